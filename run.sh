#!/usr/bin/env bash
# The main job: set up .venv if needed, then run lowvram-gen. Without arguments it starts the web UI
# on the embedded tiny model (random weights: abstract noise) and prints its address.
set -euo pipefail
cd "$(dirname "$0")"
bash scripts/setup.sh
exec .venv/bin/lowvram-gen "$@"
