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

Steps 1-3 are in `pipeline.prepare_tiling`, steps 4-5 in `pipeline.prepare_records`; this module locks, checks and
publishes ``--out`` around them.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

from infra.outputs import (
    OutputError,
    check_replaceable,
    claim_output,
    os_error_message,
    recover_folder,
    replace_folder,
    write_marker,
)
from pipeline.config import PrepareConfig, validate_config
from pipeline.errors import PipelineError
from pipeline.prepare_records import _write_records
from pipeline.prepare_tiling import _parallel, _tile_without_copies, _unique
from pipeline.report import Counts, Skipped, issues_text, text_table
from pipeline.sources import SlideError, dataset_classes, discover, inspect_slide
from pipeline.tiling import hospital_plans

COMMAND = "prepare"  # the name in the ownership marker of the folders prepare writes (infra.outputs)


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

    table = text_table(plans, written.counts, written.slides_per_hospital)
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
