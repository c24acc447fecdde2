"""Paper-style results of runs: the tables of FedSAF paper 001 (Tables 4-7) and its accuracy curves (Fig. 4-5).

For each run, at the last completed round: the test accuracy and AUC *averaged* over clients and their *standard
deviation* over clients (population std, ``ddof = 0``), the *best* averaged accuracy over rounds, the values
transmitted per round in each direction, and wall seconds per round; per hospital, the final accuracy and AUC.
A client whose test split has one class has no AUC: it is left out of the AUC mean and std.

Damaged run files are never averaged silently (issue 10, defect 4): every unreadable line of ``metrics.jsonl`` or
``aggregation.jsonl`` is named by file and line, a round missing hospitals that other rounds have is flagged and
left out of the figures (they use the last *complete* round), and both appear in ``RunResult.problems``, on the
command's stderr and in ``report.md``.

A round's figures are `federation.round_figures`' (`round_stats`, `run_figures`); the run's files are read by
`federation.run_reader`, the one reader the HTML report and the dashboard use too.

The functions are reusable: ``load_run(run_dir) -> RunResult``, ``summarise(runs) -> rows``,
``all_figures(run) -> row`` (a run's every figure, as the ablation tables and the dashboard read them),
``per_hospital(runs) -> rows``, ``markdown_table(rows)``, ``plot_accuracy(runs, png)``; ``write_report`` does
all of it for ``gastric-fl report``. ``transmitted_values`` computes the values a strategy sends per client and
round for each ``nhead`` from the model's ``state_dict`` (paper Table 6; our counts, not copied from the paper).
"""

from __future__ import annotations

import csv
import io
import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from federation.errors import FederationError
from federation.round_figures import RoundStats, round_stats, run_figures
from federation.run_reader import RecordError, read_aggregation, read_config, read_run_metrics, read_summary
from federation.runfiles import (
    ACCURACY_PNG,
    CONFIG_FILE,
    HOSPITALS_CSV,
    METRICS_FILE,
    REPORT_CSV,
    REPORT_MD,
    read_cards,
)
from federation.runs import atomic_write_text
from infra.provenance import INTENDED_USE, dataset_is_synthetic, intended_use

SUMMARY_COLUMNS: tuple[str, ...] = (
    "run",
    "strategy",
    "model",
    "nhead",
    "status",
    "rounds",
    "avg_train_loss",
    "avg_test_acc",
    "std_test_acc",
    "avg_test_auc",
    "std_test_auc",
    "best_avg_test_acc",
    "best_round",
    "sent_per_round",
    "received_per_round",
    "seconds_per_round",
)
HOSPITAL_COLUMNS: tuple[str, ...] = ("run", "client", "num_train", "num_test", "test_acc", "test_auc")


@dataclass
class RunResult:
    """Everything a run directory holds that the report needs."""

    run_dir: Path
    config: dict[str, Any]
    summary: dict[str, Any]
    metrics: list[dict[str, Any]]
    aggregation: list[dict[str, Any]]
    rounds: list[RoundStats]
    problems: list[str] = field(default_factory=list)  # damaged lines, incomplete rounds: one line each

    @property
    def name(self) -> str:
        return self.run_dir.name

    @property
    def strategy(self) -> str:
        return str(self.config.get("strategy", {}).get("name", "?"))

    @property
    def model(self) -> str:
        return str(self.config.get("model", {}).get("name", "?"))

    @property
    def nhead(self) -> int | None:
        value = self.config.get("strategy", {}).get("nhead")
        return int(value) if value is not None else None


def load_run(run_dir: str | Path) -> RunResult:
    """Read ``config.toml``, ``summary.json``, ``metrics.jsonl`` and ``aggregation.jsonl`` of ``run_dir``
    (`federation.run_reader`); a `FederationError` naming the file when the configuration or summary is unusable."""
    folder = Path(run_dir)
    try:
        config = read_config(folder).tables
    except RecordError as exc:
        raise _run_error(folder, exc) from exc.cause
    try:
        summary = dict(read_summary(folder).data)
    except RecordError as exc:
        raise _run_error(folder, exc) from exc.cause
    metrics = read_run_metrics(folder)
    aggregation = read_aggregation(folder)
    rounds = round_stats(metrics.records)
    problems = [*metrics.problems, *(f"{bad}; the record is left out" for bad in aggregation.damaged)]
    problems += _incomplete_rounds(folder / METRICS_FILE, rounds)
    return RunResult(folder, config, summary, metrics.records, aggregation.records, rounds, problems)


