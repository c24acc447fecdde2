"""Hospital page: the scorecard of a run (every hospital side by side: AUC, accuracy, sensitivity and specificity at
the chosen threshold, a warning where a good AUC hides a poor operating point, and the threshold that reaches a
target sensitivity), then one hospital in detail: ROC curve with AUC, confusion matrix at the threshold, its
figures over rounds, and example test tiles with their predicted probability, highest-confidence errors first
(FedSAF paper, Sec. 5: each client evaluated on its own test split). Everything comes from each hospital's own
``predictions.csv`` and model card, in its folder of the run."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import streamlit as st

from app.dashboard import charts, evaluation, ui
from app.dashboard.datasets import LABELS, hospital_label
from app.dashboard.runs import (
    RunInfo,
    card_threshold_sources,
    card_thresholds,
    hospital_rows,
    load_metrics,
    prediction_files,
    read_run_predictions,
    read_val_predictions,
)
from app.held_out import held_out_slides
from models.decision import SLIDE_RULE, SLIDE_TOP_K, Slides

TILES_SHOWN = 12
SLIDE_CALL = SLIDE_RULE.format(k=SLIDE_TOP_K)
DEFAULT_THRESHOLD = 0.5  # models.bundle's default decision threshold, when a run has no model cards
THRESHOLD_KEY = "threshold"


def _rate(value: float) -> str:
    return "—" if math.isnan(value) else f"{value:.3f}"


def _default_threshold(cards: dict[int, float]) -> float:
    """The model cards' threshold when every hospital's card agrees on one, else the usual 0.5."""
    values = set(cards.values())
    return values.pop() if len(values) == 1 else DEFAULT_THRESHOLD


def _threshold_controls(info: RunInfo, cards: dict[int, float]) -> tuple[float, evaluation.Floor]:
    """The threshold slider (starting at the run's model-card threshold) and the clinical floor (shared with the
    Verdict page, `ui.floor_controls`): its sensitivity is the scorecard's target, its minimum the slides needed."""
    default = _default_threshold(cards)
    # A new run starts at its own cards' threshold; so does a return to this page (Streamlit forgets the state of
    # widgets a page did not draw).
    if st.session_state.get("_threshold_run") != info.run_id or THRESHOLD_KEY not in st.session_state:
        st.session_state["_threshold_run"] = info.run_id
        st.session_state[THRESHOLD_KEY] = default
    threshold = st.slider(
        "Decision threshold (a tile is called abnormal when its probability is at least this)",
        0.0,
        1.0,
        step=0.01,
        key=THRESHOLD_KEY,
        help=ui.EXPLAIN["threshold"],
    )
    source = "the hospitals' model cards" if cards and len(set(cards.values())) == 1 else "the usual default"
    distinct = sorted(set(cards.values()))
    if len(distinct) > 1:
        source = f"the usual default (the model cards differ: {', '.join(f'{t:.2f}' for t in distinct)})"
    st.caption(f"The slider starts at {default:.2f}, from {source}.")
    floor = ui.floor_controls("hospital")
    return float(threshold), floor


