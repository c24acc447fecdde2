"""Raw slides -> per-hospital tile datasets: the FedSAF data processing (paper 001, Sec. 4.2, Figure 3).

`prepare_dataset` runs the whole chain and is what `gastric-fl prepare`, the quick start and the dashboard
call:

1. find the slides of the raw layout (`pipeline.sources`) and check each one: header and integrity, mask or
   SVG annotation, label (all-black mask = normal); a bad slide is skipped and reported (or stops the run
   with ``strict``). Pixels are decoded only once, in step 3 (decoding dominates on large TIFFs). A copy of
   another slide with the same bytes is left out here;
2. share the usable slides out over hospitals of varying sizes and split each hospital's slides into
   train/validation/test (`pipeline.partition`);
3. per slide: tiles cut from the raw pixels with the white-area filter (Step b) and labelled by the mask's
   coverage of their tissue, grayscale and per-hospital resolution (`pipeline.tiling`), written as PNGs; the
   paper's abnormal-region extraction (Step a.1) only with ``--mask-outside`` and only for training tiles. A
   copy with other bytes but the same
   decoded pixels (another format or compression) is found here, from the pixels tiling decodes anyway; it is
   then left out and steps 2-3 are run again without it, so the split is the one the byte rule would give and
   no picture contributes tiles to both train and test (a clean input is decoded once);
4. the shortcut probe (`pipeline.probe`): how well label-free pixel statistics separate the classes per split,
   with a one-line warning above 0.70;
5. ``manifest.csv``, ``prepare.json``, ``report.md`` and ``contact_sheet.png``.

Everything is written into a hidden temporary folder beside ``--out`` and renamed into place at the end
(`infra.outputs.replace_folder`), so an interrupted run never leaves a dataset that looks complete. ``--out``
is locked for the whole run (a second prepare to it is refused) and carries prepare's ownership marker;
``--overwrite`` replaces only a folder that prepare wrote entirely (`infra.outputs`, docs/reliability.md).
Slides are processed by a thread pool: OpenCV and the PNG codec release the GIL, so two threads use both cores
without copying slides between processes (measured in benchmarks/prepare_speed.py). Output bytes depend only on
inputs and settings.
"""

from __future__ import annotations

import csv
import hashlib
import io
import json
import platform
import shutil
import time
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any, TypeVar

import cv2
import numpy as np
from tqdm import tqdm

from infra.formats import MANIFEST_FILE, PREPARE_RECORD
from infra.outputs import (
    OutputError,
    check_replaceable,
    claim_output,
    os_error_message,
    recover_folder,
    replace_folder,
    write_marker,
)
from infra.provenance import synthetic_source
from pipeline.config import PrepareConfig, validate_config
from pipeline.errors import PipelineError
from pipeline.images import encode_png
from pipeline.partition import PFL_KINDS, assign_hospitals, no_validation, pfl_split, split_train_test
from pipeline.probe import probe, probe_markdown, tile_statistics
from pipeline.report import (
    REQUIRED_SPLITS,
    SPLITS,
    Counts,
    Skipped,
    contact_sheet,
    empty_counts,
    issues_text,
    markdown_report,
    text_table,
)
from pipeline.sources import (
    SlideError,
    SlideInfo,
    dataset_classes,
    discover,
    inspect_slide,
    label_of,
    load_slide,
    pixel_sha256,
)
from pipeline.tiling import BLACK_LEVEL, HospitalPlan, cut_tiles, hospital_plans, is_black, tile_name

MANIFEST_COLUMNS: tuple[str, ...] = (
    "client",
    "split",
    "label",
    "path",
    "source",
    "x",
    "y",
    "size",
    "white_ratio",
    "channels",
)
FORMAT_VERSION = 1
MASK_OUTSIDE_DEPARTURE = (
    "training tiles of abnormal slides whitened outside the cancer mask (paper 001 Step a.1, --mask-outside): "
    "painted white marks the abnormal class, a shortcut a model can learn instead of tissue; test tiles are raw"
)
COMMAND = "prepare"  # the name in the ownership marker of the folders prepare writes (infra.outputs)

