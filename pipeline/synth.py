"""`gastric-fl synth`: synthetic gastric histopathology datasets in the SEED and BOT raw layouts.

The FedSAF paper (001) trains on SEED (PNG slides + grayscale masks, 512 x 512) and BOT (TIFF slides + SVG
annotations, 2048 x 2048; Sec. 4.1, Table 2) and labels a slide abnormal iff its mask marks cancer (Sec. 4.2).
The product never downloads data, so this module writes look-alike datasets in exactly the layouts
``data/README.md`` documents, which is also what a hospital's own folder must look like.

Default class balance: BOT's 560 abnormal of 700 slides (Sec. 4.1) gives 0.8. The paper gives only SEED's total
(1,770 slides), not its split, so SEED defaults to a balanced 0.5.

Determinism: every slide draws from its own ``numpy.random.Generator`` seeded by ``SeedSequence(seed).spawn``, and
neither PNG nor TIFF output carries timestamps, so the same arguments give byte-identical files.
"""

from __future__ import annotations

import itertools
import json
import math
import multiprocessing
import os
from collections.abc import Iterator
from concurrent.futures import ProcessPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import cv2
import numpy as np
import tifffile
from numpy.typing import NDArray
from tqdm import tqdm

from infra.outputs import OutputError, claim_output, replace_folder
from infra.processes import plain_main
from infra.provenance import SYNTH_MARKER
from pipeline.errors import PipelineError
from pipeline.synth_patterns import DEFAULT_MIX, PATTERNS, TissueMix, parse_mix
from pipeline.synth_render import Zone, render_tissue
from pipeline.synth_shapes import Region, make_regions, rasterize, svg_document
from pipeline.synth_stain import Palette

GENERATOR = "gastric-fl synth"
SCHEMA_VERSION = 1
MARKER = SYNTH_MARKER
MIN_SIZE = 128
MAX_SIZE = 8192
MAX_IMAGES = 100_000


@dataclass(frozen=True)
class FormatSpec:
    """A raw layout: its native slide size and the radius of a normal nucleus at that size, in pixels."""

    name: str
    size: int
    nucleus_px: float
    abnormal_fraction: float


FORMATS: dict[str, FormatSpec] = {
    # SEED slides are small fields of view: nuclei are a few pixels across.
    "seed": FormatSpec("seed", 512, 3.4, 0.5),
    # BOT slides are large scans at higher magnification: more tissue and bigger nuclei per slide.
    "bot": FormatSpec("bot", 2048, 5.5, 0.8),
}


@dataclass(frozen=True)
class SlidePlan:
    """What slide ``index`` of a dataset will be, before it is painted."""

    index: int
    slide_id: str
    abnormal: bool
    seed: np.random.SeedSequence


@dataclass(frozen=True)
class SynthSlide:
    """One painted slide: RGB image, ground-truth mask (0 / 255, the area rendered as carcinoma) and regions."""

    plan: SlidePlan
    image: NDArray[np.uint8]
    mask: NDArray[np.uint8]
    regions: tuple[Region, ...]
    carcinoma: tuple[str, ...] = ()
    benign: tuple[str, ...] = ()

    @property
    def cancer_fraction(self) -> float:
        """Fraction of the slide's pixels rendered (and annotated) as carcinoma."""
        return float(np.count_nonzero(self.mask)) / self.mask.size


@dataclass(frozen=True)
class SynthSummary:
    """What ``generate_dataset`` wrote: the dataset folder, its format, class counts and every file (absolute)."""

    out: Path
    fmt: str
    n_normal: int
    n_abnormal: int
    files: tuple[Path, ...]
    size: int

    @property
    def images(self) -> int:
        """Number of slides written."""
        return self.n_normal + self.n_abnormal


