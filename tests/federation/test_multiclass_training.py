"""Federation training with any number of classes (issue 11, item 3): the class list comes from the prepared
dataset, the server learns it from the hospitals' ``Hello`` replies, and metrics, predictions and model cards
follow it.

The end-to-end runs use a tiny three-class class-folders dataset made by ``gastric-fl prepare`` itself (30
images of 16 px, three hospitals, one round at input 32), so they take seconds.
"""

from __future__ import annotations

import csv
import json
from pathlib import Path

import cv2
import numpy as np
import pytest
import torch
from safetensors import safe_open
from sklearn.metrics import roc_auc_score
from support.cli import run_cli

from federation.config import load_config
from federation.engine import Server
from federation.engine.pools import InProcessPool
from federation.errors import FederationError
from federation.hospital.data import LABELS, read_dataset
from federation.hospital.evaluation import auc_of, auc_or_none, multiclass_auc
from federation.hospital.handler import Site
from federation.runfiles import SUMMARY_FILE, hospital_dir, prediction_columns
from federation.server.audit import AUDIT_FILE, check_message
from federation.wire.codec import decode, encode
from models import create_model, head_keys, split_units
from models.bundle import BundleError, load_bundle

CLASSES = ("alpha", "beta", "gamma")
COLOURS = {"alpha": (200, 60, 60), "beta": (60, 180, 60), "gamma": (60, 60, 200)}
SETTINGS = (
    "run.rounds=1",
    "data.input_size=32",
    "data.batch_size=4",
    "data.eval_batch_size=8",
    "data.augment=false",
    "client.lr=0.01",
)


def _sets(*settings: str) -> list[str]:
    return [x for s in [*SETTINGS, *settings] for x in ("--set", s)]


def make_raw(root: Path, per_class: int = 10, seed: int = 0) -> Path:
    """A class-folders raw dataset: ``per_class`` 16 px noisy images of one colour per class."""
    rng = np.random.default_rng(seed)
    for name, colour in COLOURS.items():
        (root / name).mkdir(parents=True)
        for i in range(per_class):
            image = np.clip(np.array(colour) + rng.normal(0, 25, (16, 16, 3)), 0, 255).astype(np.uint8)
            cv2.imwrite(str(root / name / f"{name}_{i:02d}.png"), image)
    return root


def prepare(monkeypatch: pytest.MonkeyPatch, raw: Path, out: Path, *extra: str) -> Path:
    args = ["prepare", "--format", "class-folders", "--input", str(raw), "--out", str(out), "--clients", "3"]
    # Dirichlet(1) with this seed: hospitals 0 and 2 test on all three classes, hospital 1 on two of them
    args += ["--sizes", "equal", "--partition", "dirichlet:1.0", "--tile", "16", "--test-fraction", "0.4"]
    args += ["--seed", "2", "--no-progress", *extra]
    assert run_cli(monkeypatch, *args) == 0
    return out


