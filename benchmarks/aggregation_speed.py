"""The AMP server step (FedSAF paper 001, Eq. 3-8, 14, 16-20) against its floor, side by side, in one run.

For MobileNetV3-Small's shared part at nhead = 6 (FedSAF's default, Table 6: 195,168 values, 190,520 of them
trainable parameters) and nhead = 0 (FedAMP: everything, 1,532,052 values) and m = 5, 20, 100 clients, each
holding a perturbed copy of the model, this script times, interleaved repetition by repetition:

- **step**: ``AttentiveStrategy.aggregate_train`` exactly as the engine calls it, on the clients' replies (state
  dicts): stacking the replies, the distances ``d_ij``, ``xi``, the mix (every ``z_i``, or with FIM the one ``p``
  of Eq. 20), the centres as state dicts and the ``aggregation.jsonl`` record, plus ``json.dumps`` of that record
  (the engine's logging);
- **floor**: what no implementation of the step can avoid, on matrices already stacked: one Gram product
  ``P P^T`` of the (m, p) trainable parameters (from which every squared L2 or cosine distance follows) plus one
  mixing product ``xi @ X`` of the (m, d) shared values, float32 like the step. For ``manhattan`` no matrix
  product gives L1 distances, so its floor is ``pdist(P, p=1)`` (the L1 routine the step uses; each pair once)
  plus the same mixing product; its ratio to the Gram floor is printed as well.

The ratio is step / floor (medians of ``--repeats`` interleaved repetitions). The target is <= 1.5. With FIM on
(FedSAF) Eq. 20 gives every client the same ``p``, so the step mixes one row while the floor mixes ``m``.
It prints the figures and writes them, with the command and the machine's load, to
benchmarks/results/aggregation_speed.md.

    .venv/bin/python benchmarks/aggregation_speed.py
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks._common import command_line, machine, write_result  # noqa: E402
from federation.strategies.aggregation import mix  # noqa: E402
from federation.strategies.amp import METRICS, amp_coefficients, off_diagonal_mass, pairwise_distances  # noqa: E402
from federation.strategies.context import StrategyContext  # noqa: E402
from federation.strategies.fedsaf import AmpSettings, AttentiveStrategy  # noqa: E402
from federation.strategies.fisher_weights import fisher_intermediate, fisher_weights  # noqa: E402
from federation.strategies.flat import FlatSpec, StackBuffer, flatten, unflatten  # noqa: E402
from federation.wire.contract import Recipe, TrainReply  # noqa: E402
from models import create_model, split_units  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results" / "aggregation_speed.md"
MODEL = "mobilenet_v3_small"


@dataclass(frozen=True)
class Timing:
    """Medians of one function: wall seconds and CPU seconds of this process (every thread of it)."""

    wall: float
    cpu: float


@dataclass(frozen=True)
class Row:
    threads: int
    nhead: int
    values: int
    params: int
    m: int
    metric: str
    fim: bool
    step: Timing
    previous: Timing
    floor: Timing
    gram_floor: Timing
    stack: Timing

    @property
    def ratio(self) -> float:
        return self.step.wall / self.floor.wall

    @property
    def cpu_ratio(self) -> float:
        return self.step.cpu / self.floor.cpu

    @property
    def unstacked_cpu_ratio(self) -> float:
        """The step less its first part, the copy of the replies into the matrices, against the floor (CPU)."""
        return (self.step.cpu - self.stack.cpu) / self.floor.cpu


class Federation:
    """m clients' replies (perturbed copies of one initial model) and what a strategy over them needs."""

    def __init__(self, m: int, nhead: int, seed: int) -> None:
        model = create_model(MODEL, num_classes=2)
        state = {k: v.detach().clone() for k, v in model.state_dict().items()}
        self.param_keys = {name for name, _ in model.named_parameters()}
        self.ctx = StrategyContext(
            hospitals=tuple(range(m)),
            num_examples={c: 100 + 10 * c for c in range(m)},
            state_keys=tuple(state),
            units=tuple(split_units(model)),
            initial_state=state,
        )
        self.m, self.nhead = m, nhead
        keys = self.ctx.shared_keys(nhead)
        generator = torch.Generator().manual_seed(seed)
        self.replies: dict[int, TrainReply] = {}
        for c in range(m):
            # Perturbations of std 1e-3 per value, unequal per client; integer buffers (batch counters) unchanged.
            shared = {
                k: state[k] + (1 + c % 3) * 1e-3 * torch.randn(state[k].shape, generator=generator)
                if state[k].is_floating_point()
                else state[k].clone()
                for k in keys
            }
            metrics = {"train_loss": 0.5, "fisher_trace": 1.0 + c % 7}
            self.replies[c] = TrainReply(client=c, shared=shared, num_examples=100 + 10 * c, metrics=metrics)
        states = [self.replies[c].shared for c in range(m)]
        initial = self.ctx.initial(keys)
        self.all_values = flatten(states, FlatSpec.of(initial, keys))
        self.params = flatten(states, FlatSpec.of(initial, [k for k in keys if k in self.param_keys]))

    def strategy(self, metric: str, fim: bool) -> AttentiveStrategy:
        sigma = 1.0
        amp = AmpSettings(alpha_k=min(0.1, sigma / (self.m - 1)), sigma=sigma, lam=0.05, dm=metric, scale="relative")
        recipe = Recipe(
            epochs=1, lr=0.05, head_epochs=1 if self.nhead else 0, prox_mu=amp.prox_mu, fisher_batch=32 if fim else 0
        )
        return AttentiveStrategy(
            "fedsaf", amp=amp, nhead=self.nhead, fim=fim, recipe=recipe, ctx=self.ctx, param_keys=self.param_keys
        )


