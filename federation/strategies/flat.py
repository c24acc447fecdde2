"""Flat views of model state: many clients' ``state_dict`` entries as one ``(m clients x d values)`` matrix.

The server maths (the shared primitives of `federation.strategies.aggregation`, FedAvg's weighted sum among them;
FedSAF's, paper 001, Eq. 3-8, 16-20, in `federation.strategies.amp` and `federation.strategies.fisher_weights`; the
seed methods' beside their strategies) works on stacked flat vectors, one row per client. This module makes and
unmakes them: ``FlatSpec`` names the entries a row holds (keys, shapes, dtypes), ``flatten`` stacks the entries of
several state dicts into a fresh float32 matrix, ``StackBuffer`` does the same into a matrix kept from one round to
the next, and ``unflatten`` turns one row back into a state dict (integer entries such as BatchNorm's
``num_batches_tracked`` rounded back; with ``copy=False``, views into the row).

Stacking copies every client's ~100-250 tensors in one call, on one intra-op thread (``_one_thread``: it changes
torch's global thread count for the copy and restores it after). That is state outside the values themselves,
which is why it lives here and not beside the pure functions of the maths.
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import math
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass

import torch


@contextlib.contextmanager
def _one_thread() -> Iterator[None]:
    """Run the enclosed torch operations on one intra-op thread, then restore the thread count.

    For stacking: it copies every client's ~100-250 tensors one by one, and above 32,768 values each copy opens its
    own parallel region. A copy is bound by memory bandwidth, so a second thread gains little, while each region
    costs a thread wake-up, and on cores shared with other work a wait for the other thread's time slice: measured
    on 2 shared cores, 1 thread stacked 20 MobileNetV3-Small replies in 13-17 ms, 2 threads in 70-680 ms.
    """
    threads = torch.get_num_threads()
    if threads == 1:
        yield
        return
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


# The dtypes that flatten concatenates as they are (FlatSpec.stackable).
_STACKED_AS_IS = frozenset({torch.float32, torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8, torch.bool})


@dataclass(frozen=True)
class FlatSpec:
    """How ``state_dict`` entries map to one flat vector: the keys in order, with their shapes and dtypes."""

    keys: tuple[str, ...]
    shapes: tuple[tuple[int, ...], ...]
    dtypes: tuple[torch.dtype, ...]

    @classmethod
    def of(cls, state: Mapping[str, torch.Tensor], keys: Sequence[str] | None = None) -> FlatSpec:
        """The spec of ``state`` restricted to ``keys`` (default: all of its keys, in order)."""
        chosen = list(state.keys()) if keys is None else list(keys)
        missing = [k for k in chosen if k not in state]
        if missing:
            raise KeyError(f"state_dict has no entries {missing[:5]}")
        return cls(
            keys=tuple(chosen),
            shapes=tuple(tuple(state[k].shape) for k in chosen),
            dtypes=tuple(state[k].dtype for k in chosen),
        )

    @functools.cached_property
    def numels(self) -> tuple[int, ...]:
        return tuple(math.prod(s) for s in self.shapes)

    @functools.cached_property
    def numel(self) -> int:
        """Total number of values, i.e. the ``state_dict`` numel of the entries this spec covers."""
        return sum(self.numels)

    @functools.cached_property
    def stackable(self) -> bool:
        """Whether the entries can be concatenated as they are: float32 values and integers (exact in float32 up
        to 2^24, e.g. BatchNorm's batch counters). Other floats are first rounded to float32 one by one."""
        return all(dtype in _STACKED_AS_IS for dtype in self.dtypes)

    @functools.cached_property
    def templates(self) -> tuple[torch.Tensor, ...]:
        """Storage-less tensors of the entries' shapes (what ``unflatten`` needs to cut a vector into views)."""
        return tuple(torch.empty(shape, device="meta") for shape in self.shapes)

    @functools.cached_property
    def dtype_groups(self) -> tuple[tuple[torch.dtype, tuple[str, ...], torch.Tensor, tuple[torch.Tensor, ...]], ...]:
        """Per dtype: its entries' keys, their positions in the flat vector and their templates."""
        starts = list(itertools.accumulate(self.numels, initial=0))[:-1]
        positions: dict[torch.dtype, list[tuple[str, int, int, torch.Tensor]]] = {}
        for key, dtype, start, numel, template in zip(
            self.keys, self.dtypes, starts, self.numels, self.templates, strict=True
        ):
            positions.setdefault(dtype, []).append((key, start, numel, template))
        return tuple(
            (
                dtype,
                tuple(key for key, _, _, _ in entries),
                torch.cat([torch.arange(start, start + numel) for _, start, numel, _ in entries]),
                tuple(template for _, _, _, template in entries),
            )
            for dtype, entries in positions.items()
        )


def _entries(states: Sequence[Mapping[str, torch.Tensor]], keys: Sequence[str]) -> list[torch.Tensor]:
    """The ``keys`` entries of every state dict, state after state; ``KeyError`` naming the first one's missing keys."""
    try:
        return [state[k] for state in states for k in keys]
    except KeyError:
        missing = next(gone for state in states if (gone := [k for k in keys if k not in state]))
        raise KeyError(f"state dict lacks shared entries {missing[:5]}") from None


def flatten(states: Sequence[Mapping[str, torch.Tensor]], spec: FlatSpec) -> torch.Tensor:
    """Stack the ``spec.keys`` entries of each state dict into one float32 ``(m, d)`` matrix, in key order.

    Every client's entries, client after client, are copied in one call (torch's bucket-flattening utility, the one
    its distributed data parallel uses): they form the row-major ``(m, d)`` matrix directly. One copy of the values,
    and no Python call per tensor, which for a few clients of ~100 tensors each would cost more than the copy.
    """
    if not states:
        raise ValueError("flatten needs at least one state dict")
    m = len(states)
    tensors = _entries(states, spec.keys)
    if not tensors:
        return torch.empty(m, 0, dtype=torch.float32)
    if not spec.stackable:
        tensors = [t.to(torch.float32) for t in tensors]
    with torch.no_grad(), _one_thread():
        # (of one tensor alone the utility returns a view, and the result must be a copy the caller owns)
        flat = tensors[0].reshape(-1).clone() if len(tensors) == 1 else torch._utils._flatten_dense_tensors(tensors)
    if flat.numel() != m * spec.numel:
        raise ValueError(f"{m} state dicts hold {flat.numel()} values for {spec.keys[:3]}..., not {m} x {spec.numel}")
    return flat.view(m, spec.numel).to(torch.float32)


class StackBuffer:
    """``flatten`` into a float32 matrix kept from one call to the next, for a server that stacks every round.

    The rows' views (one per entry, shaped like it) are made once, so each call is one copy of every client's
    entries in a single call (``torch._foreach_copy_``: no Python call per tensor, integers converted on the way;
    on one thread, see ``_one_thread``) into memory already mapped: a fresh ``(m, d)`` matrix of a few hundred MB
    costs as much in page faults as the copy itself. The matrix (``rows`` x ``spec.numel`` values) is allocated
    at the first call and kept. What ``stack`` returns is a view of its first ``m`` rows: the caller may
    overwrite it, and the next call does.
    """

    def __init__(self, spec: FlatSpec, rows: int) -> None:
        if rows < 1:
            raise ValueError(f"a stack buffer needs at least one row, got {rows}")
        self.spec = spec
        self.rows = rows
        self._matrix: torch.Tensor | None = None
        self._views: list[torch.Tensor] = []

    def stack(self, states: Sequence[Mapping[str, torch.Tensor]]) -> torch.Tensor:
        """``flatten(states, spec)``, written into the kept matrix: its first ``len(states)`` rows."""
        m = len(states)
        if not 1 <= m <= self.rows:
            raise ValueError(f"{m} state dicts for a stack buffer of {self.rows} rows")
        if self._matrix is None:
            self._matrix = torch.empty(self.rows, self.spec.numel, dtype=torch.float32)
            self._views = [
                view for row in self._matrix for view in torch._utils._unflatten_dense_tensors(row, self.spec.templates)
            ]
        sources = _entries(states, self.spec.keys)
        if sources:
            with torch.no_grad(), _one_thread():
                torch._foreach_copy_(self._views[: len(sources)], sources)
        return self._matrix[:m]


def unflatten(vector: torch.Tensor, spec: FlatSpec, *, copy: bool = True) -> dict[str, torch.Tensor]:
    """The inverse of ``flatten`` for one row: a state dict keyed by ``spec.keys`` with the original shapes/dtypes.

    Integer entries (e.g. BatchNorm's ``num_batches_tracked``) are rounded back to integers. With ``copy=False``
    the entries whose dtype is the vector's are views into ``vector`` (no copy; they share its memory), made in
    one call (the inverse of ``flatten``'s).
    """
    if vector.dim() != 1 or vector.numel() != spec.numel:
        raise ValueError(f"vector of shape {tuple(vector.shape)} does not match {spec.numel} values")
    if copy:
        out: dict[str, torch.Tensor] = {}
        chunks = torch.split(vector, list(spec.numels))
        for key, shape, dtype, chunk in zip(spec.keys, spec.shapes, spec.dtypes, chunks, strict=True):
            value = chunk.reshape(shape)
            out[key] = value.round().to(dtype) if not dtype.is_floating_point else value.to(dtype, copy=True)
        return out
    views = dict(zip(spec.keys, torch._utils._unflatten_dense_tensors(vector, spec.templates), strict=True))
    for dtype, keys, positions, templates in spec.dtype_groups:
        if dtype == vector.dtype:
            continue
        # The entries of another dtype (BatchNorm's integer batch counters) are converted together, in one call.
        values = vector[positions.to(vector.device)]
        values = (values if dtype.is_floating_point else values.round()).to(dtype)
        views.update(zip(keys, torch._utils._unflatten_dense_tensors(values, templates), strict=True))
    return views  # still in spec.keys order: update() keeps a key's place
