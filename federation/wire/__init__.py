"""The wire contract between a hospital and the server: the only code both sides share about what crosses.

``contract``: the messages (``Hello``/``HelloReply``, ``TrainTask``/``TrainReply``, ``EvaluateTask``/
``EvaluateReply``, ``Failure``), the training recipe and the class vocabulary; ``codec``: their one wire form (a
JSON header plus named tensors); ``chain``: the head of a hospital's hash-chained outbound log that each reply
carries and the server anchors. Nothing here imports ``federation.hospital`` or ``federation.server``
(tests/test_dependencies.py).
"""
