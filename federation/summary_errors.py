"""A run's ``summary.json`` read back by the commands that write runs, in the words they have always used.

``train --resume`` (`federation.server.resume`, `federation.engine.load_run_config`), ``train --engine flower``
(`federation.flower.runner`) and ``ablate`` (`federation.ablation.running`) read the summary of a run they write
through the one reader of a run directory, `federation.run_reader.read_summary`; `summary_error` words its
`infra.records.RecordError` for them: a `FederationError` that names the file and what is wrong with it (the
message a person reads on the command line), or, for a failure these commands never worded, the error itself, so
that each caller handles it as before (``federation.server.loop`` words an ``OSError`` of the run directory).

Torch-free: ``federation.ablation.running`` is imported by the dashboard.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from federation.errors import FederationError
from federation.run_reader import RecordError, read_summary


def summary_error(exc: RecordError) -> Exception:
    """What the commands that write runs raise for a ``summary.json`` `read_summary` could not use: a missing file,
    one this user may not read, one that is not JSON and one that holds no JSON object are each a `FederationError`
    naming the file; a file that cannot be read otherwise (another ``OSError``) or is not UTF-8 text gives that
    error itself (``exc.cause``), as these commands met it before they read through `read_summary`."""
    path, cause = exc.path, exc.cause
    if exc.kind == "missing":
        return FederationError(f"{path} does not exist: is this a run directory made by gastric-fl train?")
    if isinstance(cause, PermissionError):  # e.g. a deployed run written by the server's user, read by another
        return FederationError(
            f"{path} cannot be read by this user ({cause.strerror}): run the command as the user that wrote it "
            "(for a deployed run: the server's user, on the server machine), or let this user read the folder"
        )
    if isinstance(cause, json.JSONDecodeError):
        return FederationError(f"{path} is not valid JSON ({cause})")
    if exc.kind == "malformed":
        return FederationError(f"{path} should hold a JSON object")
    if isinstance(cause, OSError | UnicodeDecodeError):
        return cause
    return FederationError(str(exc))


def read_summary_object(run_dir: Path) -> dict[str, Any]:
    """``<run_dir>/summary.json`` as the object written (empty while the run has written none); what `summary_error`
    says when it cannot be used."""
    try:
        return dict(read_summary(run_dir).data)
    except RecordError as exc:
        error = summary_error(exc)
        if error is exc.cause:
            raise error from None
        raise error from exc.cause
