"""Steps 1-3 of `pipeline.prepare`: which slides are used, which hospital and split each goes to, and their tiles.

Slides are checked and tiled by a thread pool (`_parallel`, in input order so that output is deterministic).
A copy of another slide is left out twice over: byte-identical files before the split (`_unique`), copies with
other bytes but the same decoded pixels once tiling has decoded them (`_pixel_copies`); the slides are then shared
out and tiled again without them (`_tile_without_copies`), so no picture contributes tiles to both train and test.
Tiles are cut by `pipeline.tiling` (FedSAF paper 001, Sec. 4.2, Step b; Step a.1 only with ``--mask-outside``
and only for training tiles) and written as PNGs into the staging folder.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

import numpy as np
from tqdm import tqdm

from infra.formats import hospital_name
from pipeline.config import PrepareConfig
from pipeline.errors import PipelineError
from pipeline.images import encode_png
from pipeline.partition import PFL_KINDS, assign_hospitals, pfl_split, split_train_test
from pipeline.probe import tile_statistics
from pipeline.report import SPLITS, Skipped
from pipeline.sources import SlideError, SlideInfo, label_of, load_slide, pixel_sha256
from pipeline.tiling import BLACK_LEVEL, HospitalPlan, cut_tiles, is_black, tile_name

T = TypeVar("T")
R = TypeVar("R")


@dataclass(frozen=True)
class _Job:
    info: SlideInfo
    hospital: int
    split: str
    plan: HospitalPlan


def _parallel(func: Callable[[T], R], items: list[T], workers: int, desc: str, progress: bool) -> Iterator[R]:
    """``map`` over a thread pool in input order (so output is deterministic), with a progress bar."""
    bar = tqdm(total=len(items), desc=desc, unit="slide", disable=not progress, leave=False)
    try:
        if workers == 1:
            for item in items:
                yield func(item)
                bar.update()
            return
        with ThreadPoolExecutor(max_workers=workers) as pool:
            futures = [pool.submit(func, item) for item in items]
            try:
                for future in futures:
                    yield future.result()
                    bar.update()
            finally:
                for future in futures:
                    future.cancel()
    finally:
        bar.close()


@dataclass(frozen=True)
class _Outcome:
    """One slide's tiling: its manifest rows, or why it was skipped; warnings; the digest of its decoded pixels."""

    rows: list[list[str]]
    skipped: Skipped | None = None
    warnings: tuple[str, ...] = ()
    pixels_sha256: str | None = None
    # per kept tile, in row order: the shortcut probe's label-free statistics of its stored pixels (pipeline.probe)
    stats: tuple[tuple[float, ...], ...] = ()
    # squares of an abnormal slide that passed the white filter but whose tissue is too little annotated
    left_out: int = 0


def _tile_job(job: _Job, config: PrepareConfig, staging: Path) -> _Outcome:
    """Decode, extract, tile and write one slide: the manifest rows of its kept tiles, or why it was skipped."""
    ref = job.info.ref
    try:
        slide = load_slide(ref, config.source, config.source.input)
    except PipelineError as exc:
        # Pixel data that fails to decode although the header was fine: skipped after the client split.
        reason = f"{exc} (found while tiling: client {job.hospital} has one {job.split} slide fewer)"
        return _Outcome(rows=[], skipped=Skipped(ref.source, reason))
    if slide.hashes != job.info.hashes:
        raise PipelineError(f"{ref.source} (or its mask) changed while prepare was running; re-run prepare")
    pixels = pixel_sha256(slide.image)
    label = job.info.label or label_of(ref, slide.mask)
    height, width = slide.image.shape[:2]
    too_small = None
    if min(width, height) < job.plan.size:
        too_small = (
            f"{ref.source}: {width}x{height} is smaller than client {job.hospital}'s {job.plan.size} px tile square; "
            "no tile taken (use a smaller --tile)"
        )
    # One generator per slide, keyed by seed and slide index: the same tiles are drawn whatever the thread order.
    rng = np.random.default_rng([config.split.seed, ref.index])
    cut = cut_tiles(
        slide.image,
        slide.mask,
        abnormal=label == "abnormal",
        plan=job.plan,
        background_max=config.tiles.background_max,
        white_level=config.tiles.white_level,
        abnormal_coverage=config.tiles.abnormal_coverage,
        max_tiles=config.tiles.max_tiles_per_slide,
        rng=rng,
        # Step a.1 only where asked and only for training tiles: validation and test tiles are always raw.
        masked=config.tiles.mask_outside and job.split == "train",
        white_max=config.tiles.white_max,
    )
    tiles = cut.tiles
    notes = [] if too_small is None else [too_small]
    if tiles and is_black(slide.image):
        notes.append(
            f"{ref.source}: the slide is black (every pixel <= {BLACK_LEVEL}), so its {len(tiles)} {label} tile(s) "
            "show no tissue; check the scan or remove the slide from the input"
        )
    folder = f"{hospital_name(job.hospital)}/{job.split}/{label}"
    rows = []
    for tile in tiles:
        rel = f"{folder}/{tile_name(ref.index, ref.source, tile.x, tile.y)}"
        (staging / rel).write_bytes(encode_png(tile.pixels))
        rows.append(
            [
                str(job.hospital),
                job.split,
                label,
                rel,
                ref.source,
                str(tile.x),
                str(tile.y),
                str(tile.size),
                f"{tile.white_ratio:.6f}",
                str(job.plan.channels),
            ]
        )
    stats = tuple(tile_statistics(tile.pixels, config.tiles.white_level) for tile in tiles)
    return _Outcome(rows=rows, warnings=tuple(notes), pixels_sha256=pixels, stats=stats, left_out=cut.left_out)


