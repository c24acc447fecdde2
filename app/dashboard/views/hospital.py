"""Hospital page: the scorecard of a run (every hospital side by side at its own operating threshold, the one its
model card decides with: its verdict, AUC, accuracy, sensitivity and specificity, a warning where a good AUC hides
a poor operating point, and the threshold that reaches the floor's sensitivity), then one hospital in detail at
that same threshold: its verdict, ROC curve with AUC, confusion matrix, its figures over rounds, and example test
tiles with their predicted probability, highest-confidence errors first (FedSAF paper, Sec. 5: each client
evaluated on its own test split). A slider explores other thresholds and says that it is exploring; the verdict,
the scorecard and the charts stay at the card's threshold until one is saved (confirmed, with who and why).
Everything comes from each hospital's own ``predictions.csv`` and model card, in its folder of the run, judged by
`app.verdicts.judge_run` as every other page and report judges it."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import streamlit as st

from app.dashboard import charts, ui
from app.dashboard.threshold_change import flash, save_floor_button, save_threshold_button, undo_button
from app.datasets import LABELS, hospital_label
from app.evaluation.classes import class_accuracy, class_confusion, is_multi_class, not_applicable
from app.evaluation.metrics import OperatingPoint, confusion, operating_point, ranked_examples, roc
from app.evaluation.tables import FLAG_HELP, FOCUS_SLIDES, UNFAMILIAR_SLIDES, judgement_table
from app.evaluation.threshold import TargetThreshold
from app.evaluation.verdict import Floor, Judgement
from app.run_predictions import prediction_files, read_run_class_predictions, read_run_predictions, run_classes
from app.run_records import RunInfo, latest_per_hospital, load_metrics
from app.verdicts import judge_run
from models.decision import SLIDE_RULE, SLIDE_TOP_K, auc_interval_text

TILES_SHOWN = 12
ACCURACY_HELP = "The share of test tiles whose class of highest probability is their own."
MACRO_AUC_HELP = (
    "Macro one-vs-rest AUC: for each class present in the hospital's test split, how well the probability of that "
    "class ranks its tiles above the others' (1 perfect, 0.5 a coin toss), averaged over those classes."
)
SLIDE_CALL = SLIDE_RULE.format(k=SLIDE_TOP_K)


def _rate(value: float) -> str:
    return "—" if math.isnan(value) else f"{value:.3f}"


def _scorecard(judgements: tuple[Judgement, ...], floor: Floor) -> None:
    """Every hospital side by side at its own card's threshold, its verdict against ``floor`` first, with warnings
    in words and the threshold reaching the floor's sensitivity (chosen on each hospital's validation split where
    it has one)."""
    for judged in judgements:
        if judged.score.warning:
            st.warning(f"**{hospital_label(judged.hospital)}**: {judged.score.warning}", icon=":material/warning:")
    table = judgement_table(judgements)
    target = floor.sensitivity
    number = st.column_config.NumberColumn
    st.dataframe(
        table,
        hide_index=True,
        width="stretch",
        key="scorecard",
        column_config={
            "hospital": st.column_config.TextColumn("hospital", pinned=True),
            "verdict": st.column_config.TextColumn("verdict", help="against the floor above (the Verdict page's)"),
            "threshold": number("threshold", format="%.2f", help="the threshold its model card decides with"),
            "test slides": number("slides", help="the slides the hospital's held-out test tiles come from"),
            "test tiles": number("tiles", help="the hospital's own held-out test tiles"),
            "AUC": number("AUC", format="%.3f", help=ui.EXPLAIN["AUC"]),
            "AUC 95% CI": st.column_config.TextColumn(
                "AUC 95% CI", help="percentile bootstrap resampling whole test slides (tiles of a slide go together)"
            ),
            "slide sensitivity": number(
                "slide sens.", format="%.2f", help=f"abnormal test slides called abnormal ({SLIDE_CALL})"
            ),
            "slide specificity": number("slide spec.", format="%.2f", help="normal test slides called normal"),
            "missed slides": st.column_config.TextColumn(
                "missed slides", help="abnormal test slides called normal at the threshold, of all abnormal slides"
            ),
            UNFAMILIAR_SLIDES: st.column_config.TextColumn(UNFAMILIAR_SLIDES, help=FLAG_HELP[UNFAMILIAR_SLIDES]),
            FOCUS_SLIDES: st.column_config.TextColumn(FOCUS_SLIDES, help=FLAG_HELP[FOCUS_SLIDES]),
            "accuracy": number("accuracy", format="%.2f", help=ui.EXPLAIN["accuracy"]),
            "sensitivity": number("sensitivity", format="%.2f", help=ui.EXPLAIN["sensitivity"]),
            "sensitivity 95% CI": st.column_config.TextColumn(
                "95% CI", help="Wilson interval of the sensitivity over the hospital's abnormal test tiles"
            ),
            "specificity": number("specificity", format="%.2f", help=ui.EXPLAIN["specificity"]),
            "specificity 95% CI": st.column_config.TextColumn(
                "95% CI ", help="Wilson interval of the specificity over the hospital's normal test tiles"
            ),
            "missed abnormal": st.column_config.TextColumn(
                "missed", help="abnormal tiles called normal at the threshold, of all abnormal tiles"
            ),
            "false alarms": st.column_config.TextColumn(
                "false alarms", help="normal tiles called abnormal at the threshold, of all normal tiles"
            ),
            "threshold for target": number(
                f"threshold for {target:.2f}",
                format="%.2f",
                help=f"the highest threshold at which the hospital reaches the floor's sensitivity {target:.2f} "
                "(chosen on its validation split where it has one)",
            ),
            "sensitivity there": number(
                "its sensitivity",
                format="%.2f",
                help="sensitivity on the test split at that threshold (ties may lift it past the target)",
            ),
            "specificity there": number(
                "its specificity", format="%.2f", help="specificity at that threshold: what reaching the target costs"
            ),
        },
    )
    st.caption(
        f"Each hospital at the threshold its model card decides with. {ui.EXPLAIN['AUC']} A high AUC with a low "
        "sensitivity or specificity means the tiles are ranked well but the threshold sits in the wrong place for "
        "that hospital."
    )


def _hospital_detail(
    info: RunInfo,
    predictions: pd.DataFrame,
    judgements: tuple[Judgement, ...],
    floor: Floor,
) -> None:
    """One hospital at its card's threshold: its verdict, figures, ROC curve, confusion matrix, history and example
    tiles; then a slider that explores another threshold (said to be exploring) and the save buttons."""
    judged_by = {j.hospital: j for j in judgements}
    hospitals = sorted(judged_by)
    hospital = st.selectbox("Hospital", hospitals, format_func=hospital_label, key="hospital")
    judged = judged_by[hospital]
    threshold = judged.threshold
    rows = predictions[predictions["client"] == hospital]
    labels = rows["label"].to_numpy(dtype=int)
    probs = rows["prob_abnormal"].to_numpy(dtype=float)
    curve = roc(labels, probs)
    point = judged.score.point
    metrics = load_metrics(info.path)
    mine = metrics[metrics["client"] == hospital]

    badge = ui.verdict_badge(judged.verdict.kind, judged.floor)
    st.markdown(f"**{hospital_label(hospital)}** &nbsp; {badge} &nbsp; {judged.verdict.reason}")
    st.caption(
        f"{hospital_label(hospital)}'s model card decides at threshold {threshold:.2f} ({judged.source}); every "
        "figure and chart below is at it."
    )
    cols = st.columns(5)
    cols[0].metric("AUC", "undefined" if curve.auc is None else f"{curve.auc:.3f}", help=ui.EXPLAIN["AUC"])
    cols[1].metric("Accuracy", _rate(point.accuracy), help=f"{ui.EXPLAIN['accuracy']} ({threshold:.2f})")
    cols[2].metric(
        "Sensitivity", _rate(point.sensitivity), help=f"{ui.EXPLAIN['sensitivity']} {point.tp} of {point.abnormal}."
    )
    cols[3].metric(
        "Specificity", _rate(point.specificity), help=f"{ui.EXPLAIN['specificity']} {point.tn} of {point.normal}."
    )
    cols[4].metric("Test tiles", f"{len(rows)}", help=f"{point.abnormal} abnormal, {point.normal} normal")
    if curve.auc is None:
        st.warning(f"{hospital_label(hospital)}'s test split holds only one class, so its AUC is undefined.")
    else:
        interval = auc_interval_text(judged.score.auc_interval, judged.score.slides)
        st.caption(f"AUC 95% CI, resampling whole slides: {interval}.")

    explored = _explore(info, hospital, threshold)
    exploring = abs(explored - threshold) > 1e-9
    seen = operating_point(labels, probs, explored) if exploring else None

    left, right = st.columns(2)
    with left:
        marker = (1.0 - point.specificity, point.sensitivity)
        other = None if seen is None else (1.0 - seen.specificity, seen.sensitivity)
        auc_text = "undefined (one class)" if curve.auc is None else f"{curve.auc:.3f}"
        roc_alt = (
            f"ROC curve of {hospital_label(hospital)}, AUC {auc_text}; at its card's threshold {threshold:.2f} (the "
            f"diamond) sensitivity {_rate(point.sensitivity)} and specificity {_rate(point.specificity)}"
            + (
                f"; the open circle: threshold {explored:.2f} being explored, sensitivity {_rate(seen.sensitivity)}, "
                f"specificity {_rate(seen.specificity)}."
                if seen is not None
                else "."
            )
        )
        figure = charts.roc_curve(
            curve,
            hospital_label(hospital),
            charts.hospital_colour(hospital),
            marker,
            other,
            marker_name=f"the card's threshold {threshold:.2f}",
            explored_name=f"exploring {explored:.2f} (not saved)",
        )
        ui.chart(st, figure, key="roc_chart", alt=roc_alt)
        st.caption(ui.EXPLAIN["ROC"] + " The diamond is the card's threshold, the one in use.")
    with right:
        confusion_alt = (
            f"Confusion matrix at the card's threshold {threshold:.2f}: of {point.normal} normal tiles {point.tn} "
            f"called normal and {point.fp} abnormal; of {point.abnormal} abnormal tiles {point.tp} called abnormal "
            f"and {point.fn} normal."
        )
        matrix = charts.confusion(confusion(labels, probs, threshold), threshold, "the model card's")
        ui.chart(st, matrix, key="confusion", alt=confusion_alt)
        st.caption(ui.EXPLAIN["confusion"])

    _save_buttons(info, hospital, explored, seen, judged.score.target, floor, threshold)

    if not mine.empty:
        history = pd.DataFrame(
            {"test AUC": mine.set_index("round")["test_auc"], "test accuracy": mine.set_index("round")["test_acc"]}
        )
        ui.chart(
            st,
            charts.per_hospital(history, f"{hospital_label(hospital)} over rounds (accuracy at 0.50)", "value"),
            key="history_chart",
        )
        last_auc = float(mine["test_auc"].iloc[-1])
        note = (
            f"Last round's test AUC recorded by the run: {last_auc:.3f}; the run's accuracy over rounds is at "
            "threshold 0.50, the training's own figure, not the card's."
        )
        if curve.auc is not None and abs(curve.auc - last_auc) > 0.005:
            # predictions.csv holds the probabilities at full precision, so the two agree unless they come from
            # different rounds (a run still writing, or a run directory written by an older version).
            note += (
                " The AUC above differs: the tile predictions and the run's metrics come from different rounds"
                " (the run may still be writing its latest round)."
            )
        st.caption(note)

    _example_tiles(info, rows, hospital, threshold)


def _explore(info: RunInfo, hospital: int, card: float) -> float:
    """A slider exploring another threshold for ``hospital``, starting at its ``card`` threshold (again on every
    return to the page, as Streamlit forgets a widget the page did not draw); when moved, it says that it explores
    and what the model would do there, while the verdict and charts stay at the card's."""
    key = f"explore_{info.run_id}_{hospital}"
    if key not in st.session_state:
        st.session_state[key] = round(card, 2)
    explored = float(
        st.slider(
            "Explore another threshold (a tile is called abnormal when its probability is at least this)",
            0.0,
            1.0,
            step=0.01,
            key=key,
            help=ui.EXPLAIN["threshold"] + " Exploring changes nothing until you save.",
        )
    )
    if abs(explored - card) <= 1e-9:
        st.caption(f"At the card's threshold {card:.2f}. Move the slider to see what another threshold would do.")
    return explored