T = TypeVar("T")
R = TypeVar("R")


@dataclass(frozen=True)
class PrepareResult:
    """What a prepare run produced: where, how many tiles per client/split/label, what was skipped."""

    out: Path
    tiles: int
    slides: int
    counts: Counts
    skipped: tuple[Skipped, ...]
    warnings: tuple[str, ...]
    report: str
    seconds: float
    shortcut_warning: str | None = None


@dataclass(frozen=True)
class _Job:
    info: SlideInfo
    client: int
    split: str
    plan: HospitalPlan


def _versions() -> dict[str, str]:
    def version(dist: str) -> str:
        try:
            return metadata.version(dist)
        except metadata.PackageNotFoundError:
            return "not installed"

    return {
        "python": platform.python_version(),
        "numpy": np.__version__,
        "opencv": cv2.__version__,
        "tifffile": version("tifffile"),
        "imagecodecs": version("imagecodecs"),
        "pillow": version("pillow"),
        "svgelements": version("svgelements"),
        "gastric-fl": version("gastric-fl"),
    }


def _check_overlap(config: PrepareConfig) -> None:
    """Refuse an output that overlaps the raw folder, before any work (raw data is never modified)."""
    src = config.source.input.resolve()
    out = config.output.out.resolve()
    if out == src or src in out.parents or out in src.parents:
        raise PipelineError(
            f"--out {config.output.out} and --input {config.source.input} overlap; write the prepared dataset "
            "to a separate folder (raw data is never modified)"
        )


