"""Verdict page, where a clinician lands once a finished run exists: every hospital's own model judged against a
clinical floor the user sets (issue 23, item 1).

Each hospital is judged at its own operating threshold (its model card's, `app.operating` saves a chosen one) by
`app.verdicts.judge_run`, the one judgement every page, report and command shows: pass, review, fail or cannot judge,
with word and colour, and the reason in one sentence. Beside it: test slides and tiles, the AUC with its interval
resampled by slide (or why it cannot be estimated), sensitivity and specificity with Wilson intervals, the slide calls
(`models.decision`), and the held-out slides reported UNFAMILIAR or with a focus, counted
(`app.evaluation.tables.flag_counts`; "not recorded" where the run's files do not say). A hospital that does not pass
and has a threshold reaching the floor gets a button to save that threshold into its bundle (chosen with a margin: the
floor on the lower end of the 95% interval of the validation sensitivity, `app.evaluation.threshold.bounded_threshold`;
where none reaches it, the page says so), confirmed with who and why after the direction of the change and what it gives
on test (`app.dashboard.threshold_change.save_threshold_button`); a saved change has an Undo
(`app.dashboard.threshold_change.undo_button`). The dataset's shortcut-probe warning, when prepare raised one, stands
above the verdicts. FedSAF paper 001, Sec. 5: each client's model on its own test split.
"""

from __future__ import annotations

import math

import streamlit as st

from app.dashboard import ui
from app.dashboard.threshold_change import flash, save_floor_button, undo_button
from app.datasets import hospital_label, load_prepare_json, shortcut_probe
from app.errors import DashboardError
from app.evaluation.classes import is_multi_class, not_applicable
from app.evaluation.tables import FOCUS_SLIDES, UNFAMILIAR_SLIDES, flag_counts
from app.evaluation.verdict import FAIL, REVIEW, Floor, HospitalScore, Judgement
from app.run_predictions import prediction_files, read_run_predictions, run_classes
from app.run_records import RunInfo, load_metrics, privacy_spent, read_run_config
from app.verdicts import judge_run
from models.decision import auc_interval_text, interval_text

RULE = (
    "The rule, in order: **cannot judge** without an abnormal test tile; **fail**, whatever the number of slides, "
    "when the whole 95% interval of the sensitivity at the hospital's threshold lies below the floor; **cannot "
    "judge** below the minimum number of test slides; **fail** when the sensitivity is below the floor, on its tiles "
    "or on its abnormal slides; **review** when the floor is met but an abnormal slide is still called normal, the "
    "interval of the sensitivity reaches below the floor (too few abnormal tiles to be sure) or the specificity is "
    "below the review line; **pass** otherwise. Figures come from each hospital's held-out test split at the "
    "threshold its model card decides with; a threshold chosen on that split is judged on it too, so confirm it on "
    "slides the model has not seen."
)


def _rate(value: float, interval: tuple[float, float] | None) -> str:
    if math.isnan(value):
        return "undefined"
    text = interval_text(interval)
    return f"{value:.2f} (95% CI {text})" if text else f"{value:.2f}"


def _figures(score: HospitalScore) -> str:
    point = score.point
    auc = "undefined (one class)" if score.auc is None else f"{score.auc:.2f}"
    if score.auc is not None:
        auc += f" (95% CI {auc_interval_text(score.auc_interval, score.slides)}, slides resampled)"
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
    counts = flag_counts(score)  # the held-out slides reported UNFAMILIAR or with a focus, as every table counts them
    parts.append(f"{UNFAMILIAR_SLIDES}: {counts[UNFAMILIAR_SLIDES]}, {FOCUS_SLIDES}: {counts[FOCUS_SLIDES]}")
    return " · ".join(parts)


def _hospital(
    info: RunInfo,
    judged: Judgement,
    floor: Floor,
    privacy: dict[int, tuple[float, float]],
    unit: str,
) -> None:
    hospital, score, result = judged.hospital, judged.score, judged.verdict
    with st.container(border=True):
        st.markdown(f"#### {hospital_label(hospital)} &nbsp; {ui.verdict_badge(result.kind, floor)}")
        st.markdown(f"{hospital_label(hospital)}: {result.reason}")
        dp = ""
        if hospital in privacy:
            epsilon, delta = privacy[hospital]
            dp = f" · differential privacy: epsilon {epsilon:.2f} at delta {delta:g} so far, per {unit}"
        st.caption(f"{_figures(score)} · threshold {judged.threshold:.2f} ({judged.source}){dp}")
        target = score.target
        if result.kind in (FAIL, REVIEW) and target is not None:
            whose = f"{hospital_label(hospital)}'s"
            floor_name = "the Verdict page's floor"
            save_floor_button(
                info, hospital, target.threshold, judged.threshold, floor.sensitivity, floor_name, whose, "the floor",
                target.split,
            )  # fmt: skip
        elif result.kind in (FAIL, REVIEW) and score.unreachable is not None:
            st.info(f"No threshold proposed: {score.unreachable.words}.", icon=":material/info:")
        undo_button(info.path, hospital, f"undo_{info.run_id}_{hospital}")


def _shortcut_warning(info: RunInfo) -> None:
    """The dataset's shortcut-probe warning (prepare's: label-free pixel statistics alone separate the classes),
    so a verdict is not read without it; nothing when the probe raised none or the record is not there."""
    if info.dataset is None or not info.dataset.is_dir():
        return
    try:
        probe = shortcut_probe(load_prepare_json(info.dataset))
    except DashboardError:
        return
    if probe is not None and probe.warning:
        st.warning(
            f"Shortcut warning on this run's data: {probe.warning} (details on the Data page).",
            icon=":material/warning:",
        )


@ui.page_guard("Verdict")
def page() -> None:
    """The Verdict page."""
    st.title("Verdict")
    st.caption("Every hospital's own model against a clinical floor, at the threshold its model card decides with.")
    flash()
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
    classes = run_classes(info.path)
    if is_multi_class(classes):
        st.info(
            not_applicable(len(classes), "the verdict, its floor and the threshold it judges at")
            + " Each hospital's accuracy and macro one-vs-rest AUC are on the Hospital and Federation pages.",
            icon=":material/info:",
        )
        return
    found = read_run_predictions(info.path)
    for problem in found.problems:
        st.error(problem, icon=":material/error:")
    if found.frame.empty:
        return
    _shortcut_warning(info)
    floor = ui.floor_controls("verdict")
    privacy = privacy_spent(load_metrics(info.path))
    unit = str((read_run_config(info.path).get("privacy") or {}).get("unit") or "slide")
    verdicts = judge_run(info.path, floor, found.frame).judgements
    for judged in verdicts:
        _hospital(info, judged, floor, privacy, unit)
    counts = {kind: sum(j.verdict.kind == kind for j in verdicts) for kind in ui.VERDICT_COLOURS}
    st.caption(
        f"{len(verdicts)} hospitals: "
        + ", ".join(f"{n} {kind}" for kind, n in counts.items() if n)
        + f". The floor: {floor.words}; the Federation and Compare pages and the HTML report downloaded "
        "from the Slide page judge with it. " + RULE
    )
    link = "Scorecard and ROC curves on the Hospital page"
    st.page_link(str(ui.VIEWS / "hospital.py"), label=link, icon=":material/arrow_forward:")


page()
