"""The benchmarks import their own helpers, even with a dependency that installs a top-level ``benchmarks``."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from support.paths import REPO


def test_the_benchmarks_package_is_this_repositorys() -> None:
    # opacus 1.6 installs a package named ``benchmarks``; ours must win where the benchmark scripts put the repo first
    code = f"import sys; sys.path.insert(0, {str(REPO)!r}); import benchmarks._common as c; print(c.__file__)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd="/", timeout=60)
    assert out.stdout.strip() == str(REPO / "benchmarks" / "_common.py")


def _fake_run(folder: Path, accuracy: dict[tuple[int, int], float], tiles: dict[int, int]) -> None:
    """A run folder `federation.report.load_run` reads: a config and one metrics record per round and hospital."""
    folder.mkdir(parents=True)
    (folder / "config.toml").write_text('[strategy]\nname = "fedsaf"\n', encoding="utf-8")
    lines = [
        json.dumps({"round": r, "client": h, "test_acc": acc, "num_train": tiles[h], "num_test": 10})
        for (r, h), acc in sorted(accuracy.items())
    ]
    (folder / "metrics.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")


def test_gpu_preset_by_round_pairs_each_round_and_follows_the_smallest_hospital(tmp_path: Path) -> None:
    # hospital 1 is the smaller (10 tiles against 90); seeds 4 and 5, rounds 1-2 of each variant, one round of
    # seed 5 missing for seed_gpu: the mean and the paired difference use the seeds that have the round
    ref = {4: [(0.8, 0.5), (0.9, 0.7)], 5: [(0.6, 0.5), (1.0, 0.9)]}  # seed -> per round (hospital 0, hospital 1)
    gpu = {4: [(0.7, 0.5), (0.9, 0.9)], 5: [(0.6, 0.3)]}
    for name, table in (("seed", ref), ("seed_gpu", gpu)):
        for seed, rounds in table.items():
            accuracy = {(r + 1, h): acc for r, pair in enumerate(rounds) for h, acc in enumerate(pair)}
            _fake_run(tmp_path / f"{name}_seed-{seed}", accuracy, {0: 90, 1: 10})
    code = (
        f"import sys; sys.path[:0] = [{str(REPO / 'benchmarks')!r}, {str(REPO)!r}]; import gpu_preset; "
        f"from pathlib import Path; print('\\n'.join(gpu_preset.by_round_section(Path({str(tmp_path)!r}), "
        "['seed', 'seed_gpu'], range(4, 6))))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd="/", timeout=120)
    rows = [line for line in out.stdout.splitlines() if line.startswith("| ") and line[2].isdigit()]
    # round 1: seed averages (0.65 + 0.55) / 2 = 0.600 (smallest 0.5); seed_gpu (0.6 + 0.45) / 2 = 0.525 (smallest
    # 0.4); differences -0.05 and -0.10 paired by seed; round 2: seed 0.875 (0.8), seed_gpu seed 4 only: 0.9 (0.9),
    # one difference: 0.9 - 0.8 = +0.100
    assert rows[0].startswith("| 1 | 0.600 (0.500) | 0.525 (0.400) | -0.075 [")
    assert rows[1] == "| 2 | 0.875 (0.800) | 0.900 (0.900) | +0.100 |"
    assert len(rows) == 2
