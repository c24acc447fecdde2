"""A hospital's exported model on whole slides: tile, score, map, summarise (issue 12, part 2).

For each slide, with the bundle's card (`models.bundle`):

1. **Tiles** exactly as ``gastric-fl prepare`` cuts a normal slide (FedSAF paper 001, Sec. 4.2, Step b;
   `pipeline.tiling`): squares of ``tiling.source_px`` slide pixels on the ``tiling.stride_px`` grid from the top-left
   corner, kept when at most ``tiling.background_max`` of their pixels are near-white (all RGB channels >=
   ``tiling.white_level``), each cut, resized to ``preprocess.tile_px`` and made gray for a gray hospital by
   `pipeline.tiling.cut_square`. The scoring never looks at an annotation.
2. **Scores**: `models.preprocess.Preprocess` (channels, resize to ``input_size``, normalisation) then the
   network in eval mode; ``P(abnormal)`` is the softmax (in float64, as the evaluation computes it) of the
   positive class.
3. **Outputs** per slide, in ``<out>/<slide>-<path digest>/`` (`inference.slides.SlideFile.output_name`: one folder
   per file, so slides whose names differ only in spaces, suffix or folder never overwrite each other):
   ``tiles.csv`` (x, y, size, probability, and the ground-truth label when known), ``overlay.png`` (the probability
   over the slide, `inference.heatmap`) and ``summary.json`` (maximum probability, top-k mean, abnormal area
   fraction at the threshold, tile count, and tile-level sensitivity/specificity when an annotation is at hand);
   ``<out>/summary.csv`` has one row per slide.

Bounded and checked input: a slide whose header declares more than ``max_pixels`` pixels is refused before it is
decoded (`pipeline.images.check_pixels`), a bundle with non-finite weights is refused when it is loaded
(`models.bundle.load_bundle`), and a black slide (prepare's rule, `pipeline.tiling.is_black`), whose squares pass
the white-area filter although they hold no tissue, is scored with a warning.

Ground truth (`tile_truth`) follows prepare's labelling (`pipeline.tiling`): a tile is *abnormal* when at least
``tiling.abnormal_coverage`` of its tissue is inside the annotation, *normal* when none of its tissue is, and
unlabelled otherwise (prepare leaves such tiles out).

Outputs are written atomically (a temporary file renamed into place); ``--out`` is locked for the call and carries
predict's ownership marker (`infra.outputs`). Predict replaces only files it writes and deletes nothing.
"""

from __future__ import annotations

import csv
import io
import json
import math
import time
from collections.abc import Callable, Sequence
from contextlib import nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import torch
from tqdm import tqdm

from inference.heatmap import COLORMAP, UNFAMILIAR_MARK, coverage_maps, render_overlay
from inference.slides import Slide, SlideFile, find_slides, read_slide
from infra.outputs import (
    OutputError,
    check_addable,
    claim_output,
    os_error_message,
    write_atomic,
    write_marker,
)
from models.bundle import Bundle, BundleError, ModelCard, decision_counts, load_bundle, read_card
from models.decision import (
    FALSE_ALARM,
    MISSED_CANCER,
    SLIDE_TOP_K,
    UNFAMILIAR_LIMIT,
    outcome,
    reported_call,
    slide_is_abnormal,
    top_k_mean,
)
from models.features import LayerStatistics
from pipeline.errors import PipelineError
from pipeline.images import DEFAULT_MAX_PIXELS, RGBImage, check_max_pixels, encode_png
from pipeline.tiling import BLACK_LEVEL, HospitalPlan, cut_square, grid_coverage, is_black, kept_positions, near_white

COMMAND = "predict"
TILE_COLUMNS = ("x", "y", "size", "probability", "truth", "tissue", "distance")
SUMMARY_COLUMNS = (
    "slide",
    "folder",
    "file",
    "tiles",
    "max_probability",
    "top_k_mean",
    "call",
    "truth",
    "threshold",
    "abnormal_area_fraction",
    "sensitivity",
    "specificity",
    "unfamiliar_share",
    "unfamiliar",
    "focus",
    "review",
    "reported",
    "outcome",
)
DEFAULT_BATCH = 64
DEFAULT_TOP_K = SLIDE_TOP_K
DEFAULT_MAX_SIDE = 4096


class PredictError(PipelineError):
    """A slide that cannot be scored (no tissue, smaller than a tile), or a bundle without a tile grid."""


