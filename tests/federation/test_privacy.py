"""Differential privacy at a hospital (issue 22, federation.hospital.privacy): the DP-SGD pieces with exact numbers, the
accountant against Opacus's own analysis, the GroupNorm model, the configuration, and a DP federation in-process:
epsilon recorded per round at the hospital and on the server, resume continuing the ledger, a spent budget
refused by the hospital's policy."""

from __future__ import annotations

import json
import math
import re
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch
from support.runs import records, stable
from support.tiny_dataset import TINY_SETTINGS, make_dataset, name_tiles_by_slide
from torch import nn

from federation.config import config_to_toml, load_config
from federation.engine import load_run_config
from federation.errors import FederationError
from federation.hospital.data import HospitalData, to_tensor
from federation.hospital.policy import (
    HospitalPolicy,
    PolicyRefusal,
    check_agreed_privacy,
    check_budget,
    check_config,
    check_privacy,
    check_recipe,
)
from federation.hospital.privacy import (
    ACCOUNTANT_FILE,
    Accountant,
    LedgerEntry,
    clip_factor,
    gradient_norm,
    noised_mean,
    planned_dp_steps,
    poisson_sample,
    rdp_epsilon,
    steps_per_epoch,
)
from federation.hospital.trainer import Trainer
from federation.launch import train
from federation.strategies.context import recipe_from_config
from federation.wire.contract import Recipe, TrainInstruction
from models import create_model
from models.registry import group_norm_groups

# every DP entry of these runs: slide-level, the defaults' 8 tiles a slide, clip 1, delta 1e-5
ENTRY = (("unit", "slide"), ("tiles_per_unit", 8), ("max_grad_norm", 1.0), ("delta", 1e-5))
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


def entry(server_round: int, sigma: float, rate: float, steps: int, **other: object) -> LedgerEntry:
    """A ledger entry of slide-level DP-SGD with clip 1, 8 tiles a unit and delta 1e-5 unless told."""
    fields = {"unit": "slide", "tiles_per_unit": 8, "max_grad_norm": 1.0, "delta": 1e-5, **other}
    return LedgerEntry(server_round, sigma, rate, steps, **fields)  # type: ignore[arg-type]


def test_the_accountant_is_opacus_rdp() -> None:
    from opacus.accountants.analysis.rdp import compute_rdp, get_privacy_spent
    from opacus.accountants.rdp import RDPAccountant

    ledger = Accountant()
    ledger.step(entry(1, 1.0, 0.01, 60))
    ledger.step(entry(2, 1.0, 0.01, 40))  # merged for the accountant: the same parameters
    assert ledger.history == [(1.0, 0.01, 100)]
    assert [e.round for e in ledger.entries] == [1, 2]
    orders = RDPAccountant.DEFAULT_ALPHAS
    rdp = compute_rdp(q=0.01, noise_multiplier=1.0, steps=100, orders=orders)
    eps, _ = get_privacy_spent(orders=orders, rdp=rdp, delta=1e-5)
    assert ledger.epsilon(1e-5) == pytest.approx(float(eps), rel=1e-12)
    assert ledger.epsilon(1e-5) == pytest.approx(1.2141452107864754, rel=1e-9)
    ledger.step(entry(3, 2.0, 0.05, 10))
    assert ledger.steps == 110
    assert ledger.epsilon_after(2.0, 0.05, 5, 1e-5) > ledger.epsilon(1e-5)
    again = Accountant.from_json(json.loads(json.dumps(ledger.to_json())), "ledger")
    assert again == ledger
    assert Accountant().epsilon(1e-5) == 0.0
    assert rdp_epsilon([(1.0, 0.01, 100)], 1e-5) == ledger_epsilon_of_first_two(ledger)
    with pytest.raises(ValueError, match="not a privacy ledger"):
        Accountant.from_json({"entries": [{"steps": 1}]}, "x.json")


def ledger_epsilon_of_first_two(ledger: Accountant) -> float:
    return Accountant(ledger.entries[:2]).epsilon(1e-5)


