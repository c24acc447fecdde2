"""A hospital's local training recipes (FedSAF paper 001, Eq. 23-25; FedRep; FedProx) and its evaluation.

``Trainer.train`` follows a ``federation.wire.contract.Recipe``:

* ``head_epochs == 0``: one phase over all parameters (Eq. 23, FedAvg/FedProx/FedAMP/Separate).
* ``head_epochs > 0``: the head (the last ``nhead`` units) trains with the shared base frozen (Eq. 24), then the
  base trains with the head frozen (Eq. 25), as in FedRep and FedSAF. A frozen part is frozen entirely: its
  BatchNorm layers run in eval mode, so their running statistics do not move either. The base is every unit
  before the head, including what of it stays at the hospital (BatchNorm under ``strategy.bn = "local"``): its
  BatchNorm layers train with it, in train mode, and stay frozen while the head trains.
* ``prox_mu > 0``: ``prox_mu / 2 * ||rho - centre||^2`` over the shared *parameters* is added to the loss while
  the shared part trains, so the optimiser sees its gradient ``prox_mu * (rho - centre)`` (FedProx's mu;
  FedAMP/FedSAF's ``lambda / alpha_K``). It is built from the live parameters, not from ``.data``: a known
  FedAMP implementation did the latter and silently trained like local-only.
* DP-SGD (``recipe.private``): a phase's optimiser is wrapped in `federation.hospital.dp_sgd.DPSGD`.
* ``fisher_batch > 0``: after training, ``federation.hospital.fisher.fisher_trace`` over the shared parameters on a
  random mini-batch of un-augmented training tiles (Eq. 12-15) is reported as ``metrics["fisher_trace"]``.
* ``optimizer = "adam"`` with ``second_moments``: Adam's bias-corrected second moments
  ``v_hat = exp_avg_sq / (1 - beta2^step)`` of the shared parameters, averaged over the steps of the second half
  of the last local epoch, are reported with the weights (precision-weighted FL, paper 004, Sec. 4 and Eq. 6).

Every random choice of a round (shuffling, augmentation, dropout, the Fisher mini-batch) comes from one seed
that the engine derives from (run seed, round, hospital), so a resumed run repeats an uninterrupted one exactly.

The batches come from `federation.hospital.batches.BatchSource`: on a GPU (`federation.hospital.gpu`, issue 32) the
hospital's tiles are held on the device as ``uint8`` once, batches are augmented and normalised there, the model
runs in channels-last memory, in bf16 autocast when ``precision = "bf16"``, with deterministic kernels unless asked
not to; on the CPU, albumentations per tile, fp32 unless ``precision = "bf16"``. Evaluation and precise BN:
`federation.hospital.evaluation`.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Iterable, Mapping, Sequence

import torch
import torch.nn.functional as F
from torch import nn

from federation.errors import Diverged, FederationError
from federation.hospital import evaluation, gpu
from federation.hospital.batches import BatchSource, fold_batches
from federation.hospital.data import HospitalData
from federation.hospital.evaluation import EvalResult
from federation.wire.contract import Recipe, TensorDict, TrainInstruction, TrainReply


def proximal_term(params: Mapping[str, torch.Tensor], centre: Mapping[str, torch.Tensor], mu: float) -> torch.Tensor:
    """``mu / 2 * sum_k ||params[k] - centre[k]||^2`` with autograd through ``params`` (the centre is constant)."""
    total = torch.zeros((), device=next(iter(params.values())).device)
    for key, value in params.items():
        total = total + (value - centre[key].detach()).pow(2).sum()
    return 0.5 * mu * total


def _optimizer(trained: list[nn.Parameter], lr: float, recipe: Recipe) -> torch.optim.Optimizer:
    """The recipe's optimiser over ``trained``: Adam (``adam_*``) or SGD (``momentum``, ``weight_decay``), fresh each
    phase."""
    if recipe.optimizer == "adam":
        return torch.optim.Adam(trained, lr=lr, betas=(recipe.adam_beta1, recipe.adam_beta2), eps=recipe.adam_eps)
    return torch.optim.SGD(trained, lr=lr, momentum=recipe.momentum, weight_decay=recipe.weight_decay)


class Trainer:
    """A hospital's model (shared base + personal head) trained on its own tiles by the server's recipes."""

    def __init__(
        self,
        data: HospitalData,
        model: nn.Module,
        shared_keys: Sequence[str],
        *,
        batch_size: int,
        eval_batch_size: int,
        augment: bool,
        device: torch.device | str = "cpu",
        head_keys: Sequence[str] | None = None,
        precision: str = "fp32",
        deterministic: bool = True,
    ) -> None:
        """``shared_keys``: the ``state_dict`` keys the hospital loads and uploads. ``head_keys``: the keys of the
        personal head (the last ``nhead`` units), which the head phase trains; the base phase trains every other
        parameter, shared or kept at the hospital. ``None``: the head is every parameter that is not shared (right
        only when no part of the base stays local). Head keys that are shared count as base. ``precision`` and
        ``deterministic``: ``run.precision`` and ``run.deterministic`` (`federation.hospital.gpu`)."""
        self.hospital = data.hospital
        self.data = data
        self.device = torch.device(device)
        self.precision = precision
        self.deterministic = deterministic
        gpu.check_precision(self.device, precision)
        if self.device.type == "cuda":
            if deterministic:
                gpu.make_deterministic(model, self.device)
            model = model.to(memory_format=torch.channels_last)
        self.model = model.to(self.device)
        self.batches = BatchSource(data, self.device, augment)
        self.batch_size = batch_size
        self.eval_batch_size = eval_batch_size
        state_keys = set(self.model.state_dict().keys())
        unknown = [k for k in [*shared_keys, *(head_keys or ())] if k not in state_keys]
        if unknown:
            raise FederationError(f"hospital {self.hospital}: shared or head keys {unknown[:3]} are not in the model")
        self.shared_keys = list(shared_keys)
        shared = set(self.shared_keys)
        self.params = dict(self.model.named_parameters())
        self.shared_params = [k for k in self.params if k in shared]
        head = set(self.params) - shared if head_keys is None else set(head_keys) - shared
        self.head_params = [k for k in self.params if k in head]
        # the base phase's parameters: the shared ones and the base's local ones (BatchNorm under bn = "local")
        self.base_params = [k for k in self.params if k not in head]

    @property
    def on_gpu(self) -> bool:
        """Whether the batches take the device path (`BatchSource.on_gpu`)."""
        return self.batches.on_gpu

    # -- the shared part ---------------------------------------------------------------------------------------
    def load_shared(self, tensors: Mapping[str, torch.Tensor] | None) -> None:
        """Copy ``tensors`` (shared keys only) into the model; ``None`` keeps the hospital's own weights."""
        if tensors is None:
            return
        state = self.model.state_dict()
        foreign = [k for k in tensors if k not in self.shared_keys]
        if foreign:
            raise FederationError(f"hospital {self.hospital} was sent non-shared tensors {foreign[:3]}")
        with torch.no_grad():
            for key, value in tensors.items():
                state[key].copy_(value)

    def shared_state(self) -> TensorDict:
        """Copies of the shared entries of the ``state_dict`` (what the hospital uploads), on the CPU."""
        state = self.model.state_dict()
        return {k: state[k].detach().to("cpu", copy=True) for k in self.shared_keys}

    def state(self) -> TensorDict:
        """Copies of the whole ``state_dict`` (for checkpoints), on the CPU."""
        return {k: v.detach().to("cpu", copy=True) for k, v in self.model.state_dict().items()}

    def load_state(self, state: Mapping[str, torch.Tensor]) -> None:
        """Restore a ``state`` written by ``Trainer.state``."""
        self.model.load_state_dict(dict(state), strict=True)

    # -- training ----------------------------------------------------------------------------------------------
    def train(self, instruction: TrainInstruction, server_round: int, seed: int) -> TrainReply:
        """Run ``instruction.recipe`` from the shared weights it carries; reply with the new shared weights."""
        recipe = instruction.recipe
        if not recipe.start_own:
            self.load_shared(instruction.shared)
        centre: dict[str, torch.Tensor] | None = None
        if recipe.prox_mu > 0:
            given = instruction.centre
            if given is None:
                raise FederationError(
                    f"hospital {self.hospital}, round {server_round}: prox_mu > 0 needs a proximal centre"
                )
            centre = {k: given[k].to(self.device) for k in self.shared_params}
        torch.manual_seed(seed)  # dropout draws from the global generator
        generator = torch.Generator().manual_seed(seed)
        self.batches.start_round(seed, self.deterministic)  # the augmentation's draws, seeded alike
        losses: list[tuple[float, int]] = []
        self.dp_steps = 0  # DP-SGD steps taken this round (federation.hospital.privacy), for the hospital's accountant
        self._moments: dict[str, torch.Tensor] = {}
        self._moment_steps = 0
        if recipe.head_epochs > 0 and self.head_params:
            if recipe.precise_bn:
                # The frozen base normalises the head's inputs with its running statistics; make them this
                # hospital's own (as evaluation will), not the ones that came with the received base.
                self.recompute_batchnorm()
            head_lr = recipe.head_lr if recipe.head_lr is not None else recipe.lr
            self._phase(self.head_params, recipe.head_epochs, head_lr, recipe, None, generator, losses, server_round)
            base = self.base_params
        else:
            base = list(self.params)
        if recipe.epochs > 0 and base:
            self._phase(base, recipe.epochs, recipe.lr, recipe, centre, generator, losses, server_round)
        if recipe.precise_bn:
            self.recompute_batchnorm()
        seen = sum(n for _, n in losses)
        metrics = {"train_loss": sum(loss * n for loss, n in losses) / seen if seen else float("nan")}
        if recipe.fisher_batch > 0:
            metrics["fisher_trace"] = self._fisher(recipe.fisher_batch, generator, recipe.fisher_estimator)
        moments: TensorDict = {}
        if recipe.second_moments:
            if recipe.optimizer != "adam" or not self._moment_steps:
                raise FederationError(
                    f"hospital {self.hospital}: second moments need client.optimizer = adam and at least one base step"
                )
            moments = {k: (v / self._moment_steps).cpu() for k, v in self._moments.items()}
        return TrainReply(
            client=self.hospital,
            shared=self.shared_state(),
            num_examples=self.data.num_train,
            metrics=metrics,
            second_moments=moments,
        )

    def _finite(self, loss: torch.Tensor, server_round: int, lr: float) -> float:
        """The loss's value; `Diverged` (one line, what to do) when it is not finite."""
        value = float(loss.detach())
        if not math.isfinite(value):
            raise Diverged(
                f"hospital {self.hospital}, round {server_round}: the training loss became {value}; "
                f"lower client.lr (now {lr}) and run again"
            )
        return value

    def _set_trainable(self, names: Iterable[str]) -> None:
        trainable = set(names)
        for key, param in self.params.items():
            param.requires_grad_(key in trainable)
        self.model.train()
        for name, module in self.model.named_modules():
            # BatchNorm of a frozen part keeps its running statistics: eval mode for it.
            if isinstance(module, nn.modules.batchnorm._BatchNorm) and f"{name}.weight" not in trainable:
                module.eval()

    def _phase(
        self,
        names: Sequence[str],
        epochs: int,
        lr: float,
        recipe: Recipe,
        centre: Mapping[str, torch.Tensor] | None,
        generator: torch.Generator,
        losses: list[tuple[float, int]],
        server_round: int,
    ) -> None:
        if recipe.private:
            self._dp_phase(names, epochs, lr, recipe, centre, generator, losses, server_round)
            return
        self._set_trainable(names)
        trained = [self.params[k] for k in names]
        optimizer = _optimizer(trained, lr, recipe)
        prox_params = {k: self.params[k] for k in self.shared_params if k in set(names)}
        use_prox = centre is not None and bool(prox_params)
        # paper 004: v_hat of the shared parameters, over the second half of the last epoch of the base phase
        watch = [k for k in self.shared_params if k in set(names)] if recipe.second_moments else []
        for epoch in range(epochs):
            order = torch.randperm(self.data.num_train, generator=generator)
            batches = fold_batches(order, self.batch_size)
            pending: list[tuple[torch.Tensor, int]] = []  # the GPU's losses, read once an epoch (no sync per step)
            for step, (x, y) in enumerate(self.batches.epoch(order, batches)):
                optimizer.zero_grad(set_to_none=True)
                with gpu.autocast(self.device, self.precision):
                    loss = F.cross_entropy(self.model(x), y)
                if self.on_gpu:
                    pending.append((loss.detach().float(), int(y.numel())))
                else:
                    losses.append((self._finite(loss, server_round, lr), int(y.numel())))
                total = loss + proximal_term(prox_params, centre, recipe.prox_mu) if use_prox else loss  # type: ignore[arg-type]
                total.backward()
                optimizer.step()
                if watch and epoch == epochs - 1 and step >= len(batches) // 2:
                    self._add_moments(optimizer, watch, recipe.adam_beta2)
            if pending:  # a non-finite loss on the GPU stops the round at the end of its epoch, in the same words
                values = torch.stack([v for v, _ in pending]).tolist()
                losses.extend(
                    (self._finite(torch.tensor(v), server_round, lr), n)
                    for v, (_, n) in zip(values, pending, strict=True)
                )
        for param in self.params.values():
            param.requires_grad_(True)

    def _dp_phase(
        self,
        names: Sequence[str],
        epochs: int,
        lr: float,
        recipe: Recipe,
        centre: Mapping[str, torch.Tensor] | None,
        generator: torch.Generator,
        losses: list[tuple[float, int]],
        server_round: int,
    ) -> None:
        """DP-SGD over ``names`` (`federation.hospital.dp_sgd`, Abadi et al. 2016, Algorithm 1): ``epochs x
        round(1/q)`` steps of the phase's optimiser wrapped in `DPSGD`, each over the units it samples (a unit's
        loss: the mean over its tiles, augmented like the plain path's)."""
        from federation.hospital.dp_sgd import DPSGD, privacy_units
        from federation.hospital.privacy import steps_per_epoch

        self._set_trainable(names)
        trained = [self.params[k] for k in names]
        optimizer = _optimizer(trained, lr, recipe)
        prox = [(self.params[k], centre[k]) for k in names if centre is not None and k in centre]
        dp = DPSGD(optimizer, trained, recipe, privacy_units(self.data, recipe), generator, prox)
        labels = torch.from_numpy(self.data.train_y)
        for _ in range(epochs * steps_per_epoch(recipe.dp_sample_rate)):
            for index in dp.sampled():
                loss = F.cross_entropy(self.model(self.batches.train_tiles(index)), labels[index].to(self.device))
                value = self._finite(loss, server_round, lr)
                dp.add(loss)
                losses.append((value, int(index.numel())))
            dp.step()
            self.dp_steps += 1
        for param in self.params.values():
            param.requires_grad_(True)

    @torch.no_grad()
    def _add_moments(self, optimizer: torch.optim.Optimizer, keys: Sequence[str], beta2: float) -> None:
        """Add this step's bias-corrected Adam second moments ``exp_avg_sq / (1 - beta2^step)`` (paper 004)."""
        for key in keys:
            state = optimizer.state[self.params[key]]
            v_hat = state["exp_avg_sq"] / (1.0 - beta2 ** float(state["step"]))
            self._moments[key] = self._moments[key] + v_hat if key in self._moments else v_hat.clone()
        self._moment_steps += 1

    def recompute_batchnorm(self, keep: Collection[str] = ()) -> None:
        """Precise BN over the hospital's un-augmented training tiles; a layer whose ``running_mean`` key is in
        ``keep`` keeps its statistics (`federation.hospital.evaluation.precise_batchnorm`)."""
        evaluation.precise_batchnorm(self.model, self.batches, self.eval_batch_size, self.precision, keep)

    def _fisher(self, batch: int, generator: torch.Generator, estimator: str = "per_sample") -> float:
        """The Fisher trace the hospital reports (`federation.hospital.fisher.reported_trace`, Eq. 12-15)."""
        from federation.hospital.fisher import reported_trace

        return reported_trace(
            self.model, self.shared_params, self.data, self.device, batch, self.batch_size, generator, estimator
        )

    # -- evaluation --------------------------------------------------------------------------------------------
    def evaluate(self, split: str = "test") -> EvalResult:
        """Base + own head on the hospital's own test split (or ``split="val"``, its validation split): mean
        cross-entropy, accuracy (argmax), AUC from the softmax (`federation.hospital.evaluation.evaluate`)."""
        return evaluation.evaluate(self.model, self.batches, split, self.eval_batch_size, self.precision)
