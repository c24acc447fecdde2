"""A hospital: local training recipes and evaluation (FedSAF paper 001, Eq. 23-25; FedRep; FedProx).

``Client.train`` follows a ``federation.wire.contract.Recipe``:

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
* ``fisher_batch > 0``: after training, ``federation.hospital.fisher.fisher_trace`` over the shared parameters on a
  random mini-batch of un-augmented training tiles (Eq. 12-15) is reported as ``metrics["fisher_trace"]``.
* ``optimizer = "adam"`` with ``second_moments``: Adam's bias-corrected second moments
  ``v_hat = exp_avg_sq / (1 - beta2^step)`` of the shared parameters, averaged over the steps of the second half
  of the last local epoch, are reported with the weights (precision-weighted FL, paper 004, Sec. 4 and Eq. 6).

Every random choice of a round (shuffling, augmentation, dropout, the Fisher mini-batch) comes from one seed
that the engine derives from (run seed, round, client), so a resumed run repeats an uninterrupted one exactly.

On a GPU (`federation.hospital.gpu`, issue 32) the hospital's tiles are held on the device as ``uint8`` once, batches
are
augmented and normalised there (the same distributions as the CPU path's albumentations), the model runs in
channels-last memory, in bf16 autocast when ``precision = "bf16"``, with deterministic kernels unless asked not
to. On the CPU the path is the one above (albumentations per tile, fp32 unless ``precision = "bf16"``).
"""

from __future__ import annotations

import math
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass

import albumentations as A
import numpy as np
import torch
import torch.nn.functional as F
from sklearn.metrics import roc_auc_score
from torch import nn

from federation.errors import Diverged, FederationError
from federation.hospital import gpu
from federation.hospital.data import HospitalData, augment_batch, make_augmenter, to_tensor
from federation.wire.contract import Recipe, TensorDict, TrainInstruction, TrainReply
from models.preprocess import default_stats


@dataclass(frozen=True)
class EvalResult:
    """A client's model on its own test split: mean loss, accuracy, AUC (``None`` when undefined: a single-class
    split) and the softmax probabilities ``probs`` (N, K) in float64, one column per class."""

    loss: float
    acc: float
    auc: float | None
    probs: np.ndarray

    @property
    def prob_abnormal(self) -> np.ndarray:
        """``P(class 1)`` per tile: the binary task's probability of ``abnormal``."""
        if self.probs.shape[1] != 2:
            raise FederationError(f"prob_abnormal is defined for two classes, this model has {self.probs.shape[1]}")
        return self.probs[:, 1]


def proximal_term(params: Mapping[str, torch.Tensor], centre: Mapping[str, torch.Tensor], mu: float) -> torch.Tensor:
    """``mu / 2 * sum_k ||params[k] - centre[k]||^2`` with autograd through ``params`` (the centre is constant)."""
    total = torch.zeros((), device=next(iter(params.values())).device)
    for key, value in params.items():
        total = total + (value - centre[key].detach()).pow(2).sum()
    return 0.5 * mu * total


def auc_or_none(labels: np.ndarray, prob_abnormal: np.ndarray) -> float | None:
    """ROC AUC of ``prob_abnormal`` against ``labels``; ``None`` when the labels hold one class (AUC undefined)."""
    if np.unique(labels).size < 2:
        return None
    return float(roc_auc_score(labels, prob_abnormal))


def multiclass_auc(labels: np.ndarray, probs: np.ndarray) -> float | None:
    """Macro one-vs-rest ROC AUC of ``probs`` (N, K) against ``labels`` (class indices), over the classes present.

    For each class ``c`` that occurs in ``labels``: the AUC of ``probs[:, c]`` separating class ``c`` from every
    other tile; the mean of these, unweighted. When every class occurs this is scikit-learn's
    ``roc_auc_score(labels, probs, multi_class="ovr", average="macro")``; a class absent from ``labels`` (a
    hospital's test split without it) has no one-vs-rest AUC and is left out, where scikit-learn would stop.
    ``None`` when fewer than two classes occur or a probability is not finite (diverged weights).
    """
    y = np.asarray(labels, dtype=np.int64)
    p = np.asarray(probs, dtype=np.float64)
    present = np.unique(y)
    if present.size < 2 or not bool(np.isfinite(p).all()):
        return None
    return float(np.mean([roc_auc_score(y == c, p[:, c]) for c in present]))


