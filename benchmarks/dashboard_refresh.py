"""Cost of one live refresh of the dashboard's Federation page, against its 2-second refresh interval.

While a run is going, the Federation page re-reads the run folder every ``REFRESH_S`` = 2 s (``st.fragment``) and
rebuilds its tables and charts (each hospital's AUC and accuracy per round, the averaged and std curves, values
transmitted, the AMP matrix xi of FedSAF paper Eq. 16-18). This script writes synthetic run folders in the
documented format (data/README.md section 3) for growing runs and times, in one run and side by side:

- **read + shape**: what the page computes from the files (``app.run_records``: metrics.jsonl into a frame,
  per-round averaged/std, per-hospital tables, xi from aggregation.jsonl, progress);
- **+ figures**: the same plus building the six Plotly figures the page draws (``app.dashboard.charts``);
- **report reader**: ``federation.report.load_run`` + ``summarise`` on the same folder (the code behind
  ``gastric-fl report``), as a reference for what reading a run costs elsewhere in the product.

It prints the medians and their ratios (to the report reader, and to the refresh interval) and writes them, with
the command, to benchmarks/results/dashboard_refresh.md. Browser-side rendering is not included.

    .venv/bin/python benchmarks/dashboard_refresh.py
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from app import run_records  # noqa: E402
from app.dashboard import charts  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results" / "dashboard_refresh.md"
REFRESH_S = 2.0  # app/dashboard/views/federation.py
SIZES = ((10, 3), (100, 10), (500, 20))


def write_run(folder: Path, rounds: int, clients: int, seed: int = 0) -> None:
    """A finished run folder of ``rounds`` x ``clients`` with unequal random figures and an xi matrix per round."""
    rng = np.random.default_rng(seed)
    folder.mkdir(parents=True)
    (folder / "config.toml").write_text(
        f'[run]\nrounds = {rounds}\n[data]\npath = "unused"\n[strategy]\nname = "fedsaf"\nnhead = 6\n'
        '[amp]\ndm = "manhattan"\n',
        encoding="utf-8",
    )
    with (folder / "metrics.jsonl").open("w") as metrics, (folder / "aggregation.jsonl").open("w") as aggregation:
        for r in range(1, rounds + 1):
            for c in range(clients):
                record = {
                    "round": r,
                    "client": c,
                    "train_loss": float(rng.uniform(0.1, 0.7)),
                    "test_loss": float(rng.uniform(0.1, 0.7)),
                    "test_acc": float(rng.uniform(0.5, 1.0)),
                    "test_auc": None if (r == 1 and c == 0) else float(rng.uniform(0.5, 1.0)),
                    "fisher_trace": float(rng.uniform(0, 1e-3)),
                    "values_sent": 585504,
                    "values_received": 585504,
                    "seconds": float(rng.uniform(1, 5)),
                    "num_train": 100 + c,
                    "num_test": 20 + c,
                }
                metrics.write(json.dumps(record) + "\n")
            xi = rng.uniform(0, 0.1, (clients, clients))
            np.fill_diagonal(xi, 0.0)
            np.fill_diagonal(xi, 1.0 - xi.sum(axis=1))
            aggregation.write(json.dumps({"round": r, "seconds": 3.0, "xi": xi.tolist()}) + "\n")
    (folder / "summary.json").write_text(json.dumps({"status": "finished", "total_rounds": rounds}), encoding="utf-8")


def shape(run: Path) -> dict[str, object]:
    """What one refresh of the Federation page computes from the files."""
    metrics = run_records.load_metrics(run)
    return {
        "rounds": run_records.per_round(metrics),
        "auc": run_records.per_hospital(metrics, "test_auc"),
        "acc": run_records.per_hospital(metrics, "test_acc"),
        "latest": run_records.latest_per_hospital(metrics),
        "xi": run_records.xi_matrices(run_records.load_aggregation(run)),
        "progress": run_records.progress(run, None, metrics=metrics),
        "info": run_records.run_info(run),
    }


def shape_and_draw(run: Path) -> None:
    """One refresh including the six Plotly figures."""
    data = shape(run)
    rounds = data["rounds"]
    xi = data["xi"]
    assert isinstance(xi, dict)
    charts.per_hospital(data["auc"], "Test AUC per hospital", "AUC")
    charts.per_hospital(data["acc"], "Test accuracy per hospital", "accuracy")
    charts.mean_std(rounds, "auc", "Averaged and std AUC", "AUC")
    charts.mean_std(rounds, "acc", "Averaged and std accuracy", "accuracy")
    charts.transmitted(rounds)
    last = max(xi)
    charts.xi_heatmap(xi[last], last)


def report_reader(run: Path) -> None:
    """The engine's reader of a run folder (gastric-fl report)."""
    from federation.report import load_run, summarise

    summarise([load_run(run)])


