"""Reading run directories (data/README.md section 3) and shaping them into the figures the paper reports.

FedSAF paper (Miao et al., 2025), Sec. 5: each client's model is evaluated on its own test split; "Averaged" is
the mean over clients of a round, "Std" the standard deviation over clients (population, ddof=0, as numpy and the
paper's PFLlib-based tables compute it), "Best" the best round of the averaged curve (Tables 4-7). A client whose
test split has one class reports AUC as ``null``: it is left out of that round's AUC mean, never counted as 0.5.

Everything here is plain Python/pandas so it is testable without Streamlit. Files are read as they are being
written by a live run: a half-written last line of a ``.jsonl`` file is ignored until it is complete.

A damaged run file never stops a page: the loaders read what they can (a damaged ``metrics.jsonl`` line is left
out, as ``gastric-fl report`` leaves it out; an unreadable ``config.toml`` reads as empty), and `run_problem`
names the damage in one line with what to do, which `RunInfo.problem` carries to the pickers and banners.

The files are read by `federation.run_reader` (the one reader of a run directory, which ``gastric-fl report`` and
the HTML report use too); this module turns what it reads into frames and one-line problems. Each hospital's
threshold as its model card states it is `app.run_cards`'.
"""

from __future__ import annotations

import functools
import math
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from app.datasets import hospital_label
from app.run_cards import NO_CARD as NO_CARD  # the cards' thresholds moved to app.run_cards; named here too
from app.run_cards import CardThreshold as CardThreshold
from app.run_cards import card_operating as card_operating
from app.run_cards import card_threshold_sources as card_threshold_sources
from app.run_cards import card_thresholds as card_thresholds
from federation import jsonl, run_reader, runfiles
from federation.round_figures import round_stats
from federation.run_reader import RecordError, RunSummary
from infra.formats import MANIFEST_FILE

RUN_FILES = (runfiles.CONFIG_FILE, runfiles.METRICS_FILE, runfiles.SUMMARY_FILE)
STATUSES = ("running", "finished", "failed")


def _summary_or_error(run: Path) -> tuple[RunSummary, str | None]:
    try:
        return run_reader.read_summary(run), None
    except RecordError as exc:
        if exc.kind == "malformed":
            return RunSummary(), "is not a JSON object"
        if isinstance(exc.cause, OSError):
            return RunSummary(), f"cannot be read ({exc.cause.strerror or exc.cause})"
        return RunSummary(), f"is not valid JSON ({exc.cause})"


def load_summary(run: Path) -> dict[str, Any]:
    """``summary.json`` of a run, or ``{}`` while it does not exist yet (or cannot be read: `run_problem` says)."""
    return dict(_summary_or_error(run)[0].data)


def _config_or_error(run: Path) -> tuple[dict[str, Any], str | None]:
    if not (run / runfiles.CONFIG_FILE).is_file():
        return {}, None
    try:
        return run_reader.read_config(run).tables, None
    except RecordError as exc:
        if exc.kind == "missing":
            return {}, None
        return {}, str(exc).removeprefix(f"{exc.path} ")


def read_run_config(run: Path) -> dict[str, Any]:
    """The resolved ``config.toml`` of a run as its TOML tables (a plain dict, not a validated ``RunConfig``), or
    ``{}`` if it has none or it cannot be read (`run_problem` says)."""
    return _config_or_error(run)[0]


def config_error(run: Path) -> str | None:
    """One line naming a run's ``config.toml`` and what is wrong with it, or ``None`` when it reads (or is absent)."""
    problem = _config_or_error(run)[1]
    return None if problem is None else f"{run / runfiles.CONFIG_FILE} {problem}"


@functools.lru_cache(maxsize=256)
def _damaged_lines(path: str, mtime_ns: int, size: int) -> tuple[jsonl.DamagedLine, ...]:
    # Keyed on the file's time and size: the run list asks about every run on every page load.
    return jsonl.scan_jsonl(Path(path)).damaged


