"""The hospital's message API at its published name (docs/design.md, "Public names"): the messages are defined in
``federation.wire.contract``, the wire contract between the hospital and the server, and re-exported here
unchanged, so tools that audit or test a hospital keep working."""

from federation.wire.contract import (
    EvaluateReply,
    EvaluateTask,
    Failure,
    Hello,
    HelloReply,
    Recipe,
    Strategy,
    TrainInstruction,
    TrainReply,
    TrainTask,
)

__all__ = [
    "EvaluateReply",
    "EvaluateTask",
    "Failure",
    "Hello",
    "HelloReply",
    "Recipe",
    "Strategy",
    "TrainInstruction",
    "TrainReply",
    "TrainTask",
]