def _save_buttons(
    info: RunInfo,
    hospital: int,
    explored: float,
    seen: OperatingPoint | None,
    target: TargetThreshold | None,
    floor: Floor,
    current: float,
) -> None:
    """What the explored threshold would do (``seen``, when exploring; said to be exploring), and buttons to save it,
    or the threshold reaching the floor (``target``, the judgement's: chosen on the hospital's validation split where
    it has one), as the hospital's operating threshold (its model bundle), each confirmed with who and why."""
    if seen is not None:
        st.info(
            f"**Exploring threshold {explored:.2f}, not saved.** There {hospital_label(hospital)} would find "
            f"{seen.tp} of {seen.abnormal} abnormal tiles (sensitivity {_rate(seen.sensitivity)}) and call "
            f"{seen.fp} of {seen.normal} normal tiles abnormal (specificity {_rate(seen.specificity)}). The verdict, "
            f"the scorecard and the charts stay at the card's threshold {current:.2f} until you save one.",
            icon=":material/explore:",
        )
    left, right = st.columns(2)
    with left:
        if seen is not None and 0.0 < explored < 1.0:
            save_threshold_button(
                info.path, hospital, explored, "set by hand", f"Save {explored:.2f} as its threshold",
                key=f"save_hand_{info.run_id}_{hospital}", current=current,
            )  # fmt: skip
    with right:
        if target is not None:
            reaches = f"the floor {floor.sensitivity:.2f}"
            save_floor_button(
                info, hospital, target.threshold, current, floor.sensitivity, "the floor", "its", reaches, target.split
            )
        undo_button(info.path, hospital, f"undo_hospital_{info.run_id}_{hospital}")


