"""A hospital's description of its own tissue, and whether a tile is unlike it (issue 47, part 1).

Torch-free (NumPy, safetensors' NumPy API; scikit-learn on first use), so the pages and the reports read it.

**What is described.** Each tile passed through the hospital's model leaves, at one early layer (`features` names it:
the network's first layer unit, MobileNetV3-Small's stem ``features.0``: convolution, BatchNorm, hard-swish), a vector
of three statistics per channel of that layer's activations over the tile: mean, log standard deviation and log mean
absolute change between neighbouring positions (a texture's fineness; 48 values for MobileNetV3-Small; the logarithms
make the change relative to the spread, which an enlarged slide lowers, a difference). Version 2 (`TISSUE_VERSION`) adds
one scale statistic per channel of the network's input (`models.features.scale_ratio`: the log ratio of the change
between positions two apart to that between neighbours, which an enlarged slide raises whatever its stain; 51 values).
The description is the Gaussian these vectors follow over the hospital's training and validation tiles: their mean
``mu`` and a Ledoit-Wolf shrinkage covariance ``Sigma`` (Ledoit and Wolf 2004, "A well-conditioned estimator for
large-dimensional covariance matrices", as scikit-learn's ``sklearn.covariance.LedoitWolf`` computes it), kept as the
precision ``Sigma^-1``.

**The distance.** A tile's squared Mahalanobis distance ``D(z) = (z - mu)' Sigma^-1 (z - mu)`` (Lee et al. 2018, "A
Simple Unified Framework for Detecting Out-of-Distribution Samples and Adversarial Attacks", Eq. 2; their confidence
score is ``-D``). Version 1: a tile is *unfamiliar* when ``D(z)`` exceeds the description's threshold. Version 2 pools
each tile with its neighbours on the slide's grid (`neighbourhood_median`: the median of ``D`` over the tile and its
tissue neighbours one grid step away across, down or diagonally): a tile is unfamiliar when that median exceeds the
threshold. A lone tile unlike the rest (a corner mostly background, a fold) no longer counts against its hospital's own
slide, while a slide unlike the hospital's is unlike it everywhere. With the scale statistic, on the quick start's
and the stain/scanner regime's runs, this took the own held-out share from up to 0.100 to at most 0.007 and every
other kind (other stains, grey, 2x) to 1.000 (benchmarks/results/shift_detection.md). Tiles without a grid
(`unfamiliar` without one) are judged alone.

**Calibration.** The threshold is the ``quantile`` (default 0.98) of out-of-fold distances: the training and
validation tiles are split by slide into ``folds`` groups, each group's distances are measured from a description
fitted without it, and the threshold is their quantile; the description kept is then fitted on all the tiles. A
threshold taken from distances of tiles the fit had seen would be too tight (every new slide of the hospital's
own would look unfamiliar); grouping by slide measures how far a *new slide* of the same hospital lies, which is
what a held-out slide is. So about ``1 - quantile`` of the hospital's own new tissue is marked unfamiliar by design.
Version 3 changes two things, both for a hospital with few tiles (the data-poor regime's hospitals hold 16-24 tiles
of 3-4 slides for 51 statistics): the covariance is shrunk on the standardised statistics (`_fit`: Ledoit-Wolf's
target, a multiple of the identity, otherwise gives every statistic the same average variance, so that one of small
spread, the scale ratio, barely counts once shrinkage is strong), and a hospital with no more slides than ``folds``
(each fold a single slide, each out-of-fold description fitted on the others only) is calibrated by slide: each
held-out tile's distance is replaced by the median over its slide's tiles before the quantile is taken
(``calibration = "slide"``). Leaving one of four slides out loosens the fit so much that single tiles of the left-out
slide lie far beyond where new slides of the final description lie (measured: out-of-fold 98% point 150-470, own
held-out test tiles 10-40), and the quantile of so few tiles is their most extreme one; a slide's median is its
typical tile. With both, the data-poor regime's hospitals mark 2x-magnified slides at 0.81-1.00 (before: 0.00 at 7
of 10) and their own held-out tiles still at 0.000 (benchmarks/results/shift_detection.md).

**Why this layer** (measured, benchmarks/results/shift_detection.md): on the quick start's models a description
fitted the same way on the pooled features before the classifier (Lee et al.'s layer) or on a middle block marked
only 5-23% of grey or re-stained tiles unfamiliar (the network was trained to ignore colour and contrast, with
colour augmentation), while the stem's channel statistics mark 90-100% of them; version 1 marked only 67-98% of
tiles at 2x magnification (and up to 10% of a small hospital's own held-out tiles), which the scale statistic and
the neighbourhood pooling of version 2 address. A description fitted on few tiles (`TissueDescription.weak`)
misses much more: see the results page.

**Where it lives.** ``tissue.safetensors`` (`TISSUE_FILE`) in the hospital's bundle folder, beside the weights:
two float64 tensors (``mean``, ``precision``) and string metadata (format version, layer, statistic, threshold,
quantile, folds, tiles, slides, round, and from version 3 the calibration). Every version is read; each is scored
as it was fitted (a version 1 file, written before the scale statistic, keeps its 48 statistics and its tile-by-tile
rule). It is written by the
hospital's own process (`federation.hospital.handler`) and read by ``predict``, the Slide page and the HTML report;
it never enters a message (the contract's messages carry no such field, and the boundary tests check every reply).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import numpy.typing as npt
from safetensors import SafetensorError
from safetensors.numpy import load_file, save_file

from infra.outputs import atomic_target
from models.errors import ModelError
from models.names import TISSUE_FILE

TISSUE_FORMAT = "gastric-fl tissue description"
TISSUE_VERSION = 3  # what `fit_description` writes; `read_description` reads every version of `STATISTICS`
STATISTICS = {
    1: "channel mean, log standard deviation and log neighbour change over the tile",
    2: (
        "channel mean, log standard deviation and log neighbour change over the tile, the input's log ratio of "
        "change at distance 2 to distance 1 per channel, median over the tile's grid neighbours"
    ),
    3: (
        "channel mean, log standard deviation and log neighbour change over the tile, the input's log ratio of "
        "change at distance 2 to distance 1 per channel, median over the tile's grid neighbours; covariance shrunk "
        "on the standardised statistics"
    ),
}
DEFAULT_QUANTILE = 0.98
DEFAULT_FOLDS = 5
MIN_TILES = 8  # fewer tiles than this describe nothing
TILES_PER_STATISTIC = 5  # below this many tiles per statistic a description is weak (`TissueDescription.weak`)


@dataclass(frozen=True)
class TilePositions:
    """Where a slide's tiles lie: each tile's top-left corner (``xs``, ``ys``, pixels) and the grid's step."""

    xs: npt.NDArray[np.int64]
    ys: npt.NDArray[np.int64]
    step: int


