"""The message contract between the server (a strategy) and a hospital (a client).

This mirrors Flower's Message API (``configure_train`` returns one message per destination node,
``aggregate_train`` receives the replies), so every engine (``federation.engine``: in-process, worker processes,
Flower) runs the same strategies unchanged. See docs/design.md, "Messages, strategies and engines".

Tensors travel as ``dict[str, torch.Tensor]`` keyed by ``state_dict`` names. Only *shared* keys ever appear
in a message: a client's personalised head (the last ``nhead`` layer units, FedSAF paper Eq. 1) never does.

What crosses the hospital boundary, in every engine, is one of the messages at the end of this module
(``Hello``/``HelloReply``, ``TrainTask``/``TrainReply``, ``EvaluateTask``/``EvaluateReply``, or a ``Failure``):
shared tensors, example counts and scalar metrics. ``federation.wire.codec`` turns each into a JSON header
plus named tensors, the one wire form every transport carries.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch

from infra.formats import BINARY_CLASSES

TensorDict = dict[str, torch.Tensor]
LABELS: tuple[str, ...] = BINARY_CLASSES  # the binary task: class index 0 and 1
# A class name is a plain label (prepare's class-folder rule): it is the one piece of text about its data that a
# hospital tells the server (``HelloReply.classes``), so it can hold nothing but a short name.
CLASS_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")


@dataclass(frozen=True)
class Recipe:
    """How a client trains this round (FedSAF paper Eq. 23-25; FedRep; FedProx).

    ``head_epochs == 0``: one phase over all trainable parameters for ``epochs`` epochs (Eq. 23).
    ``head_epochs > 0``: first ``head_epochs`` epochs on the local (head) keys with the shared part frozen
    (Eq. 24), then ``epochs`` epochs on the shared part with the head frozen (Eq. 25).
    ``prox_mu > 0``: add ``prox_mu / 2 * ||rho - centre||^2`` over the shared parameters to the loss while
    the shared part trains (FedProx's mu; FedAMP/FedSAF's ``lambda / alpha_K``), with a real gradient.
    ``fisher_batch > 0``: after training, report ``fisher_trace`` over the shared parameters (Eq. 12-15)
    computed on a mini-batch of that many training examples.
    ``precise_bn``: after training, recompute the BatchNorm running statistics as exact averages over the
    client's (unaugmented) training tiles, so that they describe the weights just trained (Wu & Johnson,
    "Rethinking 'Batch' in BatchNorm", 2021: "precise BN"). Without it, a few batches per round leave the
    running averages rounds behind the weights and evaluation collapses to one class while AUC is already high.
    ``optimizer``: ``sgd`` (``momentum``, ``weight_decay``) or ``adam`` (``adam_*``; a fresh optimiser each round).
    ``fisher_estimator``: ``per_sample`` (``fisher_batch`` random tiles) or ``full_pass`` (FedAS: every training
    batch's mean gradient, ``federation.hospital.fisher.batch_gradient_trace``).
    ``start_own``: the hospital keeps training its own shared part (the instruction carries only the proximal
    centre); otherwise it loads the instruction's ``shared`` tensors first.
    ``second_moments`` (with Adam): report the bias-corrected second moments ``v_hat`` of the shared parameters,
    averaged over the second half of the last local epoch (paper 004, Sec. 4), in ``TrainReply.second_moments``.
    ``dp_*``: differential privacy (`federation.hospital.privacy`): every training phase is DP-SGD over slides (or
    tiles).
    """

    @property
    def private(self) -> bool:
        """Whether the recipe trains with DP-SGD."""
        return self.dp_sample_rate > 0

    epochs: int = 1
    lr: float = 0.01
    head_epochs: int = 0
    head_lr: float | None = None
    prox_mu: float = 0.0
    fisher_batch: int = 0
    momentum: float = 0.0
    weight_decay: float = 0.0
    precise_bn: bool = False
    optimizer: str = "sgd"
    adam_beta1: float = 0.9
    adam_beta2: float = 0.999
    adam_eps: float = 1e-7
    second_moments: bool = False
    fisher_estimator: str = "per_sample"
    start_own: bool = False
    # DP-SGD in every phase when dp_sample_rate > 0 (federation.hospital.privacy; config [privacy]): noise multiplier
    # sigma,
    # clip norm C, Poisson rate q over the units (slides, or tiles), and at most dp_tiles_per_unit tiles per unit
    dp_noise_multiplier: float = 0.0
    dp_max_grad_norm: float = 0.0
    dp_sample_rate: float = 0.0
    dp_unit: str = "slide"
    dp_tiles_per_unit: int = 8
    dp_delta: float = 1e-5


@dataclass
class TrainInstruction:
    """Server -> one client. ``shared`` (if given) is loaded into the client's shared part before training.

    The proximal centre (``Recipe.prox_mu > 0``) is ``shared`` itself when ``centre_is_shared`` (FedProx's global
    weights, FedAMP/FedSAF's ``u_i`` / ``p_i`` that the client starts from and is pulled towards: sent and counted
    once), else ``prox_centre`` (a centre of its own, e.g. with ``client.start = "own"``). Said in a field, not by
    object identity, so that a strategy that copies its tensors still sends them once. (Evaluation alone is an
    ``EvaluateTask``.)
    """

    client: int
    recipe: Recipe
    shared: TensorDict | None = None
    prox_centre: TensorDict | None = None
    centre_is_shared: bool = False

    def __post_init__(self) -> None:
        if self.centre_is_shared and (self.shared is None or self.prox_centre is not None):
            raise ValueError("centre_is_shared needs the shared tensors and no prox_centre of its own")

    @property
    def centre(self) -> TensorDict | None:
        """The proximal centre, wherever it travels (``None``: none)."""
        return self.shared if self.centre_is_shared else self.prox_centre


@dataclass
class TrainReply:
    """One client -> server: its shared tensors after training, its example count and scalar metrics.

    ``metrics`` holds at least ``train_loss``; ``fisher_trace`` when the recipe asked for it.
    ``second_moments``: per shared *parameter*, Adam's bias-corrected ``v_hat`` when the recipe asked for it
    (paper 004); a per-tensor statistic a method needs by design, counted as traffic.
    ``evaluation``: the test metrics of the model as trained, when the task asked for them (``TrainTask.evaluate``).
    ``previous``: the test metrics of the previous round's model (its own model of that round with the shared part
    it was sent now), when the task asked for them (``TrainTask.evaluate_previous``).
    """

    client: int
    shared: TensorDict
    num_examples: int
    metrics: dict[str, float] = field(default_factory=dict)
    seconds: float = 0.0
    second_moments: TensorDict = field(default_factory=dict)
    evaluation: EvaluateReply | None = None
    previous: EvaluateReply | None = None


class Strategy(Protocol):
    """One federated algorithm: its cross-round state and what each client gets next.

    The engine calls, every round: ``configure_train`` -> clients train -> ``aggregate_train`` ->
    ``configure_evaluate`` -> each client loads what it is given (``None``: keeps its own) into its shared
    part and evaluates base + its own head on its own test split (what a hospital would deploy after the round).
    ``aggregate_train`` returns a JSON-serialisable record for ``aggregation.jsonl`` (e.g. the AMP matrix
    ``xi`` and Fisher weights ``gamma``); an empty dict when there is nothing to log.
    Two typed abilities, which every strategy states (``False`` where it has not got them): a strategy whose
    ``configure_evaluate`` always keeps each hospital's own model says so with ``evaluates_own = True``: the
    engine then asks for the evaluation with the training (one message per round instead of two) and calls
    ``configure_evaluate`` only for hospitals whose training failed. A strategy whose ``configure_evaluate(r)``
    gives each hospital exactly the shared part its next ``configure_train(r + 1)`` sends it (the averaging
    family: the global model, both times) says so with ``evaluates_next_start = True``: the engine then asks for
    round ``r``'s evaluation with round ``r + 1``'s training (``TrainTask.evaluate_previous``), so a round costs
    one message, and sends an ``EvaluateTask`` only after the last round and to a hospital whose combined message
    failed.
    ``state_tensors``/``load_state_tensors`` and ``state_json``/``load_state_json`` make the strategy's
    cross-round state checkpointable as safetensors + JSON (never pickle).
    """

    name: str
    evaluates_own: bool
    evaluates_next_start: bool

    def shared_keys(self, state_keys: Sequence[str], units: Sequence[Sequence[str]]) -> list[str]:
        """Which ``state_dict`` keys are shared, given all keys and the model's ordered layer units."""
        ...

    def configure_train(self, server_round: int, hospitals: Sequence[int]) -> dict[int, TrainInstruction]: ...

    def aggregate_train(self, server_round: int, replies: Mapping[int, TrainReply]) -> dict[str, Any]: ...

    def configure_evaluate(self, server_round: int, hospitals: Sequence[int]) -> dict[int, TensorDict | None]: ...

    def state_tensors(self) -> TensorDict: ...

    def load_state_tensors(self, tensors: Mapping[str, torch.Tensor]) -> None: ...

    def state_json(self) -> dict[str, Any]: ...

    def load_state_json(self, state: Mapping[str, Any]) -> None: ...


