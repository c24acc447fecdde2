"""The code's structure of one checkout, measured with Python's ``ast`` and ``tokenize`` (nothing is imported or run).

Over the .py files of the packages ``app``, ``federation``, ``inference``, ``models``, ``pipeline`` and ``infra``:

- modules and lines per package, and the ten largest modules;
- import edges between modules (module-level and deferred imports alike, resolved as tests/test_dependencies.py
  does: the longest known module prefix of each imported name), folder-to-folder edge counts for the packages and
  for federation's folders (engine, flower, strategies, config, ablation, its other modules);
- import cycles: strongly connected components of more than one module, and of federation's folders (each folder
  one unit, each module at federation's top one unit, the strategy registry one unit, as the dependency test does);
- the modules outside app/dashboard that import the dashboard's code;
- "one word per thing": the words client, hospital and site (and their plurals) in identifiers (split at ``_`` and
  camelCase) and in strings; the functions named hospital_folder(s)/hospital_dir, the module constants named
  ``*CARD_FILE``, the modules that spell the literal "manifest.csv";
- the modules that read a run's metrics.jsonl (a call of a reader on a path built from ``METRICS_FILE`` or
  "metrics.jsonl"), and the readers they call;
- method names special-cased outside federation/strategies (string literals equal to a strategy's name);
- the walk of the run configuration from the ``train`` command to the function that runs a round (static and
  approximate: see `config_walk`).

Commands:

    .venv/bin/python scripts/house_measure.py --repo PATH
    .venv/bin/python scripts/house_measure.py --compare BEFORE_PATH AFTER_PATH
"""

from __future__ import annotations

import argparse
import ast
import io
import re
import subprocess
import sys
import tokenize
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from support.graphs import cycles

PACKAGES = ("app", "federation", "inference", "models", "pipeline", "infra")
FEDERATION_FOLDERS = ("engine", "flower", "strategies", "config", "ablation", "hospital", "server", "wire")
REGISTRY = ("federation.strategies.registry", "federation.methods")  # the registry before and after its move
STRATEGY_NAMES = (
    "fedsaf",
    "fedamp",
    "fedavg",
    "separate",
    "fedrep",
    "fedprox",
    "fedbn",
    "fedas",
    "depthwise_fim",
    "precision_weighted",
)
WORDS = {"client": "client", "clients": "client", "hospital": "hospital", "hospitals": "hospital"}
WORDS |= {"site": "site", "sites": "site"}
FOLDER_FUNCTIONS = ("hospital_folder", "hospital_folders", "hospital_dir")
READER_WORDS = ("read", "scan", "load", "loads", "open", "iter", "parse")
START = ("app.cmd_train", "train")
FIRST_ROUND = ("federation.server.loop", "Server._round")
FIRST_ROUND_BEFORE = ("federation.engine.loop", "Server._round")  # the same method before the hospital/server split
MAX_DEPTH = 25


# -- the modules and their imports (the approach of tests/test_dependencies.py) ----------------------------------------
class Checkout:
    """The packages' modules of one checkout, parsed once."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.paths: dict[str, Path] = {}
        for package in PACKAGES:
            for path in sorted((root / package).rglob("*.py")):
                parts = list(path.relative_to(root).with_suffix("").parts)
                if parts[-1] == "__init__":
                    parts = parts[:-1]
                self.paths[".".join(parts)] = path
        self.sources = {m: p.read_text(encoding="utf-8") for m, p in self.paths.items()}
        self.trees = {m: ast.parse(s, filename=str(self.paths[m])) for m, s in self.sources.items()}
        self.imports = {m: self._imports(m) for m in self.paths}

    def is_package(self, module: str) -> bool:
        return self.paths[module].name == "__init__.py"

    def base(self, module: str, node: ast.ImportFrom) -> str:
        """The module ``node`` imports from, a relative import resolved."""
        base = node.module or ""
        if node.level:
            parts = module.split(".")
            if not self.is_package(module):
                parts = parts[:-1]
            parts = parts[: len(parts) - (node.level - 1)]
            base = ".".join([*parts, base] if base else parts)
        return base

    def _named(self, module: str, node: ast.Import | ast.ImportFrom) -> Iterator[str]:
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
            return
        base = self.base(module, node)
        for alias in node.names:
            yield f"{base}.{alias.name}"

    def known_prefix(self, name: str) -> str | None:
        parts = name.split(".")
        while parts and ".".join(parts) not in self.paths:
            parts.pop()
        return ".".join(parts) if parts else None

    def _imports(self, module: str) -> frozenset[str]:
        found: set[str] = set()
        for node in ast.walk(self.trees[module]):
            if isinstance(node, ast.Import | ast.ImportFrom):
                for name in self._named(module, node):
                    other = self.known_prefix(name)
                    if other is not None:
                        found.add(other)
        return frozenset(found - {module})


def federation_unit(module: str) -> str:
    """A module's folder within federation (``federation.engine``), or the module itself at federation's top; the
    registry is a unit of its own (as in the dependency test)."""
    if module in REGISTRY:
        return module
    return ".".join(module.split(".")[:2])


def federation_group(module: str) -> str:
    """A federation module's folder for the edge table: one of FEDERATION_FOLDERS, or "other"."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and parts[1] in FEDERATION_FOLDERS else "other"