class TissueError(ModelError):
    """A tissue description that cannot be fitted or read: one line naming the file or the value."""


@dataclass(frozen=True)
class TissueDescription:
    """A hospital's tissue (module docstring): where the statistics come from, their mean and precision, and the
    distance above which a tile is unfamiliar."""

    layer: str
    mean: npt.NDArray[np.float64]
    precision: npt.NDArray[np.float64]
    threshold: float
    quantile: float = DEFAULT_QUANTILE
    folds: int = DEFAULT_FOLDS
    tiles: int = 0
    slides: int = 0
    round: int = 0
    version: int = TISSUE_VERSION
    calibration: str = "tile"  # "tile" or "slide" (module docstring, "Calibration")

    @property
    def scale(self) -> bool:
        """Whether the statistics end with the input's scale ratios (`models.features.scale_ratio`): version 2."""
        return self.version >= 2

    def distances(self, features: npt.ArrayLike) -> npt.NDArray[np.float64]:
        """Squared Mahalanobis distance of each row of ``features`` (Lee et al. 2018, Eq. 2)."""
        return mahalanobis(np.asarray(features, dtype=np.float64), self.mean, self.precision)

    def marks(self, distances: npt.NDArray[np.float64], grid: TilePositions | None = None) -> npt.NDArray[np.bool_]:
        """Which tiles are unfamiliar given their `distances` (module docstring, "The distance"): version 1 or
        no ``grid``, each tile's own; version 2 on a grid, its `neighbourhood_median`."""
        if grid is None or self.version < 2:
            return distances > self.threshold
        return neighbourhood_median(distances, grid) > self.threshold

    def unfamiliar(self, features: npt.ArrayLike, grid: TilePositions | None = None) -> npt.NDArray[np.bool_]:
        """Which tiles (rows of ``features``, on ``grid`` when given) are unfamiliar (`marks`)."""
        return self.marks(self.distances(features), grid)

    @property
    def weak(self) -> bool:
        """Fitted on fewer than `TILES_PER_STATISTIC` tiles per statistic: measured to miss most unfamiliar tissue
        (the data-poor regime's hospitals, benchmarks/results/shift_detection.md)."""
        return self.tiles < TILES_PER_STATISTIC * self.mean.size

    def words(self) -> str:
        """One line on the description, for a page or a report (saying so when it is `weak`)."""
        text = (
            f"Mahalanobis distance on the {STATISTICS[self.version]} at layer {self.layer}, fitted on {self.tiles} "
            f"tiles of {self.slides} slides of this hospital; a tile is unfamiliar beyond the {self.quantile:.0%} "
            f"point of its own new slides' {'typical (median) ' if self.calibration == 'slide' else ''}distances "
            f"({self.threshold:.4g})"
        )
        if self.weak:
            text += (
                f"; too few tiles for its {self.mean.size} statistics (fewer than {TILES_PER_STATISTIC} each): it "
                "may miss tissue unlike this hospital's, so a low unfamiliar share says little"
            )
        return text


