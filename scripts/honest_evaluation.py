"""The size of the Step a.1 leak: shortcut probes before and after, the same models judged on masked and raw tiles.

For the quick start and each published regime (results/README.md, "The regimes"), from the same raw slides:

1. **masked**: the dataset as ``prepare`` made it before raw tiling, every abnormal tile (train and test) whitened
   outside the cancer mask (paper 001, Step a.1). Made by the code of ``--before`` (a git commit, checked out in a
   temporary worktree), with the regime's own prepare command.
2. **mask-outside**: today's ``prepare --mask-outside``: training tiles whitened, test tiles raw.
3. **raw**: today's default: every tile raw, labelled by the mask's coverage of its tissue.
   Both today's datasets are made with ``--val-fraction 0``, so that their train and test slides are exactly the
   masked dataset's (the validation split is drawn after test; with none, the splits are the old ones).

It prints and writes (``--out``, default results/honest_evaluation/):

- the shortcut probe of each dataset per split (`pipeline.probe`: the best label-free pixel statistic's AUC);
- **the same models on masked and raw test tiles**: FedSAF and Separate trained on the masked dataset, as every
  published figure was, each hospital's exported model then scored on its masked test tiles (what was published)
  and on the raw test tiles of the same test slides (what a hospital sees); tile AUC and accuracy at 0.5,
  averaged over hospitals;
- ``results.json`` with every number, and the command.

    .venv/bin/python scripts/honest_evaluation.py --before 664f23c

One training at a time, one torch thread (deterministic given the seed): about 15 minutes on 2 CPU cores.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import cv2
import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from federation.ablation import cell_status  # noqa: E402
from infra.formats import MANIFEST_FILE  # noqa: E402
from models.bundle import load_bundle  # noqa: E402
from pipeline.probe import STATISTICS, probe_prepared  # noqa: E402

GFL = str(ROOT / ".venv" / "bin" / "gastric-fl")
PYTHON = str(ROOT / ".venv" / "bin" / "python")

# name -> (synth args, prepare args, run preset): the commands in each regime preset's header
REGIMES: dict[str, tuple[list[str], list[str], str]] = {
    "quickstart": (
        ["--format", "seed", "--images", "60", "--seed", "0", "--difficulty", "0.3"],
        ["--format", "seed", "--clients", "3", "--tile", "128", "--seed", "0", "--grayscale-clients", "2"],
        "configs/demo.toml",
    ),
    "data_poor": (
        ["--format", "seed", "--images", "60", "--seed", "7", "--difficulty", "0.6"],
        ["--format", "seed", "--clients", "10", "--sizes", "equal", "--partition", "iid", "--test-fraction", "0.34",
         "--tile", "128", "--max-tiles-per-slide", "6", "--seed", "0"],
        "configs/regime_data_poor.toml",
    ),
    "site_shift": (
        ["--format", "seed", "--images", "60", "--seed", "5", "--difficulty", "0.5"],
        ["--config", "configs/prepare_site_shift.toml"],
        "configs/regime_site_shift.toml",
    ),
    "label_skew": (
        ["--format", "seed", "--images", "100", "--seed", "3", "--difficulty", "0.3"],
        ["--format", "seed", "--clients", "5", "--sizes", "equal", "--partition", "dirichlet:0.5", "--tile", "128",
         "--seed", "0"],
        "configs/regime_label_skew.toml",
    ),
    "seed_like": (
        ["--format", "seed", "--images", "120", "--seed", "1", "--difficulty", "0.4"],
        ["--format", "seed", "--clients", "5", "--sizes", "3,2,2,1,1", "--partition", "dirichlet:2.0",
         "--grayscale-clients", "1,4", "--client-scale", "1,1,0.75,1,1", "--site-shift", "random",
         "--site-strength", "1", "--tile", "128", "--seed", "0"],
        "configs/regime_seed_like.toml",
    ),
}  # fmt: skip


def run(cmd: list[str], env: dict[str, str] | None = None) -> None:
    print("$", " ".join(cmd), flush=True)
    subprocess.run(cmd, check=True, cwd=ROOT, env=env, stdout=subprocess.DEVNULL)


def datasets(name: str, before: str, data: Path) -> dict[str, Path]:
    """Make (once) the regime's raw slides and its masked, mask-outside and raw datasets."""
    synth, prepare, _ = REGIMES[name]
    raw = data / "raw" / name
    if not (raw / "synth.json").is_file():
        run([GFL, "synth", *synth, "--out", str(raw), "--overwrite"])
    out = {kind: data / "prepared" / f"honest_{name}_{kind}" for kind in ("masked", "mask_outside", "raw")}
    common = [*prepare, "--input", str(raw), "--no-progress", "--overwrite"]
    if not (out["masked"] / MANIFEST_FILE).is_file():
        with tempfile.TemporaryDirectory() as tmp:
            tree = Path(tmp) / "before"
            subprocess.run(["git", "worktree", "add", "--detach", str(tree), before], check=True, cwd=ROOT)
            try:
                env = {**os.environ, "PYTHONPATH": str(tree)}
                # the old code, run from its own tree; configs are read from there too
                cmd = [PYTHON, "-c", "from app.cli import main; main()", "prepare", *common, "--out",
                       str(out["masked"].resolve())]  # fmt: skip
                print("$ (at", before, ")", " ".join(cmd), flush=True)
                subprocess.run(cmd, check=True, cwd=tree, env=env, stdout=subprocess.DEVNULL)
            finally:
                subprocess.run(["git", "worktree", "remove", "--force", str(tree)], check=True, cwd=ROOT)
    for kind, extra in (("mask_outside", ["--mask-outside"]), ("raw", [])):
        if not (out[kind] / MANIFEST_FILE).is_file():
            run([GFL, "prepare", *common, "--val-fraction", "0", *extra, "--out", str(out[kind])])
    return out