def _check_replaceable(config: PrepareConfig) -> None:
    """An existing ``--out`` is replaced only with ``overwrite`` and only if prepare wrote all of it.

    Ownership is decided by `infra.outputs.check_replaceable`: the folder must carry prepare's marker and hold
    nothing the marker does not list, so ``--overwrite`` never deletes a file prepare did not write.
    """
    out = config.output.out
    try:
        empty = out.is_dir() and not out.is_symlink() and not any(out.iterdir())
    except OSError as exc:
        raise PipelineError(os_error_message(exc, out)) from None
    if empty:
        return  # an empty folder made beforehand is simply filled
    if out.is_dir() and not out.is_symlink() and not config.output.overwrite:
        raise PipelineError(
            f"output folder {out} already exists; pass --overwrite to replace it or choose another --out"
        )
    check_replaceable(out, COMMAND)


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
        reason = f"{exc} (found while tiling: client {job.client} has one {job.split} slide fewer)"
        return _Outcome(rows=[], skipped=Skipped(ref.source, reason))
    if slide.hashes != job.info.hashes:
        raise PipelineError(f"{ref.source} (or its mask) changed while prepare was running; re-run prepare")
    pixels = pixel_sha256(slide.image)
    label = job.info.label or label_of(ref, slide.mask)
    height, width = slide.image.shape[:2]
    too_small = None
    if min(width, height) < job.plan.size:
        too_small = (
            f"{ref.source}: {width}x{height} is smaller than client {job.client}'s {job.plan.size} px tile square; "
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
    folder = f"client_{job.client:02d}/{job.split}/{label}"
    rows = []
    for tile in tiles:
        rel = f"{folder}/{tile_name(ref.index, ref.source, tile.x, tile.y)}"
        (staging / rel).write_bytes(encode_png(tile.pixels))
        rows.append(
            [
                str(job.client),
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


def _samples(rows: Iterable[list[str]], clients: int, classes: tuple[str, ...]) -> dict[int, dict[str, list[str]]]:
    """Up to four tiles per client and label for the contact sheet, spread evenly over the manifest."""
    grouped: dict[int, dict[str, list[str]]] = {c: {lab: [] for lab in classes} for c in range(clients)}
    for row in rows:
        grouped[int(row[0])][row[2]].append(row[3])
    picked: dict[int, dict[str, list[str]]] = {}
    for client, by_label in grouped.items():
        picked[client] = {}
        for label, paths in by_label.items():
            if len(paths) <= 4:
                picked[client][label] = paths
            else:
                picked[client][label] = [paths[int(i)] for i in np.linspace(0, len(paths) - 1, 4).round()]
    return picked


def _check_splits(counts: Counts, plans: list[HospitalPlan], slides: dict[tuple[int, str], int]) -> None:
    problems = []
    for plan in plans:
        for split in REQUIRED_SPLITS:
            if sum(counts[plan.client][split].values()) == 0:
                problems.append(
                    f"client {plan.client} has no {split} tiles ({slides.get((plan.client, split), 0)} {split} "
                    "slide(s), none gave a tile that passed the filters)"
                )
    if problems:
        raise PipelineError(
            "; ".join(problems)
            + ". Every client needs train and test tiles: use fewer --clients, a larger --white-max/--background-max, "
            "a smaller --tile, or add slides"
        )


def tiles_from(config: PrepareConfig) -> str:
    """How the tiles were cut, in words for the report (and, with Step a.1, named as the departure it is)."""
    raw = (
        f"raw pixels; abnormal when >= {config.tiles.abnormal_coverage:g} of a tile's tissue is inside the mask, "
        "normal from slides with an empty mask"
    )
    if not config.tiles.mask_outside:
        return raw
    return (
        "DEPARTURE (--mask-outside, paper Step a.1): training tiles of abnormal slides whitened outside the mask, "
        "which writes the label into the pixels; test tiles " + raw
    )


def prepare_dataset(config: PrepareConfig) -> PrepareResult:
    """Run the whole pipeline for ``config`` and return what it produced (see the module docstring).

    Raises `PipelineError` (one line naming the file or value) for bad settings, an unusable input folder, an
    existing output without ``overwrite`` (or one holding files prepare did not write), an output another prepare
    is writing, an output that cannot be written (a file in the path, read-only, disk full), a client left
    without tiles of a split, or (``strict``) a bad slide. Nothing is left at ``config.output.out`` unless the
    run succeeds; a previous dataset there stays as it was.
    """
    started = time.perf_counter()
    validate_config(config)
    _check_overlap(config)
    try:
        with claim_output(config.output.out, COMMAND):
            try:
                recover_folder(config.output.out, COMMAND)  # what a killed run left beside --out
            except OSError as exc:
                raise PipelineError(os_error_message(exc, config.output.out)) from None
            _check_replaceable(config)
            return _prepare_claimed(config, started)
    except OutputError as exc:
        raise PipelineError(str(exc)) from None


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


@dataclass(frozen=True)
class _Written:
    """What the records written from a tiling hold: the manifest rows, the kept jobs, the tile counts, the slides
    per hospital, the skipped slides, the warnings and the shortcut probe."""

    rows: list[list[str]]
    jobs: list[_Job]
    counts: Counts
    slides_per_client: dict[int, int]
    skipped: tuple[Skipped, ...]
    warnings: tuple[str, ...]
    shortcut: dict[str, Any]


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
                    (staging / f"client_{plan.client:02d}" / split / label).mkdir(parents=True)
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
            shutil.rmtree(staging / f"client_{plan.client:02d}")
    return _Tiled(jobs, outcomes, ratios, usable, skipped)


def _write_records(
    config: PrepareConfig,
    staging: Path,
    plans: list[HospitalPlan],
    classes: tuple[str, ...],
    tiled: _Tiled,
) -> _Written:
    """Write ``manifest.csv``, ``prepare.json`` (with the shortcut probe), ``report.md`` and ``contact_sheet.png``
    into ``staging`` from the tiling's outcomes."""
    out = config.output
    jobs, outcomes, ratios, usable, skipped = tiled.jobs, tiled.outcomes, tiled.ratios, tiled.usable, tiled.skipped
    warnings = tuple(i.warning for i in usable if i.warning is not None)
    late = [o.skipped for o in outcomes if o.skipped is not None]
    if late and out.strict:
        raise SlideError(f"{late[0].reason} (stopped by --strict)")
    skipped = tuple(sorted([*skipped, *late], key=lambda s: s.source))
    warnings = (*warnings, *(w for o in outcomes for w in o.warnings))
    pixel_digests = {
        j.info.ref.source: o.pixels_sha256
        for j, o in zip(jobs, outcomes, strict=True)
        if o.skipped is None and o.pixels_sha256 is not None
    }
    jobs = [j for j, o in zip(jobs, outcomes, strict=True) if o.skipped is None]
    missing_val = no_validation(
        [j.client for j in jobs], [j.split for j in jobs], config.split.clients, config.split.val_fraction
    )
    if missing_val is not None:  # said, not silent: which hospitals a --val-fraction left without validation
        warnings = (*warnings, missing_val)
    kept_outcomes = [o for o in outcomes if o.skipped is None]
    per_slide = [o.rows for o in kept_outcomes]
    rows = [row for slide_rows in per_slide for row in slide_rows]

    counts = empty_counts(config.split.clients, classes)
    for row in rows:
        counts[int(row[0])][row[1]][row[2]] += 1
    slide_counts: dict[tuple[int, str], int] = {}
    for job in jobs:
        slide_counts[(job.client, job.split)] = slide_counts.get((job.client, job.split), 0) + 1
    _check_splits(counts, plans, slide_counts)

    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(MANIFEST_COLUMNS)
    writer.writerows(rows)
    (staging / MANIFEST_FILE).write_text(buffer.getvalue(), encoding="utf-8")

    slides_per_client = {p.client: sum(1 for j in jobs if j.client == p.client) for p in plans}
    excluded: dict[int, dict[str, int]] = {p.client: dict.fromkeys(SPLITS, 0) for p in plans}
    for job, outcome in zip(jobs, kept_outcomes, strict=True):
        excluded[job.client][job.split] += outcome.left_out
    class_index = {label: k for k, label in enumerate(classes)}
    shortcut = probe(
        [st for o in kept_outcomes for st in o.stats],
        [class_index[row[2]] for row in rows],
        [row[1] for row in rows],
        [int(row[0]) for row in rows],
        SPLITS,
    )
    record = _provenance(config, plans, jobs, per_slide, ratios, counts, skipped, warnings, rows, pixel_digests)
    record["left_out"] = {str(c): per for c, per in excluded.items()}
    record["labels"] = {
        "rule": tiles_from(config),
        "abnormal_coverage": config.tiles.abnormal_coverage,
        "mask_outside": config.tiles.mask_outside,
        # named wherever results from such a dataset appear (the shortcut probe measures what it leaks)
        "departure": MASK_OUTSIDE_DEPARTURE if config.tiles.mask_outside else None,
    }
    record["shortcut_probe"] = shortcut
    (staging / PREPARE_RECORD).write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")

    settings = {
        "format": config.source.format,
        "input": config.source.input.as_posix(),
        "clients": str(config.split.clients),
        "sizes": ("drawn by PFLlib's partition" if config.split.partition.kind in PFL_KINDS else config.split.sizes)
        + " (ratios "
        + ", ".join(f"{r:.2f}" for r in ratios)
        + ")",
        "partition": config.split.partition.spec(),
        "test fraction": f"{config.split.test_fraction:g}",
        "validation fraction": f"{config.split.val_fraction:g}",
        "seed": str(config.split.seed),
        "classes": ", ".join(classes),
        "simulated sites": (
            "none"
            if all(p.site is None for p in plans)
            else f"{config.sites.shift} (strength {config.sites.strength:g}"
            + (f", {len(config.sites.profile)} listed" if config.sites.profile else "")
            + "): profiles in prepare.json, clients[].site"
        ),
        "tiles": tiles_from(config),
        "background max (every tile)": f"{config.tiles.background_max:g}",
        "abnormal coverage": f"{config.tiles.abnormal_coverage:g} of a tile's tissue inside the mask",
        "left out (abnormal slides, too little annotated tissue)": ", ".join(
            f"client {c}: " + " / ".join(f"{n} {s}" for s, n in per.items()) for c, per in excluded.items()
        ),
        "near-white": f"all channels >= {config.tiles.white_level}",
        "slides with no kept tile": str(sum(1 for slide_rows in per_slide if not slide_rows)),
    }
    if config.clients.group:
        settings["groups (clients.group)"] = _groups_text(config.clients.group)
    if config.tiles.mask_outside:
        settings["white max (Step a.1, training)"] = f"{config.tiles.white_max:g}"
    report_md = markdown_report(settings, plans, counts, slides_per_client, skipped, warnings, probe_markdown(shortcut))
    (staging / "report.md").write_text(report_md, encoding="utf-8")
    sheet = contact_sheet(staging, plans, _samples(rows, config.split.clients, classes), classes)
    ok, png = cv2.imencode(".png", sheet)
    if not ok:
        raise PipelineError("could not encode contact_sheet.png (OpenCV PNG encoder)")
    (staging / "contact_sheet.png").write_bytes(png.tobytes())
    return _Written(rows, jobs, counts, slides_per_client, skipped, warnings, shortcut)


def _groups_text(groups: tuple[str, ...]) -> str:
    """``clients.group`` for the report, e.g. ``A: 0, 1, 2; B: 3, 4`` (groups in order of their first hospital)."""
    members: dict[str, list[int]] = {}
    for client, name in enumerate(groups):
        members.setdefault(name, []).append(client)
    return "; ".join(f"{name}: {', '.join(map(str, clients))}" for name, clients in members.items())


def _prepare_claimed(config: PrepareConfig, started: float) -> PrepareResult:
    """`prepare_dataset` once ``--out`` is locked and checked: slides, split, tiles, files, publish."""
    classes = dataset_classes(config.source)
    refs = discover(config.source)
    out = config.output
    infos = list(
        _parallel(
            lambda ref: inspect_slide(ref, config.source, config.source.input),
            refs,
            out.workers,
            "checking slides",
            out.progress,
        )
    )
    usable, copies = _unique([i for i in infos if i.problem is None])
    skipped = tuple(
        sorted(
            [*(Skipped(i.ref.source, i.problem) for i in infos if i.problem is not None), *copies],
            key=lambda s: s.source,
        )
    )
    if skipped and out.strict:
        raise SlideError(f"{skipped[0].reason} (stopped by --strict; {len(skipped)} bad slide(s) in total)")
    if not usable:
        raise PipelineError(
            f"none of the {len(infos)} slide(s) in {config.source.input} is usable; first problem: {skipped[0].reason}"
        )
    plans = hospital_plans(config)
    try:
        # 0700, as a prepared dataset has always been; marked at once, so that recover_folder knows it as ours
        with replace_folder(out.out, mode=0o700) as staging:
            write_marker(staging, COMMAND, complete=False, record_contents=False)
            tiled = _tile_without_copies(config, staging, usable, skipped, plans, classes)
            written = _write_records(config, staging, plans, classes, tiled)
            write_marker(staging, COMMAND)
            check_replaceable(out.out, COMMAND)  # again, last: files may have been added to --out while tiling
    except OSError as exc:
        raise PipelineError(os_error_message(exc, out.out)) from None

    table = text_table(plans, written.counts, written.slides_per_client)
    notes = issues_text(written.skipped, written.warnings)
    report = f"{table}\n{notes}" if notes else table
    if written.shortcut["warning"]:
        report += f"\nWarning: {written.shortcut['warning']}"
    return PrepareResult(
        out=out.out,
        tiles=len(written.rows),
        slides=len(written.jobs),
        counts=written.counts,
        skipped=written.skipped,
        warnings=written.warnings,
        report=report,
        seconds=time.perf_counter() - started,
        shortcut_warning=written.shortcut["warning"],
    )


def _provenance(
    config: PrepareConfig,
    plans: list[HospitalPlan],
    jobs: list[_Job],
    per_slide: list[list[list[str]]],
    ratios: list[float],
    counts: Counts,
    skipped: tuple[Skipped, ...],
    warnings: tuple[str, ...],
    rows: list[list[str]],
    pixel_digests: dict[str, str],
) -> dict[str, Any]:
    """``prepare.json``: enough to trace every tile to a source file version and to redo the run.

    ``source_sha256`` hashes the bytes of every file read (slides, masks, annotations), and each entry of
    ``slides`` carries its slide file's (``sha256``); ``source_pixels_sha256``
    the decoded pixels of every used slide (`pipeline.sources.pixel_sha256`), which identify a slide whatever
    its encoding.
    """
    hashes: dict[str, str] = {}
    for job in jobs:
        hashes.update(dict(job.info.hashes))
    classes = tuple(next(iter(counts.values()))["train"])
    manifest_digest = hashlib.sha256()
    for row in rows:
        manifest_digest.update((",".join(row) + "\n").encode())
    return {
        "format_version": FORMAT_VERSION,
        "config": config.to_json(),
        # slides made by `gastric-fl synth`: every result trained on them says so (infra.provenance)
        "synthetic": synthetic_source(config.source.input),
        # Class index order: the manifest's label i is classes[i] (binary datasets: normal 0, abnormal 1).
        "classes": list(classes),
        "versions": _versions(),
        "white_definition": (
            f"a pixel is near-white when all three RGB channels are >= {config.tiles.white_level}; white_ratio is "
            "measured on the tile's source square at original resolution"
        ),
        "clients": [
            {
                "client": p.client,
                "grayscale": p.grayscale,
                "channels": p.channels,
                "tile_px": p.tile_px,
                "scale": p.scale,
                "source_px": p.size,
                "stride_source_px": p.stride,
                "abnormal_stride_source_px": p.abnormal_stride,
                "site": None if p.site is None else p.site.to_json(),
                # the hospital's group (clients.group; None when not given): its stain, scanner and case mix are
                # those of the other hospitals in the group (docs/pipeline.md, "Regimes": clustered)
                "group": config.clients.group[p.client] if config.clients.group else None,
                "size_ratio": ratios[p.client],
                "slides": {s: sum(1 for j in jobs if j.client == p.client and j.split == s) for s in SPLITS},
                "tiles": counts[p.client],
            }
            for p in plans
        ],
        "totals": {
            "slides": len(jobs),
            "skipped": len(skipped),
            "tiles": len(rows),
            "slides_without_tiles": sum(1 for slide_rows in per_slide if not slide_rows),
            "by_label": {lab: sum(counts[c][s][lab] for c in counts for s in SPLITS) for lab in classes},
        },
        "slides": [
            {
                "source": j.info.ref.source,
                # the raw files read for it (the slide, its mask or annotation), as source_sha256 names them
                "files": [name for name, _ in j.info.hashes],
                # the slide file's own sha256: scoring its test slides later names one changed or missing since
                "sha256": dict(j.info.hashes).get(j.info.ref.source),
                "label": j.info.label,
                "client": j.client,
                "split": j.split,
                "width": j.info.width,
                "height": j.info.height,
                "tiles": len(slide_rows),
            }
            for j, slide_rows in zip(jobs, per_slide, strict=True)
        ],
        "skipped": [{"source": s.source, "reason": s.reason} for s in skipped],
        "warnings": list(warnings),
        "source_sha256": dict(sorted(hashes.items())),
        "source_pixels_sha256": dict(sorted(pixel_digests.items())),
        "manifest_rows_sha256": manifest_digest.hexdigest(),
    }
