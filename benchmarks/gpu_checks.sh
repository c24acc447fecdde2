#!/usr/bin/env bash
# The GPU checks of issue 32 that are still open, in order of importance, each under its own time limit, for a
# machine with a CUDA GPU and the project's dependencies (run from the repository root):
#   1. benchmarks/gpu_throughput.py: the product's loop against the bare loop, with the split rows (about 3 min);
#   2. benchmarks/first_round.py: where a run's first round goes (79 s against 12-18 s on an H200; under a minute);
#   3. benchmarks/gpu_preset.py: configs/seed_gpu.toml against configs/seed.toml over 3 seeds (about 5 min; it
#      resumes from the runs kept under benchmarks/results/gpu_preset_runs/, so a cut run continues next time);
#   4. benchmarks/gpu_memory.py --variants 3: two bf16 workers at batch 256 (about 1 min).
# Each writes its result as it finishes (benchmarks/results/); a check cut by its limit leaves what it wrote.
#   bash benchmarks/gpu_checks.sh [OUT]     # OUT: where the logs go (default /tmp/gfl_gpu_checks)
set -u
cd "$(dirname "$0")/.."
out=${1:-/tmp/gfl_gpu_checks}
mkdir -p "$out"
python=${PYTHON:-python3}
run() {  # run NAME LIMIT COMMAND...: one check, its log, its exit status
    local name=$1 limit=$2
    shift 2
    local start=$SECONDS
    timeout -s INT "$limit" "$@" >"$out/$name.log" 2>&1
    echo "$name: exit $? after $((SECONDS - start)) s" | tee -a "$out/status.txt"
}
nvidia-smi --query-gpu=name,memory.used,utilization.gpu --format=csv >"$out/gpu.txt" 2>&1
run throughput 240 "$python" benchmarks/gpu_throughput.py
run first_round 120 "$python" benchmarks/first_round.py
run preset 420 "$python" benchmarks/gpu_preset.py --variants seed,seed_gpu
run memory 120 "$python" benchmarks/gpu_memory.py --variants 3 --out benchmarks/results/gpu_memory_bf16_2.md
