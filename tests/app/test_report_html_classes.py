"""`gastric-fl report --html` on a 10-class run (issue 51): each hospital's page shows its accuracy, macro
one-vs-rest AUC, round curves and confusion matrix by class, says in one sentence that the binary task's notions do
not apply, and shows none of them; a damaged multi-class predictions.csv is one line and exit code 2."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest
from support.cli import run_cli
from support.ten_class import CLASSES, TenClassRun, build_ten_class_run

NOT_APPLICABLE = (
    "Not applicable to this 10-class model: the verdict, the threshold with its sensitivity and specificity, the ROC "
    "curve, example calls, slide calls and heatmaps (they judge the normal / abnormal task)."
)
# what only the binary task's report holds
BINARY_ONLY = (
    'data-metric="verdict"',
    'data-metric="sensitivity"',
    'data-metric="specificity"',
    'data-metric="threshold"',
    'id="roc-curve"',
    'id="examples"',
    'id="slides"',
    "data-slide=",
    'data-metric="slide_calls"',
)


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> TenClassRun:
    return build_ten_class_run(tmp_path_factory.mktemp("ten_class") / "data")


@pytest.fixture
def run(trained: TenClassRun, tmp_path: Path) -> Path:
    copy = tmp_path / "run"
    shutil.copytree(trained.run, copy, ignore=shutil.ignore_patterns("checkpoints"))
    return copy


def _metric(page: str, key: str) -> str:
    found = re.search(rf'data-metric="{key}">([^<]*)<', page)
    assert found, key
    return found.group(1)


def _records(run: Path, hospital: int) -> list[dict]:
    lines = (run / "metrics.jsonl").read_text(encoding="utf-8").splitlines()
    return sorted((r for r in map(json.loads, lines) if r["client"] == hospital), key=lambda r: r["round"])


def _cells(page: str) -> dict[tuple[int, int], int]:
    return {(int(i), int(j)): int(n) for i, j, n in re.findall(r'data-cell="(\d+),(\d+)">(\d+)<', page)}


def test_each_hospital_of_a_ten_class_run_gets_a_report_of_what_applies(
    run: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    assert run_cli(monkeypatch, "report", str(run), "--html") == 0
    assert capsys.readouterr().err == ""  # no slide is scored, nothing is warned about
    for hospital in (0, 1):
        page = (run / "hospitals" / f"client_{hospital:02d}" / "report.html").read_text(encoding="utf-8")
        assert page.count(NOT_APPLICABLE) == 1
        for marker in BINARY_ONLY:
            assert marker not in page, marker
        assert "<script" not in page.lower()
        # the figures agree with the engine's own evaluation of the last round, recomputed from predictions.csv
        records = _records(run, hospital)
        last = records[-1]
        assert _metric(page, "accuracy") == f"{last['test_acc']:.4f}" == _metric(page, "engine_acc")
        assert _metric(page, "auc") == f"{last['test_auc']:.4f}" == _metric(page, "engine_auc")
        assert _metric(page, "tiles") == str(last["num_test"])
        # the round curves: one row per round, the engine's figures
        rows = re.findall(
            r'<tr><td class="num">(\d+)</td><td class="num">([^<]*)</td><td class="num">([^<]*)</td>', page
        )
        assert rows == [(str(r["round"]), f"{r['test_acc']:.4f}", f"{r['test_auc']:.4f}") for r in records]
        assert re.search(r'<figure id="round-curves"><img src="data:image/png;base64,', page)
        # the confusion matrix: every class named, as many tiles as the split holds, the diagonal the accuracy
        assert [f"called {c}" in page and f"truly {c}" in page for c in CLASSES] == [True] * 10
        cells = _cells(page)
        assert len(cells) == 100
        assert sum(cells.values()) == last["num_test"]
        right = sum(cells[(i, i)] for i in range(10))
        assert f"{right / last['num_test']:.4f}" == _metric(page, "accuracy")


def test_figures_are_computed_from_the_hospitals_predictions(run: Path) -> None:
    """A hand-made predictions.csv of 6 tiles of classes 0, 0, 0, 1, 1, 2 (probabilities on classes 0-2 only).

    One-vs-rest AUC, by hand: class 0 (scores 0.7, 0.5, 0.2 against 0.3, 0.6, 0.1) wins 3 + 2 + 1 of 9 pairs = 6/9;
    class 1 (0.4, 0.1 against 0.2, 0.3, 0.6, 0.3) wins 3 + 0 of 8 = 3/8; class 2 (0.6 against 0.1, 0.2, 0.2, 0.3,
    0.3) wins 5 of 5. Macro mean (6/9 + 3/8 + 1) / 3 = 49/72 = 0.680556. Argmax calls 0, 0, 1, 1, 0, 2: 4 of 6
    right, 0.6667; confusion (truth, call): (0, 0) 2, (0, 1) 1, (1, 0) 1, (1, 1) 1, (2, 2) 1.
    """
    from app.report_html import report_html

    rows = [
        (0, (0.7, 0.2, 0.1)),
        (0, (0.5, 0.3, 0.2)),
        (0, (0.2, 0.6, 0.2)),
        (1, (0.3, 0.4, 0.3)),
        (1, (0.6, 0.1, 0.3)),
        (2, (0.1, 0.3, 0.6)),
    ]
    lines = ["client,path,label," + ",".join(f"prob_{c}" for c in CLASSES) + ",round"]
    for i, (label, probs) in enumerate(rows):
        padded = [*probs, *([0.0] * 7)]
        lines.append(f"0,client_00/test/{label}/t{i}.png,{label}," + ",".join(map(str, padded)) + ",2")
    (run / "hospitals" / "client_00" / "predictions.csv").write_text("\n".join(lines) + "\n", encoding="utf-8")

    page = report_html(run, 0)
    assert _metric(page, "auc") == f"{49 / 72:.4f}" == "0.6806"
    assert _metric(page, "accuracy") == "0.6667"
    assert _metric(page, "tiles") == "6"
    assert _metric(page, "classes_present") == "3 of 10"
    cells = _cells(page)
    assert {k: n for k, n in cells.items() if n} == {(0, 0): 2, (0, 1): 1, (1, 0): 1, (1, 1): 1, (2, 2): 1}
    assert page.count(NOT_APPLICABLE) == 1


def test_a_damaged_multi_class_predictions_file_is_one_line_and_exit_2(
    run: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    path = run / "hospitals" / "client_01" / "predictions.csv"
    lines = path.read_text(encoding="utf-8").splitlines()
    fields = lines[3].split(",")
    fields[2] = "sock"  # a label that is no class
    lines[3] = ",".join(fields)
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    assert run_cli(monkeypatch, "report", str(run), "--html") == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err
    assert "Traceback" not in err
    assert f"{path}, line 4: label must be one of the classes 0, 1" in err
    assert "rerun the run to write the file anew" in err
    assert not (run / "hospitals" / "client_00" / "report.html").exists()  # nothing written when one fails