def _run_error(folder: Path, exc: RecordError) -> FederationError:
    """What ``gastric-fl report`` says of a run's unusable ``config.toml`` or ``summary.json``."""
    path, cause = exc.path, exc.cause
    if exc.kind == "missing":
        return FederationError(
            f"{folder} is not a run directory (no {CONFIG_FILE}): give a folder made by gastric-fl train"
        )
    if isinstance(cause, PermissionError):  # e.g. a deployed run written by the server's user, read by another
        return FederationError(
            f"{path} cannot be read by this user ({cause.strerror}): run the command as the user that wrote it "
            "(for a deployed run: the server's user, on the server machine), or let this user read the folder"
        )
    if path.name == CONFIG_FILE:
        return FederationError(str(exc))
    if exc.kind == "malformed":
        return FederationError(f"{path} should hold a JSON object")
    if isinstance(cause, OSError):
        return FederationError(f"{path} cannot be read ({cause.strerror or cause})")
    return FederationError(f"{path} is not valid JSON ({cause})")


def _incomplete_rounds(path: Path, rounds: Sequence[RoundStats]) -> list[str]:
    """One line per round that lacks hospitals, saying which and what the figures use instead."""
    complete = [s.round for s in rounds if s.complete]
    lines = []
    for stats in rounds:
        if stats.complete:
            continue
        total = stats.hospitals + len(stats.missing)
        who = ", ".join(str(c) for c in stats.missing)
        noun = "client" if len(stats.missing) == 1 else "clients"
        instead = (
            f"the figures use round {complete[-1]}, the last complete round"
            if complete
            else "no round is complete, so the run has no figures"
        )
        lines.append(
            f"{path}: round {stats.round} has {stats.hospitals} of {total} hospitals ({noun} {who} missing); {instead}"
        )
    return lines


def _whole(value: float | None) -> float | int | None:
    """Counts averaged over rounds are whole numbers when every round sent the same: show them as integers."""
    return int(value) if value is not None and float(value).is_integer() else value


def summarise(runs: Sequence[RunResult]) -> list[dict[str, Any]]:
    """One row per run with ``SUMMARY_COLUMNS`` (figures of the last completed round; best over rounds)."""
    return [summary_row(run) for run in runs]


def summary_row(run: RunResult) -> dict[str, Any]:
    """One run's row of `summarise`: ``SUMMARY_COLUMNS`` (`run_figures` of its rounds, and its seconds per round)."""
    figures = run_figures(run.rounds)
    final = figures["final"] or {}
    best = figures["best"] or {}
    traffic = figures["values_per_round"] or {}
    seconds = [float(a["seconds"]) for a in run.aggregation if "seconds" in a]
    return {
        "run": run.name,
        "strategy": run.strategy,
        "model": run.model,
        "nhead": run.nhead,
        "status": run.summary.get("status", "unknown"),
        "rounds": final.get("round", 0),
        "avg_train_loss": final.get("avg_train_loss"),
        "avg_test_acc": final.get("avg_test_acc"),
        "std_test_acc": final.get("std_test_acc"),
        "avg_test_auc": final.get("avg_test_auc"),
        "std_test_auc": final.get("std_test_auc"),
        "best_avg_test_acc": best.get("avg_test_acc"),
        "best_round": best.get("round"),
        "sent_per_round": _whole(traffic.get("sent")),
        "received_per_round": _whole(traffic.get("received")),
        "seconds_per_round": statistics.fmean(seconds) if seconds else None,
    }


