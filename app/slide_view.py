"""A hospital's model over one whole slide, kept on disk for the Slide page and the HTML report (issue 12, part 3).

Scoring is ``gastric-fl predict`` (`inference.predict`: prepare's tiling, the bundle's preprocessing, softmax
P(abnormal), FedSAF paper 001 Sec. 4.2 Step b for the grid) run on one slide into a cache entry inside the
hospital's own folder, so a scored slide never leaves the hospital and a second visit reads files instead of
running the network::

    <run>/hospitals/client_XX/slides/<card key>/<slide key>/
        slide/<file>            an uploaded slide (and its annotation), its name made safe (`safe_name`); test
                                slides stay where prepare read them
        upload.json             an upload's names as uploaded, which the page and the report show
        predict/                predict's output folder (its ownership marker, summary.csv, <slide>/tiles.csv,
                                <slide>/overlay.png, <slide>/summary.json)
        view/                   the layers the page draws: slide.png (the slide, downscaled to at most
                                `DISPLAY_MAX` px), heat.png (RGBA: viridis colour of the mean P(abnormal) under the
                                tiles where it reaches the card's threshold, transparent elsewhere, as
                                `inference.heatmap`), outline.png (RGBA: the
                                annotation's outline, white on black), view.json (sizes and scale) and, for a
                                test slide, heat_prepared.png (the same heatmap drawn from its prepared test
                                tiles, `app.slide_prepared.on_prepared_tiles`: the tiles the Verdict and
                                Hospital pages count)

``<card key>`` is the bundle's round and a hash of its ``model.json``, so a bundle rewritten by a later round gets
new entries instead of stale ones. Every file is written to a temporary name and renamed.

An upload is checked and kept by `app.slide_upload`, against the page's pixel limit (`max_pixels`: ``gastric-fl
dashboard --max-pixels``, passed in ``GASTRIC_FL_MAX_PIXELS``; default `pipeline.images.DEFAULT_MAX_PIXELS`).
`problem_line` words every failure for the page with the names the user gave, never the cache entry's paths.

This module imports no torch: only `score` imports the inference package, inside the function, so that a page
showing a cached slide (or listing slides) never waits for torch. Test slides are found the way ``predict`` and
``prepare`` find them: the dataset's ``prepare.json`` lists each slide's client and split, relative to the raw
folder prepare read (``config.source.input``).
"""

from __future__ import annotations

import csv
import hashlib
import json
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import cv2
import numpy as np
import numpy.typing as npt

from app.colour_scale import viridis_rgb
from federation.runfiles import CardError, hospital_files, hospital_index, read_card_object
from infra import outputs
from infra.formats import MANIFEST_FILE, PREPARE_RECORD, SLIDE_SUMMARY_FILE, manifest_sha256
from infra.records import RecordError, read_prepare_record
from models.decision import FALSE_ALARM, MISSED_CANCER, outcome
from models.names import CARD_FILE
from pipeline.images import DEFAULT_MAX_PIXELS, UnreadableImageError, check_max_pixels
from pipeline.tile_maps import coverage_maps, probability_map, visible

SLIDES_DIR = "slides"
DISPLAY_MAX = 1280
VIEW_FILES = ("slide.png", "heat.png", "view.json")
MAX_PIXELS_ENV = "GASTRIC_FL_MAX_PIXELS"
TEST_PREFIX = "test-"  # cache entries of the hospital's test slides; uploads' entries are named otherwise
UPLOAD_FIX = "upload a PNG or TIFF slide (.png, .tif, .tiff) instead"
MASK_FIX = "upload its annotation as a SEED mask (PNG) or a BOT SVG instead, or no annotation"
UPLOAD_RECORD = "upload.json"  # in an upload's cache entry: the names the files were uploaded under
PREDICT_GRID = "predict"  # a scored slide's tiles: predict's grid over the whole slide
PREPARED_GRID = "prepared"  # a test slide's tiles: its prepared test tiles (manifest.csv, predictions.csv)
PREPARED_HEAT = "heat_prepared.png"  # in a test slide's view/: the heatmap of its prepared test tiles