def _scorecard(
    predictions: pd.DataFrame,
    threshold: float,
    target: float,
    min_slides: int,
    val: pd.DataFrame | None = None,
    held_out: dict[int, Slides] | None = None,
) -> None:
    """Every hospital side by side at ``threshold``, with warnings in words and the threshold for ``target`` (chosen
    on each hospital's validation split, ``val``, where it has one)."""
    scores = evaluation.score_hospitals(predictions, threshold, target, min_slides, val, held_out)
    for score in scores:
        if score.warning:
            st.warning(f"**{hospital_label(score.client)}**: {score.warning}", icon=":material/warning:")
    table = evaluation.scorecard_table(scores)
    number = st.column_config.NumberColumn
    st.dataframe(
        table,
        hide_index=True,
        width="stretch",
        key="scorecard",
        column_config={
            "hospital": st.column_config.TextColumn("hospital", pinned=True),
            "test slides": number("slides", help="the slides the hospital's held-out test tiles come from"),
            "test tiles": number("tiles", help="the hospital's own held-out test tiles"),
            "AUC": number("AUC", format="%.3f", help=ui.EXPLAIN["AUC"]),
            "AUC 95% CI": st.column_config.TextColumn(
                "AUC 95% CI", help="percentile bootstrap resampling whole test slides (tiles of a slide go together)"
            ),
            "slide sensitivity": number(
                "slide sens.", format="%.3f", help=f"abnormal test slides called abnormal ({SLIDE_CALL})"
            ),
            "slide specificity": number("slide spec.", format="%.3f", help="normal test slides called normal"),
            "missed slides": st.column_config.TextColumn(
                "missed slides", help="abnormal test slides called normal at the threshold, of all abnormal slides"
            ),
            "accuracy": number("accuracy", format="%.3f", help=ui.EXPLAIN["accuracy"]),
            "sensitivity": number("sensitivity", format="%.3f", help=ui.EXPLAIN["sensitivity"]),
            "sensitivity 95% CI": st.column_config.TextColumn(
                "95% CI", help="Wilson interval of the sensitivity over the hospital's abnormal test tiles"
            ),
            "specificity": number("specificity", format="%.3f", help=ui.EXPLAIN["specificity"]),
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
                format="%.3f",
                help=f"the highest threshold at which the hospital reaches the target sensitivity {target:.2f}",
            ),
            "sensitivity there": number(
                "its sensitivity",
                format="%.3f",
                help="sensitivity at that threshold (ties may lift it past the target)",
            ),
            "specificity there": number(
                "its specificity", format="%.3f", help="specificity at that threshold: what reaching the target costs"
            ),
        },
    )
    st.caption(
        f"{ui.EXPLAIN['AUC']} A high AUC with a low sensitivity or specificity means the tiles are ranked well "
        "but the threshold sits in the wrong place for that hospital."
    )


def _hospital_detail(
    info: RunInfo,
    predictions: pd.DataFrame,
    threshold: float,
    cards: dict[int, float],
    floor: evaluation.Floor,
    val: pd.DataFrame | None = None,
) -> None:
    """One hospital: figures at the threshold, ROC curve, confusion matrix, history and example tiles."""
    hospitals = sorted(int(c) for c in predictions["client"].unique())
    hospital = st.selectbox("Hospital", hospitals, format_func=hospital_label, key="hospital")
    rows = predictions[predictions["client"] == hospital]
    labels = rows["label"].to_numpy(dtype=int)
    probs = rows["prob_abnormal"].to_numpy(dtype=float)
    curve = evaluation.roc(labels, probs)
    point = evaluation.operating_point(labels, probs, threshold)
    metrics = load_metrics(info.path)
    mine = metrics[metrics["client"] == hospital]

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
    if hospital in cards:
        source = card_threshold_sources(info.path).get(hospital, "")
        st.caption(f"{hospital_label(hospital)}'s model card decides at threshold {cards[hospital]:.2f} ({source}).")
        _save_buttons(info, hospital, labels, probs, threshold, floor, cards[hospital], hospital_rows(val, hospital))

    left, right = st.columns(2)
    with left:
        marker = (1.0 - point.specificity, point.sensitivity)
        colour = charts.hospital_colour(hospital)
        auc_text = "undefined (one class)" if curve.auc is None else f"{curve.auc:.3f}"
        roc_alt = (
            f"ROC curve of {hospital_label(hospital)}, AUC {auc_text}; at threshold {threshold:.2f} (the diamond) "
            f"sensitivity {_rate(point.sensitivity)} and specificity {_rate(point.specificity)}."
        )
        ui.chart(st, charts.roc_curve(curve, hospital_label(hospital), colour, marker), key="roc_chart", alt=roc_alt)
        st.caption(ui.EXPLAIN["ROC"] + " The diamond is the threshold in use.")
    with right:
        confusion_alt = (
            f"Confusion matrix at threshold {threshold:.2f}: of {point.normal} normal tiles {point.tn} called normal "
            f"and {point.fp} abnormal; of {point.abnormal} abnormal tiles {point.tp} called abnormal and {point.fn} "
            "normal."
        )
        matrix = charts.confusion(evaluation.confusion(labels, probs, threshold), threshold)
        ui.chart(st, matrix, key="confusion", alt=confusion_alt)
        st.caption(ui.EXPLAIN["confusion"])

    if not mine.empty:
        history = pd.DataFrame(
            {"test AUC": mine.set_index("round")["test_auc"], "test accuracy": mine.set_index("round")["test_acc"]}
        )
        ui.chart(
            st, charts.per_hospital(history, f"{hospital_label(hospital)} over rounds", "value"), key="history_chart"
        )
        last_auc = float(mine["test_auc"].iloc[-1])
        note = f"Last round's test AUC recorded by the run: {last_auc:.4f}."
        if curve.auc is not None and abs(curve.auc - last_auc) > 0.005:
            # predictions.csv holds the probabilities at full precision, so the two agree unless they come from
            # different rounds (a run still writing, or a run directory written by an older version).
            note += (
                " The AUC above differs: the tile predictions and the run's metrics come from different rounds"
                " (the run may still be writing its latest round)."
            )
        st.caption(note)

    _example_tiles(info, rows, hospital, threshold)


