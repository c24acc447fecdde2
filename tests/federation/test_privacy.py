"""Differential privacy at a hospital (issue 22, federation.privacy): the DP-SGD pieces with exact numbers, the
accountant against Opacus's own analysis, the GroupNorm model, the configuration, and a DP federation in-process:
epsilon recorded per round at the hospital and on the server, resume continuing the ledger, a spent budget
refused by the hospital's policy."""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch
from support.runs import records, stable
from support.tiny_dataset import TINY_SETTINGS, make_dataset
from torch import nn

from federation.client import Client
from federation.config import config_to_toml, load_config
from federation.contract import Recipe, TrainInstruction
from federation.data import ClientData, to_tensor
from federation.engine import load_run_config
from federation.engine.policy import HospitalPolicy, PolicyRefusal, check_budget
from federation.errors import FederationError
from federation.launch import train
from federation.privacy import (
    ACCOUNTANT_FILE,
    Accountant,
    clip_factor,
    gradient_norm,
    noised_mean,
    planned_dp_steps,
    poisson_sample,
    steps_per_epoch,
)
from models import create_model
from models.registry import group_norm_groups

DP = ("model.norm=group", "privacy.noise_multiplier=1.0", "privacy.max_grad_norm=1.0", "privacy.sample_rate=0.5")


# --- the pieces --------------------------------------------------------------------------------------------------


def test_poisson_sampling_takes_each_unit_with_its_own_draw() -> None:
    draws = torch.rand(10, generator=torch.Generator().manual_seed(3))
    taken = poisson_sample(10, 0.3, torch.Generator().manual_seed(3))
    assert taken.tolist() == [i for i in range(10) if draws[i] < 0.3]
    assert poisson_sample(10, 1.0, torch.Generator().manual_seed(0)).tolist() == list(range(10))
    rate = poisson_sample(100_000, 0.1, torch.Generator().manual_seed(1)).numel() / 100_000
    assert abs(rate - 0.1) < 0.005
    with pytest.raises(ValueError, match="sample rate"):
        poisson_sample(3, 0.0, torch.Generator())


def test_clipping_bounds_the_norm_and_leaves_small_gradients_alone() -> None:
    big = [torch.tensor([3.0, 4.0]), torch.tensor([[12.0]])]  # norm 13
    assert gradient_norm(big) == 13.0
    factor = clip_factor(13.0, 1.0)
    assert factor == 1.0 / (13.0 + 1e-6)
    assert gradient_norm([g * factor for g in big]) <= 1.0
    small = [torch.tensor([0.3, 0.4])]  # norm 0.5 < C
    assert clip_factor(gradient_norm(small), 1.0) == 1.0


def test_noise_has_the_scale_sigma_c_and_the_mean_divides_by_the_expected_batch() -> None:
    total = [torch.tensor([2.0, 4.0])]
    assert noised_mean(total, 0.0, 1.0, 4.0, torch.Generator())[0].tolist() == [0.5, 1.0]
    out = noised_mean([torch.zeros(200_000)], 2.0, 0.5, 10.0, torch.Generator().manual_seed(5))[0]
    expected = torch.normal(0.0, 1.0, size=(200_000,), generator=torch.Generator().manual_seed(5)) / 10.0
    assert torch.equal(out, expected)  # sigma C = 1.0, then / (q N) = 10
    assert abs(float(out.std()) - 0.1) < 0.001
    assert steps_per_epoch(0.25) == 4
    assert steps_per_epoch(0.3) == 3
    assert planned_dp_steps(Recipe(epochs=2, head_epochs=1, dp_sample_rate=0.25)) == 12