class SlideViewError(ValueError):
    """A run, bundle, dataset or slide the Slide page or the report cannot use; one line naming the file."""

    user_facing = True


@dataclass(frozen=True)
class ListedSlide:
    """A slide of a hospital's test split, as ``prepare.json`` lists it."""

    source: str
    path: Path
    label: str
    tiles: int

    @property
    def key(self) -> str:
        """The cache entry's name for this slide."""
        return TEST_PREFIX + safe_name(self.source)


@dataclass(frozen=True)
class ScoredSlide:
    """One scored slide read back from its cache entry (see the module docstring).

    ``xs``, ``ys``: tiles' top-left corners in slide pixels; ``size``: the square's side in slide pixels;
    ``truth``: per tile ``"abnormal"``, ``"normal"`` or ``""`` (unlabelled or no annotation), prepare's rule.
    ``scale``: display layers' size over the slide's size.
    """

    entry: Path
    result: Path
    slide: Path
    summary: dict[str, Any]
    xs: npt.NDArray[np.int64]
    ys: npt.NDArray[np.int64]
    size: int
    probability: npt.NDArray[np.float64]
    truth: tuple[str, ...]
    scale: float
    width: int
    height: int
    # per tile "familiar", "unfamiliar" (models.shift) or "" (the bundle has no tissue description); () for an entry
    # scored before the column existed
    tissue: tuple[str, ...] = ()
    # which tiles xs, ys, probability and truth are: PREDICT_GRID (predict's grid of the whole slide) or
    # PREPARED_GRID (a test slide's prepared test tiles, `on_prepared_tiles`)
    grid: str = "predict"

    @property
    def overlay(self) -> Path:
        """predict's overlay PNG (the heatmap blended half-and-half over the slide)."""
        return self.result / "overlay.png"

    def layer(self, name: str) -> Path | None:
        """``view/<name>.png`` if it exists (``outline`` exists only for an annotated slide); on the prepared test
        tiles the heatmap is theirs (`PREPARED_HEAT`)."""
        if name == "heat" and self.grid == PREPARED_GRID:
            name = PREPARED_HEAT.removesuffix(".png")
        path = self.entry / "view" / f"{name}.png"
        return path if path.is_file() else None

    @property
    def threshold(self) -> float:
        """The decision threshold the summary was computed at (the card's)."""
        return float(self.summary.get("threshold", 0.5))


def call_mark(call: str, annotated: str | None) -> tuple[str, str]:
    """How a slide's call reads against its annotation: ``(icon, words)``. A call that contradicts the annotation
    is a miss or a false alarm, never marked as right: an annotated abnormal slide called normal is a MISSED cancer
    (error icon), an annotated normal slide called abnormal a FALSE ALARM (warning icon). A tick only when call and
    annotation agree; a slide without annotation gets a neutral icon and says there is nothing to check against."""
    if annotated not in ("normal", "abnormal"):
        return ":material/info:", "no annotation to check it against"
    if annotated == call:
        return ":material/check_circle:", f"agrees with the annotation ({annotated})"
    if outcome(str(annotated), call) == MISSED_CANCER:
        return ":material/error:", f"{MISSED_CANCER}: the annotation marks abnormal tissue, the model calls it normal"
    return ":material/warning:", f"{FALSE_ALARM}: the annotation marks no abnormal tissue, the model calls it abnormal"


def safe_name(text: str) -> str:
    """A file name for ``text``: path separators as ``__``, anything unusual as ``_``."""
    return re.sub(r"[^A-Za-z0-9._-]+", "_", text.replace("/", "__").replace("\\", "__")).strip("._") or "slide"


def write_atomic(path: Path, payload: bytes) -> None:
    """Write ``payload`` to ``path`` through a temporary file beside it, so a reader sees all or nothing."""
    path.parent.mkdir(parents=True, exist_ok=True)
    outputs.write_atomic(path, payload)


# --- bundles and test slides -------------------------------------------------------------------------------------


def bundle_folders(run: Path) -> dict[int, Path]:
    """Hospital index -> its folder, for each hospital of ``run`` with a model card (``model.json``)."""
    found: dict[int, Path] = {}
    for card in hospital_files(run, CARD_FILE):
        found[hospital_index(card.parent.name)] = card.parent
    return found


