"""Starting worker processes from any caller: the one rule every process pool of the product shares.

``multiprocessing``'s ``spawn`` and ``forkserver`` start methods re-import the parent's ``__main__`` script in each
child. That script may be anything that imported the product (a Streamlit page, a notebook, a test runner), not a
command meant to run twice; the workers need only functions that live in importable modules. `plain_main` makes
``__main__`` an empty module while workers start, so no child re-runs it (Python's ``multiprocessing.spawn``
skips the step when the main module has neither ``__file__`` nor ``__spec__``).
"""

from __future__ import annotations

import contextlib
import sys
import types
from collections.abc import Iterator


@contextlib.contextmanager
def plain_main() -> Iterator[None]:
    """Within the block, ``sys.modules["__main__"]`` is an empty module (module docstring); restored after."""
    saved = sys.modules.get("__main__")
    sys.modules["__main__"] = types.ModuleType("__main__")
    try:
        yield
    finally:
        if saved is not None:
            sys.modules["__main__"] = saved
