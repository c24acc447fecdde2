"""Every published table measured on masked tiles against its re-measurement on raw tissue, paired over seeds.

Each pair is two folders under ``results/`` holding the same ablation grid (the same cells, slides and seeds):
the *masked* one, trained on datasets whose every abnormal tile, test included, was whitened outside the cancer mask
(paper 001, Step a.1; kept as a record), and the *raw* one, every tile cut from raw tissue (docs/pipeline.md,
"Honest evaluation"):

- the methods tables: ``methods_<regime>/`` and ``honest_methods_<regime>/`` (configs/honest_methods_<regime>.toml);
- Tables 4-6: ``tables456_<regime>/`` and ``honest_tables456_<regime>/`` (configs/tables456_<regime>.toml on the
  regime's raw dataset);
- the fairness settings: ``fairness/`` and ``honest_fairness/`` (configs/ablation_fairness.toml);
- the privacy trade-off: ``privacy/<arm>/`` and ``honest_privacy/<arm>/`` (scripts/privacy_tradeoff.sh).

For every setting (a cell without its seed) present in both, the last round's averaged test accuracy and AUC (mean
over hospitals, from each cell's ``metrics.jsonl``) on masked and on raw tiles and the paired change raw - masked
(`federation.ablation.paired_interval`: mean and 95% t interval, ``*`` when it excludes 0, and the minimum
detectable difference at 80% power); for the methods tables
also each method against Separate on each, which method is best, and FedSAF against every other method. Nothing is
trained.

    .venv/bin/python scripts/honest_compare.py --out results/honest_evaluation/tables.md
"""

from __future__ import annotations

import argparse
import math
import re
import statistics
import sys
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from federation.ablation import cells_folder, paired_interval, paired_text  # noqa: E402
from federation.runfiles import read_metrics  # noqa: E402

REGIMES = ("data_poor", "site_shift", "label_skew", "seed_like")
PRIVACY_ARMS = ("none_plain", "none_head", "dp_plain", "dp_head")
SEED = re.compile(r"^(?P<setting>.+)_seed-(?P<seed>\d+)$")
Figures = dict[str, dict[int, dict[str, float]]]  # setting -> seed -> {"acc": ..., "auc": ...}


def last_round(cell: Path) -> dict[str, float] | None:
    """Averaged test accuracy and AUC over hospitals at the cell's last round (``None`` without metrics)."""
    records = read_metrics(cell / "metrics.jsonl").records
    if not records:
        return None
    final = max(r["round"] for r in records)
    rows = [r for r in records if r["round"] == final]
    accs = [float(r["test_acc"]) for r in rows if r["test_acc"] is not None]
    aucs = [float(r["test_auc"]) for r in rows if r["test_auc"] is not None]
    return {
        "acc": statistics.fmean(accs) if accs else math.nan,
        "auc": statistics.fmean(aucs) if aucs else math.nan,
    }


def figures(folder: Path) -> Figures:
    """Every finished cell of a published ablation folder (its ``cells.tar.xz``, or ``cells/`` where unpacked), by
    setting and seed."""
    out: Figures = {}
    with cells_folder(folder) as cells:
        for cell in sorted(cells.glob("*")):
            match = SEED.match(cell.name)
            found = last_round(cell) if match else None
            if match and found is not None:
                out.setdefault(match["setting"], {})[int(match["seed"])] = found
    return out


def shown(setting: str) -> str:
    """A setting as its cell folder names it, without the leading ``strategy-``: ``fedsaf_fim-on_split-off``."""
    return setting.removeprefix("strategy-")


def paired(values: list[float]) -> str:
    return paired_text(paired_interval(values)) or "n/a"


def mean(found: dict[int, dict[str, float]], key: str, seeds: list[int]) -> float:
    return statistics.fmean(found[s][key] for s in seeds)


def pair_rows(
    old: Figures, new: Figures, key: str, label: str, reference: str | None = None, keep: Callable[[str], bool] = bool
) -> list[str]:
    """One Markdown row per setting in both: masked mean, raw mean, paired raw - masked, and (with ``reference``)
    the setting against the reference setting on masked and on raw tiles, over the seeds all four share."""
    rows = []
    for setting in sorted(new, key=lambda s: (s != reference, s)):
        if setting not in old or not keep(setting):
            continue
        seeds = sorted(old[setting].keys() & new[setting].keys())
        if not seeds:
            continue
        delta = [new[setting][s][key] - old[setting][s][key] for s in seeds]
        cells = [label, shown(setting), str(len(seeds)), f"{mean(old[setting], key, seeds):.3f}"]
        cells += [f"{mean(new[setting], key, seeds):.3f}", paired(delta)]
        if reference is not None:
            if setting == reference or reference not in old or reference not in new:
                cells += ["", ""]
            else:
                both = [s for s in seeds if s in old[reference] and s in new[reference]]
                cells.append(paired([old[setting][s][key] - old[reference][s][key] for s in both]))
                cells.append(paired([new[setting][s][key] - new[reference][s][key] for s in both]))
        rows.append("| " + " | ".join(cells) + " |")
    return rows