def damaged_lines(path: Path, finished: bool) -> list[jsonl.DamagedLine]:
    """The damaged lines of a JSON-lines file. A cut-off *last* line counts only when the run has ``finished``
    writing (finished, failed or stopped): until then it is a line being appended."""
    try:
        stat = path.stat()
    except OSError:
        return []
    found = _damaged_lines(str(path), stat.st_mtime_ns, stat.st_size)
    return [bad for bad in found if finished or not bad.last]


def _shown(path: Path, root: Path | None) -> str:
    if root is not None:
        try:
            return str(path.relative_to(root))
        except ValueError:
            pass
    return str(path)


def run_problem(run: Path, root: Path | None = None) -> str | None:
    """One line naming the first damaged file of a run and what to do about it, or ``None`` when all read.

    Checked: ``config.toml`` (TOML), ``summary.json`` (a JSON object), ``metrics.jsonl`` and ``aggregation.jsonl``
    (a JSON object per line). Files are named relative to ``root`` (the data root) when given. A damaged line of a
    JSON-lines file is left out of the pages; ``gastric-fl train --resume`` redoes its round.
    """
    summary, summary_problem = _summary_or_error(run)
    problems: list[str] = []
    config_problem = _config_or_error(run)[1]
    if config_problem:
        problems.append(
            f"{_shown(run / runfiles.CONFIG_FILE, root)} {config_problem}: this run's settings are unknown; "
            "restore the file or delete the run folder"
        )
    if summary_problem:
        problems.append(
            f"{_shown(run / runfiles.SUMMARY_FILE, root)} {summary_problem}: this run's status is unknown; "
            "restore the file or delete the run folder"
        )
    finished = summary.ended
    for name in (runfiles.METRICS_FILE, runfiles.AGGREGATION_FILE):
        bad = damaged_lines(run / name, finished)
        if bad:
            more = f" (and {len(bad) - 1} more damaged lines)" if len(bad) > 1 else ""
            problems.append(
                f"{_shown(run / name, root)} line {bad[0].line} is {bad[0].reason}{more}; it is left out here. "
                f"Re-run with `gastric-fl train --resume {run}` to redo its round, or delete the run folder"
            )
    if not problems:
        return None
    others = f" ({len(problems) - 1} more damaged files)" if len(problems) > 1 else ""
    return problems[0] + others + "."


def config_value(config: Mapping[str, Any], section: str, key: str) -> Any:
    """``config[section][key]`` of a run's config.toml (``federation.config``'s layout), or ``None``."""
    table = config.get(section)
    return table.get(key) if isinstance(table, Mapping) else None


def is_run_dir(path: Path) -> bool:
    """A folder written by ``gastric-fl train``: it holds at least one of the run files."""
    return path.is_dir() and any((path / name).is_file() for name in RUN_FILES)


@dataclass(frozen=True)
class RunInfo:
    """What the run list shows about one run, read from its summary and configuration."""

    run_id: str
    path: Path
    status: str
    error: str | None  # summary.json's error, else the run's damaged file (`problem`)
    algorithm: str | None
    rounds_total: int | None
    dataset: Path | None
    modified: float
    pid: int | None = None
    pid_started: int | None = None  # the process's start time, so that a reused pid is not taken for the run
    problem: str | None = None  # a damaged run file, in one line with what to do (`run_problem`)

    @property
    def damaged(self) -> bool:
        """Whether one of the run's files cannot be read (``problem`` says which)."""
        return self.problem is not None


def _resolve_dataset(value: Any, run: Path) -> Path | None:
    if not isinstance(value, str) or not value:
        return None
    path = Path(value).expanduser()
    if path.is_absolute():
        return path
    # A relative [data] path was relative to where the command ran; try that (cwd), then the run's parents.
    for base in (Path.cwd(), *run.parents):
        if (base / path / MANIFEST_FILE).is_file():
            return (base / path).resolve()
    return (Path.cwd() / path).resolve()