def read_card_json(folder: Path) -> dict[str, Any]:
    """The hospital's ``model.json`` as a dict (`federation.runfiles.read_card_object`: without loading the
    weights, no torch); one-line error if unusable."""
    path = folder / CARD_FILE
    try:
        card = read_card_object(path)
    except CardError as exc:
        if exc.kind == "missing":
            raise SlideViewError(f"{path} does not exist: this hospital has no exported model yet") from None
        if exc.kind == "unreadable":
            raise SlideViewError(f"{exc}; train the run again (or resume it) to export the model anew") from None
        card = {}  # JSON, but not an object: not a card (the check below says so)
    if card.get("format") != "gastric-fl model card":
        raise SlideViewError(f"{path} is not a gastric-fl model card; train the run again to export the model anew")
    return card


def card_key(folder: Path) -> str:
    """``round_RRRR-<hash of model.json>``: cache entries belong to one version of the bundle."""
    data = (folder / CARD_FILE).read_bytes()
    card = json.loads(data)
    return f"round_{int(card.get('round') or 0):04d}-{hashlib.sha256(data).hexdigest()[:10]}"


def _resolve(value: str, bases: list[Path]) -> Path | None:
    path = Path(value).expanduser()
    if path.is_absolute():
        return path if path.is_dir() else None
    for base in bases:
        if (base / path).is_dir():
            return (base / path).resolve()
    return None


def _holds_the_cards_tiles(dataset: Path, wanted: object) -> bool:
    """Whether ``dataset``'s ``manifest.csv`` has the sha256 the card names (``wanted``); a card that names none
    (an earlier version's) takes any dataset."""
    if not isinstance(wanted, str) or not wanted:
        return True
    try:
        return manifest_sha256(dataset) == wanted
    except OSError:
        return False


def card_dataset(card: dict[str, Any], fallback: Path | None = None) -> Path | None:
    """The prepared dataset the bundle was trained on: the card's ``dataset.path``, else ``fallback``, whichever
    holds the same tiles (its ``manifest.csv`` has the sha256 the card names, where the card names one: checked on
    either path). A dataset prepared again at the card's path holds other slides and splits; another dataset would
    number its hospitals otherwise (a deployed hospital's own dataset is its slides alone, as hospital 0), so its
    test slides would be another hospital's. ``None`` when neither holds them (`dataset_problem` says why)."""
    given = card.get("dataset")
    recorded: dict[str, Any] = given if isinstance(given, dict) else {}
    wanted = recorded.get("manifest_sha256")
    value = recorded.get("path")
    own = Path(value).expanduser() if isinstance(value, str) and value else None
    if own is not None and own.is_dir() and _holds_the_cards_tiles(own, wanted):
        return own
    if fallback is None or not fallback.is_dir():
        return None
    return fallback if _holds_the_cards_tiles(fallback, wanted) else None


def dataset_problem(card: dict[str, Any]) -> str | None:
    """Why the dataset the card names cannot give its test slides, when it is on this machine but holds other tiles
    (`card_dataset`); ``None`` otherwise."""
    given = card.get("dataset")
    recorded: dict[str, Any] = given if isinstance(given, dict) else {}
    value, wanted = recorded.get("path"), recorded.get("manifest_sha256")
    if not (isinstance(value, str) and value and Path(value).expanduser().is_dir()):
        return None
    path = Path(value).expanduser()
    if _holds_the_cards_tiles(path, wanted):
        return None
    try:
        now = f"{manifest_sha256(path)[:12]}..."
    except OSError:
        now = "unreadable"
    return (
        f"{path / MANIFEST_FILE} is not the one this model was trained on (sha256 {now} now, {str(wanted)[:12]}... in "
        f"{CARD_FILE}): the dataset was prepared again, so its test slides would be other slides; restore the "
        "dataset the run trained on"
    )


