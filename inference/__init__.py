"""A hospital's exported model on whole slides: bundles, tile scoring, heatmaps (docs/design.md, "Layout and
layers").

``inference -> models, pipeline``: the bundle format and the preprocessing come from `models.bundle` and
`models.preprocess`, the slide readers and the tiling from `pipeline`; nothing here imports the federation.
`predict` is what ``gastric-fl predict`` runs (docs/inference.md).
"""

from inference.predict import predict, predict_slide
from inference.results import SlideResult
from inference.scoring import PredictError, SlideTiles, plan_of, score_positions, tile_truth, tissue_positions
from inference.slides import Slide, SlideFile, find_slides, read_slide
from models.bundle import Bundle, BundleError, ModelCard, TileGrid, load_bundle, read_card, write_bundle

__all__ = [
    "Bundle",
    "BundleError",
    "ModelCard",
    "PredictError",
    "Slide",
    "SlideFile",
    "SlideResult",
    "SlideTiles",
    "TileGrid",
    "find_slides",
    "load_bundle",
    "plan_of",
    "predict",
    "predict_slide",
    "read_card",
    "read_slide",
    "score_positions",
    "tile_truth",
    "tissue_positions",
    "write_bundle",
]