def run_dataset(config: Mapping[str, Any], run: Path) -> Path | None:
    """The prepared dataset a run trained on (``[data] path`` of its config.toml), resolved to an absolute path."""
    return _resolve_dataset(config_value(config, "data", "path"), run)


def run_info(run: Path, run_id: str | None = None, root: Path | None = None) -> RunInfo:
    """Summarise one run folder; a run with no summary yet is ``running`` (the engine writes it at the start).

    A damaged run is summarised from what reads and carries its `run_problem` (files named relative to ``root``).
    """
    summary = load_summary(run)
    config = read_run_config(run)
    status = str(summary.get("status", "running"))
    error = summary.get("error")
    problem = run_problem(run, root)
    algorithm = config_value(config, "strategy", "name") or summary.get("strategy") or summary.get("algorithm")
    rounds = config_value(config, "run", "rounds") or summary.get("total_rounds")
    stamps = [p.stat().st_mtime for p in (run / n for n in (*RUN_FILES, runfiles.AGGREGATION_FILE)) if p.is_file()]
    return RunInfo(
        run_id=run_id or run.name,
        path=run,
        status=status,
        error=str(error) if error else problem,
        algorithm=str(algorithm) if algorithm else None,
        rounds_total=int(rounds) if isinstance(rounds, int | float) and not isinstance(rounds, bool) else None,
        dataset=run_dataset(config, run) or _resolve_dataset(summary.get("dataset"), run),
        modified=max(stamps, default=run.stat().st_mtime),
        pid=summary["pid"] if isinstance(summary.get("pid"), int) else None,
        pid_started=summary["pid_started"] if isinstance(summary.get("pid_started"), int) else None,
        problem=problem,
    )


def list_runs(runs: Path) -> list[RunInfo]:
    """Runs directly under ``runs`` and one level down (the runs of an ablation grid), newest first.

    Damaged runs are listed too, with their ``problem``; files are named relative to the data root (``runs/..``).
    """
    if not runs.is_dir():
        return []
    root = runs.parent
    found: list[RunInfo] = []
    for child in sorted(runs.iterdir()):
        if child.name.startswith("."):
            continue
        if is_run_dir(child):
            found.append(run_info(child, root=root))
        elif child.is_dir():
            found.extend(
                run_info(sub, f"{child.name}/{sub.name}", root) for sub in sorted(child.iterdir()) if is_run_dir(sub)
            )
    return sorted(found, key=lambda r: r.modified, reverse=True)


# --- metrics -----------------------------------------------------------------------------------------------------

METRIC_COLUMNS = (
    "round",
    "client",
    "train_loss",
    "test_loss",
    "test_acc",
    "test_auc",
    "fisher_trace",
    "values_sent",
    "values_received",
    "seconds",
    "num_train",
    "num_test",
)


def metrics_frame(records: list[dict[str, Any]]) -> pd.DataFrame:
    """``metrics.jsonl`` records as `federation.runfiles.read_metrics` gives them (usable, one per round and
    hospital) as a frame with every documented column; ``null`` becomes NaN."""
    frame = pd.DataFrame.from_records(records) if records else pd.DataFrame()
    for column in METRIC_COLUMNS:
        if column not in frame.columns:
            frame[column] = np.nan
    for column in METRIC_COLUMNS:
        frame[column] = pd.to_numeric(frame[column], errors="coerce")
    frame["round"] = frame["round"].astype(int)
    frame["client"] = frame["client"].astype(int)
    return frame.sort_values(["round", "client"]).reset_index(drop=True)


def privacy_spent(metrics: pd.DataFrame) -> dict[int, tuple[float, float]]:
    """Each hospital's ``(epsilon, delta)`` after its last round in ``metrics`` (`metrics_frame`), for a run trained
    with differential privacy (``dp_epsilon`` in ``metrics.jsonl``, `federation.hospital.privacy`); empty otherwise."""
    if "dp_epsilon" not in metrics.columns:
        return {}
    found: dict[int, tuple[float, float]] = {}
    for row in metrics.dropna(subset=["dp_epsilon"]).itertuples(index=False):
        delta = float(getattr(row, "dp_delta", 1e-5))
        found[int(row.client)] = (float(row.dp_epsilon), delta if delta == delta else 1e-5)
    return found