def mahalanobis(
    features: npt.NDArray[np.float64], mean: npt.NDArray[np.float64], precision: npt.NDArray[np.float64]
) -> npt.NDArray[np.float64]:
    """``(z - mean)' precision (z - mean)`` for each row ``z``."""
    centred = features - mean
    return np.einsum("ij,jk,ik->i", centred, precision, centred)


def neighbourhood_median(values: npt.NDArray[np.float64], grid: TilePositions) -> npt.NDArray[np.float64]:
    """For each tile, the median of ``values`` over itself and the tiles one grid step away across, down or
    diagonally (its 3 x 3 neighbourhood on the grid, those of them that are tissue: at most 9 values)."""
    xs = np.asarray(grid.xs, dtype=np.int64)
    ys = np.asarray(grid.ys, dtype=np.int64)
    if not (values.shape == xs.shape == ys.shape) or grid.step < 1:
        raise TissueError(f"{values.shape[0]} values for {xs.shape[0]} tile positions at step {grid.step}")
    where = {(int(x), int(y)): k for k, (x, y) in enumerate(zip(xs, ys, strict=True))}
    offsets = [(dx * grid.step, dy * grid.step) for dy in (-1, 0, 1) for dx in (-1, 0, 1)]
    out = np.empty(values.shape, dtype=np.float64)
    for k, (x, y) in enumerate(zip(xs.tolist(), ys.tolist(), strict=True)):
        near = [where[p] for dx, dy in offsets if (p := (x + dx, y + dy)) in where and where[p] != k]
        out[k] = np.median(values[[k, *near]])
    return out