@dataclass(frozen=True)
class SlideTiles:
    """A slide's scored tiles: top-left corners in slide pixels, square side, ``P(abnormal)`` and truth.

    ``truth``: 1 abnormal, 0 normal, -1 unlabelled (prepare's rule, `tile_truth`); ``None`` without an annotation.
    """

    xs: npt.NDArray[np.int64]
    ys: npt.NDArray[np.int64]
    size: int
    probability: npt.NDArray[np.float64]
    truth: npt.NDArray[np.int8] | None = None
    # each tile's squared Mahalanobis distance from the hospital's tissue (models.shift) and whether it is beyond
    # the description's threshold; None when the bundle has no description
    distance: npt.NDArray[np.float64] | None = None
    unfamiliar: npt.NDArray[np.bool_] | None = None


@dataclass
class SlideResult:
    """What predict wrote for one slide (``summary`` is ``summary.json``), or why it was skipped; ``warnings``: what
    the user should know about a scored slide (a black slide, an SVG clipped to the slide)."""

    file: SlideFile
    summary: dict[str, Any] = field(default_factory=dict)
    folder: Path | None = None
    problem: str | None = None
    warnings: tuple[str, ...] = ()


UNIFORM_STD = 2.0  # a slide whose pixels vary less than this (standard deviation, 0-255) shows no structure


def uniform_spread(image: np.ndarray) -> float:
    """The standard deviation of a slide's pixel values, on every 16th row and column (a large slide needs no more
    to tell a uniform colour from tissue, and no float copy of the whole slide)."""
    return float(np.asarray(image[::16, ::16], dtype=np.float32).std())


def check_binary(card: ModelCard, where: Path | str = "the bundle") -> None:
    """`BundleError` (one line) unless ``card`` is a binary model with a positive class (``abnormal``): predict
    maps ``P(abnormal)`` over a slide, which a multi-class model (e.g. trained on digits) does not have."""
    if card.num_classes != 2 or card.positive_class is None:
        names = ", ".join(card.class_names[:5]) + (", ..." if card.num_classes > 5 else "")
        raise BundleError(
            f"{where} is a {card.num_classes}-class model ({names}) that decides by argmax; gastric-fl predict maps "
            "P(abnormal) over slides and needs a normal/abnormal model: export one from a run on a gastric dataset"
        )


def plan_of(card: ModelCard) -> HospitalPlan:
    """The card's tile grid as the `pipeline.tiling.HospitalPlan` prepare cut this hospital's tiles with."""
    grid, pre = card.tiling, card.preprocess
    if grid is None or pre.tile_px is None:
        raise BundleError(
            "the bundle's card has no tile grid (its dataset had no prepare.json), so it cannot tile whole slides; "
            "export it from a run trained on a dataset made by gastric-fl prepare"
        )
    return HospitalPlan(
        client=card.client,
        tile_px=pre.tile_px,
        scale=pre.scale if pre.scale is not None else 1.0,
        size=grid.source_px,
        stride=grid.stride_px,
        abnormal_stride=grid.abnormal_stride_px,
        grayscale=pre.grayscale,
    )


def tissue_positions(image: RGBImage, card: ModelCard, name: str = "slide") -> list[tuple[int, int]]:
    """``(x, y)`` of every tile prepare would keep from this slide were it normal (`pipeline.tiling.kept_positions`).

    `PredictError` when the slide is smaller than one tile square or no square passes the white-area filter.
    """
    plan = plan_of(card)
    grid = card.tiling
    assert grid is not None  # plan_of checked it
    height, width = image.shape[:2]
    if min(width, height) < plan.size:
        raise PredictError(
            f"{name}: {width}x{height} is smaller than one tile square ({plan.size} px), so there is nothing to score"
        )
    kept = kept_positions(image, plan, grid.background_max, grid.white_level)
    if not kept:
        raise PredictError(
            f"{name}: no tissue: no {plan.size} px square has at most {grid.background_max:g} near-white pixels "
            f"(all channels >= {grid.white_level}); is it a blank or background-only image?"
        )
    return [(x, y) for y, x, _ in kept]