def _check_args(
    fmt: str, images: int, difficulty: float, abnormal_fraction: float | None, size: int | None, workers: int = 1
) -> FormatSpec:
    if isinstance(workers, bool) or not isinstance(workers, int) or not 1 <= workers <= 256:
        raise PipelineError(f"--workers {workers!r}: give a whole number of processes from 1 to 256")
    if fmt not in FORMATS:
        raise PipelineError(f"unknown format {fmt!r}: use one of {', '.join(FORMATS)} (--format)")
    if isinstance(images, bool) or not isinstance(images, int) or images < 1:
        raise PipelineError(f"number of images must be a whole number >= 1, got {images!r} (--images)")
    if images > MAX_IMAGES:
        raise PipelineError(
            f"{images} images is more than {MAX_IMAGES} in one dataset: ask for fewer (--images), "
            "or write several datasets with different --seed values"
        )
    if not (isinstance(difficulty, int | float) and math.isfinite(difficulty) and 0.0 <= difficulty <= 1.0):
        raise PipelineError(f"difficulty must be between 0 and 1, got {difficulty!r} (--difficulty)")
    if abnormal_fraction is not None and not (
        isinstance(abnormal_fraction, int | float)
        and math.isfinite(abnormal_fraction)
        and 0.0 <= abnormal_fraction <= 1.0
    ):
        raise PipelineError(
            f"abnormal fraction must be between 0 and 1, got {abnormal_fraction!r} (--abnormal-fraction)"
        )
    if size is not None and (isinstance(size, bool) or not isinstance(size, int) or not MIN_SIZE <= size <= MAX_SIZE):
        raise PipelineError(
            f"slide size must be a whole number of pixels in [{MIN_SIZE}, {MAX_SIZE}], got {size!r} (--size)"
        )
    return FORMATS[fmt]


def plan_dataset(fmt: str, images: int, seed: int = 0, abnormal_fraction: float | None = None) -> list[SlidePlan]:
    """Slide ids, labels and per-slide seeds of a dataset (cheap; nothing is painted)."""
    spec = _check_args(fmt, images, 0.0, abnormal_fraction, None)
    fraction = spec.abnormal_fraction if abnormal_fraction is None else float(abnormal_fraction)
    n_abnormal = math.floor(images * fraction + 0.5)
    if 0.0 < fraction < 1.0 and images >= 2:
        # Both classes present whenever the fraction asks for both: a one-class dataset cannot be evaluated.
        n_abnormal = min(max(n_abnormal, 1), images - 1)
    root = np.random.SeedSequence(seed)
    labels_seed, *slide_seeds = root.spawn(images + 1)
    labels = np.zeros(images, bool)
    labels[:n_abnormal] = True
    labels = np.random.default_rng(labels_seed).permutation(labels)
    width = max(4, len(str(images - 1)))
    return [
        SlidePlan(index=i, slide_id=f"slide_{i:0{width}d}", abnormal=bool(labels[i]), seed=slide_seeds[i])
        for i in range(images)
    ]


def _resolve_tissue(tissue: str | TissueMix | None, overrides: str | None = None) -> TissueMix | None:
    """The mixture a tissue name (with ``--mix`` overrides) stands for; a `TissueMix` or None as given."""
    if not isinstance(tissue, str):
        return tissue
    try:
        return parse_mix(tissue, overrides)
    except ValueError as exc:
        raise PipelineError(str(exc)) from None


def render_slide(
    plan: SlidePlan,
    fmt: str,
    size: int | None = None,
    difficulty: float = 0.0,
    tissue: str | TissueMix | None = DEFAULT_MIX,
) -> SynthSlide:
    """Paint one planned slide. Same plan and arguments, same pixels.

    ``tissue``: a mixture of patterns (`pipeline.synth_patterns`; a name of `MIXES` or a `TissueMix`); "classic"
    or None paints the tissue of earlier versions, byte for byte.
    """
    mix = _resolve_tissue(tissue)
    spec = _check_args(fmt, 1, difficulty, None, size)
    size = spec.size if size is None else size
    unit = spec.nucleus_px * size / spec.size
    rng = np.random.default_rng(plan.seed)
    d = float(difficulty)
    palette = Palette(
        h_gain=float(rng.uniform(0.85, 1.15)),
        e_gain=float(rng.uniform(0.8, 1.2)),
        background=float(rng.uniform(0.02, 0.045)),
    )
    if mix is not None:
        return _render_mixed(plan, rng, size, unit, d, palette, mix)
    regions: list[Region] = []
    zones: list[Zone] = []
    mask = np.zeros((size, size), np.uint8)
    if plan.abnormal:
        # Difficulty shrinks the carcinoma and pulls its atypia towards normal mucosa.
        area = float(rng.uniform(0.18, 0.42)) * (1.0 - 0.7 * d)
        regions = make_regions(rng, size, area, int(rng.integers(1, 4)))
        mask = rasterize(regions, size)
        zones.append(Zone(mask.astype(bool), 1.0 - 0.7 * d))
    if d > 0 and rng.random() < d:
        # Normal-looking confounders: small patches of mild (reactive) atypia, never annotated.
        patches = make_regions(rng, size, float(rng.uniform(0.04, 0.1)), int(rng.integers(1, 3)), force_group=False)
        patch_mask = rasterize(patches, size).astype(bool) & ~mask.astype(bool)
        zones.append(Zone(patch_mask, 0.25 * d))
    aggregates = int(rng.poisson(0.3 + 0.8 * d))
    image = render_tissue(rng, size, unit, zones, palette, aggregates=aggregates)
    return SynthSlide(plan=plan, image=image, mask=mask * np.uint8(255), regions=tuple(regions))


