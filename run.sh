#!/usr/bin/env bash
# The main job: set up .venv if needed, then run lowvram-gen. Without arguments it generates an
# image with the embedded tiny model (random weights: abstract noise) and prints its path.
set -euo pipefail
cd "$(dirname "$0")"
bash scripts/setup.sh
if [ $# -eq 0 ]; then
  set -- generate "a lighthouse at dusk" --steps 4 --seed 1
fi
exec .venv/bin/lowvram-gen "$@"
