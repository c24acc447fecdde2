"""Held-out scoring reads nothing without its hash (issue 48, part 3), played from the careless operator's side: the
card's ``dataset.path`` pointed at a dataset prepared again, a raw test slide replaced after training, another
deleted, and a ``prepare.json`` of an earlier version that records no slide hashes."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from support.slides import TrainedRoot, build_trained_root

from app.held_out import score_held_out, score_run
from app.slide_view import SlideViewError, card_dataset
from federation.runfiles import SLIDES_FILE


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> TrainedRoot:
    return build_trained_root(tmp_path_factory.mktemp("hashes"))


def _copies(trained: TrainedRoot, tmp_path: Path) -> tuple[Path, Path, Path]:
    """Hospital 0's bundle folder, the prepared dataset and the raw slides, copied; the card names the copied
    dataset, whose prepare.json names the copied raw folder (the manifest, and so its sha256, unchanged)."""
    raw, prepared = tmp_path / "raw", tmp_path / "prepared"
    shutil.copytree(trained.raw, raw)
    shutil.copytree(trained.prepared, prepared)
    record = json.loads((prepared / "prepare.json").read_text())
    record["config"]["source"]["input"] = str(raw)
    (prepared / "prepare.json").write_text(json.dumps(record))
    folder = tmp_path / "client_00"
    shutil.copytree(trained.hospital(0), folder, ignore=shutil.ignore_patterns("checkpoints", "slides"))
    card = json.loads((folder / "model.json").read_text())
    card["dataset"]["path"] = str(prepared)
    (folder / "model.json").write_text(json.dumps(card))
    return folder, prepared, raw


def _test_slides(prepared: Path) -> list[str]:
    record = json.loads((prepared / "prepare.json").read_text())
    return [s["source"] for s in record["slides"] if s["client"] == 0 and s["split"] == "test" and s["tiles"] > 0]


def test_prepare_records_each_raw_slides_sha256(trained: TrainedRoot) -> None:
    import hashlib

    record = trained.record()
    assert record["slides"]
    for slide in record["slides"]:
        assert slide["sha256"] == hashlib.sha256((trained.raw / slide["source"]).read_bytes()).hexdigest()


def test_a_card_pointed_at_a_dataset_prepared_again_is_refused_on_its_own_path(
    trained: TrainedRoot, tmp_path: Path
) -> None:
    folder, prepared, _ = _copies(trained, tmp_path)
    assert card_dataset(json.loads((folder / "model.json").read_text())) == prepared  # the same tiles: used
    rows = (prepared / "manifest.csv").read_text().splitlines()  # prepared again: its rows in another order
    (prepared / "manifest.csv").write_text("\n".join([rows[0], *reversed(rows[1:])]) + "\n")
    card = json.loads((folder / "model.json").read_text())
    assert card_dataset(card) is None  # before: taken on trust, its "held-out" slides scored
    with pytest.raises(SlideViewError) as refused:
        score_held_out(folder)
    assert str(refused.value).startswith(f"{prepared / 'manifest.csv'} is not the one this model was trained on (")
    assert str(refused.value).endswith(
        "the dataset was prepared again, so its test slides would be other slides; restore the dataset the run "
        "trained on"
    )
    assert not (folder / SLIDES_FILE).exists()
    # the run's own dataset given as the fallback, with the card's tiles, is still found
    assert card_dataset(card, trained.prepared) == trained.prepared


def test_a_replaced_or_deleted_raw_slide_is_named_not_scored(trained: TrainedRoot, tmp_path: Path) -> None:
    folder, prepared, raw = _copies(trained, tmp_path)
    replaced, deleted = _test_slides(prepared)  # hospital 0's two test slides
    other = next(
        s["source"] for s in json.loads((prepared / "prepare.json").read_text())["slides"] if s["source"] != replaced
    )
    shutil.copyfile(raw / other, raw / replaced)  # another slide's bytes under the old name and label
    problems: list[str] = []
    calls = score_held_out(folder, problems=problems)
    assert [c.slide for c in calls] == [deleted]  # before: the replaced slide scored as itself
    assert len(problems) == 1
    changed = problems[0]
    assert changed.startswith(f"{replaced}: changed since prepare read it (sha256 ")
    assert changed.endswith("not scored under its old name and label (restore it, or prepare the dataset again)")
    # train's last lines (score_run) name it for the hospital
    run = tmp_path / "run"
    shutil.copytree(folder, run / "hospitals" / "client_00")
    assert score_run(run)[1:] == [f"hospital 0: test slide {changed}"]
    (raw / deleted).unlink()  # before: silently dropped
    with pytest.raises(SlideViewError) as refused:
        score_held_out(folder)
    gone = f"{deleted}: missing from {raw} since prepare listed it; not scored (restore it)"
    assert str(refused.value) == (
        f"none of hospital 0's test slides listed in {prepared / 'prepare.json'} is in {raw} as prepare read it "
        f"({changed}; {gone}); upload a slide instead"
    )


def test_an_earlier_prepare_without_slide_hashes_is_scored_unchecked_and_says_so(
    trained: TrainedRoot, tmp_path: Path
) -> None:
    folder, prepared, _ = _copies(trained, tmp_path)
    record = json.loads((prepared / "prepare.json").read_text())
    for slide in record["slides"]:
        del slide["sha256"]
    del record["source_sha256"]
    (prepared / "prepare.json").write_text(json.dumps(record))
    problems: list[str] = []
    calls = score_held_out(folder, problems=problems)
    assert [c.slide for c in calls] == _test_slides(prepared)
    assert problems == [
        f"{len(calls)} slide(s) scored unchecked: {prepared / 'prepare.json'} records no sha256 for them (an earlier "
        "prepare); prepare the dataset again to record them"
    ]


def test_a_deployed_hospital_names_a_changed_slide_of_a_finished_run(trained: TrainedRoot, tmp_path: Path) -> None:
    """`score_finished` (a deployed hospital's loop) names the slide as `train` does."""
    from app.held_out import score_finished

    folder, prepared, raw = _copies(trained, tmp_path)
    runs = tmp_path / "runs"
    shutil.copytree(folder, runs / "R1")
    replaced, kept = _test_slides(prepared)
    shutil.copyfile(raw / kept, raw / replaced)
    lines = score_finished(runs, prepared, 0, {})
    assert len(lines) == 2, lines
    assert lines[0].startswith("run R1: hospital 0: ")
    assert lines[1].startswith(f"run R1: test slide {replaced}: changed since prepare read it (sha256 ")