def test_the_accountant_is_opacus_rdp() -> None:
    from opacus.accountants.analysis.rdp import compute_rdp, get_privacy_spent
    from opacus.accountants.rdp import RDPAccountant

    ledger = Accountant()
    ledger.step(1.0, 0.01, 60)
    ledger.step(1.0, 0.01, 40)  # merged: the same parameters
    assert ledger.history == [(1.0, 0.01, 100)]
    orders = RDPAccountant.DEFAULT_ALPHAS
    rdp = compute_rdp(q=0.01, noise_multiplier=1.0, steps=100, orders=orders)
    eps, _ = get_privacy_spent(orders=orders, rdp=rdp, delta=1e-5)
    assert ledger.epsilon(1e-5) == pytest.approx(float(eps), rel=1e-12)
    assert ledger.epsilon(1e-5) == pytest.approx(1.2141452107864754, rel=1e-9)
    ledger.step(2.0, 0.05, 10)
    assert ledger.steps == 110
    assert ledger.epsilon_after(2.0, 0.05, 5, 1e-5) > ledger.epsilon(1e-5)
    again = Accountant.from_json(json.loads(json.dumps(ledger.to_json())), "ledger")
    assert again == ledger
    assert Accountant().epsilon(1e-5) == 0.0
    with pytest.raises(ValueError, match="not a privacy ledger"):
        Accountant.from_json({"history": [{"steps": 1}]}, "x.json")


def test_the_group_norm_model_has_no_batch_statistics() -> None:
    from opacus.validators import ModuleValidator

    model = create_model("mobilenet_v3_small", 2, 3, norm="group")
    assert not any(isinstance(m, nn.modules.batchnorm._BatchNorm) for m in model.modules())
    norms = [m for m in model.modules() if isinstance(m, nn.GroupNorm)]
    assert norms
    assert {m.num_groups for m in norms} == {8}
    assert not [k for k in model.state_dict() if "running" in k or "num_batches" in k]
    assert ModuleValidator.validate(model, strict=False) == []  # Opacus finds nothing DP-SGD cannot train
    assert [group_norm_groups(c) for c in (16, 40, 88, 12)] == [8, 8, 8, 4]


# --- per-slide clipping inside a training step --------------------------------------------------------------------


def _tiny_client(units: tuple[str, ...]) -> Client:
    torch.manual_seed(0)
    x = np.random.default_rng(0).integers(0, 255, size=(len(units), 4, 4, 3), dtype=np.uint8)
    y = np.array([i % 2 for i in range(len(units))], dtype=np.int64)
    data = ClientData(0, x, y, x[:2], y[:2], ["a.png", "b.png"], False, train_units=units)
    model = nn.Sequential(nn.Flatten(), nn.Linear(48, 2))
    return Client(data, model, ["1.weight", "1.bias"], batch_size=4, eval_batch_size=4, augment=False)


def test_a_dp_step_is_the_mean_of_each_slides_clipped_gradient() -> None:
    """q = 1 (every slide every step), no noise, SGD lr 1: the step is minus the sum of the slides' clipped
    gradients over the number of slides; slides have unequal tile counts, C small enough to clip some."""
    units = ("s0", "s0", "s0", "s1", "s2", "s2")
    client = _tiny_client(units)
    before = {k: v.detach().clone() for k, v in client.model.named_parameters()}
    expected = {k: torch.zeros_like(v) for k, v in before.items()}
    norms = []
    for slide in ("s0", "s1", "s2"):
        index = [i for i, u in enumerate(units) if u == slide]
        loss = nn.functional.cross_entropy(
            client.model(to_tensor(client.data.train_x[index], "cpu")), torch.from_numpy(client.data.train_y[index])
        )
        grads = torch.autograd.grad(loss, list(client.model.parameters()))
        norm = gradient_norm(grads)
        norms.append(norm)
        for (k, _), g in zip(client.model.named_parameters(), grads, strict=True):
            expected[k] += g * min(1.0, 0.5 / (norm + 1e-6))
    assert max(norms) > 0.5  # at least one slide is clipped
    recipe = Recipe(epochs=1, lr=1.0, dp_noise_multiplier=0.0, dp_max_grad_norm=0.5, dp_sample_rate=1.0)
    client.train(TrainInstruction(client=0, recipe=recipe), server_round=1, seed=0)
    assert client.dp_steps == 1
    for k, v in client.model.named_parameters():
        assert torch.allclose(v.detach(), before[k] - expected[k] / 3.0, atol=1e-6), k


