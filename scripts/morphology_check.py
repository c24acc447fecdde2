"""Is there morphology to learn in the synthetic tissue, beyond brightness and colour? (issue 30, item 5)

On raw synthetic tiles the carcinoma is darker on average than normal mucosa (crowded, enlarged, hyperchromatic
nuclei; fewer pale lumens), so the mean intensity alone separates the classes (the shortcut probe says so). That is
partly the disease itself, but a model could then score well by brightness alone. This check takes a raw prepared
dataset and writes a copy in which every tile is *flattened*: each channel of each tile shifted and scaled to the
same mean and standard deviation (those of the whole dataset), which removes every brightness and colour-level cue
and keeps the texture: nuclear size, crowding, gland architecture. It then

1. probes the flattened copy (`pipeline.probe`): the intensity statistics must now tell nothing (AUC near 0.5);
2. trains Separate (each hospital alone: no federation to help) with the quick start's settings on the raw and
   on the flattened dataset and reports each hospital's test AUC.

A flattened AUC well above 0.5 means the model can learn the classes from morphology alone.

    .venv/bin/python scripts/morphology_check.py --data data/prepared/honest_quickstart_raw

It writes results/honest_evaluation/morphology.md (and morphology.json). About 1 minute on 2 CPU cores.
"""

from __future__ import annotations

import argparse
import csv
import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import cv2
import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from infra.formats import MANIFEST_FILE  # noqa: E402
from pipeline.probe import probe_prepared  # noqa: E402

GFL = str(ROOT / ".venv" / "bin" / "gastric-fl")


def flatten(source: Path, target: Path) -> None:
    """Copy the prepared dataset ``source`` to ``target`` with every tile's channels set to common mean and std."""
    with (source / MANIFEST_FILE).open(newline="", encoding="utf-8") as handle:
        rows = list(csv.DictReader(handle))
    tiles = {}
    for r in rows:
        pixels = cv2.imread(str(source / r["path"]), cv2.IMREAD_UNCHANGED)
        tiles[r["path"]] = pixels.astype(np.float64) if pixels.ndim == 3 else pixels.astype(np.float64)[:, :, None]
    mean = float(np.mean([t.mean() for t in tiles.values()]))
    std = float(np.mean([t.std() for t in tiles.values()]))
    if target.exists():
        shutil.rmtree(target)
    for r in rows:
        t = tiles[r["path"]]
        centred = (t - t.mean(axis=(0, 1))) / np.maximum(t.std(axis=(0, 1)), 1e-6)
        flat = np.clip(centred * std + mean, 0, 255).round().astype(np.uint8)
        out = target / r["path"]
        out.parent.mkdir(parents=True, exist_ok=True)
        cv2.imwrite(str(out), flat[:, :, 0] if flat.shape[2] == 1 else flat)
    for name in (MANIFEST_FILE, "prepare.json"):
        shutil.copy2(source / name, target / name)


def separate_auc(dataset: Path, run: Path, config: str, settings: list[str] | tuple[str, ...] = ()) -> dict[str, Any]:
    extra = [arg for setting in settings for arg in ("--set", setting)]
    subprocess.run(
        [GFL, "train", "--config", config, "--data", str(dataset), "--out", str(run), "--overwrite", "-q",
         "--set", "strategy.name=separate", "--set", "run.threads=1", *extra],
        check=True, cwd=ROOT, stdout=subprocess.DEVNULL,
    )  # fmt: skip
    lines = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if line.strip()]
    last = max(line["round"] for line in lines)
    per = {int(line["client"]): line["test_auc"] for line in lines if line["round"] == last}
    values = [v for v in per.values() if v is not None]
    return {"hospitals": per, "mean_auc": float(np.mean(values)) if values else None}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--data", type=Path, default=ROOT / "data" / "prepared" / "honest_quickstart_raw")
    parser.add_argument("--config", default="configs/demo.toml")
    parser.add_argument("--out", type=Path, default=ROOT / "results" / "honest_evaluation")
    parser.add_argument("--set", action="append", default=[], help="a setting for both trainings, e.g. run.rounds=10")
    args = parser.parse_args()
    flat = args.data.parent / f"{args.data.name}_flat"
    flatten(args.data, flat)
    probes = {name: probe_prepared(folder) for name, folder in (("raw", args.data), ("flattened", flat))}
    runs = ROOT / "data" / "runs"
    aucs = {
        "raw": separate_auc(args.data, runs / "morphology_raw_separate", args.config, args.set),
        "flattened": separate_auc(flat, runs / "morphology_flat_separate", args.config, args.set),
    }
    data = args.data.resolve()
    shown = data.relative_to(ROOT) if data.is_relative_to(ROOT) else data
    result = {"data": str(shown), "config": args.config, "set": args.set, "probe": probes, "separate": aucs}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "morphology.json").write_text(json.dumps(result, indent=2) + "\n")
    lines = markdown(result)
    (args.out / "morphology.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


def markdown(result: dict[str, Any]) -> list[str]:
    """The report of one check from its ``morphology.json`` record: the probe's test AUCs, raw and flattened, and
    Separate's test AUC per hospital on each."""
    probes, aucs = result["probe"], result["separate"]
    settings = "".join(f" --set {s}" for s in result.get("set", []))
    lines = [
        "# Morphology check: can a model learn the synthetic classes without brightness or colour?",
        "",
        f"Command: `.venv/bin/python scripts/morphology_check.py --data {result['data']} "
        f"--config {result['config']}{settings}` (numbers: `morphology.json`). *Flattened*: every tile's channels "
        "set to the dataset's common mean and standard deviation, so no brightness or colour level is left; texture "
        "stays.",
        "",
        "| statistic | raw test AUC | flattened test AUC |",
        "|---|---|---|",
    ]
    for name in probes["raw"]["statistics"]:
        raw = probes["raw"]["splits"]["test"][name]
        flattened = probes["flattened"]["splits"]["test"][name]
        lines.append(f"| {name} | {raw:.3f} | {flattened:.3f} |")
    hospitals = sorted(aucs["raw"]["hospitals"], key=int)
    lines += [
        "",
        "| Separate (each hospital alone), last round | "
        + " | ".join(f"hospital {c}" for c in hospitals)
        + " | mean |",
        "|---|" + "---|" * (len(hospitals) + 1),
    ]
    for kind in ("raw", "flattened"):
        per = aucs[kind]["hospitals"]
        cells = ["n/a" if per[c] is None else f"{per[c]:.3f}" for c in hospitals]
        lines.append(f"| test AUC on {kind} tiles | " + " | ".join(cells) + f" | {aucs[kind]['mean_auc']:.3f} |")
    return lines


if __name__ == "__main__":
    main()