def test_a_ledger_refuses_impossible_entries_and_a_changed_past() -> None:
    ledger = Accountant([entry(1, 1.0, 0.5, 4), entry(2, 1.0, 0.5, 4)])
    data = ledger.to_json()
    for key, value, named in [
        ("steps", -1000, "steps -1000"),
        ("noise_multiplier", -1.0, "noise multiplier -1.0"),
        ("sample_rate", 0.0, "sample rate 0.0"),
        ("unit", "patient", "unit 'patient'"),
        ("max_grad_norm", -1.0, "clip norm -1.0"),
        ("delta", 1.0, "delta 1.0"),
    ]:
        bad = json.loads(json.dumps(data))
        bad["entries"][1][key] = value
        with pytest.raises(ValueError, match=re.escape(f"x.json entry 2 holds {named}")):
            Accountant.from_json(bad, "x.json")
    with pytest.raises(ValueError, match=r"cannot hold delta 2\.0"):
        Accountant().step(entry(1, 1.0, 0.5, 3, delta=2.0))
    anchor = ledger.anchor()
    assert (anchor["entries"], anchor["steps"]) == (2, 8)
    assert len(anchor["sha256"]) == 64
    ledger.check_anchor(anchor, "l.json")  # itself
    longer = Accountant([*ledger.entries, entry(3, 1.0, 0.5, 4)])
    longer.check_anchor(anchor, "l.json")  # entries added after the anchor only raise epsilon: accepted
    for changed in (
        Accountant(),  # reset
        Accountant(ledger.entries[:1]),  # its end removed
        Accountant([entry(1, 1e6, 0.5, 4), entry(2, 1.0, 0.5, 4)]),  # noise edited
        Accountant([entry(1, 1.0, 0.5, 4), entry(2, 1.0, 0.5, 3)]),  # steps edited
    ):
        with pytest.raises(ValueError, match=r"l\.json does not hold the 2 entries recorded in hospital\.json"):
            changed.check_anchor(anchor, "l.json")
    with pytest.raises(ValueError, match=r"record of l\.json in hospital\.json is damaged"):
        ledger.check_anchor({"entries": "two"}, "l.json")


def test_an_entry_beyond_the_anchor_that_switches_the_unit_is_refused_in_one_line() -> None:
    ledger = Accountant([entry(1, 1.0, 0.5, 4), entry(2, 1.0, 0.5, 4)])  # both protect a slide
    anchor = ledger.anchor()
    switched = Accountant([*ledger.entries, entry(3, 1.0, 0.5, 4, unit="tile")])  # nothing vouches for entry 3
    with pytest.raises(ValueError, match="beyond the 2 recorded") as err:
        switched.check_anchor(anchor, "l.json")
    assert str(err.value) == (
        "l.json entry 3, beyond the 2 recorded in hospital.json, protects a tile where the recorded ones protect a "
        "slide: restore the ledger from the hospital's backup"
    )
    # the same unit beyond the anchor is still accepted (a process stopped between the ledger and its anchor)
    Accountant([*ledger.entries, entry(3, 1.0, 0.5, 4)]).check_anchor(anchor, "l.json")


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


def _tiny_client(units: tuple[str, ...]) -> Trainer:
    torch.manual_seed(0)
    x = np.random.default_rng(0).integers(0, 255, size=(len(units), 4, 4, 3), dtype=np.uint8)
    y = np.array([i % 2 for i in range(len(units))], dtype=np.int64)
    data = HospitalData(0, x, y, x[:2], y[:2], ["a.png", "b.png"], False, train_units=units)
    model = nn.Sequential(nn.Flatten(), nn.Linear(48, 2))
    return Trainer(data, model, ["1.weight", "1.bias"], batch_size=4, eval_batch_size=4, augment=False)


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
    with pytest.raises(PolicyRefusal, match=r"delta 0\.01 is above"):
        check_budget(policy, replace(private, dp_delta=0.01), 0.0, 0.1)
    check_budget(HospitalPolicy(), Recipe(), 0.0, None)  # no budget: nothing required
    with pytest.raises(FederationError, match="max_epsilon"):
        HospitalPolicy(max_epsilon=-1.0)


