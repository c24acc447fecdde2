#!/usr/bin/env bash
# The deployment as separate sites on one machine (run as root):
#
#   sudo bash scripts/multisite_lab.sh [--data DIR] [--config FILE] [--rounds N] [--set KEY=VALUE]... [--out DIR]
#                                      [--work DIR]
#
# One network namespace and one Unix user per site: the server (its gate on 10.231.0.1:8000, the SuperLink on the
# server's own 127.0.0.1) and one hospital per client of --data (10.231.0.10, .11, ...). The sites are joined by a
# bridge in a namespace of their own: no site has a route out of the lab, and nothing is added to this machine's
# own network. Each site's home is 0700 and holds only what that site would hold: the server its kit folder, each
# hospital its kit bundle and its own slides' tiles (a dataset of its own, `federation.hospital.data.extract_hospital`).
# The operator submits the run as the server's user, in the server's namespace. The same job is trained in-process
# first; the script fails unless the deployed per-round metrics are identical, and it checks the isolation it
# claims (each site reads its own files and none of another's: homes, tiles, the lab's dataset, the reference's
# metrics and the console logs; no route out; every hospital's outbound log intact).
#
# Everything it made is removed at the end, whatever happens (processes by their process groups, namespaces,
# users, the lab folder in --work, default /tmp); what it keeps is --out (default data/runs/multisite_lab): the
# two runs' metrics, the deployed run directory, every site's log, and lab.txt with the checks.
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$(pwd)

data="" config="configs/demo.toml" rounds=2 out="data/runs/multisite_lab" work=/tmp sets=()
while [ $# -gt 0 ]; do
    case "$1" in
        --data) data="$2"; shift 2 ;;
        --config) config="$2"; shift 2 ;;
        --rounds) rounds="$2"; shift 2 ;;
        --set) sets+=("$2"); shift 2 ;;
        --out) out="$2"; shift 2 ;;
        --work) work="$2"; shift 2 ;;
        -h|--help) sed -n '2,18p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
        *) echo "error: unknown argument $1 (see --help)" >&2; exit 2 ;;
    esac
done
if [ "$(id -u)" -ne 0 ]; then
    echo "error: the lab makes network namespaces and Unix users: run it as root (sudo bash $0 ...)" >&2
    exit 2
fi
for program in ip runuser setsid useradd userdel; do
    command -v "$program" >/dev/null || { echo "error: $program is missing (iproute2, util-linux, passwd)" >&2; exit 2; }
done
[ -f "$config" ] || { echo "error: --config $config is not a file" >&2; exit 2; }
if ! [[ "$rounds" =~ ^[1-9][0-9]*$ ]]; then
    echo "error: --rounds $rounds is not a positive whole number" >&2
    exit 2
fi
[ -x .venv/bin/python ] || bash scripts/setup.sh
bash scripts/apt_install.sh nginx-light nginx "the server's gate"
command -v nginx >/dev/null || [ -x /usr/sbin/nginx ] || { echo "error: nginx is missing (apt-get install nginx-light)" >&2; exit 2; }
py="$repo/.venv/bin/python"
gfl="$repo/.venv/bin/gastric-fl"

tag="gfl-lab-$$"
if ! runuser -u nobody -- test -x "$work"; then
    echo "error: --work $work cannot be entered by other users: name a folder every site's user can pass (/tmp)" >&2
    exit 2
fi
lab=$(mktemp -d "$work/$tag.XXXXXX")
chmod 0755 "$lab"  # every site passes through it to its own 0700 home and to the runtime
private="$lab/private"  # what only the lab itself reads: the slides, the prepared dataset, each hospital's extract
mkdir -m 0700 "$private"
groups=()   # the process group of every site process
namespaces=()
users=()
teardown() {
    local status=$?
    set +e
    for g in "${groups[@]}"; do kill -TERM -- "-$g" 2>/dev/null; done
    for _ in $(seq 60); do
        alive=0
        for g in "${groups[@]}"; do kill -0 -- "-$g" 2>/dev/null && alive=1; done
        [ "$alive" -eq 0 ] && break
        sleep 1
    done
    for g in "${groups[@]}"; do kill -KILL -- "-$g" 2>/dev/null; done
    for u in "${users[@]}"; do
        pkill -KILL -u "$u" 2>/dev/null  # nothing of a lab user outlives the lab (its uid is the lab's own)
        userdel "$u" 2>/dev/null
    done
    for n in "${namespaces[@]}"; do ip netns del "$n" 2>/dev/null; done
    rm -rf "$lab"
    exit "$status"
}
trap teardown EXIT
trap 'exit 130' INT TERM

if [ -d "$out" ] && [ -n "$(ls -A "$out")" ] && [ ! -f "$out/.multisite-lab" ]; then
    echo "error: --out $out holds files the lab did not write: name an empty or new folder" >&2
    exit 2
