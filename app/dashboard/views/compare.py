"""Compare page: runs side by side or one ablation grid; the paper-style table (averaged/std/best ACC and AUC,
values transmitted, seconds: FedSAF paper Tables 4-7), overlaid averaged curves (Fig. 4-5), the settings that
differ between the runs and a warning when they differ in rounds or data; for a grid, an nhead x dm heatmap
(Tables 5-6). The ablation launcher queues a grid of FedSAF runs (nhead x dm x seeds) that train one at a time
(``jobs``: the queue file and its runner)."""

from __future__ import annotations

import itertools
import time
from pathlib import Path
from typing import Any

import pandas as pd
import streamlit as st

from app.dashboard import charts, checks, commands, compare, fields, jobs, paths, presets, ui
from app.datasets import list_datasets
from app.errors import DashboardError
from app.evaluation.classes import is_multi_class, not_applicable
from app.evaluation.tables import verdict_summary
from app.run_predictions import run_classes
from app.verdicts import judge_run

HEATMAP_FIGURES = ("Best ACC", "Averaged ACC", "Best AUC", "Averaged AUC", "Std ACC", "Values transmitted")
REFRESH_S = 2.0
QUALITY = list(compare.FIGURES.values())[:6]
COST = list(compare.FIGURES.values())[6:]
LAUNCH_METHOD = "fedsaf"  # nhead and dm are FedSAF's (paper 001, Eq. 1 and 3-8)

st.title("Compare")
ui.intended_use(None)  # runs on several datasets: the research-use line; each run's own page says more
st.caption(
    "Averaged / Std = mean / standard deviation over hospitals at the last round; Best = best round of the "
    "averaged curve. Values transmitted: both directions, all rounds. The same figures as `gastric-fl report`."
)

root = ui.root()
jobs_dir = ui.jobs_dir()


def read_queue() -> list[jobs.QueueEntry]:
    """The queue, or nothing (with one line naming the damaged file)."""
    try:
        return jobs.read_queue(jobs_dir)
    except DashboardError as exc:
        st.error(str(exc), icon=":material/error:")
        return []


def _table(table: pd.DataFrame) -> None:
    """Two tables side by side in the paper's spirit: what each run reached, and what it cost."""
    formats = {name: st.column_config.NumberColumn(format="%.3f") for name in QUALITY}
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


def _verdicts(selected: list[tuple[str, Path]]) -> None:
    """Each hospital of each run judged at its card's threshold against the floor set on the Verdict page
    (`app.verdicts.judge_run`, as every page judges it); runs without predictions on this machine are left out."""
    floor = ui.current_floor()
    tables = []
    for run_id, path in selected:
        classes = run_classes(path)
        if is_multi_class(classes):
            st.info(f"Run **{run_id}**: {not_applicable(len(classes), 'verdicts')}", icon=":material/info:")
            continue
        judged = judge_run(path, floor).judgements
        if judged:
            table = verdict_summary(judged)
            table.insert(0, "run", run_id)
            tables.append(table)
    if not tables:
        return
    st.markdown("**Each hospital's verdict** (its own model at its model card's threshold)")
    ui.verdict_table(pd.concat(tables, ignore_index=True), "verdict_table", floor)


def _curves(selected: list[tuple[str, Path]]) -> None:
    left, right = st.columns(2)
    ui.chart(
        left,
        charts.overlay(compare.curves(selected, "acc_mean"), "Averaged test accuracy", "accuracy"),
        key="overlay_acc",
    )
    ui.chart(right, charts.overlay(compare.curves(selected, "auc_mean"), "Averaged test AUC", "AUC"), key="overlay_auc")


def _mismatches(selected: list[tuple[str, Path]]) -> None:
    for sentence in compare.mismatches(selected):
        st.warning(sentence, icon=":material/warning:")


def _settings_diff(selected: list[tuple[str, Path]]) -> None:
    st.markdown("**Settings that differ** (from each run's `config.toml`)")
    diff = compare.settings_diff(selected)
    if len(diff.compared) < 2:
        st.caption("Select two or more runs whose config.toml can be read to see what differs between them.")
    elif diff.table.empty:
        st.caption(f"The {len(diff.compared)} runs have the same settings: they differ only in what was measured.")
    else:
        st.dataframe(diff.table, hide_index=True, width="stretch", key="settings_diff")
    for problem in diff.problems:
        st.caption(f"Left out: {problem}")


# --- the ablation launcher and its queue --------------------------------------------------------------------------


def _cell_id(nhead: int, dm: str, seed: int) -> str:
    return f"nhead-{nhead}_dm-{dm}_seed-{seed}"


