"""What runs at a hospital: the folder a hospital's security officer reviews (docs/design.md, "Trust model").

- ``handler``: the hospital's side of the federation (``Hospital``): it answers the three messages of
  ``federation.wire.contract`` and nothing else, owns its tiles, head, checkpoints, ledger and predictions.
- ``policy`` and ``rules``: what the hospital agrees to run and what it lets leave, as chains of named checks run
  on every task and before what it produced is kept or leaves; ``outbound``: its own append-only, hash-chained
  record of everything that left it; ``store``: its run's folder (record, checkpoints, privacy ledger).
- ``trainer`` (``Trainer``: local training), ``batches`` (its batches on the CPU or the GPU), ``dp_sgd`` (DP-SGD
  around a phase's optimiser), ``evaluation`` (evaluation, AUC, precise BN), ``data`` (its tiles and
  augmentation), ``gpu`` and ``gpu_memory`` (the device path and its memory check), ``privacy`` (DP-SGD's
  mechanism and the accounted budget it owns), ``fisher`` (the Fisher trace it reports).
- ``export`` and ``tissue``: the model bundle it keeps (with its own tissue description, which never leaves it).

Nothing here imports ``federation.server`` (tests/test_dependencies.py holds it, through every import).
"""