def best_and_fedsaf(regime: str, kind: str, found: Figures) -> str:
    """Which method is best (mean over its seeds) and FedSAF's paired difference to each other plain method."""
    plain = {s: v for s, v in found.items() if "_" not in s.removeprefix("strategy-")}
    means = {s: statistics.fmean(v[x]["acc"] for x in v) for s, v in plain.items() if v}
    top = max(means, key=lambda s: means[s])
    fedsaf = plain.get("strategy-fedsaf", {})
    cells = []
    for other in sorted(plain):
        if other == "strategy-fedsaf":
            continue
        seeds = sorted(fedsaf.keys() & plain[other].keys())
        cells.append(f"{shown(other)} {paired([fedsaf[s]['acc'] - plain[other][s]['acc'] for s in seeds])}")
    return f"| {regime} | {kind} | {shown(top)} ({means[top]:.3f}) | " + "; ".join(cells) + " |"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--results", type=Path, default=ROOT / "results")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    res = args.results
    lines = ["# Published (masked tiles) against re-measured (raw tissue): the same cells, slides and seeds", ""]
    lines += [
        "Command: `.venv/bin/python scripts/honest_compare.py --out results/honest_evaluation/tables.md`. "
        "Last-round figures averaged over hospitals, each on its own test split; *masked*: the published folder "
        "(every abnormal tile whitened outside the mask, test tiles too); *raw*: its `honest_` twin (every tile "
        "raw). Means over the seeds present in both (*n*). Δ and the comparisons are paired over seeds: mean [95% t "
        "interval], `*` when the interval excludes 0, (MDD m): the smallest true difference these seeds find with 80% "
        "power at alpha 0.05 (minimum detectable difference, docs/ablations.md).",
        "",
    ]
    header = "| regime | setting | n | masked | raw | Δ raw - masked |"
    rule = "|---|---|---|---|---|---|"
    methods = {r: (figures(res / f"methods_{r}"), figures(res / f"honest_methods_{r}")) for r in REGIMES}
    methods = {r: pair for r, pair in methods.items() if pair[1]}
    for key, name in (("acc", "accuracy"), ("auc", "AUC")):
        lines += [f"## Methods: averaged test {name}", ""]
        lines += [header + " vs Separate, masked | vs Separate, raw |", rule + "---|---|"]
        for regime, (old, new) in methods.items():
            lines += pair_rows(old, new, key, regime, reference="strategy-separate")
        lines.append("")
    lines += ["## Methods: which is best, and FedSAF against each (accuracy)", ""]
    lines += ["| regime | tiles | best (mean) | FedSAF - each other method |", "|---|---|---|---|"]
    for regime, (old, new) in methods.items():
        lines += [best_and_fedsaf(regime, "masked", old), best_and_fedsaf(regime, "raw", new)]
    lines.append("")
    # FedSAF's defaults in the Tables 4-6 grids (FIM on, split on, manhattan, nhead 6: one run, shared by the cells)
    defaults = "strategy-fedsaf_fim-on_split-on"
    groups: list[tuple[str, Path, Path, str, str | None]] = [
        (f"Tables 4-6 ({regime})", res / f"tables456_{regime}", res / f"honest_tables456_{regime}", regime, defaults)
        for regime in REGIMES
    ]
    groups.append(("Fairness settings (site_shift)", res / "fairness", res / "honest_fairness", "site_shift", None))
    groups += [
        (f"Privacy trade-off ({arm})", res / "privacy" / arm, res / "honest_privacy" / arm, arm, None)
        for arm in PRIVACY_ARMS
    ]
    for title, masked, raw, label, reference in groups:
        old, new = figures(masked), figures(raw)
        if not new:
            continue
        extra = (" vs FedSAF's defaults, masked | vs FedSAF's defaults, raw |", "---|---|") if reference else ("", "")
        for key, name in (("acc", "accuracy"), ("auc", "AUC")):
            lines += [f"## {title}: averaged test {name}", "", header + extra[0], rule + extra[1]]
            lines += pair_rows(old, new, key, label, reference=reference)
            lines.append("")
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text)


if __name__ == "__main__":
    main()
