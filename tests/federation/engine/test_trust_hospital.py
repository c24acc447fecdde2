"""A malicious server against one hospital (docs/design.md, "Trust model"; docs/deployment.md, "Trust model").

The hospital is driven as a deployed one (its own folder per run, the default policy) through
``Hospital.answer``, i.e. through the wire codec and its outbound log, exactly as Flower's ClientApp drives it.
Each test plays the server: it asks for the head, for everything, names a path, sends NaN, wrong-shaped or
foreign tensors, addresses another client. It asserts what left (the reply), what was refused, what the outbound
log holds and that the hospital's exported model is unchanged.
"""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path

import pytest
import torch
from support.checks import every
from support.tiny_dataset import LAYOUT
from support.trust import RUN, config_of, deployed, honest_keys, honest_task, send
from typer.testing import CliRunner

from app.cli import app
from federation.config import RunConfig, config_to_toml
from federation.errors import FederationError
from federation.hospital.data import extract_hospital
from federation.hospital.handler import Hospital, Site
from federation.hospital.outbound import read_outbound
from federation.hospital.policy import HospitalPolicy, load_policy
from federation.wire.codec import Message, decode, encode, envelope_digest
from federation.wire.contract import (
    EvaluateReply,
    EvaluateTask,
    Failure,
    Hello,
    HelloReply,
    Recipe,
    TrainInstruction,
    TrainReply,
)
from models import create_model, head_keys, split_units
from models.names import WEIGHTS_FILE


def after_round_one(tmp_path: Path, dataset: Path) -> tuple[Hospital, RunConfig, bytes]:
    """A hospital that took part honestly in round 1 (trained, evaluated, exported); its exported model's bytes."""
    config = config_of(dataset)
    hospital = deployed(tmp_path, dataset)
    assert isinstance(send(hospital, Hello(RUN, config_to_toml(config))), HelloReply)
    assert isinstance(send(hospital, honest_task(config, evaluate=True)), TrainReply)
    exported = (tmp_path / "state" / RUN / WEIGHTS_FILE).read_bytes()
    return hospital, config, exported


def log_of(tmp_path: Path) -> list[dict[str, object]]:
    log = read_outbound(tmp_path / "state" / "outbound.jsonl")
    assert log.problems == []
    return log.records


def refused(reply: Message, *words: str) -> None:
    assert isinstance(reply, Failure), reply
    assert reply.reason.startswith("refused by"), reply.reason
    for word in words:
        assert word in reply.reason, reply.reason


def test_an_honest_round_sends_exactly_the_agreed_keys_and_logs_them_before_they_leave(
    dataset: Path, tmp_path: Path
) -> None:
    config = config_of(dataset)
    hospital = deployed(tmp_path, dataset)
    send(hospital, Hello(RUN, config_to_toml(config)))
    envelope = hospital.answer(encode(honest_task(config)))
    reply = decode(envelope)
    assert isinstance(reply, TrainReply)
    model = create_model("mobilenet_v3_small")
    head = set(head_keys(split_units(model), 6))
    assert set(reply.shared) == set(honest_keys(config))
    assert not set(reply.shared) & head
    assert not [k for k in reply.shared if k.endswith(("running_mean", "running_var", "num_batches_tracked"))]
    records = log_of(tmp_path)
    assert [r["kind"] for r in records] == ["hello_reply", "train_reply"]
    last = records[-1]
    assert last["sha256"] == envelope_digest(envelope)
    assert last["run"] == RUN
    assert last["round"] == 1
    assert last["asked"] == "train"
    assert last["values"] == sum(t.numel() for t in reply.shared.values())
    assert set(last["tensors"]) == {f"shared/{k}" for k in reply.shared}  # type: ignore[arg-type]


def test_asking_for_every_key_or_one_head_key_is_refused_and_nothing_leaves(dataset: Path, tmp_path: Path) -> None:
    hospital, config, exported = after_round_one(tmp_path, dataset)
    everything = list(create_model("mobilenet_v3_small").state_dict())
    task = honest_task(config, 2, shared_keys=everything)
    task.instruction = TrainInstruction(0, Recipe(epochs=0), shared=None)
    refused(send(hospital, task), "tensor(s) this hospital keeps")
    one_head = honest_task(config, 2)
    one_head.shared_keys = [*one_head.shared_keys, "classifier.3.weight"]
    refused(send(hospital, one_head), "classifier.3.weight")
    records = log_of(tmp_path)
    assert [r["refused"] for r in records[-2:]] == [True, True]
    assert every(r["values"] == 0 and r["tensors"] == {} for r in records[-2:])
    assert (tmp_path / "state" / RUN / WEIGHTS_FILE).read_bytes() == exported


