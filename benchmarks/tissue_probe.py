"""The shortcut probe on every regime's raw tiles, for the classic tissue and the gastric mixture (issue: tissue a
model must read). Each regime's dataset is made with the `gastric-fl synth` and `gastric-fl prepare` commands in
the comment at the top of its preset (``configs/regime_<name>.toml``, the one source of those commands), once with
``--tissue classic`` (the tissue before the gastric patterns) and once as written (the default mixture), into a
work folder; the probe's record (``prepare.json["shortcut_probe"]``, `pipeline.probe`) gives each statistic's AUC
per split. Writes ``benchmarks/results/tissue_probe.md`` and ``.json``.

    .venv/bin/python benchmarks/tissue_probe.py [--regimes seed_like,label_skew,...] [--work /tmp/tissue_probe]
        [--keep-paths]   # the gastric datasets where the presets read them: data/raw/<regime>, data/prepared/<regime>
"""

from __future__ import annotations

import argparse
import json
import shlex
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
REGIMES = ("seed_like", "label_skew", "site_shift", "data_poor", "clustered")
TISSUES = ("classic", "gastric")
LIMIT = 0.70


def preset_commands(regime: str) -> list[list[str]]:
    """The ``gastric-fl synth`` and ``gastric-fl prepare`` commands of a regime's preset comment, as argument lists
    (continuation lines joined)."""
    lines = (ROOT / "configs" / f"regime_{regime}.toml").read_text(encoding="utf-8").splitlines()
    commands: list[str] = []
    current = ""
    for line in lines:
        if not line.startswith("#"):
            break
        text = line.lstrip("#").strip()
        if current:
            current += " " + text.rstrip("\\").strip()
        elif text.startswith(("gastric-fl synth", "gastric-fl prepare")):
            current = text.rstrip("\\").strip()
        else:
            continue
        if not text.endswith("\\"):
            commands.append(current)
            current = ""
    found = [shlex.split(c) for c in commands]
    kinds = [c[1] for c in found]
    if kinds != ["synth", "prepare"]:
        raise SystemExit(f"configs/regime_{regime}.toml: expected one synth and one prepare command, found {kinds}")
    return found


def _retarget(args: list[str], work: Path | None, tissue: str) -> list[str]:
    """Point data/raw/X and data/prepared/X at the work folder (``work`` None: keep the preset's own paths under the
    repository), and name the tissue for synth."""
    out = []
    for a in args:
        for prefix in ("data/raw/", "data/prepared/"):
            if a.startswith(prefix):
                a = str(ROOT / a if work is None else work / tissue / a.replace("/", "_"))
        out.append(a)
    out[0] = str(ROOT / ".venv" / "bin" / "gastric-fl")
    if out[1] == "synth":
        out += ["--tissue", tissue, "--overwrite", "--workers", "2"]
    else:
        out += ["--overwrite"]
        out = [str(ROOT / a) if a.startswith("configs/") else a for a in out]
    return out


