#!/usr/bin/env bash
# Install one Debian package the tests need, if its program is missing: scripts/apt_install.sh PACKAGE PROGRAM WHY
# (PROGRAM may be an absolute path, e.g. a data folder the package installs: then its existence is checked.)
# Needs root or passwordless sudo; otherwise (or without apt-get) it says what to install and exits 0, so that the
# rest of the checks still run and the test that needs the program fails saying why. A package's own service is
# never started (policy-rc.d), so nothing keeps running after the install.
set -euo pipefail
package="$1" program="$2" why="$3"
if [ "${program#/}" != "$program" ]; then
    [ -e "$program" ] && exit 0
elif command -v "$program" >/dev/null 2>&1 || [ -x "/usr/bin/$program" ] || [ -x "/usr/sbin/$program" ]; then
    exit 0
fi
if [ "$(id -u)" -eq 0 ]; then
    as_root=()
elif command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then
    as_root=(sudo -n)
else
    echo "$program is missing: install it with 'sudo apt-get install -y $package' ($why)." >&2
    exit 0
fi
if ! command -v apt-get >/dev/null 2>&1; then
    echo "$program is missing and apt-get is not available: install $package ($why)." >&2
    exit 0
fi
export DEBIAN_FRONTEND=noninteractive
policy=/usr/sbin/policy-rc.d
made_policy=0
if [ ! -e "$policy" ]; then
    printf '#!/bin/sh\nexit 101\n' | "${as_root[@]}" tee "$policy" >/dev/null
    "${as_root[@]}" chmod +x "$policy"
    made_policy=1
fi
if "${as_root[@]}" apt-get update -qq && "${as_root[@]}" apt-get install -y -qq "$package" >/dev/null; then
    echo "installed $package"
else
    echo "could not install $package with apt-get; install it by hand ($why)." >&2
fi
if [ "$made_policy" -eq 1 ]; then
    "${as_root[@]}" rm -f "$policy"
fi
