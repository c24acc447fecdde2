"""Each hospital's held-out test slides, scored once the way ``gastric-fl predict`` scores a slide (issue 30, item 4).

After the last round, every hospital's test slides (those ``prepare.json`` lists for its test split, read from the raw
folder prepare read) are scored with its exported model by predict's own code: the whole slide's tissue grid
(`inference.scoring.tissue_positions`), every square's ``P(abnormal)`` (`inference.scoring.score_positions`) and the
slide-level figures and call (`inference.scoring.summarise`: the top-k mean at the card's threshold). The result is
written once per hospital into ``<hospital folder>/slides.csv`` (`federation.runfiles.SLIDES_FILE`), one row per
slide: ``slide, truth, score, call, threshold, tiles, top_tile, unfamiliar_share`` (the highest tile probability,
for the focal flag, and the share of tiles unlike the hospital's tissue, `models.shift`; a file of the first six
columns, written before them, still reads). The Verdict, Hospital and Slide pages, ``gastric-fl report``,
the HTML report and the model card read it (`read_slide_calls`), so each names the same call and score as
``predict`` on the same slide with the same bundle. ``gastric-fl threshold`` rewrites the calls at a newly saved
threshold from the stored scores (`recall`): scores do not depend on the threshold, calls do.

Reading is torch-free (the dashboard's pages import this module); scoring imports torch when it runs.
"""

from __future__ import annotations

import csv
import io
import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from federation.errors import FederationError
from federation.runfiles import SLIDES_FILE, hospital_files, hospital_index
from infra.formats import BINARY_CLASSES
from infra.outputs import write_atomic
from models.decision import FALSE_ALARM, MISSED_CANCER, Reported, Slides, outcome, reported_call, slide_is_abnormal

COLUMNS: tuple[str, ...] = ("slide", "truth", "score", "call", "threshold", "tiles", "top_tile", "unfamiliar_share")
# a slides.csv written before the tissue description and the focal flag (issue 47): read, with both unknown
OLD_COLUMNS: tuple[str, ...] = COLUMNS[:6]


class SlideCallsError(ValueError):
    """A ``slides.csv`` that cannot be used: one line naming the file and what to do."""

    user_facing = True


@dataclass(frozen=True)
class SlideCall:
    """One held-out slide: its annotation's truth, predict's score (top-k mean) and call at ``threshold``."""

    slide: str
    truth: str  # "abnormal", "normal", or "" when the slide has no annotation
    score: float
    call: str
    threshold: float
    tiles: int
    top_tile: float | None = None  # the slide's highest tile probability (None: a file from before it was kept)
    # share of its tiles unlike the hospital's tissue (models.shift); None: the bundle has no tissue description
    unfamiliar_share: float | None = None

    @property
    def missed(self) -> bool:
        """Whether the call contradicts the annotation (a miss is never shown with a tick)."""
        return bool(self.truth) and self.call != self.truth

    @property
    def outcome(self) -> str:
        """`models.decision.MISSED_CANCER`, `FALSE_ALARM` or empty: the words every page and report use."""
        return outcome(self.truth, self.call)

    @property
    def reported(self) -> Reported:
        """How the call is reported (`models.decision.reported_call`): UNFAMILIAR, a focus to review, or the call."""
        return reported_call(self.call, self.top_tile, self.threshold, self.unfamiliar_share)


def _csv(calls: Sequence[SlideCall]) -> bytes:
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(COLUMNS)
    for c in calls:
        writer.writerow(
            [
                c.slide,
                c.truth,
                f"{c.score:.17g}",
                c.call,
                f"{c.threshold:.17g}",
                c.tiles,
                "" if c.top_tile is None else f"{c.top_tile:.17g}",
                "" if c.unfamiliar_share is None else f"{c.unfamiliar_share:.17g}",
            ]
        )
    return buffer.getvalue().encode("utf-8")


def write_slide_calls(folder: Path, calls: Sequence[SlideCall]) -> Path:
    """Write ``<folder>/slides.csv`` atomically (a reader never sees half a file)."""
    path = folder / SLIDES_FILE
    write_atomic(path, _csv(calls))
    return path


