"""The hospital boundary (docs/design.md): only shared tensors, counts and finite scalars leave a hospital, and the
server's part of a run directory holds no head tensor, tile path, label or per-tile probability.

Every message of a run is recorded (``run.audit``: ``messages.jsonl``) and checked against the rule; then every
file the server wrote is searched for what must stay at the hospitals. The same checks run on the Flower engines
in ``test_flower_engines.py``.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from safetensors import safe_open
from support.boundary import assert_boundary_held
from support.tiny_dataset import TINY_SETTINGS

from federation.config import load_config
from federation.launch import train
from federation.runfiles import HOSPITALS_DIR
from federation.server.audit import check_message


@pytest.mark.parametrize(("strategy", "nhead"), [("fedsaf", 6), ("fedrep", 1)])
def test_only_shared_tensors_and_scalars_cross_the_boundary(
    dataset: Path, tmp_path: Path, strategy: str, nhead: int
) -> None:
    run_dir = tmp_path / strategy
    config = load_config(
        None,
        [*TINY_SETTINGS, "run.rounds=2", f"strategy.name={strategy}", f"strategy.nhead={nhead}", "run.audit=true"],
        data=dataset,
    )
    train(config, run_dir, progress=False)
    found = assert_boundary_held(run_dir, dataset, nhead)
    assert found["uploaded"]  # the shared part did travel
    # and what stayed at each hospital is there: its head in its checkpoints, its predictions
    for c in (0, 1, 2):
        folder = run_dir / HOSPITALS_DIR / f"client_{c:02d}"
        assert (folder / "predictions.csv").is_file()
        with safe_open(str(folder / "model.safetensors"), framework="pt") as handle:
            assert "classifier.3.weight" in set(handle.keys())


def test_a_leaking_reply_is_caught(dataset: Path) -> None:
    # the rule itself can fail: a head tensor, a path in the header, a non-finite metric
    line = {
        "tensors": {"shared/classifier.3.weight": {"finite": True}, "shared/features.0.0.weight": {"finite": False}},
        "header": {"kind": "train_reply", "metrics": {"train_loss": float("inf")}, "test_paths": ["a.png"]},
    }
    problems = check_message(line, ["features.0.0.weight"])
    assert "tensor shared/classifier.3.weight is not a shared key" in problems
    assert "tensor shared/features.0.0.weight is not finite" in problems
    assert "header field test_paths may not leave a hospital" in problems
    assert any("inf" in p for p in problems)