def count_values(instruction: TrainInstruction) -> int:
    """Number of scalar values the server sends in ``instruction`` (the proximal centre counted once)."""
    total = 0
    if instruction.shared is not None:
        total += sum(t.numel() for t in instruction.shared.values())
    if instruction.prox_centre is not None:  # a centre of its own (one that is ``shared`` travels once)
        total += sum(t.numel() for t in instruction.prox_centre.values())
    return total


def count_reply_values(reply: TrainReply) -> int:
    """Number of tensor values a client uploads: shared tensors and per-tensor statistics (scalars not counted)."""
    return sum(t.numel() for t in reply.shared.values()) + sum(t.numel() for t in reply.second_moments.values())


# -- the messages that cross the hospital boundary --------------------------------------------------------------
@dataclass(frozen=True)
class Hello:
    """Server -> every hospital, before round 1 (and again on resume): which run, with which settings.

    ``config_toml`` is the resolved run configuration (model, input size, seeds, training settings); it holds no
    data of any hospital. ``resume``: continue the hospital's own state of ``run_id`` instead of starting afresh.
    """

    run_id: str
    config_toml: str
    resume: bool = False


@dataclass(frozen=True)
class HelloReply:
    """A hospital -> server: who it is (its client index), how many tiles it trains and tests on, and the class
    names of its dataset in class-index order.

    ``classes`` is how the server learns the number of outputs the model needs without reading a manifest: it is
    dataset metadata (short plain names, as ``prepare`` requires of class folders; the audit's ``check_message``
    accepts nothing else in it), the same for every hospital of a federation, and says nothing about any tile
    (which classes a hospital's own tiles hold stays at the hospital). The server refuses hospitals that disagree.
    """

    client: int
    num_train: int
    num_test: int
    classes: tuple[str, ...] = ("normal", "abnormal")