def listed_slides(card: dict[str, Any], dataset: Path | None) -> list[ListedSlide]:
    """The hospital's test slides that gave tiles, from ``<dataset>/prepare.json``, with their files on disk.

    `SlideViewError` (one line) when the dataset, its ``prepare.json`` or the raw folder it names is missing.
    """
    return checked_slides(card, dataset)[0]


_HASHED: dict[tuple[str, int, int, int], str] = {}  # (path, inode, size, mtime) -> sha256, for this process


def _file_sha256(path: Path) -> str:
    """sha256 of the file at ``path`` (``hashlib.file_digest``), remembered in this process while the file keeps its
    inode, size and modification time, so that a page listing large slides at every rerun hashes each once."""
    stat = path.stat()
    key = (str(path), stat.st_ino, stat.st_size, stat.st_mtime_ns)
    if key not in _HASHED:
        with path.open("rb") as handle:
            _HASHED[key] = hashlib.file_digest(handle, "sha256").hexdigest()
    return _HASHED[key]


def checked_slides(card: dict[str, Any], dataset: Path | None) -> tuple[list[ListedSlide], list[str]]:
    """`listed_slides`, and one line for each listed slide left out because its raw file is missing or no longer
    has the sha256 prepare recorded for it (``prepare.json``: the slide's ``sha256``, or ``source_sha256`` of an
    earlier prepare). A ``prepare.json`` that records no hash for its slides: the slides are listed unchecked, and
    one line says so."""
    hospital = int(card.get("client", 0))
    if dataset is None:
        problem = dataset_problem(card)
        if problem is not None:
            raise SlideViewError(problem)
        named = (card.get("dataset") or {}).get("path") if isinstance(card.get("dataset"), dict) else None
        raise SlideViewError(
            f"the prepared dataset of this model ({named or 'not named in model.json'}) is not on this machine; "
            "upload a slide instead, or copy the dataset back"
        )
    record_path = dataset / PREPARE_RECORD
    try:
        record = read_prepare_record(dataset).data
        source_input = str(record["config"]["source"]["input"])
        slides = [s for s in record["slides"] if int(s["client"]) == hospital and s["split"] == "test"]
        hashes = record.get("source_sha256") or {}
    except RecordError as exc:
        if exc.kind == "missing":
            raise SlideViewError(
                f"{record_path} does not exist, so the test slides are unknown; upload a slide instead"
            ) from None
        raise SlideViewError(f"{exc}; prepare the dataset again or upload a slide") from None
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise SlideViewError(
            f"{record_path} is damaged ({type(exc).__name__}: {exc}); prepare the dataset again or upload a slide"
        ) from None
    raw = _resolve(source_input, [Path.cwd(), *dataset.resolve().parents])
    if raw is None:
        raise SlideViewError(
            f"the raw slides prepare read ({source_input}, named in {record_path}) are not on this machine; "
            "upload a slide instead"
        )
    found: list[ListedSlide] = []
    problems: list[str] = []
    unchecked = 0
    for s in slides:
        source = str(s["source"])
        path = raw / source
        if int(s.get("tiles", 0)) <= 0:
            continue
        if not path.is_file():
            problems.append(f"{source}: missing from {raw} since prepare listed it; not scored (restore it)")
            continue
        wanted = s.get("sha256") or (hashes.get(source) if isinstance(hashes, dict) else None)
        if isinstance(wanted, str) and wanted:
            now = _file_sha256(path)
            if now != wanted:
                problems.append(
                    f"{source}: changed since prepare read it (sha256 {wanted[:12]}... then, {now[:12]}... now); not "
                    "scored under its old name and label (restore it, or prepare the dataset again)"
                )
                continue
        else:
            unchecked += 1
        found.append(ListedSlide(source, path, str(s.get("label", "")), int(s.get("tiles", 0))))
    if unchecked:
        problems.append(
            f"{unchecked} slide(s) scored unchecked: {record_path} records no sha256 for them (an earlier prepare); "
            "prepare the dataset again to record them"
        )
    if not found:
        raise SlideViewError(
            f"none of hospital {hospital}'s test slides listed in {record_path} is in {raw} as prepare read it"
            f"{' (' + '; '.join(problems) + ')' if problems else ''}; upload a slide instead"
        )
    return found, problems


