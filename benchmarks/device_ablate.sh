#!/usr/bin/env bash
# Run gastric-fl commands (synth, prepare, ablate, ...) on a machine where the project is not installed and nothing
# can be downloaded, e.g. a GPU machine whose python3 already has torch, torchvision, timm, numpy, scipy, OpenCV, ...
# The packages it lacks travel as wheels in .whl/ (ignored by git: .git/info/exclude), installed into /tmp/site;
# the project itself is imported from this checkout (PYTHONPATH), and `python3 -m app.cli` stands for `gastric-fl`.
#
#   bash benchmarks/device_ablate.sh OUT [--] ARGS... [-- ARGS...]...
#
# Each `--`-separated group of ARGS is one gastric-fl command, run in order from the repository root, e.g.
#   bash benchmarks/device_ablate.sh /tmp/out \
#     -- synth --format seed --images 120 --seed 1 --difficulty 0.4 --out data/raw/seed_like \
#     -- prepare --format seed --input data/raw/seed_like --out data/prepared/seed_like --clients 5 --sizes 3,2,2,1,1 \
#        --partition dirichlet:2.0 --grayscale-clients 1,4 --client-scale 1,1,0.75,1,1 --site-shift random \
#        --site-strength 1 --tile 128 --seed 0 \
#     -- ablate --config configs/tables456_seed_like.toml --out data/ablations/t456_cuda --workers 8 \
#        --set run.device=cuda --quiet
# (ablate's dataset: the run preset's data.path, or --data DIR / --set data.path=DIR.)
#
# OUT (a relative path is taken from the repository root) receives at most four files, so that all of them come back
# from a machine that returns only a few: env.txt (GPUs, CPUs, versions, the wheels installed, an import check),
# log.txt (every command's output), status.txt (one line per command: its exit status and seconds; written as each
# ends) and, with DEVICE_KEEP, results.tgz.
# Environment:
#   PYTHON            the interpreter (default python3)
#   DEVICE_WHEELS     the wheel folder (default .whl; absent or empty: nothing installed)
#   DEVICE_SITE       where the wheels go (default /tmp/site)
#   DEVICE_DEADLINE_S seconds from the start after which no command starts and a running one gets SIGINT (ablate
#                     then stops, resumable) and SIGKILL 20 s later; default none. Keep it under the call's limit.
#   DEVICE_KEEP       space-separated paths (e.g. data/ablations/t456_cuda) packed into OUT/results.tgz at the end,
#                     without model weights (*.safetensors)
#   DEVICE_KEEP_GOING 1: run the later commands after one fails (default: they are skipped)
# Exit status: 0 when every command exited 0; 3 when the import check failed (no command run); else the first
# failing command's status.
set -u
cd "$(dirname "$0")/.."
repo=$PWD
[ $# -ge 1 ] || { echo "usage: bash benchmarks/device_ablate.sh OUT [--] ARGS... [-- ARGS...]..." >&2; exit 2; }
out=$(realpath -m "$1")
shift
mkdir -p "$out"
: >"$out/status.txt"
: >"$out/log.txt"
: >"$out/env.txt"
python=${PYTHON:-python3}
wheels=${DEVICE_WHEELS:-.whl}
site=${DEVICE_SITE:-/tmp/site}
deadline=${DEVICE_DEADLINE_S:-}
start=$SECONDS
export PYTHONUNBUFFERED=1

# (a) the wheels: one already installed at the same or a newer version is kept (typer only below 0.21, the
# project's pin), so the carried typing_extensions never replaces a newer one there
if compgen -G "$wheels/*.whl" >/dev/null; then
    pick=$("$python" - "$wheels" 2>>"$out/env.txt" <<'EOF'
import sys
from importlib import metadata
from pathlib import Path

from packaging.utils import canonicalize_name, parse_wheel_filename
from packaging.version import Version

for wheel in sorted(Path(sys.argv[1]).glob("*.whl")):
    name, version, _, _ = parse_wheel_filename(wheel.name)
    try:
        have = Version(metadata.version(name))
    except metadata.PackageNotFoundError:
        have = None
    pinned_out = canonicalize_name(name) == "typer" and have is not None and have >= Version("0.21")
    if have is not None and have >= version and not pinned_out:
        print(f"# {wheel.name}: kept the installed {name} {have}", file=sys.stderr)
        continue
    print(wheel)
EOF
    ) || pick=$(printf '%s\n' "$wheels"/*.whl)  # no packaging module there: every wheel
    mapfile -t picked < <(printf '%s\n' "$pick" | grep .)
    if [ ${#picked[@]} -gt 0 ]; then
        "$python" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$site" \
            "${picked[@]}" >>"$out/env.txt" 2>&1 || { echo "wheel install failed (env.txt)" | tee -a "$out/status.txt"; exit 3; }
        printf 'installed into %s: %s\n' "$site" "${picked[*]##*/}" >>"$out/env.txt"
    fi
    export PYTHONPATH=$site:$repo${PYTHONPATH:+:$PYTHONPATH}
else
    echo "no wheels in $wheels: nothing installed" >>"$out/env.txt"
    export PYTHONPATH=$repo${PYTHONPATH:+:$PYTHONPATH}
fi

# (c) the machine and the versions
{
    echo "== nvidia-smi -L"; nvidia-smi -L 2>&1
    echo "== nproc: $(nproc)"
    echo "== memory"; free -g 2>&1 | head -2
    echo "== python: $(command -v "$python") $("$python" --version 2>&1)"
    echo "== PYTHONPATH=$PYTHONPATH"
    "$python" - <<'EOF' 2>&1
from importlib import metadata

import torch

print("torch", torch.__version__, "cuda", torch.version.cuda, "available", torch.cuda.is_available(),
      torch.cuda.get_device_name(0) if torch.cuda.is_available() else "")
for name in ("torchvision", "timm", "numpy", "scipy", "scikit-learn", "opencv-python-headless", "pillow", "tifffile",
             "safetensors", "albumentations", "albucore", "pydantic", "pydantic-core", "simsimd", "stringzilla",
             "svgelements", "typer", "click", "rich", "typing_extensions", "huggingface-hub", "matplotlib"):
    try:
        print(f"{name} {metadata.version(name)}")
    except metadata.PackageNotFoundError:
        print(f"{name} MISSING")
EOF
    # (b) the project importable as gastric-fl's commands and ablate's worker processes import it
    echo "== import check"
    "$python" -c "import app.cli, federation.launch, federation.ablation, federation.ablation.cells, \
federation.server.loop, federation.hospital.trainer, federation.hospital.data, pipeline.synth, pipeline.prepare, models.registry, timm, \
scipy.stats, matplotlib.pyplot, safetensors.torch; print('import check ok')" 2>&1
} >>"$out/env.txt"
if ! grep -q "^import check ok" "$out/env.txt"; then
    echo "import check failed (env.txt): no command run" | tee -a "$out/status.txt"
    exit 3
fi

# (d) the commands, in order
first_failure=0
skipping=0
run_one() {  # run_one ARGS...: one gastric-fl command, its output in log.txt, its status in status.txt
    local line="gastric-fl $*" began=$SECONDS limit=() rc
    if [ "$skipping" = 1 ]; then
        echo "skipped (an earlier command failed): $line" | tee -a "$out/status.txt"
        return
    fi
    if [ -n "$deadline" ]; then
        local left=$((deadline - (SECONDS - start)))
        if [ "$left" -le 0 ]; then
            echo "skipped (DEVICE_DEADLINE_S reached): $line" | tee -a "$out/status.txt"
            return
        fi
        limit=(timeout -s INT -k 20 "$left")
    fi
    echo "== $line" | tee -a "$out/log.txt"
    set -o pipefail
    "${limit[@]}" "$python" -m app.cli "$@" 2>&1 | tee -a "$out/log.txt"
    rc=$?
    set +o pipefail
    echo "exit $rc after $((SECONDS - began)) s: $line" | tee -a "$out/status.txt"
    if [ "$rc" != 0 ]; then
        [ "$first_failure" = 0 ] && first_failure=$rc
        [ "${DEVICE_KEEP_GOING:-0}" = 1 ] || skipping=1
    fi
}
[ "${1:-}" = "--" ] && shift
args=()
for arg in "$@"; do
    if [ "$arg" = "--" ]; then
        [ ${#args[@]} -gt 0 ] && run_one "${args[@]}"
        args=()
    else
        args+=("$arg")
    fi
done
[ ${#args[@]} -gt 0 ] && run_one "${args[@]}"

if [ -n "${DEVICE_KEEP:-}" ]; then
    # shellcheck disable=SC2086  # DEVICE_KEEP is a list of paths
    tar -czf "$out/results.tgz" --exclude='*.safetensors' $DEVICE_KEEP 2>>"$out/status.txt" \
        && echo "results.tgz: $(du -h "$out/results.tgz" | cut -f1) ($DEVICE_KEEP, no weights)" >>"$out/status.txt"
fi
echo "total $((SECONDS - start)) s" >>"$out/status.txt"
exit "$first_failure"
