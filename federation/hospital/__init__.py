"""What runs at a hospital: the folder a hospital's security officer reviews (docs/design.md, "Trust model").

- ``handler``: the hospital's side of the federation (``Hospital``): it answers the three messages of
  ``federation.wire.contract`` and nothing else, owns its tiles, head, checkpoints, ledger and predictions.
- ``policy`` and ``rules``: what the hospital agrees to run and what it lets leave, as a chain of named checks run
  on every task; ``outbound``: its own append-only, hash-chained record of everything that left it.
- ``trainer`` (local training and evaluation), ``data`` (its tiles and augmentation), ``gpu`` and ``gpu_memory``
  (the device path and its memory check), ``privacy`` (DP-SGD and the accounted budget it owns), ``fisher``
  (the Fisher trace it reports).
- ``export`` and ``tissue``: the model bundle it keeps (with its own tissue description, which never leaves it).

Nothing here imports ``federation.server`` (tests/test_dependencies.py holds it, through every import).
"""