@ui.page_guard("Compare")
def launcher() -> None:
    """Choose nhead values x dm values x seeds for a dataset and queue the FedSAF runs (one at a time)."""
    entries = read_queue()
    with st.expander(
        "Launch an ablation grid: FedSAF over nhead x dm x seeds, one run at a time",
        expanded=not entries,
        icon=":material/grid_on:",
    ):
        top = st.columns(3)
        with top[0]:
            dataset = ui.pick_dataset("Dataset", key="grid_dataset")
        if dataset is None:
            ui.no_dataset_help()
            return
        preset, resolved, units = ui.pick_preset(
            top[1], "grid_preset", "Every run starts from this preset; the grid changes nhead, dm and the seed."
        )
        base = presets.initial_values(resolved, LAUNCH_METHOD)
        rounds = int(top[2].number_input("Rounds per run", 1, 1000, int(base["run.rounds"]), 1, key="grid_rounds"))
        row = st.columns(4)
        nheads = row[0].multiselect(
            "nhead values", list(range(units + 1)), default=[0, min(6, units)], key="grid_nhead"
        )
        dms = row[1].multiselect("dm values", list(fields.DISTANCES), default=["manhattan"], key="grid_dm")
        seeds = int(row[2].number_input("Seeds", 1, 20, 1, 1, key="grid_seeds", help="Runs per setting."))
        first = int(row[3].number_input("First seed", 0, 10**6, int(base["run.seed"]), 1, key="grid_first_seed"))
        cells = list(itertools.product(sorted(set(nheads)), dms, range(first, first + seeds)))
        st.caption(
            f"{commands.plural(len(cells), 'run')} of {commands.plural(rounds, 'round')} each, on {dataset.name}; "
            "every other setting is the preset's. They train one after another, after any run already going."
        )
        hospitals = ui.num_hospitals(dataset.path)
        problems: list[str] = []
        for nhead, dm in sorted({(n, d) for n, d, _ in cells}):
            values = {**base, "run.rounds": rounds, "strategy.nhead": nhead, "amp.dm": dm, "run.seed": first}
            for message in checks.check(preset, dataset.path, values, hospitals).messages():
                if message not in problems:
                    problems.append(message)
        for message in problems:
            st.error(message, icon=":material/block:")
        clicked = st.button(
            f"Queue {commands.plural(len(cells), 'run')}",
            type="primary",
            icon=":material/queue:",
            key="queue_button",
            disabled=not cells or bool(problems),
            help="Choose at least one nhead and one dm." if not cells else None,
        )
        if clicked:
            batch = time.strftime(f"{dataset.name}-grid-%Y%m%d-%H%M%S")
            entries = []
            for nhead, dm, seed in cells:
                values = {**base, "run.rounds": rounds, "strategy.nhead": nhead, "amp.dm": dm, "run.seed": seed}
                cell = _cell_id(nhead, dm, seed)
                target = paths.runs_root(root) / batch / cell
                command = commands.train_command(preset, dataset.path, target, commands.overrides(values, resolved))
                title = f"{commands.describe_run(values, dataset.name)} (nhead {nhead}, dm {dm}, seed {seed})"
                params: dict[str, Any] = {"nhead": nhead, "dm": dm, "seed": seed}
                entries.append(
                    jobs.QueueEntry(f"{batch}_{cell}", batch, title, str(target), command, params, time.time())
                )
            try:
                jobs.enqueue(jobs_dir, entries)
            except DashboardError as exc:
                st.error(str(exc), icon=":material/block:")
            else:
                jobs.ensure_runner(jobs_dir, presets.PROJECT_ROOT, ui.terminal_busy)
                st.rerun()


STATUS_TEXT = {  # words only: an icon's name in text is read aloud by a screen reader
    jobs.QUEUED: "queued",
    jobs.CANCELLED: "cancelled",
    "running": "running",
    "succeeded": "done",
    "incomplete": "done without every hospital (see its run)",
    "failed": "failed",
    "stopped": "stopped",
    "lost": "ended (no exit code)",
}