def test_slide_level_dp_needs_slide_names() -> None:
    client = _tiny_client(("s0", "s1"))
    client.data.train_units = None
    recipe = Recipe(epochs=1, lr=0.1, dp_noise_multiplier=1.0, dp_max_grad_norm=1.0, dp_sample_rate=1.0)
    with pytest.raises(FederationError, match="tile names do not say"):
        client.train(TrainInstruction(client=0, recipe=recipe), server_round=1, seed=0)


# --- configuration and policy --------------------------------------------------------------------------------------


def test_privacy_configuration() -> None:
    plain = load_config(None, [])
    assert "[privacy]" not in config_to_toml(plain)  # a run without DP writes what it always wrote
    config = load_config(None, list(DP))
    text = config_to_toml(config)
    assert "[privacy]\nnoise_multiplier = 1.0\nmax_grad_norm = 1.0\nsample_rate = 0.5\n" in text
    assert config.privacy.run_delta == 1e-5
    with pytest.raises(FederationError, match=r"model.norm.*set model.norm = group"):
        load_config(None, list(DP[1:]))
    with pytest.raises(FederationError, match=r"privacy.sample_rate.*DP-SGD needs a clip norm and a sampling rate"):
        load_config(None, ["model.norm=group", "privacy.noise_multiplier=1.0", "privacy.max_grad_norm=1.0"])
    with pytest.raises(FederationError, match=r"privacy.max_grad_norm.*set privacy.noise_multiplier"):
        load_config(None, ["privacy.max_grad_norm=1.0"])
    with pytest.raises(FederationError, match=r"privacy.unit"):
        load_config(None, [*DP, "privacy.unit=patient"])


def test_the_policy_refuses_a_round_past_its_budget() -> None:
    policy = HospitalPolicy(max_epsilon=3.0)
    private = Recipe(epochs=1, dp_noise_multiplier=1.0, dp_max_grad_norm=1.0, dp_sample_rate=0.25)
    check_budget(policy, private, 1.0, 2.9)  # within
    with pytest.raises(PolicyRefusal, match=r"budget is spent: epsilon 2\.500 so far, 3\.100 after this round"):
        check_budget(policy, private, 2.5, 3.1)
    with pytest.raises(PolicyRefusal, match="trains only with differential privacy"):
        check_budget(policy, Recipe(), 0.0, None)
    with pytest.raises(PolicyRefusal, match=r"delta 0.01 is above"):
        check_budget(policy, Recipe(dp_sample_rate=0.25, dp_noise_multiplier=1.0, dp_delta=0.01), 0.0, 0.1)
    check_budget(HospitalPolicy(), Recipe(), 0.0, None)  # no budget: nothing required
    with pytest.raises(FederationError, match="max_epsilon"):
        HospitalPolicy(max_epsilon=-1.0)


# --- a DP federation in-process -----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def slides_dataset(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny dataset with prepare's tile names: two tiles per slide (``<slide>_s<slide>_x.._y...png``)."""
    folder = make_dataset(tmp_path_factory.mktemp("dp"))
    with (folder / "manifest.csv").open(newline="") as handle:
        rows = list(csv.DictReader(handle))
    for i, row in enumerate(rows):
        old = folder / row["path"]
        new_name = f"{i // 2:05d}_s{i // 2}_x{(i % 2) * 40:05d}_y00000.png"
        row["path"] = str(Path(row["path"]).with_name(new_name).as_posix())
        old.rename(folder / row["path"])
    with (folder / "manifest.csv").open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    return folder


