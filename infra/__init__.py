"""Shared infrastructure every folder may use (docs/design.md, "Layout and layers": the neutral package): the ownership
marker and one-writer lock of output folders, atomic writes and confined paths (`infra.outputs`), whether a process
still runs (`infra.pids`), and what a dataset's provenance says about its intended use (`infra.provenance`).
Standard library only: no torch, nothing of ``pipeline``, ``federation``, ``models``, ``inference`` or ``app``."""