def read_slide_calls(path: Path) -> list[SlideCall]:
    """The rows of a ``slides.csv``; `SlideCallsError` (one line naming the file and row) for anything else."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise SlideCallsError(
            f"{path} does not exist: the hospital's test slides are scored when a run ends (gastric-fl train)"
        ) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise SlideCallsError(f"{path} cannot be read ({exc}); train or resume the run to write it again") from None
    reader = csv.DictReader(io.StringIO(text))
    if tuple(reader.fieldnames or ()) not in (COLUMNS, OLD_COLUMNS):
        raise SlideCallsError(f"{path}: expected the columns {', '.join(COLUMNS)}; train or resume the run again")
    calls = []

    def optional(value: str | None) -> float | None:
        return None if value in (None, "") else float(value)

    for line, row in enumerate(reader, start=2):
        try:
            call = SlideCall(
                slide=str(row["slide"]),
                truth=str(row["truth"]),
                score=float(row["score"]),
                call=str(row["call"]),
                threshold=float(row["threshold"]),
                tiles=int(row["tiles"]),
                top_tile=optional(row.get("top_tile")),
                unfamiliar_share=optional(row.get("unfamiliar_share")),
            )
        except (TypeError, ValueError):
            raise SlideCallsError(f"{path} line {line}: not a slide row; train or resume the run again") from None
        sane = (
            call.slide
            and call.truth in ("", "normal", "abnormal")
            and call.call in ("normal", "abnormal")
            and math.isfinite(call.score)
            and 0.0 <= call.score <= 1.0
            and 0.0 < call.threshold < 1.0
            and call.tiles > 0
            and call.call == ("abnormal" if slide_is_abnormal(call.score, call.threshold) else "normal")
            and (call.top_tile is None or (math.isfinite(call.top_tile) and call.score <= call.top_tile <= 1.0))
            and (call.unfamiliar_share is None or 0.0 <= call.unfamiliar_share <= 1.0)
        )
        if not sane:
            raise SlideCallsError(f"{path} line {line}: impossible values; train or resume the run again")
        calls.append(call)
    return calls


def run_slide_calls(run: Path) -> dict[int, list[SlideCall]]:
    """Every hospital's held-out slide calls in ``run`` that read, by hospital (damaged files are left out)."""
    found: dict[int, list[SlideCall]] = {}
    for path in hospital_files(run, SLIDES_FILE):
        try:
            found[hospital_index(path.parent.name)] = read_slide_calls(path)
        except SlideCallsError:
            continue
    return found


def slide_level(calls: Sequence[SlideCall]) -> dict[str, object]:
    """The model card's ``metrics.slide_level`` from the held-out slides (same keys as
    `models.decision.uncertainty`'s, and ``source`` saying where they come from)."""
    from models.decision import SLIDE_RULE, SLIDE_TOP_K

    known = [c for c in calls if c.truth]
    abnormal = [c for c in known if c.truth == "abnormal"]
    normal = [c for c in known if c.truth == "normal"]
    missed = sum(c.call == "normal" for c in abnormal)
    alarms = sum(c.call == "abnormal" for c in normal)
    auc = None
    if abnormal and normal:
        from sklearn.metrics import roc_auc_score

        auc = float(roc_auc_score([int(c.truth == "abnormal") for c in known], [c.score for c in known]))
    return {
        "rule": SLIDE_RULE.format(k=SLIDE_TOP_K),
        "threshold": calls[0].threshold if calls else None,
        "slides": len(known),
        "abnormal": len(abnormal),
        "normal": len(normal),
        "missed": missed,
        "false_alarms": alarms,
        "sensitivity": (len(abnormal) - missed) / len(abnormal) if abnormal else None,
        "specificity": (len(normal) - alarms) / len(normal) if normal else None,
        "auc": auc,
        # reported UNFAMILIAR (do not rely on the call) and normal with a focus above the threshold (review)
        "unfamiliar": sum(c.reported.unfamiliar for c in calls),
        "focus": sum(c.reported.focus for c in calls),
        "described": all(c.unfamiliar_share is not None for c in calls),
        "source": f"{SLIDES_FILE}: each whole test slide scored as gastric-fl predict scores it",
    }


def _update_card(folder: Path, calls: Sequence[SlideCall]) -> None:
    """Put the held-out slides' figures into the card's ``metrics.slide_level`` (weights untouched), so that
    ``gastric-fl report`` and anyone reading the card name the same slide calls as the pages and ``predict``."""
    from models.bundle import read_card, write_bundle
    from models.names import CARD_FILE

    if not (folder / CARD_FILE).is_file():
        return
    card = read_card(folder)
    metrics = dict(card.metrics)
    metrics["slide_level"] = slide_level(calls)
    write_bundle(folder, replace(card, metrics=metrics))


def recall(folder: Path, threshold: float) -> list[SlideCall] | None:
    """Rewrite the calls of ``<folder>/slides.csv`` at ``threshold`` from its stored scores (``None``: no file)."""
    path = folder / SLIDES_FILE
    if not path.is_file():
        return None
    calls = [
        replace(c, call="abnormal" if slide_is_abnormal(c.score, threshold) else "normal", threshold=threshold)
        for c in read_slide_calls(path)
    ]
    write_slide_calls(folder, calls)
    _update_card(folder, calls)
    return calls