def score_positions(
    bundle: Bundle,
    image: RGBImage,
    positions: Sequence[tuple[int, int]],
    *,
    batch_size: int = DEFAULT_BATCH,
    device: torch.device | str = "cpu",
    on_batch: Callable[[int], object] | None = None,
    statistics: LayerStatistics | None = None,
) -> npt.NDArray[np.float64]:
    """``P(positive class)`` of the tiles at ``positions``: cut as prepare cuts, preprocessed as in training.
    ``statistics``: records the tissue description's layer statistics (`models.features`) in the same passes."""
    plan = plan_of(bundle.card)
    pre = bundle.card.preprocess
    positive = bundle.card.positive_index
    model = bundle.model
    model.eval()
    out = np.empty(len(positions), dtype=np.float64)
    with torch.inference_mode(), statistics.capture() if statistics is not None else nullcontext():
        for start in range(0, len(positions), batch_size):
            chunk = positions[start : start + batch_size]
            batch = np.stack([pre.fit(cut_square(image, None, x, y, plan)) for x, y in chunk])
            logits = model(pre.tensor(batch, device))
            out[start : start + len(chunk)] = torch.softmax(logits.double(), dim=1)[:, positive].cpu().numpy()
            if on_batch is not None:
                on_batch(len(chunk))
    return out


def score_slide(
    bundle: Bundle,
    image: RGBImage,
    name: str = "slide",
    *,
    cancer: npt.NDArray[np.bool_] | None = None,
    batch_size: int = DEFAULT_BATCH,
    device: torch.device | str = "cpu",
    progress: bool = False,
    shift: bool = True,
) -> SlideTiles:
    """The whole slide's tissue grid (`tissue_positions`) scored (`score_positions`), with each tile's truth when an
    annotation (``cancer``) is given (`tile_truth`): what ``predict`` scores a slide with, and ``slides.csv``
    (`app.held_out`) too. With the bundle's tissue description (and ``shift``), each tile's distance from the
    hospital's tissue and whether it is unfamiliar (`models.shift`), from the same forward passes.
    `PredictError` for a slide smaller than a tile or without tissue."""
    card = bundle.card
    positions = tissue_positions(image, card, name)
    described = bundle.tissue if shift else None
    stats = None if described is None else LayerStatistics(bundle.model, described.layer)
    bar = tqdm(total=len(positions), desc=Path(name).name, unit="tile", disable=not progress, leave=False)
    try:
        prob = score_positions(
            bundle, image, positions, batch_size=batch_size, device=device, on_batch=bar.update, statistics=stats
        )
    finally:
        bar.close()
    distance = None if described is None or stats is None else described.distances(stats.take())
    return SlideTiles(
        xs=np.array([x for x, _ in positions], dtype=np.int64),
        ys=np.array([y for _, y in positions], dtype=np.int64),
        size=plan_of(card).size,
        probability=prob,
        truth=None if cancer is None else tile_truth(image, cancer, positions, card),
        distance=distance,
        unfamiliar=None if distance is None or described is None else distance > described.threshold,
    )


def tile_truth(
    image: RGBImage, cancer: npt.NDArray[np.bool_], positions: Sequence[tuple[int, int]], card: ModelCard
) -> npt.NDArray[np.int8]:
    """Each tile's label by prepare's rule: 1 abnormal, 0 normal, -1 neither (see the module docstring)."""
    plan, grid = plan_of(card), card.tiling
    assert grid is not None
    white = near_white(image, grid.white_level)
    xs, ys, coverage = grid_coverage(white, cancer, plan.size, plan.stride)
    col = {x: j for j, x in enumerate(xs)}
    row = {y: i for i, y in enumerate(ys)}
    truth = np.full(len(positions), -1, dtype=np.int8)
    for k, (x, y) in enumerate(positions):
        share = coverage[row[y], col[x]]
        if share >= grid.abnormal_coverage:
            truth[k] = 1
        elif share == 0.0:
            truth[k] = 0
    return truth