def _example_tiles(info: RunInfo, rows: pd.DataFrame, hospital: int, threshold: float) -> None:
    st.subheader("Example test tiles")
    st.caption("Errors first, the ones the model was most sure about at the top; then correct calls.")
    examples = ranked_examples(rows, threshold).head(TILES_SHOWN)
    dataset = info.dataset
    if dataset is None or not dataset.is_dir():
        st.warning(f"The prepared dataset of this run ({dataset}) is not available, so its tiles cannot be shown.")
        return
    grid = st.columns(6)
    for i, row in enumerate(examples.itertuples(index=False)):
        truth = LABELS[int(row.label)]
        called = LABELS[int(row.predicted)]
        prob = float(row.prob_abnormal)
        verdict = "wrong" if row.error else "right"
        # words only, no icon (its name is read aloud) and no colour (a faded caption's colour falls below 4.5:1)
        mark = "**wrong**" if row.error else "right"
        with grid[i % 6]:
            ui.tile_image(
                dataset / str(row.path),
                caption=f"{mark} true **{truth}** · p(abnormal) = {prob:.2f}",
                alt=f"{hospital_label(hospital)} test tile, truly {truth}; the model gives it a probability of "
                f"{prob:.2f} of abnormal and calls it {called} ({verdict}).",
            )