def auc_of(labels: np.ndarray, probs: np.ndarray) -> float | None:
    """The evaluation's AUC from softmax ``probs`` (N, K): two classes, the AUC of class 1's probability (as
    ever); more, `multiclass_auc`. ``None`` when undefined (one class in ``labels``, non-finite probabilities)."""
    if not bool(np.isfinite(probs).all()):
        return None
    if probs.shape[1] == 2:
        return auc_or_none(labels, probs[:, 1])
    return multiclass_auc(labels, probs)


def _batches(order: torch.Tensor, batch_size: int) -> list[torch.Tensor]:
    chunks = list(torch.split(order, batch_size))
    # A last batch of one sample would make BatchNorm fail in train mode; fold it into the previous batch.
    if len(chunks) > 1 and chunks[-1].numel() == 1:
        chunks[-2] = torch.cat([chunks[-2], chunks[-1]])
        chunks.pop()
    return chunks


def _optimizer(trained: list[nn.Parameter], lr: float, recipe: Recipe) -> torch.optim.Optimizer:
    """The recipe's optimiser over ``trained``: Adam (``adam_*``) or SGD (``momentum``, ``weight_decay``), fresh each
    phase."""
    if recipe.optimizer == "adam":
        return torch.optim.Adam(trained, lr=lr, betas=(recipe.adam_beta1, recipe.adam_beta2), eps=recipe.adam_eps)
    return torch.optim.SGD(trained, lr=lr, momentum=recipe.momentum, weight_decay=recipe.weight_decay)