# Patch sizes (share of the slide) and strengths of the benign patterns placed as patches.
_PATCHES: dict[str, tuple[tuple[float, float], tuple[float, float]]] = {
    "gastritis": ((0.12, 0.35), (0.45, 0.95)),
    "follicle": ((0.05, 0.14), (0.85, 1.0)),
    "reactive": ((0.05, 0.12), (0.6, 1.0)),
    "metaplasia": ((0.08, 0.2), (0.6, 1.0)),
}


def _render_mixed(
    plan: SlidePlan, rng: np.random.Generator, size: int, unit: float, d: float, palette: Palette, mix: TissueMix
) -> SynthSlide:
    """A slide of ``mix``: an abnormal slide's carcinoma of one subtype, and on every slide the benign patterns
    (patches of chronic gastritis, lymphoid follicles, reactive epithelium and intestinal metaplasia), which never
    overlap the carcinoma; the mask marks exactly the carcinoma."""
    regions: list[Region] = []
    zones: list[Zone] = []
    mask = np.zeros((size, size), np.uint8)
    carcinoma: list[str] = []
    cancer_zones: list[Zone] = []
    if plan.abnormal:
        area = float(rng.uniform(0.18, 0.42)) * (1.0 - 0.7 * d)
        regions = make_regions(rng, size, area, int(rng.integers(1, 4)))
        mask = rasterize(regions, size)
        names, weights = mix.carcinoma_weights()
        # Atypia fades less with difficulty than in the classic tissue (1 - 0.7 d): here darkness no longer gives
        # the class away, so morphology is all a model has, and it must stay readable at the regimes' difficulties.
        s = 1.0 - 0.5 * d
        # Each region its own subtype (mixed-type carcinoma is common); where regions overlap the later one shows.
        for region in regions:
            subtype = names[int(rng.choice(len(names), p=weights))]
            carcinoma.append(subtype)
            cancer_zones.append(Zone(rasterize([region], size).astype(bool), s, PATTERNS[subtype](s)))
    cancer = mask.astype(bool)
    benign: list[str] = []
    for name, ((lo, hi), (s_lo, s_hi)) in _PATCHES.items():
        for _ in range(int(rng.poisson(getattr(mix, name)))):
            patch = rasterize(make_regions(rng, size, float(rng.uniform(lo, hi)), 1, force_group=False), size)
            level = float(rng.uniform(s_lo, s_hi))
            zones.append(Zone(patch.astype(bool) & ~cancer, level, PATTERNS[name](level)))
            benign.append(name)
    aggregates = int(rng.poisson(0.3 + 0.8 * d))
    # The carcinoma is painted last, so it keeps its outline whatever lies under it.
    image = render_tissue(rng, size, unit, zones + cancer_zones, palette, aggregates=aggregates, fill=False)
    return SynthSlide(
        plan=plan,
        image=image,
        mask=mask * np.uint8(255),
        regions=tuple(regions),
        carcinoma=tuple(carcinoma),
        benign=tuple(benign),
    )


def _encode_png(array: NDArray[np.uint8]) -> bytes:
    data = array[:, :, ::-1] if array.ndim == 3 else array  # OpenCV expects BGR
    # Tissue texture barely compresses: level 1 with the fixed "up" filter encodes a 512 px slide 2.4x faster
    # than OpenCV's default adaptive filtering, for a file 3% larger (measured; level 6 was 2-3x slower still).
    params = [cv2.IMWRITE_PNG_COMPRESSION, 1, cv2.IMWRITE_PNG_FILTER, cv2.IMWRITE_PNG_FILTER_UP]
    ok, buf = cv2.imencode(".png", np.ascontiguousarray(data), params)
    if not ok:
        raise PipelineError("PNG encoding failed")
    return buf.tobytes()


