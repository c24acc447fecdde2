"""Writing TOML values, the one way this project does it (reading is the standard library's ``tomllib``).

A string is written as a TOML basic string through JSON's encoder (a JSON string is a valid TOML basic string:
quotes, backslashes and control characters escaped); ``bare_words`` writes a plain word (``fedsaf``) unquoted, as
the ``--set KEY=VALUE`` form reads it.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

_BARE = re.compile(r"[A-Za-z_][A-Za-z0-9_-]*")


def toml_value(value: Any, *, bare_words: bool = False) -> str:
    """``value`` (bool, int, float, str, path, or a list or tuple of them) as a TOML value."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, list | tuple):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    if isinstance(value, str | Path) or bare_words:
        text = str(value)
        if bare_words and _BARE.fullmatch(text) and text not in ("true", "false", "inf", "nan"):
            return text  # a bare word: `--set strategy.name=fedsaf` reads it as a string (federation.config)
        return json.dumps(text, ensure_ascii=False)
    raise TypeError(f"cannot write {type(value).__name__} to TOML")