class Client:
    """One hospital: its tiles, its model (shared base + personal head) and its training recipes."""

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
        """``shared_keys``: the ``state_dict`` keys the client loads and uploads. ``head_keys``: the keys of the
        personal head (the last ``nhead`` units), which the head phase trains; the base phase trains every other
        parameter, shared or kept at the hospital. ``None``: the head is every parameter that is not shared (right
        only when no part of the base stays local). Head keys that are shared count as base. ``precision`` and
        ``deterministic``: ``run.precision`` and ``run.deterministic`` (`federation.hospital.gpu`)."""
        self.cid = data.hospital
        self.data = data
        self.device = torch.device(device)
        self.precision = precision
        self.deterministic = deterministic
        self.on_gpu = self.device.type == "cuda"
        gpu.check_precision(self.device, precision)
        if self.on_gpu:
            if deterministic:
                gpu.make_deterministic(model, self.device)
            model = model.to(memory_format=torch.channels_last)
        self.model = model.to(self.device)
        self._held: dict[str, torch.Tensor] = {}  # the tiles on the GPU (uint8), by split
        self._stats = default_stats(int(data.train_x.shape[3]))
        self._device_generator: torch.Generator | None = None
        self.batch_size = batch_size
        self.eval_batch_size = eval_batch_size
        self.augment = augment
        state_keys = set(self.model.state_dict().keys())
        unknown = [k for k in [*shared_keys, *(head_keys or ())] if k not in state_keys]
        if unknown:
            raise FederationError(f"hospital {self.cid}: shared or head keys {unknown[:3]} are not in the model")
        self.shared_keys = list(shared_keys)
        shared = set(self.shared_keys)
        self.params = dict(self.model.named_parameters())
        self.shared_params = [k for k in self.params if k in shared]
        head = set(self.params) - shared if head_keys is None else set(head_keys) - shared
        self.head_params = [k for k in self.params if k in head]
        # the base phase's parameters: the shared ones and the base's local ones (BatchNorm under bn = "local")
        self.base_params = [k for k in self.params if k not in head]

    # -- the shared part ---------------------------------------------------------------------------------------
    def load_shared(self, tensors: Mapping[str, torch.Tensor] | None) -> None:
        """Copy ``tensors`` (shared keys only) into the model; ``None`` keeps the client's own weights."""
        if tensors is None:
            return
        state = self.model.state_dict()
        foreign = [k for k in tensors if k not in self.shared_keys]
        if foreign:
            raise FederationError(f"hospital {self.cid} was sent non-shared tensors {foreign[:3]}")
        with torch.no_grad():
            for key, value in tensors.items():
                state[key].copy_(value)

    def shared_state(self) -> TensorDict:
        """Copies of the shared entries of the ``state_dict`` (what the client uploads), on the CPU."""
        state = self.model.state_dict()
        return {k: state[k].detach().to("cpu", copy=True) for k in self.shared_keys}

    def state(self) -> TensorDict:
        """Copies of the whole ``state_dict`` (for checkpoints), on the CPU."""
        return {k: v.detach().to("cpu", copy=True) for k, v in self.model.state_dict().items()}

    def load_state(self, state: Mapping[str, torch.Tensor]) -> None:
        """Restore a ``state`` written by ``Client.state``."""
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
                raise FederationError(f"hospital {self.cid}, round {server_round}: prox_mu > 0 needs a proximal centre")
            centre = {k: given[k].to(self.device) for k in self.shared_params}
        torch.manual_seed(seed)  # dropout draws from the global generator
        generator = torch.Generator().manual_seed(seed)
        augmenter = make_augmenter(seed) if self.augment and not self.on_gpu else None
        if self.on_gpu:  # the device path's augmentation draws from a generator on the device, seeded alike
            gpu.kernels(self.device, self.deterministic)
            self._device_generator = torch.Generator(device=self.device).manual_seed(seed)
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
            self._phase(
                self.head_params, recipe.head_epochs, head_lr, recipe, None, generator, augmenter, losses, server_round
            )
            base = self.base_params
        else:
            base = list(self.params)
        if recipe.epochs > 0 and base:
            self._phase(base, recipe.epochs, recipe.lr, recipe, centre, generator, augmenter, losses, server_round)
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
                    f"hospital {self.cid}: second moments need client.optimizer = adam and at least one base step"
                )
            moments = {k: (v / self._moment_steps).cpu() for k, v in self._moments.items()}
        return TrainReply(
            client=self.cid,
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
                f"hospital {self.cid}, round {server_round}: the training loss became {value}; "
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
        augmenter: A.Compose | None,
        losses: list[tuple[float, int]],
        server_round: int,
    ) -> None:
        if recipe.private:
            self._dp_phase(names, epochs, lr, recipe, centre, generator, augmenter, losses, server_round)
            return
        self._set_trainable(names)
        trained = [self.params[k] for k in names]
        optimizer = _optimizer(trained, lr, recipe)
        prox_params = {k: self.params[k] for k in self.shared_params if k in set(names)}
        use_prox = centre is not None and bool(prox_params)
        # paper 004: v_hat of the shared parameters, over the second half of the last epoch of the base phase
        watch = [k for k in self.shared_params if k in set(names)] if recipe.second_moments else []
        images, labels = self.data.train_x, torch.from_numpy(self.data.train_y)
        for epoch in range(epochs):
            order = torch.randperm(self.data.num_train, generator=generator)
            batches = _batches(order, self.batch_size)
            pending: list[tuple[torch.Tensor, int]] = []  # the GPU's losses, read once an epoch (no sync per step)
            ahead = self._device_epoch(order) if self.on_gpu else None
            start = 0
            for step, index in enumerate(batches):
                if ahead is not None:  # the epoch's tiles, augmented at once on the device: a slice per step
                    end = start + index.numel()
                    x, y = gpu.normalise(ahead[0][start:end], *self._stats), ahead[1][start:end]
                    start = end
                else:
                    batch = images[index.numpy()]
                    if augmenter is not None:
                        batch = augment_batch(augmenter, batch)
                    x = to_tensor(batch, self.device)
                    y = labels[index].to(self.device)
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

    def _split(self, split: str) -> tuple[np.ndarray, np.ndarray]:
        """The ``split``'s tiles (``uint8``) and labels: ``train``, ``val`` (`ValueError` without one) or ``test``."""
        if split == "train":
            return self.data.train_x, self.data.train_y
        if split == "val":
            if self.data.val_x is None or self.data.val_y is None:
                raise ValueError(f"hospital {self.data.hospital} has no validation split")
            return self.data.val_x, self.data.val_y
        return self.data.test_x, self.data.test_y

    def _held_split(self, split: str) -> tuple[torch.Tensor, torch.Tensor]:
        """The ``split``'s tiles (``uint8``) and labels on the GPU, uploaded once."""
        if split not in self._held:
            images, labels = self._split(split)
            self._held[split] = torch.from_numpy(np.ascontiguousarray(images)).to(self.device)
            self._held[f"{split}_y"] = torch.from_numpy(labels).to(self.device)
        return self._held[split], self._held[f"{split}_y"]

    def _device_epoch(self, order: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The training tiles in ``order`` on the GPU (``uint8``), augmented there when the hospital augments, and
        their labels: one epoch's augmentation done in chunks of `gpu.EPOCH_CHUNK` tiles rather than per step, so a
        small batch does not pay the augmentation's kernel launches every step. Each tile's draws follow the same
        distributions (`federation.hospital.gpu`); they come from the round's device generator in the epoch's order."""
        images, labels = self._held_split("train")
        order = order.to(self.device)
        tiles = images.index_select(0, order)
        if self.augment:
            assert self._device_generator is not None
            tiles = torch.cat([gpu.augment(c, self._device_generator) for c in tiles.split(gpu.EPOCH_CHUNK)])
        return tiles, labels.index_select(0, order)

    def _device_batch(
        self, split: str, index: torch.Tensor, augment: bool = False
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Tiles ``index`` of ``split`` from the GPU, augmented there when ``augment``, normalised in channels-last
        memory, with their labels."""
        images, labels = self._held_split(split)
        index = index.to(self.device)
        batch = images.index_select(0, index)
        if augment:
            assert self._device_generator is not None
            batch = gpu.augment(batch, self._device_generator)
        return gpu.normalise(batch, *self._stats), labels.index_select(0, index)

    def _units(self, recipe: Recipe) -> list[torch.Tensor]:
        """The training tiles of each privacy unit: one slide's tiles each (``dp_unit = "slide"``, from prepare's
        tile names), or one tile each."""
        if recipe.dp_unit == "tile":
            return [torch.tensor([i]) for i in range(self.data.num_train)]
        keys = self.data.train_units
        if keys is None:
            raise FederationError(
                f"hospital {self.cid}: differential privacy by slide needs to know each training tile's slide, and "
                "this dataset's tile names do not say (prepare writes them): prepare the slides with gastric-fl prepare"
            )
        groups: dict[str, list[int]] = {}
        for index, key in enumerate(keys):
            groups.setdefault(key, []).append(index)
        return [torch.tensor(groups[k]) for k in sorted(groups)]

    def _dp_phase(
        self,
        names: Sequence[str],
        epochs: int,
        lr: float,
        recipe: Recipe,
        centre: Mapping[str, torch.Tensor] | None,
        generator: torch.Generator,
        augmenter: A.Compose | None,
        losses: list[tuple[float, int]],
        server_round: int,
    ) -> None:
        """DP-SGD over ``names`` (`federation.hospital.privacy`, Abadi et al. 2016, Algorithm 1): ``epochs x
        round(1/q)``
        steps; each step Poisson-samples units, clips each sampled unit's gradient (mean loss over at most
        ``dp_tiles_per_unit`` of its tiles) to ``C``, sums, adds ``N(0, (sigma C)^2)`` and divides by ``q x units``.
        The proximal term's gradient depends on no tile, so it is added after the noise, at no privacy cost."""
        from federation.hospital.privacy import clip_factor, gradient_norm, noised_mean, poisson_sample, steps_per_epoch

        self._set_trainable(names)
        trained = [self.params[k] for k in names]
        optimizer = _optimizer(trained, lr, recipe)
        prox = [(self.params[k], centre[k]) for k in names if centre is not None and k in centre]
        units = self._units(recipe)
        expected = recipe.dp_sample_rate * len(units)
        images, labels = self.data.train_x, torch.from_numpy(self.data.train_y)
        for _ in range(epochs * steps_per_epoch(recipe.dp_sample_rate)):
            total = [torch.zeros_like(p) for p in trained]
            for u in poisson_sample(len(units), recipe.dp_sample_rate, generator).tolist():
                index = units[u]
                if index.numel() > recipe.dp_tiles_per_unit:
                    index = index[torch.randperm(index.numel(), generator=generator)[: recipe.dp_tiles_per_unit]]
                if self.on_gpu:  # augmented on the device like the plain path's tiles
                    x = self._device_batch("train", index, self.augment)[0]
                else:
                    batch = images[index.numpy()]
                    if augmenter is not None:
                        batch = augment_batch(augmenter, batch)
                    x = to_tensor(batch, self.device)
                loss = F.cross_entropy(self.model(x), labels[index].to(self.device))
                value = self._finite(loss, server_round, lr)
                grads = torch.autograd.grad(loss, trained, allow_unused=True)
                grads = tuple(torch.zeros_like(p) if g is None else g for g, p in zip(grads, trained, strict=True))
                factor = clip_factor(gradient_norm(grads), recipe.dp_max_grad_norm)
                for acc, g in zip(total, grads, strict=True):
                    acc.add_(g, alpha=factor)
                losses.append((value, int(index.numel())))
            noised = noised_mean(total, recipe.dp_noise_multiplier, recipe.dp_max_grad_norm, expected, generator)
            optimizer.zero_grad(set_to_none=True)
            for p, g in zip(trained, noised, strict=True):
                p.grad = g.to(p.dtype)
            for p, c in prox:
                p.grad = p.grad + recipe.prox_mu * (p.detach() - c)  # type: ignore[operator]
            optimizer.step()
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

    @torch.no_grad()
    def recompute_batchnorm(self, keep: Collection[str] = ()) -> None:
        """Precise BN: every BatchNorm's running statistics become the average of its batch statistics over
        one pass of the unaugmented training tiles (cumulative average, ``momentum=None``), for the current weights.

        A layer whose ``running_mean`` key is in ``keep`` (statistics that came with the shared weights) keeps its
        statistics and normalises with them during the pass (eval mode), as it will in evaluation.
        """
        named = [(n, m) for n, m in self.model.named_modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)]
        kept = [m for n, m in named if f"{n}.running_mean" in keep]
        norms = [m for n, m in named if f"{n}.running_mean" not in keep]
        if not norms or self.data.num_train == 0:
            return
        momenta = [m.momentum for m in norms]
        for module in norms:
            module.reset_running_stats()
            module.momentum = None
        self.model.train()
        for module in kept:
            module.eval()
        images = self.data.train_x
        for start in range(0, self.data.num_train, self.eval_batch_size):
            if self.on_gpu:
                index = torch.arange(start, min(start + self.eval_batch_size, self.data.num_train))
                with gpu.autocast(self.device, self.precision):
                    self.model(self._device_batch("train", index)[0])
            else:
                self.model(to_tensor(images[start : start + self.eval_batch_size], self.device))
        for module, momentum in zip(norms, momenta, strict=True):
            module.momentum = momentum

    def _fisher(self, batch: int, generator: torch.Generator, estimator: str = "per_sample") -> float:
        from federation.hospital.fisher import batch_gradient_trace, fisher_trace

        if not self.shared_params:
            raise FederationError(f"hospital {self.cid}: fisher_trace needs shared parameters (nhead leaves none)")
        if estimator == "full_pass":
            images, labels = self.data.train_x, self.data.train_y
            batches = (
                (
                    to_tensor(images[i : i + self.batch_size], self.device),
                    torch.from_numpy(labels[i : i + self.batch_size]).to(self.device),
                )
                for i in range(0, self.data.num_train, self.batch_size)
            )
            return batch_gradient_trace(self.model, self.shared_params, batches)
        pick = torch.randperm(self.data.num_train, generator=generator)[: min(batch, self.data.num_train)]
        x = to_tensor(self.data.train_x[pick.numpy()], self.device)
        y = torch.from_numpy(self.data.train_y[pick.numpy()]).to(self.device)
        return float(fisher_trace(self.model, self.shared_params, x, y))

    # -- evaluation --------------------------------------------------------------------------------------------
    @torch.no_grad()
    def evaluate(self, split: str = "test") -> EvalResult:
        """Base + own head on the client's own test split (or ``split="val"``, its validation split): mean
        cross-entropy, accuracy (argmax), AUC from the softmax (`auc_of`: class 1's probability for two classes,
        macro one-vs-rest for more)."""
        self.model.eval()
        total_loss, correct = 0.0, 0
        probs: list[np.ndarray] = []
        images, labels = self._split("val" if split == "val" else "test")
        n = int(labels.shape[0])
        for start in range(0, n, self.eval_batch_size):
            if self.on_gpu:
                x, y = self._device_batch(split, torch.arange(start, min(start + self.eval_batch_size, n)))
            else:
                x = to_tensor(images[start : start + self.eval_batch_size], self.device)
                y = torch.from_numpy(labels[start : start + self.eval_batch_size]).to(self.device)
            with gpu.autocast(self.device, self.precision):
                logits = self.model(x).float()
            total_loss += float(F.cross_entropy(logits, y, reduction="sum"))
            correct += int((logits.argmax(dim=1) == y).sum())
            probs.append(torch.softmax(logits.double(), dim=1).cpu().numpy())
        prob = np.concatenate(probs)
        # Diverged weights give NaN probabilities: their AUC is undefined, not a crash inside scikit-learn.
        return EvalResult(loss=total_loss / n, acc=correct / n, auc=auc_of(labels, prob), probs=prob)