def load_metrics(run: Path) -> pd.DataFrame:
    """The run's ``metrics.jsonl`` as a frame (empty, with all columns, before the first round ends).

    Its records are `federation.run_reader.read_run_metrics`' (the reader ``gastric-fl report`` and the HTML report
    use): damaged lines and malformed records are left out, and `run_problem` names the damaged lines.
    """
    return metrics_frame(run_reader.read_run_metrics(run).records)


def per_hospital(metrics: pd.DataFrame, column: str) -> pd.DataFrame:
    """Round x hospital table of one metric (columns named like ``Hospital 0``), for per-hospital curves."""
    if metrics.empty:
        return pd.DataFrame()
    table = metrics.pivot(index="round", columns="client", values=column)
    table.columns = [hospital_label(int(c)) for c in table.columns]
    return table


def per_round(metrics: pd.DataFrame) -> pd.DataFrame:
    """One row per round: averaged and std (over clients) ACC and AUC, values transmitted and cumulated, seconds.

    The figures are `federation.report.round_stats`' (the one computation the reports use too), over
    ``metrics`` (`metrics_frame`). ``values_sent``/``values_received`` are summed
    over clients; ``values_total`` is their cumulative sum (what has crossed the network so far). ``seconds`` sums
    the clients' wall seconds of the round.
    """
    columns = [
        "round",
        "acc_mean",
        "acc_std",
        "auc_mean",
        "auc_std",
        "auc_clients",
        "values_sent",
        "values_received",
        "values_total",
        "seconds",
    ]
    if metrics.empty:
        return pd.DataFrame(columns=columns)
    records = [
        {k: None if isinstance(v, float) and math.isnan(v) else v for k, v in row.items()}
        for row in metrics.to_dict("records")
    ]
    stats = round_stats(records)
    table = pd.DataFrame(
        {
            "round": [s.round for s in stats],
            "acc_mean": [s.avg_test_acc for s in stats],
            "acc_std": [s.std_test_acc for s in stats],
            "auc_mean": [np.nan if s.avg_test_auc is None else s.avg_test_auc for s in stats],
            "auc_std": [np.nan if s.std_test_auc is None else s.std_test_auc for s in stats],
            "auc_clients": [s.auc_hospitals for s in stats],
            "values_sent": [s.values_sent for s in stats],
            "values_received": [s.values_received for s in stats],
            "seconds": [np.nan if s.seconds is None else s.seconds for s in stats],
        }
    )
    table["values_total"] = (table["values_sent"] + table["values_received"]).cumsum()
    return table[columns]


def latest_per_hospital(metrics: pd.DataFrame) -> pd.DataFrame:
    """Each hospital's figures from its latest round: what the Federation page lists next to the charts."""
    columns = ["hospital", "round", "test AUC", "test ACC", "test loss", "train loss", "fisher trace"]
    if metrics.empty:
        return pd.DataFrame(columns=columns)
    last = metrics.sort_values("round").groupby("client", sort=True).tail(1).sort_values("client")
    return pd.DataFrame(
        {
            "hospital": [hospital_label(int(c)) for c in last["client"]],
            "round": last["round"].astype(int).to_numpy(),
            "test AUC": last["test_auc"].to_numpy(dtype=float),
            "test ACC": last["test_acc"].to_numpy(dtype=float),
            "test loss": last["test_loss"].to_numpy(dtype=float),
            "train loss": last["train_loss"].to_numpy(dtype=float),
            "fisher trace": last["fisher_trace"].to_numpy(dtype=float),
        }
    )


@dataclass(frozen=True)
class Progress:
    """Where a run stands: rounds done out of the total, wall seconds so far and an estimate of what is left."""

    rounds_done: int
    rounds_total: int | None
    seconds_elapsed: float
    seconds_left: float | None

    @property
    def fraction(self) -> float:
        """Share of rounds done, in [0, 1] (0 when the total is unknown)."""
        if not self.rounds_total:
            return 0.0
        return min(1.0, self.rounds_done / self.rounds_total)


