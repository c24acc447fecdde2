"""Time of one AMP aggregation (FedSAF paper 001, Eq. 3-8, 16-18) on the MobileNetV3-Small shared vector.

For m = 5, 20 and 100 clients, each holding a perturbed copy of MobileNetV3-Small's trainable parameters
(nhead = 0: about 1.5M values), this script times in one run:

- **vectorised**: ``federation.aggregation``: ``amp_coefficients`` (pairwise distances from one float64 Gram matrix
  streamed over value blocks) and ``mix`` (every ``z_i = sum_j xi_ij rho_j`` as one matrix product);
- **naive**: the pairwise double loop of a typical FedAMP server: for every client ``i`` and every other client
  ``j``, ``sub = rho_i - rho_j; d = dot(sub, sub)``, then ``z_i`` accumulated client by client.

Both compute the same ``xi`` (squared Euclidean distance, the paper's Eq. 4) and the same ``z``; the script checks
that they agree. The naive loop is measured on at most ``--naive-rows`` clients' rows and scaled to all ``m`` (each
row costs the same), which keeps m = 100 to a couple of minutes. It prints the figures and writes them, with the
command, to benchmarks/results/aggregation_speed.md.

    .venv/bin/python benchmarks/aggregation_speed.py
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks._common import command_line, machine, write_result  # noqa: E402
from federation.aggregation import amp_coefficients, mix  # noqa: E402
from models import create_model  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results" / "aggregation_speed.md"


def naive_aggregate(
    vectors: torch.Tensor, alpha_k: float, sigma: float, rows: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """xi and z for the first ``rows`` clients with a Python double loop over client pairs (what the vectorised
    code replaces). Each row costs the same, so the time for all ``m`` rows is ``m / rows`` times this."""
    m = vectors.shape[0]
    xi = torch.zeros(rows, m, dtype=torch.float64)
    z = torch.zeros(rows, vectors.shape[1], dtype=vectors.dtype)
    for i in range(rows):
        for j in range(m):
            if i != j:
                sub = vectors[i] - vectors[j]
                d = float(torch.dot(sub, sub))
                xi[i, j] = alpha_k * math.exp(-d / sigma) / sigma
        xi[i, i] = 1.0 - float(xi[i].sum())
        for j in range(m):
            z[i] += float(xi[i, j]) * vectors[j]
    return xi, z


def vectorised_aggregate(vectors: torch.Tensor, alpha_k: float, sigma: float) -> tuple[torch.Tensor, torch.Tensor]:
    xi = amp_coefficients(vectors, "euclidean", alpha_k, sigma)
    return xi, mix(vectors, xi)


Pair = tuple[torch.Tensor, torch.Tensor]


def timed(fn: Callable[[], Pair], repeats: int) -> tuple[float, Pair]:
    """Best wall time of ``repeats`` calls, and the last result."""
    best = math.inf
    for _ in range(repeats):
        start = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - start)
    return best, out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--clients", type=int, nargs="+", default=[5, 20, 100])
    parser.add_argument("--repeats", type=int, default=3, help="best of this many vectorised runs (naive: 1)")
    parser.add_argument(
        "--naive-rows",
        type=int,
        default=20,
        help="the naive loop computes at most this many clients' rows and is scaled up to all m (every row costs "
        "the same); keeps m=100 within minutes",
    )
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()

    torch.manual_seed(0)
    base = torch.cat([p.detach().reshape(-1) for p in create_model("mobilenet_v3_small").parameters()])
    d = base.numel()
    rows: list[tuple[int, float, float, float, float, float, int]] = []
    for m in args.clients:
        # Perturbations of std 1e-3 per value: squared distances ~ 2 d 1e-6 = 3; sigma = 3 keeps xi away from 0.
        vectors = base.unsqueeze(0) + 1e-3 * torch.randn(m, d)
        sigma = 3.0
        alpha_k = 0.5 * sigma / (m - 1)
        t_vec, (xi_v, z_v) = timed(partial(vectorised_aggregate, vectors, alpha_k, sigma), args.repeats)
        k = min(m, args.naive_rows)
        t_part, (xi_n, z_n) = timed(partial(naive_aggregate, vectors, alpha_k, sigma, k), 1)
        t_naive = t_part * m / k
        xi_err = float((xi_v[:k] - xi_n).abs().max())
        z_err = float((z_v[:k] - z_n).abs().max())
        rows.append((m, t_vec, t_naive, t_naive / t_vec, xi_err, z_err, k))
        print(
            f"m={m:4d}  vectorised {t_vec * 1000:9.1f} ms  naive {t_naive * 1000:10.1f} ms"
            f"{'' if k == m else f' (measured {k} of {m} rows, scaled)'}  "
            f"speed-up x{t_naive / t_vec:6.1f}  max|xi diff| {xi_err:.1e}  max|z diff| {z_err:.1e}",
            flush=True,
        )

    command = command_line("aggregation_speed.py")
    lines = [
        "# AMP aggregation time: vectorised vs naive pairwise loop",
        "",
        f"Command: `{command}`",
        "",
        f"{machine()}, torch {torch.__version__}, {torch.get_num_threads()} torch threads.",
        "",
        f"Shared vector: MobileNetV3-Small trainable parameters, nhead = 0, d = {d:,} float32 values per client; "
        "each client a perturbed copy (std 1e-3 per value). One aggregation = the AMP matrix xi (squared Euclidean "
        "distance, Eq. 4 and 16) and every intermediate model z_i (Eq. 18). Vectorised: best of "
        f"{args.repeats}; naive: one run, which for m > {args.naive_rows} computes only the first "
        f"{args.naive_rows} clients' rows of xi and z and is scaled by m / {args.naive_rows} (every row costs the "
        "same: m - 1 distances and m scaled additions).",
        "",
        "| clients m | vectorised (ms) | naive double loop (ms) | speed-up | max abs diff xi | max abs diff z |",
        "|---:|---:|---:|---:|---:|---:|",
    ]
    for m, t_vec, t_naive, ratio, xi_err, z_err, k in rows:
        note = "" if k == m else f" (measured {k} of {m} rows, x{m / k:g})"
        lines.append(
            f"| {m} | {t_vec * 1000:.1f} | {t_naive * 1000:.1f}{note} | x{ratio:.1f} | {xi_err:.1e} | {z_err:.1e} |"
        )
    lines += [
        "",
        "Both sides do O(m^2 d) arithmetic on float32 values. The vectorised side does it as two matrix products "
        "(the centred Gram matrix V V^T, from which every squared distance follows, and xi @ V for every z_i), "
        "which BLAS runs at full speed on all cores; the naive side as m(m-1) separate vector subtractions and dot "
        "products plus m^2 scaled additions, each a Python-level pass over d values in memory. The small "
        "differences in xi come from float32 rounding in the naive dot products of uncentred differences.",
        "",
    ]
    write_result(args.out, "\n".join(lines))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