def _write_slide(slide: SynthSlide, fmt: str, root: Path) -> list[str]:
    """Write one slide in the format's layout under ``root``; return the relative paths written."""
    sid = slide.plan.slide_id
    if fmt == "seed":
        (root / f"{sid}.png").write_bytes(_encode_png(slide.image))
        (root / f"{sid}_mask.png").write_bytes(_encode_png(slide.mask))
        return [f"{sid}.png", f"{sid}_mask.png"]
    folder = "abnormal" if slide.plan.abnormal else "normal"
    rel = f"{folder}/{sid}.tiff"
    # zlib (deflate) + horizontal predictor: lossless, readable by tifffile, Pillow, OpenCV and libtiff without
    # extra codecs, ~60% of the raw size. Level 1: higher levels took 2-3x longer for ~4% smaller files.
    # No datetime or description tags, so the bytes depend only on the pixels.
    tifffile.imwrite(
        root / rel,
        slide.image,
        photometric="rgb",
        compression="zlib",
        compressionargs={"level": 1},
        predictor=True,
        metadata=None,
        software=None,
    )
    written = [rel]
    if slide.plan.abnormal:
        svg = svg_document(list(slide.regions), slide.image.shape[0], f"{sid}: carcinoma")
        (root / f"{folder}/{sid}.svg").write_text(svg, encoding="utf-8")
        written.append(f"{folder}/{sid}.svg")
    return written