@pytest.mark.parametrize(
    ("extra", "words"),
    [
        (["strategy.name=fedavg", "strategy.nhead=0"], ["nhead 0", "at least 1"]),
        (["strategy.bn=shared"], ["BatchNorm statistics"]),
        (["client.lr=5.0"], ["client.lr = 5.0"]),
        (["run.rounds=5000"], ["run.rounds = 5000"]),
        (["strategy.name=fedavg", "strategy.nhead=1"], []),  # allowed: fedavg keeping a head of one unit
    ],
)
def test_a_hello_outside_the_policy_is_refused(
    dataset: Path, tmp_path: Path, extra: list[str], words: list[str]
) -> None:
    config = config_of(dataset, *extra)
    reply = send(deployed(tmp_path, dataset), Hello(RUN, config_to_toml(config)))
    if not words:
        assert isinstance(reply, HelloReply)
        return
    refused(reply, *words)
    assert not (tmp_path / "state" / RUN / "hospital.json").exists()


def test_the_policy_file_decides_not_the_server(dataset: Path, tmp_path: Path) -> None:
    policy_file = tmp_path / "policy.toml"
    policy_file.write_text("[share]\nmin_nhead = 0\n[accept]\nmethods = ['fedavg']\n")
    policy = load_policy(policy_file)
    fedavg = config_of(dataset, "strategy.name=fedavg", "strategy.nhead=0")
    assert isinstance(send(deployed(tmp_path / "a", dataset, policy), Hello(RUN, config_to_toml(fedavg))), HelloReply)
    refused(send(deployed(tmp_path / "b", dataset, policy), Hello(RUN, config_to_toml(config_of(dataset)))), "fedsaf")
    bad = tmp_path / "bad.toml"
    for text, says in [
        ("[share]\nmin_head = 0\n", "unknown key 'min_head'"),
        # a later section may not quietly undo an earlier one
        ("[share]\nmin_nhead = 3\n[model]\nmin_nhead = 0\n", "min_nhead belongs in [share], not [model]"),
        ("min_nhead = 3\n[share]\nmin_nhead = 0\n", "min_nhead is given twice; keep one"),
        ("[sharing]\nmin_nhead = 3\n", "unknown section [sharing]; use [share], [accept], [privacy], [model]"),
        ("[privacy]\ndp_unit = 'patient'\n", "dp_unit = 'patient'; use one of slide, tile"),
        ("[privacy]\nmax_sample_rate = 0\n", "max_sample_rate = 0; use a probability in (0, 1]"),
    ]:
        bad.write_text(text)
        with pytest.raises(FederationError, match=re.escape(f"hospital policy {bad}: {says}")):
            load_policy(bad)
    bad.write_bytes(b"[share]\nmin_nhead = \xff\n")
    with pytest.raises(FederationError, match=re.escape(f"hospital policy {bad} is not UTF-8 text (byte 20)")):
        load_policy(bad)
    # the example shipped with the project is the defaults, section by section
    example = load_policy(Path("configs/hospital_policy.toml"))
    assert dataclasses.replace(example, source=HospitalPolicy().source) == HospitalPolicy()


def test_a_server_named_path_is_never_opened_and_existence_is_not_revealed(dataset: Path, tmp_path: Path) -> None:
    existing = tmp_path / "secret.safetensors"
    existing.write_bytes(b"not even a model")
    replies = []
    for path in (existing, tmp_path / "missing.safetensors"):
        config = config_of(dataset, f"model.weights={json.dumps(str(path))}")
        replies.append(send(deployed(tmp_path / path.stem, dataset), Hello(RUN, config_to_toml(config))))
    for reply in replies:
        refused(reply, "opens no path the server names")
    assert isinstance(replies[0], Failure)
    assert isinstance(replies[1], Failure)
    assert replies[0].reason == replies[1].reason