def all_figures(run: RunResult) -> dict[str, Any]:
    """Every per-run figure, the one place the ablation tables (``federation.ablation.run_figures``) and the
    dashboard's Compare page take a run's figures from: its `summary_row`
    (``SUMMARY_COLUMNS``: the last complete round averaged and std over hospitals, the best averaged accuracy,
    values per round, seconds per round; FedSAF paper 001, Tables 4-7) plus

    - ``worst_test_auc`` / ``worst_test_acc``: the lowest final AUC / accuracy among hospitals (`per_hospital`),
      ``None`` when no hospital has one;
    - ``best_avg_test_auc``: the highest averaged AUC over rounds (``None`` without any AUC);
    - ``values_total``: the tensor values transmitted over all rounds, both directions together;
    - ``curve_avg`` / ``curve_std``: the averaged and std test accuracy of each round (paper Fig. 4-5).
    """
    row = summary_row(run)
    hospitals = per_hospital([run])
    aucs = [float(h["test_auc"]) for h in hospitals if h.get("test_auc") is not None]
    accs = [float(h["test_acc"]) for h in hospitals if h.get("test_acc") is not None]
    row["worst_test_auc"] = min(aucs) if aucs else None
    row["worst_test_acc"] = min(accs) if accs else None
    averaged_aucs = [s.avg_test_auc for s in run.rounds if s.avg_test_auc is not None]
    row["best_avg_test_auc"] = max(averaged_aucs) if averaged_aucs else None
    row["values_total"] = sum(s.values_sent + s.values_received for s in run.rounds)
    row["curve_avg"] = [s.avg_test_acc for s in run.rounds]
    row["curve_std"] = [s.std_test_acc for s in run.rounds]
    return row


def per_hospital(runs: Sequence[RunResult]) -> list[dict[str, Any]]:
    """One row per run x client: the last complete round's accuracy and AUC on that hospital's own test split."""
    rows: list[dict[str, Any]] = []
    for run in runs:
        complete = [s for s in run.rounds if s.complete]
        if not complete:
            continue
        last = complete[-1].round
        for record in sorted((m for m in run.metrics if int(m["round"]) == last), key=lambda m: int(m["client"])):
            rows.append(
                {
                    "run": run.name,
                    "client": int(record["client"]),
                    "num_train": record.get("num_train"),
                    "num_test": record.get("num_test"),
                    "test_acc": record.get("test_acc"),
                    "test_auc": record.get("test_auc"),
                }
            )
    return rows


OPERATING_COLUMNS: tuple[str, ...] = (
    "run",
    "client",
    "threshold",
    "threshold from",
    "test slides",
    "sensitivity (95% CI)",
    "specificity (95% CI)",
    "AUC 95% CI (slides)",
    "slide sensitivity",
    "slide specificity",
)


def _with_interval(value: Any, interval: Any) -> str | None:
    if not isinstance(value, int | float) or isinstance(value, bool):
        return None
    if isinstance(interval, list) and len(interval) == 2:
        return f"{value:.3f} ({interval[0]:.2f}\u2013{interval[1]:.2f})"
    return f"{value:.3f}"


def operating_points(runs: Sequence[RunResult]) -> list[dict[str, Any]]:
    """One row per run x hospital whose model card is on this machine (``hospitals/client_XX/model.json``, written
    by the hospital after each round; `federation.hospital.export.card_metrics`): its operating threshold and where it
    came from, test slides, sensitivity and specificity with their 95% Wilson intervals, the AUC's interval
    resampled by slide, and the slide calls' sensitivity and specificity (`models.decision`, issue 23). A deployed
    run's server holds no card: the section is then empty."""
    rows: list[dict[str, Any]] = []
    for run in runs:
        for index, card in sorted(read_cards(run.run_dir).items()):
            metrics = card.get("metrics")
            if not isinstance(metrics, dict) or "sensitivity" not in metrics:
                continue
            found = metrics.get("slide_level")
            slide: dict[str, Any] = found if isinstance(found, dict) else {}
            auc_ci = metrics.get("auc_ci_by_slide")
            auc_text = (
                f"{auc_ci[0]:.2f}\u2013{auc_ci[1]:.2f}" if isinstance(auc_ci, list) and len(auc_ci) == 2 else None
            )
            rows.append(
                {
                    "run": run.name,
                    "client": int(card.get("client", index)),
                    "threshold": card.get("threshold"),
                    "threshold from": card.get("threshold_source") or "the default 0.5",
                    "test slides": slide.get("slides", metrics.get("slides")),
                    "sensitivity (95% CI)": _with_interval(metrics.get("sensitivity"), metrics.get("sensitivity_ci")),
                    "specificity (95% CI)": _with_interval(metrics.get("specificity"), metrics.get("specificity_ci")),
                    "AUC 95% CI (slides)": auc_text,
                    "slide sensitivity": slide.get("sensitivity"),
                    "slide specificity": slide.get("specificity"),
                }
            )
    return rows


