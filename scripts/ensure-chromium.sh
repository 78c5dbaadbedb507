#!/usr/bin/env bash
# Install Debian's headless-capable Chromium when it is missing: the browser test of
# the HTML reports (tests/integration/test_report_browser.py) opens the pages in it.
# Idempotent; needs root (or sudo) only when it installs.
set -euo pipefail
if command -v chromium >/dev/null 2>&1; then exit 0; fi
sudo=""
if [ "$(id -u)" -ne 0 ]; then sudo="sudo"; fi
export DEBIAN_FRONTEND=noninteractive
$sudo apt-get update -q
$sudo apt-get install -y -q --no-install-recommends chromium
command -v chromium >/dev/null 2>&1 || { echo "chromium is still missing after apt-get install" >&2; exit 1; }
