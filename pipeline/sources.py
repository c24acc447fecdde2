"""Find the slides of a raw folder and read each one's label and cancer mask (FedSAF paper 001, Sec. 4.2).

Layouts (data/README.md, "Raw layouts"):
- ``seed``: ``<id>.png`` + ``<id>_mask.png`` beside it, or ``masks/<id>.png``. A mask that is entirely 0 makes
  the slide normal; any non-zero pixel makes it abnormal (the paper's rule for SEED).
- ``bot``: ``normal/<id>.tiff`` and ``abnormal/<id>.tiff`` + ``abnormal/<id>.svg`` (rasterised by
  `pipeline.svgmask`). The folder gives the label; the SVG gives the abnormal region.
- ``class-folders``: one folder of images per class, no masks: the whole image is used. Any number of classes
  (at least two); the folder's name is the label. `dataset_classes` fixes their order (the class index).
- ``idx``: IDX image sets (`pipeline.idx`: MNIST, Fashion-MNIST): every image is a slide named
  ``<images file>#<k>``, labelled by its value in the labels file (class names ``0``, ``1``, ...), in the
  order ``train`` first, then the other sets (PFLlib's merge order, `pipeline.pfl_partition`). Grey pixels are
  stored as three equal channels, as class folders' grey images are.

`inspect_slide` is the per-slide check run before the client split (so that only usable slides are shared
out): headers, masks, annotations and labels, without decoding the slide's pixels. `load_slide` decodes the
slide during tiling; the caller compares the file hashes of both reads, so a file changed in between is
caught instead of silently mixed in. `pixel_sha256` identifies a slide by its decoded pixels (the same picture
saved as PNG and as TIFF has other bytes but the same pixels); prepare applies it to the array it tiles.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import numpy.typing as npt

from pipeline.config import CLASS_NAME, LABELS, SourceConfig
from pipeline.errors import PipelineError
from pipeline.idx import image_sets, load_set, set_of
from pipeline.images import IMAGE_SUFFIXES, RGBImage, probe_size, read_bytes, read_mask, read_rgb
from pipeline.svgmask import rasterise_svg


class SlideError(PipelineError):
    """One slide cannot be used (corrupt image, bad or missing mask/annotation); skipped unless ``--strict``."""


@dataclass(frozen=True)
class SlideRef:
    """A slide found in the raw folder, before it is read."""

    index: int
    path: Path
    source: str
    mask: Path | None
    annotation: Path | None
    folder_label: str | None


@dataclass(frozen=True)
class SlideInfo:
    """What the check of one slide found: label, size, file hashes, and any problem or warning."""

    ref: SlideRef
    label: str | None
    width: int
    height: int
    hashes: tuple[tuple[str, str], ...]
    problem: str | None = None
    warning: str | None = None


@dataclass(frozen=True)
class LoadedSlide:
    """A slide's RGB pixels and its cancer mask (``None`` for normal slides and class folders)."""

    image: RGBImage
    mask: npt.NDArray[np.bool_] | None
    hashes: tuple[tuple[str, str], ...]
    warning: str | None


def _visible_images(folder: Path) -> list[Path]:
    return sorted(
        p for p in folder.iterdir() if p.is_file() and not p.name.startswith(".") and p.suffix.lower() in IMAGE_SUFFIXES
    )


def _relative(path: Path, root: Path) -> str:
    return path.relative_to(root).as_posix()


def _natural_key(name: str) -> tuple[tuple[int, int | str], ...]:
    """Sort key that orders digit runs by value: ``2`` before ``10``, ``class_9`` before ``class_10``."""
    parts = [part for part in re.split(r"(\d+)", name) if part]
    return tuple((0, int(part)) if part.isdigit() else (1, part.casefold()) for part in parts)


def dataset_classes(config: SourceConfig) -> tuple[str, ...]:
    """The classes of the raw folder, in class-index order (recorded in ``prepare.json`` as ``classes``).

    SEED and BOT: ``("normal", "abnormal")``. class-folders: ``config.classes`` when given (each must be a
    folder of ``input``); otherwise every visible subfolder holding at least one image, ordered ``normal``,
    ``abnormal`` when no other folder is there (the binary task: index 1 = abnormal), else by natural sort
    (``"2"`` before ``"10"``). A folder name that cannot be a label stops with one line naming it.
    """
    if config.format == "idx":
        values = sorted({int(v) for s in image_sets(config.input) for v in np.unique(load_set(s)[1])})
        if len(values) < 2:
            raise PipelineError(f"the IDX labels in {config.input} hold one class ({values[0]}); a classifier needs 2")
        return tuple(str(v) for v in values)
    if config.format != "class-folders":
        return LABELS
    root = config.input
    if not root.is_dir():
        raise PipelineError(f"input folder {root} does not exist or is not a folder; pass the raw dataset with --input")
    if config.classes:
        missing = [c for c in config.classes if not (root / c).is_dir()]
        if missing:
            raise PipelineError(
                f"class folder {root / missing[0]} does not exist; --classes must name folders of --input"
            )
        return config.classes
    found = [p.name for p in root.iterdir() if p.is_dir() and not p.name.startswith(".") and _visible_images(p)]
    bad = [name for name in found if not CLASS_NAME.match(name)]
    if bad:
        raise PipelineError(
            f"class folder {root / bad[0]}: the name cannot be a label (use letters, digits, '.', '_' or '-'); "
            "rename it, or list the classes to read with --classes"
        )
    if set(found) <= set(LABELS):
        return LABELS
    if len(found) < 2:
        raise PipelineError(
            f"input folder {root} holds one class folder ({found[0]}); a classifier needs at least 2 class folders"
        )
    return tuple(sorted(found, key=_natural_key))