def progress(
    run: Path, rounds_total: int | None, now: float | None = None, metrics: pd.DataFrame | None = None
) -> Progress:
    """Round k of K and time left. The engine's own estimate (``summary.json`` ``eta_seconds``) wins; without it,
    file times: the run starts when ``config.toml`` is written and a round ends when its ``metrics.jsonl`` lines
    are; the mean wall time per finished round times the rounds still to go.

    File times are used rather than the clients' ``seconds`` because they include everything the engine does
    between clients (aggregation, evaluation, checkpoints), which is what the user waits for.
    """
    now = time.time() if now is None else now
    metrics = load_metrics(run) if metrics is None else metrics  # the page passes what it has already read
    done = int(metrics["round"].max()) if not metrics.empty else 0
    config_path = run / runfiles.CONFIG_FILE
    start = config_path.stat().st_mtime if config_path.is_file() else now
    elapsed = max(0.0, now - start)
    left: float | None = None
    if done and rounds_total:
        last_round_end = (run / runfiles.METRICS_FILE).stat().st_mtime
        per_round_s = max(0.0, last_round_end - start) / done
        left = max(0.0, per_round_s * (rounds_total - done) - max(0.0, now - last_round_end))
    eta = _summary_or_error(run)[0].eta_seconds
    if eta is not None:
        left = eta
    return Progress(done, rounds_total, elapsed, left)


def format_seconds(seconds: float | None) -> str:
    """``1 h 02 min``, ``3 min 05 s``, ``12 s``; an em dash when unknown."""
    if seconds is None or not math.isfinite(seconds):
        return "—"
    whole = round(seconds)
    hours, rest = divmod(whole, 3600)
    minutes, secs = divmod(rest, 60)
    if hours:
        return f"{hours} h {minutes:02d} min"
    if minutes:
        return f"{minutes} min {secs:02d} s"
    return f"{secs} s"


# --- aggregation.jsonl --------------------------------------------------------------------------------------------


def load_aggregation(run: Path) -> list[dict[str, Any]]:
    """One record per round of what the strategy decided (``xi``, ``gamma``, ...), in round order; damaged lines
    and records without a whole-number round are left out."""
    records = [r for r in run_reader.read_aggregation(run).records if _round_of(r) is not None]
    return sorted(records, key=lambda r: _round_of(r) or 0)


def _round_of(record: Mapping[str, Any]) -> int | None:
    value = record.get("round")
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def xi_matrices(records: list[dict[str, Any]]) -> dict[int, np.ndarray]:
    """Round -> the AMP attention matrix xi (row i: the weights hospital i's model gives each hospital).

    Rounds whose record has no square ``xi`` (strategies without AMP) are left out.
    """
    found: dict[int, np.ndarray] = {}
    for record in records:
        xi = record.get("xi")
        if xi is None:
            continue
        try:
            matrix = np.asarray(xi, dtype=float)
        except (TypeError, ValueError):
            continue
        if matrix.ndim == 2 and matrix.shape[0] == matrix.shape[1] and matrix.size:
            found[int(record.get("round", len(found) + 1))] = matrix
    return found


# --- wall time ---------------------------------------------------------------------------------------------------


def _number(value: Any) -> float | None:
    if isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value):
        return float(value)
    return None


def run_seconds(run: Path, metrics: pd.DataFrame) -> float:
    """Wall seconds of a run: the sum of the rounds' ``seconds`` in ``aggregation.jsonl`` (the engine's wall time
    per round), else the sum of the clients' ``seconds`` in ``metrics.jsonl`` (clients train one after another)."""
    per_round_s = [_number(r.get("seconds")) for r in load_aggregation(run)]
    if per_round_s and all(v is not None for v in per_round_s):
        return float(sum(v for v in per_round_s if v is not None))
    return float(metrics["seconds"].sum()) if not metrics.empty else float("nan")