def test_the_hospital_owns_its_dp_unit_and_bounds() -> None:
    """A recipe that differs from the hospital's unit or bounds is refused in one line naming the value."""
    policy = HospitalPolicy(max_epsilon=5.0, min_noise_multiplier=0.5, max_tiles_per_unit=16, max_dp_steps=100)
    good = Recipe(epochs=1, dp_noise_multiplier=1.0, dp_max_grad_norm=1.0, dp_sample_rate=0.25)
    check_privacy(policy, good)
    for changed, says in [
        ({"dp_unit": "tile"}, "protects a 'tile', this hospital's budget counts 'slide' units"),
        ({"dp_noise_multiplier": 0.3}, "noise multiplier 0.3 is below this hospital's least 0.5"),
        ({"dp_noise_multiplier": 0.0, "dp_sample_rate": 0.25}, "noise multiplier 0 is below"),
        ({"dp_max_grad_norm": -1.0}, "clip norm -1 is outside (0, 100]"),
        ({"dp_tiles_per_unit": 64}, "tiles per unit 64 is outside [1, 16]"),
        (
            {"dp_sample_rate": 1e-7},
            "takes 10000000 steps (sample rate 1e-07), more than this hospital's max_dp_steps 100",
        ),
        ({"dp_delta": 1e-3}, "delta 0.001 is above this hospital's max_delta 1e-05"),
    ]:
        with pytest.raises(PolicyRefusal, match=re.escape(says)):
            check_privacy(policy, replace(good, **changed))  # type: ignore[arg-type]
        with pytest.raises(PolicyRefusal, match=re.escape(says)):  # the same at every round's recipe check
            check_recipe(policy, replace(good, **changed))  # type: ignore[arg-type]
    with pytest.raises(FederationError, match="dp_unit = 'patient'"):
        HospitalPolicy(dp_unit="patient")


def test_a_round_must_train_the_dp_the_run_agreed() -> None:
    """Whatever the hospital's policy, the server cannot drop, lower or re-unit the noise after the Hello."""
    config = load_config(None, [*TINY_SETTINGS, *DP, "privacy.noise_multiplier=1.4"])
    policy = HospitalPolicy()  # no max_epsilon: DP is not required, yet what was agreed holds
    agreed = recipe_from_config(config)
    check_agreed_privacy(policy, agreed, config)
    with pytest.raises(PolicyRefusal, match=re.escape("the round asks for no DP-SGD, the run agreed DP-SGD")):
        check_agreed_privacy(policy, Recipe(), config)
    with pytest.raises(PolicyRefusal, match=re.escape("noise_multiplier 0.3 differs from the run's agreed 1.4")):
        check_agreed_privacy(policy, replace(agreed, dp_noise_multiplier=0.3), config)
    with pytest.raises(PolicyRefusal, match=re.escape("unit 'tile' differs from the run's agreed 'slide'")):
        check_agreed_privacy(policy, replace(agreed, dp_unit="tile"), config)
    plain = load_config(None, list(TINY_SETTINGS))
    with pytest.raises(PolicyRefusal, match=re.escape("the round asks for DP-SGD, the run agreed none")):
        check_agreed_privacy(policy, agreed, plain)
    # a run asking for another unit than the hospital's is refused at the Hello, before any round
    with pytest.raises(PolicyRefusal, match="protects a 'tile'"):
        check_config(HospitalPolicy(min_nhead=0), load_config(None, [*TINY_SETTINGS, *DP, "privacy.unit=tile"]))
    with pytest.raises(PolicyRefusal, match="trains only with differential privacy"):
        check_config(HospitalPolicy(min_nhead=0, max_epsilon=5.0), plain)