# -- helpers over the syntax tree --------------------------------------------------------------------------------------
def docstring_nodes(tree: ast.Module) -> set[int]:
    """The ids of the docstrings' Constant nodes (module, class and function docstrings)."""
    found: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef) and node.body:
            first = node.body[0]
            if (
                isinstance(first, ast.Expr)
                and isinstance(first.value, ast.Constant)
                and isinstance(first.value.value, str)
            ):
                found.add(id(first.value))
    return found


def string_constants(tree: ast.Module) -> Iterator[str]:
    """Every string literal of the module but its docstrings (f-strings' literal parts included)."""
    docs = docstring_nodes(tree)
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docs:
            yield node.value


def root_name(node: ast.expr) -> str | None:
    """``a`` for ``a``, ``a.b.c``, ``a[0].b``; None for anything else."""
    while isinstance(node, ast.Attribute | ast.Subscript):
        node = node.value
    return node.id if isinstance(node, ast.Name) else None


def dotted(node: ast.expr) -> list[str] | None:
    """``["a", "b", "c"]`` for ``a.b.c``; None if it is not a plain dotted name."""
    parts: list[str] = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        return None
    return [node.id, *reversed(parts)]


def split_words(text: str) -> Iterator[str]:
    """The lower-case words of an identifier or a string: split at non-letters and at camelCase."""
    for chunk in re.findall(r"[A-Za-z]+", text):
        for word in re.findall(r"[A-Z]+(?![a-z])|[A-Z]?[a-z]+", chunk):
            yield word.lower()


# -- the figures -------------------------------------------------------------------------------------------------------
@dataclass
class WalkStep:
    module: str
    function: str
    depth: int
    via: str  # "config" (the object itself), "part" (an attribute of it) or "self" (a method of an object holding it)


@dataclass
class Figures:
    root: Path
    modules: dict[str, int] = field(default_factory=dict)  # package -> modules
    lines: dict[str, int] = field(default_factory=dict)  # package -> physical lines
    code_lines: dict[str, int] = field(default_factory=dict)  # package -> non-blank, non-comment lines
    largest: list[tuple[str, int]] = field(default_factory=list)
    edges: int = 0
    package_edges: Counter[tuple[str, str]] = field(default_factory=Counter)
    federation_edges: Counter[tuple[str, str]] = field(default_factory=Counter)
    module_cycles: list[list[str]] = field(default_factory=list)
    federation_cycles: list[list[str]] = field(default_factory=list)
    dashboard_importers: dict[str, list[str]] = field(default_factory=dict)
    words_identifiers: Counter[str] = field(default_factory=Counter)
    words_strings: Counter[str] = field(default_factory=Counter)
    folder_functions: list[str] = field(default_factory=list)
    card_constants: list[str] = field(default_factory=list)
    manifest_modules: list[str] = field(default_factory=list)
    metrics_readers: dict[str, list[str]] = field(default_factory=dict)
    metrics_functions: list[str] = field(default_factory=list)
    strategy_literals: dict[str, Counter[str]] = field(default_factory=dict)
    walk: list[WalkStep] = field(default_factory=list)
    chain: list[str] = field(default_factory=list)
    walk_notes: list[str] = field(default_factory=list)
    big_modules: list[tuple[str, int]] = field(default_factory=list)  # above MODULE_LIMIT lines
    big_classes: list[tuple[str, int]] = field(default_factory=list)  # above CLASS_LIMIT lines
    record_spellings: dict[str, list[str]] = field(default_factory=dict)  # record file -> modules spelling it
    side_edges: dict[str, list[str]] = field(default_factory=dict)  # "hospital -> server" -> module edges
    tracked: Counter[str] = field(default_factory=Counter)  # tracked files by kind


def measure(root: Path) -> Figures:
    co = Checkout(root)
    fig = Figures(root=root)
    sizes(co, fig)
    import_figures(co, fig)
    word_figures(co, fig)
    duplicate_figures(co, fig)
    fig.metrics_readers = metrics_readers(co)
    fig.metrics_functions = metrics_functions(co)
    strategy_literals(co, fig)
    config_walk(co, fig)
    limits(co, fig)
    record_spellings(co, fig)
    side_edges(co, fig)
    fig.tracked = tracked_files(root)
    return fig


MODULE_LIMIT, CLASS_LIMIT = 600, 300  # issue 49's limits
RECORD_FILES = ("summary.json", "prepare.json", "metrics.jsonl", "config.toml", "predictions.csv", "manifest.csv")
# the hospital's and the server's code: the folders after the split, the modules that held it before
HOSPITAL_BEFORE = (
    "federation.client",
    "federation.data",
    "federation.privacy",
    "federation.fisher",
    "federation.gpu",
    "federation.gpu_memory",
    "federation.engine.hospital",
    "federation.engine.policy",
    "federation.engine.rules",
    "federation.engine.outbound",
    "federation.engine.export",
    "federation.engine.tissue",
)
SERVER_BEFORE = (
    "federation.engine.loop",
    "federation.engine.guard",
    "federation.engine.checks",
    "federation.engine.audit",
    "federation.engine.dp_watch",
    "federation.engine.resume",
    "federation.engine.rounds",
    "federation.engine.summary",
)


