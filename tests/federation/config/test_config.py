"""Run configuration: TOML defaults, presets, ``--set`` overrides and strict validation."""

from __future__ import annotations

from pathlib import Path

import pytest

from federation.config import config_to_toml, load_config, parse_override
from federation.errors import FederationError

REPO = Path(__file__).resolve().parents[3]


def test_defaults_then_file_then_overrides_then_data(tmp_path: Path) -> None:
    preset = tmp_path / "p.toml"
    preset.write_text('[run]\nrounds = 7\n[strategy]\nname = "fedrep"\n[client]\nlr = 0.05\n', encoding="utf-8")
    config = load_config(preset, ["client.lr=0.2", "strategy.clients=[0, 2]"], data=tmp_path / "ds")
    assert config.run.rounds == 7  # from the file
    assert config.client.lr == 0.2  # the override wins over the file
    assert config.client.momentum == 0.9  # a default
    assert config.strategy.name == "fedrep"
    assert config.strategy.clients == (0, 2)
    assert config.data.path == str(tmp_path / "ds")
    assert config.strategy.nhead is None  # left to the strategy


def test_written_toml_reads_back_equal(tmp_path: Path) -> None:
    config = load_config(
        None, ["strategy.name=fedprox", "strategy.nhead=3", "data.augment=false", "fedprox.mu=1e-05", "run.name=a-b.c"]
    )
    path = tmp_path / "config.toml"
    path.write_text(config_to_toml(config), encoding="utf-8")
    assert load_config(path) == config


def test_a_methods_own_setting_is_refused_for_another_method() -> None:
    """A setting only one method reads (its spec's ``settings``), changed for another method, would do nothing:
    refused in one line naming the setting and its method; at its default it passes."""
    for key, value, owner, method in (
        ("fedprox.mu", "0.1", "fedprox", "fedavg"),
        ("amp.dm", "cosine", "fedsaf", "fedamp"),
        ("fedsaf.split", "false", "fedsaf", "fedrep"),
        ("depthwise_fim.reverse", "true", "depthwise_fim", "fedas"),
    ):
        with pytest.raises(FederationError, match=rf"{key} = .*applies only with strategy.name = {owner}"):
            load_config(None, [f"strategy.name={method}", f"{key}={value}"])
        assert load_config(None, [f"strategy.name={owner}", f"{key}={value}"]).strategy.name == owner
    default = load_config(None).fedprox.mu
    assert load_config(None, ["strategy.name=fedavg", f"fedprox.mu={default}"]).fedprox.mu == default


@pytest.mark.parametrize("preset", ["demo.toml", "seed.toml", "seed_gpu.toml", "bot.toml"])
def test_shipped_presets_load(preset: str) -> None:
    config = load_config(REPO / "configs" / preset)
    assert config.run.rounds >= 1


def test_the_gpu_preset_is_the_seed_preset_but_for_its_gpu_settings() -> None:
    """configs/seed_gpu.toml changes only what a GPU needs (issue 32): the rest stays configs/seed.toml's."""
    import dataclasses

    cpu = dataclasses.asdict(load_config(REPO / "configs" / "seed.toml"))
    gpu = dataclasses.asdict(load_config(REPO / "configs" / "seed_gpu.toml"))
    changed = {
        (section, key): (cpu[section][key], gpu[section][key])
        for section in cpu
        if isinstance(cpu[section], dict)
        for key in cpu[section]
        if cpu[section][key] != gpu[section][key]
    }
    assert changed == {
        ("run", "name"): ("seed", "seed_gpu"),
        ("run", "device"): ("auto", "cuda"),
        ("run", "precision"): ("fp32", "bf16"),
        ("run", "workers"): (0, 5),
        ("data", "batch_size"): (32, 256),
        ("data", "eval_batch_size"): (128, 256),
        ("client", "lr"): (0.01, 0.08),
    }


ABLATION_PRESETS = sorted(
    p.name for p in (REPO / "configs").glob("*.toml") if "[ablation]" in p.read_text(encoding="utf-8")
)


