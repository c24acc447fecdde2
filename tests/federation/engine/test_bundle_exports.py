"""Exports that never half-happen, and a run that ends without a hospital says so (issue 48, part 1).

Played from the failing side: a hospital whose DP ledger was removed refuses its next round, a hospital whose
checkpoint was cut short or had one byte flipped cannot restore it; each is left out of the run's last round. The
test checks which bundle survived (weights and card of the same round, byte for byte the last good one), which
hospital, round and reason the run's last lines name, what ``summary.json`` records, and the exit status (3).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path

import pytest
from safetensors import safe_open
from support.cli import run_cli
from support.tiny_dataset import TINY_SETTINGS, make_dataset, name_tiles_by_slide

from federation.hospital.export import replace_bundle
from federation.hospital.store import TENSORS_SHA256
from models.bundle import load_bundle, read_card

DP = ("model.norm=group", "privacy.noise_multiplier=1.0", "privacy.max_grad_norm=1.0", "privacy.sample_rate=0.5")


def _sets(*settings: str) -> list[str]:
    return [arg for setting in settings for arg in ("--set", setting)]


@pytest.fixture(scope="module")
def slides_dataset(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny dataset with prepare's tile names (two tiles a slide), which slide-level DP needs."""
    return name_tiles_by_slide(make_dataset(tmp_path_factory.mktemp("dp")))


