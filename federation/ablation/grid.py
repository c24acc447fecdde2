"""The ablation grid (FedSAF paper 001, Sec. 4.3-4.4): the settings varied, their cells and the plan that runs them.

A grid is one or more *blocks*; each block is a product of setting values (``nhead=0,3,6``, ``dm=...``,
``fim=on,off``, ``split=on,off``, ``strategy=fedavg,...``, or any ``section.key``). Every combination, run once per
seed, is a *cell* (`Cell`); a block also names the paper table its cells fill (`Block`). A `Plan` is what
``gastric-fl ablate`` runs: a base run preset, its ``--set`` overrides, the blocks and the seeds; `load_plan` reads
it from a run preset plus ``--grid`` options or from an ablation preset (a TOML with ``[ablation]``) and checks every
cell's configuration before anything runs.
"""

from __future__ import annotations

import itertools
import re
import tomllib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from federation.config import RunConfig, config_to_toml, load_config, read_toml
from federation.errors import FederationError
from infra.toml import toml_value

TABLE_KINDS: tuple[str, ...] = ("auto", "components", "distances", "nhead", "methods", "all")

# Short grid names -> configuration keys (any "section.key" is accepted as well).
ALIASES: dict[str, str] = {
    "strategy": "strategy.name",
    "nhead": "strategy.nhead",
    "dm": "amp.dm",
    "fim": "fedsaf.fim",
    "split": "fedsaf.split",
    "alpha_k": "amp.alpha_k",
    "sigma": "amp.sigma",
    "lam": "amp.lam",
    "scale": "amp.scale",
    "mu": "fedprox.mu",
    "model": "model.name",
    "rounds": "run.rounds",
}
SHORT: dict[str, str] = {v: k for k, v in ALIASES.items()}
_BOOL_WORDS = {"on": True, "off": False, "true": True, "false": False, "yes": True, "no": False}


def full_key(name: str) -> str:
    """``nhead`` -> ``strategy.nhead``; ``section.key`` unchanged; anything else is an error."""
    key = ALIASES.get(name, name)
    if "." not in key:
        raise FederationError(
            f"unknown grid setting {name!r}: use one of {', '.join(ALIASES)} or a section.key such as client.lr"
        )
    return key


def parse_value(text: str) -> Any:
    """A grid value: ``on``/``off`` -> bool, TOML numbers and booleans as such, anything else a string."""
    word = text.strip()
    if word.lower() in _BOOL_WORDS:
        return _BOOL_WORDS[word.lower()]
    try:
        return tomllib.loads(f"v = {word}")["v"]
    except tomllib.TOMLDecodeError:
        return word


def parse_grid(texts: Sequence[str]) -> dict[str, list[Any]]:
    """``["nhead=0,3,6", "fim=on,off"]`` -> ``{"strategy.nhead": [0, 3, 6], "fedsaf.fim": [True, False]}``."""
    grid: dict[str, list[Any]] = {}
    for text in texts:
        name, sep, values = text.partition("=")
        if not sep or not name.strip() or not values.strip():
            raise FederationError(f"--grid {text!r}: write it as name=value1,value2 (e.g. --grid nhead=0,3,6)")
        key = full_key(name.strip())
        if key in grid:
            raise FederationError(f"--grid {text!r}: {name.strip()} is given twice; list all its values once")
        parsed = [parse_value(v) for v in values.split(",") if v.strip()]
        if len(set(map(repr, parsed))) != len(parsed):
            raise FederationError(f"--grid {text!r} repeats a value")
        grid[key] = parsed
    return grid


def _slug(value: Any) -> str:
    text = ("on" if value else "off") if isinstance(value, bool) else str(value)
    return re.sub(r"[^A-Za-z0-9.]+", "", text) or "x"


@dataclass(frozen=True)
class Cell:
    """One run of the grid: its settings (full keys, in grid order) and seed."""

    params: tuple[tuple[str, Any], ...]
    seed: int
    block: int

    @property
    def id(self) -> str:
        parts = [f"{SHORT.get(k, k.replace('.', '-'))}-{_slug(v)}" for k, v in self.params]
        return "_".join([*parts, f"seed-{self.seed}"])

    @property
    def group(self) -> tuple[tuple[str, Any], ...]:
        """The settings without the seed: cells of one group are averaged over seeds."""
        return self.params

    def overrides(self) -> list[str]:
        """The cell's ``--set section.key=value`` options (``infra.toml.toml_value``: a plain word stays bare, any
        other string is quoted), then its seed."""
        return [f"{k}={toml_value(v, bare_words=True)}" for k, v in self.params] + [f"run.seed={self.seed}"]


@dataclass
class Block:
    """One product of settings, the paper table its cells fill and (optionally) its own number of seeds."""

    grid: dict[str, list[Any]]
    table: str = "auto"
    seeds: int | None = None

    def resolved_table(self) -> str:
        if self.table != "auto":
            return self.table
        keys = {SHORT.get(k, k) for k in self.grid if len(self.grid[k]) > 1} or {SHORT.get(k, k) for k in self.grid}
        if keys and keys <= {"fim", "split"}:
            return "components"
        if keys == {"dm"}:
            return "distances"
        if "nhead" in keys:
            return "nhead"
        if keys == {"strategy"}:
            return "methods"
        return "all"


