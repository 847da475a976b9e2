#!/usr/bin/env bash
# Make sure Debian's headless-capable Chromium is installed: the report-page tests
# (tests/report/test_report_chromium.py) open the page in it. Installs with apt-get
# when /usr/bin/chromium is absent and we may (root, or passwordless sudo); otherwise
# says so and leaves the decision to the tests (they skip with that reason).
set -u
CHROMIUM="${CURVPLAN_CHROMIUM:-/usr/bin/chromium}"
if [ -x "$CHROMIUM" ]; then
  exit 0
fi
if ! command -v apt-get >/dev/null 2>&1; then
  echo "ensure_chromium: $CHROMIUM is missing and apt-get is not available; install Chromium" >&2
  exit 0
fi
SUDO=""
if [ "$(id -u)" != "0" ]; then
  if sudo -n true 2>/dev/null; then SUDO="sudo -n"; else
    echo "ensure_chromium: $CHROMIUM is missing; run: sudo apt-get install -y chromium" >&2
    exit 0
  fi
fi
echo "ensure_chromium: installing chromium with apt-get …" >&2
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq >/dev/null && $SUDO apt-get install -y -qq chromium >/dev/null \
  || echo "ensure_chromium: apt-get install chromium failed" >&2
exit 0
