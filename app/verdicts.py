"""One verdict per hospital, the same on every page, report and command (issue 31, item 1).

A hospital's operating point is its model card's threshold (``models.bundle``; `app.operating` saves a chosen one,
with the split that chose it). `judge_run` judges every hospital of a run at that threshold against a clinical
floor (`app.evaluation.verdict.judge`: the Verdict rule), from its own ``predictions.csv``, its validation
predictions (where the threshold reaching the floor is chosen) and its held-out slides as ``predict`` scored them
(``slides.csv``). The Verdict, Hospital, Federation and Compare pages, the HTML report, ``gastric-fl report`` and
``gastric-fl predict`` all read their verdicts from here, so they cannot disagree. FedSAF paper 001, Sec. 5: each
hospital's model on its own test split.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from app.evaluation.tables import flag_counts, verdict_word
from app.evaluation.verdict import Floor, Judgement, judge
from app.held_out import SlideCallsError, as_slides, held_out_slides, read_slide_calls
from app.run_predictions import hospital_rows, read_prediction_file, read_run_predictions, read_val_predictions
from app.run_records import NO_CARD, CardThreshold, card_operating


@dataclass(frozen=True)
class RunVerdicts:
    """Every hospital of a run that could be judged, by hospital, and one line per predictions file that could
    not be read."""

    judgements: tuple[Judgement, ...]
    problems: tuple[str, ...] = ()

    def of(self, hospital: int) -> Judgement | None:
        """The hospital's judgement, if it was judged."""
        return next((j for j in self.judgements if j.hospital == hospital), None)


def judge_run(run: Path, floor: Floor, predictions: pd.DataFrame | None = None) -> RunVerdicts:
    """Judge every hospital of ``run`` that has test predictions at its card's threshold against ``floor``.

    ``predictions``: the run's test predictions when the caller has read them already (`read_run_predictions`);
    read here otherwise."""
    problems: tuple[str, ...] = ()
    if predictions is None:
        found = read_run_predictions(run)
        predictions, problems = found.frame, found.problems
    if predictions.empty:
        return RunVerdicts((), problems)
    operating = card_operating(run)
    val = read_val_predictions(run)
    held_out = held_out_slides(run)
    judged = []
    for key, rows in predictions.groupby("client", sort=True):
        hospital = int(key)
        card: CardThreshold = operating.get(hospital, NO_CARD)
        judged.append(
            judge(
                hospital,
                rows,
                card.value,
                card.source,
                card.split,
                floor,
                hospital_rows(val, hospital),
                held_out.get(hospital),
            )
        )
    return RunVerdicts(tuple(judged), problems)


def verdict_rows(runs: list[Path], floor: Floor) -> list[dict[str, Any]]:
    """One row per run x hospital judged (`judge_run`): run, client, verdict, threshold, where it came from, its
    held-out slides reported UNFAMILIAR or with a focus (`app.evaluation.tables.flag_counts`) and the reason
    (``federation.report.VERDICT_COLUMNS``), for ``gastric-fl report``."""
    rows: list[dict[str, Any]] = []
    for run in runs:
        for judged in judge_run(run, floor).judgements:
            rows.append(
                {
                    "run": run.name,
                    "client": judged.hospital,
                    "verdict": verdict_word(judged.verdict.kind, floor),
                    "threshold": round(judged.threshold, 4),
                    "threshold from": judged.source,
                    **flag_counts(judged.score),
                    "reason": judged.verdict.reason,
                }
            )
    return rows


def judge_folder(folder: Path, card: CardThreshold, hospital: int, floor: Floor) -> Judgement | None:
    """Judge one hospital's bundle ``folder`` (a hospital folder of a run: its ``predictions.csv``, and where
    present its ``val_predictions.csv`` and ``slides.csv``) at its ``card`` threshold against ``floor``, as
    `judge_run` judges it; ``None`` when the folder holds no readable test predictions (an exported bundle alone)."""
    from app.errors import DashboardError
    from federation.runfiles import PREDICTIONS_FILE, SLIDES_FILE, VAL_PREDICTIONS_FILE

    try:
        rows = read_prediction_file(folder / PREDICTIONS_FILE)
    except DashboardError:
        return None
    val = None
    if (folder / VAL_PREDICTIONS_FILE).is_file():
        try:
            val = read_prediction_file(folder / VAL_PREDICTIONS_FILE)
        except DashboardError:
            val = None
    held_out = None
    if (folder / SLIDES_FILE).is_file():
        try:
            held_out = as_slides(read_slide_calls(folder / SLIDES_FILE))
        except SlideCallsError:
            held_out = None
    return judge(hospital, rows, card.value, card.source, card.split, floor, val, held_out)
