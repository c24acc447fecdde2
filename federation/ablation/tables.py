"""The paper-style tables of an ablation (FedSAF paper 001, Sec. 4.3-4.4: Tables 4-7, Figures 4-5).

Per block, the mean and the sample standard deviation (``ddof = 1``) over seeds of each run's figures
(``federation.report``: last round averaged/std over clients, best averaged accuracy, values transmitted), plus the
worst hospital's final AUC and accuracy:

- ``components`` (Table 4: FIM x model splitting), ``distances`` (Table 5: dm), ``nhead`` (Table 6: head layers vs
  values transmitted), ``methods`` (Table 7: methods, with the worst hospital's AUC), or ``all`` columns;
- the averaged and std test accuracy over rounds (Figures 4-5), mean over seeds with a band of +- one std;
- ``paired.md`` / ``paired.csv``: the paired differences of ``federation.ablation.paired`` as tables.

`write_tables` writes them all, with ``results.md``.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from federation.ablation.archive import cells_folder
from federation.ablation.grid import SHORT, Cell, Plan
from federation.ablation.paired import PAIRED_FIELDS, method_label, method_variant, paired_rows
from federation.ablation.running import CELLS_DIR, cell_status, shown_path
from federation.runfiles import REPORT_DIR, REPORT_MD
from federation.runs import atomic_write_text

# (figure, label) of the per-run figures averaged over seeds (federation.report.all_figures).
METRIC_FIELDS: tuple[tuple[str, str], ...] = (
    ("avg_train_loss", "Averaged train loss"),
    ("avg_test_acc", "Averaged test acc"),
    ("avg_test_auc", "Averaged test AUC"),
    ("std_test_acc", "Std test acc"),
    ("std_test_auc", "Std test AUC"),
    ("best_avg_test_acc", "Best averaged test acc"),
    ("worst_test_auc", "Worst hospital AUC"),
    ("worst_test_acc", "Worst hospital acc"),
    ("sent_per_round", "Values sent per round"),
    ("received_per_round", "Values received per round"),
    ("seconds_per_round", "Seconds per round"),
)
TABLE_COLUMNS: dict[str, tuple[str, ...]] = {
    "components": (
        "avg_train_loss",
        "avg_test_acc",
        "avg_test_auc",
        "std_test_acc",
        "std_test_auc",
        "sent_per_round",
        "received_per_round",
    ),
    "distances": ("avg_train_loss", "avg_test_acc", "std_test_acc", "avg_test_auc"),
    "nhead": ("sent_per_round", "received_per_round", "avg_test_acc", "avg_test_auc", "best_avg_test_acc"),
    "methods": (
        "best_avg_test_acc",
        "avg_test_acc",
        "avg_test_auc",
        "std_test_acc",
        "worst_test_auc",
        "worst_test_acc",
        "sent_per_round",
    ),
    "all": tuple(f for f, _ in METRIC_FIELDS),
}
TABLE_TITLES: dict[str, str] = {
    "components": "Table 4 style: FedSAF components (FIM, model splitting)",
    "distances": "Table 5 style: AMP distance metrics",
    "nhead": "Table 6 style: head layers (nhead) vs values transmitted",
    "methods": "Table 7 style: methods",
    "all": "All figures",
}
TABLE_NUMBERS: dict[str, int] = {"components": 4, "distances": 5, "nhead": 6, "methods": 7}
METRIC_LABELS = dict(METRIC_FIELDS)  # a figure's column -> the label its tables show


def run_figures(run_dir: Path) -> dict[str, Any]:
    """The figures of the finished run in ``run_dir``: ``federation.report.all_figures`` (the ``summarise`` row,
    the worst hospital's final AUC and accuracy, the accuracy curves over rounds)."""
    from federation.report import all_figures, load_run

    return all_figures(load_run(run_dir))


def _mean_std(values: Sequence[float]) -> tuple[float | None, float | None]:
    if not values:
        return None, None
    return statistics.fmean(values), statistics.stdev(values) if len(values) > 1 else None


def group_rows(cells: Sequence[Cell], figures: Mapping[str, Mapping[str, Any]]) -> list[dict[str, Any]]:
    """One row per group of cells (same settings, all seeds): ``<field>_mean`` / ``<field>_std`` and ``seeds``."""
    groups: dict[tuple[tuple[str, Any], ...], list[Cell]] = {}
    for cell in cells:
        groups.setdefault(cell.group, []).append(cell)
    rows: list[dict[str, Any]] = []
    for group, members in groups.items():
        done = [figures[c.id] for c in members if c.id in figures]
        row: dict[str, Any] = {SHORT.get(k, k): v for k, v in group}
        row["seeds"] = len(done)
        for name, _ in METRIC_FIELDS:
            values = [float(f[name]) for f in done if f.get(name) is not None]
            row[f"{name}_mean"], row[f"{name}_std"] = _mean_std(values)
        row["_curves"] = [(f["curve_avg"], f["curve_std"]) for f in done]
        rows.append(row)
    return rows


def _fmt(value: float | None, big: bool) -> str:
    if value is None:
        return "-"
    return f"{value:,.0f}" if big else f"{value:.4f}"


def markdown_rows(rows: Sequence[Mapping[str, Any]], keys: Sequence[str], columns: Sequence[str]) -> str:
    """A Markdown table: the settings, then ``mean ± std`` over seeds of each figure column."""
    header = [*keys, "seeds", *(METRIC_LABELS[c] for c in columns)]
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    for row in rows:
        cells = [_fmt_setting(row.get(k)) for k in keys] + [str(row["seeds"])]
        for column in columns:
            big = column.endswith("_per_round") and column != "seconds_per_round"
            mean, std = row.get(f"{column}_mean"), row.get(f"{column}_std")
            text = _fmt(mean, big)
            if mean is not None and std is not None:
                text += f" ± {_fmt(std, big)}"
            cells.append(text)
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def _fmt_setting(value: Any) -> str:
    if isinstance(value, bool):
        return "on" if value else "off"
    return "-" if value is None else str(value)


def csv_rows(rows: Sequence[Mapping[str, Any]], keys: Sequence[str], columns: Sequence[str]) -> str:
    from federation.report import csv_text

    fields = [*keys, "seeds", *(f"{c}_{s}" for c in columns for s in ("mean", "std"))]
    return csv_text(rows, fields)


def plot_curves(rows: Sequence[Mapping[str, Any]], keys: Sequence[str], path: Path, title: str) -> None:
    """Averaged and std test accuracy over rounds per group (paper Fig. 4-5): mean over seeds, band of +- 1 std."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    fig, (ax_avg, ax_std) = plt.subplots(1, 2, figsize=(11, 4), constrained_layout=True)
    for row in rows:
        curves = row["_curves"]
        if not curves:
            continue
        length = min(len(a) for a, _ in curves)
        if length == 0:
            continue
        label = ", ".join(f"{k}={_fmt_setting(row.get(k))}" for k in keys) or "run"
        rounds = np.arange(1, length + 1)
        for ax, index in ((ax_avg, 0), (ax_std, 1)):
            values = np.array([c[index][:length] for c in curves], dtype=float)
            mean = values.mean(axis=0)
            (line,) = ax.plot(rounds, mean, marker="o", markersize=3, label=label)
            if len(values) > 1:
                std = values.std(axis=0, ddof=1)
                ax.fill_between(rounds, mean - std, mean + std, color=line.get_color(), alpha=0.15)
    ax_avg.set(title="Averaged test accuracy", xlabel="round", ylabel="mean over hospitals")
    ax_std.set(title="Std test accuracy", xlabel="round", ylabel="std over hospitals")
    for ax in (ax_avg, ax_std):
        ax.grid(True, alpha=0.3)
    ax_avg.legend(fontsize=8)
    fig.suptitle(f"{title} (mean over seeds, band: +- 1 std over seeds)", fontsize=10)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)


def _fmt_diff(row: Mapping[str, Any], name: str) -> str:
    """``+0.2000 [-1.0706, +1.4706] (MDD 1.4083)``: mean, 95% interval and minimum detectable difference of one
    figure's paired differences (``[n/a]`` and no MDD for one seed; `` (n=k)`` when fewer seeds have the figure)."""
    mean = row.get(f"{name}_diff_mean")
    if mean is None:
        return "-"
    low, high = row.get(f"{name}_diff_low"), row.get(f"{name}_diff_high")
    text = f"{mean:+.4f} " + (f"[{low:+.4f}, {high:+.4f}]" if low is not None and high is not None else "[n/a]")
    mdd = row.get(f"{name}_diff_mdd")
    if mdd is not None:
        text += f" (MDD {mdd:.4f})"
    if row.get(f"{name}_n") != row.get("n"):
        text += f" (n={row.get(f'{name}_n')})"
    return text


def paired_context_keys(rows: Sequence[Mapping[str, Any]]) -> list[str]:
    """The grid settings (other than the method) that appear in ``rows``, in order of appearance."""
    keys: list[str] = []
    for row in rows:
        for key in row:
            if key == "method":  # the settings come first
                break
            if key not in keys:
                keys.append(key)
    return keys


def paired_markdown(rows: Sequence[Mapping[str, Any]], fields: Sequence[str] = PAIRED_FIELDS) -> str:
    """A Markdown table: the other settings, method, reference, n, then ``mean [95% interval] (MDD m)`` per field
    (m: the minimum detectable difference at 80% power, `federation.ablation.paired`)."""
    keys = paired_context_keys(rows)
    header = [*keys, "method", "minus", "n", *(f"Δ {METRIC_LABELS[f]} [95% CI] (MDD)" for f in fields)]
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    for row in rows:
        cells = [_fmt_setting(row.get(k)) for k in keys] + [str(row["method"]), str(row["reference"]), str(row["n"])]
        cells += [_fmt_diff(row, f) for f in fields]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def paired_csv(rows: Sequence[Mapping[str, Any]], fields: Sequence[str] = PAIRED_FIELDS) -> str:
    """The rows of `paired_rows` as CSV: the settings, method, reference, n, then per field ``<field>_diff_mean``,
    ``_diff_sd``, ``_diff_low``, ``_diff_high``, ``_diff_mdd`` (minimum detectable difference) and ``_n``."""
    from federation.report import csv_text

    parts = ("diff_mean", "diff_sd", "diff_low", "diff_high", "diff_mdd", "n")
    columns = [*paired_context_keys(rows), "method", "reference", "n", *(f"{f}_{p}" for f in fields for p in parts)]
    return csv_text(rows, columns)


PAIRED_NOTE = (
    "Paired differences: for each method and each reference method (Separate, FedAvg) in the grid, with the same "
    "value of every other grid setting, d_s = figure(method, seed s) - figure(reference, seed s) over the n seeds "
    "both finished; mean [mean ± t_{0.975, n-1} · sd / √n] with sd the sample std (ddof = 1) of the d_s. n = 1 has "
    "no interval (n/a). An interval that excludes 0 means the difference is unlikely to be seed noise alone. "
    "MDD: the minimum detectable difference, (t_{0.975, n-1} + t_{0.80, n-1}) · sd / √n, the smallest true "
    "difference a two-sided paired t-test at alpha 0.05 finds with 80% power given this seed-to-seed spread (the "
    "usual central-t approximation, Cohen 1988; slightly optimistic for few seeds); an interval containing 0 with "
    "an MDD above the differences that matter means too few seeds to tell, not equal methods. "
    "(n=k) after a figure: only k seeds have it (e.g. a hospital without AUC).\n"
)


def write_tables(plan: Plan, out: Path, *, per_run_reports: bool = True) -> dict[str, Path]:
    """Write the paper-style tables (Markdown + CSV) and curves, one per table kind, and ``results.md``.

    Files: ``table4_components``, ``table5_distances``, ``table6_nhead``, ``table7_methods`` (or ``table_all``)
    with ``.md``, ``.csv`` and ``.png``; ``paired.md`` / ``paired.csv`` when the grid has Separate or FedAvg and
    another method (``paired_rows``; key ``paired`` of the result); each finished run also gets
    ``federation.report``'s own report in ``<run>/report/``. The runs are read from ``out/cells/``, or in a
    published folder from ``out/cells.tar.xz`` (`federation.ablation.archive.cells_folder`; no reports then).
    """
    from federation.report import load_run, write_report

    cells = plan.cells()
    owners = plan.owners(cells)
    by_run: dict[str, dict[str, Any]] = {}
    figures: dict[str, dict[str, Any]] = {}
    # a published folder holds its runs' records in cells.tar.xz (federation.ablation.archive); reports are
    # written only into an ablation's own cells/ folder, never into the temporary one unpacked from an archive
    with cells_folder(out) as cells_dir:
        per_run_reports = per_run_reports and cells_dir == out / CELLS_DIR
        for cell in cells:
            owner = owners[cell.id]
            run_dir = cells_dir / owner
            if owner not in by_run:
                if cell_status(run_dir) != "finished":
                    continue
                by_run[owner] = run_figures(run_dir)
                if per_run_reports and not (run_dir / REPORT_DIR / REPORT_MD).is_file():
                    write_report([load_run(run_dir)], run_dir / REPORT_DIR)
            figures[cell.id] = by_run[owner]
    paths: dict[str, Path] = {}
    sections = [
        "# Ablation results\n",
        f"Base preset `{shown_path(plan.config_path)}`"
        + (f" with {' '.join('--set ' + o for o in plan.overrides)}" if plan.overrides else "")
        + f"; seeds from {plan.first_seed}. Each figure: mean ± sample std (ddof=1) over the seeds that finished, "
        "of the run's last round (averaged/std = mean/std over hospitals of each hospital's own test split); best = "
        "highest averaged accuracy over rounds; worst hospital = lowest final AUC/accuracy among hospitals; "
        "values = tensor values per round, all hospitals together (server -> clients = sent, clients -> server "
        "= received), counted from the messages.\n",
    ]
    kinds: dict[str, list[int]] = {}
    for index, block in enumerate(plan.blocks):
        kinds.setdefault(block.resolved_table(), []).append(index)
    for kind in sorted(kinds, key=lambda k: list(TABLE_TITLES).index(k)):
        # Blocks of one kind make one table (e.g. Table 6: FedAvg and FedAMP at nhead 0 beside FedSAF's nheads).
        table_cells: list[Cell] = []
        keys: list[str] = []
        for index in kinds[kind]:
            table_cells += plan.block_cells(index)
            keys += [SHORT.get(k, k) for k in plan.blocks[index].grid if SHORT.get(k, k) not in keys]
        rows = group_rows(table_cells, figures)
        columns = TABLE_COLUMNS[kind]
        stem = f"table{TABLE_NUMBERS[kind]}_{kind}" if kind in TABLE_NUMBERS else f"table_{kind}"
        md, csv_path, png = out / f"{stem}.md", out / f"{stem}.csv", out / f"{stem}.png"
        table = markdown_rows(rows, keys, columns)
        atomic_write_text(md, f"# {TABLE_TITLES[kind]}\n\n{table}\n![curves]({png.name})\n")
        atomic_write_text(csv_path, csv_rows(rows, keys, columns))
        plot_curves(rows, keys, png, TABLE_TITLES[kind])
        paths[stem] = md
        missing = len(table_cells) - sum(1 for c in table_cells if c.id in figures)
        note = f" ({missing} of {len(table_cells)} runs not finished: left out)" if missing else ""
        sections += [f"\n## {TABLE_TITLES[kind]}{note}\n", table, f"\n![curves]({png.name})\n"]
    configs = {cell.id: plan.cell_config(cell) for cell in cells}
    variants = {cell.id: method_variant(plan, cell, configs[cell.id]) for cell in cells}
    methods = {cell.id: method_label(configs[cell.id], variants[cell.id]) for cell in cells}
    paired = paired_rows(cells, figures, methods, variants=variants)
    if paired:
        table = paired_markdown(paired)
        title = "Paired differences to Separate and FedAvg (same seeds)"
        atomic_write_text(out / "paired.md", f"# {title}\n\n{PAIRED_NOTE}\n{table}")
        atomic_write_text(out / "paired.csv", paired_csv(paired))
        paths["paired"] = out / "paired.md"
        sections += [f"\n## {title}\n", PAIRED_NOTE, table]
    results = out / "results.md"
    atomic_write_text(results, "\n".join(sections))
    paths["results"] = results
    return paths
