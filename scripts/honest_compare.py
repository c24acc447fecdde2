"""The published methods tables (masked tiles) against their re-measurement on raw tissue, paired over seeds.

For each regime with both ``docs/results/methods_<regime>/`` (trained on datasets whose every abnormal tile, test
included, was whitened outside the cancer mask) and ``docs/results/honest_methods_<regime>/`` (the same slides,
every tile raw: configs/honest_methods_<regime>.toml): for each method and seed present in both, the last round's
averaged test accuracy and AUC (mean over hospitals, from each cell's ``metrics.jsonl``). It prints and writes
(``--out``) one table per figure: each method's mean on masked and on raw tiles, the paired change raw - masked
with its 95% t interval, and the key comparisons (FedSAF - Separate, FedSAF - FedAvg, FedSAF - FedRep, best method)
on each. Nothing is trained.

    .venv/bin/python scripts/honest_compare.py --out docs/results/honest_evaluation/tables.md
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
METHODS = ("separate", "fedavg", "fedrep", "fedamp", "fedsaf")
REGIMES = ("data_poor", "site_shift", "label_skew", "seed_like")
# two-sided 95% t quantiles by degrees of freedom
T975 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776}


def last_round(cell: Path) -> dict[str, float] | None:
    """Averaged test accuracy and AUC over hospitals at the cell's last round (``None`` if it has no metrics)."""
    path = cell / "metrics.jsonl"
    if not path.is_file():
        return None
    lines = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    final = max(line["round"] for line in lines)
    rows = [line for line in lines if line["round"] == final]
    aucs = [r["test_auc"] for r in rows if r["test_auc"] is not None]
    return {
        "acc": statistics.fmean(r["test_acc"] for r in rows),
        "auc": statistics.fmean(aucs) if aucs else math.nan,
    }


def figures(folder: Path) -> dict[tuple[str, int], dict[str, float]]:
    out = {}
    for method in METHODS:
        for seed in range(10):
            found = last_round(folder / "cells" / f"strategy-{method}_seed-{seed}")
            if found is not None:
                out[(method, seed)] = found
    return out


def paired(values: list[float]) -> str:
    """Mean [95% t interval] of paired differences; ``*`` when the interval excludes 0."""
    if not values:
        return "n/a"
    mean = statistics.fmean(values)
    if len(values) < 2:
        return f"{mean:+.3f}"
    half = T975[len(values) - 1] * statistics.stdev(values) / math.sqrt(len(values))
    star = " *" if mean - half > 0 or mean + half < 0 else ""
    return f"{mean:+.3f} [{mean - half:+.3f}, {mean + half:+.3f}]{star}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--results", type=Path, default=ROOT / "docs" / "results")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    lines = ["# Published (masked tiles) against re-measured (raw tissue), same methods, slides and seeds", ""]
    lines += [
        "Command: `.venv/bin/python scripts/honest_compare.py --out docs/results/honest_evaluation/tables.md`. "
        "Last-round figures averaged over hospitals, each on its own test split; *masked*: "
        "`docs/results/methods_<regime>/` (every abnormal tile whitened outside the mask, test tiles too); *raw*: "
        "`docs/results/honest_methods_<regime>/` (every tile raw). Seeds present in both (0-2). Δ: paired over "
        "seeds, mean [95% t interval], `*` when it excludes 0.",
        "",
    ]
    # per regime with a re-measurement: (published masked figures, raw figures)
    loaded = {
        regime: (figures(args.results / f"methods_{regime}"), new)
        for regime in REGIMES
        if (new := figures(args.results / f"honest_methods_{regime}"))
    }
    for key, name in (("acc", "accuracy"), ("auc", "AUC")):
        lines += [
            f"## Averaged test {name}",
            "",
            "| regime | method | masked | raw | Δ raw - masked | vs Separate, masked | vs Separate, raw |",
            "|---|---|---|---|---|---|---|",
        ]
        for regime, (old, new) in loaded.items():
            for method in METHODS:
                seeds = sorted(s for (m, s) in new if m == method and (m, s) in old)
                if not seeds:
                    continue
                masked = [old[(method, s)][key] for s in seeds]
                raw = [new[(method, s)][key] for s in seeds]
                ref = [s for s in seeds if ("separate", s) in old and ("separate", s) in new]
                vs_old = [old[(method, s)][key] - old[("separate", s)][key] for s in ref]
                vs_new = [new[(method, s)][key] - new[("separate", s)][key] for s in ref]
                lines.append(
                    f"| {regime} | {method} | {statistics.fmean(masked):.3f} | {statistics.fmean(raw):.3f} | "
                    f"{paired([b - a for a, b in zip(masked, raw, strict=True)])} | "
                    f"{'' if method == 'separate' else paired(vs_old)} | "
                    f"{'' if method == 'separate' else paired(vs_new)} |"
                )
        lines.append("")
    lines += [
        "## Which method is best, and FedSAF against each (averaged test accuracy, seeds 0-2)",
        "",
        "| regime | tiles | best | FedSAF - Separate | FedSAF - FedAvg | FedSAF - FedRep | FedSAF - FedAMP |",
        "|---|---|---|---|---|---|---|",
    ]
    for regime, (old, new) in loaded.items():
        for kind, found in (("masked", old), ("raw", new)):
            means = {
                m: statistics.fmean(found[(m, s)]["acc"] for s in range(3) if (m, s) in found)
                for m in METHODS
                if any((m, s) in found for s in range(3))
            }
            top = max(means, key=lambda m: means[m])
            cells = []
            for other in ("separate", "fedavg", "fedrep", "fedamp"):
                seeds = [s for s in range(3) if ("fedsaf", s) in found and (other, s) in found]
                cells.append(paired([found[("fedsaf", s)]["acc"] - found[(other, s)]["acc"] for s in seeds]))
            lines.append(f"| {regime} | {kind} | {top} ({means[top]:.3f}) | " + " | ".join(cells) + " |")
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text)


if __name__ == "__main__":
    main()