def probe_summary(record: dict[str, Any]) -> dict[str, Any]:
    """Per split: the best statistic and its AUC, and the pure-white and mean-intensity AUCs."""
    out = {}
    for split, row in record["splits"].items():
        # .get: a dataset prepared before a statistic was added has no key for it
        values = {s: row[s] for s in STATISTICS if row.get(s) is not None}
        if not values:
            continue
        best = max(values, key=lambda s: values[s])
        out[split] = {"best": best, "auc": values[best], **values, "tiles": row["tiles"]}
    return out


def tiles_of(dataset: Path, client: int, split: str) -> tuple[list[np.ndarray], np.ndarray, list[str]]:
    with (dataset / MANIFEST_FILE).open(newline="", encoding="utf-8") as handle:
        rows = [r for r in csv.DictReader(handle) if int(r["client"]) == client and r["split"] == split]
    images = []
    for r in rows:
        pixels = cv2.imread(str(dataset / r["path"]), cv2.IMREAD_UNCHANGED)
        images.append(pixels if pixels.ndim == 2 else cv2.cvtColor(pixels, cv2.COLOR_BGR2RGB))
    labels = np.array([int(r["label"] == "abnormal") for r in rows])
    return images, labels, [r["source"] for r in rows]


def judge(bundle_folder: Path, images: list[np.ndarray], labels: np.ndarray) -> dict[str, float | None]:
    """Tile AUC and accuracy at 0.5 of the bundle on ``images``."""
    import torch
    from sklearn.metrics import roc_auc_score

    bundle = load_bundle(bundle_folder)
    pre = bundle.card.preprocess
    with torch.inference_mode():
        batch = np.stack([pre.fit(t) for t in images])
        prob = torch.softmax(bundle.model(pre.tensor(batch)).double(), dim=1)[:, 1].numpy()
    auc = float(roc_auc_score(labels, prob)) if len(set(labels.tolist())) == 2 else None
    return {"auc": auc, "acc": float(((prob >= 0.5) == (labels == 1)).mean()), "tiles": len(labels)}


