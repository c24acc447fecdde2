"""The Federation form's fields of the settings a method declares in its spec (`federation.methods.Setting`): a toy
method added with nothing but its spec (`support.toy_method`) gets its field among the method's hyper-parameters,
shown for it alone, with the declared label, help and limits, its starting value, the engine's check in the form's
words, and its ``--set`` on the command line."""

from __future__ import annotations

from support.toy_method import run_with_toy

from app.dashboard.fields import _LISTED, FIELDS, GROUPS, SPEC, declared_field
from federation.methods import SPECS, Setting


def test_the_form_lists_its_fields_by_group_and_the_declared_ones_after_the_listed() -> None:
    assert [f.group for f in FIELDS] == sorted((f.group for f in FIELDS), key=list(GROUPS).index)
    assert [f for f in FIELDS if f in _LISTED] == list(_LISTED)
    assert {f.key for f in FIELDS if f not in _LISTED} == {f"{s.name}.{x.name}" for s in SPECS for x in s.section}


def test_a_declared_setting_becomes_a_field_of_its_kind() -> None:
    spec = SPEC["fedprox"]
    number = declared_field(spec, Setting("rate", 0.5, "How fast.", minimum=0.0, maximum=2.0, step=0.1))
    assert (number.key, number.label, number.kind, number.group, number.help) == (
        "fedprox.rate",
        "rate",
        "float",
        "method",
        "How fast.",
    )
    assert (number.minimum, number.maximum, number.step, number.fmt, number.methods) == (0.0, 2.0, 0.1, "%g", None)
    count = declared_field(spec, Setting("steps", 3, "h", label="Steps", minimum=1))
    assert (count.label, count.kind, count.minimum, count.maximum, count.fmt) == ("Steps", "int", 1, None, None)
    assert declared_field(spec, Setting("on", True, "h")).kind == "bool"
    choice = declared_field(spec, Setting("dm", "l1", "h", choices=("l1", "l2")))
    assert (choice.kind, choice.options) == ("choice", ("l1", "l2"))


def test_a_new_methods_declared_setting_reaches_the_form_with_no_line_of_its_own() -> None:
    out = run_with_toy(
        """
from app.dashboard import checks, commands, fields, presets
assert fields.ALGORITHMS[-1] == "fedsketch" and fields.ALGORITHM_NAMES["fedsketch"] == "FedSketch (a toy)"
item = fields.FIELDS_BY_KEY["fedsketch.beta"]
assert (item.label, item.kind, item.group, item.help) == ("Sketch beta", "float", "method", "How hard the toy pulls.")
assert (item.minimum, item.maximum, item.step) == (0.0, 1.0, 0.05)
assert {n for n in fields.ALGORITHMS if item.applies({"strategy.name": n})} == {"fedsketch"}
method = [f.key for f in fields.FIELDS if f.group == "method"]
assert method[-1] == "fedsketch.beta", method
resolved = presets.resolve_preset(presets.DEFAULT_PRESET)[0]
values = presets.initial_values(resolved, "fedsketch")
assert values["fedsketch.beta"] == 0.5
assert checks.field_problem(item, 2.0, resolved) == "Sketch beta = 2: use a finite value in [0.0, 1.0]."
assert checks.field_problem(item, 0.7, resolved) is None
assert "fedsketch.beta=0.7" in commands.overrides({**values, "fedsketch.beta": 0.7}, resolved)
assert "fedsketch.beta=0.5" not in commands.overrides(values, resolved)  # the preset's value is not passed
other = {**presets.initial_values(resolved, "fedavg"), "fedsketch.beta": 0.7}
assert not any(s.startswith("fedsketch.") for s in commands.overrides(other, resolved))  # not fedavg's setting
checked = checks.check(presets.DEFAULT_PRESET, None, {**values, "fedsketch.beta": 2.0}, 3)
assert checked.fields == {"fedsketch.beta": "Sketch beta = 2: use a finite value in [0.0, 1.0]."}, checked
assert checks.check(presets.DEFAULT_PRESET, None, {**values, "fedsketch.beta": 0.7}, 3).ok
print("checked")
"""
    )
    assert out == "checked\n"
