"""Steps 4-5 of `pipeline.prepare`: the shortcut probe, ``manifest.csv``, ``prepare.json``, ``report.md`` and
``contact_sheet.png``.

Written into the staging folder from the tiling's outcomes (`pipeline.prepare_tiling`), with the shortcut probe
(`pipeline.probe`, step 4). ``prepare.json`` (`_provenance`) traces every tile to a source file version and holds
enough to redo the run; ``MANIFEST_COLUMNS`` are the manifest's columns, which the federation reads.
"""

from __future__ import annotations

import csv
import hashlib
import io
import json
import platform
from collections.abc import Iterable
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any

import cv2
import numpy as np

from infra.formats import MANIFEST_FILE, PREPARE_RECORD
from infra.provenance import synthetic_source
from pipeline.config import PrepareConfig
from pipeline.errors import PipelineError
from pipeline.partition import PFL_KINDS, no_validation
from pipeline.prepare_tiling import _Job, _Tiled
from pipeline.probe import probe, probe_markdown
from pipeline.report import REQUIRED_SPLITS, SPLITS, Counts, Skipped, contact_sheet, empty_counts, markdown_report
from pipeline.sources import SlideError
from pipeline.tiling import HospitalPlan

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


def _samples(rows: Iterable[list[str]], hospitals: int, classes: tuple[str, ...]) -> dict[int, dict[str, list[str]]]:
    """Up to four tiles per client and label for the contact sheet, spread evenly over the manifest."""
    grouped: dict[int, dict[str, list[str]]] = {c: {lab: [] for lab in classes} for c in range(hospitals)}
    for row in rows:
        grouped[int(row[0])][row[2]].append(row[3])
    picked: dict[int, dict[str, list[str]]] = {}
    for hospital, by_label in grouped.items():
        picked[hospital] = {}
        for label, paths in by_label.items():
            if len(paths) <= 4:
                picked[hospital][label] = paths
            else:
                picked[hospital][label] = [paths[int(i)] for i in np.linspace(0, len(paths) - 1, 4).round()]
    return picked


def _check_splits(counts: Counts, plans: list[HospitalPlan], slides: dict[tuple[int, str], int]) -> None:
    problems = []
    for plan in plans:
        for split in REQUIRED_SPLITS:
            if sum(counts[plan.hospital][split].values()) == 0:
                problems.append(
                    f"client {plan.hospital} has no {split} tiles ({slides.get((plan.hospital, split), 0)} {split} "
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


@dataclass(frozen=True)
class _Written:
    """What the records written from a tiling hold: the manifest rows, the kept jobs, the tile counts, the slides
    per hospital, the skipped slides, the warnings and the shortcut probe."""

    rows: list[list[str]]
    jobs: list[_Job]
    counts: Counts
    slides_per_hospital: dict[int, int]
    skipped: tuple[Skipped, ...]
    warnings: tuple[str, ...]
    shortcut: dict[str, Any]


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
        [j.hospital for j in jobs], [j.split for j in jobs], config.split.clients, config.split.val_fraction
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
        slide_counts[(job.hospital, job.split)] = slide_counts.get((job.hospital, job.split), 0) + 1
    _check_splits(counts, plans, slide_counts)

    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(MANIFEST_COLUMNS)
    writer.writerows(rows)
    (staging / MANIFEST_FILE).write_text(buffer.getvalue(), encoding="utf-8")

    slides_per_hospital = {p.hospital: sum(1 for j in jobs if j.hospital == p.hospital) for p in plans}
    excluded: dict[int, dict[str, int]] = {p.hospital: dict.fromkeys(SPLITS, 0) for p in plans}
    for job, outcome in zip(jobs, kept_outcomes, strict=True):
        excluded[job.hospital][job.split] += outcome.left_out
    class_index = {label: k for k, label in enumerate(classes)}
    shortcut = probe(
        [st for o in kept_outcomes for st in o.stats],
        [class_index[row[2]] for row in rows],
        [row[1] for row in rows],
        [int(row[0]) for row in rows],
        SPLITS,
        slides=[row[MANIFEST_COLUMNS.index("source")] for row in rows],
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
            if all(p.stain_profile is None for p in plans)
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
    report_md = markdown_report(
        settings, plans, counts, slides_per_hospital, skipped, warnings, probe_markdown(shortcut)
    )
    (staging / "report.md").write_text(report_md, encoding="utf-8")
    sheet = contact_sheet(staging, plans, _samples(rows, config.split.clients, classes), classes)
    ok, png = cv2.imencode(".png", sheet)
    if not ok:
        raise PipelineError("could not encode contact_sheet.png (OpenCV PNG encoder)")
    (staging / "contact_sheet.png").write_bytes(png.tobytes())
    return _Written(rows, jobs, counts, slides_per_hospital, skipped, warnings, shortcut)


def _groups_text(groups: tuple[str, ...]) -> str:
    """``clients.group`` for the report, e.g. ``A: 0, 1, 2; B: 3, 4`` (groups in order of their first hospital)."""
    members: dict[str, list[int]] = {}
    for hospital, name in enumerate(groups):
        members.setdefault(name, []).append(hospital)
    return "; ".join(f"{name}: {', '.join(map(str, hospitals))}" for name, hospitals in members.items())


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
                "client": p.hospital,
                "grayscale": p.grayscale,
                "channels": p.channels,
                "tile_px": p.tile_px,
                "scale": p.scale,
                "source_px": p.size,
                "stride_source_px": p.stride,
                "abnormal_stride_source_px": p.abnormal_stride,
                "site": None if p.stain_profile is None else p.stain_profile.to_json(),
                # the hospital's group (clients.group; None when not given): its stain, scanner and case mix are
                # those of the other hospitals in the group (docs/pipeline.md, "Regimes": clustered)
                "group": config.clients.group[p.hospital] if config.clients.group else None,
                "size_ratio": ratios[p.hospital],
                "slides": {s: sum(1 for j in jobs if j.hospital == p.hospital and j.split == s) for s in SPLITS},
                "tiles": counts[p.hospital],
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
                "client": j.hospital,
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