def summarise(
    tiles: SlideTiles,
    card: ModelCard,
    threshold: float,
    top_k: int,
    shape: tuple[int, int],
    threshold_source: str | None = None,
    tissue: str = "",
) -> dict[str, Any]:
    """The slide-level figures of ``summary.json`` (see docs/inference.md), with the slide's call: abnormal when
    its top-k mean reaches the threshold (`models.decision.slide_is_abnormal`), and which threshold made it; the
    unfamiliar share of its tiles (`models.shift`; ``None`` without a description, ``tissue`` then says why) and
    how the call is reported (`models.decision.reported_call`: UNFAMILIAR, a focus above the threshold, review)."""
    prob = tiles.probability
    k = min(top_k, len(prob))
    score = top_k_mean(prob, k)
    covered, called = coverage_maps(tiles.xs, tiles.ys, tiles.size, prob >= threshold, shape, 1.0)
    call = "abnormal" if slide_is_abnormal(score, threshold) else "normal"
    share = None if tiles.unfamiliar is None else float(tiles.unfamiliar.mean())
    reported = reported_call(call, float(prob.max()), threshold, share)
    out: dict[str, Any] = {
        "tiles": len(prob),
        "tile_size_px": tiles.size,
        "stride_px": card.tiling.stride_px if card.tiling else None,
        "threshold": threshold,
        "threshold_source": card.threshold_source if threshold_source is None else threshold_source,
        "call": call,
        "reported": reported.words,
        "review": reported.review,
        "focus": reported.focus,
        "unfamiliar": reported.unfamiliar,
        "unfamiliar_share": share,
        "unfamiliar_tiles": None if tiles.unfamiliar is None else int(tiles.unfamiliar.sum()),
        "unfamiliar_limit": UNFAMILIAR_LIMIT,
        "tissue": tissue,
        "call_rule": f"abnormal when the mean of the {k} highest tile probabilities is at least {threshold:.4g}",
        "max_probability": float(prob.max()),
        "top_k": k,
        "top_k_mean": score,
        "mean_probability": float(prob.mean()),
        "abnormal_tiles": int((prob >= threshold).sum()),
        "abnormal_area_fraction": float(called.sum() / covered.sum()),
        "tissue_area_px": int(covered.sum()),
    }
    if tiles.truth is not None:
        pos, neg = tiles.truth == 1, tiles.truth == 0
        out["ground_truth"] = {
            "rule": (
                f"abnormal: at least {card.tiling.abnormal_coverage if card.tiling else 0.5:g} of its tissue inside "
                "the annotation; normal: none of it; else unlabelled (prepare's rule)"
            ),
            "abnormal_tiles": int(pos.sum()),
            "normal_tiles": int(neg.sum()),
            "unlabelled_tiles": int((tiles.truth == -1).sum()),
            **decision_counts(prob, pos, neg, threshold),
        }
    return out


def _tiles_csv(tiles: SlideTiles) -> bytes:
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(TILE_COLUMNS)
    labels = {1: "abnormal", 0: "normal", -1: ""}
    for k in range(len(tiles.probability)):
        truth = "" if tiles.truth is None else labels[int(tiles.truth[k])]
        familiar = "" if tiles.unfamiliar is None else "unfamiliar" if tiles.unfamiliar[k] else "familiar"
        distance = "" if tiles.distance is None else f"{tiles.distance[k]:.6g}"
        writer.writerow(
            [int(tiles.xs[k]), int(tiles.ys[k]), tiles.size, f"{tiles.probability[k]:.17g}", truth, familiar, distance]
        )
    return buffer.getvalue().encode("utf-8")


def _check_out(out: Path, slide: Path) -> None:
    """``--out`` must be new, empty or predict's own, and not the slide folder itself."""
    if slide.is_dir() and out.resolve() == slide.resolve():
        raise OutputError(f"--out {out} is the --slide folder; write the results to a separate folder")
    check_addable(out, COMMAND)


