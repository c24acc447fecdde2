"""Append "Where the runs were trained" to a published ablation's COMMAND.md, for grids whose cells were trained on
more than one machine (issue 30: some re-measured cells ran on a lent 16-core machine, the rest here).

A cell's machine is the one its ``summary.json`` names (``machines``, recorded by newer runs; ``gastric-fl ablate
--publish`` then names them itself); for runs trained before, it is told by where their dataset lay (``dataset``,
as the run saw it): each ``--machine PREFIX=DESCRIPTION`` names the machine of the cells whose dataset path starts
with PREFIX; the other cells were trained on this machine (``--here``). The section also names the commit each cell
was trained at (``code_versions``) when it differs from the one COMMAND.md names, and the dataset's sha256 (the
same on every machine, or the section says so).

    .venv/bin/python scripts/trained_where.py results/honest_tables456_label_skew \\
        --machine "/tmp/data/=a 16-core Intel Xeon machine (Python 3.12.3, torch 2.11.0, numpy 2.5.2, OpenCV 5.0.0)" \\
        --here "this 2-core AMD EPYC machine (Python 3.11.7, torch 2.15.0)"
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from federation.ablation import cells_folder

SECTION = "## Where the runs were trained"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("published", type=Path)
    parser.add_argument("--machine", action="append", default=[], help="PREFIX=DESCRIPTION")
    parser.add_argument("--here", required=True, help="the machine of every other cell")
    parser.add_argument("--note", default="", help="a sentence added at the end")
    args = parser.parse_args()
    command = args.published / "COMMAND.md"
    text = command.read_text(encoding="utf-8")
    if SECTION in text:
        sys.exit(f"{command} already has '{SECTION}': publish again to start from a fresh COMMAND.md")
    machines = [tuple(m.split("=", 1)) for m in args.machine]
    groups: dict[str, list[str]] = defaultdict(list)
    commits: dict[str, set[str]] = defaultdict(set)
    shas: set[str] = set()
    with cells_folder(args.published) as folder:  # its cells.tar.xz, or cells/ where unpacked
        summaries = {p.parent.name: json.loads(p.read_text(encoding="utf-8")) for p in folder.glob("*/summary.json")}
    if not summaries:
        sys.exit(f"{args.published} has no cells/*/summary.json (in cells.tar.xz or cells/)")
    cells = sorted(summaries)
    for name in cells:
        summary = summaries[name]
        where = next((d for prefix, d in machines if str(summary["dataset"]).startswith(prefix)), args.here)
        if summary.get("machines"):  # a run that names its machine (federation.provenance.machine) says it itself
            where = " then ".join(summary["machines"])
        groups[where].append(name)
        commits[where].update(summary.get("code_versions") or [])
        shas.add(str(summary.get("dataset_sha256")))
    lines = ["", SECTION, ""]
    for where, names in groups.items():
        at = ", ".join(f"`{c}`" for c in sorted(commits[where]))
        lines.append(
            f"{len(names)} of the {len(cells)} runs were trained on {where}, at {at}: "
            + ", ".join(f"`{n}`" for n in names)
            + "."
        )
        lines.append("")
    same = "the same on every machine" if len(shas) == 1 else "NOT the same on every machine"
    lines.append(
        f"The dataset's manifest.csv sha256 ({', '.join(sorted(s[:12] + '...' for s in shas))}) is {same}; each "
        "machine made it by the same commands. The same seed on two machines need not give the same figures bit for "
        'bit (other CPUs and torch builds); each run is deterministic on its own machine. "+ changes": the working '
        "tree held uncommitted edits when the run started." + (f" {args.note}" if args.note else "")
    )
    command.write_text(text.rstrip("\n") + "\n" + "\n".join(lines) + "\n", encoding="utf-8")
    print(f"written: {command}")


if __name__ == "__main__":
    main()