def _fit(
    features: npt.NDArray[np.float64], standardise: bool = True
) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.float64]]:
    """Mean and Ledoit-Wolf shrinkage precision (scikit-learn's ``LedoitWolf``).

    ``standardise`` (version 3): the shrinkage is applied to the statistics divided by their standard deviations
    (the correlation matrix), and the precision brought back to the statistics' units, ``S^-1 P S^-1`` with ``S``
    the diagonal of standard deviations. Ledoit-Wolf shrinks towards a multiple of the identity, which on raw
    statistics of unequal spread gives every statistic the same average variance: with few tiles (strong
    shrinkage) a statistic of small spread, such as the scale ratio, then barely counts. Shrinking the correlation
    matrix keeps each statistic's own variance (the diagonal target, Schaefer and Strimmer 2005, target "D")."""
    from sklearn.covariance import LedoitWolf  # a second of import: only when a description is fitted

    if not standardise:
        estimator = LedoitWolf(store_precision=True).fit(features)
        return np.asarray(estimator.location_, dtype=np.float64), np.asarray(estimator.precision_, dtype=np.float64)
    spread = features.std(axis=0)
    # a statistic that never varied on the hospital's tiles: a floor, so that a change in it counts without dividing
    # by zero
    spread = np.maximum(spread, max(float(spread.max()), 1.0) * 1e-6)
    estimator = LedoitWolf(store_precision=True).fit(features / spread)
    precision = np.asarray(estimator.precision_, dtype=np.float64) / np.outer(spread, spread)
    return np.asarray(estimator.location_, dtype=np.float64) * spread, precision


def fold_of_slides(slides: Sequence[str], folds: int, seed: int = 0) -> npt.NDArray[np.int64]:
    """Each tile's fold: its slide's, slides dealt in a seeded random order into ``folds`` groups (one slide per
    group when there are fewer slides than ``folds``; a tile's own index modulo ``folds`` when they all come from
    one slide)."""
    names = sorted(set(slides))
    if len(names) < 2:
        return np.arange(len(slides), dtype=np.int64) % folds
    order = np.random.default_rng(seed).permutation(len(names))
    fold = {names[i]: k % folds for k, i in enumerate(order)}
    return np.array([fold[s] for s in slides], dtype=np.int64)


def fit_description(
    features: npt.ArrayLike,
    slides: Sequence[str],
    layer: str,
    *,
    quantile: float = DEFAULT_QUANTILE,
    folds: int = DEFAULT_FOLDS,
    round: int = 0,
    version: int = TISSUE_VERSION,
) -> TissueDescription:
    """Describe a hospital's tiles (``features``: one row per tile, the statistics of ``version``; ``slides``:
    each tile's slide) and calibrate the threshold on out-of-fold distances of single tiles (module docstring).
    `TissueError` for too few tiles, non-finite values or an unknown version."""
    if version not in STATISTICS:
        raise TissueError(f"tissue description version {version} is unknown (known: {sorted(STATISTICS)})")
    x = np.asarray(features, dtype=np.float64)
    if x.ndim != 2 or x.shape[0] != len(slides):
        raise TissueError(f"{x.shape} features for {len(slides)} slide names: one row per tile is needed")
    if x.shape[0] < MIN_TILES:
        raise TissueError(f"{x.shape[0]} tiles cannot describe a hospital's tissue (at least {MIN_TILES} needed)")
    if not np.isfinite(x).all():
        raise TissueError("the tiles' statistics hold NaN or infinite values: the model diverged")
    if not (0.5 <= quantile < 1.0) or folds < 2:
        raise TissueError(f"quantile must be in [0.5, 1) and folds at least 2, got {quantile} and {folds}")
    fold = fold_of_slides(list(slides), folds)
    held_out = np.empty(x.shape[0], dtype=np.float64)
    for k in range(int(fold.max()) + 1):
        mine = fold == k
        if not mine.any():
            continue
        mean, precision = _fit(x[~mine], version >= 3)
        held_out[mine] = mahalanobis(x[mine], mean, precision)
    names = np.asarray([str(s) for s in slides], dtype=object)
    distinct = set(names.tolist())
    by_slide = version >= 3 and 2 <= len(distinct) <= folds
    if by_slide:  # each fold one slide: its tiles' typical distance (module docstring, "Calibration")
        for name in distinct:
            mine = names == name
            held_out[mine] = np.median(held_out[mine])
    mean, precision = _fit(x, version >= 3)
    return TissueDescription(
        layer=layer,
        mean=mean,
        precision=precision,
        threshold=float(np.quantile(held_out, quantile)),
        quantile=quantile,
        folds=folds,
        tiles=int(x.shape[0]),
        slides=len(set(slides)),
        round=round,
        version=version,
        calibration="slide" if by_slide else "tile",
    )


