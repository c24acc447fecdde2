"""The in-process federation engine: the only round loop, for every strategy (FedSAF paper 001, Algorithm 1).

Every round: ``configure_train`` -> each client trains on what it was sent -> ``aggregate_train`` ->
``configure_evaluate`` -> each client evaluates its model (shared part as sent + its own head) on its own test
split. Values sent and received per client are counted from the messages (``federation.contract``).

Clients run one after another in this process (``run.workers = 0``, the default) or spread over worker processes
(``run.workers = W``). On the shared 2-core machine, sequential clients with one torch thread matched the workers
per round without their start-up cost (``benchmarks/results/round_time.md``). Worker messages are JSON headers
plus safetensors bytes, never pickles.

Determinism: each client's round draws every random number (shuffling, augmentation, dropout, the Fisher
mini-batch) from a seed derived from (run seed, round, client); the initial weights from (run seed, "init").
So a run resumed from its last checkpoint ends with the same numbers as one that never stopped, without
saving any RNG state.
"""

from __future__ import annotations

import json
import multiprocessing
import multiprocessing.connection
import os
import signal
import threading
import time
import traceback
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from types import FrameType
from typing import Any, Protocol

import numpy as np
import torch
from safetensors.torch import load as st_load
from safetensors.torch import save as st_save
from tqdm import tqdm

from federation.client import Client, EvalResult
from federation.config import RunConfig, config_to_toml, load_config, with_values
from federation.contract import (
    Recipe,
    Strategy,
    TensorDict,
    TrainInstruction,
    TrainReply,
    count_reply_values,
    count_values,
)
from federation.data import LABELS, check_clients, load_clients, read_manifest
from federation.errors import FederationError
from federation.report import round_stats, run_figures
from federation.runs import (
    AGGREGATION_FILE,
    CONFIG_FILE,
    METRICS_FILE,
    PREDICTIONS_FILE,
    SUMMARY_FILE,
    Checkpoint,
    append_jsonl,
    complete_checkpoints,
    finite_or_none,
    is_live_run,
    keep_rounds,
    now_iso,
    prepare_run_dir,
    read_checkpoint,
    read_json,
    read_jsonl,
    write_checkpoint,
    write_json,
    write_predictions,
)
from federation.strategies import StrategyContext, build_strategy, default_nhead
from models import check_input_size, check_nhead, create_model, split_units

NUM_CLASSES = len(LABELS)
# Settings a resumed run may change: they do not alter the federation's maths.
RESUMABLE_KEYS = frozenset({"run.rounds", "run.workers", "run.threads", "run.keep_checkpoints", "run.device"})


class RunStopped(Exception):
    """The run was interrupted (Ctrl-C or SIGTERM); ``summary.json`` says ``stopped``."""


def derive_seed(*parts: int | str) -> int:
    """A 31-bit seed from (run seed, round, client, ...): independent streams, reproducible anywhere."""
    words = [p if isinstance(p, int) else int.from_bytes(p.encode(), "little") % (2**32) for p in parts]
    return int(np.random.SeedSequence(words).generate_state(1)[0]) & 0x7FFFFFFF