def test_a_dp_federation_records_epsilon_and_resume_continues_the_ledger(slides_dataset: Path, tmp_path: Path) -> None:
    settings = [*TINY_SETTINGS, *DP, "strategy.name=fedrep", "client.head_epochs=1", "client.epochs=1"]
    straight = tmp_path / "straight"
    train(load_config(None, settings, data=slides_dataset), straight, progress=False)
    lines = records(straight)
    assert {line["round"] for line in lines} == {1, 2}
    for client in (0, 1, 2):
        ledger = json.loads((straight / "hospitals" / f"client_{client:02d}" / ACCOUNTANT_FILE).read_text())
        # 2 rounds x (1 head + 1 base epoch) x round(1 / 0.5) steps, all at sigma 1, q 0.5
        assert ledger == {
            "accountant": "opacus RDPAccountant",
            "history": [{"noise_multiplier": 1.0, "sample_rate": 0.5, "steps": 8}],
        }
        mine = [line for line in lines if line["client"] == client]
        first, second = sorted(mine, key=lambda line: line["round"])
        assert first["dp_steps"] == 4.0
        assert second["dp_steps"] == 8.0
        assert first["dp_epsilon"] == pytest.approx(Accountant([(1.0, 0.5, 4)]).epsilon(1e-5))
        assert second["dp_epsilon"] == pytest.approx(Accountant([(1.0, 0.5, 8)]).epsilon(1e-5))
        assert second["dp_epsilon"] > first["dp_epsilon"] > 0
        assert first["dp_delta"] == 1e-5
    # the ledger is a file a run may hold: train --overwrite replaces a DP run like any other
    from federation.runs import RUN_PATTERNS
    from infra.outputs import foreign_entries

    assert foreign_entries(straight, "train", RUN_PATTERNS) == []
    # the model card states the guarantee of the weights; report.md what recomputes each hospital's epsilon
    from federation.report import load_run, privacy_rows
    from models.bundle import read_card

    card = read_card(straight / "hospitals" / "client_00").privacy
    assert card["epsilon"] == pytest.approx(Accountant([(1.0, 0.5, 8)]).epsilon(1e-5))
    assert (card["delta"], card["unit"], card["steps"], card["noise_multiplier"]) == (1e-5, "slide", 8, 1.0)
    rows = privacy_rows([load_run(straight)])
    assert [(r["client"], r["round"], r["DP-SGD steps"], r["sample rate"]) for r in rows] == [
        (0, 2, 8, 0.5),
        (1, 2, 8, 0.5),
        (2, 2, 8, 0.5),
    ]
    assert rows[0]["epsilon"] == pytest.approx(card["epsilon"])
    # stop after round 1, resume to 2: the ledger continues exactly
    resumed = tmp_path / "resumed"
    train(load_config(None, [*settings, "run.rounds=1"], data=slides_dataset), resumed, progress=False)
    train(load_run_config(resumed, ["run.rounds=2"]), resumed, resume=True, progress=False)
    for client in (0, 1, 2):
        name = f"client_{client:02d}"
        assert (resumed / "hospitals" / name / ACCOUNTANT_FILE).read_text() == (
            straight / "hospitals" / name / ACCOUNTANT_FILE
        ).read_text()
    assert [line["dp_epsilon"] for line in records(resumed)] == [line["dp_epsilon"] for line in lines]
    assert math.isfinite(lines[0]["test_acc"])


# --- the hospital's side: its ledger, its budget, what leaves ------------------------------------------------------

RUN = "dp-run"