fi
mkdir -p "$out"
out=$(cd "$out" && pwd)
touch "$out/.multisite-lab"
rm -rf "$out/logs" "$out/in-process" "$out/deployed" "$out/lab.txt"  # an earlier lab's, never anything else
mkdir -p -m 0700 "$out/logs"  # the sites' console logs: read by the lab only, never by another site
report() { echo "$*" | tee -a "$out/lab.txt"; }

# --- the data: a multi-hospital prepared dataset (default: the quick start's synthetic slides) ---
if [ -z "$data" ]; then
    data="$private/prepared"
    "$gfl" synth --format seed --images 60 --seed 0 --difficulty 0.3 --out "$private/raw" >/dev/null
    "$gfl" prepare --format seed --input "$private/raw" --out "$data" --clients 3 --tile 128 --seed 0 \
        --grayscale-clients 2 >/dev/null
fi
[ -f "$data/manifest.csv" ] || { echo "error: --data $data is not a prepared dataset (no manifest.csv)" >&2; exit 2; }
data=$(cd "$data" && pwd)
hospitals=$("$py" -c "import sys; from federation.hospital.data import read_dataset; rows, _ = read_dataset(sys.argv[1]); \
print(len({r.hospital for r in rows}))" "$data")
settings=(--set "run.rounds=$rounds")
for s in "${sets[@]}"; do settings+=(--set "$s"); done

# --- the reference: the same job in-process ---
mkdir -p -m 0700 "$out/in-process"  # the reference's figures: the lab's, not any site's
"$gfl" train --config "$config" --data "$data" --out "$out/in-process" "${settings[@]}" -q --overwrite \
    >"$out/logs/in-process.log" 2>&1
chmod 0700 "$out/in-process"

