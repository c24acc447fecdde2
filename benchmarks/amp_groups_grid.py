"""AMP's within-group weight share over every FedSAF / FedAMP cell of an ablation grid (issue: the clustered regime).

For each cell (one method and setting, one seed) of ``ABLATION/cells/``, `federation.amp_groups.read_group_shares`
reads its ``aggregation.jsonl``: per round, the share of each hospital's weight on other hospitals (AMP's ``xi``,
FedSAF paper 001, Eq. 3-8) that stays within its own group, averaged over hospitals, against the share uniform weights
would give (chance). The table gives, per setting, the mean over seeds of that share at the first and the last round
and over all rounds, the chance level, and the paired difference last-round share minus chance over seeds with its
95% t interval and minimum detectable difference (`federation.ablation.paired`). Writes ``OUT.md`` and ``OUT.json``.

    .venv/bin/python benchmarks/amp_groups_grid.py ABLATION --groups A,A,A,B,B,B,C,C,C \
        --out benchmarks/results/amp_groups
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from federation.ablation.paired import paired_interval, paired_text  # noqa: E402
from federation.amp_groups import parse_groups, read_group_shares  # noqa: E402

CELL = re.compile(r"^(?P<setting>.+)_seed-(?P<seed>\d+)$")


def cell_shares(cell: Path, groups: dict[int, str]) -> dict[str, Any] | None:
    """First-round, last-round and all-round mean within-group share and the chance level of one run."""
    path = cell / "aggregation.jsonl"
    if not path.is_file() or not (cell / "summary.json").is_file():  # a run cut short has no summary
        return None
    rounds = [r for r in read_group_shares(path, groups).rounds if r.share.mean_within is not None]
    if not rounds:
        return None
    within = [float(r.share.mean_within) for r in rounds if r.share.mean_within is not None]
    return {
        "rounds": len(rounds),
        "first": within[0],
        "last": within[-1],
        "mean": sum(within) / len(within),
        "chance": rounds[-1].share.mean_chance,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("ablation", type=Path)
    parser.add_argument("--groups", required=True, help="each hospital's group, comma-separated in hospital order")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "amp_groups")
    args = parser.parse_args(argv)
    groups = parse_groups(args.groups)
    by_setting: dict[str, dict[int, dict[str, Any]]] = defaultdict(dict)
    for cell in sorted((args.ablation / "cells").iterdir()):
        match = CELL.match(cell.name)
        if not match or not any(m in match["setting"] for m in ("fedsaf", "fedamp")):
            continue
        shares = cell_shares(cell, groups)
        if shares is not None:
            by_setting[match["setting"]][int(match["seed"])] = shares
    if not by_setting:
        print(f"error: no FedSAF or FedAMP cell with aggregation.jsonl under {args.ablation / 'cells'}")
        return 2
    lines = [
        f"# AMP's weight within groups: {args.ablation.name}",
        "",
        f"Command: `.venv/bin/python benchmarks/amp_groups_grid.py {args.ablation} --groups {args.groups}` "
        "(numbers beside it in JSON). Per hospital, the share of its weight on the other hospitals (AMP's xi) that "
        "goes to its own group, averaged over hospitals; chance: the share uniform weights would give. Mean over "
        "seeds; last - chance: paired over seeds, 95% t interval, * where it excludes 0, MDD the smallest difference "
        "the seeds could detect (80% power).",
        "",
        "| setting | seeds | round 1 | last round | all rounds | chance | last - chance |",
        "|---|---|---|---|---|---|---|",
    ]
    record: dict[str, Any] = {}
    for setting, seeds in sorted(by_setting.items()):
        rows = [seeds[s] for s in sorted(seeds)]

        def avg(key: str, rows: list[dict[str, Any]] = rows) -> float:
            return sum(float(r[key]) for r in rows) / len(rows)

        gap = paired_text(paired_interval([float(r["last"]) - float(r["chance"]) for r in rows])) or "n/a"
        lines.append(
            f"| {setting} | {len(rows)} | {avg('first'):.3f} | {avg('last'):.3f} | {avg('mean'):.3f} | "
            f"{avg('chance'):.3f} | {gap} |"
        )
        record[setting] = seeds
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.with_suffix(".md").write_text("\n".join(lines) + "\n", encoding="utf-8")
    args.out.with_suffix(".json").write_text(json.dumps(record, indent=1) + "\n", encoding="utf-8")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