def discover(config: SourceConfig) -> list[SlideRef]:
    """Every slide of ``config.input`` in its layout, in a stable (sorted) order.

    Raises `PipelineError` when the folder is missing or holds no slide of the layout (nothing to do).
    """
    root = config.input
    if config.format == "idx":
        return _discover_idx(root)
    if not root.is_dir():
        raise PipelineError(f"input folder {root} does not exist or is not a folder; pass the raw dataset with --input")
    found: list[tuple[Path, Path | None, Path | None, str | None]] = []
    if config.format == "seed":
        mask_dir = root / config.mask_dir if config.mask_dir else None
        suffix = config.mask_suffix
        for path in _visible_images(root):
            if suffix and path.stem.endswith(suffix):
                continue
            mask = None
            beside = [path.with_name(f"{path.stem}{suffix}{ext}") for ext in (".png", path.suffix)] if suffix else []
            candidates = [*beside, *([mask_dir / f"{path.stem}.png"] if mask_dir is not None else [])]
            for candidate in candidates:
                if candidate.is_file():
                    mask = candidate
                    break
            found.append((path, mask, None, None))
        layout_hint = f"<id>.png with <id>{suffix}.png beside it or {config.mask_dir}/<id>.png"
    else:
        for label in dataset_classes(config):
            folder = root / label
            if not folder.is_dir():
                continue
            for path in _visible_images(folder):
                annotation = None
                if config.format == "bot" and label == "abnormal":
                    svg = path.with_suffix(".svg")
                    annotation = svg if svg.is_file() else None
                found.append((path, None, annotation, label))
        layout_hint = (
            "normal/ and abnormal/ folders of images"
            if config.format == "bot"
            else "one folder of images per class, e.g. normal/ and abnormal/"
        )
    if not found:
        raise PipelineError(
            f"input folder {root} holds no slides in the {config.format} layout (expected {layout_hint}); "
            "check --input and --format"
        )
    found.sort(key=lambda item: _relative(item[0], root))
    return [
        SlideRef(
            index=i,
            path=path,
            source=_relative(path, root),
            mask=mask,
            annotation=annotation,
            folder_label=label,
        )
        for i, (path, mask, annotation, label) in enumerate(found)
    ]


def _discover_idx(root: Path) -> list[SlideRef]:
    """Every image of the IDX sets of ``root``, ``train`` first (PFLlib's order), each a slide ``<file>#<k>``."""
    refs: list[SlideRef] = []
    for image_set in image_sets(root):
        _, labels = load_set(image_set)
        width = len(str(len(labels) - 1))
        rel = _relative(image_set.images, root)
        refs.extend(
            SlideRef(
                index=len(refs) + k,
                path=image_set.images,
                source=f"{rel}#{k:0{width}d}",
                mask=None,
                annotation=None,
                folder_label=str(int(value)),
            )
            for k, value in enumerate(labels)
        )
    return refs


def _idx_image(ref: SlideRef) -> tuple[RGBImage, str]:
    """An IDX slide's pixels as RGB (three equal channels) and the SHA-256 of its stored bytes."""
    pixels, _ = load_set(set_of(ref.path))
    k = int(ref.source.rpartition("#")[2])
    if k >= len(pixels):
        raise SlideError(f"{ref.source}: {ref.path} now holds {len(pixels)} images; re-run prepare")
    gray = pixels[k]
    return np.ascontiguousarray(np.repeat(gray[:, :, None], 3, axis=2)), _sha256(gray.tobytes())


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def pixel_sha256(image: npt.NDArray[np.generic]) -> str:
    """SHA-256 of a decoded image: a header with its dtype and shape, then its samples in C order.

    Files with the same picture in other encodings (PNG and TIFF, or a PNG re-compressed) give the same digest;
    one changed sample changes it. The header keeps apart arrays whose bytes are equal but whose shape is not
    (96x32 against 32x96, RGB against gray).
    """
    shape = "x".join(str(n) for n in image.shape)
    digest = hashlib.sha256(f"{image.dtype.str} {shape}\n".encode())
    # hashlib releases the GIL on large buffers, so tiling threads hash in parallel.
    digest.update(np.ascontiguousarray(image).data)
    return digest.hexdigest()