# --- a DP federation in-process -----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def slides_dataset(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny dataset with prepare's tile names: two tiles per slide (``<slide>_s<slide>_x.._y...png``)."""
    return name_tiles_by_slide(make_dataset(tmp_path_factory.mktemp("dp")))


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
            "entries": [
                {**dict(ENTRY), "round": r, "noise_multiplier": 1.0, "sample_rate": 0.5, "steps": 4} for r in (1, 2)
            ],
        }
        mine = [line for line in lines if line["client"] == client]
        first, second = sorted(mine, key=lambda line: line["round"])
        assert first["dp_steps"] == 4.0
        assert second["dp_steps"] == 8.0
        assert first["dp_epsilon"] == pytest.approx(rdp_epsilon([(1.0, 0.5, 4)], 1e-5))
        assert second["dp_epsilon"] == pytest.approx(rdp_epsilon([(1.0, 0.5, 8)], 1e-5))
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
    assert card["epsilon"] == pytest.approx(rdp_epsilon([(1.0, 0.5, 8)], 1e-5))
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
    from federation.config import resolve_config
    from federation.derived import initial_state
    from federation.hospital.handler import Hospital, Site
    from federation.hospital.outbound import read_outbound
    from federation.hospital.policy import agreed_shared_keys
    from federation.strategies.context import recipe_from_config
    from federation.wire.codec import decode, encode
    from federation.wire.contract import Failure, Hello, HelloReply, TrainReply, TrainTask

    config = resolve_config(
        load_config(None, [*TINY_SETTINGS, *DP, "strategy.name=fedrep", "strategy.nhead=1"], data=slides_dataset)
    )
    recipe = recipe_from_config(config)
    assert recipe.private
    first = Accountant([entry(1, 1.0, 0.5, planned_dp_steps(recipe))])
    second = Accountant([entry(1, 1.0, 0.5, 2 * planned_dp_steps(recipe))])
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
    assert "the round asks for no DP-SGD, the run agreed DP-SGD" in refusal.reason
    reply = send(task(1, recipe))
    assert isinstance(reply, TrainReply)
    assert reply.metrics["dp_epsilon"] == pytest.approx(first.epsilon(1e-5))
    assert set(reply.metrics) == {"train_loss", "dp_epsilon", "dp_delta", "dp_steps"}
    ledger = json.loads((tmp_path / "state" / RUN / ACCOUNTANT_FILE).read_text())
    assert ledger["entries"] == [
        {**dict(ENTRY), "round": 1, "noise_multiplier": 1.0, "sample_rate": 0.5, "steps": planned_dp_steps(recipe)}
    ]
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
    # and the head of the outbound log before this reply's line (federation.hospital.outbound)
    scalars = {"num_examples", "metrics", "seconds", "evaluation", "outbound_head"}
    assert set(sent["scalars"]) == scalars  # type: ignore[arg-type]
    assert sent["scalars"]["evaluation"] is None  # type: ignore[index]  (no evaluation was asked for)
    assert set(sent["scalars"]["metrics"]) == {"train_loss", "dp_epsilon", "dp_delta", "dp_steps"}  # type: ignore[index]


@pytest.mark.slow
def test_a_dp_federation_gives_the_same_figures_in_every_engine(slides_dataset: Path, tmp_path: Path) -> None:
    """In-process and the loopback deployment (each hospital under a policy that requires DP, each message in a
    fresh process): identical per-round metrics, epsilons included, and each deployed hospital's ledger the
    in-process one. (flower-sim runs the same hospital code as the deployment; the engines test compares it with
    in-process without DP.)"""
    from federation.flower.demo import run_demo

    settings = [*TINY_SETTINGS, *DP, "strategy.name=fedrep", "client.head_epochs=1", "client.epochs=1"]
    local, demo = tmp_path / "local", tmp_path / "demo"
    policy = tmp_path / "policy.toml"
    policy.write_text("min_nhead = 1\nmax_epsilon = 1000.0\n", encoding="utf-8")
    train(load_config(None, settings, data=slides_dataset), local, progress=False)
    run_demo(
        load_config(None, [*settings, "run.engine=flower"], data=slides_dataset), demo, progress=False, policy=policy
    )
    figures = stable(local)
    assert stable(demo) == figures
    assert len(figures) == 6  # 2 rounds x 3 hospitals
    assert min(line["dp_epsilon"] for line in figures) > 0
    for client in (0, 1, 2):
        name = f"client_{client:02d}/{ACCOUNTANT_FILE}"
        assert (demo / "hospitals" / name).read_text() == (local / "hospitals" / name).read_text()