def predict_slide(
    bundle: Bundle,
    slide: Slide,
    out: Path,
    *,
    threshold: float | None = None,
    top_k: int = DEFAULT_TOP_K,
    batch_size: int = DEFAULT_BATCH,
    max_side: int = DEFAULT_MAX_SIDE,
    device: torch.device | str = "cpu",
    progress: bool = True,
    shift: bool = True,
) -> SlideResult:
    """Tile, score and map one decoded slide; writes ``<out>/<slide output name>/`` and returns its summary.
    ``shift``: mark unfamiliar tissue with the bundle's tissue description (off only to measure its cost)."""
    started = time.perf_counter()
    card = bundle.card
    chosen = card.threshold if threshold is None else threshold
    name = str(slide.file.path)
    tiles = score_slide(
        bundle,
        slide.image,
        name,
        cancer=slide.cancer,
        batch_size=batch_size,
        device=device,
        progress=progress,
        shift=shift,
    )
    warnings = [] if slide.warning is None else [slide.warning]
    if is_black(slide.image):
        warnings.append(
            f"{name}: the slide is black (every pixel <= {BLACK_LEVEL}), so its {len(tiles.xs)} tile(s) show no "
            "tissue and their probabilities mean nothing; check the scan"
        )
    elif (spread := uniform_spread(slide.image)) < UNIFORM_STD:
        warnings.append(
            f"{name}: the slide is one uniform colour (pixel standard deviation {spread:.1f}), so its "
            f"{len(tiles.xs)} tile(s) show no tissue structure and their probabilities mean nothing; check the scan"
        )
    prob = tiles.probability
    height, width = slide.image.shape[:2]
    note = (
        "not used (predict called without the tissue description)"
        if not shift
        else bundle.tissue_note
        if bundle.tissue is None
        else bundle.tissue.words()
    )
    summary: dict[str, Any] = {
        "slide": slide.file.name,
        "folder": slide.file.output_name,
        "file": str(slide.file.path),
        "annotation": None if slide.file.annotation is None else str(slide.file.annotation),
        "truth": None if slide.cancer is None else "abnormal" if bool(slide.cancer.any()) else "normal",
        "width": width,
        "height": height,
        "model": {
            "bundle": str(bundle.folder),
            "architecture": card.architecture,
            "run_id": card.run_id,
            "round": card.round,
            "client": card.client,
        },
        **summarise(tiles, card, chosen, top_k, (height, width), None if threshold is None else "--threshold", note),
    }
    summary["outcome"] = outcome(str(summary["truth"] or ""), str(summary["call"]))
    # a description fitted on few tiles may miss unfamiliar tissue: `tissue` then says so (models.shift)
    summary["tissue_weak"] = bool(shift and bundle.tissue is not None and bundle.tissue.weak)
    overlay, scale = render_overlay(
        slide.image, tiles.xs, tiles.ys, tiles.size, prob, slide.cancer, max_side, chosen, tiles.unfamiliar
    )
    summary["overlay"] = {
        "file": "overlay.png",
        "width": int(overlay.shape[1]),
        "height": int(overlay.shape[0]),
        "scale": scale,
        "colormap": COLORMAP,
        "shown_from": chosen,
        "outline": "ground-truth annotation (white on black)" if slide.cancer is not None else None,
        "unfamiliar": UNFAMILIAR_MARK if tiles.unfamiliar is not None else None,
    }
    if warnings:
        summary["warning"] = "; ".join(warnings)
    summary["seconds"] = round(time.perf_counter() - started, 3)
    folder = out / slide.file.output_name
    folder.mkdir(parents=True, exist_ok=True)
    write_atomic(folder / "tiles.csv", _tiles_csv(tiles))
    write_atomic(folder / "overlay.png", encode_png(overlay))
    write_atomic(folder / "summary.json", (json.dumps(summary, indent=2, allow_nan=False) + "\n").encode())
    return SlideResult(file=slide.file, summary=summary, folder=folder, warnings=tuple(warnings))


def _flag(value: object, known: bool) -> str:
    """``true``/``false`` for summary.csv, empty where the value is not known (no description, a skipped slide)."""
    return ("true" if value else "false") if known else ""


def _summary_csv(results: Sequence[SlideResult]) -> bytes:
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow([*SUMMARY_COLUMNS, "problem"])
    for r in results:
        s = r.summary
        truth = s.get("ground_truth", {})

        def fmt(value: Any) -> str:
            return "" if value is None or (isinstance(value, float) and math.isnan(value)) else f"{value:.6g}"

        writer.writerow(
            [
                r.file.name,
                r.file.output_name if r.folder is not None else "",
                str(r.file.path),
                s.get("tiles", ""),
                fmt(s.get("max_probability")),
                fmt(s.get("top_k_mean")),
                s.get("call", ""),
                s.get("truth") or "",
                fmt(s.get("threshold")),
                fmt(s.get("abnormal_area_fraction")),
                fmt(truth.get("sensitivity")),
                fmt(truth.get("specificity")),
                fmt(s.get("unfamiliar_share")),
                _flag(s.get("unfamiliar"), s.get("unfamiliar_share") is not None),
                _flag(s.get("focus"), bool(s)),
                _flag(s.get("review"), bool(s)),
                s.get("reported", ""),
                s.get("outcome", ""),
                r.problem or "",
            ]
        )
    return buffer.getvalue().encode("utf-8")