def limits(co: Checkout, fig: Figures) -> None:
    """Modules above ``MODULE_LIMIT`` lines and classes above ``CLASS_LIMIT`` lines (decorators to last line)."""
    for module, source in co.sources.items():
        count = len(source.splitlines())
        if count > MODULE_LIMIT:
            fig.big_modules.append((module, count))
        for node in ast.walk(co.trees[module]):
            if isinstance(node, ast.ClassDef) and node.end_lineno is not None:
                first = min([node.lineno, *(d.lineno for d in node.decorator_list)])
                size = node.end_lineno - first + 1
                if size > CLASS_LIMIT:
                    fig.big_classes.append((f"{module}:{node.name}", size))
    fig.big_modules.sort(key=lambda item: -item[1])
    fig.big_classes.sort(key=lambda item: -item[1])


def record_spellings(co: Checkout, fig: Figures) -> None:
    """The modules whose string literals (docstrings aside) spell each record file's name."""
    for name in RECORD_FILES:
        fig.record_spellings[name] = sorted(
            m for m, tree in co.trees.items() if any(name in text for text in string_constants(tree))
        )


def _side(module: str, after: tuple[str, ...], before: tuple[str, ...]) -> bool:
    return module.startswith(after) or module in before


def side_edges(co: Checkout, fig: Figures) -> None:
    """Direct imports from the hospital's code to the server's and back (folders after the split, the named
    modules before it)."""
    hospital = (("federation.hospital.", "federation.hospital"), HOSPITAL_BEFORE)
    server = (("federation.server.", "federation.server"), SERVER_BEFORE)
    for name, (mine, other) in (("hospital -> server", (hospital, server)), ("server -> hospital", (server, hospital))):
        fig.side_edges[name] = sorted(
            f"{m} -> {o}" for m in co.paths if _side(m, *mine) for o in co.imports[m] if _side(o, *other)
        )


def tracked_files(root: Path) -> Counter[str]:
    """Tracked files by kind: results (results/ and benchmarks/results/), code (.py), and the rest."""
    listed = subprocess.run(["git", "-C", str(root), "ls-files"], capture_output=True, text=True, check=True)
    kinds: Counter[str] = Counter()
    for path in listed.stdout.splitlines():
        if path.startswith(("results/", "benchmarks/results/")):
            kinds["published results"] += 1
            kinds[f"published results .{path.rsplit('.', 1)[-1]}"] += 1 if "." in path.rsplit("/", 1)[-1] else 0
        elif path.endswith(".py"):
            kinds["code (.py)"] += 1
        else:
            kinds["other (docs, configs, ...)"] += 1
    kinds["all"] = sum(v for k, v in kinds.items() if not k.startswith("published results ."))
    return kinds


def sizes(co: Checkout, fig: Figures) -> None:
    per_module: dict[str, int] = {}
    for module, source in co.sources.items():
        package = module.split(".")[0]
        lines = source.splitlines()
        per_module[module] = len(lines)
        fig.modules[package] = fig.modules.get(package, 0) + 1
        fig.lines[package] = fig.lines.get(package, 0) + len(lines)
        code = sum(1 for line in lines if line.strip() and not line.strip().startswith("#"))
        fig.code_lines[package] = fig.code_lines.get(package, 0) + code
    fig.largest = sorted(per_module.items(), key=lambda item: (-item[1], item[0]))[:10]


def import_figures(co: Checkout, fig: Figures) -> None:
    edges = {m: set(co.imports[m]) for m in co.paths}
    fig.edges = sum(len(others) for others in edges.values())
    units: dict[str, set[str]] = {}
    for module, others in edges.items():
        for other in others:
            fig.package_edges[module.split(".")[0], other.split(".")[0]] += 1
            if module.startswith("federation.") and other.startswith("federation."):
                fig.federation_edges[federation_group(module), federation_group(other)] += 1
        if module.startswith("federation."):
            unit = federation_unit(module)
            units.setdefault(unit, set()).update(
                federation_unit(o) for o in others if o.startswith("federation.") and federation_unit(o) != unit
            )
        if module != "app.dashboard" and not module.startswith("app.dashboard."):
            names = sorted(o for o in others if o == "app.dashboard" or o.startswith("app.dashboard."))
            if names:
                fig.dashboard_importers[module] = names
    fig.module_cycles = cycles(edges)
    fig.federation_cycles = cycles(units)


