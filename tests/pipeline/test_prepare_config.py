"""`pipeline.config`: defaults < TOML < command line, and every bad value refused with a message naming it."""

from __future__ import annotations

from pathlib import Path

import pytest

from pipeline.config import PrepareConfig, build_config, load_toml, parse_partition
from pipeline.errors import PipelineError

CONFIGS = Path(__file__).resolve().parents[2] / "configs"


def test_command_line_overrides_toml_which_overrides_defaults() -> None:
    toml = {"split": {"clients": 4, "seed": 3}, "tiles": {"tile": 64}, "clients": {"grayscale": [1]}}
    overrides: dict[str, dict[str, object]] = {"split": {"clients": 6, "seed": None}, "tiles": {"white_max": 0.25}}
    config = build_config(toml, overrides)
    assert config.split.clients == 6  # command line wins
    assert config.split.seed == 3  # None on the command line = not given
    assert config.tiles.tile == 64
    assert config.tiles.white_max == 0.25
    assert config.clients.grayscale == (1,)
    assert config.tiles.background_max == PrepareConfig().tiles.background_max


def test_partition_specs() -> None:
    assert parse_partition("iid").kind == "iid"
    assert parse_partition("Dirichlet:0.3").alpha == pytest.approx(0.3)
    assert parse_partition("classes:1").classes == 1
    assert parse_partition("dirichlet:0.5").spec() == "dirichlet:0.5"
    for bad in ("dirichlet:0", "dirichlet:-1", "dirichlet:x", "classes:0", "classes:x", "skewed"):
        with pytest.raises(PipelineError, match="is not understood"):
            parse_partition(bad)
    # S is bounded by the number of classes, known for SEED/BOT at once and for class folders once read.
    assert parse_partition("classes:3").classes == 3
    with pytest.raises(PipelineError, match=r"classes:3 asks for more classes per client than the 2"):
        build_config(None, {"split": {"partition": "classes:3"}})


@pytest.mark.parametrize(
    ("layer", "message"),
    [
        ({"tiles": {"tyle": 64}}, "unknown setting tiles.tyle"),
        ({"tile": {"tile": 64}}, r"unknown section \[tile\]"),
        ({"tiles": {"tile": "big"}}, "tiles.tile must be an integer"),
        ({"tiles": {"white_max": 1.5}}, "--white-max 1.5 must be a fraction"),
        ({"tiles": {"tile": 4}}, "--tile 4 is too small"),
        ({"split": {"test_fraction": 1.0}}, "--test-fraction 1.0 must be between 0 and 1"),
        ({"split": {"clients": 0}}, "--clients 0 must be at least 1"),
        ({"split": {"sizes": "3,2"}}, "--sizes '3,2' must be"),
        ({"split": {"sizes": "3,-1,1,1,1"}}, "5 positive numbers"),
        ({"clients": {"grayscale": [5]}}, r"client indices must be in 0\.\.4"),
        ({"clients": {"scale": [1, 0.5]}}, "--client-scale has 2 values but there are 5 clients"),
        ({"clients": {"scale": [1, 1, 1, 1, 0]}}, "between 0.05 and 4"),
        ({"clients": {"tile": [1.5, 1, 1, 1, 1]}}, "list of integers"),
        ({"output": {"overwrite": "yes"}}, "must be true or false"),
        ({"source": {"format": "ndpi"}}, "format 'ndpi' is unknown"),
        ({"split": {"partition": 3}}, "split.partition must be a string"),
    ],
)
def test_bad_settings_are_refused_with_the_name(layer: dict[str, dict[str, object]], message: str) -> None:
    with pytest.raises(PipelineError, match=message):
        build_config(layer, None, origin="preset.toml")


def test_presets_load_and_the_seed_preset_spells_out_the_defaults() -> None:
    seed = build_config(load_toml(CONFIGS / "prepare_seed.toml"))
    assert seed == PrepareConfig()
    noniid = build_config(load_toml(CONFIGS / "prepare_seed_noniid.toml"))
    assert noniid.split.partition.kind == "dirichlet"
    assert noniid.clients.scale == (1.0, 1.0, 0.5, 1.0, 1.0)
    bot = build_config(load_toml(CONFIGS / "prepare_bot.toml"))
    assert bot.source.format == "bot"
    assert bot.split.clients == 10


def test_unreadable_toml_is_named(tmp_path: Path) -> None:
    broken = tmp_path / "broken.toml"
    broken.write_text("[split\nclients = 2")
    with pytest.raises(PipelineError, match=f"config file {broken} could not be read as TOML"):
        load_toml(broken)
    with pytest.raises(PipelineError, match="does not exist"):
        load_toml(tmp_path / "missing.toml")
