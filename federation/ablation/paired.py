"""Paired differences between the methods of an ablation grid over the seeds both finished.

Each method's paired difference to Separate and to FedAvg, with the same value of every other grid setting: the
differences ``d_s = figure(method, seed s) - figure(reference, seed s)`` and their mean with a 95% Student t interval
``mean ± t_{0.975, n-1} · sd / √n`` (``sd`` with ``ddof = 1``; `paired_interval`, `paired_rows`). `method_label` and
`method_variant` say what a cell's method is.

Beside each difference, the smallest one the comparison could detect: the minimum detectable difference (MDD) of a
two-sided paired t-test at alpha 0.05 with 80% power, ``MDD = (t_{0.975, n-1} + t_{0.80, n-1}) · sd / √n``
(`minimum_detectable_difference`). This is the usual approximation of standard power analysis (Cohen 1988,
*Statistical Power Analysis for the Behavioral Sciences*, 2nd ed., ch. 2; the paired test is the one-sample test of
the differences) with central t quantiles in place of the noncentral t, and it takes the observed ``sd`` as the true
seed-to-seed spread. It says how large a true difference must be for these seeds to find it, not what the observed
difference means: an interval that contains 0 with an MDD larger than the differences that matter says the grid
had too few seeds to tell, not that the methods are equal. With the noncentral t, a true difference of exactly the
MDD is found with probability 0.73 at n = 2, 0.77 at n = 3, 0.79 at n = 5 and 0.80 from n = 10 (scipy.stats.nct):
for few seeds the MDD is slightly optimistic.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from federation.ablation.grid import SHORT, Cell, Plan
from federation.config import RunConfig
from federation.methods import SPECS

# The methods every other method is compared with, when the grid has them (their specs' ``paired_reference``).
PAIRED_REFERENCES: tuple[str, ...] = tuple(spec.name for spec in SPECS if spec.paired_reference)
# Per-run figures whose paired differences are reported.
PAIRED_FIELDS: tuple[str, ...] = ("avg_test_acc", "avg_test_auc", "worst_test_acc", "worst_test_auc")
# t_{0.975, df} for df = 1..30 (Student's t, two-sided 95%), to six decimals; beyond 30, scipy's value when scipy is
# installed, else the normal 1.96 (at most 0.08 too narrow at df = 31, 3% of the half-width).
T_975: tuple[float, ...] = (
    12.706205, 4.302653, 3.182446, 2.776445, 2.570582, 2.446912, 2.364624, 2.306004, 2.262157, 2.228139,
    2.200985, 2.178813, 2.160369, 2.144787, 2.131450, 2.119905, 2.109816, 2.100922, 2.093024, 2.085963,
    2.079614, 2.073873, 2.068658, 2.063899, 2.059539, 2.055529, 2.051831, 2.048407, 2.045230, 2.042272,
)  # fmt: skip


# t_{0.80, df} for df = 1..30 (Student's t, the one-sided quantile of 80% power), to six decimals (scipy.stats.t.ppf);
# beyond 30, scipy's value when scipy is installed, else the normal 0.8416 (0.012 too small at df = 31, under 0.5%
# of the MDD's factor t_{0.975} + t_{0.80}).
T_80: tuple[float, ...] = (
    1.376382, 1.060660, 0.978472, 0.940965, 0.919544, 0.905703, 0.896030, 0.888890, 0.883404, 0.879058,
    0.875530, 0.872609, 0.870152, 0.868055, 0.866245, 0.864667, 0.863279, 0.862049, 0.860951, 0.859964,
    0.859074, 0.858266, 0.857530, 0.856855, 0.856236, 0.855665, 0.855137, 0.854647, 0.854192, 0.853767,
)  # fmt: skip


def _t_quantile(df: int, table: tuple[float, ...], level: float, normal: float) -> float:
    """Student's t quantile ``level`` from ``table`` (df 1..len), scipy beyond, else the normal quantile."""
    if df < 1:
        raise ValueError(f"degrees of freedom must be 1 or more (got {df})")
    if df <= len(table):
        return table[df - 1]
    try:
        from scipy.stats import t as student_t
    except ImportError:
        return normal
    return float(student_t.ppf(level, df))