def _unique(infos: list[SlideInfo]) -> tuple[list[SlideInfo], list[Skipped]]:
    """Usable slides with byte-identical copies left out (the first in sorted order is kept).

    Two copies of one slide could land in different splits (defect 5 of issue 10): the same pixels in train and
    test. The slide's own SHA-256 (``hashes[0]``) decides; a copy with another mask is still the same image.
    Copies with other bytes but the same decoded pixels are found by `_pixel_copies` once tiling has decoded them.
    """
    first: dict[str, str] = {}
    kept: list[SlideInfo] = []
    copies: list[Skipped] = []
    for info in infos:
        source, digest = info.hashes[0]
        if digest in first:
            copies.append(
                Skipped(
                    source,
                    f"{source}: same bytes as {first[digest]} (SHA-256 {digest[:12]}...); left out so that one image "
                    "cannot be in both train and test (remove the copy from the input)",
                )
            )
            continue
        first[digest] = source
        kept.append(info)
    return kept, copies


def _pixel_copies(jobs: list[_Job], outcomes: list[_Outcome]) -> list[Skipped]:
    """The tiled slides whose decoded pixels repeat an earlier slide's, each with the line that reports it.

    The rule of `_unique`, applied to the decoded pixels (`pipeline.sources.pixel_sha256`): a slide saved again
    as another format or at another compression level has other bytes but is the same image, and must not give
    tiles to both train and test. The first slide in sorted order is kept, whatever its mask or annotation (a
    slide is its image, so a copy with another mask is still a copy).
    """
    first: dict[str, str] = {}
    copies: list[Skipped] = []
    for job, outcome in zip(jobs, outcomes, strict=True):
        digest = outcome.pixels_sha256
        if outcome.skipped is not None or digest is None:
            continue
        source = job.info.ref.source
        if digest not in first:
            first[digest] = source
            continue
        copies.append(
            Skipped(
                source,
                f"{source}: same pixels as {first[digest]} although the files differ (SHA-256 of the decoded pixels "
                f"{digest[:12]}...); left out so that one image cannot be in both train and test (remove one of the "
                "two files from the input)",
            )
        )
    return copies


def _assign(
    config: PrepareConfig, usable: list[SlideInfo], plans: list[HospitalPlan], classes: tuple[str, ...]
) -> tuple[list[_Job], list[float]]:
    """Share ``usable`` out over the hospitals and split each hospital's slides into train/val/test (from the seed)."""
    rng = np.random.default_rng(config.split.seed)
    labels = [str(i.label) for i in usable]
    if config.split.partition.kind in PFL_KINDS:
        owners, splits, ratios = pfl_split(labels, config.split, classes)
        return [_Job(i, c, s, plans[c]) for i, c, s in zip(usable, owners, splits, strict=True)], ratios
    owners, ratios = assign_hospitals(labels, config.split, rng, classes)
    splits = split_train_test(
        labels, owners, config.split.clients, config.split.test_fraction, rng, classes, config.split.val_fraction
    )
    return [_Job(i, c, s, plans[c]) for i, c, s in zip(usable, owners, splits, strict=True)], ratios


@dataclass(frozen=True)
class _Tiled:
    """What tiling left in the staging folder: the jobs and their outcomes (in the same order), the hospitals' size
    ratios, and the usable and skipped slides as they end up."""

    jobs: list[_Job]
    outcomes: list[_Outcome]
    ratios: list[float]
    usable: list[SlideInfo]
    skipped: tuple[Skipped, ...]


def _tile_without_copies(
    config: PrepareConfig,
    staging: Path,
    usable: list[SlideInfo],
    skipped: tuple[Skipped, ...],
    plans: list[HospitalPlan],
    classes: tuple[str, ...],
) -> _Tiled:
    """Share the usable slides out and tile them into ``staging``; again without the slides whose decoded pixels
    copy another's, until none does."""
    out = config.output
    while True:
        jobs, ratios = _assign(config, usable, plans, classes)
        for plan in plans:
            for split in SPLITS:
                for label in classes:
                    (staging / hospital_name(plan.hospital) / split / label).mkdir(parents=True)
        outcomes = list(
            _parallel(lambda job: _tile_job(job, config, staging), jobs, out.workers, "tiling", out.progress)
        )
        pixel_copies = _pixel_copies(jobs, outcomes)
        if not pixel_copies:
            break
        if out.strict:
            raise SlideError(f"{pixel_copies[0].reason} (stopped by --strict)")
        # Pixels are decoded only here, so a copy is recognised only after it was given a hospital and split.
        # Share the slides out again without the copies, as if they had been left out with the byte-identical
        # ones: the split then does not depend on them. Tiling twice costs a second decode, but only when the
        # input holds such copies; a clean input is decoded once.
        left_out = {c.source for c in pixel_copies}
        usable = [i for i in usable if i.ref.source not in left_out]
        skipped = tuple(sorted([*skipped, *pixel_copies], key=lambda s: s.source))
        for plan in plans:
            shutil.rmtree(staging / hospital_name(plan.hospital))
    return _Tiled(jobs, outcomes, ratios, usable, skipped)
