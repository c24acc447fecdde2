"""The same federation through every engine, side by side in one run: seconds and CPU seconds per round, start-up.

Engines (``run.engine``): ``local`` (hospitals in this process), ``flower-sim`` (a simulation SuperLink and
``flwr run``: Flower's simulation runtime, Ray actors) and the loopback deployment of ``gastric-fl federation
demo`` (kit, gate, SuperLink with TLS and SuperNode authentication, one SuperNode and hospital executor per
hospital, ``flwr run``). The job (``--regime``): the quick start's (``configs/demo.toml``, FedSAF, 3 hospitals) or
the data-poor regime's (``configs/regime_data_poor.toml``, 10 hospitals); datasets are made here if missing. For
each engine: total wall time, start-up, a steady round's seconds and the machine's CPU seconds (between the first
and the last round's record), CPU seconds by process kind, and the values each hospital sends and receives per
round (what leaves a site). The per-round metrics of the three runs are compared too (identical expected), and
the deployment is held against the targets of a deployed round (in-process + 8 s; 1.5 x its CPU).

    .venv/bin/python benchmarks/engines.py --rounds 4
    .venv/bin/python benchmarks/engines.py --rounds 4 --regime data_poor
    .venv/bin/python benchmarks/engines.py --rounds 4 --strategy fedrep

Prints the table and writes it, with the command, to benchmarks/results/engines.md (engines_data_poor.md; with
``--strategy S``, ``engines_S.md`` / ``engines_data_poor_S.md``). ``--strategy fedrep`` measures the averaging
family, whose round's evaluation rides with the next round's training (one message per round, one more after the
last); FedRep keeps a head at each hospital (nhead 1), as a deployed hospital's default policy requires.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks._common import command_line, machine, write_result  # noqa: E402
from federation.config import load_config  # noqa: E402
from federation.flower.demo import run_demo  # noqa: E402
from federation.launch import train  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results" / "engines.md"
CLI = [sys.executable, "-m", "app.cli"]


# --regime: (its dataset, its configuration, its words in the report, where the report goes)
REGIMES = {
    "quickstart": (
        "configs/demo.toml",
        "configs/demo.toml (FedSAF, nhead 6) on the quick-start dataset (3 hospitals, 64 px inputs)",
        "engines.md",
    ),
    "data_poor": (
        "configs/regime_data_poor.toml",
        "configs/regime_data_poor.toml (FedSAF) on the data-poor regime's dataset (10 hospitals of about 24 "
        "training tiles, 64 px inputs)",
        "engines_data_poor.md",
    ),
}


def prepared_dataset(name: str, synth: list[str], prepare: list[str]) -> Path:
    """``data/prepared/<name>``, made when missing from ``synth`` slides (``data/raw/<name>``) and ``prepare``."""
    raw, prepared = ROOT / "data" / "raw" / name, ROOT / "data" / "prepared" / name
    if not (prepared / "manifest.csv").is_file():
        synth_command = [*CLI, "synth", "--format", "seed", *synth, "--out", str(raw), "--overwrite"]
        subprocess.run(synth_command, check=True, cwd=ROOT)
        subprocess.run(
            [*CLI, "prepare", "--format", "seed", "--input", str(raw), "--out", str(prepared), *prepare,
             "--overwrite", "--no-progress"],
            check=True, cwd=ROOT,
        )  # fmt: skip
    return prepared


def quickstart_dataset() -> Path:
    """The quick start's prepared dataset (scripts/quickstart.sh)."""
    return prepared_dataset(
        "bench_engines",
        ["--images", "60", "--seed", "0", "--difficulty", "0.3"],
        ["--clients", "3", "--tile", "128", "--seed", "0", "--grayscale-clients", "2"],
    )