def _previous_output(out: Path) -> bool:
    """Whether ``out`` holds exactly a previous synth dataset (its marker lists every file in it)."""
    marker = out / MARKER
    try:
        info = json.loads(marker.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    if not isinstance(info, dict) or info.get("generator") != GENERATOR or not isinstance(info.get("files"), list):
        return False
    expected = {*info["files"], MARKER}
    present = {p.relative_to(out).as_posix() for p in out.rglob("*") if p.is_file()}
    return present <= expected


def prepare_out(out: Path, overwrite: bool) -> None:
    """Check ``out`` before writing: new, empty, or a previous synth output (replaced only with ``overwrite``)."""
    if out.exists() and not out.is_dir():
        raise PipelineError(f"output {out} is a file, not a directory: pass a new or empty directory to --out")
    if out.is_dir() and any(out.iterdir()):
        if not _previous_output(out):
            raise PipelineError(
                f"output directory {out} is not empty and does not hold a previous synth dataset: "
                "pass a new or empty directory to --out (nothing was changed)"
            )
        if not overwrite:
            raise PipelineError(
                f"output directory {out} already holds a synthetic dataset: add --overwrite to replace it"
            )
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise PipelineError(
            f"cannot create output directory {out} ({exc.strerror or exc}): choose a writable location with --out"
        ) from exc
    if not os.access(out.parent, os.W_OK):
        raise PipelineError(f"output directory {out.parent} is not writable: choose another location with --out")


def _render_and_write(
    plan: SlidePlan, fmt: str, size: int, difficulty: float, root: Path, mix: TissueMix | None
) -> tuple[list[str], dict[str, Any]]:
    """Paint slide ``plan`` and write it under ``root``: (relative paths written, what synth.json says of it)."""
    slide = render_slide(plan, fmt, size, difficulty, mix)
    record: dict[str, Any] = {"cancer_fraction": round(slide.cancer_fraction, 6)}
    if mix is not None:
        record |= {"carcinoma": list(slide.carcinoma), "benign": list(slide.benign)}
    return _write_slide(slide, fmt, root), record


def _written_slides(
    plans: list[SlidePlan],
    fmt: str,
    size: int,
    difficulty: float,
    root: Path,
    workers: int,
    mix: TissueMix | None,
) -> Iterator[tuple[list[str], dict[str, Any]]]:
    """Every slide painted and written, in plan order; ``workers`` > 1 spreads them over that many processes.

    Each slide draws from its own seeded generator (module docstring), so the files do not depend on ``workers``.
    """
    if workers <= 1 or len(plans) < 2:
        for plan in plans:
            yield _render_and_write(plan, fmt, size, difficulty, root, mix)
        return
    context = multiprocessing.get_context("forkserver")
    with plain_main(), ProcessPoolExecutor(min(workers, len(plans)), mp_context=context) as pool:
        chunk = max(1, min(16, len(plans) // (4 * workers)))
        yield from pool.map(
            _render_and_write,
            plans,
            *(itertools.repeat(x, len(plans)) for x in (fmt, size, difficulty, root, mix)),
            chunksize=chunk,
        )


def generate_dataset(
    out: Path,
    fmt: str,
    images: int,
    seed: int = 0,
    difficulty: float = 0.0,
    abnormal_fraction: float | None = None,
    size: int | None = None,
    progress: bool = False,
    overwrite: bool = False,
    workers: int = 1,
    tissue: str = DEFAULT_MIX,
    mix: str | None = None,
) -> SynthSummary:
    """Write a synthetic dataset of ``images`` slides in the ``fmt`` ("seed" or "bot") raw layout to ``out``.

    ``size`` None means the format's real size (SEED 512, BOT 2048); features scale with it. ``difficulty`` in
    [0, 1] shrinks carcinoma regions, softens their atypia and adds mild atypia to normal slides.
    ``abnormal_fraction`` None means 0.5 for SEED and 0.8 for BOT (see the module docstring).
    Everything is written to a temporary folder beside ``out`` and renamed at the end, so an interrupted run
    leaves no half-written dataset; ``overwrite`` replaces only a previous synth output, never foreign files.
    ``out`` is locked while the run lasts (`infra.outputs.claim_output`): a second synth to it is refused.
    ``workers``: slides painted at once, one process each (the files are the same for any value).
    ``tissue``: the named mixture of patterns (`pipeline.synth_patterns.MIXES`: "gastric", the default, or
    "classic", the tissue of earlier versions byte for byte); ``mix``: overrides of its weights, "tubular=2,follicle=0".
    """
    spec = _check_args(fmt, images, difficulty, abnormal_fraction, size, workers)
    resolved = _resolve_tissue(tissue, mix)
    # Resolved, so that "." or "../x" still have a real name and parent for the temporary folder beside them.
    out = Path(out).expanduser().resolve()
    size = spec.size if size is None else size
    plans = plan_dataset(fmt, images, seed, abnormal_fraction)
    try:
        with claim_output(out, "synth"):
            return _generate_claimed(
                out,
                spec,
                plans,
                seed,
                difficulty,
                abnormal_fraction,
                size,
                progress,
                overwrite,
                workers,
                tissue,
                resolved,
            )
    except OutputError as exc:
        raise PipelineError(str(exc)) from None


def _generate_claimed(
    out: Path,
    spec: FormatSpec,
    plans: list[SlidePlan],
    seed: int,
    difficulty: float,
    abnormal_fraction: float | None,
    size: int,
    progress: bool,
    overwrite: bool,
    workers: int,
    tissue: str,
    mix: TissueMix | None,
) -> SynthSummary:
    """`generate_dataset` once ``out`` is locked: check it, render into a temporary folder, swap into place."""
    fmt, images = spec.name, len(plans)
    with staging_folder(out, overwrite) as tmp:
        if fmt == "bot":
            (tmp / "normal").mkdir()
            (tmp / "abnormal").mkdir()
        files: list[str] = []
        slides_info = []
        bar = tqdm(total=images, desc=f"synth {fmt}", unit="slide", disable=not progress)
        with bar:
            for plan, (written, record) in zip(
                plans, _written_slides(plans, fmt, size, difficulty, tmp, workers, mix), strict=True
            ):
                files += written
                slides_info.append(
                    {"id": plan.slide_id, "label": "abnormal" if plan.abnormal else "normal", "files": written} | record
                )
                bar.update(1)
        n_abnormal = sum(p.abnormal for p in plans)
        info = {
            "generator": GENERATOR,
            "schema": SCHEMA_VERSION,
            "note": "Synthetic slides; the pipeline ignores this file.",
            "format": fmt,
            "size": size,
            "images": images,
            "seed": seed,
            "difficulty": float(difficulty),
            "tissue": tissue,
            "mix": None if mix is None else mix.as_dict(),
            "abnormal_fraction": spec.abnormal_fraction if abnormal_fraction is None else float(abnormal_fraction),
            "n_normal": images - n_abnormal,
            "n_abnormal": n_abnormal,
            "slides": slides_info,
            "files": files,
        }
        write_info(tmp, info)
    return SynthSummary(
        out=out,
        fmt=fmt,
        n_normal=images - n_abnormal,
        n_abnormal=n_abnormal,
        files=tuple(out / f for f in files),
        size=size,
    )


@contextmanager
def staging_folder(out: Path, overwrite: bool) -> Iterator[Path]:
    """Check ``out`` (`prepare_out`) and yield a fresh hidden folder beside it to write the dataset into.

    The folder is swapped into ``out`` when the block ends (`infra.outputs.replace_folder`): a previous synth
    output is replaced only then, and comes back if the final rename fails. Any failure or interruption inside
    removes the folder again and leaves ``out`` as it was; an ``OSError`` becomes one `PipelineError` line. End the
    block with `write_info`, the marker that makes the folder a synth dataset.
    """
    prepare_out(out, overwrite)
    try:
        with replace_folder(out) as tmp:
            yield tmp
    except OSError as exc:
        raise PipelineError(
            f"cannot write the dataset to {out} ({exc.strerror or exc}): check space and permissions"
        ) from exc


def write_info(tmp: Path, info: dict[str, Any]) -> None:
    """Write the generator's ``info`` as the dataset's marker file (`MARKER`) in the staging folder ``tmp``."""
    (tmp / MARKER).write_text(json.dumps(info, indent=1) + "\n", encoding="utf-8")
