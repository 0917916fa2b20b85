#!/usr/bin/env bash
# The whole test suite: set up .venv if needed, then pytest (extra arguments go to pytest).
# The browser tests drive Debian's Chromium; as root (CI) it is installed when missing, otherwise
# those tests skip and say why.
set -euo pipefail
cd "$(dirname "$0")"
SETUP_FOR=./test.sh bash scripts/setup.sh
if ! command -v chromium >/dev/null 2>&1 && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
  echo "test: installing Debian's chromium for the browser tests" >&2
  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null) \
    || echo "test: could not install chromium; browser tests will skip" >&2
fi
exec .venv/bin/python -m pytest "$@"
