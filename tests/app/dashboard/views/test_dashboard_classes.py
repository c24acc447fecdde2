"""Every dashboard page on a real 10-class run (issue 51; tests/support/ten_class.py): no exception, the figures that
apply are the run's own, and where a binary notion does not apply the page says so in one line instead."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import numpy as np
import pytest
from streamlit.testing.v1 import AppTest
from support.dashboard import open_page
from support.ten_class import CLASSES, TenClassRun, build_ten_class_run

NOT_APPLICABLE = "Not applicable to this 10-class model: "
ENDING = "(they judge the normal / abnormal task)."


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> TenClassRun:
    return build_ten_class_run(tmp_path_factory.mktemp("ten_class_dashboard") / "data")


@pytest.fixture
def root(trained: TenClassRun, monkeypatch: pytest.MonkeyPatch) -> TenClassRun:
    monkeypatch.setenv("GASTRIC_FL_DATA", str(trained.root))
    return trained


def _lines(at: AppTest) -> list[str]:
    """The page's one-line notes on what does not apply."""
    return [str(i.value) for i in at.info if NOT_APPLICABLE in str(i.value)]


def _last(run: Path) -> dict[int, dict]:
    last: dict[int, dict] = {}
    for line in (run / "metrics.jsonl").read_text(encoding="utf-8").splitlines():
        record = json.loads(line)
        last[record["client"]] = record  # rounds are written in order: the later one replaces the earlier
    return last


@pytest.mark.parametrize(
    ("page", "notions"),
    [
        ("federation", "verdicts, sensitivity and specificity"),
        ("verdict", "the verdict, its floor and the threshold it judges at"),
        ("compare", "verdicts"),
        ("slide", "the Slide page's map of P(abnormal) and its slide call"),
    ],
)
def test_a_binary_notion_is_one_line_on_each_page(root: TenClassRun, page: str, notions: str) -> None:
    at = open_page(page)  # no exception
    (line,) = _lines(at)
    assert f"{NOT_APPLICABLE}{notions} {ENDING}" in line
    assert not at.error, [e.value for e in at.error]
    assert not any("verdict" in d.value.columns for d in at.dataframe)  # no verdict table


def test_the_federation_page_shows_the_runs_figures(root: TenClassRun) -> None:
    at = open_page("federation", {"selected_run": root.run.name})
    last = _last(root.run)
    (latest,) = [d.value for d in at.dataframe if "test AUC" in d.value.columns]
    assert latest.set_index("hospital")["test AUC"].to_dict() == {f"Hospital {h}": last[h]["test_auc"] for h in last}
    assert latest.set_index("hospital")["test ACC"].to_dict() == {f"Hospital {h}": last[h]["test_acc"] for h in last}
    shown = next(str(m.value) for m in at.metric if m.label == "Averaged AUC")
    assert shown == f"{np.mean([r['test_auc'] for r in last.values()]):.3f}"
    assert not at.warning  # the binary scorecard's AUC-versus-accuracy warning does not apply


def test_the_hospital_page_shows_accuracy_macro_auc_and_the_confusion_matrix(root: TenClassRun) -> None:
    at = open_page("hospital")
    (line,) = _lines(at)
    assert "the scorecard, the verdict, the threshold with its sensitivity and specificity" in line
    assert not at.error, [e.value for e in at.error]
    last = _last(root.run)
    table = next(d.value for d in at.dataframe if "test ACC" in d.value.columns).set_index("hospital")
    assert table["test ACC"].to_dict() == {f"Hospital {h}": last[h]["test_acc"] for h in last}
    assert table["test AUC"].to_dict() == {f"Hospital {h}": last[h]["test_auc"] for h in last}
    # Hospital 0 (the first): its predictions.csv, counted by hand here
    with (root.hospital(0) / "predictions.csv").open(newline="", encoding="utf-8") as handle:
        rows = list(csv.DictReader(handle))
    expected = np.zeros((10, 10), dtype=int)
    for row in rows:
        called = int(np.argmax([float(row[f"prob_{c}"]) for c in CLASSES]))
        expected[CLASSES.index(row["label"]), called] += 1
    matrix = next(d.value for d in at.dataframe if "called 0" in d.value.columns)
    assert list(matrix.columns) == [f"called {c}" for c in CLASSES]
    assert list(matrix.index) == [f"truly {c}" for c in CLASSES]
    assert matrix.to_numpy().tolist() == expected.tolist()
    metrics = {m.label: str(m.value) for m in at.metric}
    assert metrics["Accuracy"] == f"{np.trace(expected) / len(rows):.3f}" == f"{last[0]['test_acc']:.3f}"
    assert metrics["Macro AUC"] == f"{last[0]['test_auc']:.3f}"
    assert metrics["Test tiles"] == str(len(rows)) == str(last[0]["num_test"])
    assert not [c for c in at.get("plotly_chart") if "ROC" in str(c.proto)]  # no ROC curve


def test_the_data_page_counts_every_class(root: TenClassRun) -> None:
    at = open_page("data")
    assert not at.error, [e.value for e in at.error]
    table = next(d.value for d in at.dataframe if "hospital" in d.value.columns).set_index("hospital")
    with (root.dataset / "manifest.csv").open(newline="", encoding="utf-8") as handle:
        manifest = list(csv.DictReader(handle))
    for hospital in (0, 1):
        for split in ("train", "val", "test"):
            counted = [
                sum(r["client"] == str(hospital) and r["split"] == split and r["label"] == c for r in manifest)
                for c in CLASSES
            ]
            assert table.loc[f"Hospital {hospital}", [f"{split} {c}" for c in CLASSES]].tolist() == counted
    assert table["total"].sum() == len(manifest)