@pytest.fixture(scope="module")
def dataset(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("three")
    with pytest.MonkeyPatch.context() as monkeypatch:
        return prepare(monkeypatch, make_raw(root / "raw"), root / "prepared")


def read_predictions(path: Path) -> list[dict[str, str]]:
    with path.open(newline="", encoding="utf-8") as handle:
        return list(csv.DictReader(handle))


# -- the AUC of a multi-class evaluation -------------------------------------------------------------------------
def test_multiclass_auc_exact_numbers_with_a_missing_class() -> None:
    # Four classes, class 2 absent from the labels; unequal class sizes and one tie (0.3 vs 0.3 for class 1).
    labels = np.array([0, 0, 1, 3, 1])
    probs = np.array(
        [
            [0.6, 0.2, 0.1, 0.1],
            [0.3, 0.3, 0.2, 0.2],
            [0.2, 0.5, 0.1, 0.2],
            [0.1, 0.2, 0.3, 0.4],
            [0.4, 0.3, 0.0, 0.3],
        ]
    )
    # by hand, pairs (positive, negative) ranked right (+1/2 for a tie):
    # class 0: positives 0.6, 0.3 vs negatives 0.2, 0.1, 0.4 -> 3 + 2 = 5 of 6
    # class 1: positives 0.5, 0.3 vs negatives 0.2, 0.3, 0.2 -> 3 + 2.5 = 5.5 of 6
    # class 3: positive 0.4 vs negatives 0.1, 0.2, 0.2, 0.3 -> 4 of 4
    expected = (5 / 6 + 5.5 / 6 + 1.0) / 3
    value = multiclass_auc(labels, probs)
    assert value == pytest.approx(expected, abs=1e-15)
    assert expected == pytest.approx(11 / 12)
    # unweighted over the classes present: the prevalence-weighted mean (0.9) would be another number
    assert value is not None
    assert abs(value - 0.9) > 0.01
    # scikit-learn's macro one-vs-rest over all four classes is NaN here (class 2 has no positive); over the
    # classes present it is the mean of their binary one-vs-rest AUCs
    assert np.mean([roc_auc_score(labels == c, probs[:, c]) for c in (0, 1, 3)]) == pytest.approx(expected)
    assert auc_of(labels, probs) == multiclass_auc(labels, probs)


def test_multiclass_auc_equals_sklearn_when_every_class_is_present_and_is_none_when_undefined() -> None:
    rng = np.random.default_rng(3)
    logits = rng.normal(size=(23, 5))
    probs = np.exp(logits) / np.exp(logits).sum(axis=1, keepdims=True)
    labels = np.concatenate([np.arange(5), rng.integers(0, 5, 18)])
    sklearn = roc_auc_score(labels, probs, multi_class="ovr", average="macro")
    assert multiclass_auc(labels, probs) == pytest.approx(sklearn, abs=1e-12)
    assert multiclass_auc(np.full(4, 2), probs[:4]) is None  # one class: undefined
    broken = probs.copy()
    broken[3, 1] = np.nan
    assert multiclass_auc(labels, broken) is None  # diverged weights: undefined, not a crash
    # two classes: the binary rule of old, AUC of class 1's probability
    two = np.stack([1 - probs[:, 0], probs[:, 0]], axis=1)
    binary = (labels == 0).astype(np.int64)
    assert auc_of(binary, two) == auc_or_none(binary, probs[:, 0])


# -- reading the class list ----------------------------------------------------------------------------------------
def test_the_class_list_comes_from_prepare_json_else_from_the_labels(dataset: Path, tmp_path: Path) -> None:
    rows, classes = read_dataset(dataset)
    assert classes == CLASSES
    assert json.loads((dataset / "prepare.json").read_text())["classes"] == list(CLASSES)
    manifest = list(csv.DictReader((dataset / "manifest.csv").open()))
    assert [CLASSES[r.label] for r in rows] == [m["label"] for m in manifest]
    # without prepare.json: the labels in natural order (as prepare orders folders); normal/abnormal stay binary
    bare = tmp_path / "bare"
    bare.mkdir()
    lines = ["client,split,label,path,channels"]
    for i, label in enumerate(["10", "2", "1", "2"]):
        (bare / f"t{i}.png").write_bytes(b"")
        lines.append(f"0,train,{label},t{i}.png,3")
    (bare / "manifest.csv").write_text("\n".join(lines) + "\n")
    assert read_dataset(bare)[1] == ("1", "2", "10")
    (bare / "manifest.csv").write_text("client,split,label,path,channels\n0,train,abnormal,t0.png,3\n")
    assert read_dataset(bare)[1] == LABELS
    # a label outside prepare.json's classes is refused, naming the line
    (bare / "prepare.json").write_text(json.dumps({"classes": ["normal", "cancer"]}))
    with pytest.raises(FederationError, match=r"line 2: label 'abnormal' is not one of the dataset's classes"):
        read_dataset(bare)


def test_predictions_columns_keep_the_binary_layout() -> None:
    assert prediction_columns(LABELS) == ("client", "path", "label", "prob_abnormal", "round")
    assert prediction_columns(("a", "b")) == ("client", "path", "label", "prob_a", "prob_b", "round")


# -- end to end ----------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("strategy", ["fedsaf", "fedavg"])
def test_three_classes_train_end_to_end(
    dataset: Path, tmp_path: Path, strategy: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    run = tmp_path / "run"
    args = ["train", "--data", str(dataset), "--out", str(run), "-q"]
    assert run_cli(monkeypatch, *args, *_sets(f"strategy.name={strategy}", "run.audit=true")) == 0
    summary = json.loads((run / SUMMARY_FILE).read_text())
    assert summary["status"] == "finished"
    assert summary["classes"] == list(CLASSES)
    metrics = {m["client"]: m for m in map(json.loads, (run / "metrics.jsonl").read_text().splitlines())}
    assert sorted(metrics) == [0, 1, 2]
    all_present = some_missing = 0
    for client, line in metrics.items():
        folder = hospital_dir(run, client)
        rows = read_predictions(folder / "predictions.csv")
        assert list(rows[0]) == ["client", "path", "label", "prob_alpha", "prob_beta", "prob_gamma", "round"]
        probs = np.array([[float(r[f"prob_{c}"]) for c in CLASSES] for r in rows])
        labels = np.array([CLASSES.index(r["label"]) for r in rows])
        assert np.allclose(probs.sum(axis=1), 1.0, atol=1e-12)
        assert len(rows) == line["num_test"]
        assert line["test_acc"] == pytest.approx(float((probs.argmax(axis=1) == labels).mean()), abs=1e-12)
        present = np.unique(labels)
        if present.size == len(CLASSES):
            all_present += 1
            sklearn = roc_auc_score(labels, probs, multi_class="ovr", average="macro")
        elif present.size > 1:  # over the classes present: the mean of their one-vs-rest AUCs
            some_missing += 1
            sklearn = float(np.mean([roc_auc_score(labels == c, probs[:, c]) for c in present]))
        else:
            sklearn = None
        assert line["test_auc"] == (None if sklearn is None else pytest.approx(sklearn, abs=1e-12))
        card = json.loads((folder / "model.json").read_text())
        assert card["num_classes"] == 3
        assert card["class_names"] == list(CLASSES)
        assert card["positive_class"] is None
        assert card["decision"] == "argmax"
        assert card["metrics"]["acc"] == pytest.approx(line["test_acc"], abs=1e-12)
        assert card["metrics"]["auc"] == line["test_auc"]
        assert sum(card["metrics"]["per_class"].values()) == len(rows)
        with safe_open(str(folder / "model.safetensors"), framework="pt") as handle:
            assert handle.get_slice("classifier.3.weight").get_shape()[0] == 3
    assert all_present, "no hospital's test split holds every class: the sklearn comparison would be vacuous"
    assert some_missing, "every test split holds every class: the missing-class rule would go untested"
    # the boundary: the class names are the one text field a hello reply carries, and nothing else leaked
    nhead = 6 if strategy == "fedsaf" else 0
    model = create_model("mobilenet_v3_small", 3)
    shared = sorted(set(model.state_dict()) - set(head_keys(split_units(model), nhead)))
    lines = [json.loads(x) for x in (run / AUDIT_FILE).read_text().splitlines()]
    hellos = [x for x in lines if x["kind"] == "hello_reply"]
    assert [x["header"]["classes"] for x in hellos] == [list(CLASSES)] * 3
    from_hospitals = [x for x in lines if x["direction"] == "from_hospital"]
    assert from_hospitals
    for line in from_hospitals:
        assert check_message(line, shared) == [], line["kind"]


def test_gastric_fl_predict_refuses_a_multiclass_bundle(
    dataset: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    run = tmp_path / "run"
    assert run_cli(monkeypatch, "train", "--data", str(dataset), "--out", str(run), "-q", *_sets()) == 0
    capsys.readouterr()
    bundle = load_bundle(hospital_dir(run, 0))  # the bundle itself loads: a 3-output model deciding by argmax
    assert bundle.card.decision == "argmax"
    assert bundle.card.class_names == CLASSES
    assert bundle.model(torch.zeros(2, 3, 32, 32)).shape == (2, 3)
    with pytest.raises(BundleError, match="no positive class"):
        _ = bundle.card.positive_index
    slide = next((dataset / "client_00" / "test").rglob("*.png"))
    out = tmp_path / "pred"
    code = run_cli(
        monkeypatch, "predict", "--model", str(hospital_dir(run, 0)), "--slide", str(slide), "--out", str(out)
    )
    err = capsys.readouterr().err.strip()
    assert code == 2
    assert len(err.splitlines()) == 1
    assert "3-class model (alpha, beta, gamma)" in err
    assert "argmax" in err
    assert not out.exists()


def test_hospitals_that_disagree_on_the_classes_are_refused(
    dataset: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # the same class folders prepared with another class order: same names, other indices (as two hospitals that
    # prepared their own data differently would be in a deployment)
    other = prepare(monkeypatch, dataset.parent / "raw", tmp_path / "reordered", "--classes", "gamma,beta,alpha")
    assert read_dataset(other)[1] == ("gamma", "beta", "alpha")
    run = tmp_path / "run"
    config = load_config(None, list(SETTINGS), data=dataset)
    sites = [Site(dataset, 0, hospital_dir(run, 0)), Site(other, 1, hospital_dir(run, 1))]
    server = Server(config, run, progress=False)
    with pytest.raises(FederationError) as error:
        server.run(lambda: InProcessPool(sites))
    message = str(error.value)
    assert len(message.splitlines()) == 1
    assert "hospitals disagree on the classes: hospital 0 has ['alpha', 'beta', 'gamma'], hospital 1 has" in message
    summary = json.loads((run / SUMMARY_FILE).read_text())
    assert summary["status"] == "failed"
    assert summary["rounds_done"] == 0


def test_the_audit_accepts_class_names_only_in_a_hello_reply() -> None:
    from federation.wire.contract import HelloReply

    header, _ = encode(HelloReply(2, 10, 4, CLASSES))
    assert header["classes"] == list(CLASSES)
    assert decode((header, {})) == HelloReply(2, 10, 4, CLASSES)
    assert decode(({k: v for k, v in header.items() if k != "classes"}, {})) == HelloReply(2, 10, 4, LABELS)

    def line(kind: str, classes: object) -> dict[str, object]:
        return {"tensors": {}, "header": {"kind": kind, "client": 0, "classes": classes}}

    assert check_message(line("hello_reply", list(CLASSES)), []) == []
    bad = "classes is not a hello reply's list of plain class names"
    assert check_message(line("train_reply", list(CLASSES)), []) == [bad]
    assert check_message(line("hello_reply", ["alpha", "slide 3 of patient Smith"]), []) == [bad]
    assert check_message(line("hello_reply", "alpha"), []) == [bad]
