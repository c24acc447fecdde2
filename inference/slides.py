"""Which slides ``gastric-fl predict`` scores, and their ground truth when an annotation is at hand.

A slide is any PNG, JPEG or TIFF file (decoded by content, `pipeline.images`). Its annotation is found as
``prepare`` finds it (`pipeline.sources`, data/README.md "Raw layouts"):

* SEED: ``<id>_mask.png`` beside ``<id>.png``, or ``masks/<id>.png`` (binary; all zero = a normal slide);
* BOT: ``<id>.svg`` beside ``<id>.tiff`` (the abnormal region, rasterised by `pipeline.svgmask`);
* a slide in a folder named ``normal`` without an annotation is normal throughout (BOT's and class folders' rule).

Slide and annotation are decoded by `pipeline.sources.load_slide`, with prepare's checks (mask size and values,
SVG geometry) and its pixel limit (`pipeline.images.check_pixels`, read from the header before any decoding), so a
slide ``predict`` reads is the image ``prepare`` read.

Each slide's outputs go to a folder of its own, `SlideFile.output_name`: its readable name (`slide_name`) and 12 hex
digits of the SHA-256 of its absolute path. Files whose names differ only in characters the readable name cannot
hold (``a b.png``, ``a_b.png``), in their suffix (``x.png``, ``x.tif``) or in their folder (``d1/s.png``,
``d2/s.png``, scored in one call or in two) get different folders; the same file scored again gets the same folder
and replaces its own outputs.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import numpy.typing as npt

from pipeline.config import SourceConfig
from pipeline.errors import PipelineError
from pipeline.images import DEFAULT_MAX_PIXELS, IMAGE_SUFFIXES, RGBImage, read_bytes, read_rgb
from pipeline.sources import SlideRef, load_slide

MASK_SUFFIX = "_mask"
MASK_DIR = "masks"
# Longest readable part of an output folder's name: the path digest keeps names unique, so long paths are cut
# here rather than exceed the file system's 255-byte name limit.
NAME_MAX = 100


class SlideInputError(PipelineError):
    """A ``--slide`` that names nothing to score (no such file, a folder without slides)."""


@dataclass(frozen=True)
class SlideFile:
    """A slide to score: its file, a name unique within this call, and its annotation if any."""

    path: Path
    name: str
    mask: Path | None = None
    svg: Path | None = None
    folder_label: str | None = None

    @property
    def annotation(self) -> Path | None:
        """The SEED mask or BOT SVG beside the slide, if any."""
        return self.mask or self.svg

    @property
    def output_name(self) -> str:
        """The folder of this slide's outputs under ``--out``: ``<name>-<12 hex digits>``, the digits being the start
        of the SHA-256 of the slide's absolute path (symbolic links resolved). Unique per file, and the same for the
        same file in every call (see the module docstring)."""
        digest = hashlib.sha256(self.path.resolve().as_posix().encode("utf-8")).hexdigest()[:12]
        return f"{self.name[:NAME_MAX]}-{digest}"


@dataclass(frozen=True)
class Slide:
    """A decoded slide: RGB pixels and, when known, its cancer region (``None``: no ground truth)."""

    file: SlideFile
    image: RGBImage
    cancer: npt.NDArray[np.bool_] | None
    warning: str | None = None


def _is_mask(path: Path) -> bool:
    return path.stem.endswith(MASK_SUFFIX) or path.parent.name == MASK_DIR


def _visible(path: Path, root: Path) -> bool:
    return not any(part.startswith(".") for part in path.relative_to(root).parts)


def _annotated(path: Path, name: str) -> SlideFile:
    beside = path.with_name(f"{path.stem}{MASK_SUFFIX}.png")
    in_dir = path.parent / MASK_DIR / f"{path.stem}.png"
    mask = beside if beside.is_file() else in_dir if in_dir.is_file() else None
    svg = path.with_suffix(".svg")
    label = path.parent.name if path.parent.name in ("normal", "abnormal") else None
    return SlideFile(
        path=path, name=name, mask=mask, svg=svg if mask is None and svg.is_file() else None, folder_label=label
    )


def slide_name(relative: str) -> str:
    """A folder name for a slide's outputs: its path without suffix, ``/`` as ``__``, odd characters as ``_``."""
    stem = relative.rsplit(".", 1)[0] if "." in relative.rsplit("/", 1)[-1] else relative
    return re.sub(r"[^A-Za-z0-9._-]+", "_", stem.replace("/", "__")).strip(".") or "slide"


def find_slides(path: Path, exclude: Path | None = None) -> list[SlideFile]:
    """The slides ``--slide`` names: one file, or every image under a folder (sorted; masks, hidden files and
    anything under ``exclude`` left out). `SlideInputError` when there is nothing to score."""
    if path.is_file():
        return [_annotated(path, slide_name(path.name))]
    if not path.is_dir():
        raise SlideInputError(f"--slide {path} does not exist: give a slide file (PNG/TIFF) or a folder of slides")
    found = []
    for item in sorted(path.rglob("*")):
        if not item.is_file() or item.suffix.lower() not in IMAGE_SUFFIXES or _is_mask(item):
            continue
        if not _visible(item, path) or (exclude is not None and exclude.resolve() in item.resolve().parents):
            continue
        found.append(_annotated(item, slide_name(item.relative_to(path).as_posix())))
    if not found:
        raise SlideInputError(
            f"--slide {path} holds no slide ({', '.join(IMAGE_SUFFIXES)} files other than *{MASK_SUFFIX}.png masks)"
        )
    return found


def read_slide(file: SlideFile, max_pixels: int = DEFAULT_MAX_PIXELS) -> Slide:
    """Decode a slide and its annotation with prepare's readers; `PipelineError` (one line) if either is unusable.

    A slide (or mask) whose header declares more than ``max_pixels`` pixels is refused before it is decoded
    (`pipeline.images.ImageTooLargeError`). Ground truth: the mask's or SVG's cancer pixels; all normal for a slide
    in a ``normal`` folder without an annotation; ``None`` otherwise.
    """
    root = file.path.parent
    if file.mask is not None or file.svg is not None:
        ref = SlideRef(
            index=0,
            path=file.path,
            source=str(file.path),  # errors name the slide as the user gave it (its mask: beside it, by file name)
            mask=file.mask,
            annotation=file.svg,
            folder_label="abnormal" if file.svg is not None else None,
        )
        config = SourceConfig(format="seed" if file.mask is not None else "bot", input=root, max_pixels=max_pixels)
        loaded = load_slide(ref, config, root)
        region = loaded.mask if loaded.mask is not None else np.zeros(loaded.image.shape[:2], dtype=bool)
        return Slide(file=file, image=loaded.image, cancer=region, warning=loaded.warning)
    image = read_rgb(read_bytes(file.path), str(file.path), max_pixels)
    cancer = np.zeros(image.shape[:2], dtype=bool) if file.folder_label == "normal" else None
    return Slide(file=file, image=image, cancer=cancer)
