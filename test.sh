#!/usr/bin/env bash
# The whole test suite: set up .venv if needed, then pytest (extra arguments go to pytest).
set -euo pipefail
cd "$(dirname "$0")"
bash scripts/setup.sh
exec .venv/bin/python -m pytest "$@"