@pytest.mark.parametrize("preset", ABLATION_PRESETS)
def test_every_cell_of_a_shipped_ablation_preset_is_a_valid_run(preset: str) -> None:
    from federation.ablation import load_plan

    plan = load_plan(REPO / "configs" / preset)
    cells = plan.cells()
    assert cells
    for cell in cells:
        config = plan.cell_config(cell)  # raises on a setting the engine would refuse
        assert config.run.rounds >= 1
    assert len(ABLATION_PRESETS) >= 10


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("bogus.key=1", r"unknown section \[bogus\]"),
        ("run.colour=1", r"unknown key run\.colour"),
        ("run.rounds=0", r"run\.rounds = 0 is out of range"),
        ("run.rounds=2.5", r"run\.rounds = 2\.5 has the wrong type"),
        ("client.lr=-0.1", r"client\.lr = -0\.1 is out of range"),
        ("client.momentum=1.0", "momentum < 1"),
        ("data.augment=3", r"data\.augment = 3 has the wrong type"),
        ("data.batch_size=1", r"data\.batch_size = 1 is out of range"),
        ("strategy.name=fedfoo", "use one of separate, fedavg"),
        ("strategy.nhead=-1", r"strategy\.nhead = -1"),
        ("strategy.clients=[1, 1]", "distinct client indices"),
        ("strategy.clients=some", '"all" or a list'),
        ("model.name=vgg", "use one of mobilenet_v3_small"),
        ("amp.dm=chebyshev", "use one of euclidean"),
        ("run.device=tpu", "cpu, cuda, auto"),
        ("rounds=3", "section.key=value"),
    ],
)
def test_bad_overrides_are_rejected_with_the_key_named(override: str, message: str) -> None:
    with pytest.raises(FederationError, match=message):
        load_config(None, [override])


def test_unknown_key_in_a_file_names_the_file(tmp_path: Path) -> None:
    preset = tmp_path / "bad.toml"
    preset.write_text("[client]\nlearning_rate = 0.1\n", encoding="utf-8")
    with pytest.raises(FederationError, match=r"bad\.toml: unknown key client\.learning_rate"):
        load_config(preset)
    with pytest.raises(FederationError, match="does not exist"):
        load_config(tmp_path / "missing.toml")
    broken = tmp_path / "broken.toml"
    broken.write_text("[run\n", encoding="utf-8")
    with pytest.raises(FederationError, match="not valid TOML"):
        load_config(broken)


def test_override_values_are_read_as_toml_or_bare_words() -> None:
    assert parse_override("strategy.name=fedavg") == ("strategy", "name", "fedavg")
    assert parse_override("client.lr=0.5") == ("client", "lr", 0.5)
    assert parse_override("data.augment=false") == ("data", "augment", False)
    assert parse_override("strategy.clients=[0,1]") == ("strategy", "clients", [0, 1])


def test_no_training_at_all_is_rejected() -> None:
    with pytest.raises(FederationError, match="at least one epoch"):
        load_config(None, ["client.epochs=0", "client.head_epochs=0"])


@pytest.mark.parametrize(
    ("clients", "alpha_k", "sigma"),
    [(3, 5.0, 10.0), (3, 5.000001, 10.0), (3, 6.0, 10.0), (2, 10.0, 10.0), (2, 10.1, 10.0), (5, 0.5, 2.0),
     (5, 0.51, 2.0), (11, 0.1, 1.0), (12, 0.1, 1.0)],
)  # fmt: skip
def test_the_torch_free_amp_bound_is_the_engines(clients: int, alpha_k: float, sigma: float) -> None:
    """federation.bounds.amp_bound_problem (the dashboard's check, no torch) refuses exactly what the engine's
    check_amp_settings refuses when a run starts, with the same words; alpha_k (m - 1) = sigma is allowed."""
    from federation.bounds import amp_bound_problem
    from federation.strategies.amp import check_amp_settings

    problem = amp_bound_problem(clients, alpha_k, sigma)
    assert (problem is None) == (alpha_k * (clients - 1) <= sigma * (1 + 1e-12))
    if problem is None:
        check_amp_settings(clients, "euclidean", alpha_k, sigma)
    else:
        with pytest.raises(FederationError) as refused:
            check_amp_settings(clients, "euclidean", alpha_k, sigma)
        assert str(refused.value) == problem
