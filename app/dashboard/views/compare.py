"""Compare page: runs side by side or one ablation grid; the paper-style table (averaged/std/best ACC and AUC,
values transmitted, seconds: FedSAF paper Tables 4-7), overlaid averaged curves (Fig. 4-5) and, for a grid,
an nhead x dm heatmap (Tables 5-6)."""

from __future__ import annotations

import pandas as pd
import streamlit as st

from app.dashboard import charts, paths, ui
from app.dashboard.runs import TABLE_COLUMNS, RunInfo, compare_table, grid_heatmap, list_grids, load_metrics, per_round

FIGURES = {"acc_best": "Best ACC", "acc_avg": "Averaged ACC", "auc_best": "Best AUC", "auc_avg": "Averaged AUC"}

st.title("Compare")
st.caption(
    "Averaged = mean over hospitals at the last round, Std = standard deviation over hospitals at the last round, "
    "Best = best round of the averaged curve. Values transmitted: both directions, all rounds."
)

runs = ui.all_runs()
if not runs:
    ui.no_runs_help()
    st.stop()

grids = list_grids(paths.runs_root(ui.root()))
mode = st.segmented_control("Compare", ["Runs", "Ablation grid"], default="Runs", key="compare_mode")

chosen: list[RunInfo]
if mode == "Ablation grid":
    if not grids:
        st.info(
            "No ablation grid yet. Run one from a terminal, e.g. `gastric-fl ablate --help`; each grid is a folder "
            f"of runs under `{paths.runs_root(ui.root())}`.",
            icon=":material/info:",
        )
        st.stop()
    grid = st.selectbox("Grid", grids, format_func=lambda p: p.name, key="grid")
    chosen = [r for r in runs if r.path.parent == grid]
else:
    by_id = {r.run_id: r for r in runs}
    default = [r.run_id for r in runs if r.status == "finished"][:4] or [runs[0].run_id]
    ids = st.multiselect(
        "Runs", list(by_id), default=default, format_func=lambda i: ui.run_label(by_id[i]), key="compare_runs"
    )
    chosen = [by_id[i] for i in ids]

if not chosen:
    st.info("Select at least one run.")
    st.stop()

failed = [r for r in chosen if ui.display_status(r) == "failed"]
for info in failed:
    st.error(f"Run **{info.run_id}** failed: {info.error or 'see the Federation page for its log'}", icon="🚨")

table = compare_table(chosen)
number_format = {name: st.column_config.NumberColumn(format="%.4f") for name in list(TABLE_COLUMNS.values())[:6]}
st.dataframe(
    table,
    hide_index=True,
    width="stretch",
    key="compare_table",
    column_config={
        **number_format,
        "Values transmitted": st.column_config.NumberColumn(format="localized"),
        "Seconds": st.column_config.NumberColumn(format="%.1f"),
    },
)
st.download_button(
    "Download the table (CSV)", table.to_csv(index=False), file_name="comparison.csv", icon=":material/download:"
)

curves_acc: dict[str, pd.Series] = {}
curves_auc: dict[str, pd.Series] = {}
for info in chosen:
    rounds = per_round(load_metrics(info.path)).set_index("round")
    if not rounds.empty:
        curves_acc[info.run_id] = rounds["acc_mean"]
        curves_auc[info.run_id] = rounds["auc_mean"]
left, right = st.columns(2)
left.plotly_chart(charts.overlay(curves_acc, "Averaged test accuracy", "accuracy"), key="overlay_acc")
right.plotly_chart(charts.overlay(curves_auc, "Averaged test AUC", "AUC"), key="overlay_auc")

if mode == "Ablation grid":
    figure = str(st.selectbox("Heatmap of", list(FIGURES), format_func=lambda k: FIGURES[k], key="grid_figure"))
    heat = grid_heatmap(chosen, figure)
    if heat.empty:
        st.info("These runs do not vary nhead and dm (their configs lack strategy.nhead / amp.dm).")
    else:
        st.plotly_chart(charts.grid_heatmap(heat, f"{FIGURES[figure]} by nhead and distance"), key="grid_heatmap")