def previous_step(strategy: AttentiveStrategy, replies: dict[int, TrainReply]) -> str:
    """The step as it was before ``amp_aggregate``, on today's kernels: the replies stacked twice (parameters for
    the distances, every shared value for the mix), the distances computed twice (inside ``amp_coefficients`` and
    again for the record), all m rows mixed, Eq. 20 as a second product, and every centre copied out."""
    clients = sorted(replies)
    states = [replies[c].shared for c in clients]
    initial = {k: states[0][k] for k in strategy.keys}
    spec = FlatSpec.of(initial, strategy.keys)
    amp = strategy.amp
    rho_params = flatten(states, strategy.param_spec)
    xi = amp_coefficients(rho_params, amp.dm, amp.alpha_k, amp.sigma, scale=amp.scale)
    distances = pairwise_distances(rho_params, amp.dm, scale=amp.scale)
    z = mix(flatten(states, spec), xi)
    record: dict[str, object] = {
        "clients": clients,
        "distances": distances.tolist(),
        "xi": xi.tolist(),
        "off_diagonal_mass": off_diagonal_mass(xi),
    }
    if strategy.fim:
        traces = [float(replies[c].metrics["fisher_trace"]) for c in clients]
        gamma = fisher_weights(traces)
        p = fisher_intermediate(z, gamma)
        record["gamma"] = [float(g) for g in gamma]
        shared_p = unflatten(p[0], spec)
        centres = [shared_p if torch.equal(p[row], p[0]) else unflatten(p[row], spec) for row in range(len(clients))]
    else:
        centres = [unflatten(z[row], spec) for row in range(len(clients))]
    del centres
    return json.dumps(record)


def interleaved(fns: dict[str, Callable[[], object]], repeats: int) -> dict[str, Timing]:
    """Medians over ``repeats`` rounds that run every function once, in turn (so that other work on the machine
    hits them alike), of the wall time and of this process's CPU time; one untimed warm-up call each first.
    CPU time is the steadier figure on shared cores: it leaves out the time the process waited for a core."""
    for fn in fns.values():
        fn()
    walls: dict[str, list[float]] = {name: [] for name in fns}
    cpus: dict[str, list[float]] = {name: [] for name in fns}
    names = list(fns)
    for rep in range(repeats):
        # each repetition starts one function later, so that none always runs right after the same other one
        # (what ran before decides what is still in the caches)
        for name in names[rep % len(names) :] + names[: rep % len(names)]:
            fn = fns[name]
            wall, cpu = time.perf_counter(), time.process_time()
            fn()
            cpus[name].append(time.process_time() - cpu)
            walls[name].append(time.perf_counter() - wall)
    return {name: Timing(statistics.median(walls[name]), statistics.median(cpus[name])) for name in fns}


