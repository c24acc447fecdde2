"""Every chart of the dashboard has a text alternative (issue 23, item 8): the pages draw Plotly charts only with an
``alt`` (`app.dashboard.ui.chart`, or the Slide page's own), and `charts.describe` words a figure's data."""

from __future__ import annotations

import ast
from pathlib import Path

import pandas as pd
import plotly.graph_objects as go
from support.checks import every
from support.dashboard import Fixture, open_page

from app.dashboard import charts

VIEWS = Path(__file__).resolve().parents[3] / "app" / "dashboard" / "views"


def test_no_page_draws_a_chart_without_a_text_alternative() -> None:
    calls = 0
    for path in sorted(VIEWS.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
                if node.func.attr == "plotly_chart":
                    calls += 1
                    assert any(k.arg == "alt" for k in node.keywords), f"{path.name}:{node.lineno} has no alt"
                if node.func.attr == "chart" and isinstance(node.func.value, ast.Name) and node.func.value.id == "ui":
                    calls += 1  # ui.chart gives the figure's description when no alt is given
    assert calls >= 13


def test_describe_words_a_figures_data() -> None:
    table = pd.DataFrame({"Hospital 0": [0.5, 0.75, 0.9], "Hospital 1": [0.6, 0.65, 0.7]}, index=[1, 2, 3])
    fig = charts.per_hospital(table, "Test AUC per hospital", "AUC")
    assert charts.describe(fig) == (
        "Test AUC per hospital (AUC against round): Hospital 0: 0.5 at round 1 to 0.9 at round 3; "
        "Hospital 1: 0.6 at round 1 to 0.7 at round 3."
    )
    heat = go.Figure(go.Heatmap(z=[[1, 2], [3, 4]]))
    heat.update_layout(title="xi")
    assert charts.describe(heat) == "xi (y against x): a 2 by 2 grid of values from 1 to 4."
    assert charts.describe(go.Figure()) == "Chart (y against x): no data yet."


def test_the_pages_charts_carry_their_alt(fixture_root: Fixture) -> None:
    at = open_page("federation", {"selected_run": fixture_root.finished.name})
    alts = [c.proto.alt for c in at.get("plotly_chart")]
    assert len(alts) >= 5
    assert every(alts), alts
    assert any(a.startswith("Test AUC per hospital (AUC against round): Hospital 0:") for a in alts), alts
