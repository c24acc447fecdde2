"""A slide uploaded on the Slide page: checked before anything of it is kept, then kept in its cache entry inside the
hospital's folder (`app.slide_view` describes the entry), with the names it was uploaded under.

An upload is checked before anything of it is kept (`check_upload`): its type by name and content, and its size from
its header against the page's pixel limit (`app.slide_view.max_pixels`: ``gastric-fl dashboard --max-pixels``, passed
in ``GASTRIC_FL_MAX_PIXELS``; default `pipeline.images.DEFAULT_MAX_PIXELS`), so an image too large to decode is
refused in one sentence naming the uploaded file. An upload that could not be scored is removed (`discard`).
"""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

from app.slide_view import (
    SLIDES_DIR,
    UPLOAD_FIX,
    UPLOAD_RECORD,
    SlideViewError,
    card_key,
    is_annotation,
    safe_name,
    uploaded_names,
    write_atomic,
)
from pipeline.images import UnreadableImageError, check_pixels

SLIDE_SUFFIXES = (".png", ".tif", ".tiff")
ANNOTATION_SUFFIXES = (".png", ".svg")
LIMIT_HINT = "downscale it, or start the dashboard with a larger --max-pixels"


def _check_suffixes(name: str, annotation: str | None) -> None:
    suffix = Path(name).suffix.lower()
    if suffix not in SLIDE_SUFFIXES:
        raise SlideViewError(
            f"{name} is not a slide the page can score: upload a PNG or TIFF image (.png, .tif, .tiff), "
            f"not {suffix + ' files' if suffix else 'a file without a suffix'}"
        )
    if annotation is not None and Path(annotation).suffix.lower() not in ANNOTATION_SUFFIXES:
        raise SlideViewError(
            f"{annotation} is not an annotation the page can read: upload a SEED mask (PNG) or a BOT SVG, "
            "or no annotation"
        )


def check_upload(name: str, data: bytes, limit: int, annotation: str | None = None) -> tuple[int, int]:
    """Check an upload before anything of it is kept: the slide's and annotation's types by name, the slide's type
    by content and its size from its header (at most ``limit`` pixels); ``(width, height)``.

    `SlideViewError` or `pipeline.images.ImageReadError`, one sentence naming the uploaded file (``name``), what
    is wrong with it and what to upload instead (never a byte of its content).
    """
    _check_suffixes(name, annotation)
    try:
        return check_pixels(data, name, limit, LIMIT_HINT)
    except UnreadableImageError as exc:
        raise exc.advising(UPLOAD_FIX) from None


def stage_upload(folder: Path, name: str, data: bytes, annotation: tuple[str, bytes] | None = None) -> Path:
    """Keep an uploaded slide (and its annotation) in its cache entry; returns the slide's path there.

    The entry is named by a hash of the names and bytes, so the same upload finds its earlier result and two
    uploads never share an entry (``case 7.png`` and ``case_7.png``, kept as ``case_7.png`` each, are two entries).
    An annotation is stored where predict looks for it: a PNG as ``<stem>_mask.png`` (SEED), an SVG as
    ``<stem>.svg`` (BOT). The names as uploaded go to the entry's `UPLOAD_RECORD` (`uploaded_names`). Names of the
    wrong type are refused before anything is written.
    """
    _check_suffixes(name, None if annotation is None else annotation[0])
    suffix = Path(name).suffix.lower()
    digest = hashlib.sha256(name.encode("utf-8") + b"\0" + data)
    if annotation is not None:
        digest.update(b"\0" + annotation[0].encode("utf-8") + b"\0" + annotation[1])
    entry = folder / SLIDES_DIR / card_key(folder) / f"upload-{digest.hexdigest()[:16]}"
    stem = safe_name(Path(name).stem)
    slide = entry / "slide" / f"{stem}{suffix}"
    if not slide.is_file():
        write_atomic(slide, data)
    if annotation is not None:
        kind = Path(annotation[0]).suffix.lower()
        target = slide.with_name(f"{stem}_mask.png" if kind == ".png" else f"{stem}.svg")
        if not target.is_file():
            write_atomic(target, annotation[1])
    if not (entry / UPLOAD_RECORD).is_file():
        record = {"slide": name, "annotation": None if annotation is None else annotation[0]}
        write_atomic(entry / UPLOAD_RECORD, (json.dumps(record, indent=2) + "\n").encode("utf-8"))
    return slide


def kept_names(entry: Path, slide: str | None = None, annotation: str | None = None) -> dict[Path, str]:
    """The files an upload's cache ``entry`` keeps, each mapped to the name to show for it: ``slide`` and
    ``annotation`` (the names as uploaded) when given, else as the entry's record has them (`uploaded_names`), else
    the kept file's own name. Empty for any other entry (a test slide's path is the user's own). For
    `app.slide_view.problem_line` and `app.slide_view.shown_text`."""
    if not entry.name.startswith("upload-"):
        return {}
    recorded = uploaded_names(entry)
    names: dict[Path, str] = {}
    kept = sorted((entry / "slide").glob("*"))
    stems = {p.stem for p in kept}
    for path in kept:
        given = (annotation or recorded[1]) if is_annotation(path, stems) else (slide or recorded[0])
        names[path] = given or path.name
    return names


def discard(entry: Path) -> None:
    """Remove a cache entry (an upload that could not be scored), if it lies under a hospital's ``slides/``."""
    if entry.parent.parent.name == SLIDES_DIR and entry.is_dir():
        shutil.rmtree(entry, ignore_errors=True)
