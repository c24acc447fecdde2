"""The Federation form finds what ``server.robust`` needs of the dataset's hospitals before a process starts (issue
48, part 4): a preset with the trimmed mean and a dataset of 2 hospitals is refused in the engine's own words, the
same preset with 3 is not."""

from __future__ import annotations

from pathlib import Path

from app.dashboard import checks, presets


def test_a_trimmed_mean_preset_on_two_hospitals_is_refused_before_a_run(tmp_path: Path) -> None:
    preset = tmp_path / "robust.toml"
    text = presets.DEFAULT_PRESET.read_text(encoding="utf-8")
    preset.write_text(f'{text}\n[server]\nrobust = "trimmed_mean"\n', encoding="utf-8")
    resolved = presets.resolve_preset(preset)[0]
    values = presets.initial_values(resolved, "fedavg")
    two = checks.check(preset, None, values, 2)
    assert two.general == [
        "config server.robust = 'trimmed_mean' needs at least 3 hospitals, and this run has 2: with fewer it drops "
        "nothing and is a plain mean; leave server.robust unset or federate 3 or more"
    ]
    assert checks.check(preset, None, values, 3).ok