@dataclass
class Plan:
    """What ``gastric-fl ablate`` runs: a base run preset, its overrides, the blocks and the seeds.

    ``first_seed`` is the base preset's ``run.seed``; a block runs ``block.seeds`` (else ``seeds``) seeds from it.
    """

    config_path: Path
    blocks: list[Block]
    seeds: int = 1
    overrides: list[str] = field(default_factory=list)
    data: Path | None = None
    first_seed: int = 0

    def base_config(self) -> RunConfig:
        return load_config(self.config_path, self.overrides, self.data)

    def block_seeds(self, block: Block) -> list[int]:
        count = block.seeds if block.seeds is not None else self.seeds
        return [self.first_seed + i for i in range(count)]

    def block_cells(self, index: int) -> list[Cell]:
        """Block ``index``'s product x its seeds."""
        block = self.blocks[index]
        keys = list(block.grid)
        return [
            Cell(tuple(zip(keys, values, strict=True)), seed, index)
            for values in itertools.product(*(block.grid[k] for k in keys))
            for seed in self.block_seeds(block)
        ]

    def cells(self) -> list[Cell]:
        """Every block's cells; a combination listed twice (in any block) is one cell (the first)."""
        seen: set[str] = set()
        out: list[Cell] = []
        for index in range(len(self.blocks)):
            for cell in self.block_cells(index):
                if cell.id not in seen:
                    seen.add(cell.id)
                    out.append(cell)
        return out

    def cell_config(self, cell: Cell) -> RunConfig:
        return load_config(self.config_path, [*self.overrides, *cell.overrides()], self.data)

    def owners(self, cells: Sequence[Cell]) -> dict[str, str]:
        """Cell id -> id of the cell whose run it uses: cells whose resolved configurations are identical (e.g.
        ``fim=on, split=on`` and ``strategy=fedsaf`` with the defaults) share one run instead of training twice."""
        from federation.engine import resolve_config

        first: dict[str, str] = {}
        owner: dict[str, str] = {}
        for cell in cells:
            text = config_to_toml(resolve_config(self.cell_config(cell)))
            owner[cell.id] = first.setdefault(text, cell.id)
        return owner


def load_plan(
    config: Path,
    grid: Sequence[str] = (),
    seeds: int | None = None,
    overrides: Sequence[str] = (),
    table: str = "auto",
    data: Path | None = None,
) -> Plan:
    """A plan from a run preset plus ``--grid`` options, or from an ablation preset (a TOML with ``[ablation]``).

    Ablation preset::

        [ablation]
        config = "benchmark.toml"   # run preset, relative to this file
        seeds = 3
        [[ablation.block]]
        table = "components"        # optional: auto | components | distances | nhead | methods | all
        seeds = 1                   # optional: this block's own number of seeds
        fim = ["on", "off"]
        split = ["on", "off"]
    """
    if table not in TABLE_KINDS:
        raise FederationError(f"--table {table!r}: use one of {', '.join(TABLE_KINDS)}")
    raw = read_toml(config, "pass a run or ablation preset from configs/")
    seed_count = seeds
    preset_seeds: int | None = None
    if "ablation" in raw:
        if grid:
            raise FederationError(
                f"{config} is an ablation preset with its own grid: drop --grid (or use a run preset)"
            )
        section = raw["ablation"]
        unknown = set(section) - {"config", "seeds", "block"}
        if unknown:
            raise FederationError(f"{config}: unknown [ablation] keys {sorted(unknown)}; use config, seeds, block")
        if "config" not in section:
            raise FederationError(f'{config}: [ablation] needs config = "<run preset>" (relative to this file)')
        base = (config.parent / str(section["config"])).resolve()
        blocks = [_block_from_toml(b, config) for b in section.get("block", [])]
        if not blocks:
            raise FederationError(f"{config}: add at least one [[ablation.block]] with the settings to vary")
        preset_seeds = int(section.get("seeds", 1))
        if seed_count is not None:  # --seeds overrides the preset and every block
            for block in blocks:
                block.seeds = None
    else:
        if not grid:
            raise FederationError(f"{config} is a run preset: give the grid with --grid name=v1,v2 (repeatable)")
        base = config
        blocks = [Block(parse_grid(grid), table)]
    if seed_count is None:
        seed_count = preset_seeds if preset_seeds is not None else 1
    if seed_count < 1 or any(b.seeds is not None and b.seeds < 1 for b in blocks):
        raise FederationError(f"seeds must be 1 or more (got {seed_count})")
    plan = Plan(base, blocks, seed_count, list(overrides), data)
    plan.first_seed = plan.base_config().run.seed
    for cell in plan.cells():  # every cell's configuration is checked before anything runs
        try:
            plan.cell_config(cell)
        except FederationError as exc:
            raise FederationError(f"grid cell {cell.id}: {exc}") from exc
    return plan


def _block_from_toml(raw: Mapping[str, Any], source: Path) -> Block:
    table = str(raw.get("table", "auto"))
    if table not in TABLE_KINDS:
        raise FederationError(f"{source}: block table = {table!r}; use one of {', '.join(TABLE_KINDS)}")
    seeds = raw.get("seeds")
    if seeds is not None and (not isinstance(seeds, int) or isinstance(seeds, bool)):
        raise FederationError(f"{source}: block seeds = {seeds!r}; use a whole number")
    grid: dict[str, list[Any]] = {}
    for name, values in raw.items():
        if name in ("table", "seeds"):
            continue
        items = values if isinstance(values, list) else [values]
        grid[full_key(name)] = [parse_value(v) if isinstance(v, str) else v for v in items]
    if not grid:
        raise FederationError(f"{source}: an [[ablation.block]] lists no settings")
    return Block(grid, table, seeds)
