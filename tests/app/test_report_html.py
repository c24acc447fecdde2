"""`gastric-fl report --html`: one self-contained file per hospital whose figures are the run's own, written safely;
bad input is one line and exit code 2 with nothing written."""

from __future__ import annotations

import base64
import csv
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from support.checks import every
from support.cli import run_cli
from support.slides import TrainedRoot, build_trained_root, copy_root

from federation.runs import RUN_PATTERNS
from infra.outputs import MARKER_NAME, foreign_entries, read_marker

IMG = re.compile(r"<img\b[^>]*>")


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> TrainedRoot:
    return build_trained_root(tmp_path_factory.mktemp("report") / "data")


@pytest.fixture
def data(trained: TrainedRoot, tmp_path: Path) -> TrainedRoot:
    return copy_root(trained, tmp_path / "data")


def _metric(page: str, key: str) -> str:
    found = re.search(rf'data-metric="{key}">([^<]*)<', page)
    assert found, key
    return found.group(1)


def _one_line_error(capsys: pytest.CaptureFixture[str], *words: str) -> str:
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: "), err
    assert "\n" not in err, err
    assert "Traceback" not in err, err
    for word in words:
        assert word in err, err
    return err


def _server_part(run: Path) -> dict[str, int]:
    """Every file of the run outside ``hospitals/`` with its size: what the server's part holds."""
    return {
        p.relative_to(run).as_posix(): p.stat().st_size
        for p in run.rglob("*")
        if p.is_file() and p.relative_to(run).parts[0] != "hospitals"
    }


def _last_round(run: Path, client: int) -> dict:
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if line.strip()]
    return max((r for r in records if r["client"] == client), key=lambda r: r["round"])


