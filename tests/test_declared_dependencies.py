"""Every library the product imports is declared in pyproject.toml, and every declared dependency is used.

The product's packages (app, federation, inference, models, pipeline, infra) are walked with ``ast`` (imports at
module level and inside functions alike); each third-party top-level module is mapped to its distribution with
``importlib.metadata.packages_distributions`` (the installed metadata, so ``sklearn`` is scikit-learn and ``cv2``
is opencv-python-headless).
"""

from __future__ import annotations

import ast
import re
import sys
import tomllib
from functools import cache
from importlib import metadata

from support.paths import REPO

PACKAGES = ("app", "federation", "inference", "models", "pipeline", "infra")
# declared in the dev extra because only a developer's tool imports them (named with where and why)
DEV_ONLY = {"playwright": "app/dashboard/browser.py: the docs' screenshots and the browser test"}
# declared and used without an import: a plugin another library loads (named with where and why)
LOADED_BY_OTHERS = {"imagecodecs": "tifffile's TIFF codecs (pipeline/images.py); prepare.json records its version"}


def _norm(name: str) -> str:
    return name.lower().replace("_", "-")


def _declared(section: str) -> set[str]:
    project = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    entries = project["dependencies"] if section == "main" else project["optional-dependencies"][section]
    return {_norm(re.split(r"[<>=\[ ;!~]", entry)[0]) for entry in entries}


@cache
def _imported() -> dict[str, set[str]]:
    """Third-party top-level modules the packages import, with the files importing each."""
    found: dict[str, set[str]] = {}
    for package in PACKAGES:
        for path in (REPO / package).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                if isinstance(node, ast.Import):
                    names = [alias.name for alias in node.names]
                elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                    names = [node.module]
                else:
                    continue
                for name in names:
                    top = name.split(".")[0]
                    if top in sys.stdlib_module_names or top in PACKAGES or top == "__future__":
                        continue
                    found.setdefault(top, set()).add(str(path.relative_to(REPO)))
    return found


def _distributions(module: str) -> set[str]:
    return {_norm(d) for d in metadata.packages_distributions().get(module, [])}


def test_every_imported_library_is_declared() -> None:
    main, dev = _declared("main"), _declared("dev")
    assert {"torch", "flwr", "ray"} <= main
    imported = _imported()
    assert len(imported) > 15
    undeclared = {
        module: sorted(files)
        for module, files in imported.items()
        if not _distributions(module) & main and not (module in DEV_ONLY and _distributions(module) & dev)
    }
    assert undeclared == {}


def test_every_declared_dependency_is_used() -> None:
    used = {d for module in _imported() for d in _distributions(module)}
    unused = sorted(_declared("main") - used - set(LOADED_BY_OTHERS))
    assert unused == []
    # the exceptions are still declared (else they are stale)
    assert set(LOADED_BY_OTHERS) <= _declared("main")
    assert set(DEV_ONLY) <= _declared("dev")