def resolve_device(name: str) -> torch.device:
    """``auto`` -> CUDA when available, else CPU; ``cuda`` without a GPU is an error."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise FederationError("run.device = cuda but no CUDA GPU is visible: use run.device = cpu or auto")
    return torch.device(name)


def resolve_config(config: RunConfig) -> RunConfig:
    """Fill in what the configuration left to the strategy (``nhead``) and to the client (``head_lr``)."""
    if config.strategy.nhead is None:
        config = with_values(config, "strategy", nhead=default_nhead(config.strategy.name))
    if config.client.head_lr is None:
        config = with_values(config, "client", head_lr=config.client.lr)
    return config


@dataclass(frozen=True)
class ClientInfo:
    """What the server may know of a client (never its tiles): counts, and test paths/labels for the report."""

    client: int
    num_train: int
    num_test: int
    test_paths: list[str]
    test_labels: list[int]


@dataclass(frozen=True)
class Trained:
    reply: TrainReply
    seconds: float


@dataclass(frozen=True)
class Evaluated:
    result: EvalResult
    seconds: float


def build_clients(
    config: RunConfig, client_ids: Sequence[int], shared_keys: Sequence[str], initial: Mapping[str, torch.Tensor]
) -> dict[int, Client]:
    """Load the tiles of ``client_ids`` and give each client the common initial model."""
    device = resolve_device(config.run.device)
    data = load_clients(config.data.path, config.data.input_size, config.model.in_chans, client_ids)
    clients: dict[int, Client] = {}
    for c, d in data.items():
        model = create_model(config.model.name, NUM_CLASSES, config.model.in_chans)
        model.load_state_dict(dict(initial))
        clients[c] = Client(
            d,
            model,
            shared_keys,
            batch_size=config.data.batch_size,
            eval_batch_size=config.data.eval_batch_size,
            augment=config.data.augment,
            device=device,
        )
    return clients


def _info(client: Client) -> ClientInfo:
    d = client.data
    return ClientInfo(d.client, d.num_train, d.num_test, list(d.test_paths), [int(v) for v in d.test_y])


# -- client pools ------------------------------------------------------------------------------------------------
class ClientPool(Protocol):
    """Where the clients live: this process or worker processes. Same answers either way."""

    def info(self) -> dict[int, ClientInfo]: ...

    def train(
        self, server_round: int, instructions: Mapping[int, TrainInstruction], seeds: Mapping[int, int]
    ) -> dict[int, Trained]: ...

    def evaluate(self, shared: Mapping[int, TensorDict | None]) -> dict[int, Evaluated]: ...

    def states(self) -> dict[int, TensorDict]: ...

    def load_states(self, states: Mapping[int, TensorDict]) -> None: ...

    def close(self) -> None: ...


class InProcessPool:
    """Clients run one after another in this process."""

    def __init__(self, clients: dict[int, Client]) -> None:
        self.clients = clients

    def info(self) -> dict[int, ClientInfo]:
        return {c: _info(client) for c, client in self.clients.items()}

    def train(
        self, server_round: int, instructions: Mapping[int, TrainInstruction], seeds: Mapping[int, int]
    ) -> dict[int, Trained]:
        out: dict[int, Trained] = {}
        for c, instruction in instructions.items():
            start = time.perf_counter()
            reply = self.clients[c].train(instruction, server_round, seeds[c])
            out[c] = Trained(reply, time.perf_counter() - start)
        return out

    def evaluate(self, shared: Mapping[int, TensorDict | None]) -> dict[int, Evaluated]:
        out: dict[int, Evaluated] = {}
        for c, tensors in shared.items():
            start = time.perf_counter()
            self.clients[c].load_shared(tensors)
            out[c] = Evaluated(self.clients[c].evaluate(), time.perf_counter() - start)
        return out

    def states(self) -> dict[int, TensorDict]:
        return {c: client.state() for c, client in self.clients.items()}

    def load_states(self, states: Mapping[int, TensorDict]) -> None:
        for c, state in states.items():
            self.clients[c].load_state(state)

    def close(self) -> None:
        return None


def encode_message(header: Mapping[str, Any], tensors: Mapping[str, torch.Tensor] | None = None) -> bytes:
    """One IPC message: 8-byte header length, JSON header, safetensors body (no pickle)."""
    head = json.dumps(dict(header)).encode("utf-8")
    body = st_save({k: v.detach().cpu().contiguous() for k, v in tensors.items()}) if tensors else b""
    return len(head).to_bytes(8, "little") + head + body


def decode_message(data: bytes) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    """Inverse of ``encode_message``."""
    size = int.from_bytes(data[:8], "little")
    header: dict[str, Any] = json.loads(data[8 : 8 + size].decode("utf-8"))
    body = data[8 + size :]
    return header, (st_load(body) if body else {})


def _pack_payloads(dicts: Mapping[int, TensorDict | None]) -> tuple[dict[int, int | None], dict[str, torch.Tensor]]:
    """Give each distinct tensor dict one payload index, so a dict sent to many clients travels once."""
    index: dict[int, int] = {}
    refs: dict[int, int | None] = {}
    tensors: dict[str, torch.Tensor] = {}
    for c, d in dicts.items():
        if d is None:
            refs[c] = None
            continue
        if id(d) not in index:
            index[id(d)] = len(index)
            tensors.update({f"p{index[id(d)]}/{k}": v for k, v in d.items()})
        refs[c] = index[id(d)]
    return refs, tensors


def _unpack_payload(tensors: Mapping[str, torch.Tensor], ref: int | None) -> TensorDict | None:
    if ref is None:
        return None
    prefix = f"p{ref}/"
    return {k[len(prefix) :]: v for k, v in tensors.items() if k.startswith(prefix)}


def _worker_main(conn: multiprocessing.connection.Connection) -> None:
    """A worker process: owns some clients and answers train/evaluate/state requests until told to stop."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent handles Ctrl-C and then stops us
    pool: InProcessPool | None = None
    while True:
        try:
            header, tensors = decode_message(conn.recv_bytes())
        except EOFError:
            return
        op = header["op"]
        try:
            if op == "stop":
                conn.send_bytes(encode_message({"ok": True}))
                return
            if op == "init":
                torch.set_num_threads(int(header["threads"]))
                config = _config_from_text(header["config"])
                pool = InProcessPool(build_clients(config, header["clients"], header["shared_keys"], tensors))
                infos = {str(c): asdict(i) for c, i in pool.info().items()}
                conn.send_bytes(encode_message({"ok": True, "info": infos}))
                continue
            if pool is None:
                raise RuntimeError("worker used before init")
            if op == "train":
                instructions: dict[int, TrainInstruction] = {}
                seeds: dict[int, int] = {}
                for item in header["items"]:
                    c = int(item["client"])
                    shared = _unpack_payload(tensors, item["shared"])
                    centre = shared if item["centre_is_shared"] else _unpack_payload(tensors, item["centre"])
                    instructions[c] = TrainInstruction(c, Recipe(**item["recipe"]), shared, centre)
                    seeds[c] = int(item["seed"])
                done = pool.train(int(header["round"]), instructions, seeds)
                out_tensors = {f"c{c}/{k}": v for c, t in done.items() for k, v in t.reply.shared.items()}
                replies = [
                    {
                        "client": c,
                        "num_examples": t.reply.num_examples,
                        "metrics": t.reply.metrics,
                        "seconds": t.seconds,
                    }
                    for c, t in done.items()
                ]
                conn.send_bytes(encode_message({"ok": True, "replies": replies}, out_tensors))
            elif op == "evaluate":
                shared_map = {int(c): _unpack_payload(tensors, ref) for c, ref in header["refs"].items()}
                evaluated = pool.evaluate(shared_map)
                results = [
                    {"client": c, "loss": e.result.loss, "acc": e.result.acc, "auc": e.result.auc, "seconds": e.seconds}
                    for c, e in evaluated.items()
                ]
                probs = {f"c{c}": torch.from_numpy(e.result.prob_abnormal.copy()) for c, e in evaluated.items()}
                conn.send_bytes(encode_message({"ok": True, "results": results}, probs))
            elif op == "states":
                states = pool.states()
                conn.send_bytes(
                    encode_message({"ok": True}, {f"c{c}/{k}": v for c, s in states.items() for k, v in s.items()})
                )
            elif op == "load_states":
                pool.load_states(_split_by_client(tensors))
                conn.send_bytes(encode_message({"ok": True}))
            else:
                raise RuntimeError(f"unknown worker op {op!r}")
        except Exception as exc:
            conn.send_bytes(
                encode_message(
                    {
                        "ok": False,
                        "error": str(exc),
                        "user_facing": bool(getattr(exc, "user_facing", False)),
                        "traceback": traceback.format_exc(),
                    }
                )
            )