def t_quantile_975(df: int) -> float:
    """The 0.975 quantile of Student's t with ``df`` degrees of freedom (``df >= 1``)."""
    return _t_quantile(df, T_975, 0.975, 1.96)


def t_quantile_80(df: int) -> float:
    """The 0.80 quantile of Student's t with ``df`` degrees of freedom (``df >= 1``): the power term of the MDD."""
    return _t_quantile(df, T_80, 0.80, 0.8416)


def minimum_detectable_difference(sd: float, n: int) -> float:
    """``(t_{0.975, n-1} + t_{0.80, n-1}) * sd / sqrt(n)``: the smallest true mean difference a two-sided paired
    t-test at alpha 0.05 finds with 80% power over ``n >= 2`` pairs whose differences have standard deviation ``sd``
    (the central-t approximation of the module docstring; Cohen 1988)."""
    if n < 2:
        raise ValueError(f"a detectable difference needs 2 or more pairs (got {n})")
    return (t_quantile_975(n - 1) + t_quantile_80(n - 1)) * sd / math.sqrt(n)


@dataclass(frozen=True)
class PairedStats:
    """Mean of paired differences, their sample std (``ddof = 1``), 95% interval and minimum detectable difference
    (``mdd``: alpha 0.05, 80% power); ``None`` where undefined (``mdd`` and the interval need ``n >= 2``)."""

    n: int
    mean: float | None
    sd: float | None
    low: float | None
    high: float | None
    mdd: float | None = None


def paired_interval(differences: Sequence[float]) -> PairedStats:
    """``mean ± t_{0.975, n-1} * sd / sqrt(n)`` of ``differences`` (``sd`` with ``ddof = 1``), and the minimum
    detectable difference ``(t_{0.975, n-1} + t_{0.80, n-1}) * sd / sqrt(n)``.

    ``n = 0``: everything ``None``; ``n = 1``: the mean only (no spread, no interval, no MDD).
    """
    n = len(differences)
    if n == 0:
        return PairedStats(0, None, None, None, None)
    mean = statistics.fmean(differences)
    if n == 1:
        return PairedStats(1, mean, None, None, None)
    sd = statistics.stdev(differences)
    half = t_quantile_975(n - 1) * sd / math.sqrt(n)
    return PairedStats(n, mean, sd, mean - half, mean + half, minimum_detectable_difference(sd, n))


def paired_text(stats: PairedStats) -> str | None:
    """``+0.100 [-0.050, +0.250] (MDD 0.184)`` (n = 3; three decimals; `` *`` after the interval when it excludes 0; the
    MDD when there is one), the mean alone when there is no interval (one seed), ``None`` when there is no
    difference at all."""
    if stats.mean is None:
        return None
    if stats.low is None or stats.high is None:
        return f"{stats.mean:+.3f}"
    mark = " *" if stats.low > 0 or stats.high < 0 else ""
    detectable = "" if stats.mdd is None else f" (MDD {stats.mdd:.3f})"
    return f"{stats.mean:+.3f} [{stats.low:+.3f}, {stats.high:+.3f}]{mark}{detectable}"


def paired_differences(method: Mapping[int, float | None], reference: Mapping[int, float | None]) -> list[float]:
    """``method[s] - reference[s]`` for each seed ``s`` (ascending) where both have a value."""
    return [
        float(value) - float(ref)
        for seed, value in sorted(method.items())
        if value is not None and (ref := reference.get(seed)) is not None
    ]


def method_label(config: RunConfig, variant: Sequence[tuple[str, Any]] = ()) -> str:
    """What a paired row compares: ``fedavg``, ``fedavg+fedlws`` for a wrapped strategy, and a variant's own
    settings after it, e.g. ``depthwise_fim (reverse=true)`` or ``precision_weighted (client.optimizer=adam,
    client.lr=0.001)`` (``method_variant``)."""
    label = "+".join([config.strategy.name, *config.strategy.wrap])
    if not variant:
        return label
    shown = [
        f"{k.removeprefix(config.strategy.name + '.')}={str(v).lower() if isinstance(v, bool) else v}"
        for k, v in variant
    ]
    return f"{label} ({', '.join(shown)})"


