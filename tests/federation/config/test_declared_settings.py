"""Settings a method declares in its spec (`federation.methods.Setting`, ``StrategySpec.section``): the checks a
declaration carries, the section, defaults and refusals the configuration builds from it, and a toy method added
with nothing but its spec (`support.toy_method`) loading, refused for other methods and written to config.toml."""

from __future__ import annotations

import dataclasses
import os
import pickle
import subprocess
import sys
from collections.abc import Callable

import pytest
from support.paths import REPO
from support.toy_method import run_with_toy

from federation.config import SECTIONS, RunConfig, config_to_toml, load_config
from federation.config.defaults import declared_toml
from federation.config.sections import DECLARED, _declared_section
from federation.errors import FederationError
from federation.methods import SPECS, Setting, StrategySpec


def test_a_declared_setting_says_what_to_use_in_the_configurations_words() -> None:
    beta = Setting("beta", 0.5, "h", minimum=0.0, maximum=1.0)
    assert beta.kind is float
    assert [beta.problem(v) for v in (0.0, 0.5, 1.0)] == [None, None, None]
    for wrong in (-0.1, 1.5, float("nan"), float("inf")):
        assert beta.problem(wrong) == "use a finite value in [0.0, 1.0]"
    assert Setting("eps", 1e-7, "h", minimum=0.0, minimum_excluded=True).problem(0.0) == "use a finite value > 0.0"
    half_open = Setting("p", 0.5, "h", minimum=0.0, maximum=1.0, minimum_excluded=True)
    assert half_open.problem(0.0) == "use a finite value in (0.0, 1.0]"
    assert Setting("rounds", 3, "h", minimum=1).problem(0) == "use a value >= 1"
    assert Setting("cap", 3, "h", maximum=5, maximum_excluded=True).problem(5) == "use a value < 5"
    assert Setting("free", 0.5, "h").problem(float("nan")) == "use a finite value"
    assert Setting("dm", "l1", "h", choices=("l1", "l2")).problem("cos") == "use one of l1, l2"
    assert Setting("on", True, "h").problem(False) is None


@pytest.mark.parametrize(
    ("declared", "why"),
    [
        (lambda: Setting("Beta", 0.5, "h"), "lower case"),
        (lambda: Setting("beta", None, "h"), "bool, int, float or str"),  # type: ignore[arg-type]
        (lambda: Setting("dm", "l1", "h"), "lists its choices"),
        (lambda: Setting("beta", 0.5, "h", choices=("a",)), "only a string setting has choices"),
        (lambda: Setting("on", True, "h", minimum=0), "only a number has bounds"),
        (lambda: Setting("beta", 0.5, "h", minimum=1.0, maximum=0.0), "minimum is above the maximum"),
        (lambda: Setting("beta", 2.0, "h", maximum=1.0), r"outside the declared range: use a finite value <= 1.0"),
        (lambda: Setting("eps", 0.0, "h", minimum=0.0, minimum_excluded=True), "outside the declared range"),
    ],
)
def test_a_declaration_that_cannot_work_fails_on_import(declared: Callable[[], object], why: str) -> None:
    with pytest.raises(ValueError, match=why):
        declared()


def test_a_spec_declares_each_setting_once_and_owns_its_keys() -> None:
    one = Setting("beta", 0.5, "h")
    with pytest.raises(ValueError, match="declares a setting twice"):
        StrategySpec("fedtoy", "m", "T", "T", 10, section=(one, one))
    spec = StrategySpec("fedtoy", "m", "T", "T", 10, settings=("amp.dm",), section=(one, Setting("on", True, "h")))
    assert spec.owned == ("amp.dm", "fedtoy.beta", "fedtoy.on")
    assert all(s.owned == s.settings for s in SPECS if not s.section)


def test_the_declared_section_checks_its_values_and_names_the_key() -> None:
    spec = StrategySpec(
        "fed_toy",
        "m",
        "FedToy",
        "T",
        10,
        section=(Setting("beta", 0.5, "h", minimum=0.0, maximum=1.0), Setting("mode", "a", "h", choices=("a", "b"))),
    )
    cls = _declared_section(spec)
    assert cls.__name__ == "FedToySection"
    assert cls.__module__ == "federation.config.sections"
    assert [(f.name, f.type, f.default) for f in dataclasses.fields(cls)] == [("beta", float, 0.5), ("mode", str, "a")]
    assert dataclasses.asdict(cls(beta=1.0)) == {"beta": 1.0, "mode": "a"}
    with pytest.raises(FederationError, match=r"config fed_toy\.beta = 1\.5 is out of range: use a finite value") as e:
        cls(beta=1.5)
    assert e.value.key == "fed_toy.beta"
    with pytest.raises(FederationError, match=r"config fed_toy\.mode = 'c' is out of range: use one of a, b"):
        cls(mode="c")
    assert declared_toml([spec]) == '\n[fed_toy]\n# h\nbeta = 0.5\n# h\nmode = "a"\n'
    assert declared_toml(SPECS) == "".join(declared_toml([s]) for s in SPECS if s.section)


