"""One operating threshold (issue 23, item 4): `gastric-fl threshold` saves it into the hospital's bundle, and
`predict` then calls tiles and slides at it and says where it came from; the slide call rule in predict's outputs."""

from __future__ import annotations

import csv
import json
import shutil
from pathlib import Path

import pytest
from support.cli import run_cli
from support.slides import TinyRun

from app.evaluation.threshold import TargetThreshold, bounded_threshold
from app.run_predictions import read_prediction_file
from inference.results import slide_calls_line
from models.bundle import BundleError, read_card, set_threshold
from models.decision import slides_of_tiles, top_k_mean


def _copy_bundle(tiny_run: TinyRun, tmp_path: Path) -> Path:
    run = tmp_path / "run"
    shutil.copytree(tiny_run.run, run, ignore=shutil.ignore_patterns("slides", "checkpoints"))
    return run


def _write_val(folder: Path, abnormal: dict[int, list[float]], normal: dict[int, list[float]]) -> Path:
    """A ``val_predictions.csv`` of slides (index -> tile probabilities) named as prepare names tiles."""
    lines = ["client,path,label,prob_abnormal,round"]
    for label, slides in (("abnormal", abnormal), ("normal", normal)):
        for index, probs in slides.items():
            lines += [
                f"0,client_00/val/{label}/{index:05d}_v{index}_x{k * 64:05d}_y00000.png,{label},{p},1"
                for k, p in enumerate(probs)
            ]
    path = folder / "val_predictions.csv"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def test_threshold_from_the_floor_is_saved_and_used_by_predict(
    tiny_run: TinyRun, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    run = _copy_bundle(tiny_run, tmp_path)
    folder = run / "hospitals" / "client_00"
    before = read_card(folder)
    assert before.threshold == 0.5
    assert before.threshold_source == "the default 0.5"
    weights = (folder / "model.safetensors").read_bytes()

    # the tiny run's validation split has no abnormal tile and its test split one abnormal slide: no threshold can
    # show 0.90 with 95% confidence, and the command says so in one line, writing nothing
    assert run_cli(monkeypatch, "threshold", str(run), "--hospital", "0", "--sensitivity", "0.9") == 2
    refusal = capsys.readouterr().err
    assert "predictions.csv: no threshold reaches sensitivity 0.90 with 95% confidence on the test split" in refusal
    assert "from 1 abnormal slide show at best a lower bound of 0.21" in refusal
    assert read_card(folder).threshold == 0.5
    # six abnormal validation slides of eight tiles, every tile at 0.2 or more: 0.90 is shown at 0.2
    val = _write_val(folder, {s: [0.2, 0.5, 0.7, 0.9] * 2 for s in range(6)}, {9: [0.1] * 8})
    assert run_cli(monkeypatch, "threshold", str(run), "--hospital", "0", "--sensitivity", "0.9") == 0
    frame = read_prediction_file(val)
    expected = bounded_threshold(
        frame["label"].to_numpy(), frame["prob_abnormal"].to_numpy(), 0.9, slides_of_tiles(frame["path"].to_numpy())
    )
    assert isinstance(expected, TargetThreshold)
    card = read_card(folder)
    assert card.threshold == pytest.approx(expected.threshold) == 0.2
    assert card.threshold_source.startswith("reaches sensitivity 0.90 on round 1's validation split")
    assert card.metrics["threshold"] == card.threshold
    assert (folder / "model.safetensors").read_bytes() == weights  # only the card changed
    assert f"threshold {card.threshold:.4g} saved" in capsys.readouterr().out

    out = tmp_path / "out"
    slide = tiny_run.raw / "slide_0000.png"
    args = ("predict", "--model", str(folder), "--slide", str(slide), "--out", str(out), "--no-progress")
    assert run_cli(monkeypatch, *args) == 0
    printed = capsys.readouterr().out
    rows = list(csv.DictReader((out / "summary.csv").open(encoding="utf-8")))
    summary = json.loads((out / rows[0]["folder"] / "summary.json").read_text(encoding="utf-8"))
    assert summary["threshold"] == card.threshold
    assert summary["threshold_source"] == card.threshold_source
    probs = [float(r["probability"]) for r in csv.DictReader((out / rows[0]["folder"] / "tiles.csv").open())]
    called = "abnormal" if top_k_mean(probs, summary["top_k"]) >= card.threshold else "normal"
    assert summary["call"] == rows[0]["call"] == called
    assert f"called {called} at threshold {card.threshold:.2f} ({card.threshold_source})" in printed
    assert "slide calls at threshold" in printed  # the slide has a mask: its truth is known

    # set by hand; --threshold on predict overrides and says so
    assert run_cli(monkeypatch, "threshold", str(run), "--hospital", "0", "--value", "0.3") == 0
    assert read_card(folder).threshold_source == "set by hand"
    assert run_cli(monkeypatch, *args, "--threshold", "0.7") == 0
    summary = json.loads((out / rows[0]["folder"] / "summary.json").read_text(encoding="utf-8"))
    assert (summary["threshold"], summary["threshold_source"]) == (0.7, "--threshold")


def test_each_saved_threshold_is_kept_in_the_card_history(
    tiny_run: TinyRun, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    run = _copy_bundle(tiny_run, tmp_path)
    folder = run / "hospitals" / "client_00"
    written = json.loads((folder / "model.json").read_text(encoding="utf-8"))
    written["written_at"] = first_written = "2026-01-01T00:00:00+00:00"  # exported earlier than the change
    (folder / "model.json").write_text(json.dumps(written), encoding="utf-8")
    by_hand = ("--value", "0.3", "--by", "Dr A", "--reason", "tumour board 12 Nov")
    assert run_cli(monkeypatch, "threshold", str(run), "--hospital", "0", *by_hand) == 0
    assert "was 0.5; by Dr A, because: tumour board 12 Nov" in capsys.readouterr().out
    assert run_cli(monkeypatch, "threshold", str(run), "--hospital", "0", "--value", "0.42", "--by", "Dr B") == 0
    card = read_card(folder)
    assert card.threshold == 0.42
    assert card.written_at != first_written  # the card says when it last changed
    history = card.threshold_history
    assert [(h["from"], h["to"], h["by"], h["reason"], h["split"]) for h in history] == [
        (0.5, 0.3, "Dr A", "tumour board 12 Nov", ""),
        (0.3, 0.42, "Dr B", "", ""),
    ]
    assert history[1]["at"] == card.written_at
    # the history survives a re-read of the file as written (strict JSON)
    assert json.loads((folder / "model.json").read_text(encoding="utf-8"))["threshold_history"][0]["to"] == 0.3


def test_predict_prints_the_intended_use_and_the_verdict_against_the_floor_it_is_given(
    tiny_run: TinyRun, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from app.cli_floor import DEFAULT_MIN_SLIDES, DEFAULT_SENSITIVITY, DEFAULT_SPECIFICITY
    from app.evaluation.verdict import Floor
    from app.verdicts import judge_run

    assert Floor() == Floor(DEFAULT_SENSITIVITY, DEFAULT_MIN_SLIDES, DEFAULT_SPECIFICITY)  # the page's defaults
    run = _copy_bundle(tiny_run, tmp_path)
    folder = run / "hospitals" / "client_00"
    slide = tiny_run.raw / "slide_0000.png"
    base = ("predict", "--model", str(folder), "--slide", str(slide), "--no-progress")
    for floor, extra in ((Floor(), ()), (Floor(0.5, 1, 0.3), ("--floor", "0.5", "--min-slides", "1",
                                                               "--review-specificity", "0.3"))):  # fmt: skip
        out = tmp_path / f"out_{floor.sensitivity}"
        assert run_cli(monkeypatch, *base, "--out", str(out), *extra) == 0
        lines = capsys.readouterr().out.splitlines()
        assert lines[0] == f"intended use: {read_card(folder).intended_use}"
        judged = judge_run(run, floor).of(0)  # what the Verdict page says with that floor
        assert judged is not None
        verdict = [line for line in lines if line.startswith("verdict of hospital 0's model")]
        lowered = " at floor 0.50 (below 0.90)" if floor.sensitivity < 0.9 else ""  # a lowered floor, said
        assert verdict == [
            f"verdict of hospital 0's model at its threshold 0.50: {judged.verdict.kind.upper()}{lowered}, "
            f"{judged.verdict.reason} (against the floor: {floor.words})"
        ]
    # a bundle copied out of its run has no test predictions beside it: said, not judged
    alone = tmp_path / "alone"
    alone.mkdir()
    for name in ("model.json", "model.safetensors"):
        shutil.copy(folder / name, alone / name)
    assert run_cli(monkeypatch, "predict", "--model", str(alone), "--slide", str(slide), "--out",
                   str(tmp_path / "out_alone"), "--no-progress") == 0  # fmt: skip
    assert "verdict: not judged here" in capsys.readouterr().out
    assert run_cli(monkeypatch, *base, "--out", str(tmp_path / "bad"), "--floor", "0") == 2
    assert "--floor/--min-slides/--review-specificity" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("extra", "words"),
    [
        (("--value", "1.0"), "not strictly between 0 and 1"),
        (("--value", "0.3", "--sensitivity", "0.9"), "exactly one of"),
        ((), "exactly one of"),
        (("--sensitivity", "1.5"), "not in (0, 1]"),
    ],
)
def test_threshold_refusals_are_one_line(
    tiny_run: TinyRun,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    extra: tuple[str, ...],
    words: str,
) -> None:
    run = _copy_bundle(tiny_run, tmp_path)
    card = (run / "hospitals" / "client_00" / "model.json").read_bytes()
    assert run_cli(monkeypatch, "threshold", str(run), "--hospital", "0", *extra) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: "), err
    assert "\n" not in err
    assert words in err, err
    assert (run / "hospitals" / "client_00" / "model.json").read_bytes() == card
    assert run_cli(monkeypatch, "threshold", str(run), "--hospital", "7", "--value", "0.3") == 2
    assert "client_07" in capsys.readouterr().err


def test_set_threshold_keeps_everything_else(tiny_run: TinyRun, tmp_path: Path) -> None:
    run = _copy_bundle(tiny_run, tmp_path)
    folder = run / "hospitals" / "client_01"
    before = read_card(folder)
    after = set_threshold(folder, 0.25, "set by hand")
    assert (after.threshold, after.threshold_source) == (0.25, "set by hand")
    assert read_card(folder) == after
    assert after.metrics == before.metrics
    assert after.round == before.round
    with pytest.raises(BundleError, match="say where"):
        set_threshold(folder, 0.25, " ")


def test_slide_calls_line_counts_against_truth() -> None:
    class Result:
        def __init__(self, truth: str | None, call: str) -> None:
            self.problem = None
            self.summary = {"truth": truth, "call": call, "threshold": 0.4}

    results = [Result("abnormal", "abnormal"), Result("abnormal", "normal"), Result("normal", "normal"),
               Result(None, "abnormal")]  # fmt: skip
    assert slide_calls_line(results) == (  # type: ignore[arg-type]
        "slide calls at threshold 0.40: 1 of 2 abnormal slides called abnormal, 1 of 1 normal slides called normal"
    )
    assert slide_calls_line([Result(None, "normal")]) is None  # type: ignore[list-item]


def test_a_floor_threshold_is_chosen_with_a_margin_on_validation_shown_on_test_and_undone(
    tiny_run: TinyRun, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    run = _copy_bundle(tiny_run, tmp_path)
    folder = run / "hospitals" / "client_00"
    test = read_prediction_file(folder / "predictions.csv")
    # validation: 8 abnormal slides of 6 tiles at 0.8, 0.7, 0.6 (twice); ceil(0.75 x 48) = 36th highest is 0.6,
    # where every tile is caught: lower bound 48/51.84 = 0.93 >= 0.75. A slide of its own at 0.95 only would be
    # chosen by the point estimate alone at 0.95; the margin keeps the floor on the other slides too.
    _write_val(folder, {s: [0.8, 0.7, 0.6] * 2 for s in range(8)}, {9: [0.65, 0.1] * 3})
    sens = ("threshold", str(run), "--hospital", "0", "--sensitivity", "0.75")
    assert run_cli(monkeypatch, *sens, "--dry-run") == 0  # said, not written
    out = capsys.readouterr().out
    assert read_card(folder).threshold == 0.5
    assert "hospital 0: threshold 0.60 reaches 0.75 with 95% confidence on validation (sensitivity 1.00, 95% CI " in out
    assert "hospital 0: raising the threshold from 0.50 to 0.60 (fewer tiles and slides called abnormal)" in out
    labels, probs = test["label"].to_numpy(), test["prob_abnormal"].to_numpy()
    found = int(((probs >= 0.6) & (labels == 1)).sum())
    assert (
        f"on its test split at 0.6: sensitivity {found / (labels == 1).sum():.2f} ({found} of 5 abnormal tiles)" in out
    )
    assert "--dry-run: nothing written" in out
    assert run_cli(monkeypatch, *sens, "--by", "Dr A", "--reason", "board") == 0
    card = read_card(folder)
    assert card.threshold == 0.6
    assert card.threshold_split == "validation"
    assert card.threshold_source == (
        "reaches sensitivity 0.75 on round 1's validation split (48 of 48 abnormal tiles, 95% CI lower bound 0.93; "
        "chosen on validation, judged on test)"
    )
    # the card's figures are the test split's at the validation threshold
    assert card.metrics["sensitivity"] == pytest.approx(found / (labels == 1).sum())
    assert "optimistic" not in capsys.readouterr().out
    # undo: back to 0.5 with the default's source, as a new change; the history's last entry is the threshold
    assert run_cli(monkeypatch, "threshold", str(run), "--hospital", "0", "--undo", "--by", "Dr B") == 0
    out = capsys.readouterr().out
    assert "hospital 0: lowering the threshold from 0.60 to 0.50 (more tiles and slides called abnormal)" in out
    card = read_card(folder)
    assert (card.threshold, card.threshold_source, card.threshold_split) == (0.5, "the default 0.5", "")
    assert [(h["from"], h["to"], h["by"]) for h in card.threshold_history] == [(0.5, 0.6, "Dr A"), (0.6, 0.5, "Dr B")]
    assert card.threshold_history[-1]["to"] == card.threshold
    assert card.threshold_history[-1]["reason"].startswith("undo of the change of ")
    # without a validation split the test split chooses; its one abnormal slide cannot show 0.75: refused
    (folder / "val_predictions.csv").unlink()
    assert run_cli(monkeypatch, *sens) == 2
    assert "no threshold reaches sensitivity 0.75 with 95% confidence on the test split" in capsys.readouterr().err
    assert read_card(folder).threshold == 0.5