_METHOD_KEYS = ("strategy.name", "strategy.wrap")
# The optimiser a method's paper prescribes (e.g. Adam for precision-weighted FL, paper 004).
_OPTIMIZER_KEYS = frozenset({"client.optimizer", "client.lr", "client.momentum", "client.weight_decay"})


def method_variant(plan: Plan, cell: Cell, config: RunConfig) -> tuple[tuple[str, Any], ...]:
    """The grid settings that make ``cell`` a variant of its method rather than a setting every method shares.

    A setting of the method's own section (``depthwise_fim.reverse``, ``fedsaf.fim``, a wrapper's ``fedlws.beta``)
    always is; the optimiser settings (``client.optimizer``, ``client.lr``, ...) are when a block of a single
    strategy changes the optimiser (the method's prescribed recipe, e.g. Adam for ``precision_weighted``), and
    otherwise context like any other setting (a learning-rate sweep). Paired differences compare a variant with
    the references in the context of the remaining settings. ``config``: the cell's (``plan.cell_config``).
    """
    sections = {config.strategy.name, *config.strategy.wrap}
    grid = plan.blocks[cell.block].grid
    recipe = len(grid.get("strategy.name", [None])) == 1 and "client.optimizer" in grid
    return tuple(
        (k, v)
        for k, v in cell.params
        if k not in _METHOD_KEYS and (k.split(".")[0] in sections or (recipe and k in _OPTIMIZER_KEYS))
    )


def paired_rows(
    cells: Sequence[Cell],
    figures: Mapping[str, Mapping[str, Any]],
    methods: Mapping[str, str],
    fields: Sequence[str] = PAIRED_FIELDS,
    references: Sequence[str] = PAIRED_REFERENCES,
    variants: Mapping[str, Sequence[tuple[str, Any]]] | None = None,
) -> list[dict[str, Any]]:
    """Paired differences of each method to each reference method of the grid.

    ``methods`` maps a cell id to its method (``method_label``); ``figures`` holds the figures of finished cells.
    Cells are paired when every other grid setting (all but ``strategy.name`` / ``strategy.wrap`` and the cell's
    ``variants``, the settings its method label carries: ``method_variant``) is the same and the seed is the same;
    a seed finished on one side only is left out. One row per setting context, reference present in that context
    and method other than the reference, with ``n`` (seeds paired) and per field
    ``<field>_diff_mean`` / ``_diff_sd`` / ``_diff_low`` / ``_diff_high`` / ``_diff_mdd`` (minimum detectable
    difference) / ``_n`` (seeds where both have the field).
    """
    # context (the other settings) -> method -> seed -> figures; the first cell of a (context, method, seed) counts
    table: dict[tuple[tuple[str, Any], ...], dict[str, dict[int, Mapping[str, Any] | None]]] = {}
    for cell in cells:
        own = {k for k, _ in (variants or {}).get(cell.id, ())}
        context = tuple(
            (k, v) for k, v in sorted(cell.params, key=lambda kv: kv[0]) if k not in _METHOD_KEYS and k not in own
        )
        seeds = table.setdefault(context, {}).setdefault(methods[cell.id], {})
        if cell.seed not in seeds:
            seeds[cell.seed] = figures.get(cell.id)
    rows: list[dict[str, Any]] = []
    for context, by_method in table.items():
        for reference in references:
            if reference not in by_method:
                continue
            ref_runs = by_method[reference]
            for method, runs in by_method.items():
                if method == reference:
                    continue
                done = {s: f for s, f in runs.items() if f is not None}
                ref_done = {s: f for s, f in ref_runs.items() if f is not None}
                row: dict[str, Any] = {SHORT.get(k, k): v for k, v in context}
                row.update(method=method, reference=reference, n=len(done.keys() & ref_done.keys()))
                for name in fields:
                    diffs = paired_differences(
                        {s: f.get(name) for s, f in done.items()}, {s: f.get(name) for s, f in ref_done.items()}
                    )
                    stats = paired_interval(diffs)
                    row[f"{name}_diff_mean"], row[f"{name}_diff_sd"] = stats.mean, stats.sd
                    row[f"{name}_diff_low"], row[f"{name}_diff_high"] = stats.low, stats.high
                    row[f"{name}_diff_mdd"] = stats.mdd
                    row[f"{name}_n"] = stats.n
                rows.append(row)
    return rows
