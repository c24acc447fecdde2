"""Compare page: runs side by side or one ablation grid; the paper-style table (averaged/std/best ACC and AUC,
values transmitted, seconds: FedSAF paper Tables 4-7), overlaid averaged curves (Fig. 4-5) and, for a grid,
an nhead x dm heatmap (Tables 5-6)."""

from __future__ import annotations

import shlex
from pathlib import Path

import pandas as pd
import streamlit as st

from app.dashboard import charts, compare, paths, ui
from app.dashboard.errors import DashboardError

HEATMAP_FIGURES = ("Best ACC", "Averaged ACC", "Best AUC", "Averaged AUC", "Std ACC", "Values transmitted")

st.title("Compare")
st.caption(
    "Averaged / Std = mean / standard deviation over hospitals at the last round; Best = best round of the "
    "averaged curve. Values transmitted: both directions, all rounds. The same figures as `gastric-fl report`."
)

root = ui.root()
runs = ui.all_runs()
try:
    grids = compare.list_grids(paths.ablations_root(root))
except DashboardError as exc:
    st.error(str(exc))
    grids = []
if not runs and not grids:
    ui.no_runs_help()
    st.stop()

start_mode = "Ablation grid" if st.query_params.get("compare") == "grid" else "Runs"  # ?compare=grid links
mode = st.segmented_control("Compare", ["Runs", "Ablation grid"], default=start_mode, key="compare_mode")


QUALITY = list(compare.FIGURES.values())[:6]
COST = list(compare.FIGURES.values())[6:]


def _table(table: pd.DataFrame) -> None:
    """Two tables side by side in the paper's spirit: what each run reached, and what it cost."""
    formats = {name: st.column_config.NumberColumn(format="%.4f") for name in QUALITY}
    big = ("Values transmitted", "Sent / round", "Received / round")
    formats.update({name: st.column_config.NumberColumn(format="localized") for name in big})
    formats.update({n: st.column_config.NumberColumn(format="%.1f") for n in ("Seconds", "Seconds / round")})
    ids = [c for c in table.columns if c not in QUALITY and c not in COST]
    st.markdown("**Accuracy and AUC** (hospitals' own test splits)")
    st.dataframe(table[ids + QUALITY], hide_index=True, width="stretch", key="quality_table", column_config=formats)
    st.markdown("**Cost**: values transmitted and wall time")
    st.dataframe(table[["run", *COST]], hide_index=True, width="stretch", key="cost_table", column_config=formats)
    st.download_button(
        "Download both tables (CSV)", table.to_csv(index=False), file_name="comparison.csv", icon=":material/download:"
    )


def _curves(selected: list[tuple[str, Path]]) -> None:
    left, right = st.columns(2)
    left.plotly_chart(
        charts.overlay(compare.curves(selected, "acc_mean"), "Averaged test accuracy", "accuracy"), key="overlay_acc"
    )
    right.plotly_chart(
        charts.overlay(compare.curves(selected, "auc_mean"), "Averaged test AUC", "AUC"), key="overlay_auc"
    )


if mode == "Ablation grid":
    if not grids:
        example = ["gastric-fl", "ablate", "--config", "configs/demo.toml", "--grid", "nhead=0,3,6"]
        example += ["--grid", "dm=manhattan,euclidean", "--set", "strategy.name=fedsaf"]
        example += [
            "--data",
            str(paths.prepared_root(root) / "demo"),
            "--out",
            str(paths.ablations_root(root) / "demo"),
        ]
        st.info("No ablation grid yet. Run one from a terminal, for example:", icon=":material/info:")
        st.code(shlex.join(example), language="bash", wrap_lines=True)
        st.stop()
    grid = st.selectbox("Grid", grids, format_func=lambda g: f"{g.name} ({len(g.cells)} cells)", key="grid")
    for cell in grid.cells:
        if cell.status == "failed":
            st.error(f"Cell **{cell.cell_id}** failed: {cell.error or 'no error recorded'}", icon="🚨")
    table = compare.grid_table(grid)
    _table(table)
    figure = str(st.selectbox("Heatmap of", HEATMAP_FIGURES, key="grid_figure"))
    heat = compare.grid_heatmap(table, figure)
    if heat.empty:
        st.info("This grid does not vary nhead or the distance dm, so there is no nhead x dm heatmap.")
    else:
        st.plotly_chart(charts.grid_heatmap(heat, f"{figure} by nhead and distance dm"), key="grid_heatmap")
    _curves(grid.runs())
else:
    if not runs:
        st.info("No single runs yet: start one on the Federation page.", icon=":material/info:")
        st.stop()
    by_id = {r.run_id: r for r in runs}
    default = [r.run_id for r in runs if r.status == "finished"][:4] or [runs[0].run_id]
    ids = st.multiselect(
        "Runs", list(by_id), default=default, format_func=lambda i: ui.run_label(by_id[i]), key="compare_runs"
    )
    if not ids:
        st.info("Select at least one run.")
        st.stop()
    for run_id in ids:
        if ui.display_status(by_id[run_id]) == "failed":
            st.error(f"Run **{run_id}** failed: {by_id[run_id].error or 'see the Federation page for its log'}")
    selected = [(run_id, by_id[run_id].path) for run_id in ids]
    _table(compare.compare_table(selected))
    _curves(selected)
