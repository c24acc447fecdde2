"""scikit-learn's bundled handwritten digits written to the class-folders layout (`gastric-fl synth --format digits`).

The FedSAF paper (001) also checks its method on datasets other than gastric histopathology. The product
downloads nothing, and scikit-learn ships one small real dataset inside the package: the UCI optical
recognition of handwritten digits test set (``sklearn.datasets.load_digits``: 1,797 images of 8 x 8 pixels,
16 gray levels, classes 0-9). This module writes it as ``<out>/<digit>/digit_<index>.png`` so that
`gastric-fl prepare --format class-folders` reads it like any labelled image folder.

Pixels: value v in 0..16 becomes ``round(v * 255 / 16)`` (ink light on a black ground, as stored: background 0),
single-channel PNG. Each 8 x 8 image is enlarged by an integer factor with nearest-neighbour sampling
(default 64 px, factor 8): every original pixel becomes a block, no value is invented, and 64 px is the model
input size of the benchmark presets, so `prepare --tile 64` cuts exactly one tile per image and training
resizes nothing. Nothing is random: the same scikit-learn data give the same bytes.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import cv2
import numpy as np
from tqdm import tqdm

from infra.outputs import OutputError, claim_output
from pipeline.errors import PipelineError
from pipeline.synth import GENERATOR, SCHEMA_VERSION, staging_folder, write_info

DEFAULT_SIZE = 64
MAX_SIZE = 1024
SOURCE = 8  # sklearn's digits are 8 x 8
LEVELS = 16  # and hold values 0..16


@dataclass(frozen=True)
class DigitsSummary:
    """What `export_digits` wrote: the folder, images per class (class order 0..9) and every file."""

    out: Path
    counts: dict[str, int]
    files: tuple[Path, ...]
    size: int

    @property
    def images(self) -> int:
        """Number of images written."""
        return sum(self.counts.values())


def _check_size(size: int) -> None:
    if isinstance(size, bool) or not isinstance(size, int) or size < SOURCE or size > MAX_SIZE or size % SOURCE:
        raise PipelineError(
            f"digits image size must be a multiple of {SOURCE} px in [{SOURCE}, {MAX_SIZE}], got {size!r} (--size); "
            f"the default is {DEFAULT_SIZE}"
        )


def digit_pixels(image: np.ndarray, size: int) -> np.ndarray:
    """One 8 x 8 digit (values 0..16) as a ``size`` x ``size`` uint8 image (nearest-neighbour blocks)."""
    gray = np.rint(np.asarray(image, dtype=np.float64) * (255.0 / LEVELS)).astype(np.uint8)
    factor = size // SOURCE
    return np.ascontiguousarray(np.kron(gray, np.ones((factor, factor), dtype=np.uint8)))


def _encode(pixels: np.ndarray) -> bytes:
    ok, buffer = cv2.imencode(".png", pixels, [cv2.IMWRITE_PNG_COMPRESSION, 6])
    if not ok:
        raise PipelineError("PNG encoding failed (OpenCV); check the OpenCV installation")
    return bytes(buffer.tobytes())


def export_digits(
    out: Path, size: int = DEFAULT_SIZE, progress: bool = False, overwrite: bool = False
) -> DigitsSummary:
    """Write all 1,797 scikit-learn digits to ``out`` in the class-folders layout (``0/`` ... ``9/``).

    Same safety as `pipeline.synth.generate_dataset`: written to a hidden folder beside ``out`` and renamed at
    the end; ``out`` is locked while it runs; ``overwrite`` replaces only a previous synth/digits output.
    """
    _check_size(size)
    try:
        from sklearn import __version__ as sklearn_version
        from sklearn.datasets import load_digits
    except ImportError:
        raise PipelineError(
            "scikit-learn is not installed; install the project's dependencies (pip install -e .)"
        ) from None
    data = load_digits()
    images, targets = np.asarray(data.images), np.asarray(data.target)
    classes = [str(c) for c in sorted({int(t) for t in targets})]
    out = Path(out).expanduser().resolve()
    try:
        with claim_output(out, "synth"), staging_folder(out, overwrite) as tmp:
            for name in classes:
                (tmp / name).mkdir(parents=True)
            files: list[str] = []
            width = len(str(len(images) - 1))
            for index in tqdm(range(len(images)), desc="digits", unit="image", disable=not progress):
                rel = f"{int(targets[index])}/digit_{index:0{width}d}.png"
                (tmp / rel).write_bytes(_encode(digit_pixels(images[index], size)))
                files.append(rel)
            counts = {name: int(np.count_nonzero(targets == int(name))) for name in classes}
            info = {
                "generator": GENERATOR,
                "schema": SCHEMA_VERSION,
                "note": "scikit-learn's bundled digits (load_digits) in the class-folders layout; "
                "the pipeline ignores this file.",
                "format": "digits",
                "source": f"sklearn.datasets.load_digits (scikit-learn {sklearn_version})",
                "size": size,
                "upscale": f"nearest neighbour x{size // SOURCE}; value v -> round(v * 255 / 16)",
                "images": len(files),
                "classes": classes,
                "counts": counts,
                "files": files,
            }
            write_info(tmp, info)
    except OutputError as exc:
        raise PipelineError(str(exc)) from None
    return DigitsSummary(out=out, counts=counts, files=tuple(out / f for f in files), size=size)
