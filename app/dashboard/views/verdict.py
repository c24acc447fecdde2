"""Verdict page, where a clinician lands once a finished run exists: every hospital's own model judged against a
clinical floor the user sets (issue 23, item 1).

Each hospital is judged at its own operating threshold (its model card's, `app.operating` saves a chosen one) by
`app.dashboard.evaluation.verdict`: pass, review, fail or cannot judge, with icon, word and colour, and the reason in
one sentence. Beside it: test slides and tiles, the AUC with its interval resampled by slide, sensitivity and
specificity with Wilson intervals, and the slide calls (`models.decision`). A hospital that does not pass and has a
threshold reaching the floor gets a button to save that threshold into its bundle. FedSAF paper 001, Sec. 5: each
client's model on its own test split.
"""

from __future__ import annotations

import math

import pandas as pd
import streamlit as st

from app.dashboard import evaluation, ui
from app.dashboard.datasets import hospital_label
from app.dashboard.runs import (
    RunInfo,
    card_threshold_sources,
    card_thresholds,
    hospital_rows,
    load_metrics,
    prediction_files,
    privacy_spent,
    read_run_config,
    read_run_predictions,
    read_val_predictions,
)
from app.held_out import held_out_slides
from models.decision import DEFAULT_THRESHOLD, Slides, interval_text

# icon + word + colour (Streamlit's background colours; the word alone carries the meaning)
LOOK = {
    evaluation.PASS: (":material/check_circle:", "green", "PASS"),
    evaluation.REVIEW: (":material/rate_review:", "orange", "REVIEW"),
    evaluation.FAIL: (":material/cancel:", "red", "FAIL"),
    evaluation.CANNOT_JUDGE: (":material/help:", "gray", "CANNOT JUDGE"),
}
RULE = (
    "The rule, in order: **cannot judge** below the minimum number of test slides; **fail** when the sensitivity at "
    "the hospital's threshold is below the floor, on its tiles or on its abnormal slides; **review** when the floor "
    "is met but the 95% interval of the sensitivity reaches below it (too few abnormal tiles to be sure) or the "
    "specificity is below the review line; **pass** otherwise. Figures come from each hospital's held-out test "
    "split; a threshold chosen on that split is judged on it too, so confirm it on slides the model has not seen."
)


def _rate(value: float, interval: tuple[float, float] | None) -> str:
    if math.isnan(value):
        return "undefined"
    text = interval_text(interval)
    return f"{value:.2f} (95% CI {text})" if text else f"{value:.2f}"


def _figures(score: evaluation.HospitalScore) -> str:
    point = score.point
    auc = "undefined (one class)" if score.auc is None else f"{score.auc:.3f}"
    if score.auc_interval is not None:
        auc += f" (95% CI {interval_text(score.auc_interval)}, slides resampled)"
    slides = "unknown" if score.slides is None else str(score.slides)
    parts = [
        f"**{slides}** test slides, **{point.abnormal + point.normal}** tiles ({point.abnormal} abnormal)",
        f"AUC {auc}",
        f"sensitivity {_rate(point.sensitivity, point.sensitivity_interval)}",
        f"specificity {_rate(point.specificity, point.specificity_interval)}",
    ]
    slide = score.slide_point
    if slide is not None:
        parts.append(
            f"slides: {slide.tp} of {slide.abnormal} abnormal called abnormal, {slide.tn} of {slide.normal} normal "
            "called normal"
        )
    return " · ".join(parts)


def _hospital(
    info: RunInfo,
    client: int,
    rows: pd.DataFrame,
    floor: evaluation.Floor,
    privacy: dict[int, tuple[float, float]],
    unit: str,
    thresholds: dict[int, float],
    sources: dict[int, str],
    val_rows: pd.DataFrame | None = None,
    held_out: Slides | None = None,
) -> evaluation.Verdict:
    threshold = thresholds.get(client, DEFAULT_THRESHOLD)
    source = sources.get(client, "the default 0.5 (no model card)")
    score = evaluation.score_hospital(client, rows, threshold, floor.sensitivity, floor.min_slides, val_rows, held_out)
    result = evaluation.verdict(score, floor)
    icon, colour, word = LOOK[result.kind]
    with st.container(border=True):
        st.markdown(f"#### {hospital_label(client)} &nbsp; :{colour}-background[{icon} **{word}**]")
        st.markdown(f"{hospital_label(client)}: {result.reason}")
        dp = ""
        if client in privacy:
            epsilon, delta = privacy[client]
            dp = f" · differential privacy: epsilon {epsilon:.2f} at delta {delta:g} so far, per {unit}"
        st.caption(f"{_figures(score)} · threshold {threshold:.2f} ({source}){dp}")
        target = score.target
        if result.kind in (evaluation.FAIL, evaluation.REVIEW) and target is not None:
            whose = f"{hospital_label(client)}'s"
            floor_name = "the Verdict page's floor"
            ui.save_floor_button(
                info, client, target.threshold, threshold, floor.sensitivity, floor_name, whose, "the floor",
                target.split,
            )  # fmt: skip
    return result


@ui.page_guard("Verdict")
def page() -> None:
    """The Verdict page."""
    st.title("Verdict")
    st.caption("Every hospital's own model against a clinical floor, at the threshold it decides with.")
    runs = [r for r in ui.all_runs() if prediction_files(r.path)]
    if not runs:
        ui.no_runs_help()
        return
    info = ui.pick_run(runs, "Run", key="verdict_run", finished_first=True)
    if info is None:
        return
    ui.intended_use(info.dataset)
    status = ui.display_status(info)
    if info.damaged or status != "finished":
        ui.status_banner(info)
    found = read_run_predictions(info.path)
    for problem in found.problems:
        st.error(problem, icon=":material/error:")
    if found.frame.empty:
        return
    floor = ui.floor_controls("verdict")
    privacy = privacy_spent(load_metrics(info.path))
    unit = str((read_run_config(info.path).get("privacy") or {}).get("unit") or "slide")
    groups = found.frame.groupby("client", sort=True)
    thresholds, sources = (
        card_thresholds(info.path),
        card_threshold_sources(info.path),
    )  # once per page, not per hospital
    val = read_val_predictions(info.path)
    held_out = held_out_slides(info.path)  # the test slides as predict scored them (slides.csv)
    verdicts = [
        _hospital(
            info,
            int(client),
            rows,
            floor,
            privacy,
            unit,
            thresholds,
            sources,
            hospital_rows(val, int(client)),
            held_out.get(int(client)),
        )
        for client, rows in groups
    ]
    counts = {kind: sum(v.kind == kind for v in verdicts) for kind in LOOK}
    st.caption(
        f"{len(verdicts)} hospitals: "
        + ", ".join(f"{n} {LOOK[kind][2].lower()}" for kind, n in counts.items() if n)
        + ". "
        + RULE
    )
    link = "Scorecard and ROC curves on the Hospital page"
    st.page_link(str(ui.VIEWS / "hospital.py"), label=link, icon=":material/arrow_forward:")


page()
