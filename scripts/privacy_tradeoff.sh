#!/usr/bin/env bash
# Accuracy against epsilon for FedSAF, FedAvg and FedRep, Separate without DP as the floor (issue 22,
# docs/privacy.md). 3 seeds; about 40 minutes on 2 CPU cores (39 runs, two at once; WORKERS=N to change).
#
# Tiles cut from raw tissue and judged on raw test tiles (issue 30): data/prepared/honest_privacy_raw ->
# results/honest_privacy. The masked-tile record in results/privacy was made by this script before issue 30
# (prepare then painted everything outside the cancer mask white in training and test tiles); its COMMAND.md files
# name the commit.
#
#   1. 300 synthetic SEED slides over 3 hospitals: 112, 75 and 53 training slides (28, 19, 13 for testing; no
#      validation split, so both versions train and test on the same slides);
#   2. four ablations: no DP (FedRep, FedSAF; Separate, FedAvg with 2 epochs so that every method takes the
#      same steps), and DP at epsilon 1, 3 and 8 (delta 1e-5, 30 DP-SGD steps of Poisson rate 0.3 over slides,
#      clip norm 1; the noise multipliers below are Opacus's get_noise_multiplier for those settings);
#   3. the table with paired differences over seeds: scripts/privacy_table.py -> <published folder>/results.md.
set -euo pipefail
cd "$(dirname "$0")/.."
gfl=.venv/bin/gastric-fl
data=data/prepared/honest_privacy_raw runs=data/ablations/honest_privacy published=results/honest_privacy
$gfl synth --format seed --images 300 --seed 1 --difficulty 0.3 --out data/raw/privacy --overwrite
$gfl prepare --format seed --input data/raw/privacy --out "$data" --clients 3 --tile 128 --seed 0 \
    --val-fraction 0 --overwrite
# (the grid's noise multiplier replaces the one set here, which only makes the base configuration a DP one)
DP=(--set privacy.noise_multiplier=1.3538 --set privacy.max_grad_norm=1.0 --set privacy.sample_rate=0.3)
SIGMAS=6.9531,2.7539,1.3538   # epsilon 1, 3, 8 at delta 1e-5 after 30 steps of rate 0.3 (Opacus RDP)
TWO_EPOCHS=(--set client.epochs=2 --set client.head_epochs=0)
W=(--workers "${WORKERS:-2}")   # cells at once: the figures are those of one after another
$gfl ablate --config configs/privacy_tradeoff.toml --data "$data" --grid strategy.name=fedrep,fedsaf --seeds 3 "${W[@]}" \
    --out "${runs}_none_head" --publish "$published/none_head"
$gfl ablate --config configs/privacy_tradeoff.toml --data "$data" --grid strategy.name=separate,fedavg --seeds 3 "${W[@]}" \
    "${TWO_EPOCHS[@]}" --out "${runs}_none_plain" --publish "$published/none_plain"
$gfl ablate --config configs/privacy_tradeoff.toml --data "$data" --grid strategy.name=fedrep,fedsaf \
    --grid privacy.noise_multiplier=$SIGMAS --seeds 3 "${W[@]}" "${DP[@]}" \
    --out "${runs}_dp_head" --publish "$published/dp_head"
$gfl ablate --config configs/privacy_tradeoff.toml --data "$data" --grid strategy.name=fedavg \
    --grid privacy.noise_multiplier=$SIGMAS --seeds 3 "${W[@]}" "${DP[@]}" "${TWO_EPOCHS[@]}" \
    --out "${runs}_dp_plain" --publish "$published/dp_plain"
.venv/bin/python scripts/privacy_table.py "$published"
