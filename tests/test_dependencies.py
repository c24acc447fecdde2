"""The dependency rules of docs/design.md ("Layout and layers"), checked on every import of every module: at module
level and inside functions (a deferred import is still a dependency).

- The top-level folders depend one way: ``app -> inference -> models, pipeline``, ``app -> federation -> models``,
  ``app -> pipeline``, and every folder may use the neutral ``infra`` package, which uses none of them; nothing
  imports ``app``; ``federation`` does not import ``pipeline``.
- No import cycle between modules.
- Within ``federation``, its folders and modules form no cycle either (``engine`` and ``flower`` do not import each
  other both ways); the strategy registry is a leaf that imports nothing of this project.
- ``pipeline``, ``infra`` and the torch-free readers never import torch.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from functools import cache
from pathlib import Path

import pytest
from support.graphs import cycles
from support.paths import REPO

PACKAGES = ("app", "pipeline", "federation", "models", "inference", "infra")
MAY_IMPORT = {
    "app": {"inference", "federation", "pipeline", "models", "infra"},
    "inference": {"models", "pipeline", "infra"},
    "federation": {"models", "infra"},
    "models": {"infra"},
    "pipeline": {"infra"},
    "infra": set(),
}
TORCH_FREE = (
    "pipeline",
    "infra",
    "federation.runfiles",
    "federation.run_reader",
    "federation.round_figures",
    "federation.progress",
    "federation.jsonl",
    "federation.methods",
    "federation.config",
)
LEAVES = ("federation.methods",)  # import nothing of this project


@cache
def modules() -> dict[str, Path]:
    """Every module of the project by dotted name (a package by its ``__init__``)."""
    found: dict[str, Path] = {}
    for package in PACKAGES:
        for path in (REPO / package).rglob("*.py"):
            parts = list(path.relative_to(REPO).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            found[".".join(parts)] = path
    return found


def _named(module: str, node: ast.Import | ast.ImportFrom) -> Iterator[str]:
    """The dotted names ``node`` imports, relative imports resolved."""
    if isinstance(node, ast.Import):
        yield from (alias.name for alias in node.names)
        return
    base = node.module or ""
    if node.level:
        parts = module.split(".")
        if modules()[module].name != "__init__.py":
            parts = parts[:-1]
        parts = parts[: len(parts) - (node.level - 1)]
        base = ".".join([*parts, base] if base else parts)
    for alias in node.names:
        yield f"{base}.{alias.name}"  # a submodule, or a name in ``base``: resolved by ``imports``


@cache
def imports(module: str) -> frozenset[str]:
    """What ``module`` imports anywhere in its file: the project's modules (the longest known prefix of each
    name) and ``torch`` for any torch or torchvision import."""
    known = modules()
    found: set[str] = set()
    for node in ast.walk(ast.parse(known[module].read_text(encoding="utf-8"))):
        if not isinstance(node, ast.Import | ast.ImportFrom):
            continue
        for name in _named(module, node):
            parts = name.split(".")
            if parts[0] in ("torch", "torchvision", "timm", "opacus"):
                found.add("torch")
                continue
            while parts and ".".join(parts) not in known:
                parts.pop()
            if parts:
                found.add(".".join(parts))
    return frozenset(found - {module})


def test_the_walk_sees_deferred_imports_and_every_folder() -> None:
    # the walk itself: it finds the modules of every folder, and an import inside a function
    assert {name.split(".")[0] for name in modules()} == set(PACKAGES)
    assert len(modules()) > 100
    deferred = "federation.hospital.handler"  # imports federation.hospital.export inside a method
    assert "federation.hospital.export" in imports(deferred)
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_the_top_level_folders_depend_one_way() -> None:
    wrong = [
        f"{module} imports {other}"
        for module in sorted(modules())
        for other in sorted(imports(module))
        if other != "torch"
        and other.split(".")[0] != module.split(".")[0]
        and other.split(".")[0] not in MAY_IMPORT[module.split(".")[0]]
    ]
    assert wrong == []


def test_the_dashboard_is_a_leaf_of_app() -> None:
    """The command line, the reports and the shared readers of ``app`` never import the dashboard's modules; the
    dashboard imports them (``app.evaluation.*``, ``app.run_records``, ``app.datasets``, ``app.errors``, ...)."""
    inside = [m for m in modules() if m.startswith("app.dashboard")]
    outside = [m for m in modules() if m.startswith("app.") and not m.startswith("app.dashboard")]
    assert len(inside) > 10
    assert len(outside) > 10
    wrong = [f"{m} imports {o}" for m in sorted(outside) for o in sorted(imports(m)) if o.startswith("app.dashboard")]
    assert wrong == []
    assert any(o.startswith("app.evaluation.") for m in inside for o in imports(m))


def test_no_module_imports_back_what_imports_it() -> None:
    edges = {m: {o for o in imports(m) if o != "torch"} for m in modules()}
    assert cycles(edges) == []


def _federation_unit(module: str) -> str:
    """A module's folder within ``federation`` (``federation.engine``), or the module itself at the top; the
    registry counts on its own (a leaf by design)."""
    if module in LEAVES:
        return module
    parts = module.split(".")
    return ".".join(parts[:2])


def test_federations_folders_form_no_cycle() -> None:
    edges: dict[str, set[str]] = {}
    for module in modules():
        if not module.startswith("federation."):
            continue
        unit = _federation_unit(module)
        edges.setdefault(unit, set()).update(
            _federation_unit(o) for o in imports(module) if o.startswith("federation.") and _federation_unit(o) != unit
        )
    assert "federation.engine" in edges
    assert "federation.flower" in edges
    assert cycles(edges) == []


@pytest.mark.parametrize("module", LEAVES)
def test_a_leaf_imports_nothing_of_the_project(module: str) -> None:
    assert imports(module) == frozenset()


def test_torch_free_modules_never_import_torch() -> None:
    chosen = [m for m in modules() if any(m == t or m.startswith(f"{t}.") for t in TORCH_FREE)]
    assert len(chosen) > 20
    assert [m for m in chosen if "torch" in imports(m)] == []


def _reached(start: str) -> set[str]:
    """Every project module importing ``start`` loads: its imports, deferred ones included, through each imported
    module, and each package whose ``__init__`` Python runs on the way (``a.b.c`` runs ``a`` and ``a.b``)."""
    known = modules()
    seen: set[str] = set()
    todo = [start]
    while todo:
        module = todo.pop()
        if module in seen or module not in known:
            continue
        seen.add(module)
        parts = module.split(".")
        todo.extend(".".join(parts[:k]) for k in range(1, len(parts)))
        todo.extend(o for o in imports(module) if o != "torch")
    return seen - {start}


SIDES = {"federation.hospital": "federation.server", "federation.server": "federation.hospital"}


@pytest.mark.parametrize("side", sorted(SIDES))
def test_the_hospital_and_the_server_import_nothing_of_each_other(side: str) -> None:
    """docs/design.md, "Trust model": what runs at a hospital (``federation/hospital/``) loads no module of the
    server (``federation/server/``), through any chain of imports, and the reverse; both share only the wire
    contract (``federation/wire/``) and neutral modules (configuration, errors, run files)."""
    other = SIDES[side]
    mine = [m for m in modules() if m == side or m.startswith(f"{side}.")]
    assert len(mine) >= 8
    wrong = {m: sorted(o for o in _reached(m) if o == other or o.startswith(f"{other}.")) for m in sorted(mine)}
    assert {m: o for m, o in wrong.items() if o} == {}


HOSPITAL_RUNTIME = ("federation.flower.executor", "federation.flower.hospital_app", "federation.flower.records")


@pytest.mark.parametrize("module", HOSPITAL_RUNTIME)
def test_what_a_deployed_hospital_runs_loads_no_server_code(module: str) -> None:
    """A deployed hospital's SuperNode runs its executor, which answers with the hospital's ``ClientApp``: none of
    it loads ``federation.server`` (the server's ``ServerApp`` is ``federation.flower.apps``)."""
    reached = _reached(module)
    assert "federation.hospital.handler" in reached or module == "federation.flower.records"
    assert sorted(o for o in reached if o.startswith("federation.server")) == []


def test_the_wire_contract_imports_neither_side() -> None:
    wire = [m for m in modules() if m.startswith("federation.wire")]
    assert len(wire) >= 3
    reached = {o for m in wire for o in _reached(m)}
    assert sorted(o for o in reached if o.startswith(("federation.hospital", "federation.server"))) == []


def test_the_boundary_walk_follows_chains_and_packages() -> None:
    # the walk itself: federation.server.loop reaches federation.wire.codec and the packages it sits in
    reached = _reached("federation.server.loop")
    assert {"federation", "federation.server", "federation.wire.codec"} <= reached
    assert "federation.strategies.aggregation" in _reached("federation.strategies.fedavg")