def word_figures(co: Checkout, fig: Figures) -> None:
    for source in co.sources.values():
        for token in tokenize.generate_tokens(io.StringIO(source).readline):
            if token.type == tokenize.NAME:
                target = fig.words_identifiers
            elif token.type == tokenize.STRING or token.type == getattr(tokenize, "FSTRING_MIDDLE", -1):
                target = fig.words_strings
            else:
                continue
            for word in split_words(token.string):
                if word in WORDS:
                    target[WORDS[word]] += 1


def duplicate_figures(co: Checkout, fig: Figures) -> None:
    for module, tree in co.trees.items():
        for node in ast.walk(tree):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.name.lstrip("_") in FOLDER_FUNCTIONS:
                fig.folder_functions.append(f"{module}:{node.name}")
        for node in tree.body:
            targets: list[ast.expr] = []
            if isinstance(node, ast.Assign):
                targets = list(node.targets)
            elif isinstance(node, ast.AnnAssign):
                targets = [node.target]
            for target in targets:
                if isinstance(target, ast.Name) and target.id.endswith("CARD_FILE"):
                    fig.card_constants.append(f"{module}:{target.id}")
        if any("manifest.csv" in text for text in string_constants(tree)):
            fig.manifest_modules.append(module)


def _mentions_metrics(node: ast.AST, names: set[str]) -> bool:
    for sub in ast.walk(node):
        if isinstance(sub, ast.Name) and (sub.id == "METRICS_FILE" or sub.id in names):
            return True
        if isinstance(sub, ast.Attribute) and sub.attr == "METRICS_FILE":
            return True
        if isinstance(sub, ast.Constant) and isinstance(sub.value, str) and "metrics.jsonl" in sub.value:
            return True
    return False


def _call_name(call: ast.Call) -> str:
    func = call.func
    if isinstance(func, ast.Attribute):
        return func.attr
    if isinstance(func, ast.Name):
        return func.id
    return ""


def metrics_readers(co: Checkout) -> dict[str, list[str]]:
    """Modules with a call of a reader (a name with the word read/scan/load(s)/open/iter/parse) on a path built from
    METRICS_FILE or "metrics.jsonl" (or on a name assigned or looped over from one, within the same function), or a
    ``.read_text()``/``.open()`` of such a path; each with the readers' names. Docstrings never count."""
    found: dict[str, list[str]] = {}
    for module, tree in co.trees.items():
        docs = docstring_nodes(tree)
        readers: set[str] = set()
        functions = [n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)]
        top = [s for s in tree.body if not isinstance(s, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef)]
        scopes: list[list[ast.AST]] = [list(ast.walk(f)) for f in functions]
        scopes.append([n for s in top for n in ast.walk(s)])
        for scope in scopes:
            body = [n for n in scope if id(n) not in docs]
            names: set[str] = set()
            for _ in range(2):  # names assigned from a metrics path, and names assigned from those
                for node in body:
                    if isinstance(node, ast.Assign) and _mentions_metrics(node.value, names):
                        names.update(t.id for t in node.targets if isinstance(t, ast.Name))
                    elif isinstance(node, ast.For | ast.comprehension) and _mentions_metrics(node.iter, names):
                        names.update(n.id for n in ast.walk(node.target) if isinstance(n, ast.Name))
            for node in body:
                if not isinstance(node, ast.Call):
                    continue
                name = _call_name(node)
                if not set(split_words(name)) & set(READER_WORDS):
                    continue
                args = [*node.args, *(k.value for k in node.keywords)]
                on_path = isinstance(node.func, ast.Attribute) and _mentions_metrics(node.func.value, names)
                if on_path or any(_mentions_metrics(arg, names) for arg in args):
                    readers.add(name)
        if readers:
            found[module] = sorted(readers)
    return found


def metrics_functions(co: Checkout) -> list[str]:
    """Functions whose name has the word "metrics" and whose body calls a reader (a second, simpler
    form of the count above): module:function."""
    found: list[str] = []
    for module, tree in co.trees.items():
        for node in ast.walk(tree):
            if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) or "metrics" not in split_words(node.name):
                continue
            names = {_call_name(c) for c in ast.walk(node) if isinstance(c, ast.Call)}
            if any(set(split_words(n)) & set(READER_WORDS) for n in names):
                found.append(f"{module}:{node.name}")
    return sorted(found)


def strategy_literals(co: Checkout, fig: Figures) -> None:
    for module, tree in co.trees.items():
        if module.startswith("federation.strategies") or module in REGISTRY:  # the methods and their registry
            continue
        counts = Counter(text for text in string_constants(tree) if text in STRATEGY_NAMES)
        if counts:
            fig.strategy_literals[str(co.paths[module].relative_to(co.root))] = counts


# -- the configuration's walk ------------------------------------------------------------------------------------------
Target = tuple[str, str]  # (module, qualified name: "f" or "Class.method")