@pytest.fixture(scope="module")
def one_round(dataset: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A finished one-round FedAvg run, never modified: tests copy it."""
    run = tmp_path_factory.mktemp("runs") / "one"
    with pytest.MonkeyPatch.context() as patch:
        code = run_cli(patch, "train", "--data", str(dataset), "--out", str(run), "-q", *_sets(*TINY_SETTINGS))
    assert code == 0
    return run


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _weights_round(path: Path) -> str:
    with safe_open(str(path), framework="pt") as handle:
        return str((handle.metadata() or {})["round"])


def _warnings(err: str) -> list[str]:
    assert "Traceback" not in err
    return [line for line in err.splitlines() if line.startswith("warning: hospital")]


def test_a_refused_dp_round_leaves_the_last_good_bundle_and_the_run_ends_naming_the_hospital(
    slides_dataset: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    run = tmp_path / "R"
    settings = (*TINY_SETTINGS, *DP, "strategy.name=fedrep", "run.rounds=1")
    assert run_cli(monkeypatch, "train", "--data", str(slides_dataset), "--out", str(run), "-q", *_sets(*settings)) == 0
    bundle = run / "hospitals" / "client_00"
    weights_before, card_before = _digest(bundle / "model.safetensors"), _digest(bundle / "model.json")
    (bundle / "privacy.json").unlink()  # the ledger removed: its next DP round is rightly refused
    capsys.readouterr()
    code = run_cli(monkeypatch, "train", "--resume", str(run), "-q", "--set", "run.rounds=2")
    out, err = capsys.readouterr()
    assert code == 3, err
    # the last good bundle survived whole: before, the weights were round 2's and the card round 1's
    assert (_digest(bundle / "model.safetensors"), _digest(bundle / "model.json")) == (weights_before, card_before)
    assert _weights_round(bundle / "model.safetensors") == "1"
    assert load_bundle(bundle).card.round == 1  # predict and threshold read it
    assert not [p.name for p in bundle.iterdir() if p.name.startswith(".")]  # no temp file left
    # the other hospitals went on to round 2
    assert read_card(run / "hospitals" / "client_01").round == 2
    assert out.splitlines()[0].startswith("finished 2 rounds without 1 hospital(s) (named below)")
    lines = _warnings(err)
    assert len(lines) == 1
    assert lines[0].startswith("warning: hospital 0 was left out of round 2, the run's last: ")
    assert f"{bundle / 'privacy.json'} does not hold the 1 entries recorded in hospital.json" in lines[0]
    assert lines[0].endswith(
        "its exported model (model.json) is not of round 2: fix the cause, then continue with gastric-fl train --resume"
    )
    assert err.strip().splitlines()[-1] == lines[0]  # the last line said
    summary = json.loads((run / "summary.json").read_text())
    assert summary["status"] == "finished"
    assert [(e["hospital"], e["round"], e["evaluated"]) for e in summary["left_out"]] == [(0, 2, False)]
    assert "privacy.json does not hold" in summary["left_out"][0]["reason"]


def _resume_after(
    one_round: Path, tmp_path: Path, damage: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> tuple[Path, str]:
    run = tmp_path / "R"
    shutil.copytree(one_round, run, symlinks=True)
    # hospital 1's newest checkpoint, from which its next round starts
    checkpoint = run / "hospitals" / "client_01" / "checkpoints" / "round_0002.safetensors"
    data = checkpoint.read_bytes()
    if damage == "cut":
        checkpoint.write_bytes(data[: len(data) // 2])
    else:  # one byte of the last tensor's values flipped: safetensors reads it without a word
        checkpoint.write_bytes(data[:-1] + bytes([data[-1] ^ 0x01]))
    capsys.readouterr()
    code = run_cli(monkeypatch, "train", "--resume", str(run), "-q", "--set", "run.rounds=3")
    _, err = capsys.readouterr()
    assert code == 3, err
    lines = _warnings(err)
    assert len(lines) == 1, err
    assert lines[0].startswith("warning: hospital 1 was left out of round 3, the run's last: ")
    return checkpoint, lines[0]


def test_a_cut_hospital_checkpoint_is_named_as_a_read_error(
    one_round: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    checkpoint, line = _resume_after(one_round, tmp_path, "cut", monkeypatch, capsys)
    assert f"its checkpoint {checkpoint} cannot be read (" in line
    assert "cannot write" not in line  # before: "cannot write its checkpoint"


def test_a_hospital_checkpoint_with_a_flipped_byte_is_refused_by_its_hash(
    one_round: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    with safe_open(str(one_round / "hospitals" / "client_01" / "checkpoints" / "round_0002.safetensors"), "pt") as f:
        assert len((f.metadata() or {})[TENSORS_SHA256]) == 64  # every checkpoint carries its tensors' sha256
    checkpoint, line = _resume_after(one_round, tmp_path, "flip", monkeypatch, capsys)
    assert f"its checkpoint {checkpoint} does not hash to the sha256 written into it when it was saved" in line
    assert "it changed since; restore it from a backup, or delete it to continue from an earlier round" in line


def test_replace_bundle_keeps_the_previous_bundle_when_any_step_fails(
    one_round: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    bundle = tmp_path / "bundle"
    shutil.copytree(one_round / "hospitals" / "client_00", bundle, symlinks=True)
    before = {name: _digest(bundle / name) for name in ("model.safetensors", "model.json")}
    card = read_card(bundle)
    round_1 = bundle / "checkpoints" / "round_0001.safetensors"
    shutil.copyfile(one_round / "hospitals" / "client_00" / "checkpoints" / "round_0002.safetensors", round_1)
    # the weights to publish are missing: nothing changes, nothing is left
    with pytest.raises(FileNotFoundError):
        replace_bundle(bundle, card, bundle / "checkpoints" / "round_0009.safetensors")
    assert {name: _digest(bundle / name) for name in before} == before
    # the card's rename fails after the weights' one: the previous weights are put back
    real = os.replace

    def failing(source: str | Path, target: str | Path) -> None:
        if Path(target).name == "model.json":
            raise OSError(28, "No space left on device")
        real(source, target)

    monkeypatch.setattr(os, "replace", failing)
    with pytest.raises(OSError, match="No space left"):
        replace_bundle(bundle, card, round_1)
    monkeypatch.setattr(os, "replace", real)
    assert {name: _digest(bundle / name) for name in before} == before
    assert not [p.name for p in bundle.iterdir() if p.name.startswith(".")]


def test_the_last_lines_say_whether_a_left_out_hospitals_model_is_of_the_last_round() -> None:
    from federation.runfiles import left_out_lines

    summary = {
        "left_out_at_hello": {"2": "its hello declares 1000000000 training tiles, more than server.max_examples"},
        "left_out": [
            {"hospital": 0, "round": 3, "reason": "hospital 0: no answer within 60 s", "evaluated": True},
            {"hospital": 1, "round": 3, "reason": "x; evaluation: hospital 1: its model is not finite"},
        ],
    }
    assert left_out_lines(summary) == [
        "hospital 2 was left out of the whole run at its hello: its hello declares 1000000000 training tiles, more "
        "than server.max_examples",
        "hospital 0 was left out of round 3, the run's last: no answer within 60 s; it did not train in round 3, but "
        "evaluated and exported round 3's model: fix the cause, then continue with gastric-fl train --resume",
        "hospital 1 was left out of round 3, the run's last: x; evaluation: its model is not finite; its exported "
        "model (model.json) is not of round 3: fix the cause, then continue with gastric-fl train --resume",
    ]
    assert left_out_lines({"status": "finished", "left_out": []}) == []