def slide_calls_line(results: Sequence[SlideResult]) -> str | None:
    """One line on the slide calls against the slides' truth (those with an annotation or a ``normal`` folder):
    abnormal slides called abnormal and normal slides called normal, with the threshold; ``None`` without truth."""
    judged = [r.summary for r in results if r.problem is None and r.summary.get("truth") in ("abnormal", "normal")]
    if not judged:
        return None
    abnormal = [s for s in judged if s["truth"] == "abnormal"]
    normal = [s for s in judged if s["truth"] == "normal"]
    found = sum(s["call"] == "abnormal" for s in abnormal)
    cleared = sum(s["call"] == "normal" for s in normal)
    thresholds = sorted({f"{float(s['threshold']):.2f}" for s in judged})
    text = (
        f"slide calls at threshold {', '.join(thresholds)}: {found} of {len(abnormal)} abnormal slides called "
        f"abnormal, {cleared} of {len(normal)} normal slides called normal"
    )
    for word in (MISSED_CANCER, FALSE_ALARM):
        named = [str(s["slide"]) for s in judged if s.get("outcome") == word]
        text += f"; {word}: {', '.join(named)}" if named else ""
    unfamiliar = sum(bool(s.get("unfamiliar")) for s in judged)
    focus = sum(bool(s.get("focus")) for s in judged)
    text += f"; {unfamiliar} UNFAMILIAR (do not rely on their calls)" if unfamiliar else ""
    return text + (f"; {focus} normal with a focus above the threshold (review)" if focus else "")


def predict(
    model: Path,
    slide: Path,
    out: Path,
    *,
    threshold: float | None = None,
    top_k: int = DEFAULT_TOP_K,
    batch_size: int = DEFAULT_BATCH,
    max_side: int = DEFAULT_MAX_SIDE,
    device: str = "cpu",
    progress: bool = True,
    warn: Callable[[str], None] | None = None,
    max_pixels: int = DEFAULT_MAX_PIXELS,
    shift: bool = True,
) -> list[SlideResult]:
    """``gastric-fl predict``: score every slide ``slide`` names with the bundle at ``model`` into ``out``.

    A bundle that does not fit, holds non-finite weights or is not a binary normal/abnormal model (`check_binary`)
    raises `BundleError`; a single slide that cannot be read, declares more than ``max_pixels`` pixels or holds no
    tissue raises `PipelineError`. With a folder of slides, a bad slide is reported through ``warn`` and skipped,
    the others are written, and a `PredictError` naming the first problem is raised at the end. All are one line.
    A scored slide's warnings (e.g. a black slide) go to ``warn`` too, and into its ``summary.json``.
    """
    if threshold is not None and not 0.0 < threshold < 1.0:
        raise PredictError(f"--threshold must be strictly between 0 and 1, got {threshold}")
    if top_k < 1 or batch_size < 1 or max_side < 16:
        raise PredictError("--top-k and --batch-size must be at least 1 and --max-side at least 16")
    check_max_pixels(max_pixels)
    torch_device = torch.device(
        "cuda" if device == "auto" and torch.cuda.is_available() else device.replace("auto", "cpu")
    )
    check_binary(read_card(model), model)  # before the weights are read: the card alone decides
    bundle = load_bundle(model, torch_device)
    plan_of(bundle.card)
    files = find_slides(slide, exclude=out)
    _check_out(out, slide)
    results: list[SlideResult] = []
    try:
        with claim_output(out, COMMAND):
            _check_out(out, slide)
            out.mkdir(parents=True, exist_ok=True)
            write_marker(out, COMMAND, record_contents=False)
            for file in tqdm(files, desc="slides", unit="slide", disable=not progress or len(files) == 1):
                try:
                    decoded = read_slide(file, max_pixels)
                    result = predict_slide(
                        bundle,
                        decoded,
                        out,
                        threshold=threshold,
                        top_k=top_k,
                        batch_size=batch_size,
                        max_side=max_side,
                        device=torch_device,
                        progress=progress,
                        shift=shift,
                    )
                    del decoded  # free this slide's pixels before the next slide is decoded
                    results.append(result)
                    if warn is not None:
                        for message in result.warnings:
                            warn(message)
                except PipelineError as exc:
                    if len(files) == 1:
                        raise
                    results.append(SlideResult(file=file, problem=str(exc)))
                    if warn is not None:
                        warn(str(exc))
            write_atomic(out / "summary.csv", _summary_csv(results))
    except OSError as exc:
        raise OutputError(os_error_message(exc, out)) from None
    failed = [r for r in results if r.problem is not None]
    if failed:
        raise PredictError(
            f"{len(failed)} of {len(files)} slide(s) could not be scored (the others are in {out}); "
            f"first: {failed[0].problem}"
        )
    return results