@ui.page_guard("Compare")
def queue_panel() -> None:
    """The queue: each entry's status (queued, running, done...), Cancel for a waiting one, Stop for the running
    one; refreshed every ``REFRESH_S`` while there is work."""
    jobs.ensure_runner(jobs_dir, presets.PROJECT_ROOT, ui.terminal_busy)
    entries = read_queue()
    if not entries:
        return
    statuses = [jobs.entry_status(jobs_dir, e) for e in entries]
    counts = {s: statuses.count(s) for s in dict.fromkeys(statuses)}
    st.markdown("**Run queue** · " + " · ".join(f"{n} {STATUS_TEXT[s]}" for s, n in counts.items()))
    for entry, status in zip(entries, statuses, strict=True):
        left, middle, right = st.columns([6, 2, 1], vertical_alignment="center")
        left.markdown(entry.title)
        middle.markdown(STATUS_TEXT.get(status, status))
        if status == jobs.QUEUED and right.button("Cancel", key=f"cancel_{entry.entry_id}", icon=":material/close:"):
            jobs.cancel(jobs_dir, entry.entry_id)
            st.rerun()
        if status == "running" and right.button("Stop", key=f"stop_{entry.entry_id}", icon=":material/stop:"):
            job = jobs.load(jobs_dir, entry.entry_id)
            if job is not None:
                jobs.stop(jobs_dir, job)
            st.rerun()
    left, right, _ = st.columns([2, 2, 3])
    if jobs.QUEUED in statuses and left.button("Cancel all waiting", key="cancel_all", icon=":material/clear_all:"):
        for entry, status in zip(entries, statuses, strict=True):
            if status == jobs.QUEUED:
                jobs.cancel(jobs_dir, entry.entry_id)
        st.rerun()
    done = [s for s in statuses if s not in (jobs.QUEUED, "running")]
    if done and right.button("Clear finished from the list", key="clear_queue", icon=":material/playlist_remove:"):
        jobs.clear_finished(jobs_dir)
        st.rerun()
    st.caption(
        "The queue lives in the data folder and survives a page reload. It is worked through by the dashboard: "
        "if `gastric-fl dashboard` stops, the run in progress finishes on its own and the waiting ones start when "
        "the dashboard is next opened on this page or the Federation page."
    )


# --- the comparisons ------------------------------------------------------------------------------------------


@ui.page_guard("Compare")
def comparisons() -> None:
    """Runs side by side, or one ablation grid (``gastric-fl ablate`` or the launcher's)."""
    runs = ui.all_runs()
    try:
        grids = compare.list_grids(paths.ablations_root(root))
    except DashboardError as exc:
        st.error(str(exc), icon=":material/error:")
        grids = []
    grids += compare.queue_grids(read_queue(), paths.runs_root(root))
    if not runs and not grids:
        ui.no_runs_help()
        return
    start_mode = "Ablation grid" if st.query_params.get("compare") == "grid" else "Runs"  # ?compare=grid links
    mode = st.segmented_control("Compare", ["Runs", "Ablation grid"], default=start_mode, key="compare_mode")
    if mode == "Ablation grid":
        grid_view(grids, runs)
    else:
        runs_view(runs)


def grid_view(grids: list[compare.Grid], runs: list[Any]) -> None:
    """One ablation grid: its cells' table, failed cells, the nhead x dm heatmap and the curves."""
    if not grids:
        st.info(
            "No ablation grid yet. Launch one above, or run one from a terminal (it runs as shown):",
            icon=":material/info:",
        )
        datasets = [d.path for d in list_datasets(paths.prepared_root(root))]
        example = compare.example_ablate(root, datasets, [r.dataset for r in runs])
        st.code(example, language="bash", wrap_lines=True)
        return
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
        ui.chart(st, charts.grid_heatmap(heat, f"{figure} by nhead and distance dm"), key="grid_heatmap")
    _verdicts(grid.runs())
    _curves(grid.runs())
    _mismatches(grid.runs())


def runs_view(runs: list[Any]) -> None:
    """Selected runs side by side: warnings, the tables, the curves and the settings that differ."""
    if not runs:
        st.info("No single runs yet: start one on the Federation page.", icon=":material/info:")
        return
    by_id = {r.run_id: r for r in runs}
    default = [r.run_id for r in runs if r.status == "finished"][:4] or [runs[0].run_id]
    ids = st.multiselect(
        "Runs", list(by_id), default=default, format_func=lambda i: ui.run_label(by_id[i]), key="compare_runs"
    )
    if not ids:
        st.info("Select at least one run.")
        return
    for run_id in ids:
        info = by_id[run_id]
        if info.damaged:  # its readable lines are compared; the damaged one is named, the run is not "failed"
            st.warning(f"Run **{run_id}** is damaged: {info.problem}", icon=":material/warning:")
        elif ui.display_status(info) == "failed":
            st.error(f"Run **{run_id}** failed: {info.error or 'see the Federation page for its log'}")
    selected = [(run_id, by_id[run_id].path) for run_id in ids]
    _mismatches(selected)
    _table(compare.compare_table(selected))
    _verdicts(selected)
    _curves(selected)
    _settings_diff(selected)


# The launcher and the queue sit at the top but are drawn last, so that the comparisons come first.
launch_box = st.container()
queue_box = st.container()
comparisons()
with queue_box:
    if jobs.has_work(jobs_dir):
        ui.fragment("Compare", queue_panel, REFRESH_S)()
    else:
        queue_panel()
with launch_box:
    launcher()
