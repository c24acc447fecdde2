"""FedSAF (Miao et al., 2025; paper 001, Sec. 3 and Algorithm 1), and the attentive core FedAMP shares.

Server, each round ``k`` (Algorithm 1, lines 11-12), from the shared parts ``rho_j^{k-1}`` the clients returned:

1. AMP (Eq. 3-8, 16-18): ``xi = amp_coefficients(rho, dm, alpha_k, sigma)``, ``z_i = sum_j xi_ij rho_j``.
2. FIM (Eq. 14, 19-20), when ``fedsaf.fim`` is on: ``gamma_i = tFIM_i / sum_n tFIM_n`` from the Fisher traces the
   clients reported, and ``p_i = gamma_i z_i + sum_{j != i} gamma_j z_j``. As written, Eq. 20 gives every
   client the same ``p`` (the gamma-weighted mean of the ``z_j``); that is implemented as written.
   With FIM off, ``p_i = z_i``.

``server.max_weight`` (not in the paper; unset, nothing changes): gamma is capped at it
(`federation.strategies.aggregation.
cap_weights`: a hospital reporting a trace of 1e30 gets ``max_weight``, not 1.0) and so is every AMP weight
``xi_ij`` of another hospital (the excess stays with the hospital's own model, Eq. 16). Then no hospital weighs more
than ``max_weight`` in another's ``z_i`` nor in the common ``p`` (its weight there, ``sum_i gamma_i xi_ij``, is a
mean of the gammas: ``xi`` is symmetric; `federation.strategies.amp.amp_aggregate`). ``aggregation.jsonl``
records
``weight_cap`` and, with FIM, ``weights`` (each hospital's weight in ``p``).

Client (Eq. 23-25): it loads ``p_i`` into its shared part and is pulled towards it by
``lambda / (2 alpha_K) ||rho - p_i||^2`` (recipe ``prox_mu = lambda / alpha_K``, centre ``p_i``). With splitting on
(``fedsaf.split`` and ``nhead > 0``) the last ``nhead`` layer units are the personalised head that never leaves
the hospital; the head trains first with the base frozen (Eq. 24), then the base with the head frozen (Eq. 25).
With splitting off everything is shared and one phase trains all parameters (Eq. 23).

What forms ``rho``: the message carries the whole shared ``state_dict`` part (the units before the head),
trainable parameters *and* BatchNorm buffers, so the counts of values sent equal that part's ``state_dict``
numel. The distances ``d_ij`` are computed on the trainable parameters only (Eq. 3-8 compare model parameters;
running statistics have another scale and would dominate the L1/L2 sums), while the buffers are mixed with the
same ``xi`` and ``gamma`` as the parameters, so every shared BatchNorm layer stays consistent with its weights
(non-negative weights keep running variances positive; the integer batch counter is rounded back).

In round 1 every ``rho_j^0`` is the common initial model, so ``z_i = p_i =`` the initial weights whatever
``xi`` is: the server sends them as both the starting point and the proximal centre, and nothing is logged.
The model a hospital deploys after a round is its own trained one (base + head), so evaluation keeps it.

FedAMP (Huang et al., AAAI 2021) is the same server without splitting or FIM (``u_i = z_i``), see ``fedamp.py``.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from federation.bounds import max_weight_problem
from federation.config import RunConfig
from federation.errors import FederationError
from federation.runs import finite_or_none
from federation.strategies.amp import (
    AmpAggregate,
    amp_aggregate,
    attention_derivative,
    check_amp_settings,
    off_diagonal_mass,
)
from federation.strategies.context import (
    StrategyContext,
    cap_example_weights,
    fisher_traces,
    recipe_from_config,
    shared_nhead,
)
from federation.strategies.fisher_weights import fisher_weights
from federation.strategies.flat import FlatSpec, StackBuffer, unflatten
from federation.wire.contract import Recipe, TensorDict, TrainInstruction, TrainReply
from models import create_model

# Below this mean off-diagonal weight AMP has, in effect, turned into local training (issue 5, item 4).
COLLABORATION_WARNING_THRESHOLD = 1e-3


class CollaborationWarning(UserWarning):
    """AMP's off-diagonal weights have (almost) vanished: the clients no longer learn from each other."""


