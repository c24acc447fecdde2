"""The GPU memory estimate that guards ``run.workers`` on one GPU (``federation.hospital.gpu_memory``, issue 32)
against what
the device really holds.

A synthetic SEED dataset (``gastric-fl synth --format seed --images N --difficulty 0.3``, prepared with
``configs/prepare_seed_noniid.toml``: 5 unequal hospitals, two grayscale) is trained with ``configs/seed.toml`` for
two rounds under each variant (``run.workers``, batch, precision) on ``--device cuda``, in a child process, while
``nvidia-smi --query-gpu=memory.used`` is read every 50 ms. The measured figure is the peak minus the reading before
the child started (every process of the run: the parent's CUDA context, which `train` creates when it checks the
free memory, and each worker's). The estimate is ``federation.hospital.gpu_memory.run_bytes`` for the run plus, with
workers, one ``CONTEXT_BYTES`` for that parent. The estimate is meant to be at or above the measured peak
(ratio >= 1), not far above it.

Without a GPU (``--device cpu``) the script writes the estimates alone. Results:
``benchmarks/results/gpu_memory.md``.

    .venv/bin/python benchmarks/gpu_memory.py                   # on a machine with a GPU
    .venv/bin/python benchmarks/gpu_memory.py --slides 40 --out /tmp/m.md   # a quick check
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import torch
from _common import CLI, ROOT, command_line, machine, synthetic_dataset, write_result

from federation import gpu_memory

RESULTS = ROOT / "benchmarks" / "results" / "gpu_memory.md"
PRESET = ROOT / "configs" / "seed.toml"
VARIANTS = [  # (run.workers, data.batch_size, run.precision)
    (0, 32, "fp32"),
    (5, 32, "fp32"),
    (5, 256, "bf16"),
    (2, 256, "bf16"),
]


def _gpu_used_mib() -> int:
    out = subprocess.run(
        ["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits", "--id=0"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    return int(out.strip().splitlines()[0])


def _measured_peak(args: list[str]) -> tuple[int, float]:
    """Run ``gastric-fl ARGS`` in a child process; (its peak GPU memory above the start, bytes; wall seconds)."""
    base = _gpu_used_mib()
    peak = base
    done = threading.Event()

    def poll() -> None:
        nonlocal peak
        while not done.is_set():
            peak = max(peak, _gpu_used_mib())
            time.sleep(0.05)

    watcher = threading.Thread(target=poll, daemon=True)
    watcher.start()
    start = time.perf_counter()
    try:
        subprocess.run([*CLI, *args], check=True, cwd=ROOT, stdout=subprocess.DEVNULL)
    finally:
        done.set()
        watcher.join()
    return (peak - base) * 2**20, time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--slides", type=int, default=240)
    parser.add_argument("--work", type=Path, default=Path(tempfile.gettempdir()) / "gfl_gpu_memory")
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument("--variants", default="", help="indices into VARIANTS to run, e.g. 2,3 (default: all)")
    args = parser.parse_args()
    chosen = [VARIANTS[int(i)] for i in args.variants.split(",")] if args.variants else VARIANTS
    data, _ = synthetic_dataset("seed", args.slides, args.work, str(ROOT / "configs" / "prepare_seed_noniid.toml"),
                                workers=min(8, os.cpu_count() or 1))  # fmt: skip
    counts = gpu_memory.hospital_tiles(data)
    tiles = [counts[h] for h in sorted(counts)]
    on_gpu = args.device == "cuda"
    rows = []
    for workers, batch, precision in chosen:
        parent = gpu_memory.CONTEXT_BYTES if workers > 0 else 0  # with workers, the parent checks and holds a context
        estimate = parent + gpu_memory.run_bytes(tiles, workers, gpu_memory.Shape(128, 3, batch, "mobilenet_v3_small"))
        measured, seconds = (0, 0.0)
        if on_gpu:
            run_dir = args.work / f"run_w{workers}_b{batch}_{precision}"
            settings = [f"run.workers={workers}", f"data.batch_size={batch}", f"run.precision={precision}",
                        "run.rounds=2", "run.device=cuda"]  # fmt: skip
            measured, seconds = _measured_peak(
                ["train", "--config", str(PRESET), "--data", str(data), "--out", str(run_dir), "--overwrite", "-q",
                 *[a for s in settings for a in ("--set", s)]]
            )  # fmt: skip
        rows.append((workers, batch, precision, estimate, measured, seconds))
        shown = f"measured {measured / 2**30:.2f} GiB in {seconds:.0f} s" if on_gpu else "no GPU"
        print(f"workers {workers}, batch {batch}, {precision}: estimate {estimate / 2**30:.2f} GiB, {shown}")
    device = torch.cuda.get_device_name(0) if on_gpu else "none (estimates only)"
    lines = [
        "# GPU memory: the estimate that guards run.workers against the device's peak",
        "",
        f"Command: `{command_line('gpu_memory.py')}`",
        "",
        f"{machine()}; GPU {device}; torch {torch.__version__}; Python {sys.version.split()[0]}.",
        "",
        f"Data: {args.slides} synthetic SEED slides prepared with configs/prepare_seed_noniid.toml: "
        f"{len(tiles)} hospitals of {', '.join(str(t) for t in tiles)} tiles (every split) at 128 px. "
        "configs/seed.toml for two rounds per variant. Estimate: `federation.hospital.gpu_memory.run_bytes` + the "
        "parent's "
        "context when there are workers; measured: the peak of `nvidia-smi`'s memory.used above the reading before "
        "the run.",
        "",
        "| run.workers | batch | precision | estimate GiB | measured peak GiB | estimate / measured |",
        "|---:|---:|---|---:|---:|---:|",
    ]
    for workers, batch, precision, estimate, measured, _ in rows:
        ratio = f"{estimate / measured:.2f}" if measured else "n/a"
        peak = f"{measured / 2**30:.2f}" if on_gpu else "n/a"
        lines.append(f"| {workers} | {batch} | {precision} | {estimate / 2**30:.2f} | {peak} | {ratio} |")
    write_result(args.out, "\n".join(lines) + "\n")
    print(f"written: {args.out}")


if __name__ == "__main__":
    main()
