"""The Federation form's settings without Streamlit: the fields agree with federation.config (limits, names,
the strategy registry), each invalid field gets its own message from the engine's checks, rules between fields
and the engine's start-time rules are found, and the command carries only what the method reads."""

from __future__ import annotations

import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

import pytest
from support.dashboard import write_prepared

from app.dashboard import checks, commands, fields, live, presets
from app.run_records import Progress
from federation.config import DEFAULTS_TOML, SECTIONS, load_config
from federation.errors import FederationError
from federation.progress import RoundProgress

DEMO = presets.DEFAULT_PRESET


@pytest.fixture(scope="module")
def resolved() -> dict[str, Any]:
    return presets.resolve_preset(DEMO)[0]


@pytest.fixture(scope="module")
def dataset(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("data") / "tiny"
    write_prepared(folder)
    return folder


def _values(resolved: dict[str, Any], method: str = "fedsaf", **changes: Any) -> dict[str, Any]:
    values = presets.initial_values(resolved, method)
    values.update({key.replace("__", "."): value for key, value in changes.items()})
    return values


def test_every_field_is_a_setting_of_the_run_configuration() -> None:
    assert fields.FIELDS
    for item in fields.FIELDS:
        assert item.section in SECTIONS, item.key
        assert item.name in SECTIONS[item.section].__dataclass_fields__, item.key
    defaults = presets.resolve_preset(None)[0]
    choices = [item for item in fields.FIELDS if item.kind == "choice"]
    assert choices
    for item in choices:  # every option is accepted by the engine
        assert item.options, item.key
        for option in item.options:
            assert checks.field_problem(item, option, defaults, {"strategy.name": "fedavg"}) is None, option


def _below(item: fields.Field) -> float:
    assert item.minimum is not None
    return item.minimum - 1 if item.kind == "int" else item.minimum - 1e-9


@pytest.mark.parametrize("item", [f for f in fields.FIELDS if f.kind in ("int", "float")], ids=lambda f: f.key)
def test_number_limits_never_allow_what_the_engine_refuses(item: fields.Field) -> None:
    """Below the widget's minimum the engine refuses too, so the limit costs nothing; at the minimum the engine
    either accepts, or the field has a message (an exclusive bound such as lr > 0)."""
    defaults = presets.resolve_preset(None)[0]
    context = {"strategy.name": "fedavg", "strategy.wrap": ["fedlws", "fedtlu"], "client.optimizer": "adam"}
    assert checks.field_problem(item, _below(item), defaults, context) is not None
    at_minimum = checks.field_problem(item, item.minimum, defaults, context)
    exclusive = {"client.lr", "amp.sigma", "amp.alpha_k", "precision_weighted.eps", "fedlws.beta", "fedtlu.portion"}
    exclusive |= {"adam.eps"}
    assert (at_minimum is not None) == (item.key in exclusive), (item.key, at_minimum)


def test_each_invalid_field_gets_its_own_message(resolved: dict[str, Any], dataset: Path) -> None:
    values = _values(resolved, client__lr=0.0, amp__sigma=-1.0, fedsaf__fisher_batch=0)
    checked = checks.check(DEMO, dataset, values, 3)
    assert list(checked.fields) == ["client.lr", "amp.sigma", "fedsaf.fisher_batch"]
    assert checked.fields["client.lr"] == "Learning rate = 0: use a finite value > 0."
    assert checked.fields["amp.sigma"] == "sigma = -1: use a finite value > 0."
    assert checked.fields["fedsaf.fisher_batch"] == "Fisher mini-batch = 0: use a value >= 1."
    assert not checked.ok
    # The same settings through the CLI's loader fail too (on the first of them).
    with pytest.raises(FederationError):
        load_config(DEMO, commands.overrides(values, resolved), dataset)
    assert checks.check(DEMO, dataset, _values(resolved), 3).ok


def test_a_field_hidden_behind_another_failure_of_its_section_is_found(resolved: dict[str, Any]) -> None:
    # [client] checks start, optimizer, epochs, lr, momentum... in that order and stops at the first failure.
    values = _values(resolved, client__lr=0.0, client__momentum=1.0, client__weight_decay=-0.5)
    checked = checks.check(DEMO, None, values, 3)
    assert list(checked.fields) == ["client.lr", "client.momentum", "client.weight_decay"]


def test_an_error_from_loading_the_configuration_goes_to_the_field_its_key_names(
    resolved: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    # The field comes from FederationError.key, not from the words of the message.
    def refuse(key: str | None, message: str) -> None:
        def load(*args: Any, **kwargs: Any) -> None:
            raise FederationError(message, key=key)

        monkeypatch.setattr(checks, "load_config", load)

    values = _values(resolved)
    refuse("client.lr", "too steep for these tiles")
    checked = checks.check(DEMO, None, values, 3)
    assert checked.fields == {"client.lr": "Learning rate: too steep for these tiles"}
    assert checked.general == []
    # The engine's "config s.k = v is out of range: need" still reads as "Label = v: need." on its field.
    refuse("amp.sigma", "config amp.sigma = 2.0 is out of range: use at most 1")
    sigma = values["amp.sigma"]
    assert checks.check(DEMO, None, values, 3).fields == {"amp.sigma": f"sigma = {sigma:g}: use at most 1."}
    # No key, a key the form does not offer, or a setting the method does not read: a general problem, even when
    # the message mentions a field.
    for key in (None, "server.max_weight", "fedprox.mu"):
        refuse(key, "config client.lr = 0.05 is out of range: lower it")
        checked = checks.check(DEMO, None, values, 3)
        assert checked.fields == {}, key
        assert checked.general == ["config client.lr = 0.05 is out of range: lower it"], key


def test_a_section_error_about_another_key_is_not_the_fields(monkeypatch: pytest.MonkeyPatch) -> None:
    defaults = presets.resolve_preset(None)[0]
    lr = fields.FIELDS_BY_KEY["client.lr"]

    class AboutMomentum:
        def __init__(self, **values: Any) -> None:
            raise FederationError("config client.lr = 0.01 is fine, the momentum is not", key="client.momentum")

    class AboutNoKey:
        def __init__(self, **values: Any) -> None:
            raise FederationError("the section refuses this learning rate")

    monkeypatch.setitem(SECTIONS, "client", AboutMomentum)
    assert checks.field_problem(lr, 0.01, defaults) is None
    monkeypatch.setitem(SECTIONS, "client", AboutNoKey)
    assert checks.field_problem(lr, 0.01, defaults) == "Learning rate: the section refuses this learning rate"


def test_rules_between_settings_and_at_start_are_found(resolved: dict[str, Any]) -> None:
    # AMP's bound alpha_k x (m - 1) <= sigma (federation.strategies.amp.check_amp_settings), with 3 hospitals.
    assert checks.check(DEMO, None, _values(resolved, amp__alpha_k=0.5, amp__sigma=1.0), 3).ok
    too_big = checks.check(DEMO, None, _values(resolved, amp__alpha_k=0.6), 3)
    assert "lower alpha_k to at most 0.5" in too_big.fields["amp.alpha_k"]
    # FedAvg does not read alpha_k: the bound does not apply, and the field is not passed.
    assert checks.check(DEMO, None, _values(resolved, "fedavg", amp__alpha_k=5.0), 3).ok
    # precision_weighted needs Adam: the engine's rule between strategy.name and client.optimizer.
    pw = checks.check(DEMO, None, _values(resolved, "precision_weighted"), 3)
    assert "set client.optimizer = adam" in pw.fields["client.optimizer"]
    assert checks.check(DEMO, None, _values(resolved, "precision_weighted", client__optimizer="adam"), 3).ok
    # A wrapper needs an averaging method; its own settings are checked once it is chosen.
    assert checks.check(DEMO, None, _values(resolved, "fedavg", strategy__wrap=["fedtlu"]), 3).ok
    portion = checks.check(DEMO, None, _values(resolved, "fedavg", strategy__wrap=["fedtlu"], fedtlu__portion=0), 3)
    assert list(portion.fields) == ["fedtlu.portion"]
    # Epochs: client.epochs + client.head_epochs must train something; FedSAF's split needs a head epoch.
    none = checks.check(DEMO, None, _values(resolved, client__epochs=0, client__head_epochs=0), 3)
    assert "train for at least one epoch" in none.fields["client.epochs"]
    headless = checks.check(DEMO, None, _values(resolved, client__head_epochs=0), 3)
    assert "trains the head first" in headless.fields["client.head_epochs"]
    assert checks.check(DEMO, None, _values(resolved, client__head_epochs=0, fedsaf__split=False), 3).ok
    small = checks.check(DEMO, None, _values(resolved, data__input_size=16), 3)
    assert "at least 32 pixels" in small.fields["data.input_size"]
    assert checks.check(DEMO, None, _values(resolved), 1).general == [
        "The dataset has 1 hospital(s): a federation needs at least 2."
    ]
    assert checks.check(DEMO, None, _values(resolved, "separate"), 1).ok


def test_fields_apply_to_the_methods_that_read_them(resolved: dict[str, Any]) -> None:
    def shown(method: str, **changes: Any) -> set[str]:
        values = _values(resolved, method, **changes)
        return {f.key for f in fields.FIELDS if f.applies(values)}

    assert {"strategy.nhead", "amp.dm", "amp.alpha_k", "fedsaf.fim", "client.start"} <= shown("fedsaf")
    assert "fedamp.dm" not in shown("fedsaf")
    assert "amp.dm" not in shown("fedamp")
    assert "fedamp.dm" in shown("fedamp")
    assert not {"strategy.nhead", "amp.sigma", "client.start", "strategy.bn"} & shown("separate")
    assert "strategy.bn" not in shown("fedbn")  # FedBN fixes it
    assert "fedlws.beta" not in shown("fedavg")
    assert "fedlws.beta" in shown("fedavg", strategy__wrap=["fedlws"])
    assert "adam.beta1" in shown("fedavg", client__optimizer="adam")
    assert "client.momentum" not in shown("fedavg", client__optimizer="adam")
    assert {f.key for f in fields.FIELDS if f.group == "plain"} == {
        "strategy.name",
        "run.rounds",
        "run.seed",
        "client.epochs",
        "client.lr",
    }


def test_the_command_carries_the_method_the_rounds_and_what_changed(resolved: dict[str, Any], tmp_path: Path) -> None:
    assert commands.overrides(_values(resolved), resolved) == ["strategy.name=fedsaf", "run.rounds=4"]
    changed = _values(resolved, run__rounds=1, amp__dm="cosine", fedsaf__fim=False, strategy__nhead=3)
    assert commands.overrides(changed, resolved) == [
        "strategy.name=fedsaf",
        "run.rounds=1",
        "strategy.nhead=3",
        "amp.dm=cosine",
        "fedsaf.fim=false",
    ]
    # A setting the method does not read is never passed, whatever its value.
    avg = commands.overrides(_values(resolved, "fedavg", amp__alpha_k=0.3, strategy__wrap=["fedlws"]), resolved)
    assert avg == ["strategy.name=fedavg", "run.rounds=4", 'strategy.wrap=["fedlws"]']
    command = commands.train_command(DEMO, tmp_path / "ds", tmp_path / "run", ["run.rounds=1"])
    assert command[3:9] == ["train", "--config", str(DEMO), "--data", str(tmp_path / "ds"), "--out"]
    assert command[-3:] == [str(tmp_path / "run"), "--set", "run.rounds=1"]
    assert commands.as_typed(command).startswith("gastric-fl train --config ")
    # What the CLI resolves from these overrides is what the form showed.
    config = load_config(DEMO, commands.overrides(changed, resolved), tmp_path)
    assert (config.run.rounds, config.strategy.nhead, config.amp.dm, config.fedsaf.fim) == (1, 3, "cosine", False)


def test_a_new_method_starts_from_its_own_nhead(resolved: dict[str, Any]) -> None:
    assert presets.initial_values(resolved, "fedrep")["strategy.nhead"] == 1
    assert presets.initial_values(resolved, "fedsaf")["strategy.nhead"] == 6
    assert commands.overrides(_values(resolved, "fedrep"), resolved) == ["strategy.name=fedrep", "run.rounds=4"]


def test_a_preset_that_is_not_toml_falls_back_to_the_defaults(tmp_path: Path) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text("[run\n")
    values, problem = presets.resolve_preset(bad)
    assert problem is not None
    assert str(bad) in problem
    assert "\n" not in problem
    assert values["run"]["rounds"] == tomllib.loads(DEFAULTS_TOML)["run"]["rounds"]


def test_the_banner_sentence_is_plain() -> None:
    values = {"strategy.name": "fedsaf", "run.rounds": 4}
    assert commands.describe_run(values, "demo") == "Training FedSAF on demo, 4 rounds"
    assert commands.describe_run({"strategy.name": "fedavg", "run.rounds": 1}, "x") == "Training FedAvg on x, 1 round"


def test_new_run_id_never_reuses_a_folder() -> None:
    first = commands.new_run_id("fedsaf", set(), now=0.0)
    assert first.endswith("-fedsaf")
    assert commands.new_run_id("fedsaf", {first}, now=0.0) == f"{first}-2"


def test_the_progress_bar_within_a_round() -> None:
    state = Progress(rounds_done=2, rounds_total=5, seconds_elapsed=30.0, seconds_left=95.0)
    assert live.bar(state, None, True) == (0.4, "Round 2 of 5 · about 1 min 35 s left")
    training = RoundProgress(3, 5, "training", 1, 4, 0.0)
    fraction, text = live.bar(state, training, True)
    assert text == "Round 2 of 5 · round 3: training, 1 of 4 hospitals done · about 1 min 35 s left"
    assert fraction == pytest.approx((2 + 0.8 * 1 / 4) / 5)
    evaluating = RoundProgress(3, 5, "evaluating", 2, 4, 0.0)
    assert live.bar(state, evaluating, True)[0] == pytest.approx((2 + 0.85 + 0.15 * 2 / 4) / 5)
    assert "combining the hospitals' updates" in live.bar(state, RoundProgress(3, 5, "aggregating", 0, 4, 0.0), True)[1]
    # A step of a finished round (between rounds), or a run that is not running, adds nothing.
    assert live.bar(state, RoundProgress(2, 5, "evaluating", 4, 4, 0.0), True) == (
        0.4,
        "Round 2 of 5 · about 1 min 35 s left",
    )
    assert live.bar(state, training, False) == (0.4, "Round 2 of 5")


def test_drawing_the_form_imports_no_torch() -> None:
    """What the Federation and Compare pages do before their first content: resolve the preset, the form's values
    and limits, the command, the queue; only `checks.check` (after the form is drawn) imports the engine."""
    code = (
        "import sys\n"
        "from app.dashboard import commands, compare, fields, jobs, live, presets\n"
        "resolved, _ = presets.resolve_preset(presets.DEFAULT_PRESET)\n"
        "values = presets.initial_values(resolved, 'fedsaf')\n"
        "assert presets.presets() and commands.overrides(values, resolved)\n"
        "[f.applies(values) and fields.limits(f, 15) for f in fields.FIELDS]\n"
        "print('torch' in sys.modules)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120)
    assert done.stdout.strip() == "False"


def test_a_methods_nhead_rule_is_read_from_its_spec_by_the_form_and_the_strategy(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # one place: change FedRep's least head in its StrategySpec and both the dashboard's check and FedRep's own
    # build() follow, with the same number
    import dataclasses

    import federation.methods as registry
    from federation.strategies.fedrep import build

    monkeypatch.setitem(registry.SPEC, "fedrep", dataclasses.replace(registry.SPEC["fedrep"], min_nhead=2))
    config = load_config(None, ["strategy.name=fedrep", "strategy.nhead=1"])
    problems = checks._start_problems(config, 3)
    assert ("strategy.nhead", "nhead = 1: FedRep needs a local head, so use 2 or more (or FedAvg).") in problems
    with pytest.raises(FederationError, match=r"strategy.nhead >= 2"):
        build(config, None)  # type: ignore[arg-type]  # refused before the context is read
    fixed = load_config(None, ["strategy.name=fedamp", "strategy.nhead=1"])
    assert (None, "FedAMP shares the whole model, so strategy.nhead must be 0 (the preset sets 1).") in (
        checks._start_problems(fixed, 3)
    )
    assert not [
        p for p in checks._start_problems(load_config(None, ["strategy.name=separate"]), 1) if "federation" in p[1]
    ]


def test_the_nhead_limit_of_a_timm_architecture_is_its_own() -> None:
    """A preset may name a timm architecture (models.names): nhead's upper bound is that model's layer units, not
    the default model's; a name that is no model keeps the default bound (the configuration check says why)."""
    from models import create_model, split_units

    units = len(split_units(create_model("timm/mobilenetv3_small_050")))
    assert units == 14
    assert fields.model_units("timm/mobilenetv3_small_050") == units
    assert fields.model_units("mobilenet_v3_small") == fields.DEFAULT_UNITS == 15
    assert fields.model_units("timm/no_such_network") == fields.DEFAULT_UNITS