@dataclass(frozen=True)
class AmpSettings:
    """The ``[amp]`` hyper-parameters: alpha_k and sigma (Eq. 3-8), lambda (Eq. 23-25), the distance and its scale."""

    alpha_k: float
    sigma: float
    lam: float
    dm: str
    scale: str

    @classmethod
    def from_config(cls, config: RunConfig) -> AmpSettings:
        amp = config.amp
        return cls(alpha_k=amp.alpha_k, sigma=amp.sigma, lam=amp.lam, dm=amp.dm, scale=amp.scale)

    @property
    def prox_mu(self) -> float:
        """The client's proximal strength ``lambda / alpha_K`` (Eq. 23-25: ``lambda/(2 alpha_K) ||rho - p||^2``)."""
        return self.lam / self.alpha_k


def trainable_keys(config: RunConfig) -> set[str]:
    """Names of the model's trainable parameters (its ``state_dict`` minus buffers such as BatchNorm statistics)."""
    model = create_model(config.model.name, num_classes=2, in_chans=config.model.in_chans, norm=config.model.norm)
    return {name for name, _ in model.named_parameters()}


class AttentiveStrategy:
    """AMP aggregation with optional Fisher reweighting and model splitting: FedSAF, or FedAMP with both off.

    Cross-round state: each participating client's centre (``p_i`` or ``u_i``) for the next round.
    A hospital deploys its own trained model, so its evaluation comes with its training (``evaluates_own``).
    """

    evaluates_own = True
    evaluates_next_start = False

    def __init__(
        self,
        name: str,
        *,
        amp: AmpSettings,
        nhead: int,
        fim: bool,
        recipe: Recipe,
        ctx: StrategyContext,
        param_keys: set[str],
        max_weight: float | None = None,
    ) -> None:
        self.name = name
        self.amp = amp
        self.nhead = nhead
        self.fim = fim
        self.recipe = recipe
        self.hospitals = tuple(ctx.hospitals)
        check_amp_settings(len(self.hospitals), amp.dm, amp.alpha_k, amp.sigma)
        if max_weight is not None:
            problem = max_weight_problem(len(self.hospitals), max_weight)
            if problem is not None:
                raise FederationError(problem)
        self.max_weight = max_weight
        self.keys = ctx.shared_keys(nhead)
        if not self.keys:
            raise FederationError(f"{name} with nhead={nhead} shares no layer: use a smaller strategy.nhead")
        initial = ctx.initial(self.keys)
        # Parameters (which the distances compare) and buffers (mixed only) are stacked into one matrix each, kept
        # from round to round (one row per client).
        self.param_spec = FlatSpec.of(initial, [k for k in self.keys if k in param_keys])
        self.buffer_spec = FlatSpec.of(initial, [k for k in self.keys if k not in param_keys])
        if self.param_spec.numel == 0:
            raise FederationError(f"{name} with nhead={nhead} shares no trainable parameter: use a smaller nhead")
        self._param_stack = StackBuffer(self.param_spec, len(self.hospitals))
        self._buffer_stack = StackBuffer(self.buffer_spec, len(self.hospitals)) if self.buffer_spec.keys else None
        # One dict for all clients in round 1 (the common initial model, z_i = p_i = rho^0).
        self.centres: dict[int, TensorDict] = dict.fromkeys(self.hospitals, initial)
        # Clients whose centres are rows of the last round's mixed matrix (views, not copies: see _centre).
        self._rows_of_block: frozenset[int] = frozenset()

    def shared_keys(self, state_keys: Sequence[str], units: Sequence[Sequence[str]]) -> list[str]:
        return list(self.keys)  # the base units less what strategy.bn keeps local (StrategyContext.shared_keys)

    def configure_train(self, server_round: int, hospitals: Sequence[int]) -> dict[int, TrainInstruction]:
        out: dict[int, TrainInstruction] = {}
        for c in hospitals:
            if c not in self.centres:
                raise FederationError(
                    f"{self.name}: hospital {c} is not one of this run's hospitals {list(self.hospitals)}"
                )
            centre = self.centres[c]
            if self.recipe.start_own:
                # client.start = own: the hospital keeps its own model; only the centre it is pulled to travels.
                out[c] = TrainInstruction(client=c, recipe=self.recipe, shared=None, prox_centre=centre)
            else:
                # The client starts from p_i and is pulled towards it: sent and counted once.
                out[c] = TrainInstruction(client=c, recipe=self.recipe, shared=centre, centre_is_shared=True)
        return out

    def aggregate_train(self, server_round: int, replies: Mapping[int, TrainReply]) -> dict[str, Any]:
        hospitals = sorted(replies)
        if not hospitals:
            raise FederationError(f"round {server_round}: no hospital replied")
        traces: list[float] | None = None
        gamma: torch.Tensor | None = None
        capping: dict[str, Any] | None = None
        if self.fim:
            traces = fisher_traces(
                server_round,
                replies,
                hospitals,
                " although fedsaf.fim is on (the client recipe must have fisher_batch > 0)",
            )
            gamma = fisher_weights(traces)  # Eq. 14
            if self.max_weight is not None:  # server.max_weight: no hospital's gamma above it (not in the paper)
                capped, capping = cap_example_weights(gamma.tolist(), hospitals, self.max_weight)
                gamma = torch.tensor(capped, dtype=torch.float64)
        unknown = [c for c in hospitals if c not in self.centres]
        if unknown:
            raise FederationError(
                f"{self.name}: client(s) {unknown} are not among this run's clients {list(self.hospitals)}"
            )
        states = [replies[c].shared for c in hospitals]
        # Each reply is copied once, into these matrices (kept from round to round); amp_aggregate centres them.
        params = self._param_stack.stack(states)
        buffers = None if self._buffer_stack is None else self._buffer_stack.stack(states)
        step = amp_aggregate(
            params,
            self.amp.dm,
            self.amp.alpha_k,
            self.amp.sigma,
            scale=self.amp.scale,
            extra=buffers,
            gamma=gamma,
            overwrite=True,
            max_weight=self.max_weight,
        )
        record: dict[str, Any] = {
            "clients": hospitals,
            "dm": self.amp.dm,
            "scale": self.amp.scale,
            "distances": _matrix(step.distances),
            "xi": _matrix(step.xi),
            "off_diagonal_mass": off_diagonal_mass(step.xi),
        }
        if self.max_weight is not None:
            # the cap as applied (gamma's with FIM, AMP's weights of other hospitals) and each one's weight in p
            capping = capping or {"max_weight": self.max_weight, "capped": [], "uniform": False}
            raw = self.amp.alpha_k * attention_derivative(step.distances, self.amp.sigma)
            raw.fill_diagonal_(0.0)
            lowered = (raw > self.max_weight).any(dim=0).tolist()  # hospital j weighed more than the cap in a z_i
            amp_capped = {str(c) for c, low in zip(hospitals, lowered, strict=True) if low}
            capping["capped"] = sorted(set(capping["capped"]) | amp_capped, key=int)
            record["weight_cap"] = capping
            if gamma is not None:
                record["weights"] = {str(c): w for c, w in zip(hospitals, step.coefficients[0].tolist(), strict=True)}
        if gamma is not None:
            record["fisher_traces"] = traces
            record["gamma"] = gamma.tolist()
            # Eq. 20 gives every client the same p: one row was mixed, and every client holds the same dict.
            shared_p = self._centre(step, 0)
            for c in hospitals:
                self.centres[c] = shared_p
            self._rows_of_block = frozenset()
        else:
            # A client left out of this round keeps last round's centre; as a view it would keep that round's
            # whole (m, d) matrix alive, so it gets its own copy.
            for c in self._rows_of_block.difference(hospitals):
                self.centres[c] = {k: v.clone() for k, v in self.centres[c].items()}
            for row, c in enumerate(hospitals):
                self.centres[c] = self._centre(step, row)  # z_i, Eq. 18
            self._rows_of_block = frozenset(hospitals)
        mass = record["off_diagonal_mass"]
        if len(hospitals) > 1 and mass < COLLABORATION_WARNING_THRESHOLD:
            warnings.warn(
                f"{self.name} round {server_round}: AMP gives other clients a mean weight of {mass:.2e} "
                f"(< {COLLABORATION_WARNING_THRESHOLD:g}), so the clients barely collaborate; the distances "
                f"d_ij ({self.amp.dm}, scale={self.amp.scale}) are large against amp.sigma={self.amp.sigma}: "
                'raise amp.sigma (with amp.alpha_k <= sigma/(m-1)) or use amp.scale = "relative"',
                CollaborationWarning,
                stacklevel=2,
            )
        return record

    def _centre(self, step: AmpAggregate, row: int) -> TensorDict:
        """Row ``row`` of the mixed matrices as a state dict in ``self.keys`` order, its tensors views of the row.

        Views, not copies: whoever uses a centre copies it anyway (the hospital's ``load_state_dict``, the message
        codec, a checkpoint), and copying here would cost as much as the mix itself when the clients are few.
        """
        parts = unflatten(step.mixed[row], self.param_spec, copy=False)
        if step.mixed_extra is not None:
            parts.update(unflatten(step.mixed_extra[row], self.buffer_spec, copy=False))
        return {k: parts[k] for k in self.keys}

    def configure_evaluate(self, server_round: int, hospitals: Sequence[int]) -> dict[int, TensorDict | None]:
        # A hospital deploys its own trained model (base + head): nothing to load.
        return dict.fromkeys(hospitals)

    def state_tensors(self) -> TensorDict:
        # safetensors refuses tensors that share memory: a centre every client shares (round 1's initial model,
        # Eq. 20's common p) is stored once as "shared.<key>", otherwise one copy per client.
        first = self.centres[self.hospitals[0]]
        if all(self.centres[c] is first for c in self.hospitals):
            return {f"shared.{k}": v for k, v in first.items()}
        return {f"centre.{c}.{k}": v.clone() for c, centre in self.centres.items() for k, v in centre.items()}

    def load_state_tensors(self, tensors: Mapping[str, torch.Tensor]) -> None:
        if all(f"shared.{k}" in tensors for k in self.keys):
            common = {k: tensors[f"shared.{k}"].detach().clone() for k in self.keys}
            self.centres = dict.fromkeys(self.hospitals, common)
            return
        centres: dict[int, TensorDict] = {}
        for c in self.hospitals:
            missing = [k for k in self.keys if f"centre.{c}.{k}" not in tensors]
            if missing:
                raise FederationError(
                    f"{self.name} checkpoint lacks client {c}'s centre {missing[:3]}: it is from another run"
                )
            centres[c] = {k: tensors[f"centre.{c}.{k}"].detach().clone() for k in self.keys}
        self.centres = centres

    def state_json(self) -> dict[str, Any]:
        return {"nhead": self.nhead, "fim": self.fim, "clients": list(self.hospitals)}

    def load_state_json(self, state: Mapping[str, Any]) -> None:
        for key, mine in (("nhead", self.nhead), ("fim", self.fim), ("clients", list(self.hospitals))):
            if key in state and state[key] != mine:
                raise FederationError(f"{self.name} checkpoint was made with {key}={state[key]}, not {mine}")


