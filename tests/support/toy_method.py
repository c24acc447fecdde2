"""A toy method added to the strategy registry in a fresh interpreter, as a newcomer adds one (docs/extending.md):
``fedsketch``, FedAvg's module under another name, with one setting of its own declared in its spec, ``fedsketch.beta``
(float, default 0.5, in [0, 1]). Nothing else is changed, so what the configuration and the dashboard's form do
with it is what they build from the declaration alone.
"""

from __future__ import annotations

import os
import subprocess
import sys

from support.paths import REPO

TOY_SPEC = """    StrategySpec(
        "fedsketch",
        "federation.strategies.fedavg",
        "FedSketch",
        "FedSketch (a toy)",
        10,
        averaging=True,
        example_weighted=True,
        section=(
            Setting("beta", 0.5, "How hard the toy pulls.", label="Sketch beta", minimum=0.0, maximum=1.0, step=0.05),
        ),
    ),
"""
_END_OF_SPECS = ")\nSPEC: dict[str, StrategySpec]"

# Run first in the fresh interpreter: federation.methods from its own source with TOY_SPEC as the last of SPECS.
_PRELUDE = f"""
import pathlib, sys, types
import federation
_source = pathlib.Path({str(REPO / "federation" / "methods.py")!r}).read_text(encoding="utf-8")
assert _source.count({_END_OF_SPECS!r}) == 1, "SPECS no longer ends as tests/support/toy_method.py expects"
_source = _source.replace({_END_OF_SPECS!r}, {TOY_SPEC!r} + {_END_OF_SPECS!r})
_module = types.ModuleType("federation.methods")
_module.__file__ = {str(REPO / "federation" / "methods.py")!r}
sys.modules["federation.methods"] = _module
federation.methods = _module
exec(compile(_source, _module.__file__, "exec"), _module.__dict__)
"""


def run_with_toy(code: str) -> str:
    """Run ``code`` in a fresh interpreter whose registry holds the toy method; its output (it fails the calling
    test, with the interpreter's error, when ``code`` raises)."""
    done = subprocess.run(
        [sys.executable, "-c", _PRELUDE + code],
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    return done.stdout
