"""The hospital at its published name (docs/design.md, "Public names"): ``Hospital`` and ``Site`` are defined in
``federation.hospital.handler`` (the hospital's own folder) and re-exported here unchanged, so tools that drive a
hospital keep working."""

from federation.hospital.handler import Hospital, Site

__all__ = ["Hospital", "Site"]