def _matrix(t: torch.Tensor) -> list[list[float | None]]:
    """A float matrix as nested lists for ``aggregation.jsonl`` (JSON has no inf/nan: those become null)."""
    rows: list[list[float | None]] = t.tolist()
    if bool(torch.isfinite(t).all()):
        return rows
    return [[finite_or_none(v) for v in row] for row in rows]


def build(config: RunConfig, ctx: StrategyContext) -> AttentiveStrategy:
    """FedSAF with the ``[amp]`` and ``[fedsaf]`` settings; ``fedsaf.split = false`` shares everything (nhead 0)."""
    amp = AmpSettings.from_config(config)
    nhead = shared_nhead(config)
    split = nhead > 0
    if split and config.client.head_epochs < 1:
        raise FederationError(
            "fedsaf with model splitting trains the head first (Eq. 24): set client.head_epochs >= 1, "
            "or fedsaf.split = false"
        )
    recipe = recipe_from_config(
        config,
        head_epochs=config.client.head_epochs if split else 0,
        prox_mu=amp.prox_mu,
        fisher_batch=config.fedsaf.fisher_batch if config.fedsaf.fim else 0,
    )
    return AttentiveStrategy(
        "fedsaf",
        amp=amp,
        nhead=nhead,
        fim=config.fedsaf.fim,
        recipe=recipe,
        ctx=ctx,
        param_keys=trainable_keys(config),
        max_weight=config.server.max_weight,
    )