def _classes(info: RunInfo, classes: tuple[str, ...]) -> None:
    """A run of more than two classes (issue 51): one line on what does not apply, each hospital's latest accuracy
    and macro one-vs-rest AUC (``metrics.jsonl``, as the Federation page lists them), then one hospital's confusion
    matrix by class from its ``predictions.csv`` (`app.evaluation.classes`) and its figures over rounds."""
    st.info(
        not_applicable(
            len(classes),
            "the scorecard, the verdict, the threshold with its sensitivity and specificity, the ROC curve and the "
            "example calls",
        )
        + " Shown instead: each hospital's accuracy and macro one-vs-rest AUC, and its confusion matrix by class.",
        icon=":material/info:",
    )
    found = read_run_class_predictions(info.path)
    for problem in found.problems:
        st.error(problem, icon=":material/error:")
    metrics = load_metrics(info.path)
    number = st.column_config.NumberColumn
    st.subheader("Every hospital, latest round")
    st.dataframe(
        latest_per_hospital(metrics)[["hospital", "round", "test ACC", "test AUC"]],
        hide_index=True,
        width="stretch",
        key="classes_table",
        column_config={
            "test ACC": number("accuracy", format="%.3f", help=ACCURACY_HELP),
            "test AUC": number("macro AUC", format="%.3f", help=MACRO_AUC_HELP),
        },
    )
    if not found.hospitals:
        return
    st.subheader("One hospital")
    hospital = int(st.selectbox("Hospital", sorted(found.hospitals), format_func=hospital_label, key="hospital"))
    predictions = found.hospitals[hospital]
    names = predictions.classes
    matrix = class_confusion(predictions.labels, predictions.probs, len(names))
    accuracy = class_accuracy(predictions.labels, predictions.probs)
    mine = metrics[metrics["client"] == hospital].sort_values("round") if not metrics.empty else metrics
    auc = float(mine["test_auc"].iloc[-1]) if len(mine) else math.nan
    cols = st.columns(3)
    cols[0].metric("Accuracy", "undefined" if accuracy is None else f"{accuracy:.3f}", help=ACCURACY_HELP)
    cols[1].metric("Macro AUC", _rate(auc), help=f"{MACRO_AUC_HELP} The run's own figure of its latest round.")
    cols[2].metric("Test tiles", f"{len(predictions.labels)}")
    st.markdown(f"**{hospital_label(hospital)}'s confusion matrix** (rows: true class; columns: the class called)")
    st.dataframe(
        pd.DataFrame(matrix, index=[f"truly {c}" for c in names], columns=[f"called {c}" for c in names]),
        key="class_confusion",
    )
    st.caption(
        f"{int(np.trace(matrix))} of {len(predictions.labels)} test tiles lie on the diagonal (called their own "
        "class: the class of highest probability)."
    )
    if len(mine):
        history = pd.DataFrame(
            {"macro AUC": mine.set_index("round")["test_auc"], "accuracy": mine.set_index("round")["test_acc"]}
        )
        ui.chart(
            st, charts.per_hospital(history, f"{hospital_label(hospital)} over rounds", "value"), key="history_chart"
        )


