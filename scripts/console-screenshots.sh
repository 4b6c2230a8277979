#!/usr/bin/env bash
# Refreshes docs/console/*.png: runs the console's browser test (headless Chromium) with
# PORTCULLIS_CONSOLE_SCREENSHOTS set, which saves a PNG of every page it visits.
set -euo pipefail
cd "$(dirname "$0")/.."
if ! command -v chromium >/dev/null || ! command -v chromedriver >/dev/null; then
  apt-get install -y chromium chromium-driver
fi
PORTCULLIS_CONSOLE_SCREENSHOTS="$PWD/docs/console" \
  cargo test -p portcullis-gateway --test e2e console::a_browser_ -- --nocapture 2>/dev/null \
  || PORTCULLIS_CONSOLE_SCREENSHOTS="$PWD/docs/console" \
     cargo test -p portcullis-gateway --test e2e console::a_browser_
ls -l docs/console