PRIVACY_COLUMNS: tuple[str, ...] = (
    "run",
    "client",
    "round",
    "epsilon",
    "delta",
    "unit",
    "noise multiplier",
    "sample rate",
    "clip norm",
    "DP-SGD steps",
    "accountant",
)


def privacy_rows(runs: Sequence[RunResult]) -> list[dict[str, Any]]:
    """One row per run x hospital of a run trained with differential privacy (``[privacy]``,
    `federation.hospital.privacy`):
    its epsilon at the run's delta after its last recorded round (what it reported in ``metrics.jsonl``), and what
    recomputes it independently: the noise multiplier, sampling rate and DP-SGD steps with Opacus's RDP accountant
    (plus the clip norm and the unit protected)."""
    rows: list[dict[str, Any]] = []
    for run in runs:
        privacy = run.config.get("privacy") or {}
        if "noise_multiplier" not in privacy:
            continue
        last: dict[int, Mapping[str, Any]] = {}
        for record in run.metrics:
            if "dp_epsilon" in record and isinstance(record.get("round"), int):
                hospital = int(record["client"])
                if hospital not in last or int(record["round"]) >= int(last[hospital]["round"]):
                    last[hospital] = record
        for hospital in sorted(last):
            chosen = last[hospital]
            steps = chosen.get("dp_steps")
            rows.append(
                {
                    "run": run.name,
                    "client": hospital,
                    "round": chosen["round"],
                    "epsilon": chosen.get("dp_epsilon"),
                    "delta": f"{chosen.get('dp_delta', privacy.get('delta', 1e-5)):g}",
                    "unit": privacy.get("unit", "slide"),
                    "noise multiplier": privacy.get("noise_multiplier"),
                    "sample rate": privacy.get("sample_rate"),
                    "clip norm": privacy.get("max_grad_norm"),
                    "DP-SGD steps": int(steps) if isinstance(steps, int | float) else None,
                    "accountant": "opacus RDP",
                }
            )
    return rows


def _cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return str(value)
    if isinstance(value, float):
        if math.isnan(value):
            return "-"
        return f"{value:,.0f}" if abs(value) >= 1000 else f"{value:.4f}"
    if isinstance(value, int):
        return f"{value:,}"
    return str(value)


# What a column is called where people read it (the CSV files keep the field names other tools read).
HEADINGS = {"client": "hospital"}


def markdown_table(rows: Sequence[Mapping[str, Any]], columns: Sequence[str] | None = None) -> str:
    """A GitHub Markdown table of ``rows`` (``None`` shown as ``-``; floats to 4 decimals); a ``client`` column is
    headed "hospital" (`HEADINGS`)."""
    if not rows:
        return "(no rows)\n"
    cols = list(columns) if columns is not None else list(rows[0])
    lines = ["| " + " | ".join(HEADINGS.get(c, c) for c in cols) + " |", "|" + "|".join("---" for _ in cols) + "|"]
    lines += ["| " + " | ".join(_cell(row.get(c)) for c in cols) + " |" for row in rows]
    return "\n".join(lines) + "\n"


def csv_text(rows: Sequence[Mapping[str, Any]], columns: Sequence[str]) -> str:
    """``rows`` as CSV with a header line (``None`` as an empty cell)."""
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=list(columns), lineterminator="\n", extrasaction="ignore")
    writer.writeheader()
    writer.writerows([{c: ("" if row.get(c) is None else row.get(c)) for c in columns} for row in rows])
    return buffer.getvalue()


