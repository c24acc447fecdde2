"""A fake ablation for the paired-difference tests of `gastric-fl ablate` (and its ``--publish``): a plan of four
methods over three seeds and a train function that writes finished runs with known figures, without training."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from federation.config import RunConfig, config_to_toml
from federation.errors import FederationError
from support.runs import metrics_line, write_finished_run

# Final averaged (= worst hospital) accuracy per method and seed; AUC constant per method.
ACC = {
    "separate": {0: 0.70, 1: 0.60},  # seed 2 fails: left out of its pairs
    "fedavg": {0: 0.80, 1: 0.90, 2: 0.75},
    "fedamp": {0: 0.90, 1: 0.80, 2: 0.70},
    "fedsaf": {0: 0.95, 1: 0.95, 2: 0.95},
}
AUC = {"separate": 0.80, "fedavg": 0.90, "fedamp": 0.95, "fedsaf": 0.99}


class PairedFakeTrain:
    """A finished run directory with two hospitals of equal figures taken from ``ACC`` / ``AUC``."""

    def __call__(self, config: RunConfig, run_dir: Path, *, resume: bool, overwrite: bool, progress: bool) -> Any:
        name, seed = config.strategy.name, config.run.seed
        if seed not in ACC[name]:
            raise FederationError("client 0, round 1: the training loss became nan")
        lines = [metrics_line(1, c, ACC[name][seed], AUC[name]) for c in (0, 1)]
        return write_finished_run(run_dir, config_to_toml(config), lines)


def paired_ablation(tmp_path: Path) -> Path:
    """An ablation plan (``ablation_p.toml`` in ``tmp_path``) over an empty dataset: Separate, FedAvg and FedAMP in
    one table and FedSAF at nhead 6 in another, three seeds each; run it with ``PairedFakeTrain``."""
    data = tmp_path / "ds"
    data.mkdir()
    (data / "manifest.csv").write_text("client,split,label,path,channels\n", encoding="utf-8")
    (tmp_path / "preset.toml").write_text(
        f'[run]\nname = "t"\nrounds = 1\n[data]\npath = "{data.as_posix()}"\n', encoding="utf-8"
    )
    path = tmp_path / "ablation_p.toml"
    path.write_text(
        '[ablation]\nconfig = "preset.toml"\nseeds = 3\n'
        '[[ablation.block]]\ntable = "methods"\nstrategy = ["separate", "fedavg", "fedamp"]\n'
        # FedSAF only at nhead 6: no Separate / FedAvg with that setting, so no paired row
        '[[ablation.block]]\ntable = "nhead"\nstrategy = "fedsaf"\nnhead = 6\n',
        encoding="utf-8",
    )
    return path
