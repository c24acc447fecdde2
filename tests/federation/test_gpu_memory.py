"""Whether hospitals or ablation cells sharing one GPU fit (federation.hospital.gpu_memory, issue 32), checked on the
CPU: the
estimate's exact arithmetic on unequal hospitals, the round-robin spread of the worker pool, the refusals naming what
fits, and `train` / `ablate` refusing before anything is written when the GPU's free memory is too small."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from support.cli import run_cli
from support.tiny_dataset import TINY_SETTINGS

from federation.errors import FederationError
from federation.hospital import gpu_memory

MIB = 2**20
SHAPE = gpu_memory.Shape(input_size=32, channels=3, batch_size=8, model_name="m")


@pytest.fixture
def constants(monkeypatch: pytest.MonkeyPatch) -> None:
    """A model of 1 MiB of parameters whose training saves 0.5 MiB of activations per tile."""
    monkeypatch.setattr(gpu_memory, "parameter_bytes", lambda _name, _channels: MIB)
    monkeypatch.setattr(gpu_memory, "activation_bytes", lambda _name, _size, _channels: MIB // 2)


def test_the_pools_round_robin_spread() -> None:
    assert gpu_memory.spread([10, 20, 30, 40, 50], 2) == [[10, 30, 50], [20, 40]]
    assert gpu_memory.spread([10, 20], 5) == [[10], [20]]  # never more processes than hospitals
    assert gpu_memory.spread([10, 20, 30], 0) == [[10, 20, 30]]


def test_a_process_estimate_is_exact_on_unequal_hospitals(constants: None) -> None:
    # tiles 1000 + 300 of 32 x 32 x 3 bytes; 2 models x 4 x 1 MiB; 8 tiles x 0.5 MiB; x 1.25; + the context
    held = 1300 * 32 * 32 * 3
    expected = gpu_memory.CONTEXT_BYTES + int(1.25 * (held + 8 * MIB + 4 * MIB))
    assert gpu_memory.process_bytes([1000, 300], SHAPE) == expected
    # three hospitals over two workers: [1000, 50] and [300]
    one = gpu_memory.process_bytes([1000, 50], SHAPE)
    two = gpu_memory.process_bytes([300], SHAPE)
    assert gpu_memory.run_bytes([1000, 300, 50], 2, SHAPE) == one + two
    assert two == gpu_memory.CONTEXT_BYTES + int(1.25 * (300 * 3072 + 4 * MIB + 4 * MIB))
    # a hospital of 5 tiles trains batches of 5, not of 8
    assert gpu_memory.process_bytes([5], SHAPE) == gpu_memory.CONTEXT_BYTES + int(
        1.25 * (5 * 3072 + 4 * MIB + 5 * MIB // 2)
    )


def test_too_many_workers_are_refused_naming_how_many_fit(constants: None) -> None:
    tiles = [1000, 300, 50]
    needs = {w: gpu_memory.run_bytes(tiles, w, SHAPE) for w in (1, 2, 3)}
    assert needs[1] < needs[2] < needs[3]  # each process adds a context
    assert gpu_memory.check_shared_gpu(tiles, 3, needs[3], SHAPE) == needs[3]
    with pytest.raises(FederationError) as refused:
        gpu_memory.check_shared_gpu(tiles, 3, needs[2], SHAPE)
    message = str(refused.value)
    assert message == (
        "run.workers = 3: the hospitals would need about 5.3 GiB of GPU memory at once and 3.5 GiB is free; "
        "use run.workers = 2 (the estimate errs high: --set run.check_gpu_memory=false runs them anyway)"
    )
    with pytest.raises(FederationError, match=r"even one worker does not fit: lower data\.batch_size"):
        gpu_memory.check_shared_gpu(tiles, 3, needs[1] - 1, SHAPE)


def test_cells_sharing_a_gpu_are_refused_naming_the_workers_that_fit() -> None:
    needs = [3 * 2**30, 1 * 2**30, 2 * 2**30]
    assert gpu_memory.check_cells(needs, 2, 5 * 2**30) == 5 * 2**30  # the two largest together
    with pytest.raises(FederationError) as refused:
        gpu_memory.check_cells(needs, 3, 5 * 2**30)
    assert str(refused.value) == (
        "--workers 3: the cells sharing the GPU would need about 6.0 GiB of its memory at once and 5.0 GiB is free; "
        "use --workers 2 (the estimate errs high: --set run.check_gpu_memory=false runs them anyway)"
    )
    with pytest.raises(FederationError, match="even one cell does not fit"):
        gpu_memory.check_cells(needs, 2, 2 * 2**30)


def test_the_activation_estimate_grows_with_the_tiles_area() -> None:
    """MobileNetV3-Small's saved activations per tile: a few MiB at 128 px, about four times those at 64 px."""
    small = gpu_memory.activation_bytes("mobilenet_v3_small", 64, 3)
    large = gpu_memory.activation_bytes("mobilenet_v3_small", 128, 3)
    assert 2 * MIB < large < 32 * MIB
    assert 3.5 < large / small < 4.5
    assert 1 * MIB < gpu_memory.parameter_bytes("mobilenet_v3_small", 3) < 16 * MIB


