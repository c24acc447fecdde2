"""Where the cells of a parallel grid run: worker processes on this machine, or tasks on a Ray cluster.

Both give ``federation.ablation.running`` the same thing: a ``submit(train_fn, config, run_dir, resume)`` that
returns a ``concurrent.futures.Future`` of one cell's run, and a short description for the grid's first line.

* **Worker processes** (`process_cells`, ``ablate --workers N``): a ``spawn`` pool (each cell a fresh interpreter,
  so no state leaks between cells). With ``run.device`` on a GPU and several GPUs visible, worker *k* sees GPU
  *k mod n* alone (``CUDA_VISIBLE_DEVICES``); with one GPU the workers share it.
* **A Ray cluster** (`ray_cells`, ``ablate --ray ADDRESS``; Ray comes with Flower's simulation extra): each cell is
  a Ray task of one CPU, and of one whole GPU when its ``run.device`` is a GPU and the cluster has GPUs (Ray then
  sets ``CUDA_VISIBLE_DEVICES`` for it). ``ADDRESS`` is what ``ray.init`` takes: ``host:port`` of a running
  cluster's head (``ray start --head``), ``auto`` (the cluster this machine belongs to) or ``local`` (a cluster
  started here for this grid and stopped after it; its tasks import from this process's ``sys.path``). A task
  writes its run directory at the path the plan gives,
  so every node must see the ablation folder and the datasets at the same paths (a shared file system) and have
  this package installed (https://docs.ray.io/en/latest/ray-core/tasks.html). An interruption cancels the cells
  in flight (Ray raises ``KeyboardInterrupt`` in each, and the engine checkpoints it as it does on Ctrl-C) and
  waits for them to stop, so the same command resumes them.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import signal
import socket
import sys
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import Future, ProcessPoolExecutor
from pathlib import Path
from typing import Any

from federation.errors import FederationError, first_line
from infra.processes import plain_main

TrainFn = Callable[..., Mapping[str, Any]]
Submit = Callable[[TrainFn, Any, Path, bool], "Future[None]"]
CANCEL_WAIT_S = 120.0  # how long an interrupted grid waits for its Ray cells to checkpoint and stop
# in a worker process of `process_cells`: the grid's stop event, set when the grid is interrupted (None elsewhere)
_stop: Any = None


def train_cell(train_fn: TrainFn, config: Any, run_dir: Path, resume: bool) -> None:
    """One cell where it runs (a worker process or a Ray task): no per-round bars, several cells write at once.

    In a worker process Ctrl-C interrupts the cell only while it trains (the engine then checkpoints it and stops);
    a cell that reaches a worker after the grid was interrupted is not started (it stays pending)."""
    if _stop is None:  # a Ray task: Ray cancels it with its own KeyboardInterrupt
        train_fn(config, run_dir, resume=resume, overwrite=not resume, progress=False)
        return
    signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        if not _stop.is_set():
            train_fn(config, run_dir, resume=resume, overwrite=not resume, progress=False)
    finally:
        signal.signal(signal.SIGINT, signal.SIG_IGN)


def visible_gpus(on_gpu: bool) -> list[str]:
    """The GPUs worker processes spread over: every visible one when a cell runs on a GPU, else none."""
    if not on_gpu:
        return []
    import torch

    return [str(i) for i in range(torch.cuda.device_count())] if torch.cuda.is_available() else []


def _worker_start(gpus: Sequence[str], stop: Any) -> None:
    """A worker process's start: with several GPUs, it sees one of them alone (worker k: GPU k mod n). Idle or
    loading a cell's code it ignores Ctrl-C, which reaches the whole process group: the grid stops it (`train_cell`),
    and no worker prints a traceback of the import it was in."""
    global _stop
    _stop = stop
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    identity = multiprocessing.current_process()._identity
    if len(gpus) > 1 and identity:
        os.environ["CUDA_VISIBLE_DEVICES"] = gpus[(identity[0] - 1) % len(gpus)]


@contextlib.contextmanager
def process_cells(workers: int, on_gpu: bool) -> Iterator[tuple[Submit, str]]:
    """Cells in ``workers`` spawned processes on this machine (module docstring)."""
    context = multiprocessing.get_context("spawn")
    gpus = visible_gpus(on_gpu)
    stop = context.Event()
    pool = ProcessPoolExecutor(workers, mp_context=context, initializer=_worker_start, initargs=(gpus, stop))

    def submit(train_fn: TrainFn, config: Any, run_dir: Path, resume: bool) -> Future[None]:
        with plain_main():  # a worker starts as a cell is submitted
            return pool.submit(train_cell, train_fn, config, run_dir, resume)

    try:
        yield submit, f"{workers} worker processes"
    except BaseException:
        # Interrupted: the cells training got the same Ctrl-C and checkpoint; those not started stay pending. A
        # second Ctrl-C while waiting for them ends the workers at once (each cell resumes from its last checkpoint)
        stop.set()
        try:
            pool.shutdown(wait=True, cancel_futures=True)
        except KeyboardInterrupt:
            for child in multiprocessing.active_children():
                child.terminate()
            pool.shutdown(wait=False, cancel_futures=True)
        raise
    pool.shutdown(wait=True)


def _reachable(address: str) -> None:
    """A ``host:port`` (or ``ray://host:port``) address must accept a connection before Ray is asked to join it:
    ``ray.init`` would otherwise retry for about a minute before failing."""
    target = address.removeprefix("ray://")
    host, sep, port = target.rpartition(":")
    if not sep or not port.isdigit():
        return  # "auto", "local": Ray resolves them itself
    try:
        socket.create_connection((host or "127.0.0.1", int(port)), timeout=3).close()
    except OSError as exc:
        raise FederationError(
            f"--ray {address}: no Ray cluster answers there ({exc.strerror or exc}); start one with "
            "`ray start --head` and give the address it prints, or use --ray local"
        ) from None


@contextlib.contextmanager
def ray_cells(address: str, on_gpu: bool, local_cpus: int | None = None) -> Iterator[tuple[Submit, str]]:
    """Cells as tasks on the Ray cluster at ``address`` (module docstring). ``local_cpus``: the CPUs of a cluster
    started here (``address`` ``local``; default: this machine's cores), so the cells it runs at once."""
    try:
        import ray
    except ImportError:
        raise FederationError("--ray needs Ray (a declared dependency): run bash scripts/setup.sh") from None
    _reachable(address)
    joined = not ray.is_initialized()
    if joined:
        options: dict[str, Any] = {"include_dashboard": False, "configure_logging": False}
        if address == "local":  # a cluster of this machine: this process's CPUs cap and its import path
            options["num_cpus"] = local_cpus if local_cpus is not None else (os.cpu_count() or 1)
            path = os.pathsep.join(p for p in sys.path if p)
            options["runtime_env"] = {"env_vars": {"PYTHONPATH": path}}
        try:
            ray.init(address=address, **options)
        except (ConnectionError, RuntimeError, ValueError) as exc:
            raise FederationError(f"--ray {address}: cannot join that Ray cluster ({first_line(exc)})") from None
    try:
        gpus = float(ray.cluster_resources().get("GPU", 0))
        task = ray.remote(num_cpus=1, num_gpus=1 if on_gpu and gpus >= 1 else 0, max_retries=0)(train_cell)
        refs: list[Any] = []

        def submit(train_fn: TrainFn, config: Any, run_dir: Path, resume: bool) -> Future[None]:
            ref = task.remote(train_fn, config, run_dir, resume)
            refs.append(ref)
            future: Future[None] = ref.future()
            return future

        try:
            yield submit, f"Ray tasks on {address} ({int(ray.cluster_resources().get('CPU', 0))} CPUs, {gpus:g} GPUs)"
        except BaseException:
            for ref in refs:
                with contextlib.suppress(Exception):
                    ray.cancel(ref)
            with contextlib.suppress(Exception):
                ray.wait(refs, num_returns=len(refs), timeout=CANCEL_WAIT_S)
            raise
    finally:
        if joined:
            ray.shutdown()


def cause(exc: Exception) -> Exception:
    """The error a cell raised: a Ray task's failure wraps it (``RayTaskError.cause``)."""
    inner = getattr(exc, "cause", None)
    return inner if isinstance(inner, Exception) and type(exc).__name__.startswith("RayTaskError") else exc