def plot_accuracy(runs: Sequence[RunResult], path: Path) -> None:
    """Averaged and std test accuracy over rounds, one line per run (paper Fig. 4-5), saved as PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    fig, (ax_avg, ax_std) = plt.subplots(1, 2, figsize=(10, 4), constrained_layout=True)
    for run in runs:
        complete = [s for s in run.rounds if s.complete]  # an incomplete round's mean is not comparable
        rounds = [s.round for s in complete]
        label = f"{run.name} ({run.strategy})"
        ax_avg.plot(rounds, [s.avg_test_acc for s in complete], marker="o", markersize=3, label=label)
        ax_std.plot(rounds, [s.std_test_acc for s in complete], marker="o", markersize=3, label=label)
    ax_avg.set(title="Averaged test accuracy", xlabel="round", ylabel="accuracy (mean over clients)")
    ax_std.set(title="Std test accuracy", xlabel="round", ylabel="accuracy (std over clients)")
    for ax in (ax_avg, ax_std):
        ax.grid(True, alpha=0.3)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax_avg.legend(fontsize=8)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)


# the two counts of held-out slides are app.evaluation.tables.UNFAMILIAR_SLIDES and FOCUS_SLIDES ("not recorded"
# where the run's slides.csv does not record them)
VERDICT_COLUMNS: tuple[str, ...] = (
    "run",
    "client",
    "verdict",
    "threshold",
    "threshold from",
    "unfamiliar slides",
    "focus slides (review)",
    "reason",
)


def write_report(
    runs: Sequence[RunResult], out_dir: Path, verdicts: Sequence[Mapping[str, Any]] = (), floor: str = ""
) -> dict[str, Path]:
    """Write ``report.md``, ``report.csv``, ``hospitals.csv`` and ``accuracy.png`` into ``out_dir``; ``verdicts``
    (rows of `VERDICT_COLUMNS`) against ``floor`` (in words) go into ``report.md``."""
    if not runs:
        raise FederationError("no runs to report: give at least one run directory")
    rows = summarise(runs)
    hospitals = per_hospital(runs)
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = {
        "markdown": out_dir / REPORT_MD,
        "csv": out_dir / REPORT_CSV,
        "hospitals": out_dir / HOSPITALS_CSV,
        "curves": out_dir / ACCURACY_PNG,
    }
    problems = [problem for run in runs for problem in run.problems]
    text = render_markdown(
        rows,
        hospitals,
        curves=paths["curves"].name,
        problems=problems,
        intended=runs_intended_use(runs),
        operating=operating_points(runs),
        privacy=privacy_rows(runs),
        verdicts=verdicts,
        floor=floor,
        classes_note=classes_note(runs),
    )
    atomic_write_text(paths["markdown"], text)
    atomic_write_text(paths["csv"], csv_text(rows, SUMMARY_COLUMNS))
    atomic_write_text(paths["hospitals"], csv_text(hospitals, HOSPITAL_COLUMNS))
    plot_accuracy(runs, paths["curves"])
    return paths


def classes_note(runs: Sequence[RunResult]) -> str:
    """For runs with more than two classes (``summary.json``'s ``classes``): the AUC columns hold the macro
    one-vs-rest AUC over the classes present (`federation.hospital.evaluation.multiclass_auc`), and the binary task's
    notions
    (verdict, sensitivity, slide calls) are named as not applicable; empty for binary runs."""
    counts = sorted({len(run.summary.get("classes") or ()) for run in runs} - {0, 1, 2})
    if not counts:
        return ""
    named = " / ".join(str(n) for n in counts)
    return (
        f"Classes: {named}. test_auc is the macro one-vs-rest AUC over the classes present in a hospital's test "
        f"split; verdicts, sensitivity and slide calls are not applicable for {named} classes (they judge the "
        "normal / abnormal task)."
    )


def runs_intended_use(runs: Sequence[RunResult]) -> str:
    """The intended-use sentence of a report on ``runs`` (`infra.provenance.intended_use`): with the synthetic
    note when any run was trained on a dataset made by ``gastric-fl synth``."""
    datasets = [(run.config.get("data") or {}).get("path") for run in runs]
    return intended_use(synthetic=any(dataset_is_synthetic(Path(d)) for d in datasets if isinstance(d, str) and d))


def render_markdown(
    rows: Sequence[Mapping[str, Any]],
    hospitals: Sequence[Mapping[str, Any]],
    curves: str | None = None,
    problems: Sequence[str] = (),
    intended: str = INTENDED_USE,
    operating: Sequence[Mapping[str, Any]] = (),
    privacy: Sequence[Mapping[str, Any]] = (),
    verdicts: Sequence[Mapping[str, Any]] = (),
    floor: str = "",
    classes_note: str = "",
) -> str:
    """The report as Markdown: its intended use (`infra.provenance`), problems found in the run files (if any),
    each hospital's verdict against ``floor`` (rows of `VERDICT_COLUMNS`, judged by the caller as the dashboard
    judges: `app.verdicts`), ``classes_note`` (what a multi-class run's figures mean, `classes_note`), the run
    table, the per-hospital table and (optionally) the curves image."""
    parts = [
        f"# Federation report\n\n**{intended}**\n",
        "Figures of the last completed round: avg/std = mean/std over hospitals of each hospital's own test split; "
        "best = highest averaged accuracy over rounds; sent/received = values per round, all hospitals together.\n"
        + (f"\n{classes_note}\n" if classes_note else ""),
        markdown_table(rows, SUMMARY_COLUMNS),
        "\n## Per hospital (last complete round)\n",
        markdown_table(hospitals, HOSPITAL_COLUMNS),
    ]
    if verdicts:
        parts[1:1] = [
            "## Verdict (each hospital at its model card's threshold)\n",
            f"Against the floor: {floor}. The same verdicts as the dashboard's Verdict page with that floor.\n",
            markdown_table(verdicts, VERDICT_COLUMNS),
        ]
    if operating:
        parts += [
            "\n## Operating point (each hospital's model card)\n",
            "At each hospital's own threshold: sensitivity and specificity with 95% Wilson intervals over its test "
            "tiles (too narrow: tiles of a slide go together), the AUC's 95% interval resampled by slide, and the "
            "slide calls (a slide is abnormal when the mean of its 5 highest tile probabilities reaches the "
            "threshold).\n",
            markdown_table(operating, OPERATING_COLUMNS),
        ]
    if privacy:
        parts += [
            "\n## Differential privacy (each hospital's ledger)\n",
            "Each hospital trained with DP-SGD, a slide (or, where the unit says so, a tile) as the protected unit; "
            "epsilon at delta after its last round, accounted by Opacus's RDP accountant from the noise multiplier, "
            "sampling rate and steps listed (what recomputes it). Not covered: the test metrics, training loss and "
            "Fisher trace the hospitals reported (docs/privacy.md).\n",
            markdown_table(privacy, PRIVACY_COLUMNS),
        ]
    if problems:
        listed = "\n".join(f"- {problem}" for problem in problems)
        parts[1:1] = [
            f"## Problems\n\nThe run files are damaged or incomplete; the figures below leave out:\n\n{listed}\n"
        ]
    if curves:
        parts.append(f"\n![Averaged and std test accuracy over rounds]({curves})\n")
    return "\n".join(parts)


def transmitted_values(
    model_name: str = "mobilenet_v3_small", nheads: Sequence[int] = (0, 3, 6, 9, 12)
) -> list[dict[str, Any]]:
    """Values one client uploads (and is sent back) per round when the last ``nhead`` units stay local.

    ``state_dict_values`` counts every shared ``state_dict`` entry (weights and BatchNorm buffers: what our
    strategies send); ``parameters`` counts trainable parameters only, for comparison with papers that do.
    """
    from models import base_keys, check_nhead, create_model, split_units

    model = create_model(model_name)
    units = split_units(model)
    state = model.state_dict()
    param_names = {name for name, _ in model.named_parameters()}
    rows: list[dict[str, Any]] = []
    for nhead in nheads:
        check_nhead(nhead, units)
        keys = base_keys(units, nhead)
        rows.append(
            {
                "model": model_name,
                "nhead": nhead,
                "shared_units": len(units) - nhead,
                "state_dict_values": sum(state[k].numel() for k in keys),
                "parameters": sum(state[k].numel() for k in keys if k in param_names),
            }
        )
    return rows