def test_train_with_workers_that_do_not_fit_is_refused_before_the_run_exists(
    dataset: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A GPU stood in for: the device resolves to CUDA and reports 4 GiB free; three workers need more, two fit."""
    monkeypatch.setattr(gpu_memory, "resolve_device", lambda _name: torch.device("cuda"))
    monkeypatch.setattr(gpu_memory, "free_gpu_bytes", lambda _device="cuda": 4 * 2**30)
    run = tmp_path / "run"
    settings = [a for s in TINY_SETTINGS for a in ("--set", s)]
    code = run_cli(monkeypatch, "train", "--data", str(dataset), "--out", str(run), "-q", *settings,
                   "--set", "run.workers=3")  # fmt: skip
    assert code == 2
    err = capsys.readouterr().err
    wanted = (
        "error: run.workers = 3: the hospitals would need about 5.3 GiB of GPU memory at once and 4.0 GiB is free; "
        "use run.workers = 2 (the estimate errs high: --set run.check_gpu_memory=false runs them anyway)\n"
    )
    assert wanted in err
    assert not run.exists()


def test_ablate_cells_sharing_one_gpu_that_do_not_fit_are_refused_before_any_runs(
    dataset: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """One GPU stood in for (visible to the cells, 3 GiB free): two cells at once need two processes' contexts."""
    import federation.ablation.running

    monkeypatch.setattr(federation.ablation.running, "visible_gpus", lambda _on_gpu: ["0"])
    monkeypatch.setattr(gpu_memory, "free_gpu_bytes", lambda _device="cuda": 3 * 2**30)
    out, preset = tmp_path / "grid", tmp_path / "preset.toml"
    preset.write_text(f'[run]\nname = "g"\ndevice = "auto"\n[data]\npath = "{dataset.as_posix()}"\n', encoding="utf-8")
    settings = [a for s in TINY_SETTINGS for a in ("--set", s)]
    code = run_cli(monkeypatch, "ablate", "--config", str(preset), "--grid", "client.lr=0.01,0.03", "--workers", "2",
                   "--out", str(out), "-q", *settings)  # fmt: skip
    assert code == 2
    err = capsys.readouterr().err
    assert (
        "--workers 2: the cells sharing the GPU would need about 3.7 GiB of its memory at once and 3.0 GiB is "
        "free; use --workers 1" in err
    )
    assert not list(out.glob("cells/*/metrics.jsonl"))


def _never_asked(_device: str = "cuda") -> int:
    raise AssertionError("the GPU's free memory was read although the check is off")


def test_run_check_gpu_memory_false_skips_the_estimate_and_true_keeps_it(
    dataset: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With a GPU stood in for and 1 byte free, three workers are refused by default and let through with
    ``run.check_gpu_memory = false``, whose check never reads the GPU's free memory."""
    from federation.config import load_config
    from federation.engine import local_sites

    monkeypatch.setattr(gpu_memory, "resolve_device", lambda _name: torch.device("cuda"))
    checked = load_config(None, [*TINY_SETTINGS, "run.workers=3"], data=dataset)
    assert checked.run.check_gpu_memory is True  # the default
    sites = [site.data_index for site in local_sites(checked, tmp_path / "run")]
    monkeypatch.setattr(gpu_memory, "free_gpu_bytes", lambda _device="cuda": 1)
    with pytest.raises(FederationError, match=r"^run\.workers = 3: .* even one worker does not fit"):
        gpu_memory.check_workers_fit(checked, sites)
    unchecked = load_config(None, [*TINY_SETTINGS, "run.workers=3", "run.check_gpu_memory=false"], data=dataset)
    monkeypatch.setattr(gpu_memory, "free_gpu_bytes", _never_asked)
    assert gpu_memory.check_workers_fit(unchecked, sites) is None


def test_ablate_cells_that_opt_out_are_left_out_of_the_estimate(dataset: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Cells that set ``run.check_gpu_memory = false`` are not counted; when none is left, nothing is read."""
    from federation.ablation.running import check_cells_fit
    from federation.config import load_config

    on = load_config(None, [*TINY_SETTINGS], data=dataset)
    off = load_config(None, [*TINY_SETTINGS, "run.check_gpu_memory=false"], data=dataset)
    need = gpu_memory.config_bytes(on, gpu_memory.hospital_tiles(dataset))
    monkeypatch.setattr(gpu_memory, "free_gpu_bytes", lambda _device="cuda": need)
    check_cells_fit([on, off, off], 3)  # only the one cell that checks is counted: it fits exactly
    with pytest.raises(FederationError, match=r"^--workers 2: .* use --workers 1"):
        check_cells_fit([on, on, off], 2)  # two that check do not fit in one's memory
    monkeypatch.setattr(gpu_memory, "free_gpu_bytes", _never_asked)
    check_cells_fit([off, off], 2)