def measure(regime: str, tissue: str, work: Path | None) -> dict[str, Any]:
    """Make one regime's dataset with one tissue and return its probe record and the time it took."""
    start = time.perf_counter()
    prepared = None
    for command in preset_commands(regime):
        args = _retarget(command, work, tissue)
        subprocess.run(args, check=True, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        if command[1] == "prepare":
            prepared = Path(args[args.index("--out") + 1])
    assert prepared is not None
    seconds = round(time.perf_counter() - start, 1)
    whole = json.loads((prepared / "prepare.json").read_text(encoding="utf-8"))
    record = whole["shortcut_probe"]
    mix = None
    worst = record.get("worst")
    if worst is not None and worst["auc"] > LIMIT:
        mix = hospital_mix(prepared, worst["statistic"], worst["split"], int(whole["config"]["tiles"]["white_level"]))
    return {"probe": record, "seconds": seconds, "hospital_mix": mix}


def hospital_mix(prepared: Path, statistic: str, split: str, white_level: int) -> list[dict[str, Any]]:
    """Per hospital, for one split: its tiles, its share of abnormal tiles, the mean of ``statistic`` over its normal
    and its abnormal tiles, and the statistic's AUC within the hospital: where a pooled AUC comes from when hospitals
    differ both in the statistic and in case mix."""
    import numpy as np

    from pipeline.probe import STATISTICS, prepared_statistics, separation_auc

    k = STATISTICS.index(statistic)
    rows, stats = prepared_statistics(prepared, white_level, split)
    by_hospital: dict[int, list[tuple[int, float]]] = {}
    for row, tile in zip(rows, stats, strict=True):
        by_hospital.setdefault(int(row["client"]), []).append((int(row["label"] != "normal"), tile[k]))
    out = []
    for hospital, pairs in sorted(by_hospital.items()):
        labels = np.array([p[0] for p in pairs])
        values = np.array([p[1] for p in pairs])
        out.append(
            {
                "hospital": hospital,
                "tiles": len(pairs),
                "abnormal_share": round(float(labels.mean()), 3),
                "mean_normal": round(float(values[labels == 0].mean()), 5) if (labels == 0).any() else None,
                "mean_abnormal": round(float(values[labels == 1].mean()), 5) if (labels == 1).any() else None,
                "auc_within": None if (auc := separation_auc(values, labels)) is None else round(auc, 3),
            }
        )
    return out


def _cell(value: float | None) -> str:
    return "n/a" if value is None else (f"**{value:.3f}**" if value > LIMIT else f"{value:.3f}")


def _worst(record: dict[str, Any], key: str) -> str:
    w = record.get(key)
    return "n/a" if not w else f"{w['statistic']} {_cell(w['auc'])} ({w['split']})"


def _chance(record: dict[str, Any]) -> str:
    """The chance test (`pipeline.probe.chance_within`) of the split where the worst within-hospital statistic is:
    what shuffling that split's slides' labels gives in 5% of shuffles, the slides, and the p-value."""
    worst = record.get("worst_within")
    chance = (record.get("chance") or {}).get(worst["split"]) if worst else None
    if not chance:
        return "n/a"
    return f"{chance['chance_95']:.3f} ({chance['slides']} slides), p = {chance['p_value']:.3f}"


def markdown(results: dict[str, dict[str, dict[str, Any]]]) -> str:
    """A summary (the worst statistic per regime and tissue, pooled and within hospitals), then one table per regime:
    each statistic's AUC per split and tissue, pooled over hospitals and within them."""
    out = [
        "# The shortcut probe on every regime's raw tiles: classic tissue against the gastric mixture",
        "",
        "Command: `.venv/bin/python benchmarks/tissue_probe.py` (numbers: `tissue_probe.json`). Each regime's "
        "dataset is made with its preset's own synth and prepare commands (`configs/regime_<name>.toml`), once with "
        "`--tissue classic` (the tissue before the gastric patterns) and once with the default gastric mixture. "
        "Each cell: a label-free statistic's AUC as a score for the label, `max(AUC, 1 - AUC)` (0.5 = tells "
        f"nothing); **bold** above {LIMIT:.2f}, where prepare warns. *Pooled*: all hospitals' tiles of a split "
        "together; *within*: only pairs of tiles of one hospital (`pipeline.probe.within_auc`), which leaves out "
        "what hospitals differing in stain and case mix together give a shared model. *Chance*: the tiles of a "
        "slide share its label, so a split's AUC rests on its slides; shuffling the slides' labels within each "
        "hospital 999 times (`pipeline.probe.chance_within`) gives the worst statistic's AUC that chance alone "
        "exceeds in 5% of shuffles on the split of the gastric within figure, and the p-value of that figure.",
        "",
        "| regime | classic, pooled | classic, within | gastric, pooled | gastric, within | gastric within: chance | "
        "minutes |",
        "|---|---|---|---|---|---|---|",
    ]
    for regime, by_tissue in results.items():
        cells = []
        for tissue in TISSUES:
            record = by_tissue.get(tissue, {}).get("probe", {})
            cells += [_worst(record, "worst"), _worst(record, "worst_within")]
        cells.append(_chance(by_tissue.get("gastric", {}).get("probe", {})))
        minutes = sum(v["seconds"] for v in by_tissue.values()) / 60
        out.append(f"| {regime} | " + " | ".join(cells) + f" | {minutes:.1f} |")
    for regime, by_tissue in results.items():
        tissues = [t for t in TISSUES if t in by_tissue]
        first = by_tissue[tissues[-1]]["probe"]
        splits = list(first["splits"])
        columns = [(t, s, kind) for s in splits for t in tissues for kind in ("splits", "within_hospitals")]
        head = " | ".join(
            f"{s} {t} {'pooled' if k == 'splits' else 'within'} ({by_tissue[t]['probe']['splits'][s]['tiles']})"
            for t, s, k in columns
        )
        out += ["", f"## {regime}", "", f"| statistic | {head} |", "|---|" + "---|" * len(columns)]
        for name in first["statistics"]:
            row = [by_tissue[t]["probe"].get(k, {}).get(s, {}).get(name) for t, s, k in columns]
            out.append(f"| {name} | " + " | ".join(_cell(v) for v in row) + " |")
        mix = by_tissue.get("gastric", {}).get("hospital_mix")
        if mix:
            worst = by_tissue["gastric"]["probe"]["worst"]
            out += [
                "",
                f"Where the gastric tissue's pooled {worst['statistic']} ({worst['auc']:.3f}, {worst['split']}) comes "
                "from: per hospital, its share of abnormal tiles and the statistic's mean over its normal and its "
                "abnormal tiles. When the hospitals with more abnormal tiles also differ in the statistic (their "
                "stain or scanner), pooling separates the classes although no hospital's own tiles do (AUC within).",
                "",
                "| hospital | tiles | abnormal share | mean, normal | mean, abnormal | AUC within |",
                "|---|---|---|---|---|---|",
            ]
            for h in mix:
                cells = [h["mean_normal"], h["mean_abnormal"], h["auc_within"]]
                shown = ["n/a" if v is None else f"{v:.4g}" for v in cells]
                head = f"| {h['hospital']} | {h['tiles']} | {h['abnormal_share']:.3f} | "
                out.append(head + " | ".join(shown) + " |")
    return "\n".join(out) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--regimes", default=",".join(REGIMES))
    parser.add_argument("--tissues", default=",".join(TISSUES))
    parser.add_argument("--work", type=Path, default=Path("/tmp/tissue_probe"))
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "tissue_probe")
    parser.add_argument(
        "--keep-paths",
        action="store_true",
        help="write the gastric datasets to the presets' own data/raw/<regime> and data/prepared/<regime> (what "
        "the regime presets and ablation grids train on), the classic ones to --work",
    )
    args = parser.parse_args(argv)
    regimes = [r for r in args.regimes.split(",") if r]
    tissues = [t for t in args.tissues.split(",") if t]
    unknown = [r for r in regimes if r not in REGIMES] + [t for t in tissues if t not in TISSUES]
    if unknown or not regimes or not tissues:
        print(f"error: unknown regime or tissue {unknown}: use {', '.join(REGIMES)}; {', '.join(TISSUES)}")
        return 2
    results: dict[str, dict[str, dict[str, Any]]] = {}
    for regime in regimes:
        for tissue in tissues:
            work = None if args.keep_paths and tissue == "gastric" else args.work
            results.setdefault(regime, {})[tissue] = measure(regime, tissue, work)
            record = results[regime][tissue]["probe"]
            print(
                f"{regime} {tissue}: worst {_worst(record, 'worst')}, within {_worst(record, 'worst_within')}",
                flush=True,
            )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.with_suffix(".json").write_text(json.dumps(results, indent=1) + "\n", encoding="utf-8")
    args.out.with_suffix(".md").write_text(markdown(results), encoding="utf-8")
    print(f"wrote {args.out.with_suffix('.md')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