def test_the_written_sections_come_first_and_section_reads_both_kinds() -> None:
    """The sections written in `federation.config.sections` keep their order (config.toml stays as it was); the
    declared ones follow, one per spec that declares any."""
    written = [f.name for f in dataclasses.fields(RunConfig) if f.name != "declared"]
    assert written[:3] == ["run", "data", "model"]
    assert list(SECTIONS) == [*written, *DECLARED]
    assert set(DECLARED) == {s.name for s in SPECS if s.section}
    config = load_config(None)
    for name in SECTIONS:
        assert config.section(name) is (config.declared[name] if name in DECLARED else getattr(config, name))
    with pytest.raises(KeyError, match=r"no section \[declared\]"):
        config.section("declared")
    assert pickle.loads(pickle.dumps(config)) == config


def test_the_configuration_imports_no_strategy_module_and_no_torch() -> None:
    """The configuration reads the registry (`federation.methods`), never the strategies package, whose modules
    import the configuration: no import loop between the two."""
    done = subprocess.run(
        [sys.executable, "-c", "import sys, federation.config\nprint(' '.join(sorted(sys.modules)))"],
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        capture_output=True,
        text=True,
        check=True,
    )
    loaded = done.stdout.split()
    assert "federation.methods" in loaded
    assert [m for m in loaded if m.startswith("federation.strategies") or m.split(".")[0] == "torch"] == []


def test_a_new_method_with_a_setting_of_its_own_needs_only_its_spec() -> None:
    """The toy method's spec alone gives it a section, a default in DEFAULTS_TOML and config.toml, the declared
    range check, the refusal of a changed value for any other method, ``--set`` and ``with_values``, and a
    configuration that pickles (ablation cells' worker processes) and reads back from its TOML."""
    plain = config_to_toml(load_config(REPO / "configs" / "demo.toml"))
    out = run_with_toy(
        """
import pickle, tomllib
from federation.config import DEFAULTS_TOML, SECTIONS, config_from_dict, config_to_toml, load_config, with_values
from federation.errors import FederationError
assert DEFAULTS_TOML.endswith("\\n[fedsketch]\\n# How hard the toy pulls.\\nbeta = 0.5\\n"), DEFAULTS_TOML[-200:]
assert list(SECTIONS)[-1] == "fedsketch"
toy = load_config(None, ["strategy.name=fedsketch", "fedsketch.beta=0.7"])
assert toy.section("fedsketch").beta == 0.7
assert config_to_toml(toy).endswith("[fedsketch]\\nbeta = 0.7\\n")
assert config_from_dict(tomllib.loads(config_to_toml(toy))) == toy  # what a hospital reads from Hello
assert pickle.loads(pickle.dumps(toy)) == toy
assert with_values(toy, "fedsketch", beta=0.25).section("fedsketch").beta == 0.25
for sets, says in (
    (["strategy.name=fedavg", "fedsketch.beta=0.7"],
     "config fedsketch.beta = 0.7 is out of range: leave it at its default: it applies only with strategy.name = "
     "fedsketch"),
    (["strategy.name=fedsketch", "fedsketch.beta=2"],
     "config fedsketch.beta = 2.0 is out of range: use a finite value in [0.0, 1.0]"),
    (["strategy.name=fedsketch", "fedsketch.beta=high"],
     "config fedsketch.beta = 'high' has the wrong type: expected float"),
    (["fedsketch.gamma=1"], "unknown key fedsketch.gamma; [fedsketch] accepts beta"),
):
    try:
        load_config(None, sets)
    except FederationError as exc:
        assert says in str(exc), (sets, str(exc))
    else:
        raise AssertionError(f"{sets} loaded")
assert load_config(None, ["strategy.name=fedavg", "fedsketch.beta=0.5"]).strategy.name == "fedavg"
print(config_to_toml(load_config("configs/demo.toml")), end="")
"""
    )
    assert out == plain + "\n[fedsketch]\nbeta = 0.5\n"
    assert "[fedsketch]" not in plain