@ui.page_guard("Hospital")
def page() -> None:
    """The Hospital page."""
    st.title("Hospital")
    st.caption("How each hospital's own model does on that hospital's held-out test tiles.")
    flash()

    runs = ui.all_runs()
    if not runs:
        ui.no_runs_help()
        return
    # Each hospital writes its predictions.csv after every round, in its own folder; runs without any are not listed.
    ready = [r for r in runs if prediction_files(r.path)]
    if not ready:
        st.info(
            "No run has tile predictions yet (each hospital writes them after every round). "
            "Watch the running ones on the Federation page.",
            icon=":material/hourglass_top:",
        )
        for listed in runs:
            if ui.display_status(listed) == "failed":
                ui.status_banner(listed)
        return

    info = ui.pick_run(ready, "Run", key="hospital_run", finished_first=True)
    if info is None:
        return
    ui.intended_use(info.dataset)
    classes = run_classes(info.path)
    if is_multi_class(classes):
        _classes(info, classes)
        return
    found = read_run_predictions(info.path)
    for problem in found.problems:
        st.error(problem, icon=":material/error:")
    predictions = found.frame
    if predictions.empty:
        return
    status = ui.display_status(info)
    if info.damaged:
        ui.status_banner(info)
    elif status != "finished":
        latest = "the latest round"
        if "round" in predictions.columns:
            rounds = pd.to_numeric(predictions["round"], errors="coerce")
            latest = f"round {int(rounds.max())}" if rounds.notna().any() else latest
        st.info(f"Run **{info.run_id}** is {status}: these are the predictions of {latest}.", icon=":material/info:")

    floor = ui.floor_controls("hospital")
    judged = judge_run(info.path, floor, predictions).judgements
    if not judged:
        return
    st.subheader("Scorecard: every hospital at its own threshold")
    _scorecard(judged, floor)

    st.subheader("One hospital")
    _hospital_detail(info, predictions, judged, floor)


page()