def measure(fed: Federation, metrics: list[str], repeats: int) -> list[Row]:
    """Per metric, the floor(s) and the step with FIM off and on, interleaved; one metric's strategies at a time
    (each keeps its stacked matrix and its centres: a few hundred MB at m = 100, nhead = 0)."""
    m = fed.m
    xi = torch.full((m, m), 0.1 / m) + torch.eye(m) * 0.9  # any (m, m) float32 weights: the cost is the same
    params, values = fed.params, fed.all_values

    def gram_floor() -> object:
        return params @ params.T, xi @ values

    def l1_floor() -> object:
        return torch.nn.functional.pdist(params, p=1.0), xi @ values

    states = [fed.replies[c].shared for c in sorted(fed.replies)]
    probe = fed.strategy(metrics[0], False)
    stacks = [StackBuffer(probe.param_spec, m)]
    if probe.buffer_spec.keys:
        stacks.append(StackBuffer(probe.buffer_spec, m))

    def stack() -> object:
        # the step's first part alone: the replies copied into the strategy's kept matrices, as it does
        return [buffer.stack(states) for buffer in stacks]

    rows = []
    for metric in metrics:
        fns: dict[str, Callable[[], object]] = {"gram floor": gram_floor, "stack": stack}
        if metric == "manhattan":
            fns["l1 floor"] = l1_floor
        for fim in (False, True):
            strategy = fed.strategy(metric, fim)

            def step(strategy: AttentiveStrategy = strategy) -> object:
                return json.dumps(strategy.aggregate_train(2, fed.replies))

            fns[f"fim={fim}"] = step

            def previous(strategy: AttentiveStrategy = strategy) -> object:
                return previous_step(strategy, fed.replies)

            fns[f"previous fim={fim}"] = previous
        timings = interleaved(fns, repeats)
        del fns
        gc.collect()
        for fim in (False, True):
            rows.append(
                Row(
                    threads=torch.get_num_threads(),
                    nhead=fed.nhead,
                    values=values.shape[1],
                    params=params.shape[1],
                    m=m,
                    metric=metric,
                    fim=fim,
                    step=timings[f"fim={fim}"],
                    previous=timings[f"previous fim={fim}"],
                    floor=timings["l1 floor" if metric == "manhattan" else "gram floor"],
                    gram_floor=timings["gram floor"],
                    stack=timings["stack"],
                )
            )
    return rows