def _config_from_text(text: str) -> RunConfig:
    import tomllib

    from federation.config import config_from_dict

    return config_from_dict(tomllib.loads(text), "worker config")


def _split_by_client(tensors: Mapping[str, torch.Tensor]) -> dict[int, TensorDict]:
    out: dict[int, TensorDict] = {}
    for name, value in tensors.items():
        client, _, key = name.partition("/")
        out.setdefault(int(client[1:]), {})[key] = value
    return out


class WorkerPool:
    """Clients spread round-robin over ``workers`` processes (forked from a fresh forkserver; ``run.threads`` each)."""

    def __init__(
        self, config: RunConfig, client_ids: Sequence[int], shared_keys: Sequence[str], initial: TensorDict
    ) -> None:
        workers = min(config.run.workers, len(client_ids))
        # forkserver: one fresh server process imports torch and this module once, then forks each worker from
        # it; cheaper than spawn (one import per worker) and, unlike fork, never copies a process whose torch
        # thread pools are already running.
        context = multiprocessing.get_context("forkserver")
        context.set_forkserver_preload(["federation.simulation"])
        self.conns: list[multiprocessing.connection.Connection] = []
        self.processes: list[Any] = []
        self.owner: dict[int, int] = {}
        threads = config.run.threads or max(1, (os.cpu_count() or 1) // workers)
        for w in range(workers):
            parent, child = context.Pipe()
            process = context.Process(target=_worker_main, args=(child,), daemon=True, name=f"fl-worker-{w}")
            process.start()
            child.close()
            self.conns.append(parent)
            self.processes.append(process)
        assigned: dict[int, list[int]] = {w: [] for w in range(workers)}
        for i, c in enumerate(sorted(client_ids)):
            assigned[i % workers].append(c)
            self.owner[c] = i % workers
        text = config_to_toml(config)
        for w, conn in enumerate(self.conns):
            header = {
                "op": "init",
                "threads": threads,
                "config": text,
                "clients": assigned[w],
                "shared_keys": list(shared_keys),
            }
            conn.send_bytes(encode_message(header, initial))
        self._info: dict[int, ClientInfo] = {}
        try:
            for reply, _ in self._gather():
                for c, info in reply["info"].items():
                    self._info[int(c)] = ClientInfo(**info)
        except BaseException:
            self.close()  # e.g. a missing tile: do not leave the other workers waiting
            raise

    def _gather(self, conns: Sequence[int] | None = None) -> list[tuple[dict[str, Any], dict[str, torch.Tensor]]]:
        out = []
        for w in conns if conns is not None else range(len(self.conns)):
            try:
                header, tensors = decode_message(self.conns[w].recv_bytes())
            except EOFError as exc:
                raise RuntimeError(f"federation worker {w} died (see its traceback above)") from exc
            if not header.get("ok"):
                if header.get("user_facing"):
                    raise FederationError(header["error"])
                raise RuntimeError(f"federation worker {w} failed:\n{header.get('traceback', header['error'])}")
            out.append((header, tensors))
        return out

    def info(self) -> dict[int, ClientInfo]:
        return dict(self._info)

    def _by_worker(self, clients: Sequence[int]) -> dict[int, list[int]]:
        out: dict[int, list[int]] = {}
        for c in clients:
            out.setdefault(self.owner[c], []).append(c)
        return out

    def train(
        self, server_round: int, instructions: Mapping[int, TrainInstruction], seeds: Mapping[int, int]
    ) -> dict[int, Trained]:
        groups = self._by_worker(list(instructions))
        for w, clients in groups.items():
            payload: dict[int, TensorDict | None] = {}
            for c in clients:
                payload[2 * c] = instructions[c].shared
                centre = instructions[c].prox_centre
                payload[2 * c + 1] = None if centre is None or centre is instructions[c].shared else centre
            refs, tensors = _pack_payloads(payload)
            items = [
                {
                    "client": c,
                    "recipe": asdict(instructions[c].recipe),
                    "shared": refs[2 * c],
                    "centre": refs[2 * c + 1],
                    "centre_is_shared": instructions[c].prox_centre is not None
                    and instructions[c].prox_centre is instructions[c].shared,
                    "seed": seeds[c],
                }
                for c in clients
            ]
            self.conns[w].send_bytes(encode_message({"op": "train", "round": server_round, "items": items}, tensors))
        out: dict[int, Trained] = {}
        for header, tensors in self._gather(list(groups)):
            split = _split_by_client(tensors)
            for r in header["replies"]:
                c = int(r["client"])
                reply = TrainReply(c, split.get(c, {}), int(r["num_examples"]), dict(r["metrics"]))
                out[c] = Trained(reply, float(r["seconds"]))
        return {c: out[c] for c in instructions}

    def evaluate(self, shared: Mapping[int, TensorDict | None]) -> dict[int, Evaluated]:
        groups = self._by_worker(list(shared))
        for w, clients in groups.items():
            refs, tensors = _pack_payloads({c: shared[c] for c in clients})
            self.conns[w].send_bytes(
                encode_message({"op": "evaluate", "refs": {str(c): r for c, r in refs.items()}}, tensors)
            )
        out: dict[int, Evaluated] = {}
        for header, tensors in self._gather(list(groups)):
            for r in header["results"]:
                c = int(r["client"])
                result = EvalResult(float(r["loss"]), float(r["acc"]), r["auc"], tensors[f"c{c}"].numpy())
                out[c] = Evaluated(result, float(r["seconds"]))
        return {c: out[c] for c in shared}

    def states(self) -> dict[int, TensorDict]:
        for conn in self.conns:
            conn.send_bytes(encode_message({"op": "states"}))
        out: dict[int, TensorDict] = {}
        for _, tensors in self._gather():
            out.update(_split_by_client(tensors))
        return out

    def load_states(self, states: Mapping[int, TensorDict]) -> None:
        groups = self._by_worker(list(states))
        for w, clients in groups.items():
            tensors = {f"c{c}/{k}": v for c in clients for k, v in states[c].items()}
            self.conns[w].send_bytes(encode_message({"op": "load_states"}, tensors))
        self._gather(list(groups))

    def close(self) -> None:
        for conn in self.conns:
            try:
                conn.send_bytes(encode_message({"op": "stop"}))
            except (BrokenPipeError, OSError):
                continue
        for process in self.processes:
            process.join(timeout=10)
            if process.is_alive():
                process.terminate()
                process.join(timeout=5)
        for conn in self.conns:
            conn.close()


# -- the run -----------------------------------------------------------------------------------------------------
@contextmanager
def _stop_on_sigterm() -> Iterator[None]:
    """Turn SIGTERM into ``RunStopped`` (as Ctrl-C is ``KeyboardInterrupt``) so the run is marked ``stopped``."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum: int, frame: FrameType | None) -> None:
        raise RunStopped("stopped by SIGTERM")

    previous = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def initial_state(config: RunConfig) -> tuple[TensorDict, list[tuple[str, list[str]]]]:
    """The common initial weights (from ``weights`` or seeded random init) and the model's layer units."""
    torch.manual_seed(derive_seed(config.run.seed, "init"))
    model = create_model(config.model.name, NUM_CLASSES, config.model.in_chans, config.model.weights or None)
    return {k: v.detach().clone() for k, v in model.state_dict().items()}, split_units(model)


class Simulation:
    """One run of the federation into ``run_dir`` (fresh, or resumed from its last checkpoint)."""

    def __init__(self, config: RunConfig, run_dir: Path, *, progress: bool = True) -> None:
        self.config = resolve_config(config)
        self.run_dir = run_dir
        self.progress = progress
        self.summary: dict[str, Any] = {}

    # summary.json ------------------------------------------------------------------------------------------------
    def _write_summary(self, **changes: Any) -> None:
        self.summary.update(changes, updated_at=now_iso())
        write_json(self.run_dir / SUMMARY_FILE, self.summary)

    def run(self, *, resume: bool = False, overwrite: bool = False) -> dict[str, Any]:
        """Train every round; returns the final ``summary.json`` content. Raises on failure or interruption."""
        config = self.config
        # Settings that cannot work are refused before a run directory exists, so a mistyped --data leaves
        # nothing behind; failures after this point are recorded in the run's summary.json instead.
        check_input_size(config.model.name, config.data.input_size)
        self.rows = read_manifest(config.data.path)
        if resume:
            previous = read_json(self.run_dir / SUMMARY_FILE) if (self.run_dir / SUMMARY_FILE).is_file() else {}
            if is_live_run(self.run_dir):
                raise FederationError(f"{self.run_dir} is still running (pid {previous['pid']}): stop it first")
            self.summary = dict(previous)
        else:
            prepare_run_dir(self.run_dir, overwrite)
        self.summary.update(
            run_id=self.run_dir.name,
            status="running",
            pid=os.getpid(),
            total_rounds=config.run.rounds,
            rounds_done=self.summary.get("rounds_done", 0),
            eta_seconds=None,
            error=None,
            finished_at=None,
            strategy=config.strategy.name,
            model=config.model.name,
            nhead=config.strategy.nhead,
            dataset=config.data.path,
        )
        self.summary.setdefault("started_at", now_iso())
        if resume:
            self.summary["resumed_at"] = now_iso()
        (self.run_dir / CONFIG_FILE).write_text(config_to_toml(config), encoding="utf-8")
        self._write_summary()
        pool: ClientPool | None = None
        threads_before = torch.get_num_threads()
        if config.run.threads > 0:
            torch.set_num_threads(config.run.threads)
        try:
            with _stop_on_sigterm():
                pool = self._start(resume)
                self._loop(pool)
        except (KeyboardInterrupt, RunStopped) as exc:
            self._write_summary(status="stopped", eta_seconds=None, error=str(exc) or "interrupted")
            raise RunStopped(
                f"stopped after round {self.summary.get('rounds_done', 0)}; "
                f"continue with: gastric-fl train --resume {self.run_dir}"
            ) from exc
        except Exception as exc:
            message = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            self._write_summary(status="failed", eta_seconds=None, error=message)
            raise
        finally:
            if pool is not None:
                pool.close()
            torch.set_num_threads(threads_before)
        self._write_summary(status="finished", eta_seconds=0, finished_at=now_iso())
        return self.summary

    def _start(self, resume: bool) -> ClientPool:
        config = self.config
        rows = self.rows
        chosen = config.strategy.clients
        clients = tuple(check_clients(Path(config.data.path), rows, None if isinstance(chosen, str) else chosen))
        counts = {c: sum(1 for r in rows if r.client == c and r.split == "train") for c in clients}
        initial, units = initial_state(config)
        check_nhead(config.strategy.nhead or 0, units)
        ctx = StrategyContext(clients, counts, tuple(initial), tuple(units), initial)
        self.strategy: Strategy = build_strategy(config, ctx)
        shared_keys = self.strategy.shared_keys(list(initial), [keys for _, keys in units])
        self.clients = clients
        if config.run.workers > 0:
            pool: ClientPool = WorkerPool(config, clients, shared_keys, initial)
        else:
            pool = InProcessPool(build_clients(config, clients, shared_keys, initial))
        self.info = pool.info()
        self.start_round = 1
        self.round_seconds: list[float] = []
        if resume:
            done = complete_checkpoints(self.run_dir)
            if done:
                checkpoint = read_checkpoint(self.run_dir, done[-1])
                missing = [c for c in clients if c not in checkpoint.clients]
                if missing:
                    raise FederationError(
                        f"checkpoint round {done[-1]} lacks clients {missing}: it is from another run"
                    )
                pool.load_states({c: checkpoint.clients[c] for c in clients})
                self.strategy.load_state_tensors(checkpoint.strategy_tensors)
                self.strategy.load_state_json(checkpoint.strategy_json)
                self.start_round = done[-1] + 1
            last = self.start_round - 1
            for name in (METRICS_FILE, AGGREGATION_FILE):
                keep_rounds(self.run_dir / name, last)
            self.summary["rounds_done"] = last
        else:
            for name in (METRICS_FILE, AGGREGATION_FILE):
                (self.run_dir / name).write_text("", encoding="utf-8")
        self.summary["clients"] = list(clients)
        return pool

    def _loop(self, pool: ClientPool) -> None:
        config = self.config
        total = config.run.rounds
        bar = tqdm(
            total=total,
            initial=self.start_round - 1,
            desc=self.run_dir.name,
            unit="round",
            disable=not self.progress,
            dynamic_ncols=True,
        )
        try:
            for server_round in range(self.start_round, total + 1):
                self._round(pool, server_round)
                bar.update(1)
                final = self.summary.get("final") or {}
                bar.set_postfix(acc=f"{final.get('avg_test_acc', 0):.3f}")
        finally:
            bar.close()

    def _round(self, pool: ClientPool, server_round: int) -> None:
        config = self.config
        start = time.perf_counter()
        instructions = self.strategy.configure_train(server_round, self.clients)
        sent = {c: count_values(i) for c, i in instructions.items()}
        seeds = {c: derive_seed(config.run.seed, server_round, c) for c in instructions}
        trained = pool.train(server_round, instructions, seeds)
        received = {c: count_reply_values(t.reply) for c, t in trained.items()}
        record = self.strategy.aggregate_train(server_round, {c: t.reply for c, t in trained.items()})
        evaluated = pool.evaluate(self.strategy.configure_evaluate(server_round, self.clients))
        seconds = time.perf_counter() - start

        lines = []
        for c in self.clients:
            t = trained.get(c)
            e = evaluated[c]
            metrics = t.reply.metrics if t else {}
            lines.append(
                {
                    "round": server_round,
                    "client": c,
                    "train_loss": finite_or_none(metrics.get("train_loss")),
                    "test_loss": finite_or_none(e.result.loss),
                    "test_acc": e.result.acc,
                    "test_auc": finite_or_none(e.result.auc),
                    "fisher_trace": finite_or_none(metrics.get("fisher_trace")),
                    "values_sent": sent.get(c, 0),
                    "values_received": received.get(c, 0),
                    "seconds": (t.seconds if t else 0.0) + e.seconds,
                    "num_train": self.info[c].num_train,
                    "num_test": self.info[c].num_test,
                }
            )
        append_jsonl(self.run_dir / METRICS_FILE, lines)
        aggregation = {
            "round": server_round,
            "seconds": seconds,
            "values_sent": sum(sent.values()),
            "values_received": sum(received.values()),
            **record,
        }
        append_jsonl(self.run_dir / AGGREGATION_FILE, [aggregation])
        write_predictions(
            self.run_dir / PREDICTIONS_FILE,
            (
                [c, path, LABELS[label], f"{prob:.17g}", server_round]
                for c in self.clients
                for path, label, prob in zip(
                    self.info[c].test_paths, self.info[c].test_labels, evaluated[c].result.prob_abnormal, strict=True
                )
            ),
        )
        write_checkpoint(
            self.run_dir,
            Checkpoint(server_round, pool.states(), self.strategy.state_tensors(), self.strategy.state_json()),
            keep=config.run.keep_checkpoints,
        )
        self.round_seconds.append(seconds)
        per_round = sum(self.round_seconds) / len(self.round_seconds)
        figures = run_figures(round_stats(read_jsonl(self.run_dir / METRICS_FILE)))
        self._write_summary(
            rounds_done=server_round,
            seconds_per_round=per_round,
            eta_seconds=per_round * (config.run.rounds - server_round),
            **figures,
        )


def train(
    config: RunConfig,
    run_dir: Path,
    *,
    resume: bool = False,
    overwrite: bool = False,
    progress: bool = True,
) -> dict[str, Any]:
    """Run (or resume) a federation into ``run_dir``; returns the final summary."""
    return Simulation(config, run_dir, progress=progress).run(resume=resume, overwrite=overwrite)


def load_run_config(run_dir: Path, overrides: Sequence[str] = ()) -> RunConfig:
    """The saved configuration of ``run_dir`` with the (few) overrides a resume may change."""
    from federation.config import parse_override

    path = run_dir / CONFIG_FILE
    if not path.is_file():
        raise FederationError(
            f"{run_dir} has no {CONFIG_FILE}: --resume needs a run directory made by gastric-fl train"
        )
    for text in overrides:
        section, key, _ = parse_override(text)
        if f"{section}.{key}" not in RESUMABLE_KEYS:
            raise FederationError(
                f"--set {text}: a resumed run keeps its configuration; "
                f"only {', '.join(sorted(RESUMABLE_KEYS))} may change"
            )
    return load_config(path, overrides)