# --- cache entries -----------------------------------------------------------------------------------------------


def slide_entry(folder: Path, slide: ListedSlide) -> Path:
    """The cache entry of a test slide scored with the bundle in ``folder``."""
    return folder / SLIDES_DIR / card_key(folder) / slide.key


def max_pixels() -> int:
    """The Slide page's pixel limit: ``GASTRIC_FL_MAX_PIXELS`` (``gastric-fl dashboard --max-pixels``), else
    `pipeline.images.DEFAULT_MAX_PIXELS`; `SlideViewError` or `PipelineError` (one line) for a value that is not a
    usable limit."""
    text = os.environ.get(MAX_PIXELS_ENV, "").strip()
    if not text:
        return DEFAULT_MAX_PIXELS
    try:
        value = int(text)
    except ValueError:
        raise SlideViewError(
            f"{MAX_PIXELS_ENV}={text!r} is not a whole number of pixels; restart the dashboard with e.g. "
            f"--max-pixels {DEFAULT_MAX_PIXELS}"
        ) from None
    return check_max_pixels(value, MAX_PIXELS_ENV)


def uploaded_names(entry: Path) -> tuple[str | None, str | None]:
    """The names an upload's slide and annotation were uploaded under (its entry's `UPLOAD_RECORD`), ``None`` for
    each one not known (a test slide's entry, an annotation not given, an entry kept before the record was)."""
    try:
        record = json.loads((entry / UPLOAD_RECORD).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError):
        return None, None
    if not isinstance(record, dict):
        return None, None
    slide, annotation = record.get("slide"), record.get("annotation")
    return (slide if isinstance(slide, str) else None), (annotation if isinstance(annotation, str) else None)


def slide_name(scored: ScoredSlide, names: Mapping[Path, str] | None = None) -> str:
    """The name to show for a scored slide: an upload's as uploaded (``names``, else its entry's record), a test
    slide's own file name."""
    for path, name in (names or {}).items():
        if path.name == scored.slide.name:
            return name
    return uploaded_names(scored.entry)[0] or str(scored.summary.get("slide") or scored.slide.name)


def is_annotation(path: Path, stems: set[str]) -> bool:
    """Whether a file kept in an upload's entry is its annotation (``<stem>.svg``, or ``<stem>_mask.png`` beside
    the slide ``<stem>``) rather than its slide."""
    return path.suffix.lower() == ".svg" or (path.stem.endswith("_mask") and path.stem.removesuffix("_mask") in stems)


def scored_entries(folder: Path) -> list[Path]:
    """Cache entries of the hospital's current bundle that hold a complete result, newest first."""
    try:
        base = folder / SLIDES_DIR / card_key(folder)
    except (OSError, ValueError):
        return []
    done = [e for e in base.glob("*") if load(e) is not None] if base.is_dir() else []
    return sorted(done, key=lambda e: (e / "view" / "view.json").stat().st_mtime, reverse=True)


def _result_folder(entry: Path) -> Path | None:
    folders = [p.parent for p in (entry / "predict").glob(f"*/{SLIDE_SUMMARY_FILE}")]
    return folders[0] if len(folders) == 1 else None


def load(entry: Path) -> ScoredSlide | None:
    """The scored slide of a complete cache entry; ``None`` when it is not (yet) complete or is damaged."""
    result = _result_folder(entry)
    if result is None or not all((entry / "view" / name).is_file() for name in VIEW_FILES):
        return None
    try:
        summary = json.loads((result / SLIDE_SUMMARY_FILE).read_text(encoding="utf-8"))
        view = json.loads((entry / "view" / "view.json").read_text(encoding="utf-8"))
        with (result / "tiles.csv").open(newline="", encoding="utf-8") as handle:
            rows = list(csv.DictReader(handle))
        xs = np.array([int(r["x"]) for r in rows], dtype=np.int64)
        ys = np.array([int(r["y"]) for r in rows], dtype=np.int64)
        probability = np.array([float(r["probability"]) for r in rows], dtype=np.float64)
        size = int(summary["tile_size_px"])
        return ScoredSlide(
            entry=entry,
            result=result,
            slide=Path(str(view["slide"])),
            summary=summary,
            xs=xs,
            ys=ys,
            size=size,
            probability=probability,
            truth=tuple(r.get("truth", "") or "" for r in rows),
            scale=float(view["scale"]),
            width=int(view["width"]),
            height=int(view["height"]),
            tissue=tuple(r.get("tissue", "") or "" for r in rows),
        )
    except (OSError, UnicodeDecodeError, ValueError, KeyError, TypeError):
        return None