class Resolver:
    """Names to the project's functions and classes, through imports and re-exports (approximate: no inheritance,
    no types of variables beyond ``x = Class(...)``, no dynamic dispatch)."""

    def __init__(self, co: Checkout) -> None:
        self.co = co
        self.defs: dict[str, dict[str, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef]] = {}
        self.names: dict[str, dict[str, tuple[str, str | None]]] = {}
        for module, tree in co.trees.items():
            defs: dict[str, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef] = {}
            for node in tree.body:
                if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                    defs[node.name] = node
                    if isinstance(node, ast.ClassDef):
                        for item in node.body:
                            if isinstance(item, ast.FunctionDef | ast.AsyncFunctionDef):
                                defs[f"{node.name}.{item.name}"] = item
            self.defs[module] = defs
            self.names[module] = self.imported(module, [n for n in ast.walk(tree) if _is_module_level(tree, n)])

    def imported(self, module: str, nodes: list[ast.AST]) -> dict[str, tuple[str, str | None]]:
        """Local name -> (module, name in it) or (module, None) for a module itself."""
        found: dict[str, tuple[str, str | None]] = {}
        for node in nodes:
            if isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.asname:
                        found[alias.asname] = (alias.name, None)
                    else:
                        first = alias.name.split(".")[0]
                        found[first] = (first, None)
            elif isinstance(node, ast.ImportFrom):
                base = self.co.base(module, node)
                for alias in node.names:
                    local = alias.asname or alias.name
                    if f"{base}.{alias.name}" in self.co.paths:
                        found[local] = (f"{base}.{alias.name}", None)
                    else:
                        found[local] = (base, alias.name)
        return found

    def lookup(self, module: str, name: str, depth: int = 0) -> Target | None:
        """Where ``name`` of ``module`` is defined (following re-exports)."""
        if module not in self.defs or depth > 10:
            return None
        if name in self.defs[module]:
            return (module, name)
        head, _, rest = name.partition(".")
        if head in self.names[module]:
            other, inner = self.names[module][head]
            full = ".".join(p for p in (inner, rest) if p)
            if not full:
                return None
            return self.lookup(other, full, depth + 1)
        return None

    def resolve(self, module: str, parts: list[str], local: dict[str, tuple[str, str | None]]) -> Target | None:
        """The definition a dotted call name ``parts`` reaches in ``module`` (``local``: a function's own imports)."""
        head, rest = parts[0], parts[1:]
        if head in local or head in self.names[module]:
            other, inner = local.get(head) or self.names[module][head]
            if inner is None:  # a module: a.b.c -> module a.b, name c
                while rest and f"{other}.{rest[0]}" in self.co.paths:
                    other = f"{other}.{rest[0]}"
                    rest = rest[1:]
                return self.lookup(other, ".".join(rest)) if rest else None
            return self.lookup(other, ".".join([inner, *rest]))
        if head in self.defs[module]:
            return self.lookup(module, ".".join(parts))
        return None


def _is_module_level(tree: ast.Module, node: ast.AST) -> bool:
    return node in tree.body or any(
        node in getattr(n, "body", ()) for n in tree.body if isinstance(n, ast.If | ast.Try)
    )


def _is_config(node: ast.expr, tracked: set[str], holder: bool) -> str | None:
    """ "config" if ``node`` is a tracked name (or ``self.config`` in an object holding it), "part" if it is an
    attribute or item of one, None otherwise."""
    if isinstance(node, ast.Name) and node.id in tracked:
        return "config"
    if holder and dotted(node) == ["self", "config"]:
        return "config"
    name = root_name(node)
    if name in tracked:
        return "part"
    if holder and name == "self":
        parts = []
        while isinstance(node, ast.Attribute | ast.Subscript):
            if isinstance(node, ast.Attribute):
                parts.append(node.attr)
            node = node.value
        if parts and parts[-1] == "config":
            return "part"
    return None


