#!/usr/bin/env bash
# Quick start, command 1: set up .venv/, then the main job on built-in synthetic data:
# synthetic SEED slides -> per-hospital tiles -> a short federation -> the per-hospital table.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
gfl=.venv/bin/gastric-fl
$gfl synth --format seed --images 60 --seed 0 --difficulty 0.3 --out data/raw/quickstart --overwrite
# Tiles overlap (stride 64, half a tile): on the default gastric tissue a model has to read glands and cells,
# which takes more tiles and rounds than darkness did (docs/synthetic-data.md, "Patterns").
$gfl prepare --format seed --input data/raw/quickstart --out data/prepared/quickstart --clients 3 \
    --tile 128 --stride 64 --seed 0 --grayscale-clients 2 --overwrite
$gfl train --config configs/demo.toml --data data/prepared/quickstart --out data/runs/quickstart --overwrite \
    --set run.rounds=10
$gfl report data/runs/quickstart
