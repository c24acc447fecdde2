"""The names of a run directory's hospital folders, in one place (data/README.md section 3; torch-free).

A run keeps each in-process hospital's files in ``<run>/hospitals/client_XX/`` (two digits: the hospital's index in
the federation); a deployed hospital's kit and folder carry the same name. Everything that builds, lists or parses
such a folder uses these: `hospital_dir`, `HOSPITAL_GLOB` (``client_[0-9][0-9]``), `hospital_name`,
`hospital_index`.
"""

from __future__ import annotations

from pathlib import Path

HOSPITALS_DIR = "hospitals"
HOSPITAL_PREFIX = "client_"
HOSPITAL_GLOB = "client_[0-9][0-9]"


def hospital_name(client: int) -> str:
    """``client_XX``: the folder (and kit) name of hospital ``client``."""
    return f"{HOSPITAL_PREFIX}{client:02d}"


def hospital_dir(run: Path, client: int) -> Path:
    """``<run>/hospitals/client_XX``: hospital ``client``'s folder in a run directory."""
    return run / HOSPITALS_DIR / hospital_name(client)


def hospital_index(name: str) -> int:
    """The hospital index a ``client_XX`` folder name carries (``ValueError`` for another name)."""
    if not name.startswith(HOSPITAL_PREFIX):
        raise ValueError(f"{name!r} is not a hospital folder name (client_XX)")
    return int(name.removeprefix(HOSPITAL_PREFIX))


def hospital_files(run: Path, name: str) -> list[Path]:
    """``<run>/hospitals/client_XX/<name>`` for every hospital folder of ``run`` that holds it, by index."""
    return sorted((run / HOSPITALS_DIR).glob(f"{HOSPITAL_GLOB}/{name}"))