def config_walk(co: Checkout, fig: Figures) -> None:
    """From ``train`` in app/cmd_train.py, depth first through the project's functions that are handed the run
    configuration: a call is followed when an argument is a name holding it (the command's ``config`` and what is
    assigned from a call given it), an attribute of it (the callee is visited, not walked further), or when it is
    a method of an object holding it (``self.m(...)`` where the class keeps ``self.config``; ``x.m(...)`` where
    ``x = Class(config, ...)``). Names resolve through imports and re-exports; no inheritance, no dynamic dispatch."""
    resolver = Resolver(co)
    seen: set[Target] = set()
    path: list[str] = []

    def holds_config(module: str, cls: str) -> bool:
        node = resolver.defs[module].get(cls)
        if not isinstance(node, ast.ClassDef):
            return False
        for sub in ast.walk(node):
            if isinstance(sub, ast.Assign | ast.AnnAssign):
                targets = sub.targets if isinstance(sub, ast.Assign) else [sub.target]
                if any(dotted(t) == ["self", "config"] for t in targets):
                    return True
        return False

    def visit(target: Target, seeds: set[str], via: str, depth: int, holder: bool) -> None:
        module, qualname = target
        key = f"{module}:{qualname}"
        if target in seen or depth > MAX_DEPTH:
            return
        seen.add(target)
        path.append(key)
        fig.walk.append(WalkStep(module, qualname, depth, via))
        if target in (FIRST_ROUND, FIRST_ROUND_BEFORE) and not fig.chain:
            fig.chain = list(path)
        node = resolver.defs[module].get(qualname)
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and (seeds or holder):
            walk_function(module, qualname, node, seeds, depth, holder)
        path.pop()

    def walk_function(
        module: str,
        qualname: str,
        node: ast.FunctionDef | ast.AsyncFunctionDef,
        seeds: set[str],
        depth: int,
        holder: bool,
    ) -> None:
        cls = qualname.split(".")[0] if "." in qualname else None
        local = resolver.imported(module, [n for n in ast.walk(node) if isinstance(n, ast.Import | ast.ImportFrom)])
        tracked = set(seeds)
        kinds: dict[str, Target] = {}  # a name assigned from a class given the configuration -> that class
        statements = list(ast.walk(node))
        for _ in range(2):
            for sub in statements:
                if not isinstance(sub, ast.Assign | ast.AnnAssign) or sub.value is None:
                    continue
                value = sub.value
                assigned = sub.targets if isinstance(sub, ast.Assign) else [sub.target]
                targets = [t.id for t in assigned if isinstance(t, ast.Name)]
                if not isinstance(value, ast.Call):
                    if _is_config(value, tracked, holder) == "config":  # an alias: cfg = config, config = self.config
                        tracked.update(targets)
                    continue
                if not any(_is_config(a, tracked, holder) == "config" for a in _arguments(value)):
                    continue
                parts = dotted(value.func)
                callee = resolver.resolve(module, parts, local) if parts else None
                if callee and isinstance(resolver.defs[callee[0]].get(callee[1]), ast.ClassDef):
                    kinds.update((t, callee) for t in targets)  # an object holding the configuration
                else:  # a configuration made from one (cfg = load_config(config, ...)), by its name
                    tracked.update(t for t in targets if "config" in t.lower() or "cfg" in t.lower())
        calls = sorted((c for c in statements if isinstance(c, ast.Call)), key=lambda c: (c.lineno, c.col_offset))
        for call in calls:
            parts = dotted(call.func)
            if not parts:
                continue
            callee = None
            on_object = False
            if parts[0] == "self" and len(parts) == 2 and cls and holder:
                callee = resolver.lookup(module, f"{cls}.{parts[1]}")
                on_object = True
            elif parts[0] in kinds and len(parts) == 2:
                owner = kinds[parts[0]]
                callee = resolver.lookup(owner[0], f"{owner[1]}.{parts[1]}")
                on_object = True
            else:
                callee = resolver.resolve(module, parts, local)
            if callee is None:
                continue
            given = {i: _is_config(a, tracked, holder) for i, a in enumerate(call.args)}
            given_kw = {k.arg: _is_config(k.value, tracked, holder) for k in call.keywords if k.arg}
            whole = [i for i, g in given.items() if g == "config"]
            whole_kw = [k for k, g in given_kw.items() if g == "config"]
            parts_given = any(g == "part" for g in [*given.values(), *given_kw.values()])
            if not (whole or whole_kw or parts_given or on_object):
                continue
            definition = resolver.defs[callee[0]].get(callee[1])
            is_class = isinstance(definition, ast.ClassDef)
            if is_class:
                init = resolver.lookup(callee[0], f"{callee[1]}.__init__")
                if init is not None:
                    callee = init
                    definition = resolver.defs[init[0]][init[1]]
            seeds_in: set[str] = set()
            if isinstance(definition, ast.FunctionDef | ast.AsyncFunctionDef):
                params = [a.arg for a in [*definition.args.posonlyargs, *definition.args.args]]
                if "." in callee[1] and params and params[0] in ("self", "cls"):
                    params = params[1:]
                for i in whole:
                    if i < len(params):
                        seeds_in.add(params[i])
                    elif definition.args.vararg:
                        seeds_in.add(definition.args.vararg.arg)
                for k in whole_kw:
                    seeds_in.add(k)
            # a method runs with the configuration at hand when called on an object holding it, or when the
            # class's constructor is given it and keeps it (self.config)
            holder_in = "." in callee[1] and (
                on_object or (bool(seeds_in) and holds_config(callee[0], callee[1].split(".")[0]))
            )
            via = "config" if (whole or whole_kw) else ("self" if on_object else "part")
            visit(callee, seeds_in, via, depth + 1, holder_in)

    start = resolver.lookup(START[0], START[1])
    if start is None:  # the command is registered by a nested function: find it
        for sub in ast.walk(co.trees[START[0]]):
            if isinstance(sub, ast.FunctionDef) and sub.name == START[1]:
                resolver.defs[START[0]][START[1]] = sub
                start = START
                break
    if start is None:
        fig.walk_notes.append(f"no function {START[1]} in {START[0]}")
        return
    visit(start, {"config"}, "config", 0, False)
    if not fig.chain:
        fig.walk_notes.append(f"{FIRST_ROUND[0]}:{FIRST_ROUND[1]} was not reached")


def _arguments(call: ast.Call) -> list[ast.expr]:
    return [*call.args, *(k.value for k in call.keywords)]