def score_held_out(
    folder: Path, dataset: Path | None = None, device: str = "cpu", problems: list[str] | None = None
) -> list[SlideCall]:
    """Score the hospital's test slides with the bundle in ``folder`` (predict's code) and write ``slides.csv``.

    The slides are those ``prepare.json`` lists for the hospital's test split (`app.slide_view.checked_slides`),
    from the dataset the card names only while its ``manifest.csv`` has the card's ``manifest_sha256``, each raw
    slide only while it has the sha256 prepare recorded; `app.slide_view.SlideViewError` when the dataset or its raw
    slides are not on this machine, or the dataset is another. A slide that changed or is missing since prepare, or
    cannot be scored (unreadable, no tissue), is left out of the file and named in ``problems`` (one line each).
    ``device``: where the model scores the tiles,
    a ``run.device`` value (``auto``, ``cpu``, ``cuda``; `federation.derived.resolve_device`): a run's slides
    are scored where it trained (on a CPU, a few hundred slides take minutes).
    """
    from app import slide_view
    from federation.derived import resolve_device
    from inference.predict import score_slide, summarise
    from inference.slides import find_slides, read_slide
    from models.bundle import load_bundle
    from models.decision import SLIDE_TOP_K
    from pipeline.errors import PipelineError

    card = slide_view.read_card_json(folder)
    classes = card.get("class_names")
    if isinstance(classes, list) and tuple(classes) != BINARY_CLASSES:
        # a slide call is normal / abnormal at a threshold: it has no meaning for another class list
        raise slide_view.SlideViewError(f"slide calls are not applicable for {len(classes)} classes")
    slides, skipped = slide_view.checked_slides(card, slide_view.card_dataset(card, dataset))
    if problems is not None:
        problems.extend(skipped)
    where = resolve_device(device)
    bundle = load_bundle(folder, where)
    calls = []
    for listed in slides:
        try:
            decoded = read_slide(find_slides(listed.path)[0])
            tiles = score_slide(bundle, decoded.image, str(listed.path), device=where)
        except PipelineError as exc:
            if problems is not None:
                problems.append(f"{listed.source}: not scored ({exc})")
            continue
        height, width = decoded.image.shape[:2]
        summary = summarise(tiles, bundle.card, bundle.card.threshold, SLIDE_TOP_K, (height, width))
        share = summary["unfamiliar_share"]
        calls.append(
            SlideCall(
                slide=listed.source,
                truth=listed.label if listed.label in ("normal", "abnormal") else "",
                score=float(summary["top_k_mean"]),
                call=str(summary["call"]),
                threshold=float(summary["threshold"]),
                tiles=int(summary["tiles"]),
                top_tile=float(summary["max_probability"]),
                unfamiliar_share=None if share is None else float(share),
            )
        )
    write_slide_calls(folder, calls)
    _update_card(folder, calls)
    return calls


def as_slides(calls: Sequence[SlideCall]) -> Slides | None:
    """The annotated slides of ``calls`` as `models.decision.Slides` (truth 1 abnormal, predict's score), the form
    the pages' slide figures take, with every slide of ``calls`` reported UNFAMILIAR or with a focus by name (or
    ``None`` for a flag the file does not record); ``None`` when none is annotated."""
    import numpy as np

    known = [c for c in calls if c.truth]
    if not known:
        return None
    return Slides(
        keys=tuple(c.slide for c in known),
        labels=np.array([int(c.truth == "abnormal") for c in known], dtype=np.int64),
        scores=np.array([c.score for c in known], dtype=np.float64),
        tiles=np.array([c.tiles for c in known], dtype=np.int64),
        # counted only where every row recorded what decides the flag (an older file, or a bundle without a tissue
        # description, leaves it None: "not recorded", never 0)
        unfamiliar=(
            tuple(c.slide for c in calls if c.reported.unfamiliar)
            if all(c.unfamiliar_share is not None for c in calls)
            else None
        ),
        focus=tuple(c.slide for c in calls if c.reported.focus) if all(c.top_tile is not None for c in calls) else None,
    )


