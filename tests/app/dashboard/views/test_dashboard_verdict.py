"""The Verdict page (issue 23, item 1) through AppTest: the dashboard lands on it once a finished run exists; each
hospital gets pass / review / fail / cannot judge with its reason; the floor set on it carries to the Hospital page;
the threshold saved from it (or from the scorecard) goes into the bundle and the HTML report uses it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest
from support.dashboard import MAIN, open_page, write_config, write_metrics, write_prepared, write_summary

from models.bundle import ModelCard, read_card, write_bundle
from models.preprocess import Preprocess

# Per hospital: (abnormal slides, normal slides), each slide a list of tile probabilities.
SPLITS = {
    # ranked perfectly but every abnormal tile below 0.5: AUC 1, sensitivity 0 -> fail; 48 abnormal tiles, enough
    # for threshold 0.30 (all of them) to reach 0.90 on the lower end of its 95% interval (48/51.8 = 0.93)
    0: ([[0.30, 0.35, 0.40, 0.45] * 4] * 3, [[0.05, 0.10, 0.15, 0.20]] * 3),
    # 3 slides only -> cannot judge
    1: ([[0.9, 0.8]] * 2, [[0.1, 0.2]]),
    # 60 of 60 abnormal tiles found, 5 and 5 slides -> pass
    2: ([[0.95] * 12] * 5, [[0.05] * 12] * 5),
}


def _card(client: int) -> ModelCard:
    return ModelCard(
        architecture="mobilenet_v3_small",
        num_classes=2,
        class_names=("normal", "abnormal"),
        nhead=1,
        head_units=("classifier.3",),
        preprocess=Preprocess(input_size=32),
        tiling=None,
        hospital=client,
        round=2,
    )


@pytest.fixture
def verdict_root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A data root with one finished run of three hospitals (SPLITS) whose tile names are prepare's."""
    root = tmp_path / "data"
    dataset = root / "prepared" / "v"
    write_prepared(dataset, clients=3, per_class=2)
    run = root / "runs" / "20250401-000000-fedsaf"
    write_config(run, dataset)
    write_metrics(run)
    write_summary(run, "finished")
    for client, (abnormal, normal) in SPLITS.items():
        folder = run / "hospitals" / f"client_{client:02d}"
        folder.mkdir(parents=True)
        lines = ["client,path,label,prob_abnormal,round"]
        slides = [("abnormal", s) for s in abnormal] + [("normal", s) for s in normal]
        for index, (label, probs) in enumerate(slides):
            for k, p in enumerate(probs):
                path = f"client_{client:02d}/test/{label}/{index:05d}_s{index}_x{k * 64:05d}_y00000.png"
                lines.append(f"{client},{path},{label},{p},2")
        (folder / "predictions.csv").write_text("\n".join(lines) + "\n", encoding="utf-8")
        write_bundle(folder, _card(client))
    monkeypatch.setenv("GASTRIC_FL_DATA", str(root))
    return run


def _markdown(at: AppTest) -> str:
    return " ".join(str(m.value) for m in at.markdown)


def test_the_dashboard_lands_on_the_verdict_once_a_finished_run_exists(verdict_root: Path) -> None:
    at = AppTest.from_file(MAIN, default_timeout=90)
    at.run()
    assert not at.exception
    assert at.title[0].value == "Verdict"
    (verdict_root / "summary.json").write_text(json.dumps({"status": "running", "total_rounds": 2}))
    at = AppTest.from_file(MAIN, default_timeout=90)
    at.run()
    assert at.title[0].value == "Data"  # no finished run: the data first