# --- a runtime every site's user can run: this virtual environment and its interpreter, if they are not already ---
runtime="$repo/.venv"
export PYTHONPATH="" LD_LIBRARY_PATH=""
if ! (cd / && runuser -u nobody -- "$py" -c "import ssl, torch, federation") >/dev/null 2>&1; then
    # (e.g. the interpreter lives under root's 0700 home): the interpreter and the environment as hard links where
    # the file system allows (else copies), the project's code as a copy, the entry points' first lines pointing to
    # the copy. Files are replaced, never edited, so the originals stay untouched.
    base=$("$py" -c "import sys; print(sys.base_prefix)")
    mkdir -p "$lab/runtime"
    cp -al "$base" "$lab/runtime/python" 2>/dev/null || cp -a "$base" "$lab/runtime/python"
    cp -al "$repo/.venv" "$lab/runtime/venv" 2>/dev/null || cp -a "$repo/.venv" "$lab/runtime/venv"
    runtime="$lab/runtime/venv"
    version=$("$py" -c "import sys; print(f'{sys.version_info[0]}.{sys.version_info[1]}')")
    for link in "$runtime"/bin/python*; do
        if [ -L "$link" ]; then ln -sfn "$lab/runtime/python/bin/python$version" "$link"; fi
    done
    sed "s|^home = .*|home = $lab/runtime/python/bin|" "$repo/.venv/pyvenv.cfg" >"$lab/pyvenv.cfg"
    rm "$runtime/pyvenv.cfg" && mv "$lab/pyvenv.cfg" "$runtime/pyvenv.cfg"
    for script in "$runtime"/bin/*; do
        [ -f "$script" ] && [ ! -L "$script" ] || continue
        if head -c 200 "$script" | head -n 1 | grep -q "^#!$repo/.venv/bin/python"; then
            sed "1s|^#!$repo/.venv/bin/python|#!$runtime/bin/python|" "$script" >"$script.new"
            chmod 0755 "$script.new" && rm "$script" && mv "$script.new" "$script"
        fi
    done
    mkdir -p "$lab/runtime/src"
    for package in app pipeline federation models inference infra; do cp -a "$repo/$package" "$lab/runtime/src/"; done
    export PYTHONPATH="$lab/runtime/src"  # before the editable install's finder, which names this checkout
    export LD_LIBRARY_PATH="$lab/runtime/python/lib"  # a shared libpython is found where it was built, else here
    (cd / && runuser -u nobody -- env PYTHONPATH="$PYTHONPATH" LD_LIBRARY_PATH="$LD_LIBRARY_PATH" \
        "$runtime/bin/python" -c "import ssl, torch, federation") \
        || { echo "error: the lab's runtime copy in $lab/runtime does not run as another user" >&2; exit 1; }
fi

# --- the sites: a user, a 0700 home and a network namespace each, joined by a bridge in the lab's own namespace ---
hub="$tag-hub"
ip netns add "$hub"
namespaces+=("$hub")
ip -n "$hub" link add br0 type bridge
ip -n "$hub" link set br0 up
sites=(server)
for ((c = 0; c < hospitals; c++)); do sites+=("h$c"); done
declare -A address user home
for i in "${!sites[@]}"; do
    site=${sites[$i]}
    ns="$tag-$site"
    address[$site]="10.231.0.$([ "$site" = server ] && echo 1 || echo $((10 + i - 1)))"
    ip netns add "$ns"
    namespaces+=("$ns")
    ip -n "$hub" link add "v$site" type veth peer name eth0 netns "$ns"
    ip -n "$hub" link set "v$site" master br0 up
    ip -n "$ns" addr add "${address[$site]}/24" dev eth0
    ip -n "$ns" link set eth0 up
    ip -n "$ns" link set lo up
    user[$site]="$tag-$site"
    home[$site]="$lab/home/$site"
    mkdir -p "${home[$site]}"
    useradd --system --user-group --no-create-home --home-dir "${home[$site]}" --shell /usr/sbin/nologin \
        "${user[$site]}"
    users+=("${user[$site]}")
done
chmod 0711 "$lab/home"

"$gfl" federation init --out "$lab/kit" --hospitals "$hospitals" --host "${address[server]}" --port 8000 \
    >"$out/logs/init.log"
cp -a "$lab/kit/server" "${home[server]}/kit"
cp "$config" "${home[server]}/config.toml"
for ((c = 0; c < hospitals; c++)); do
    site="h$c"
    cp -a "$lab/kit/hospitals/client_$(printf %02d "$c")" "${home[$site]}/bundle"
    "$py" -c "import sys; from pathlib import Path; from federation.hospital.data import extract_hospital; \
extract_hospital(sys.argv[1], int(sys.argv[2]), Path(sys.argv[3]))" "$data" "$c" "$private/extract-$c"
    cp -r "$private/extract-$c" "${home[$site]}/data"  # new files: the lab's copies, never links to --data
done
rm -rf "$lab/kit" "$private"/extract-*
for site in "${sites[@]}"; do
    mkdir -p "${home[$site]}/tmp"
    chown -R "${user[$site]}:${user[$site]}" "${home[$site]}"
    chmod 0700 "${home[$site]}"
done

# run SITE LOG COMMAND...: COMMAND as SITE's user in SITE's namespace, in a process group of its own
# Besides its user and namespace, each site sees an empty, unreadable folder where the lab's dataset (--data, which
# may be world-readable where it lives) and its outputs (--out) are: `ip netns exec` gives the command a mount
# namespace of its own (mounts made in it do not reach this machine), where these are covered before the site's
# user starts.
as_site() {
    local site=$1
    shift
    ip netns exec "$tag-$site" sh -c 'for d in "$0" "$1"; do mount -t tmpfs -o size=4k,mode=000 lab-hidden "$d"; done
        shift; exec "$@"' "$data" "$out" \
        runuser -u "${user[$site]}" -- env -i HOME="${home[$site]}" \
        TMPDIR="${home[$site]}/tmp" PATH="$runtime/bin:/usr/sbin:/usr/bin:/sbin:/bin" LANG=C.UTF-8 \
        PYTHONPATH="$PYTHONPATH" LD_LIBRARY_PATH="$LD_LIBRARY_PATH" "$@"
}
start() {
    local site=$1 log=$2
    shift 2
    setsid bash -c "$(declare -f as_site); $(declare -p tag user home runtime data out PYTHONPATH LD_LIBRARY_PATH); as_site \"\$@\"" \
        lab "$site" "$@" >"$out/logs/$log.log" 2>&1 &
    groups+=("$!")
}
wait_for() {  # wait_for LOG TEXT SECONDS
    for _ in $(seq "$3"); do
        grep -q "$2" "$out/logs/$1.log" 2>/dev/null && return 0
        sleep 1
    done
    echo "error: '$2' not in $out/logs/$1.log after $3 s:" >&2
    tail -n 20 "$out/logs/$1.log" >&2
    return 1
}

start server server "$runtime/bin/gastric-fl" federation server --kit "${home[server]}/kit" \
    --host "${address[server]}" --port 8000 --control-port 8001 --state "${home[server]}/state"
wait_for server "registered client_$(printf %02d $((hospitals - 1)))" 180
for ((c = 0; c < hospitals; c++)); do
    start "h$c" "hospital$c" "$runtime/bin/gastric-fl" federation hospital --data "${home[h$c]}/data" \
        --bundle "${home[h$c]}/bundle" --state "${home[h$c]}/state"
done

# --- the operator: the server's user, on the server's own address of the SuperLink ---
began=$(date +%s)
as_site server timeout 1800 "$runtime/bin/gastric-fl" train --engine flower --superlink 127.0.0.1:8001 \
    --kit "${home[server]}/kit" --config "${home[server]}/config.toml" --out "${home[server]}/runs/lab" \
    --set "flower.hospitals=$hospitals" "${settings[@]}" -q >"$out/logs/train.log" 2>&1 \
    || { echo "error: the deployed run failed:" >&2; tail -n 20 "$out/logs/train.log" >&2; exit 1; }
seconds=$(($(date +%s) - began))
cp -r "${home[server]}/runs/lab" "$out/deployed"
chmod 0700 "$out/deployed"  # the server's run: the lab's to compare, not the hospitals' to read

# --- the checks ---
failed=0
check() {  # check WHAT COMMAND...: the command must succeed
    local what=$1
    shift
    if "$@" >/dev/null 2>&1; then report "ok: $what"; else report "FAILED: $what"; failed=1; fi
}
refused() {  # refused WHAT COMMAND...: the command must fail
    local what=$1
    shift
    if "$@" >/dev/null 2>&1; then report "FAILED: $what"; failed=1; else report "ok: $what"; fi
}
report "lab: $hospitals hospitals and a server, $rounds rounds, deployed run ${seconds} s (operator's train)"
check "deployed per-round metrics identical to in-process" "$py" -c "import json, sys
def load(p): return [{k: v for k, v in json.loads(x).items() if k != 'seconds'} for x in open(p)]
a, b = load(sys.argv[1]), load(sys.argv[2])
sys.exit(0 if a == b and len(a) > 0 else 1)" "$out/in-process/metrics.jsonl" "$out/deployed/metrics.jsonl"
for site in "${sites[@]}"; do
    check "$site's home is 0700" test "$(stat -c %a "${home[$site]}")" = 700
done
# a refusal below means something only because the same command on a site's own files succeeds
check "h0's user reads its own tiles" as_site h0 cat "${home[h0]}/data/manifest.csv"
check "the server's user reads its own run" as_site server cat "${home[server]}/runs/lab/metrics.jsonl"
refused "h0's user cannot list h1's home" as_site h0 ls "${home[h1]}"
refused "h0's user cannot read h1's tiles" as_site h0 cat "${home[h1]}/data/manifest.csv"
refused "h0's user cannot read the lab's dataset (every hospital's tiles)" as_site h0 cat "$data/manifest.csv"
refused "the server's user cannot read the lab's dataset" as_site server cat "$data/manifest.csv"
refused "h0's user cannot read the in-process reference's metrics" as_site h0 cat "$out/in-process/metrics.jsonl"
refused "h0's user cannot read h1's console log" as_site h0 cat "$out/logs/hospital1.log"
refused "h0's user cannot read the server's console log" as_site h0 cat "$out/logs/server.log"
refused "h0's user cannot read the lab's private folder" as_site h0 ls "$private"
refused "h0's user cannot list the server's home" as_site h0 ls "${home[server]}"
refused "the server's user cannot list h0's home" as_site server ls "${home[h0]}"
refused "h0 has no route out of the lab" as_site h0 "$runtime/bin/python" -c "import socket
socket.create_connection(('192.0.2.1', 443), timeout=3)"
check "h0 reaches the server's gate" as_site h0 "$runtime/bin/python" -c "import socket
socket.create_connection(('${address[server]}', 8000), timeout=3)"
refused "h0 cannot reach the SuperLink's control port" as_site h0 "$runtime/bin/python" -c "import socket
socket.create_connection(('${address[server]}', 8001), timeout=3)"
audit_site() {  # audit_site C: hospital C audits its log against its anchor; the report goes to logs/audit-hC.txt
    as_site "h$1" "$runtime/bin/gastric-fl" federation audit --state "${home[h$1]}/state" \
        --anchor "${home[h$1]}/anchors.json" --hospital "$1" >"$out/logs/audit-h$1.txt" 2>&1
}
for ((c = 0; c < hospitals; c++)); do
    # the operator hands each hospital the server's record of its outbound log's head (the run's anchors.json):
    # its log must still hold it, end included
    install -m 0600 -o "${user[h$c]}" -g "${user[h$c]}" "${home[server]}/runs/lab/anchors.json" "${home[h$c]}/anchors.json"
    check "h$c's outbound log is intact" audit_site "$c"  # one audit: its exit code checked, its report kept
    check "h$c kept its exported model at home" test -f "${home[h$c]}/state/runs/lab/model.safetensors"
done
refused "no hospital's folder in the server's run directory" test -e "$out/deployed/hospitals"
if [ "$failed" -ne 0 ]; then
    echo "error: the lab's checks failed (see $out/lab.txt)" >&2
    exit 1
fi
report "all checks passed; results in $out"