@dataclass
class TrainTask:
    """Server -> one hospital: train round ``server_round`` as ``instruction`` says, drawing randomness from ``seed``.

    ``shared_keys``: the ``state_dict`` keys of the shared part, i.e. what the hospital loads and uploads.
    ``evaluate``: right after training, also evaluate the model as trained (what the strategy deploys when it
    keeps each hospital's own model, ``Strategy.evaluates_own``) and put the result in ``TrainReply.evaluation``;
    it saves a second message per round, which on a deployment costs as much as the training.
    ``evaluate_previous``: before training, evaluate round ``server_round - 1``'s model with the shared part sent
    (``instruction.shared``: for ``Strategy.evaluates_next_start`` it is what that round's ``EvaluateTask`` would
    carry) exactly as that ``EvaluateTask`` would, and put the result in ``TrainReply.previous``.
    """

    run_id: str
    server_round: int
    seed: int
    shared_keys: list[str]
    instruction: TrainInstruction
    evaluate: bool = False
    evaluate_previous: bool = False


@dataclass
class EvaluateTask:
    """Server -> one hospital: load ``shared`` (``None``: keep its own) and evaluate on its own test split."""

    run_id: str
    server_round: int
    client: int
    shared_keys: list[str]
    shared: TensorDict | None = None


@dataclass(frozen=True)
class EvaluateReply:
    """A hospital -> server: scalar test metrics (``loss``, ``acc``, ``auc``; ``None`` when undefined)."""

    client: int
    num_examples: int
    metrics: dict[str, float | None]
    seconds: float = 0.0


@dataclass(frozen=True)
class Failure:
    """A hospital could not do what it was asked (or did not answer): the reason, in one line, no data.

    ``silent``: no answer came at all (the transport timed out), so the hospital is probably down: the engine
    does not wait for it again in the same round. ``diverged``: its training or evaluation became non-finite
    (``federation.errors.Diverged``), not a refusal or a fault.
    """

    client: int
    reason: str
    silent: bool = False
    diverged: bool = False
