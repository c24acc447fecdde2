#!/usr/bin/env bash
# Quick start, command 2: set up .venv/ and run the whole check: ruff, mypy, then the pytest suite.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
.venv/bin/ruff check .
.venv/bin/ruff format --check .
.venv/bin/mypy
bash scripts/install_browser.sh  # Debian chromium for the dashboard browser test (tests/app, -m browser)
# Debian nginx-light: the server gate that the deployment tests start (federation.flower.gate)
bash scripts/apt_install.sh nginx-light nginx "the deployment tests and gastric-fl federation server"
# Debian dataset-fashion-mnist: Zalando's IDX files, read by prepare --format idx (tests/pipeline/test_idx.py)
bash scripts/apt_install.sh dataset-fashion-mnist /usr/share/datasets/fashion-mnist "the Fashion-MNIST tests and configs/fmnist_table7.toml"
# Two pytest-xdist workers where there are two cores: the deployment tests (one unit of work, first:
# tests/support/scheduling.py, SERIAL) on one while the other takes every other module; one process on a single core.
workers=0
[ "$(nproc)" -ge 2 ] && workers=2
.venv/bin/python -m pytest -n "$workers" --no-loadscope-reorder "$@"