def write_description(folder: Path, description: TissueDescription) -> Path:
    """Write ``folder/tissue.safetensors`` atomically (safetensors: tensors and string metadata, no pickle)."""
    path = folder / TISSUE_FILE
    metadata = {
        "format": TISSUE_FORMAT,
        "format_version": str(description.version),
        "layer": description.layer,
        "statistic": STATISTICS[description.version],
        "threshold": repr(float(description.threshold)),
        "quantile": repr(float(description.quantile)),
        "folds": str(description.folds),
        "tiles": str(description.tiles),
        "slides": str(description.slides),
        "round": str(description.round),
        "calibration": description.calibration,
    }
    tensors = {
        "mean": np.ascontiguousarray(description.mean, dtype=np.float64),
        "precision": np.ascontiguousarray(description.precision, dtype=np.float64),
    }
    with atomic_target(path) as tmp:
        save_file(tensors, str(tmp), metadata=metadata)
    return path


def read_description(folder: Path) -> TissueDescription | None:
    """The description in a bundle folder; ``None`` when the bundle has none (an older export).

    `TissueError` (one line naming the file) for a file that is damaged or of another format."""
    path = folder / TISSUE_FILE
    if not path.is_file():
        return None
    try:
        from safetensors import safe_open

        with safe_open(str(path), framework="numpy") as handle:
            metadata = handle.metadata() or {}
        tensors = load_file(str(path))
    except (SafetensorError, OSError, ValueError) as exc:
        raise TissueError(f"{path} is not a readable safetensors file ({exc}); export the model again") from None
    versions = {str(v): v for v in STATISTICS}
    if metadata.get("format") != TISSUE_FORMAT or metadata.get("format_version") not in versions:
        raise TissueError(f"{path} is not a tissue description this version reads; export the model again")
    version = versions[metadata["format_version"]]
    if metadata.get("statistic") != STATISTICS[version]:
        raise TissueError(
            f"{path} describes other statistics ({metadata.get('statistic')!r}) than this version measures; export "
            "the model again"
        )
    try:
        mean = np.asarray(tensors["mean"], dtype=np.float64)
        precision = np.asarray(tensors["precision"], dtype=np.float64)
        description = TissueDescription(
            layer=metadata["layer"],
            mean=mean,
            precision=precision,
            threshold=float(metadata["threshold"]),
            quantile=float(metadata["quantile"]),
            folds=int(metadata["folds"]),
            tiles=int(metadata["tiles"]),
            slides=int(metadata["slides"]),
            round=int(metadata["round"]),
            version=version,
            calibration=metadata.get("calibration", "tile"),  # written from version 3 on
        )
    except (KeyError, ValueError) as exc:
        raise TissueError(f"{path} lacks or garbles {exc}; export the model again") from None
    if description.calibration not in ("tile", "slide"):
        raise TissueError(f"{path} names an unknown calibration {description.calibration!r}; export the model again")
    finite = np.isfinite(mean).all() and np.isfinite(precision).all() and math.isfinite(description.threshold)
    if mean.ndim != 1 or precision.shape != (mean.size, mean.size) or not finite or description.threshold <= 0:
        raise TissueError(f"{path} holds impossible values; export the model again")
    return description
