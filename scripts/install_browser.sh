#!/usr/bin/env bash
# Install Debian's Chromium for the dashboard's end-to-end browser test (tests/app, marker `browser`).
# Never downloads a browser build of its own: the test drives /usr/bin/chromium through Playwright.
set -euo pipefail
bash "$(dirname "$0")/apt_install.sh" chromium chromium "the dashboard's browser test, pytest -m browser"