def test_report_html_is_self_contained_and_shows_the_runs_figures(
    data: TrainedRoot, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    server_part_before = _server_part(data.run)
    assert run_cli(monkeypatch, "report", str(data.run), "--html") == 0
    out = capsys.readouterr().out
    # each report is hospital data (its tiles, per-tile probabilities): it goes into the hospital's own folder
    reports = [data.hospital(client) / "report.html" for client in (0, 1)]
    assert [str(path) in out for path in reports] == [True, True]
    assert sorted(p.relative_to(data.run).as_posix() for p in data.run.rglob("*.html")) == [
        "hospitals/client_00/report.html",
        "hospitals/client_01/report.html",
    ]
    # the run's server part is left exactly as it was: no report, no marker, no lock file
    assert _server_part(data.run) == server_part_before
    # the run (trained without the CLI, as a deployed hospital's is) had no slides.csv: the report scored the
    # held-out slides as predict does, and its slide table names their calls
    from app.held_out import read_slide_calls

    calls = read_slide_calls(data.hospital(0) / "slides.csv")
    assert calls
    first = reports[0].read_text(encoding="utf-8")
    assert every(c.slide.rsplit(".", 1)[0] in first for c in calls)
    summary = json.loads((data.run / "summary.json").read_text())
    for client in (0, 1):
        page = reports[client].read_text(encoding="utf-8")
        # self-contained: nothing is fetched from anywhere, no script runs
        assert not re.search(r"""(?:src|href|action)\s*=\s*["']?\s*(?:[a-z]+:)?//""", page, re.IGNORECASE)
        assert "<script" not in page.lower()
        assert "<link" not in page.lower()
        assert "url(" not in page.lower()
        images = IMG.findall(page)
        assert len(images) >= 4  # ROC, confusion matrix, tiles, a heatmap
        for tag in images:
            assert 'src="data:image/png;base64,' in tag, tag[:80]
            alt = re.search(r'alt="([^"]+)"', tag)
            assert alt, tag[:80]
            assert alt.group(1).strip()
        roc = re.search(r'<figure id="roc-curve"><img src="data:image/png;base64,([^"]+)"', page)
        assert roc
        assert base64.b64decode(roc.group(1)).startswith(b"\x89PNG")
        # the figures are the run's own: metrics.jsonl's last round, the model card, summary.json's dataset hash
        engine = _last_round(data.run, client)
        card = json.loads((data.hospital(client) / "model.json").read_text())
        assert _metric(page, "auc") == f"{engine['test_auc']:.4f}" == f"{card['metrics']['auc']:.4f}"
        assert _metric(page, "accuracy") == f"{engine['test_acc']:.4f}"
        assert _metric(page, "engine_auc") == f"{engine['test_auc']:.4f}"
        assert _metric(page, "sensitivity") == f"{card['metrics']['sensitivity']:.4f}"
        assert _metric(page, "specificity") == f"{card['metrics']['specificity']:.4f}"
        assert _metric(page, "tiles") == str(engine["num_test"]) == str(card["metrics"]["tiles"])
        assert _metric(page, "dataset_sha256") == summary["dataset_sha256"]
        assert "data-slide=" in page  # one test slide scored for the heatmap
        # the dataset's shortcut probe, as prepare.json records it, one row per pixel statistic
        assert page.count('data-metric="shortcut_probe"') == 1
        probe = json.loads((data.prepared / "prepare.json").read_text())["shortcut_probe"]
        assert f"{probe['splits']['test']['mean_intensity']:.3f}" in page
    # the heatmap came from predict, kept in the hospital's own folder
    assert list((data.hospital(0) / "slides").rglob("overlay.png"))
    # the reports and the scored slides are files a run may hold: train --overwrite still replaces the run
    assert foreign_entries(data.run, "train", RUN_PATTERNS) == []


def test_report_html_out_one_hospital_and_a_second_call(
    data: TrainedRoot, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    out = tmp_path / "out"
    assert run_cli(monkeypatch, "report", str(data.run), "--html", "--hospital", "1", "--out", str(out)) == 0
    assert sorted(p.name for p in out.iterdir()) == [MARKER_NAME, "client_01.html"]
    assert read_marker(out)["command"] == "report"  # type: ignore[index]
    first = (out / "client_01.html").read_text(encoding="utf-8")
    assert "Hospital 1" in first
    assert not list(data.run.rglob("*.html"))  # --out replaces the default place, it does not add to it
    # a second call replaces its own file; a file it did not write stays and nothing half-written remains
    (out / "notes.txt").write_text("mine", encoding="utf-8")
    (out / MARKER_NAME).unlink()
    capsys.readouterr()
    assert run_cli(monkeypatch, "report", str(data.run), "--html", "--out", str(out)) == 2
    _one_line_error(capsys, str(out), "did not write")
    assert sorted(p.name for p in out.iterdir()) == ["client_01.html", "notes.txt"]


def _damage(data: TrainedRoot, damage: str) -> None:
    hospital = data.hospital(0)
    if damage == "predictions":
        rows = (hospital / "predictions.csv").read_text().splitlines()
        rows[3] = rows[3].rsplit(",", 2)[0] + ",abnormal,high"
        (hospital / "predictions.csv").write_text("\n".join(rows) + "\n")
    elif damage == "card":
        (hospital / "model.json").write_text("{ truncated")
    elif damage == "multiclass":
        card = json.loads((hospital / "model.json").read_text())
        (hospital / "model.json").write_text(json.dumps(card | {"class_names": list("0123456789")}))
    elif damage == "config":
        (data.run / "config.toml").write_text("[run\nrounds = ")
    elif damage == "no_predictions":
        for folder in (data.hospital(0), data.hospital(1)):
            (folder / "predictions.csv").unlink()


@pytest.mark.parametrize(
    ("damage", "args", "words"),
    [
        ("predictions", (), ("predictions.csv", "line 4")),
        ("card", (), ("model.json", "not readable JSON")),
        ("config", (), ("config.toml", "not valid TOML")),
        ("multiclass", (), ("model.json", "10 classes")),
        ("no_predictions", (), ("holds no hospital with a predictions.csv",)),
        ("", ("--hospital", "7"), ("hospital 7 is not part of this run",)),
        ("", ("--transmitted", "mobilenet_v3_small"), ("--transmitted and --html",)),
    ],
)
def test_bad_input_is_one_line_exit_2_and_writes_nothing(
    data: TrainedRoot,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    damage: str,
    args: tuple[str, ...],
    words: tuple[str, ...],
) -> None:
    _damage(data, damage)
    assert run_cli(monkeypatch, "report", str(data.run), "--html", *args) == 2
    _one_line_error(capsys, *words)
    assert not list(data.run.rglob("*.html"))


def test_a_missing_run_is_one_line(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    assert run_cli(monkeypatch, "report", str(tmp_path / "nowhere"), "--html") == 2
    _one_line_error(capsys, "nowhere", "does not exist")


def test_the_report_reads_the_card_threshold_and_warns_about_the_operating_point(data: TrainedRoot) -> None:
    from app.report_html import report_html

    hospital = data.hospital(0)
    with (hospital / "predictions.csv").open(newline="") as handle:
        rows = list(csv.DictReader(handle))
    # Rank every abnormal tile above every normal one, but all below 0.5: AUC 1, sensitivity 0 at the card's 0.5.
    for row in rows:
        row["prob_abnormal"] = "0.45" if row["label"] == "abnormal" else "0.05"
    with (hospital / "predictions.csv").open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    page = report_html(data.run, 0)
    assert _metric(page, "auc") == "1.0000"
    assert _metric(page, "sensitivity") == "0.0000"
    abnormal = sum(row["label"] == "abnormal" for row in rows)
    assert f"misses {abnormal} of {abnormal} abnormal tiles" in page  # the scorecard's own warning sentence
    assert "this threshold is in the wrong place" in page
    assert "below the target sensitivity 0.90" in page
    # its one abnormal test slide cannot show 0.90 with 95% confidence: no threshold proposed, and said why
    assert 'data-metric="target_threshold"' not in page
    assert "no threshold reaches sensitivity 0.90 with 95% confidence on the test split" in page
    # 0 of n abnormal tiles found: the Wilson interval starts at 0 (exact numbers in test_dashboard_scorecard.py)
    assert _metric(page, "sensitivity_ci").startswith("0.00\u2013")
    card = json.loads((hospital / "model.json").read_text())
    change = {"from": 0.5, "to": 0.4, "source": "set by hand", "split": "", "by": "Dr A", "at": "", "reason": ""}
    moved = {"threshold": 0.4, "threshold_source": "set by hand", "threshold_history": [change]}
    (hospital / "model.json").write_text(json.dumps(card | moved))  # as gastric-fl threshold --value 0.4 writes it
    page = report_html(data.run, "client_00")
    assert _metric(page, "threshold") == "0.4"
    assert _metric(page, "sensitivity") == "1.0000"
    assert "this threshold is in the wrong place" not in page
    assert "below the target sensitivity" not in page
    assert _metric(page, "sensitivity_ci").endswith("\u20131.00")


def test_building_a_report_imports_no_torch(data: TrainedRoot) -> None:
    script = (
        "import sys\nfrom pathlib import Path\nfrom app.report_html import report_html\n"
        f"page = report_html(Path({str(data.run)!r}), 0)\nassert 'data-metric=\"auc\"' in page\n"
        "print('torch' in sys.modules)\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "False"


def test_the_report_gives_the_verdict_slide_calls_and_test_slides_first(data: TrainedRoot) -> None:
    """Issue 23: the verdict against the default floor, every test slide with its call, the AUC interval by slide,
    the threshold's source, and heatmaps of test slides before uploads, captioned by file name, with a colour bar."""
    from app import slide_prepared, slide_view
    from app.evaluation.metrics import operating_point
    from app.evaluation.verdict import Floor, score_hospital, verdict
    from app.report_html import load_hospital, report_html, score_one_slide
    from models.bundle import set_threshold
    from models.decision import interval_text, weak_caveat

    set_threshold(data.hospital(0), 0.35, "set by hand")
    assert score_one_slide(load_hospital(data.run, 0)) is None
    page = report_html(data.run, 0)
    rep = load_hospital(data.run, 0)
    import pandas as pd

    frame = pd.DataFrame({"label": rep.predictions.labels, "prob_abnormal": rep.predictions.probs,
                          "path": rep.predictions.paths})  # fmt: skip
    score = score_hospital(0, frame, 0.35, 0.9)
    expected = verdict(score, Floor())
    assert f'data-verdict="{expected.kind}"' in page
    assert expected.reason.replace("'", "&#x27;") in page
    assert _metric(page, "threshold") == "0.35"
    assert "from set by hand" in page
    assert score.slides is not None
    assert _metric(page, "slides") == str(score.slides)
    assert _metric(page, "auc_ci") == (interval_text(score.auc_interval) or "undefined")
    table = page.split('data-metric="slide_calls"')[1].split("</table>")[0]
    assert table.count("<tr>") == 1 + score.slides  # header + one row per test slide
    assert score.slide_point is not None
    assert table.count("<td>abnormal</td><td>") >= 1
    # one set of words (issue 47): each row says MISSED CANCER, FALSE ALARM or agreement, as predict and the pages do
    assert "WRONG" not in page
    row = r"<tr><td>[^<]*</td><td>(\w+)</td><td[^>]*>\d+</td><td[^>]*>[\d.]+</td><td>(\w+)</td><td>([^<]*)</td></tr>"
    assert len(re.findall(row, table)) == score.slides
    for truth, call, said in re.findall(row, table):
        expected_words = {("abnormal", "normal"): "MISSED CANCER", ("normal", "abnormal"): "FALSE ALARM"}
        assert said == expected_words.get((truth, call), "agrees with the annotation"), (truth, call, said)
    assert len(re.findall(r"<td>(MISSED CANCER|FALSE ALARM|agrees with the annotation)</td>", table)) == score.slides
    figure = re.search(r'<figure data-slide="([^"]+)" data-kind="(\w+)">', page)
    assert figure
    assert figure.group(2) == "test"
    entries = slide_view.scored_entries(data.hospital(0))
    assert entries
    assert every(e.name.startswith(slide_view.TEST_PREFIX) for e in entries)
    summary = slide_view.load(entries[0]).summary  # type: ignore[union-attr]
    assert figure.group(1) == Path(summary["file"]).name
    assert summary["threshold"] == 0.35
    assert summary["threshold_source"] == "set by hand"
    assert f"called {summary['call']} at threshold 0.35 (set by hand)" in page
    assert "Colour bar of P(abnormal): below the threshold 0.35 left uncoloured (shown light grey on the bar)" in page
    # the test's hospital holds few tiles, so its tissue description is weak: the page says so beside the share, as
    # predict and the Slide page do (issue 47)
    assert summary["tissue_weak"] is True
    assert summary["unfamiliar_share"] is not None
    caveat = weak_caveat(summary)
    assert caveat.startswith("Too few tiles for its 51 statistics")
    assert f"({caveat.rstrip('.')})".replace("'", "&#x27;") in page
    # the test slide's tile figures are its prepared test tiles' (the verdict's), not the heatmap grid's
    mine = slide_prepared.tiles_of_slide(list(rep.predictions.paths), figure.group(1))
    assert mine is not None
    point = operating_point(rep.predictions.labels[mine], rep.predictions.probs[mine], 0.35)
    assert f"(its {point.abnormal + point.normal} prepared test tiles, as the verdict counts them)" in page


def test_report_md_gives_each_hospitals_operating_point_from_its_card(
    data: TrainedRoot, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from models.bundle import read_card, set_threshold

    set_threshold(data.hospital(1), 0.3, "set by hand")
    assert run_cli(monkeypatch, "report", str(data.run)) == 0
    printed = capsys.readouterr().out
    text = (data.run / "report.md").read_text(encoding="utf-8")
    assert "## Operating point (each hospital's model card)" in text
    card = read_card(data.hospital(0)).metrics
    low, high = card["sensitivity_ci"]
    section = text.split("## Operating point")[1].splitlines()
    row = next(line for line in section if line.startswith(f"| {data.run.name} | 0 |"))
    assert f"{card['sensitivity']:.3f} ({low:.2f}\u2013{high:.2f})" in row
    assert f"| {card['slides']} |" in row
    assert "the default 0.5" in row
    hand = next(line for line in section if line.startswith(f"| {data.run.name} | 1 |"))
    assert "| 0.3000 | set by hand |" in hand
    assert hand in printed  # the command prints the same table
