"""The benchmarks import their own helpers, even with a dependency that installs a top-level ``benchmarks``."""

from __future__ import annotations

import subprocess
import sys

from support.paths import REPO


def test_the_benchmarks_package_is_this_repositorys() -> None:
    # opacus 1.6 installs a package named ``benchmarks``; ours must win where the benchmark scripts put the repo first
    code = f"import sys; sys.path.insert(0, {str(REPO)!r}); import benchmarks._common as c; print(c.__file__)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd="/", timeout=60)
    assert out.stdout.strip() == str(REPO / "benchmarks" / "_common.py")