# --- scoring (the only place torch is imported) -----------------------------------------------------------------


def _png(pixels: npt.NDArray[np.uint8]) -> bytes:
    """RGB or RGBA ``uint8`` -> PNG bytes."""
    code = cv2.COLOR_RGBA2BGRA if pixels.shape[2] == 4 else cv2.COLOR_RGB2BGR
    ok, data = cv2.imencode(".png", cv2.cvtColor(pixels, code))
    if not ok:
        raise SlideViewError("could not encode a PNG (OpenCV)")
    return data.tobytes()


def _heat_png(mean: npt.NDArray[np.float64], covered: npt.NDArray[np.bool_], threshold: float | None) -> bytes:
    """The heatmap layer: the colour bar's viridis (`app.colour_scale`) of the mean probability under the tiles,
    opaque only where it reaches ``threshold`` (`pipeline.tile_maps.visible`: every covered pixel when
    ``threshold`` is ``None``)."""
    shown = visible(mean, covered, threshold)
    colours = viridis_rgb(mean).reshape(*mean.shape, 3)
    heat = np.dstack([colours, np.where(shown, 255, 0).astype(np.uint8)])
    return _png(np.ascontiguousarray(heat))


def _layers(
    image: npt.NDArray[np.uint8],
    cancer: npt.NDArray[np.bool_] | None,
    mean: npt.NDArray[np.float64],
    covered: npt.NDArray[np.bool_],
    scale: float,
    threshold: float | None = None,
) -> dict[str, bytes]:
    """slide.png, heat.png (`_heat_png`) and (with an annotation) outline.png at the display scale."""
    height, width = image.shape[:2]
    size_out = (max(1, round(width * scale)), max(1, round(height * scale)))
    base = image if scale == 1.0 else cv2.resize(image, size_out, interpolation=cv2.INTER_AREA)
    layers = {"slide.png": _png(np.ascontiguousarray(base)), "heat.png": _heat_png(mean, covered, threshold)}
    if cancer is not None and cancer.any():
        region: npt.NDArray[np.uint8] = cancer.astype(np.uint8)
        if scale != 1.0:
            region = np.asarray(cv2.resize(region, size_out, interpolation=cv2.INTER_NEAREST), dtype=np.uint8)
        contours, _ = cv2.findContours(region, cv2.RETR_EXTERNAL, cv2.CHAIN_APPROX_SIMPLE)
        outline = np.zeros((size_out[1], size_out[0], 4), dtype=np.uint8)
        thickness = max(1, round(max(size_out) / 400))
        cv2.drawContours(outline, contours, -1, (0, 0, 0, 255), 2 * thickness + 1)
        cv2.drawContours(outline, contours, -1, (255, 255, 255, 255), thickness)
        layers["outline.png"] = _png(outline)
    return layers