def test_a_hospital_spends_its_budget_then_refuses_and_only_accounted_scalars_leave(
    slides_dataset: Path, tmp_path: Path
) -> None:
    from federation.contract import Failure, Hello, HelloReply, TrainReply, TrainTask
    from federation.engine.codec import decode, encode
    from federation.engine.derived import initial_state, resolve_config
    from federation.engine.hospital import Hospital, Site
    from federation.engine.outbound import read_outbound
    from federation.engine.policy import agreed_shared_keys
    from federation.strategies.context import recipe_from_config

    config = resolve_config(
        load_config(None, [*TINY_SETTINGS, *DP, "strategy.name=fedrep", "strategy.nhead=1"], data=slides_dataset)
    )
    recipe = recipe_from_config(config)
    assert recipe.private
    first = Accountant()
    first.step(1.0, 0.5, planned_dp_steps(recipe))
    second = Accountant()
    second.step(1.0, 0.5, 2 * planned_dp_steps(recipe))
    budget = (first.epsilon(1e-5) + second.epsilon(1e-5)) / 2  # enough for one round, not for two
    hospital = Hospital(
        Site(slides_dataset, 0, tmp_path / "state", per_run=True, policy=HospitalPolicy(max_epsilon=budget))
    )

    def send(message: object) -> object:
        return decode(hospital.answer(encode(message)))  # type: ignore[arg-type]

    assert isinstance(send(Hello(RUN, config_to_toml(config))), HelloReply)
    model = create_model(config.model.name, 2, config.model.in_chans, norm="group")
    keys = agreed_shared_keys(config, model)
    initial, _ = initial_state(config)

    def task(server_round: int, the_recipe: Recipe) -> TrainTask:
        shared = {k: initial[k].clone() for k in keys}
        return TrainTask(RUN, server_round, 7, keys, TrainInstruction(0, the_recipe, shared=shared))

    # a server that drops DP from the recipe is refused: this hospital trains only privately
    plain = Recipe(epochs=1, lr=0.01)
    refusal = send(task(1, plain))
    assert isinstance(refusal, Failure)
    assert "trains only with differential privacy" in refusal.reason
    reply = send(task(1, recipe))
    assert isinstance(reply, TrainReply)
    assert reply.metrics["dp_epsilon"] == pytest.approx(first.epsilon(1e-5))
    assert set(reply.metrics) == {"train_loss", "dp_epsilon", "dp_delta", "dp_steps"}
    ledger = json.loads((tmp_path / "state" / RUN / ACCOUNTANT_FILE).read_text())
    assert ledger["history"] == [{"noise_multiplier": 1.0, "sample_rate": 0.5, "steps": planned_dp_steps(recipe)}]
    # round 2 would pass the budget: refused, and the ledger is unchanged
    refusal = send(task(2, recipe))
    assert isinstance(refusal, Failure)
    assert "privacy budget is spent" in refusal.reason
    assert f"max_epsilon {budget:g}" in refusal.reason
    assert json.loads((tmp_path / "state" / RUN / ACCOUNTANT_FILE).read_text()) == ledger
    # what left the hospital: the hello, one train reply (the shared tensors and the accounted scalars), refusals
    records = read_outbound(tmp_path / "state" / "outbound.jsonl").records
    assert [r["kind"] for r in records] == ["hello_reply", "failure", "train_reply", "failure"]
    sent = records[2]
    assert set(sent["tensors"]) == {f"shared/{k}" for k in keys}  # type: ignore[arg-type]
    # beside the tensors: counts, seconds, and the metrics: the training loss (not covered by the guarantee,
    # docs/privacy.md) and the accounted scalars
    assert set(sent["scalars"]) == {"num_examples", "metrics", "seconds", "evaluation"}  # type: ignore[arg-type]
    assert sent["scalars"]["evaluation"] is None  # type: ignore[index]  (no evaluation was asked for)
    assert set(sent["scalars"]["metrics"]) == {"train_loss", "dp_epsilon", "dp_delta", "dp_steps"}  # type: ignore[index]


@pytest.mark.slow
def test_a_dp_federation_gives_the_same_figures_in_every_engine(slides_dataset: Path, tmp_path: Path) -> None:
    """In-process, flower-sim and the loopback deployment (each hospital under a policy that requires DP): identical
    per-round metrics, epsilons included, and each deployed hospital's ledger the in-process one."""
    from federation.flower.demo import run_demo

    settings = [*TINY_SETTINGS, *DP, "strategy.name=fedrep", "client.head_epochs=1", "client.epochs=1"]
    local, sim, demo = tmp_path / "local", tmp_path / "sim", tmp_path / "demo"
    policy = tmp_path / "policy.toml"
    policy.write_text("min_nhead = 1\nmax_epsilon = 1000.0\n", encoding="utf-8")
    train(load_config(None, settings, data=slides_dataset), local, progress=False)
    train(load_config(None, [*settings, "run.engine=flower-sim"], data=slides_dataset), sim, progress=False)
    run_demo(
        load_config(None, [*settings, "run.engine=flower"], data=slides_dataset), demo, progress=False, policy=policy
    )

    def figures(run: Path) -> list[dict]:
        return stable(run)

    assert figures(sim) == figures(local)
    assert figures(demo) == figures(local)
    assert all(line["dp_epsilon"] > 0 for line in figures(local))
    for run in (sim, demo):
        for client in (0, 1, 2):
            name = f"client_{client:02d}/{ACCOUNTANT_FILE}"
            assert (run / "hospitals" / name).read_text() == (local / "hospitals" / name).read_text()
