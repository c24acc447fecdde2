#!/usr/bin/env bash
# Create or update .venv/ with everything the project needs (uv; falls back to installing uv with pip).
set -euo pipefail
cd "$(dirname "$0")/.."
if ! command -v uv >/dev/null 2>&1; then
    python3 -m pip install --quiet uv 2>/dev/null || python3 -m pip install --quiet --user uv
    export PATH="$HOME/.local/bin:$PATH"
fi
[ -x .venv/bin/python ] || uv venv --quiet --python 3.11 .venv
uv pip install --quiet --python .venv/bin/python -e '.[dev]'