def calls_line(hospital: int, calls: Sequence[SlideCall]) -> str:
    """One line for a hospital's held-out slide calls, misses named as misses."""
    abnormal = [c for c in calls if c.truth == "abnormal"]
    normal = [c for c in calls if c.truth == "normal"]
    found = sum(c.call == "abnormal" for c in abnormal)
    cleared = sum(c.call == "normal" for c in normal)
    missed = [c.slide for c in abnormal if c.missed]
    alarms = [c.slide for c in normal if c.missed]
    text = (
        f"hospital {hospital}: {found} of {len(abnormal)} abnormal test slides called abnormal, {cleared} of "
        f"{len(normal)} normal called normal"
    )
    text += f"; {MISSED_CANCER}: {', '.join(missed)}" if missed else ""
    text += f"; {FALSE_ALARM}: {', '.join(alarms)}" if alarms else ""
    strange = [c.slide for c in calls if c.reported.unfamiliar]
    focus = [c.slide for c in calls if c.reported.focus]
    text += f"; UNFAMILIAR (do not rely on the call): {', '.join(strange)}" if strange else ""
    return text + (f"; normal with a focus above the threshold (review): {', '.join(focus)}" if focus else "")


def score_run(run: Path, dataset: Path | None = None, device: str = "cpu") -> list[str]:
    """`score_held_out` (on ``device``) for every hospital of ``run`` whose folder is on this machine; one line per
    hospital."""
    from app import slide_view
    from models.bundle import BundleError

    lines = []
    for hospital, folder in sorted(slide_view.bundle_folders(run).items()):
        problems: list[str] = []
        try:
            calls = score_held_out(folder, dataset, device, problems)
        except (slide_view.SlideViewError, BundleError, FederationError) as exc:
            lines.append(f"hospital {hospital}: test slides not scored ({exc})")
            continue
        lines.append(calls_line(hospital, calls))
        lines += [f"hospital {hospital}: test slide {problem}" for problem in problems]
    return lines


def _finished_on(folder: Path, card: dict[str, object]) -> str | None:
    """The run's ``run.device`` when the hospital's exported model (``card``) is that of its run's last round
    (``hospital.json``'s configuration names both); ``None`` for a round's export or an unreadable record."""
    import tomllib

    from federation.runfiles import HOSPITAL_FILE
    from infra.records import read_json_object

    try:
        record = read_json_object(folder / HOSPITAL_FILE)  # RecordError, a ValueError, when unusable
        run = tomllib.loads(str(record["config_toml"]))["run"]
        rounds, device = run["rounds"], str(run.get("device", "cpu"))
    except (OSError, ValueError, KeyError, TypeError, tomllib.TOMLDecodeError):
        return None
    return device if isinstance(card.get("round"), int) and card.get("round") == rounds else None


def score_finished(runs: Path, dataset: Path, hospital: int, seen: dict[Path, int]) -> list[str]:
    """A deployed hospital's runs (``runs``: one folder per run, `federation.hospital.handler.Site.per_run`) whose
    model was exported after the run's last round and whose ``slides.csv`` is missing or older than that export:
    score the test slides of ``dataset`` with it (`score_held_out`, predict's code), once per export. ``seen``
    (folder -> the card's modification time last handled) is kept by the caller between calls. One line per run
    scored or not scored."""
    from app import slide_view
    from models.bundle import BundleError
    from models.names import CARD_FILE
    from pipeline.errors import PipelineError

    lines = []
    for card_path in sorted(runs.glob(f"*/{CARD_FILE}")):
        folder = card_path.parent
        try:
            stamp = card_path.stat().st_mtime_ns
            slides = folder / SLIDES_FILE
            if seen.get(folder) == stamp or (slides.is_file() and slides.stat().st_mtime_ns >= stamp):
                continue
            seen[folder] = stamp  # each export is looked at once, scored or not
            device = _finished_on(folder, slide_view.read_card_json(folder))
            if device is None:
                continue  # a round's export: the card is written again after the next one
            problems: list[str] = []
            calls = score_held_out(folder, dataset, device, problems)  # where the hospital trained the run
            seen[folder] = card_path.stat().st_mtime_ns  # score_held_out wrote the card's slide-level figures
        except (
            slide_view.SlideViewError,
            BundleError,
            FederationError,
            SlideCallsError,
            PipelineError,
            OSError,
        ) as exc:
            lines.append(f"run {folder.name}: test slides not scored ({exc})")
            continue
        lines.append(f"run {folder.name}: {calls_line(hospital, calls)}")
        lines += [f"run {folder.name}: test slide {problem}" for problem in problems]
    return lines


def held_out_slides(run: Path) -> dict[int, Slides]:
    """`as_slides` of every hospital's ``slides.csv`` in ``run`` that reads and holds an annotated slide."""
    found = {}
    for hospital, calls in run_slide_calls(run).items():
        slides = as_slides(calls)
        if slides is not None:
            found[hospital] = slides
    return found
