#!/usr/bin/env bash
# The GPU checks of issue 32 that are still open, in order of importance, each under its own time limit, for a
# machine with a CUDA GPU and the project's dependencies (run from the repository root):
#   1. benchmarks/gpu_throughput.py: the product's loop against the bare loop, with the split rows (3-4 min);
#   2. benchmarks/first_round.py: where a run's first round goes (79 s against 12-18 s on an H200: 7-9 s a hospital
#      whatever its tile count; is it per batch shape, and is it cuDNN's? under a minute);
#   3. benchmarks/gpu_preset.py: configs/seed_gpu.toml against configs/seed.toml over 3 seeds (about 3 min for the
#      two missing seeds: it resumes from the runs kept under benchmarks/results/gpu_preset_runs/);
#   4. benchmarks/gpu_memory.py --variants 3: two bf16 workers at batch 256 (about 1 min);
#   5. benchmarks/gpu_preset.py with the batch-128 variant, which lost less accuracy on the CPU
#      (benchmarks/results/gpu_preset_cpu.md), on the GPU (about 3 min).
# Each writes its result as it finishes (benchmarks/results/); a check cut by its limit leaves what it wrote. After
# each check, every file under benchmarks/results/ written since the script started is copied to OUT/results/ (same
# relative paths), so a machine taken back mid-way has already handed over the checks that finished.
#   bash benchmarks/gpu_checks.sh [OUT] [CHECKS]   # OUT: logs and results (default /tmp/gfl_gpu_checks; a relative
#   path is taken from the repository root);
#   CHECKS: which, in order (default "throughput first_round preset memory preset128": at most 14.2 min of limits,
#   so split them over two calls where one command may run 10 min)
set -u
cd "$(dirname "$0")/.."
out=$(realpath -m "${1:-/tmp/gfl_gpu_checks}")  # absolute: collect reads it from benchmarks/results
checks=${2:-throughput first_round preset memory preset128}
mkdir -p "$out/results"
touch "$out/.started"
python=${PYTHON:-python3}
collect() {  # the results written since the start, into OUT/results/
    (cd benchmarks/results && find . -type f -newer "$out/.started" -exec cp --parents {} "$out/results/" \;)
}
run() {  # run NAME LIMIT COMMAND...: one check (when CHECKS names it), its log, its exit status
    local name=$1 limit=$2
    shift 2
    case " $checks " in *" $name "*) ;; *) return ;; esac
    local start=$SECONDS
    timeout -s INT "$limit" "$@" >"$out/$name.log" 2>&1
    echo "$name: exit $? after $((SECONDS - start)) s" | tee -a "$out/status.txt"
    collect
}
nvidia-smi --query-gpu=name,memory.used,utilization.gpu --format=csv >"$out/gpu.txt" 2>&1
run throughput 230 "$python" benchmarks/gpu_throughput.py
run first_round 90 "$python" benchmarks/first_round.py --runs benchmarks/results/gpu_preset_runs/* \
    benchmarks/results/gpu_preset_runs_cpu/*
run preset 240 "$python" benchmarks/gpu_preset.py --variants seed,seed_gpu
run memory 90 "$python" benchmarks/gpu_memory.py --variants 3 --out benchmarks/results/gpu_memory_bf16_2.md
run preset128 200 "$python" benchmarks/gpu_preset.py --variants seed,seed_gpu,seed_gpu_batch128
