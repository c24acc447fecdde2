"""Intended use on every result (issue: a verdict a clinician can trust, item 5): "research use only, not for
diagnosis" on the dashboard's result pages, the HTML report, `report`'s files and the model card, and "synthetic
slides" wherever the dataset was made by `gastric-fl synth` (``prepare.json``'s ``synthetic``,
``infra.provenance``)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from support.cli import run_cli
from support.dashboard import Fixture, open_page
from support.slides import TrainedRoot, build_trained_root, copy_root

from infra.provenance import INTENDED_USE, SYNTHETIC_NOTE, dataset_is_synthetic, intended_use
from models.bundle import ModelCard, read_card


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> TrainedRoot:
    return build_trained_root(tmp_path_factory.mktemp("use") / "data")


def test_a_dataset_is_synthetic_by_its_record_or_its_raw_folders_marker(tmp_path: Path) -> None:
    dataset, raw = tmp_path / "prepared", tmp_path / "raw"
    dataset.mkdir()
    raw.mkdir()
    assert not dataset_is_synthetic(None)
    assert not dataset_is_synthetic(dataset)  # no prepare.json
    for damaged in (b"{cut off", b"[1, 2]", b"\xff\xfe{}"):  # not JSON, not a JSON object, not UTF-8
        (dataset / "prepare.json").write_bytes(damaged)
        assert not dataset_is_synthetic(dataset)
        assert intended_use(dataset) == INTENDED_USE
    (dataset / "prepare.json").write_text(json.dumps({"config": {"source": {"input": str(raw)}}}))
    assert not dataset_is_synthetic(dataset)  # an older record, a raw folder without synth's marker
    (raw / "synth.json").write_text("{}")
    assert dataset_is_synthetic(dataset)  # the older record's raw folder was made by synth
    (dataset / "prepare.json").write_text(json.dumps({"synthetic": False, "config": {"source": {"input": str(raw)}}}))
    assert not dataset_is_synthetic(dataset)  # the record's own flag decides
    assert intended_use(dataset) == INTENDED_USE
    assert intended_use(synthetic=True) == f"{INTENDED_USE} {SYNTHETIC_NOTE}"


def test_everything_trained_on_synthetic_slides_says_so(
    trained: TrainedRoot, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    record = json.loads((trained.prepared / "prepare.json").read_text())
    assert record["synthetic"] is True  # prepare saw synth's marker in its input
    data = copy_root(trained, tmp_path / "data")
    # the model card
    card = read_card(data.hospital(0))
    assert card.intended_use == f"{INTENDED_USE} {SYNTHETIC_NOTE}"
    assert card.dataset["synthetic"] is True
    raw_card = json.loads((data.hospital(0) / "model.json").read_text())
    assert raw_card["intended_use"] == f"{INTENDED_USE} {SYNTHETIC_NOTE}"
    older = {k: v for k, v in raw_card.items() if k != "intended_use"}  # a card written before the field
    assert ModelCard.from_json(older).intended_use == INTENDED_USE
    # the HTML report
    assert run_cli(monkeypatch, "report", str(data.run), "--html") == 0
    page = (data.hospital(0) / "report.html").read_text()
    assert f'data-metric="intended_use">{INTENDED_USE} {SYNTHETIC_NOTE}' in page.replace("&#x27;", "'")
    # `report`'s tables and file
    capsys.readouterr()
    assert run_cli(monkeypatch, "report", str(data.run)) == 0
    assert f"note: {INTENDED_USE} {SYNTHETIC_NOTE}" in capsys.readouterr().err
    assert f"**{INTENDED_USE} {SYNTHETIC_NOTE}**" in (data.run / "report.md").read_text()
    # the dashboard's result pages
    monkeypatch.setenv("GASTRIC_FL_DATA", str(data.root))
    for name in ("hospital", "federation", "slide"):
        at = open_page(name)
        captions = " ".join(str(c.value) for c in at.caption)
        assert f"{INTENDED_USE} {SYNTHETIC_NOTE}" in captions, name


def test_a_real_dataset_is_research_use_only_without_the_synthetic_note(fixture_root: Fixture) -> None:
    for name in ("hospital", "federation", "compare"):
        captions = " ".join(str(c.value) for c in open_page(name).caption)
        assert INTENDED_USE in captions, name
        assert SYNTHETIC_NOTE not in captions, name