@pytest.mark.parametrize("bad", ["nan", "shape", "foreign", "centre"])
def test_bad_tensors_are_refused_and_the_exported_model_stays(dataset: Path, tmp_path: Path, bad: str) -> None:
    hospital, config, exported = after_round_one(tmp_path, dataset)
    task = honest_task(config, 2, evaluate=True)
    shared = task.instruction.shared
    assert shared is not None
    key = next(k for k in shared if k.endswith("weight"))
    if bad == "nan":
        shared[key] = torch.full_like(shared[key], float("nan"))
    elif bad == "shape":
        shared[key] = shared[key].flatten()[:-1]
    elif bad == "foreign":
        shared["classifier.3.bias"] = torch.zeros(2)
    else:
        task.instruction = TrainInstruction(
            0, Recipe(epochs=1, prox_mu=1.0), shared=shared, prox_centre={key: shared[key] * float("inf")}
        )
    reply = send(hospital, task)
    refused(
        reply,
        {"nan": "not finite", "shape": "agreed model's is", "foreign": "classifier.3.bias", "centre": "not finite"}[
            bad
        ],
    )
    assert (tmp_path / "state" / RUN / WEIGHTS_FILE).read_bytes() == exported
    assert not (tmp_path / "state" / RUN / "checkpoints" / "round_0002.safetensors").exists()
    # an evaluation with NaN weights is refused too, and a later honest round still works from the good state
    fresh = honest_task(config, 2).instruction.shared
    assert fresh is not None
    nan = {k: torch.full_like(v, float("nan")) if v.is_floating_point() else v for k, v in fresh.items()}
    refused(send(hospital, EvaluateTask(RUN, 1, 0, task.shared_keys, nan)), "not finite")
    assert (tmp_path / "state" / RUN / WEIGHTS_FILE).read_bytes() == exported
    assert isinstance(send(hospital, honest_task(config, 2)), TrainReply)


@pytest.mark.parametrize(
    ("recipe", "words"),
    [
        (Recipe(lr=-1.0), "lr = -1.0"),
        (Recipe(lr=float("nan")), "not a finite number"),
        (Recipe(epochs=10_000), "epochs = 10000"),
        (Recipe(prox_mu=1e9), "prox_mu"),
        (Recipe(optimizer="rmsprop"), "optimizer 'rmsprop' is not one of sgd, adam"),
        (Recipe(fisher_estimator="bogus"), "fisher_estimator 'bogus' is not one of per_sample, full_pass"),
        (Recipe(momentum=1e30), "momentum = 1e+30 is outside [0, 1]"),
        (Recipe(optimizer="adam", adam_beta1=5.0), "adam_beta1 = 5 is outside [0, 1]"),
        (Recipe(optimizer="adam", adam_eps=0.0), "adam_eps = 0 is outside (0, 1]"),
        (Recipe(dp_sample_rate=1e-7, dp_noise_multiplier=1.0, dp_max_grad_norm=1.0), "takes 10000000 steps"),
        (Recipe(dp_sample_rate=0.5, dp_noise_multiplier=1.0, dp_max_grad_norm=-1.0), "clip norm -1 is outside"),
    ],
)
def test_a_recipe_outside_the_policy_is_refused(dataset: Path, tmp_path: Path, recipe: Recipe, words: str) -> None:
    hospital, config, _ = after_round_one(tmp_path, dataset)
    task = honest_task(config, 2)
    task.instruction = TrainInstruction(0, recipe, shared=task.instruction.shared)
    refused(send(hospital, task), words)


def test_another_clients_task_and_a_bad_run_id_are_one_line_failures(dataset: Path, tmp_path: Path) -> None:
    hospital, config, _ = after_round_one(tmp_path, dataset)
    task = honest_task(config, 2)
    task.instruction = TrainInstruction(1, task.instruction.recipe, shared=task.instruction.shared)
    refused(send(hospital, task), "client 1's task")
    for run_id in ("a\x00b", "../escape", "x" * 500):
        reply = send(hospital, Hello(run_id, config_to_toml(config)))
        assert isinstance(reply, Failure)
        assert "cannot name a hospital folder" in reply.reason
    garbage = ({"kind": "train", "run_id": RUN}, {})
    reply = decode(hospital.answer(garbage))
    assert isinstance(reply, Failure)
    assert "cannot read the message" in reply.reason


def test_a_new_hello_never_replaces_a_run_the_hospital_holds(dataset: Path, tmp_path: Path) -> None:
    hospital, config, exported = after_round_one(tmp_path, dataset)
    refused(send(hospital, Hello(RUN, config_to_toml(config))), "already holds run")
    assert (tmp_path / "state" / RUN / WEIGHTS_FILE).read_bytes() == exported
    assert isinstance(send(hospital, Hello(RUN, config_to_toml(config), resume=True)), HelloReply)


