"""No dashboard page waits on torch to show its first content: the modules the pages import at the top, the readers
of run files behind the Compare page, and the Data and Hospital pages themselves never import torch."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from dashboard_fixtures import Fixture

ROOT = Path(__file__).resolve().parents[2]
MODULES = (
    "app.dashboard.runs",
    "app.dashboard.ui",
    "app.dashboard.charts",
    "app.dashboard.evaluation",
    "app.dashboard.datasets",
    "app.dashboard.errors",
    "app.dashboard.paths",
    "federation.report",  # what the Compare page reads runs with
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