# -- the report --------------------------------------------------------------------------------------------------------
def headline(fig: Figures) -> dict[str, str]:
    """The single-number figures, by label (the rows of the side-by-side table)."""
    rows: dict[str, str] = {}
    for package in PACKAGES:
        rows[f"modules in {package}"] = str(fig.modules.get(package, 0))
    rows["modules, all packages"] = str(sum(fig.modules.values()))
    for package in PACKAGES:
        rows[f"lines in {package} (code lines)"] = f"{fig.lines.get(package, 0)} ({fig.code_lines.get(package, 0)})"
    rows["lines, all packages (code lines)"] = f"{sum(fig.lines.values())} ({sum(fig.code_lines.values())})"
    rows["largest module (lines)"] = f"{fig.largest[0][0]} ({fig.largest[0][1]})" if fig.largest else "-"
    rows["import edges between modules"] = str(fig.edges)
    cross = sum(n for (a, b), n in fig.package_edges.items() if a != b)
    rows["edges between packages"] = str(cross)
    fed_cross = sum(n for (a, b), n in fig.federation_edges.items() if a != b)
    rows["edges between federation's folders (other = its top modules)"] = str(fed_cross)
    rows["module import cycles (SCCs > 1 module)"] = str(len(fig.module_cycles))
    rows["federation folder cycles"] = str(len(fig.federation_cycles))
    rows["modules outside app/dashboard importing it"] = str(len(fig.dashboard_importers))
    for word in ("client", "hospital", "site"):
        ident, strings = fig.words_identifiers[word], fig.words_strings[word]
        rows[f"word '{word}(s)': identifiers + strings"] = f"{ident} + {strings} = {ident + strings}"
    rows["functions named hospital_folder(s)/hospital_dir"] = str(len(fig.folder_functions))
    rows["module constants named *CARD_FILE"] = str(len(fig.card_constants))
    rows['modules spelling "manifest.csv" (docstrings aside)'] = str(len(fig.manifest_modules))
    rows["modules reading metrics.jsonl"] = str(len(fig.metrics_readers))
    readers = sorted({r for names in fig.metrics_readers.values() for r in names})
    rows["distinct readers they call on it"] = f"{len(readers)} ({', '.join(readers)})"
    own = [m for m, names in fig.metrics_readers.items() if names != ["read_metrics"]]
    rows["of those, modules parsing it without read_metrics"] = str(len(own))
    rows["functions named *metrics* calling a reader"] = str(len(fig.metrics_functions))
    literal_total = sum(sum(c.values()) for c in fig.strategy_literals.values())
    rows["method-name literals outside federation/strategies and the registry"] = str(literal_total)
    rows["files holding them"] = str(len(fig.strategy_literals))
    rows[f"modules above {MODULE_LIMIT} lines"] = str(len(fig.big_modules))
    rows[f"classes above {CLASS_LIMIT} lines"] = str(len(fig.big_classes))
    biggest = max(fig.big_classes, key=lambda item: item[1], default=None)
    rows["largest class above the limit (lines)"] = f"{biggest[0]} ({biggest[1]})" if biggest else "-"
    for name, spelled in fig.record_spellings.items():
        rows[f'modules spelling "{name}"'] = str(len(spelled))
    for name, edges in fig.side_edges.items():
        rows[f"direct imports {name}"] = str(len(edges))
    for kind in ("all", "code (.py)", "published results", "published results .jsonl", "published results .json"):
        rows[f"tracked files: {kind}"] = str(fig.tracked.get(kind, 0))
    rows["config walk: functions visited"] = str(len(fig.walk))
    rows["config walk: modules visited"] = str(len({s.module for s in fig.walk}))
    whole = {s.module for s in fig.walk if s.via != "part"}
    rows["config walk: modules the whole object reaches"] = str(len(whole))
    stays, places, returns = walk_stays(fig.walk)
    rows["config walk: stays of the whole object (places, returns)"] = f"{stays} ({places}, {returns})"
    rows["config walk: train -> first round, functions"] = str(len(fig.chain)) if fig.chain else "not reached"
    rows["config walk: train -> first round, modules"] = (
        str(len({step.split(":")[0] for step in fig.chain})) if fig.chain else "not reached"
    )
    return rows


def walk_stays(walk: list[WalkStep]) -> tuple[int, int, int]:
    """Where the whole configuration object stays on its way from ``train``: the walk's steps that receive the
    object itself (``config``) or run as a method of an object holding it (``self``), in depth-first visit order;
    a stay is a maximal run of such steps in one module, a place a module with a stay, and a return a stay in a
    module the object had already left (the root's stay included)."""
    modules = [s.module for s in walk if s.via != "part"]
    stays = [m for i, m in enumerate(modules) if i == 0 or modules[i - 1] != m]
    returns = sum(1 for i, m in enumerate(stays) if m in stays[:i])
    return len(stays), len(set(stays)), returns