def _binary_mask(raw: npt.NDArray[np.generic], name: str, threshold: int | None) -> npt.NDArray[np.bool_]:
    """Cancer pixels of a SEED mask: non-zero, or ``> threshold`` when one is given."""
    if threshold is not None:
        return np.asarray(raw.astype(np.int64) > threshold)
    # bincount is much faster than np.unique for 8-bit masks (no sort).
    values = np.flatnonzero(np.bincount(raw.ravel(), minlength=256)) if raw.dtype == np.uint8 else np.unique(raw)
    if len(values) > 2 or (len(values) == 2 and values[0] != 0):
        shown = ", ".join(str(v) for v in values[:6]) + (", ..." if len(values) > 6 else "")
        raise SlideError(
            f"{name}: mask is not binary ({len(values)} distinct values: {shown}); re-export it with 0 and 255 "
            "only, or pass --mask-threshold T to treat values above T as cancer"
        )
    return np.asarray(raw != 0)


@dataclass(frozen=True)
class _Annotation:
    mask: npt.NDArray[np.bool_] | None
    hashes: tuple[tuple[str, str], ...]
    warning: str | None


def _annotation(ref: SlideRef, config: SourceConfig, root: Path, width: int, height: int) -> _Annotation:
    """The slide's cancer mask (SEED mask PNG or BOT SVG) checked against the slide's size; None if it has none."""
    if config.format == "seed":
        if ref.mask is None:
            expected = f"{ref.path.stem}{config.mask_suffix}.png"
            where = f" or {config.mask_dir}/{ref.path.stem}.png" if config.mask_dir else ""
            raise SlideError(f"{ref.source}: no mask found (expected {expected} beside it{where})")
        mask_name = _relative(ref.mask, root)
        mask_data = read_bytes(ref.mask)
        raw = read_mask(mask_data, mask_name, config.max_pixels)
        if raw.shape[:2] != (height, width):
            raise SlideError(
                f"{mask_name}: mask is {raw.shape[1]}x{raw.shape[0]} but its slide {ref.source} is {width}x{height}; "
                "the mask must have the slide's size"
            )
        mask = _binary_mask(raw, mask_name, config.mask_threshold)
        return _Annotation(mask, ((mask_name, _sha256(mask_data)),), None)
    if config.format == "bot" and ref.folder_label == "abnormal":
        if ref.annotation is None:
            raise SlideError(
                f"{ref.source}: abnormal slide has no annotation {ref.path.with_suffix('.svg').name} beside it"
            )
        svg_name = _relative(ref.annotation, root)
        svg_data = read_bytes(ref.annotation)
        rasterised = rasterise_svg(svg_data, width, height, svg_name)
        return _Annotation(rasterised.mask > 0, ((svg_name, _sha256(svg_data)),), rasterised.clipped)
    return _Annotation(None, (), None)


def load_slide(ref: SlideRef, config: SourceConfig, root: Path) -> LoadedSlide:
    """Decode a slide and its mask; any problem raises `SlideError` (or `ImageReadError`) naming the file."""
    if config.format == "idx":
        image, digest = _idx_image(ref)
        return LoadedSlide(image=image, mask=None, hashes=((ref.source, digest),), warning=None)
    data = read_bytes(ref.path)
    image = read_rgb(data, ref.source, config.max_pixels)
    height, width = image.shape[:2]
    annotation = _annotation(ref, config, root, width, height)
    return LoadedSlide(
        image=image,
        mask=annotation.mask,
        hashes=((ref.source, _sha256(data)), *annotation.hashes),
        warning=annotation.warning,
    )


def label_of(ref: SlideRef, mask: npt.NDArray[np.bool_] | None) -> str:
    """``normal``/``abnormal``: from the folder when the layout has one, else from the mask (any cancer pixel)."""
    if ref.folder_label is not None:
        return ref.folder_label
    return "abnormal" if mask is not None and bool(mask.any()) else "normal"


def inspect_slide(ref: SlideRef, config: SourceConfig, root: Path) -> SlideInfo:
    """First pass over a slide: header, file hashes, mask or annotation and label; a problem is recorded, not raised.

    The slide's pixels are not decoded here (that happens once, while tiling): the header gives the size the
    mask must match, and `probe_size` catches truncated or corrupt files cheaply and slides over
    ``config.max_pixels`` (a problem like any other: the slide is skipped, or stops a ``--strict`` run).
    """
    if config.format == "idx":
        try:
            image, digest = _idx_image(ref)
        except PipelineError as exc:
            return SlideInfo(ref=ref, label=None, width=0, height=0, hashes=(), problem=str(exc))
        height, width = image.shape[:2]
        return SlideInfo(ref=ref, label=ref.folder_label, width=width, height=height, hashes=((ref.source, digest),))
    try:
        data = read_bytes(ref.path)
        width, height = probe_size(data, ref.source, config.max_pixels)
        annotation = _annotation(ref, config, root, width, height)
    except PipelineError as exc:
        return SlideInfo(ref=ref, label=None, width=0, height=0, hashes=(), problem=str(exc))
    return SlideInfo(
        ref=ref,
        label=label_of(ref, annotation.mask),
        width=width,
        height=height,
        hashes=((ref.source, _sha256(data)), *annotation.hashes),
        warning=annotation.warning,
    )