def score(folder: Path, slide: Path, entry: Path, max_pixels: int = DEFAULT_MAX_PIXELS) -> ScoredSlide:
    """Score ``slide`` with the bundle in ``folder`` into the cache ``entry`` (predict, then the display layers).

    Raises what ``gastric-fl predict`` raises for a bundle that does not fit, an unreadable slide, a slide over
    ``max_pixels`` or a slide without tissue (all one line, ``user_facing``), and `SlideViewError` if the result
    cannot be read back.
    """
    from inference.predict import predict
    from inference.slides import find_slides, read_slide

    predict(folder, slide, entry / "predict", progress=False, max_pixels=max_pixels)
    scored_file = find_slides(slide)[0]
    decoded = read_slide(scored_file, max_pixels)
    result = _result_folder(entry)
    if result is None:
        raise SlideViewError(f"{entry / 'predict'}: predict wrote no result for {slide.name}; score it again")
    with (result / "tiles.csv").open(newline="", encoding="utf-8") as handle:
        rows = list(csv.DictReader(handle))
    summary = json.loads((result / SLIDE_SUMMARY_FILE).read_text(encoding="utf-8"))
    height, width = decoded.image.shape[:2]
    scale = min(1.0, DISPLAY_MAX / max(height, width))
    xs = np.array([int(r["x"]) for r in rows], dtype=np.int64)
    ys = np.array([int(r["y"]) for r in rows], dtype=np.int64)
    probability = np.array([float(r["probability"]) for r in rows], dtype=np.float64)
    mean, covered = probability_map(xs, ys, int(summary["tile_size_px"]), probability, (height, width), scale)
    layers = _layers(decoded.image, decoded.cancer, mean, covered, scale, float(summary["threshold"]))
    strange = np.array([r.get("tissue") == "unfamiliar" for r in rows], dtype=bool)
    if strange.any():  # unfamiliar tissue hatched grey, predict's overlay's mark (inference.heatmap.hatch)
        from inference.heatmap import hatch

        _, region = coverage_maps(xs, ys, int(summary["tile_size_px"]), strange, (height, width), scale)
        stripes = hatch(np.zeros((*region.shape, 3), dtype=np.uint8), region)
        alpha = np.where(stripes.any(axis=2), 255, 0).astype(np.uint8)
        layers["unfamiliar.png"] = _png(np.ascontiguousarray(np.dstack([stripes, alpha])))
    for name, payload in layers.items():
        write_atomic(entry / "view" / name, payload)
    view = {
        "slide": str(slide.resolve()),
        "annotation": None if scored_file.annotation is None else str(scored_file.annotation),
        "width": width,
        "height": height,
        "scale": scale,
        "colormap": "viridis",
    }
    write_atomic(entry / "view" / "view.json", (json.dumps(view, indent=2) + "\n").encode())
    loaded = load(entry)
    if loaded is None:
        raise SlideViewError(f"{entry}: the scored slide could not be read back; score it again")
    return loaded


def problem_line(exc: BaseException, slide: Path, names: Mapping[Path, str] | None = None) -> str:
    """One line for a failure while scoring ``slide``: the error's own message when it is meant for the user.

    ``names`` maps files the page keeps (an upload's copy in its cache entry) to the names the user gave them: the
    line names those, never the cache's paths, and says what to upload instead of a file that is not a readable
    image.
    """
    if isinstance(exc, UnreadableImageError) and names:
        # an upload's file: what to upload instead, rather than the command line's "remove it from the input"
        kept = {form: path for path in names for form in (path.name, str(path), str(path.resolve()))}
        path = kept.get(exc.name) or kept.get(str(Path(exc.name).resolve()))  # named bare (a mask), or in full
        stems = {p.stem for p in names}
        fix = MASK_FIX if path is not None and is_annotation(path, stems) else UPLOAD_FIX
        text = str(exc.advising(fix))
    elif getattr(exc, "user_facing", False):
        text = str(exc)
    elif isinstance(exc, OSError):
        text = f"{slide}: {exc.strerror or type(exc).__name__} ({exc.filename or slide}); check the file and the folder"
    else:
        text = f"{slide}: scoring failed ({type(exc).__name__}: {exc}); try `gastric-fl predict` on it for details"
    return shown_text(text, names)


def shown_text(text: str, names: Mapping[Path, str] | None) -> str:
    """``text`` (one line) with each path of ``names`` (absolute or as given, then its bare file name, each as a
    whole word: ``a.png`` stays in ``data.png``) replaced by the name the user knows it by."""
    shown = {form: name for path, name in (names or {}).items() for form in (path.name, str(path), str(path.resolve()))}
    if shown:
        # One pass, longest form first, so that a name put in is never replaced again.
        forms = "|".join(re.escape(form) for form in sorted(shown, key=len, reverse=True))
        text = re.sub(rf"(?<![\w./-])(?:{forms})(?![\w])", lambda match: shown[match.group(0)], text)
    return " ".join(text.split())