def test_each_hospital_gets_its_verdict_and_reason(verdict_root: Path) -> None:
    at = open_page("verdict")
    text = _markdown(at)
    assert "**FAIL**" in text
    assert (
        "Hospital 0: misses 48 of 48 abnormal tiles at threshold 0.50 (sensitivity 0.00, 95% CI 0.00\u20130.07, "
        "wholly below the floor 0.90); on its slides it misses 3 of 3 abnormal slides (00000, 00001, 00002); "
        "threshold 0.30 reaches 0.90 with 95% confidence on the test split it was chosen on (so optimistic; 95% CI "
        "lower bound 0.93, 3 abnormal slides): sensitivity 1.00 (48 of 48 abnormal tiles), specificity 1.00 (0 of 12 "
        "normal tiles called abnormal); it finds all 3 abnormal test slides, 0 of 3 normal slides called abnormal "
        "(false alarms)." in text
    )
    heading = text.split("###")[0]  # the hospitals' cards, before the sidebar's title
    assert ":material/" not in heading  # a screen reader hears the word only, no icon name
    assert "icon" not in heading
    assert "**CANNOT JUDGE**" in text
    assert "Hospital 1: too few slides to judge: 3 test slides (6 tiles), at least 5 wanted." in text
    assert "**PASS**" in text
    assert "Hospital 2: finds 60 of 60 abnormal tiles at threshold 0.50" in text
    captions = " ".join(str(c.value) for c in at.caption)
    assert "research use only" in captions.lower()
    assert "3 hospitals: 1 pass, 1 fail, 1 cannot judge" in captions
    assert "threshold 0.50 (the default 0.5)" in captions
    assert "slides resampled" in captions  # the AUC's interval by slide
    # hospital 1's 3 slides give no interval, and the page says why instead of "1.00-1.00"
    assert "AUC 1.00 (95% CI cannot be estimated from 3 slides (at least 5, 2 of each class, wanted)" in captions


def test_the_floor_carries_to_the_hospital_page(verdict_root: Path) -> None:
    at = open_page("verdict")
    at.number_input(key="verdict_floor_min_slides").set_value(3)
    at.run()
    assert "too few slides" not in _markdown(at)  # hospital 1 now judged: 4 of 4 found, 4 abnormal tiles -> review
    assert "Hospital 1: finds 4 of 4 abnormal tiles" in _markdown(at)
    at.number_input(key="verdict_floor_sensitivity").set_value(0.5)
    at.run()
    at.switch_page("views/hospital.py")
    at.run()
    assert not at.exception
    assert at.number_input(key="hospital_floor_sensitivity").value == 0.5
    assert at.number_input(key="hospital_floor_min_slides").value == 3
    at.switch_page("views/verdict.py")
    at.run()
    assert at.number_input(key="verdict_floor_sensitivity").value == 0.5


def _confirm(at: AppTest, label_start: str, who: str = "Dr A", why: str = "tumour board") -> None:
    """Press the save button whose label starts with ``label_start``, fill in who and why, and confirm."""
    (button,) = [b for b in at.button if b.label.startswith(label_start)]
    button.click()
    at.run()
    assert not at.exception
    key = button.key
    at.text_input(key=f"{key}_who").set_value(who)
    at.text_input(key=f"{key}_why").set_value(why)
    (confirm,) = [b for b in at.button if b.key == f"{key}_confirm"]
    confirm.click()
    at.run()
    assert not at.exception


def test_saving_asks_for_confirmation_who_and_why(verdict_root: Path) -> None:
    folder = verdict_root / "hospitals" / "client_00"
    at = open_page("verdict")
    (button,) = [b for b in at.button if b.label.startswith("Save 0.30 as Hospital 0")]
    button.click()
    at.run()
    text = _markdown(at)
    # one click only proposes: the card is unchanged, and the page says what would change and on which split
    assert read_card(folder).threshold == 0.5
    assert "Change Hospital 0's operating threshold from 0.50 to 0.30?" in text
    assert "chosen on the test split it is judged on, so optimistic" in text
    (confirm,) = [b for b in at.button if b.key == f"{button.key}_confirm"]
    confirm.click()  # without who and why: refused
    at.run()
    assert "Say who decides and why" in " ".join(str(e.value) for e in at.error)
    assert read_card(folder).threshold == 0.5
    (cancel,) = [b for b in at.button if b.key == f"{button.key}_cancel"]
    cancel.click()
    at.run()
    assert "Change Hospital 0's operating threshold" not in _markdown(at)
    assert read_card(folder).threshold == 0.5


def test_saving_the_floors_threshold_goes_into_the_bundle_and_the_report(verdict_root: Path) -> None:
    from app.report_html import report_html

    at = open_page("verdict")
    _confirm(at, "Save 0.30 as Hospital 0")
    card = read_card(verdict_root / "hospitals" / "client_00")
    assert card.threshold == pytest.approx(0.30)
    assert card.threshold_source.startswith("reaches sensitivity 0.90 on the test split")
    assert card.metrics["sensitivity"] == 1.0  # recomputed at the new threshold
    assert [(h["from"], h["to"], h["by"], h["reason"]) for h in card.threshold_history] == [
        (0.5, pytest.approx(0.30), "Dr A", "tumour board")
    ]
    assert "Saved: Hospital 0 now decides at threshold 0.30" in " ".join(str(s.value) for s in at.success)
    text = _markdown(at)  # the same run that saved: the page is redrawn at the new threshold at once
    assert "Hospital 0: misses" not in text
    assert "Hospital 0: finds 48 of 48 abnormal tiles at threshold 0.30" in text
    page = report_html(verdict_root, 0)
    assert 'data-metric="threshold">0.3<' in page
    assert "reaches sensitivity 0.90 on the test split" in page


