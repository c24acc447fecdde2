"""No dashboard page waits on torch, neither for its first content nor to settle: the modules the pages import at
the top, the readers of run files behind the Compare page, the run configuration and the Federation form's checks
(the strategy registry, the models' names), and the Data, Federation, Hospital and Compare pages themselves never
import torch."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from support.dashboard import Fixture

ROOT = Path(__file__).resolve().parents[3]
MODULES = (
    "app.run_records",
    "app.dashboard.ui",
    "app.dashboard.charts",
    "app.evaluation.tables",  # and through it metrics, threshold, words and verdict
    "app.datasets",
    "app.errors",
    "app.dashboard.paths",
    "federation.report",  # what the Compare page reads runs with
    "app.dashboard.fields",  # the Federation form's fields
    "app.dashboard.presets",  # the form's presets and starting values
    "app.dashboard.checks",  # the form's checks, also the Compare page's launcher's
    "app.dashboard.commands",  # the command lines the form and the launcher start
    "federation.config",  # what the checks load the configuration with
)


def _loaded(code: str, env: dict[str, str] | None = None) -> set[str]:
    """The top-level packages loaded by ``code`` in a fresh interpreter (it prints them)."""
    done = subprocess.run(
        [sys.executable, "-c", code + "\nimport sys\nprint(' '.join(sorted({m.split('.')[0] for m in sys.modules})))"],
        cwd=ROOT,
        env={**os.environ, **(env or {})},
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    return set(done.stdout.split())


def test_the_dashboard_modules_do_not_import_torch() -> None:
    loaded = _loaded("\n".join(f"import {m}" for m in MODULES))
    assert "pandas" in loaded  # the check sees what was imported
    assert "torch" not in loaded
    assert "sklearn" not in loaded  # imported when the first ROC is computed, after the page's first content


def test_checking_the_form_and_loading_a_configuration_import_no_torch() -> None:
    """The whole check the Federation form runs (every field, the configuration as train loads it, the start-time
    rules: AMP's bound, nhead within the model's layer units, the input size), with a FedSAF whose alpha_k breaks the
    bound so that every rule is reached; the old import paths still give the same names."""
    code = f"""
from pathlib import Path
from app.dashboard import checks, presets
from federation.config import load_config
load_config({str(ROOT / "configs" / "demo.toml")!r})
resolved = presets.resolve_preset(presets.DEFAULT_PRESET)[0]
values = presets.initial_values(resolved, "fedsaf")
values["amp.alpha_k"] = 100.0
values["strategy.nhead"] = 99
checked = checks.check(presets.DEFAULT_PRESET, None, values, 3)
assert set(checked.fields) == {{"amp.alpha_k", "strategy.nhead"}}, checked
import models, federation.strategies, models.names, federation.methods as registry
assert models.MODEL_NAMES is models.names.MODEL_NAMES
assert federation.strategies.STRATEGY_NAMES is registry.STRATEGY_NAMES
assert federation.strategies.default_nhead is registry.default_nhead
"""
    loaded = _loaded(code)
    assert {"app", "federation", "models"} <= loaded  # the check sees what was imported
    assert "torch" not in loaded
    assert "torchvision" not in loaded


def test_the_data_and_hospital_pages_do_not_import_torch(fixture_root: Fixture) -> None:
    code = f"""
from streamlit.testing.v1 import AppTest
at = AppTest.from_file({str(ROOT / "app" / "dashboard" / "main.py")!r}, default_timeout=90)
at.run()
at.switch_page("views/hospital.py")
at.run()
assert not at.exception, [e.value for e in at.exception]
assert at.get("plotly_chart"), "the Hospital page drew its charts"
"""
    loaded = _loaded(code, {"GASTRIC_FL_DATA": str(fixture_root.root)})
    assert "streamlit" in loaded
    assert "sklearn" in loaded  # the ROC curve was computed
    assert "torch" not in loaded


def test_the_federation_and_compare_pages_do_not_import_torch(fixture_root: Fixture) -> None:
    """Both pages run the form's checks (the Federation form, the Compare page's ablation launcher) to settle."""
    code = f"""
from streamlit.testing.v1 import AppTest
at = AppTest.from_file({str(ROOT / "app" / "dashboard" / "main.py")!r}, default_timeout=90)
at.run()
for page, button in (("views/federation.py", "Start federation"), ("views/compare.py", "Queue ")):
    at.switch_page(page)
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    assert any(b.label.startswith(button) for b in at.button), [b.label for b in at.button]  # drawn after the checks
"""
    loaded = _loaded(code, {"GASTRIC_FL_DATA": str(fixture_root.root)})
    assert {"streamlit", "plotly"} <= loaded
    assert "torch" not in loaded
