"""The message codec at its published name (docs/design.md, "Public names"): defined in ``federation.wire.codec``
(the wire contract) and re-exported here unchanged."""

from federation.wire.codec import decode, encode, from_bytes, to_bytes

__all__ = ["decode", "encode", "from_bytes", "to_bytes"]