def one_figure(template: str | None) -> None:
    """A three-line figure as ``charts._layout`` builds it, with or without a Plotly template."""
    import plotly.graph_objects as go

    fig = go.Figure()
    for i in range(3):
        fig.add_trace(go.Scatter(x=list(range(10)), y=list(range(10)), mode="lines+markers", name=str(i)))
    extra = {} if template is None else {"template": template}
    fig.update_layout(height=360, margin={"l": 10, "r": 10, "t": 40, "b": 10}, **extra)


def median_s(fn: Callable[[Path], object], run: Path, repeats: int) -> float:
    fn(run)  # warm-up: imports and caches
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn(run)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--repeats", type=int, default=7, help="timed repetitions per size (median reported)")
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for rounds, clients in SIZES:
            run = Path(tmp) / f"run_{rounds}x{clients}"
            write_run(run, rounds, clients)
            shaped = median_s(shape, run, args.repeats)
            drawn = median_s(shape_and_draw, run, args.repeats)
            reference = median_s(report_reader, run, args.repeats)
            rows.append((rounds, clients, shaped, drawn, reference))
            print(
                f"{rounds:4d} rounds x {clients:2d} clients: read+shape {shaped * 1e3:7.1f} ms, + figures "
                f"{drawn * 1e3:7.1f} ms, report reader {reference * 1e3:7.1f} ms; "
                f"refresh = {drawn / REFRESH_S:.1%} of the {REFRESH_S:g} s interval",
                flush=True,
            )
    bare = median_s(lambda _: one_figure(None), Path(), args.repeats * 3)
    themed = median_s(lambda _: one_figure("plotly_white"), Path(), args.repeats * 3)
    print(f"one figure: {bare * 1e3:.1f} ms without a template, {themed * 1e3:.1f} ms with plotly_white")
    command = "    .venv/bin/python benchmarks/dashboard_refresh.py" + (
        f" --repeats {args.repeats}" if args.repeats != 7 else ""
    )
    lines = [
        "# Dashboard: cost of one live refresh of the Federation page",
        "",
        "Reproduce:",
        "",
        command,
        "",
        f"Machine: {platform.processor() or platform.machine()}, {os.cpu_count()} CPU cores (load average "
        f"{os.getloadavg()[0]:.1f} when written), Python {platform.python_version()}; "
        f"median of {args.repeats} repetitions after one warm-up.",
        "",
        "Synthetic finished runs in the documented format (metrics.jsonl, aggregation.jsonl with an xi matrix per "
        "round). *read + shape*: the page's tables from the files; *+ figures*: plus its six Plotly figures; "
        "*report reader*: `federation.report.load_run` + `summarise` (gastric-fl report) on the same folder. "
        "Browser rendering is not included.",
        "",
        "| rounds x clients | metrics lines | read + shape (ms) | + figures (ms) | report reader (ms) "
        "| refresh / report reader | refresh / 2 s interval |",
        "|---|---|---|---|---|---|---|",
    ]
    for rounds, clients, shaped, drawn, reference in rows:
        lines.append(
            f"| {rounds} x {clients} | {rounds * clients:,} | {shaped * 1e3:.1f} | {drawn * 1e3:.1f} "
            f"| {reference * 1e3:.1f} | {drawn / reference:.1f}x | {drawn / REFRESH_S:.1%} |"
        )
    lines += [
        "",
        "Why the figures set no Plotly template (Streamlit applies its own theme when it draws them): one three-line "
        f"figure takes {bare * 1e3:.1f} ms to build without a template and {themed * 1e3:.1f} ms with "
        f'`template="plotly_white"` ({themed / bare:.1f}x), and the page builds six every 2 s.',
    ]
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text("\n".join(lines) + "\n", encoding="utf-8")
    print(f"wrote {RESULTS}")


if __name__ == "__main__":
    main()
