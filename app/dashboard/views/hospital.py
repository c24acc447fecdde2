"""Hospital page: one hospital of a run (finished, or at its latest round), from the run's predictions.csv:
ROC curve with AUC, confusion matrix at a chosen threshold, and example test tiles with their predicted
probability, highest-confidence errors first (FedSAF paper, Sec. 5: each client evaluated on its own test
split)."""

from __future__ import annotations

import pandas as pd
import streamlit as st

from app.dashboard import charts, evaluation, ui
from app.dashboard.datasets import LABELS, hospital_label
from app.dashboard.errors import DashboardError
from app.dashboard.runs import load_metrics, load_predictions, prediction_files

TILES_SHOWN = 12

st.title("Hospital")
st.caption("How one hospital's own model does on that hospital's held-out test tiles.")

runs = ui.all_runs()
if not runs:
    ui.no_runs_help()
    st.stop()
# Each hospital writes its predictions.csv after every round, in its own folder; runs without any are not listed.
ready = [r for r in runs if prediction_files(r.path)]
if not ready:
    st.info(
        "No run with per-tile predictions yet (predictions.csv is written after each round). "
        "Watch the running ones on the Federation page.",
        icon=":material/hourglass_top:",
    )
    for info in runs:
        if ui.display_status(info) == "failed":
            ui.status_banner(info)
    st.stop()

left, right = st.columns([2, 1])
with left:
    picked = ui.pick_run(ready, "Run", key="hospital_run")
if picked is None:
    st.stop()
info = picked
try:
    predictions = load_predictions(info.path)
except DashboardError as exc:
    st.error(str(exc))
    st.stop()

status = ui.display_status(info)
if status != "finished":
    latest = f"round {int(predictions['round'].max())}" if "round" in predictions.columns else "the latest round"
    st.info(f"Run **{info.run_id}** is {status}: these are the predictions of {latest}.", icon=":material/info:")
hospitals = sorted(int(c) for c in predictions["client"].unique())
with right:
    hospital = st.selectbox("Hospital", hospitals, format_func=hospital_label, key="hospital")
rows = predictions[predictions["client"] == hospital]
labels = rows["label"].to_numpy()
probs = rows["prob_abnormal"].to_numpy()

threshold = st.slider(
    "Decision threshold (a tile is called abnormal when its probability is at least this)",
    0.0,
    1.0,
    0.5,
    0.01,
    key="threshold",
)
curve = evaluation.roc(labels, probs)
matrix = evaluation.confusion(labels, probs, threshold)
scores = evaluation.rates(matrix)
metrics = load_metrics(info.path)
mine = metrics[metrics["client"] == hospital]
last_auc = float(mine["test_auc"].iloc[-1]) if not mine.empty else float("nan")

cols = st.columns(5)
cols[0].metric("AUC", "undefined" if curve.auc is None else f"{curve.auc:.3f}", help="from predictions.csv")
cols[1].metric("Accuracy", f"{scores['accuracy']:.3f}", help=f"at threshold {threshold:.2f}")
cols[2].metric("Sensitivity", f"{scores['sensitivity']:.3f}", help="abnormal tiles called abnormal")
cols[3].metric("Specificity", f"{scores['specificity']:.3f}", help="normal tiles called normal")
cols[4].metric(
    "Test tiles", f"{len(rows)}", help=f"{int(labels.sum())} abnormal, {int(len(labels) - labels.sum())} normal"
)
if curve.auc is None:
    st.warning(f"{hospital_label(hospital)}'s test split holds only one class, so its AUC is undefined.")

left, right = st.columns(2)
left.plotly_chart(charts.roc_curve(curve, hospital_label(hospital)), key="roc_chart")
right.plotly_chart(charts.confusion(matrix, threshold), key="confusion_chart")

if not mine.empty:
    history = pd.DataFrame(
        {"test AUC": mine.set_index("round")["test_auc"], "test accuracy": mine.set_index("round")["test_acc"]}
    )
    st.plotly_chart(
        charts.per_hospital(history, f"{hospital_label(hospital)} over rounds", "value"), key="history_chart"
    )
    note = f"Last round's test AUC in metrics.jsonl: {last_auc:.4f}."
    if curve.auc is not None and abs(curve.auc - last_auc) > 0.005:
        # predictions.csv holds the probabilities at full precision, so the two agree unless they come from
        # different rounds (a run still writing, or a run directory written by an older version).
        note += (
            " The AUC above differs: predictions.csv and metrics.jsonl do not come from the same evaluation"
            " (the run may still be writing its latest round)."
        )
    st.caption(note)

st.subheader("Example test tiles")
st.caption("Errors first, the ones the model was most sure about at the top; then correct calls.")
examples = evaluation.ranked_examples(rows, threshold).head(TILES_SHOWN)
dataset = info.dataset
if dataset is None or not dataset.is_dir():
    st.warning(f"The prepared dataset of this run ({dataset}) is not available, so its tiles cannot be shown.")
else:
    grid = st.columns(6)
    for i, row in enumerate(examples.itertuples(index=False)):
        with grid[i % 6]:
            tile = dataset / str(row.path)
            if tile.is_file():
                st.image(str(tile), width="stretch")
            else:
                st.caption(f"missing: {row.path}")
            mark = ":red[:material/close: wrong]" if row.error else ":green[:material/check: right]"
            st.caption(f"{mark} true **{LABELS[int(row.label)]}** · p(abnormal) = {float(row.prob_abnormal):.2f}")
