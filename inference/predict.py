"""A hospital's exported model on whole slides: tile, score, map, summarise (issue 12, part 2).

For each slide, with the bundle's card (`models.bundle`; steps 1-2 and the ground truth in `inference.scoring`, the
tables of step 3 in `inference.results`):

1. **Tiles** and 2. **Scores** as `inference.scoring` describes them (prepare's grid, the bundle's preprocessing,
   ``P(abnormal)`` in float64).
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

Ground truth (`inference.scoring.tile_truth`) follows prepare's labelling (`pipeline.tiling`): a tile is *abnormal*
when at least ``tiling.abnormal_coverage`` of its tissue is inside the annotation, *normal* when none of its tissue
is, and unlabelled otherwise (prepare leaves such tiles out).

Outputs are written atomically (a temporary file renamed into place); ``--out`` is locked for the call and carries
predict's ownership marker (`infra.outputs`). Predict replaces only files it writes and deletes nothing.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch
from tqdm import tqdm

from inference.heatmap import COLORMAP, UNFAMILIAR_MARK, render_overlay
from inference.results import SlideResult, _summary_csv, _tiles_csv
from inference.scoring import DEFAULT_BATCH, PredictError, check_binary, plan_of, score_slide, summarise
from inference.slides import Slide, find_slides, read_slide
from infra.formats import SLIDE_SUMMARY_FILE
from infra.outputs import OutputError, check_addable, claim_output, os_error_message, write_atomic, write_marker
from models.bundle import Bundle, load_bundle, read_card
from models.decision import SLIDE_TOP_K, outcome
from pipeline.errors import PipelineError
from pipeline.images import DEFAULT_MAX_PIXELS, check_max_pixels, encode_png
from pipeline.tiling import BLACK_LEVEL, is_black

COMMAND = "predict"
DEFAULT_TOP_K = SLIDE_TOP_K
DEFAULT_MAX_SIDE = 4096


UNIFORM_STD = 2.0  # a slide whose pixels vary less than this (standard deviation, 0-255) shows no structure


def uniform_spread(image: np.ndarray) -> float:
    """The standard deviation of a slide's pixel values, on every 16th row and column (a large slide needs no more
    to tell a uniform colour from tissue, and no float copy of the whole slide)."""
    return float(np.asarray(image[::16, ::16], dtype=np.float32).std())


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
            "client": card.hospital,
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
    write_atomic(folder / SLIDE_SUMMARY_FILE, (json.dumps(summary, indent=2, allow_nan=False) + "\n").encode())
    return SlideResult(file=slide.file, summary=summary, folder=folder, warnings=tuple(warnings))


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