def leak(name: str, sets: dict[str, Path], data: Path, methods: list[str]) -> dict[str, Any]:
    """Train each method on the masked dataset; judge every hospital's model on masked and on raw test tiles."""
    preset = REGIMES[name][2]
    found: dict[str, Any] = {}
    for method in methods:
        run_dir = data / "runs" / f"honest_{name}_{method}_masked"
        if cell_status(run_dir) != "finished":
            run([GFL, "train", "--config", preset, "--data", str(sets["masked"]), "--out", str(run_dir),
                 "--overwrite", "-q", "--set", f"strategy.name={method}", "--set", "run.threads=1"])  # fmt: skip
        hospitals = sorted(int(p.name.split("_")[1]) for p in (run_dir / "hospitals").glob("client_*"))
        per = []
        for client in hospitals:
            folder = run_dir / "hospitals" / f"client_{client:02d}"
            masked_x, masked_y, masked_src = tiles_of(sets["masked"], client, "test")
            raw_x, raw_y, raw_src = tiles_of(sets["raw"], client, "test")
            per.append(
                {
                    "client": client,
                    "masked": judge(folder, masked_x, masked_y),
                    "raw": judge(folder, raw_x, raw_y),
                    "same_test_slides": sorted(set(masked_src)) == sorted(set(raw_src)),
                }
            )

        def mean(kind: str, key: str, per: list[dict[str, Any]] = per) -> float | None:
            values = [p[kind][key] for p in per if p[kind][key] is not None]
            return float(np.mean(values)) if values else None

        found[method] = {
            "hospitals": per,
            "masked_auc": mean("masked", "auc"),
            "raw_auc": mean("raw", "auc"),
            "masked_acc": mean("masked", "acc"),
            "raw_acc": mean("raw", "acc"),
        }
    return found


def fmt(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.3f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--before", default="664f23c", help="commit whose prepare whitened test tiles too")
    parser.add_argument("--regimes", nargs="*", default=list(REGIMES))
    parser.add_argument("--methods", nargs="*", default=["fedsaf", "separate"])
    parser.add_argument("--data", type=Path, default=ROOT / "data")
    parser.add_argument("--out", type=Path, default=ROOT / "results" / "honest_evaluation")
    args = parser.parse_args()
    results: dict[str, Any] = {}
    path = args.out / "results.json"
    if path.is_file():
        results = json.loads(path.read_text())
    for name in args.regimes:
        sets = datasets(name, args.before, args.data)
        probes = {"masked": probe_summary(probe_prepared(sets["masked"]))}
        for kind in ("mask_outside", "raw"):
            record = json.loads((sets[kind] / "prepare.json").read_text())
            probes[kind] = probe_summary(record["shortcut_probe"])
        results[name] = {"probe": probes, "leak": leak(name, sets, args.data, args.methods)}
        args.out.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(results, indent=2) + "\n")
        print(json.dumps({name: {k: v for k, v in results[name].items()}}, indent=1)[:2000], flush=True)
    lines = [
        "# Honest evaluation: the size of the Step a.1 leak",
        "",
        f"Command: `.venv/bin/python scripts/honest_evaluation.py --before {args.before}` (every number: "
        "`results.json`). Datasets: the regimes' own synth and prepare commands; *masked* made by the code at "
        f"`{args.before}` (every abnormal tile whitened outside the mask, train and test), *mask-outside* and *raw* "
        "by today's prepare with `--val-fraction 0` (the same train and test slides).",
        "",
        "## Shortcut probe: the best label-free pixel statistic's AUC per split",
        "",
        "| regime | masked train | masked test | mask-outside train | mask-outside test | raw train | raw test |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, r in results.items():
        p = r["probe"]
        cells = []
        for kind in ("masked", "mask_outside", "raw"):
            for split in ("train", "test"):
                row = p[kind].get(split)
                cells.append("n/a" if row is None else f"{row['auc']:.3f} ({row['best']})")
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    lines += [
        "",
        "Pure-white share alone (the painted-white shortcut) on the test split: "
        + "; ".join(
            f"{n}: masked {fmt(r['probe']['masked'].get('test', {}).get('pure_white'))}, raw "
            f"{fmt(r['probe']['raw'].get('test', {}).get('pure_white'))}"
            for n, r in results.items()
        )
        + ".",
        "",
        "## The same models on masked and on raw test tiles",
        "",
        "Each method trained on the masked dataset (as every figure published before was), then each hospital's "
        "exported model scored on its masked test tiles and on the raw test tiles of the same slides; tile AUC "
        "and accuracy at 0.5, averaged over hospitals.",
        "",
        "| regime | method | AUC masked | AUC raw | accuracy masked | accuracy raw |",
        "|---|---|---|---|---|---|",
    ]
    for name, r in results.items():
        for method, m in r["leak"].items():
            lines.append(
                f"| {name} | {method} | {fmt(m['masked_auc'])} | {fmt(m['raw_auc'])} | {fmt(m['masked_acc'])} | "
                f"{fmt(m['raw_acc'])} |"
            )
    (args.out / "results.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