def test_a_failed_write_or_a_non_finite_evaluation_is_a_failure_and_nothing_is_deployed(
    dataset: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from safetensors import SafetensorError

    import federation.hospital.store as store_module
    from federation.hospital.evaluation import EvalResult
    from federation.hospital.trainer import Trainer

    hospital, config, exported = after_round_one(tmp_path, dataset)

    def full_disk(*args: object, **kwargs: object) -> None:
        raise SafetensorError("Error while serializing: IoError(No space left on device)")

    with monkeypatch.context() as patch:
        patch.setattr(store_module, "save_file", full_disk)
        reply = send(hospital, honest_task(config, 2))
    assert isinstance(reply, Failure)
    assert "cannot write its checkpoint" in reply.reason
    original = Trainer.evaluate

    def diverged(self: Trainer) -> EvalResult:
        return dataclasses.replace(original(self), loss=float("nan"))

    monkeypatch.setattr(Trainer, "evaluate", diverged)
    reply = send(hospital, honest_task(config, 2, evaluate=True))
    assert isinstance(reply, Failure)
    assert "not kept or deployed" in reply.reason
    assert (tmp_path / "state" / RUN / WEIGHTS_FILE).read_bytes() == exported
    monkeypatch.setattr(Trainer, "evaluate", original)
    ok = send(hospital, EvaluateTask(RUN, 2, 0, honest_keys(config), None))
    assert isinstance(ok, EvaluateReply)


def test_audit_reports_runs_values_and_refusals_and_detects_an_edited_log(dataset: Path, tmp_path: Path) -> None:
    hospital, config, _ = after_round_one(tmp_path, dataset)
    task = honest_task(config, 2)
    task.shared_keys = [*task.shared_keys, "classifier.3.weight"]
    send(hospital, task)
    runner = CliRunner()
    result = runner.invoke(app, ["federation", "audit", "--state", str(tmp_path / "state")])
    assert result.exit_code == 0, result.output
    assert "integrity: intact" not in result.output  # without an anchor, the end of the log is not vouched for
    assert "the end of the log cannot be checked without an anchor" in result.output
    assert f"run {RUN}: 3 replies" in result.output
    assert "refused requests: 1" in result.output
    assert "classifier.3.weight" in result.output
    sent = sum(int(r["values"]) for r in log_of(tmp_path))  # type: ignore[call-overload]
    assert f"{sent:,} values left" in result.output
    assert sent > 0
    log = tmp_path / "state" / "outbound.jsonl"
    lines = log.read_text().splitlines()
    log.write_text("\n".join([lines[0], lines[2]]) + "\n")  # a reply removed from the record
    result = runner.invoke(app, ["federation", "audit", "--state", str(tmp_path / "state")])
    assert result.exit_code == 1
    assert "outbound.jsonl:2: the chain is broken" in result.output


def test_a_hospital_with_only_its_own_slides_takes_part_under_its_bundles_index(dataset: Path, tmp_path: Path) -> None:
    """A hospital that prepared only its own slides (its dataset's only client is 0) answers as the federation's
    hospital 2, with its own counts, and holds nothing of another hospital."""
    own = extract_hospital(dataset, 2, tmp_path / "mine")
    assert {line.split(",")[0] for line in (own / "manifest.csv").read_text().splitlines()[1:]} == {"0"}
    config = config_of(dataset)
    hospital = Hospital(Site(own, 2, tmp_path / "state", per_run=True, policy=HospitalPolicy(), rows=0))
    hello = send(hospital, Hello(RUN, config_to_toml(config)))
    assert isinstance(hello, HelloReply)
    assert (hello.client, hello.num_train, hello.num_test) == (2, sum(LAYOUT[2]["train"]), sum(LAYOUT[2]["test"]))
    task = honest_task(config, 1, evaluate=True)
    task.instruction = TrainInstruction(2, task.instruction.recipe, shared=task.instruction.shared)
    reply = send(hospital, task)
    assert isinstance(reply, TrainReply)
    assert reply.client == 2
    assert reply.evaluation is not None
    assert reply.evaluation.client == 2
    assert reply.num_examples == sum(LAYOUT[2]["train"])


def test_a_hospital_that_lost_its_checkpoints_says_so_instead_of_training_on(dataset: Path, tmp_path: Path) -> None:
    import shutil

    _, config, exported = after_round_one(tmp_path, dataset)
    shutil.rmtree(tmp_path / "state" / RUN / "checkpoints")
    fresh = deployed(tmp_path, dataset)  # a restarted hospital process: nothing in memory
    reply = send(fresh, honest_task(config, 2))
    assert isinstance(reply, Failure)
    assert "no checkpoint before round 2" in reply.reason
    assert "although it saved one for round 1" in reply.reason
    assert (tmp_path / "state" / RUN / WEIGHTS_FILE).read_bytes() == exported
    # a hospital that missed round 1 altogether (never trained) starts round 2 from the initial model, as before
    other = deployed(tmp_path / "late", dataset)
    assert isinstance(send(other, Hello(RUN, config_to_toml(config))), HelloReply)
    assert isinstance(send(other, honest_task(config, 2)), TrainReply)
