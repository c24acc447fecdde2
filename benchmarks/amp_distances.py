"""Real AMP distances d_ij on the benchmark preset, and how much collaboration each setting of [amp] gives.

FedSAF's attentive weights (paper 001, Eq. 3-8 and 16) are ``xi_ij = alpha_k exp(-d_ij / sigma) / sigma``. With a
shared vector of 10^5-10^6 values, raw distances can be so large against ``sigma`` that every off-diagonal
weight underflows and AMP silently becomes local training. This script measures the distances the server
really sees:

1. it trains the hospitals of the preset (``configs/benchmark.toml`` by default) *alone* (strategy ``separate``)
   for ``--rounds`` rounds from the common initial model, keeping every round's checkpoint;
2. for each round, each ``nhead`` and each ``dm``, it computes ``d_ij`` between the clients' shared trainable
   parameters, raw (the paper) and rescaled (``amp.scale = per_value`` / ``relative``);
3. it reports the mean off-diagonal weight ``sum_{j != i} xi_ij`` (averaged over clients) that several
   ``[amp]`` settings give on those distances, including the defaults.

Local-only training is the upper end of what AMP sees (AMP and the proximal pull keep clients closer), so a
setting that collaborates here collaborates in a federation too. Figures are printed and written, with the
command, to benchmarks/results/amp_distances.md.

    .venv/bin/python benchmarks/amp_distances.py --config configs/benchmark.toml --rounds 2
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from safetensors.torch import load_file  # noqa: E402

from benchmarks._common import command_line, machine, write_result  # noqa: E402
from federation.ablation import cell_status  # noqa: E402
from federation.config import load_config, with_values  # noqa: E402
from federation.derived import NUM_CLASSES  # noqa: E402
from federation.errors import FederationError  # noqa: E402
from federation.launch import train  # noqa: E402
from federation.strategies.amp import (  # noqa: E402
    METRICS,
    amp_coefficients,
    off_diagonal_mass,
    pairwise_distances,
)
from federation.strategies.flat import FlatSpec, flatten  # noqa: E402
from models import base_keys, create_model, split_units  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results" / "amp_distances.md"
NHEADS = (0, 3, 6, 9, 12)

# (label, alpha_k, sigma, scale) for 5 clients; "defaults" is read from the configuration defaults.
SETTINGS: tuple[tuple[str, float, float, str], ...] = (
    ("alpha 0.02, sigma 0.1, raw", 0.02, 0.1, "raw"),
    ("alpha 0.25, sigma 1, raw", 0.25, 1.0, "raw"),
    ("alpha 25, sigma 100, raw", 25.0, 100.0, "raw"),
    ("alpha 1e-5, sigma 1e-4, per_value", 1e-5, 1e-4, "per_value"),
    ("alpha 0.2, sigma 1, relative", 0.2, 1.0, "relative"),
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", type=Path, default=ROOT / "configs" / "benchmark.toml")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument(
        "--run-dir",
        type=Path,
        default=None,
        help="keep the local-training run here and reuse it when it is already finished (default: a temp folder)",
    )
    args = parser.parse_args()

    config = load_config(args.config)
    config = with_values(config, "strategy", name="separate", nhead=0)
    config = with_values(config, "run", rounds=args.rounds, keep_checkpoints=args.rounds)
    defaults = load_config(None).amp
    settings = (
        *SETTINGS,
        (
            f"defaults: alpha {defaults.alpha_k:g}, sigma {defaults.sigma:g}, {defaults.scale}",
            defaults.alpha_k,
            defaults.sigma,
            defaults.scale,
        ),
    )

    model = create_model(config.model.name, NUM_CLASSES, config.model.in_chans)
    units = split_units(model)
    params = {n for n, _ in model.named_parameters()}
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="amp_distances_") as tmp:
        run_dir = args.run_dir if args.run_dir is not None else Path(tmp) / "run"
        reused = cell_status(run_dir) == "finished"
        if not reused:
            train(config, run_dir, progress=False, overwrite=True)
        train_seconds = time.perf_counter() - start
        # each hospital's whole model after each round, from the hospitals' own folders in the run
        folders = sorted((run_dir / "hospitals").glob("client_*"))
        checkpoints = {
            r: {
                int(f.name.removeprefix("client_")): load_file(str(f / "checkpoints" / f"round_{r:04d}.safetensors"))
                for f in folders
            }
            for r in range(1, args.rounds + 1)
        }

    distance_rows: list[str] = []
    mass_rows: list[str] = []
    for server_round, checkpoint in checkpoints.items():
        clients = sorted(checkpoint)
        states = [checkpoint[c] for c in clients]
        m = len(clients)
        for nhead in NHEADS:
            keys = [k for k in base_keys(units, nhead) if k in params]
            spec = FlatSpec.of(states[0], keys)
            vectors = flatten(states, spec)
            off = ~torch.eye(m, dtype=torch.bool)
            for metric in METRICS:
                raw = pairwise_distances(vectors, metric)[off]
                per_value = pairwise_distances(vectors, metric, scale="per_value")[off]
                relative = pairwise_distances(vectors, metric, scale="relative")[off]
                distance_rows.append(
                    f"| {server_round} | {nhead} | {spec.numel:,} | {metric} | {raw.min():.4g} | "
                    f"{raw.median():.4g} | {raw.max():.4g} | {per_value.median():.4g} | "
                    f"{relative.min():.3g} - {relative.max():.3g} |"
                )
                masses = []
                for _, alpha_k, sigma, scale in settings:
                    try:
                        xi = amp_coefficients(vectors, metric, alpha_k, sigma, scale=scale)
                    except FederationError:
                        masses.append("rejected")
                        continue
                    weights = xi[off]
                    spread = float(weights.max() / weights.min()) if float(weights.min()) > 0 else float("inf")
                    masses.append(f"{off_diagonal_mass(xi):.3g} (x{spread:.3g})")
                mass_rows.append(f"| {server_round} | {nhead} | {metric} | " + " | ".join(masses) + " |")
        print(f"round {server_round}: {m} clients, distances measured", flush=True)

    command = command_line("amp_distances.py")
    lines = [
        "# AMP distances on the benchmark preset, and the collaboration they allow",
        "",
        f"Command: `{command}`",
        "",
        f"{machine()}, torch {torch.__version__}. "
        f"Preset: `{args.config.relative_to(ROOT) if args.config.is_relative_to(ROOT) else args.config}` "
        f"({config.model.name}, input {config.data.input_size} px, {len(checkpoints[1])} clients, "
        f"client lr {config.client.lr}, momentum {config.client.momentum}, {config.client.epochs} epoch(s) per "
        f"round); the hospitals trained alone (strategy separate) for {args.rounds} round(s) from the common "
        f"initial model{'' if reused else f' in {train_seconds:.0f} s'}, then the distances between their "
        "trainable parameters were computed for each nhead (the shared part: every layer unit but the last nhead).",
        "",
        "## Distances d_ij between clients (off-diagonal pairs)",
        "",
        "raw = as the paper (euclidean: squared L2; manhattan: L1; cosine: the similarity itself; cosine_distance: "
        "1 - similarity); per value = raw / number of values (euclidean and manhattan only); relative = raw / mean "
        "off-diagonal raw distance of the round.",
        "",
        "| round | nhead | shared values | dm | raw min | raw median | raw max | per value median | relative range |",
        "|---:|---:|---:|---|---:|---:|---:|---:|---|",
        *distance_rows,
        "",
        "## Collaboration each [amp] setting gives on these distances",
        "",
        "Each cell: the mean over clients of the weight given to the other clients, sum_{j != i} xi_ij "
        "(0 = local training only; the self-weight is 1 minus this), and in brackets the ratio of the largest to "
        "the smallest off-diagonal weight (x1 = every peer weighted alike, i.e. no attention; inf = some weight "
        "is exactly 0). 'rejected': the strategies refuse the setting because a self-weight could go negative "
        "(alpha_k (m-1) > sigma; for the literal cosine similarity, which can reach -1, alpha_k (m-1) e^(1/sigma) > "
        "sigma).",
        "",
        "| round | nhead | dm | " + " | ".join(label for label, *_ in settings) + " |",
        "|---:|---:|---|" + "---|" * len(settings),
        *mass_rows,
        "",
    ]
    write_result(args.out, "\n".join(lines))
    print("\n".join(lines))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