def _save_buttons(
    info: RunInfo,
    hospital: int,
    labels: np.ndarray,
    probs: np.ndarray,
    threshold: float,
    floor: evaluation.Floor,
    current: float,
    val_rows: pd.DataFrame | None = None,
) -> None:
    """Save the slider's threshold, or the one reaching the floor (chosen on the hospital's validation predictions,
    ``val_rows``, where it has them), as the hospital's operating threshold (its model bundle): the Slide page, its
    calls, the HTML report and ``predict`` then use it."""
    left, right = st.columns(2)
    with left:
        if 0.0 < threshold < 1.0 and abs(threshold - current) > 1e-9:
            ui.save_threshold_button(
                info.path, hospital, threshold, "set by hand", f"Save {threshold:.2f} as its threshold",
                key=f"save_hand_{info.run_id}_{hospital}",
            )  # fmt: skip
    target = evaluation.chosen_target(labels, probs, floor.sensitivity, val_rows)
    with right:
        if target is not None:
            reaches = f"the floor {floor.sensitivity:.2f}"
            ui.save_floor_button(
                info, hospital, target.threshold, current, floor.sensitivity, "the floor", "its", reaches, target.split
            )


def _example_tiles(info: RunInfo, rows: pd.DataFrame, hospital: int, threshold: float) -> None:
    st.subheader("Example test tiles")
    st.caption("Errors first, the ones the model was most sure about at the top; then correct calls.")
    examples = evaluation.ranked_examples(rows, threshold).head(TILES_SHOWN)
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
        mark = ":orange[:material/close: wrong]" if row.error else ":blue[:material/check: right]"
        with grid[i % 6]:
            ui.tile_image(
                dataset / str(row.path),
                caption=f"{mark} true **{truth}** · p(abnormal) = {prob:.2f}",
                alt=f"{hospital_label(hospital)} test tile, truly {truth}; the model gives it a probability of "
                f"{prob:.2f} of abnormal and calls it {called} ({verdict}).",
            )


@ui.page_guard("Hospital")
def page() -> None:
    """The Hospital page."""
    st.title("Hospital")
    st.caption("How each hospital's own model does on that hospital's held-out test tiles.")

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

    cards = card_thresholds(info.path)
    st.subheader("Scorecard: every hospital at one threshold")
    threshold, floor = _threshold_controls(info, cards)
    val = read_val_predictions(info.path)  # once per page: the scorecard's and the save buttons' thresholds
    _scorecard(predictions, threshold, floor.sensitivity, floor.min_slides, val, held_out_slides(info.path))

    st.subheader("One hospital")
    _hospital_detail(info, predictions, threshold, cards, floor, val)


page()