def test_a_reset_ledger_or_a_changed_resume_is_refused_and_the_budget_counts_on(
    slides_dataset: Path, tmp_path: Path
) -> None:
    """The attacks on the ledger (issue 34): removed, reset to -1000 steps, noise edited to 1e6 between rounds; each
    refused naming the ledger, the true epsilon kept; a resume Hello keeps the ledger's anchor and the first
    checkpoint, and one that changes the run's settings is refused."""
    from federation.config import resolve_config
    from federation.derived import initial_state
    from federation.hospital.handler import Hospital, Site
    from federation.hospital.policy import agreed_shared_keys
    from federation.wire.codec import decode, encode
    from federation.wire.contract import Failure, Hello, HelloReply, TrainReply, TrainTask

    settings = [*TINY_SETTINGS, *DP, "strategy.name=fedrep", "strategy.nhead=1"]
    config = resolve_config(load_config(None, settings, data=slides_dataset))
    recipe = recipe_from_config(config)
    steps = planned_dp_steps(recipe)
    hospital = Hospital(
        Site(slides_dataset, 0, tmp_path / "state", per_run=True, policy=HospitalPolicy(max_epsilon=50))
    )
    folder = tmp_path / "state" / RUN

    def send(message: object) -> object:
        return decode(hospital.answer(encode(message)))  # type: ignore[arg-type]

    assert isinstance(send(Hello(RUN, config_to_toml(config))), HelloReply)
    keys = agreed_shared_keys(config, create_model(config.model.name, 2, config.model.in_chans, norm="group"))
    initial, _ = initial_state(config)

    def task(server_round: int) -> TrainTask:
        shared = {k: initial[k].clone() for k in keys}
        return TrainTask(RUN, server_round, 7, keys, TrainInstruction(0, recipe, shared=shared))

    first = send(task(1))
    assert isinstance(first, TrainReply)
    one_round = rdp_epsilon([(1.0, 0.5, steps)], 1e-5)
    assert first.metrics["dp_epsilon"] == pytest.approx(one_round)
    ledger_path = folder / ACCOUNTANT_FILE
    honest = ledger_path.read_text()
    anchor = json.loads((folder / "hospital.json").read_text())["privacy_ledger"]
    assert (anchor["entries"], anchor["steps"]) == (1, steps)

    def tampered(data: dict | None) -> None:
        if data is None:
            ledger_path.unlink()
        else:
            ledger_path.write_text(json.dumps(data))
        hospital._loaded = None  # a new process, as a deployed SuperNode starts for each message
        refusal = send(task(2))
        assert isinstance(refusal, Failure), refusal
        assert str(ledger_path) in refusal.reason
        ledger_path.write_text(honest)

    reset = json.loads(honest)
    reset["entries"][0]["steps"] = -1000
    tampered(None)  # removed: before, round 2 reported epsilon from zero again
    tampered(reset)  # an impossible entry
    reset["entries"][0]["steps"] = steps
    reset["entries"][0]["noise_multiplier"] = 1e6
    tampered(reset)  # a believable edit: the anchor tells it
    tampered({"accountant": "opacus RDPAccountant", "entries": []})  # reset to empty
    second = send(task(2))
    assert isinstance(second, TrainReply)
    # the budget counts on from the true ledger: exactly two rounds of steps
    assert second.metrics["dp_epsilon"] == pytest.approx(rdp_epsilon([(1.0, 0.5, 2 * steps)], 1e-5))
    assert second.metrics["dp_epsilon"] > one_round
    record = json.loads((folder / "hospital.json").read_text())
    assert record["first_checkpoint"] == 1
    # a resume Hello keeps what tells a lost checkpoint from a missed round, and the ledger's anchor
    assert isinstance(send(Hello(RUN, config_to_toml(config), resume=True)), HelloReply)
    after = json.loads((folder / "hospital.json").read_text())
    assert after["first_checkpoint"] == 1
    assert after["privacy_ledger"] == record["privacy_ledger"]
    # one that changes what the run computes is refused, naming the settings; the run's length may change
    changed = resolve_config(load_config(None, [*settings, "strategy.nhead=3", "client.lr=0.05"], data=slides_dataset))
    refusal = send(Hello(RUN, config_to_toml(changed), resume=True))
    assert isinstance(refusal, Failure)
    assert (
        "a resume may not change the run's settings (strategy.nhead, client.lr, client.head_lr differ" in refusal.reason
    )
    longer = resolve_config(load_config(None, [*settings, "run.rounds=5"], data=slides_dataset))
    assert isinstance(send(Hello(RUN, config_to_toml(longer), resume=True)), HelloReply)
    # its checkpoints removed, the hospital names it instead of starting again from the initial model
    for path in (folder / "checkpoints").glob("*.safetensors"):
        path.unlink()
    hospital._loaded = None
    lost = send(task(3))
    assert isinstance(lost, Failure)
    assert "no checkpoint before round 3" in lost.reason
    assert "although it saved one for round 1" in lost.reason
    # and a resume Hello names it before any round (the server stops with that line: exit 2 in the CLI)
    again = send(Hello(RUN, config_to_toml(config), resume=True))
    assert isinstance(again, Failure)
    assert "has trained in run dp-run since round 1, but its checkpoints" in again.reason