def matrix(counts: Counter[tuple[str, str]], names: tuple[str, ...], other: Counter[tuple[str, str]] | None) -> str:
    """A Markdown table of edge counts (row imports column); with ``other`` each cell is "before -> after"."""
    lines = ["| imports -> | " + " | ".join(names) + " |", "|---|" + "---:|" * len(names)]
    for a in names:
        cells = []
        for b in names:
            if other is None:
                cells.append(str(counts[a, b]) if counts[a, b] else "·")
            else:
                x, y = counts[a, b], other[a, b]
                cells.append("·" if not x and not y else (str(x) if x == y else f"{x} -> {y}"))
        lines.append(f"| {a} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def details(fig: Figures) -> list[str]:
    out = ["### Largest modules", "", "| module | lines |", "|---|---:|"]
    out += [f"| {m} | {n} |" for m, n in fig.largest]
    out += ["", "### Cycles", ""]
    out += [f"- modules: {', '.join(c)}" for c in fig.module_cycles] or ["- modules: none"]
    out += [f"- federation folders: {', '.join(c)}" for c in fig.federation_cycles] or ["- federation folders: none"]
    out += ["", "### Modules outside app/dashboard importing it", ""]
    out += [f"- {m}: {', '.join(n)}" for m, n in sorted(fig.dashboard_importers.items())] or ["- none"]
    out += ["", "### Duplicated names", ""]
    out += [f"- hospital folder functions: {', '.join(fig.folder_functions) or 'none'}"]
    out += [f"- *CARD_FILE constants: {', '.join(fig.card_constants) or 'none'}"]
    out += [f'- "manifest.csv" spelled in: {", ".join(fig.manifest_modules) or "none"}']
    out += ["", "### Readers of metrics.jsonl", ""]
    out += [f"- {m}: {', '.join(r)}" for m, r in sorted(fig.metrics_readers.items())] or ["- none"]
    out += [f"- functions named *metrics* calling a reader: {', '.join(fig.metrics_functions) or 'none'}"]
    out += ["", "### Method names outside federation/strategies", ""]
    for path, counts in sorted(fig.strategy_literals.items()):
        out.append(f"- {path} ({sum(counts.values())}): " + ", ".join(f"{k} {v}" for k, v in sorted(counts.items())))
    out += ["", "### The configuration's walk (static, approximate)", ""]
    if fig.chain:
        out.append("train -> first round: " + " -> ".join(fig.chain))
    out += [f"- {note}" for note in fig.walk_notes]
    out += [
        "",
        "Approximate: calls are resolved by imported name (re-exports followed), an object's methods only through",
        "`self` or a name assigned from the class, no inheritance, no call through a variable or a registry.",
        "Visited, depth first (via: config = the object, part = an attribute of it, self = a method of an",
        "object holding it):",
        "",
        "```",
    ]
    out += [f"{'  ' * s.depth}{s.module}:{s.function} [{s.via}]" for s in fig.walk]
    out += ["```"]
    return out


def revision(root: Path) -> str:
    """The checkout's commit (``git rev-parse HEAD``), or "-" outside git."""
    try:
        done = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True, check=True)
    except (OSError, subprocess.CalledProcessError):
        return "-"
    return done.stdout.strip()


def report(fig: Figures) -> str:
    out = [f"# Code structure of {fig.root} (commit {revision(fig.root)})", "", "| figure | value |", "|---|---|"]
    out += [f"| {k} | {v} |" for k, v in headline(fig).items()]
    out += ["", "### Edges between packages", "", matrix(fig.package_edges, PACKAGES, None)]
    out += ["", "### Edges within federation", "", matrix(fig.federation_edges, (*FEDERATION_FOLDERS, "other"), None)]
    out += ["", *details(fig)]
    return "\n".join(out) + "\n"


def compare(before: Figures, after: Figures) -> str:
    a, b = headline(before), headline(after)
    out = [
        f"# Code structure: {before.root} (before) and {after.root} (after)",
        "",
        f"Before: commit {revision(before.root)}; after: commit {revision(after.root)}.",
        "",
        "| figure | before | after |",
        "|---|---|---|",
    ]
    out += [f"| {k} | {a[k]} | {b[k]} |" for k in a]
    out += ["", "### Edges between packages (before -> after)", ""]
    out += [matrix(before.package_edges, PACKAGES, after.package_edges)]
    out += ["", "### Edges within federation (before -> after; other = federation's top modules)", ""]
    out += [matrix(before.federation_edges, (*FEDERATION_FOLDERS, "other"), after.federation_edges)]
    out += ["", "## Before", "", *details(before), "", "## After", "", *details(after)]
    return "\n".join(out) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    group = parser.add_mutually_exclusive_group(required=True)
    group.add_argument("--repo", type=Path, help="a checkout to measure")
    group.add_argument("--compare", type=Path, nargs=2, metavar=("BEFORE", "AFTER"), help="two checkouts")
    args = parser.parse_args(argv)
    if args.repo is not None:
        sys.stdout.write(report(measure(args.repo)))
    else:
        sys.stdout.write(compare(measure(args.compare[0]), measure(args.compare[1])))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