def report(rows: list[Row], args: argparse.Namespace, loads: list[tuple[float, float, float]]) -> str:
    command = command_line("aggregation_speed.py")
    load = " / ".join(f"{x:.1f}" for x in loads[0])
    lines = [
        "# AMP server step vs its floor (one Gram product + one mixing product)",
        "",
        f"Command: `{command}`",
        "",
        f"{machine()}; load average {load} when started (1 / 5 / 15 min). torch {torch.__version__}; torch threads "
        f"as in the table. Medians of {args.repeats} interleaved repetitions (one warm-up call each).",
        "",
        "**Step**: `AttentiveStrategy.aggregate_train` as the engine calls it, on m replies (state dicts of "
        "MobileNetV3-Small's shared part, each a perturbed copy of one model), plus `json.dumps` of the record "
        "it returns for `aggregation.jsonl`: stacking the replies, d_ij, xi (Eq. 3-8, 16), the mix (Eq. 18; with "
        "FIM the one p of Eq. 14, 20), the centres as state dicts, the record. `scale = relative`, "
        "`strategy.bn = shared` (BatchNorm buffers travel and are mixed, but stay out of the distances).",
        "",
        "**Floor**: on matrices already stacked, one Gram product `P @ P.T` of the m x p trainable parameters "
        "(every squared L2 and cosine distance follows from it) plus one mixing product `xi @ X` of the m x d "
        "shared values, float32 like the step. For `manhattan` no matrix product gives L1 distances: its floor is "
        "`torch.nn.functional.pdist(P, p=1)` (the L1 routine the step itself uses; each pair once) plus the same "
        "mixing product; the last column gives its step against the Gram floor too.",
        "",
        "**Wall** is what a user waits; **CPU** is this process's CPU time (all its threads), which leaves out "
        "the time spent waiting for a core while other work shares the machine, and so is the steadier ratio here.",
        "",
        "**Previous**: the step as it was before `amp_aggregate` (`previous_step` in the script), on today's "
        "kernels: the replies stacked twice, the distances computed twice (in `amp_coefficients` and again for the "
        "record), all m rows mixed and Eq. 20 as a second product, every centre copied out.",
        "",
        "**Stack**: the step's first part alone, the copy of the m replies (one tensor per entry) into the "
        "matrices the strategy keeps from round to round (`StackBuffer`); the floor starts from matrices already "
        "stacked, so the last column is the rest of the step against the floor.",
        "",
        "| threads | nhead | values d (params p) | m | dm | FIM | floor wall (ms) | previous wall (ms) | "
        "step wall (ms) | previous / floor | **step / floor (wall)** | floor CPU (ms) | step CPU (ms) | "
        "**step / floor (CPU)** | step / Gram floor (CPU) | stack CPU (ms) | (step - stack) / floor (CPU) |",
        "|---:|---:|---:|---:|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        lines.append(
            f"| {r.threads} | {r.nhead} | {r.values:,} ({r.params:,}) | {r.m} | {r.metric} | "
            f"{'on' if r.fim else 'off'} | {r.floor.wall * 1e3:.1f} | {r.previous.wall * 1e3:.1f} | "
            f"{r.step.wall * 1e3:.1f} | {r.previous.wall / r.floor.wall:.2f} | **{r.ratio:.2f}** | "
            f"{r.floor.cpu * 1e3:.1f} | {r.step.cpu * 1e3:.1f} | **{r.cpu_ratio:.2f}** | "
            f"{r.step.cpu / r.gram_floor.cpu:.2f} | {r.stack.cpu * 1e3:.1f} | {r.unstacked_cpu_ratio:.2f} |"
        )
    lines += ["", f"Load average when finished: {' / '.join(f'{x:.1f}' for x in loads[-1])}.", ""]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--clients", type=int, nargs="+", default=[5, 20, 100])
    parser.add_argument("--nhead", type=int, nargs="+", default=[6, 0], help="6: FedSAF's default; 0: FedAMP")
    parser.add_argument("--metrics", nargs="+", default=list(METRICS), choices=METRICS)
    parser.add_argument("--repeats", type=int, default=7, help="interleaved repetitions; the median is reported")
    parser.add_argument(
        "--threads", type=int, nargs="+", default=[torch.get_num_threads()], help="torch thread counts to run with"
    )
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()

    loads = [os.getloadavg()]
    rows: list[Row] = []
    for threads in args.threads:
        torch.set_num_threads(threads)
        for nhead in args.nhead:
            for m in args.clients:
                fed = Federation(m, nhead, seed=m)
                for row in measure(fed, args.metrics, args.repeats):
                    rows.append(row)
                    print(
                        f"threads={threads} nhead={nhead:2d} d={row.values:>9,} m={m:4d} {row.metric:16s} "
                        f"fim={'on ' if row.fim else 'off'} floor {row.floor.wall * 1e3:8.1f} ms  "
                        f"previous {row.previous.wall * 1e3:8.1f} ms  step {row.step.wall * 1e3:8.1f} ms  "
                        f"ratio {row.ratio:5.2f}  "
                        f"CPU ratio {row.cpu_ratio:5.2f}  (vs Gram floor {row.step.cpu / row.gram_floor.cpu:5.2f}; "
                        f"less the stack {row.unstacked_cpu_ratio:5.2f})",
                        flush=True,
                    )
                del fed
                gc.collect()
    loads.append(os.getloadavg())
    write_result(args.out, report(rows, args, loads))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