def data_poor_dataset() -> Path:
    """The data-poor regime's dataset (configs/regime_data_poor.toml: 10 hospitals)."""
    return prepared_dataset(
        "data_poor",
        ["--images", "60", "--seed", "7", "--difficulty", "0.6"],
        ["--clients", "10", "--sizes", "equal", "--partition", "iid", "--test-fraction", "0.34", "--tile", "128",
         "--max-tiles-per-slide", "6", "--seed", "0"],
    )  # fmt: skip


def lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(x) for x in path.read_text().splitlines()]


TICK = os.sysconf("SC_CLK_TCK")
KINDS = (  # how a process's command line names what it is, first match wins
    ("federation.flower.executor", "hospital executor (training)"),
    ("flwr-serverapp", "ServerApp"),
    ("flower-superexec", "SuperExec"),
    ("flower-superlink", "SuperLink"),
    ("flower-supernode", "SuperNode"),
    ("nginx", "gate (nginx)"),
    ("bin/flwr", "flwr CLI"),
    ("ray", "Ray"),
)


def machine_cpu() -> float:
    """CPU seconds the whole machine has been busy since boot (``/proc/stat``: all but idle and iowait)."""
    fields = [int(x) for x in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    return (sum(fields) - fields[3] - fields[4]) / TICK


def _processes(since_ticks: int) -> dict[int, tuple[str, float]]:
    """``pid -> (kind, CPU seconds)`` of every process started after ``since_ticks`` (clock ticks after boot)."""
    found: dict[int, tuple[str, float]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            stat = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            if int(stat[19]) < since_ticks:
                continue
            command = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except (OSError, IndexError, ValueError):
            continue
        kind = next((name for key, name in KINDS if key in command), "other")
        found[int(entry.name)] = (kind, (int(stat[11]) + int(stat[12])) / TICK)
    return found


class Sampler(threading.Thread):
    """Every 0.2 s: the machine's busy CPU seconds, this process's, every process started since (by kind), and
    when each round of ``run_dir`` was checkpointed (``rounds_done`` in its ``summary.json``: the same point of a
    round whether its evaluation came in a message of its own or rides with the next round's training). A process
    that starts and ends between two samples is not seen by kind (it still counts in the machine's total)."""

    def __init__(self, run_dir: Path) -> None:
        super().__init__(daemon=True)
        self.run_dir = run_dir
        self.halt = threading.Event()
        self.since = int(float(Path("/proc/uptime").read_text().split()[0]) * TICK)
        self.start_cpu, self.start_self = machine_cpu(), sum(os.times()[:2])
        self.per_pid: dict[int, tuple[str, float]] = {}
        self.rounds: list[tuple[float, float]] = []  # (wall time, machine CPU) when each round was checkpointed
        self.began = time.perf_counter()
        # when the server's round loop started (its summary.json) and the first hospital answered Hello (its folder)
        self.marks: dict[str, float] = {}

    def run(self) -> None:
        while not self.halt.wait(0.2):
            self.sample()

    def sample(self) -> None:
        for mark, path in (("server", self.run_dir / "summary.json"), ("hello", self.run_dir / "hospitals")):
            if mark not in self.marks and path.exists():
                self.marks[mark] = time.perf_counter() - self.began
        for pid, (kind, cpu) in _processes(self.since).items():
            # an exited process not yet reaped has an empty command line: it keeps the kind it was first seen as
            known = self.per_pid.get(pid, (kind, 0.0))[0]
            self.per_pid[pid] = (known if kind == "other" else kind, cpu)
        try:  # rounds trained and aggregated: the server's summary says so when it checkpoints a round
            done = int(json.loads((self.run_dir / "summary.json").read_text()).get("rounds_done") or 0)
        except (OSError, ValueError):
            done = 0
        while len(self.rounds) < done:
            self.rounds.append((time.perf_counter(), machine_cpu()))

    def finish(self) -> dict[str, Any]:
        self.halt.set()
        self.join()
        self.sample()
        kinds: dict[str, float] = {"this process": sum(os.times()[:2]) - self.start_self}
        for kind, cpu in self.per_pid.values():
            kinds[kind] = kinds.get(kind, 0.0) + cpu
        steady = len(self.rounds) - 1  # rounds after the first (which also reads every hospital's tiles)
        return {
            "marks": dict(self.marks),
            "last_record": self.rounds[-1][0] - self.began if self.rounds else float("nan"),
            "cpu_total": machine_cpu() - self.start_cpu,
            "cpu_kinds": kinds,
            "steady_round": (self.rounds[-1][0] - self.rounds[0][0]) / steady if steady > 0 else float("nan"),
            "steady_cpu": (self.rounds[-1][1] - self.rounds[0][1]) / steady if steady > 0 else float("nan"),
        }


def measure(
    engine: str,
    data: Path,
    rounds: int,
    run_dir: Path,
    config_file: str = "configs/demo.toml",
    extra: tuple[str, ...] = (),
) -> dict[str, Any]:
    """One run with ``engine`` (and ``extra`` settings); its timings, CPU seconds and traffic."""
    settings = [f"run.rounds={rounds}", f"run.engine={'flower' if engine == 'deployment' else engine}", *extra]
    config = load_config(ROOT / config_file, settings, data)
    sampler = Sampler(run_dir)
    sampler.start()
    began = time.perf_counter()
    if engine == "deployment":
        summary = run_demo(config, run_dir, progress=False)
    else:
        summary = train(config, run_dir, progress=False)
    total = time.perf_counter() - began
    cpu = sampler.finish()
    per_round = [float(r["seconds"]) for r in lines(run_dir / "aggregation.jsonl")]
    metrics = lines(run_dir / "metrics.jsonl")
    return {
        "engine": engine,
        "total": total,
        "round": statistics.mean(per_round),
        "startup": total - sum(per_round),
        "sent": statistics.mean(m["values_sent"] for m in metrics),
        "received": statistics.mean(m["values_received"] for m in metrics),
        "metrics": [{k: v for k, v in m.items() if k != "seconds"} for m in metrics],
        "timings": summary.get("deployment_timings", {}),
        **cpu,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--regime", choices=sorted(REGIMES), default="quickstart")
    parser.add_argument("--strategy", default=None, help="another strategy than the configuration's (e.g. fedrep)")
    args = parser.parse_args()
    config_file, job, report = REGIMES[args.regime]
    extra: tuple[str, ...] = ()
    if args.strategy:
        extra = (f"strategy.name={args.strategy}",)
        job = job.replace(" (FedSAF, nhead 6)", "").replace(" (FedSAF)", "") + f" with strategy.name = {args.strategy}"
        report = report.replace(".md", f"_{args.strategy}.md")
    data = quickstart_dataset() if args.regime == "quickstart" else data_poor_dataset()
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        for engine in ("local", "flower-sim", "deployment"):
            results.append(measure(engine, data, args.rounds, Path(tmp) / engine, config_file, extra))
            print(f"{engine}: {results[-1]['total']:.1f} s", flush=True)
    base = results[0]
    same = all(r["metrics"] == base["metrics"] for r in results)
    rows = [
        "| engine | total s | start-up s | s per round | x local | CPU s per round | x local | CPU s in all "
        "| values sent / received per hospital and round |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        rows.append(
            f"| {r['engine']} | {r['total']:.1f} | {r['startup']:.1f} | {r['steady_round']:.1f} | "
            f"{r['steady_round'] / base['steady_round']:.1f} | {r['steady_cpu']:.1f} | "
            f"{r['steady_cpu'] / base['steady_cpu']:.1f} | {r['cpu_total']:.1f} | "
            f"{r['sent']:,.0f} / {r['received']:,.0f} |"
        )
    kinds = sorted({k for r in results for k in r["cpu_kinds"]})
    breakdown = [
        "| engine | " + " | ".join(kinds) + " | not seen by kind |",
        "|---|" + "---|" * (len(kinds) + 1),
    ]
    for r in results:
        seen = sum(r["cpu_kinds"].values())
        cells = [f"{r['cpu_kinds'].get(k, 0.0):.1f}" for k in kinds]
        breakdown.append(f"| {r['engine']} | " + " | ".join(cells) + f" | {r['cpu_total'] - seen:.1f} |")
    target_wall = base["steady_round"] + 8.0
    target_cpu = 1.5 * base["steady_cpu"]
    deployed = results[-1]
    wall_met = "met" if deployed["steady_round"] <= target_wall else "NOT met"
    cpu_met = "met" if deployed["steady_cpu"] <= target_cpu else "NOT met"
    deploy = results[-1]["timings"]
    stages = [
        "| engine | server's round loop running | first hospital answered Hello | last round checkpointed | run over |",
        "|---|---|---|---|---|",
    ]
    for r in results:
        marks = r["marks"]
        stages.append(
            f"| {r['engine']} | {marks.get('server', float('nan')):.1f} | {marks.get('hello', float('nan')):.1f} | "
            f"{r['last_record']:.1f} | {r['total']:.1f} |"
        )
    text = "\n".join(
        [
            "# Engines side by side: in-process, Flower simulation, loopback deployment",
            "",
            f"Command: `{command_line('engines.py')}`",
            "",
            f"{machine()}. Job: {job}, {args.rounds} rounds, the engines one after another in one process run.",
            "",
            *rows,
            "",
            f"Per-round metrics identical across the three engines: {'yes' if same else 'NO'}.",
            "",
            "A round's seconds and CPU seconds are those between the first and the last round's checkpoint "
            "(`rounds_done` in `summary.json`), divided by the rounds between them: everything a steady round costs "
            "(training, evaluation, "
            "messages, polls, the operator following the run), without the start-up and the first round (which "
            "also reads every hospital's tiles). CPU seconds are the whole machine's busy time (`/proc/stat`), so "
            "the machine should be otherwise idle (see the load average above).",
            "",
            f"Targets for the deployment: at most the in-process round + 8 s = {target_wall:.1f} s per round "
            f"(measured {deployed['steady_round']:.1f}: {wall_met}); "
            f"at most 1.5 x the in-process CPU = {target_cpu:.1f} CPU s per round (measured "
            f"{deployed['steady_cpu']:.1f}: {cpu_met}).",
            "",
            "CPU seconds of the whole run by process (sampled every 0.2 s; 'this process' is the benchmark itself, "
            "which runs the in-process engine, the demo's coordination and the operator's following; a process "
            "that lives less than 0.2 s is not seen by kind):",
            "",
            *breakdown,
            "",
            "Where the start-up and the end go (seconds after the engine was asked to run; sampled every 0.2 s): "
            "the server's round loop running (its `summary.json` written), the first hospital answering Hello (its "
            "folder made), the last round checkpointed, the run over (its last evaluation recorded, everything "
            "stopped):",
            "",
            *stages,
            "",
            f"Deployment start-up: SuperLink healthy {deploy.get('superlink_healthy', 0):.1f} s, SuperNodes "
            f"registered and online {deploy.get('supernodes_online', 0):.1f} s; the rest of its start-up is "
            "`flwr run` (bundle, ServerApp process) and the Hello round.",
            "",
            "Values are tensor values (float32 weights and BatchNorm buffers, 4 bytes each); the reply also "
            "carries a few scalars (loss, accuracy, AUC, Fisher trace, counts). A round is train + aggregate + "
            "evaluate as the server measures it; a hospital reads its tiles at its first task, so round 1 "
            "includes that. A deployed hospital answers through its own executor (federation.flower.executor), "
            "which keeps its code, tiles and model loaded between messages. The ServerApp pulls replies with a "
            "short growing interval (federation.flower.apps.exchange) and the operator follows the run directory; "
            "what remains of a deployed round beyond the training is mostly the SuperNode's fixed 3-second poll "
            "(hard-coded in Flower 1.41) and the gate and TLS hops.",
            "",
        ]
    )
    print(text)
    write_result(RESULTS.parent / report, text)


if __name__ == "__main__":
    main()