def test_the_scorecard_saves_the_sliders_threshold(verdict_root: Path) -> None:
    at = open_page("hospital")
    at.slider(key=f"explore_{verdict_root.name}_0").set_value(0.42)
    at.run()
    _confirm(at, "Save 0.42 as its threshold")
    card = read_card(verdict_root / "hospitals" / "client_00")
    assert (card.threshold, card.threshold_source) == (0.42, "set by hand")


def test_a_dp_runs_epsilon_is_beside_each_verdict(verdict_root: Path) -> None:
    lines = [json.loads(line) for line in (verdict_root / "metrics.jsonl").read_text().splitlines()]
    for line in lines:
        line.update(dp_epsilon=1.5 * line["round"] + line["client"], dp_delta=1e-5, dp_steps=4.0 * line["round"])
    (verdict_root / "metrics.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    last = max(line["round"] for line in lines)
    at = open_page("verdict")
    captions = " ".join(str(c.value) for c in at.caption)
    for client in SPLITS:
        assert f"differential privacy: epsilon {1.5 * last + client:.2f} at delta 1e-05 so far, per slide" in captions


def test_the_hospital_page_and_its_charts_follow_the_saved_threshold(verdict_root: Path) -> None:
    at = open_page("verdict")
    _confirm(at, "Save 0.30 as Hospital 0")
    at.switch_page("views/hospital.py")
    at.run()
    assert not at.exception
    (table,) = [d.value for d in at.dataframe if "verdict" in d.value.columns]
    row = table.set_index("hospital").loc["Hospital 0"]
    assert (row["threshold"], row["verdict"], row["sensitivity"]) == (pytest.approx(0.30), "PASS", 1.0)
    text = _markdown(at)
    assert "Hospital 0:" not in text  # the detail names it once, in bold, beside its verdict
    assert (
        "**Hospital 0** &nbsp; :green-background[**PASS**] &nbsp; finds 48 of 48 abnormal tiles at threshold 0.30"
        in text
    )
    assert at.slider(key=f"explore_{verdict_root.name}_0").value == pytest.approx(0.30)
    assert {m.label: m.value for m in at.metric}["Sensitivity"] == "1.000"
    charts = {json.loads(c.proto.spec)["layout"]["title"]["text"]: c.proto for c in at.get("plotly_chart")}
    (confusion,) = [spec for title, spec in charts.items() if title.startswith("Confusion matrix")]
    assert "Confusion matrix at threshold 0.30 (the model card's)" in [t for t in charts]
    assert "at the card's threshold 0.30" in confusion.alt
    (roc,) = [spec for title, spec in charts.items() if title.startswith("ROC curve")]
    names = [trace.get("name") for trace in json.loads(roc.spec)["data"]]
    assert "the card's threshold 0.30" in names
    assert not [n for n in names if n and n.startswith("exploring")]
    assert "at its card's threshold 0.30 (the diamond) sensitivity 1.000" in roc.alt


def test_the_confirm_box_shows_the_direction_and_the_test_consequences_before_saving(verdict_root: Path) -> None:
    """Issue 47: the proposed threshold's consequences on test are said before anything is written, and a
    threshold that misses an abnormal test slide says so plainly."""
    folder = verdict_root / "hospitals" / "client_00"
    # the held-out slides as predict scored them: one abnormal slide's score (0.28) lies below the proposal 0.30
    (folder / "slides.csv").write_text(
        "slide,truth,score,call,threshold,tiles\n"
        "00000,abnormal,0.42,normal,0.5,16\n00001,abnormal,0.40,normal,0.5,16\n00002,abnormal,0.28,normal,0.5,16\n"
        "00003,normal,0.17,normal,0.5,4\n00004,normal,0.35,normal,0.5,4\n00005,normal,0.12,normal,0.5,4\n",
        encoding="utf-8",
    )
    at = open_page("verdict")
    text = _markdown(at)
    # the verdict's suggestion gives its figures on test, the slides from slides.csv
    assert "it misses 1 of 3 abnormal test slides (00002), 1 of 3 normal slides called abnormal" in text
    (button,) = [b for b in at.button if b.label.startswith("Save 0.30 as Hospital 0")]
    button.click()
    at.run()
    assert not at.exception
    text = _markdown(at)
    assert read_card(folder).threshold == 0.5  # nothing written yet
    assert "This means **lowering the threshold from 0.50 to 0.30 (more tiles and slides called abnormal)**." in text
    assert (
        "On Hospital 0's test split at 0.30: sensitivity 1.00 (48 of 48 abnormal tiles), specificity 1.00 (0 of 12 "
        "normal tiles called abnormal); it misses 1 of 3 abnormal test slides (00002), 1 of 3 normal slides called "
        "abnormal (false alarms)." in text
    )
    errors = " ".join(str(e.value) for e in at.error)
    assert "At 0.30 the model calls 1 of 3 abnormal test slides normal (00002): cancers it would miss." in errors


def test_undo_on_the_page_restores_the_previous_threshold(verdict_root: Path) -> None:
    folder = verdict_root / "hospitals" / "client_00"
    at = open_page("verdict")
    assert not [b for b in at.button if b.label.startswith("Undo")]  # nothing to undo yet
    _confirm(at, "Save 0.30 as Hospital 0")
    assert read_card(folder).threshold == pytest.approx(0.30)
    (undo,) = [b for b in at.button if b.label == "Undo: back to 0.50"]
    undo.click()
    at.run()
    assert "This means **raising the threshold from 0.30 to 0.50 (fewer tiles and slides called abnormal)**." in (
        _markdown(at)
    )
    assert read_card(folder).threshold == pytest.approx(0.30)  # asked first
    at.text_input(key=f"{undo.key}_who").set_value("Dr B")
    (confirm,) = [b for b in at.button if b.key == f"{undo.key}_confirm"]
    confirm.click()
    at.run()
    assert not at.exception
    card = read_card(folder)
    assert (card.threshold, card.threshold_source) == (0.5, "the default 0.5")
    assert [(h["from"], h["to"], h["by"]) for h in card.threshold_history] == [
        (0.5, pytest.approx(0.30), "Dr A"),
        (pytest.approx(0.30), 0.5, "Dr B"),
    ]
    assert card.threshold_history[-1]["to"] == card.threshold
    assert "Undone: Hospital 0 decides at threshold 0.50 again" in " ".join(str(s.value) for s in at.success)
    assert "Hospital 0: misses 48 of 48 abnormal tiles at threshold 0.50" in _markdown(at)


def _walk(node: object) -> list[object]:
    """Every element under ``node`` in page order (AppTest keeps a block's children by their index)."""
    children = getattr(node, "children", None)
    if not isinstance(children, dict):
        return [node]
    return [leaf for _, child in sorted(children.items()) for leaf in _walk(child)]


def test_the_federation_page_shows_the_verdicts_above_the_averaged_auc(verdict_root: Path) -> None:
    at = open_page("federation")
    order = [
        (str(getattr(e, "type", "")), str(getattr(e, "label", "") or getattr(e, "value", ""))[:40])
        for e in _walk(at.main)
    ]
    verdict_at = next(i for i, (kind, text) in enumerate(order) if text.startswith("**Each hospital's verdict**"))
    auc_at = next(i for i, (kind, text) in enumerate(order) if kind == "metric" and text == "Averaged AUC")
    assert verdict_at < auc_at
    (table,) = [d.value for d in at.dataframe if "verdict" in d.value.columns]
    assert table["verdict"].tolist() == ["FAIL", "CANNOT JUDGE", "PASS"]


def test_a_floor_below_the_default_is_marked_on_every_badge(verdict_root: Path) -> None:
    from app.evaluation.verdict import Floor
    from app.report_html import report_html

    at = open_page("verdict")
    assert ":green-background[**PASS**]" in _markdown(at)  # the default floor: a plain PASS
    at.number_input(key="verdict_floor_sensitivity").set_value(0.7)
    at.run()
    text = _markdown(at)
    assert ":green-background[**PASS at floor 0.70 (below 0.90)**]" in text
    assert ":red-background[**FAIL at floor 0.70 (below 0.90)**]" in text
    assert "[**PASS**]" not in text
    at.switch_page("views/hospital.py")
    at.run()
    (table,) = [d.value for d in at.dataframe if "verdict" in d.value.columns]
    assert all(word.endswith(" at floor 0.70 (below 0.90)") for word in table["verdict"])
    assert ":red-background[**FAIL at floor 0.70 (below 0.90)**]" in _markdown(at)
    at.switch_page("views/federation.py")
    at.run()
    (table,) = [d.value for d in at.dataframe if "verdict" in d.value.columns]
    assert table["verdict"].tolist()[2] == "PASS at floor 0.70 (below 0.90)"
    page = report_html(verdict_root, 2, floor=Floor(0.7))
    assert "✔ PASS at floor 0.70 (below 0.90)</strong>" in page
    assert "✔ PASS</strong>" in report_html(verdict_root, 2, floor=Floor(0.9))


@pytest.mark.parametrize("name", ["verdict", "hospital", "federation", "compare", "data"])
def test_no_icon_name_is_in_the_pages_text(verdict_root: Path, name: str) -> None:
    """Issue 47: an icon written into text (``:material/close: wrong``) reaches a screen reader as its name ("close
    icon ... wrong"); icons stay in the icon= of alerts and buttons, where Streamlit hides them, and text is words.
    The Hospital page's example tiles (unreadable here: their captions say so) and its verdicts included."""
    at = open_page(name)
    texts = [str(e.value) for kind in ("markdown", "caption") for e in at.get(kind)]
    images = [str(c) for e in at.get("imgs") for c in getattr(e.proto, "imgs", [])]
    assert texts
    found = [t for t in texts + images if ":material/" in t]
    assert not found, found
    if name == "hospital":
        assert any(t.startswith("cannot read ") for t in texts)  # the example tiles' caption, in words


def test_the_verdict_counts_unfamiliar_and_focus_slides_everywhere_it_is_shown(
    verdict_root: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Issue 47, item 1: hospital 2's held-out slides (slides.csv, 5 of them: 2 mostly unfamiliar, 1 normal with a
    tile above the threshold) are counted on the Verdict, Hospital and Federation pages, by gastric-fl report (its
    text and report.md) and in the HTML report; hospital 0, without a slides.csv, says "not recorded", not 0."""
    from support.cli import run_cli

    from app.report_html import report_html

    (verdict_root / "hospitals" / "client_02" / "slides.csv").write_text(
        "slide,truth,score,call,threshold,tiles,top_tile,unfamiliar_share\n"
        "00000,abnormal,0.95,abnormal,0.5,12,0.95,0.9\n00001,abnormal,0.95,abnormal,0.5,12,0.95,0.75\n"
        "00002,abnormal,0.95,abnormal,0.5,12,0.95,0.1\n00005,normal,0.20,normal,0.5,12,0.7,0\n"
        "00006,normal,0.05,normal,0.5,12,0.05,0.5\n",
        encoding="utf-8",
    )
    at = open_page("verdict")
    captions = [str(c.value) for c in at.caption]
    (two,) = [c for c in captions if "threshold 0.50" in c and "**5** test slides" in c]
    assert "unfamiliar slides: 2, focus slides (review): 1" in two
    (zero,) = [c for c in captions if "**6** test slides" in c]  # hospital 0
    assert "unfamiliar slides: not recorded, focus slides (review): not recorded" in zero
    for page, key in (("views/hospital.py", "scorecard"), ("views/federation.py", "verdict_table")):
        at.switch_page(page)
        at.run()
        assert not at.exception
        (table,) = [d.value for d in at.dataframe if "verdict" in d.value.columns]
        assert table["unfamiliar slides"].tolist() == ["not recorded", "not recorded", "2"], key
        assert table["focus slides (review)"].tolist() == ["not recorded", "not recorded", "1"], key
    html = report_html(verdict_root, 2)
    assert '<td class="num" data-metric="unfamiliar_slides">2</td>' in html
    assert '<td class="num" data-metric="focus_slides">1</td>' in html
    assert '<td class="num" data-metric="unfamiliar_slides">not recorded</td>' in report_html(verdict_root, 0)
    assert run_cli(monkeypatch, "report", str(verdict_root)) == 0
    printed = capsys.readouterr().out
    header = (
        "| run | hospital | verdict | threshold | threshold from | unfamiliar slides | focus slides (review) | reason |"
    )
    row_two = f"| {verdict_root.name} | 2 | PASS | 0.5000 | the default 0.5 | 2 | 1 |"
    row_zero = f"| {verdict_root.name} | 0 | FAIL | 0.5000 | the default 0.5 | not recorded | not recorded |"
    report = (verdict_root / "report.md").read_text(encoding="utf-8")
    for text in (printed, report):
        assert header in text
        assert row_two in text
        assert row_zero in text
