#!/usr/bin/env bash
# Install Debian's Chromium for the dashboard's end-to-end browser test (tests/app, marker `browser`).
# Never downloads a browser build of its own: the test drives /usr/bin/chromium through Playwright.
set -euo pipefail
if [ -x /usr/bin/chromium ]; then
    exit 0
fi
if [ "$(id -u)" -eq 0 ]; then
    as_root=()
elif command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then
    as_root=(sudo -n)
else
    echo "chromium is missing: install it with 'sudo apt-get install -y chromium' to run the browser test" \
        "(pytest -m browser); the other tests do not need it." >&2
    exit 0
fi
if ! command -v apt-get >/dev/null 2>&1; then
    echo "chromium is missing and apt-get is not available: install Chromium so that /usr/bin/chromium exists" \
        "to run the browser test (pytest -m browser)." >&2
    exit 0
fi
export DEBIAN_FRONTEND=noninteractive
# A failed install must not stop the rest of the checks: the browser test then fails and says why.
if "${as_root[@]}" apt-get update -qq && "${as_root[@]}" apt-get install -y -qq chromium >/dev/null; then
    echo "installed $(/usr/bin/chromium --version 2>/dev/null || echo chromium)"
else
    echo "could not install chromium with apt-get; install it by hand (apt-get install -y chromium)" \
        "to run the browser test (pytest -m browser)." >&2
fi
