#!/usr/bin/env bash
# Set up (or check) the virtual environment at .venv; fast when nothing changed.
#
# - torch: a torch already importable by $PYTHON is kept (the venv sees it through
#   --system-site-packages); otherwise torch 2.14.1 + torchvision 0.29.1 are installed
#   (override with TORCH_PACKAGES="torch==X torchvision==Y", e.g. for a ROCm or CPU index).
# - then the package itself, editable, with its test extras.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
VENV=.venv
TORCH_PACKAGES=${TORCH_PACKAGES:-"torch==2.14.1 torchvision==0.29.1"}

if ! "$PYTHON" -c 'import sys; sys.exit(sys.version_info < (3, 10))' 2>/dev/null; then
  echo "lowvram-gen needs Python 3.10 or newer; set PYTHON=/path/to/python3.x" >&2
  exit 1
fi
if [ ! -x "$VENV/bin/python" ]; then
  if "$PYTHON" -c 'import torch' 2>/dev/null; then
    echo "setup: reusing the torch of $PYTHON ($("$PYTHON" -c 'import torch; print(torch.__version__)'))" >&2
    "$PYTHON" -m venv --system-site-packages "$VENV"
  else
    "$PYTHON" -m venv "$VENV"
  fi
  "$VENV/bin/python" -m pip install -q --upgrade pip
fi
PIP=("$VENV/bin/python" -m pip install -q --disable-pip-version-check)
if ! "$VENV/bin/python" -c 'import torch' 2>/dev/null; then
  echo "setup: installing $TORCH_PACKAGES (once; several GB on machines without a local copy)" >&2
  # shellcheck disable=SC2086
  "${PIP[@]}" $TORCH_PACKAGES
fi
stamp="$VENV/.lowvram-gen-installed"
want=$(cat pyproject.toml | sha256sum | cut -d' ' -f1)
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  echo "setup: installing lowvram-gen and its dependencies into $VENV" >&2
  "${PIP[@]}" -e ".[test]"
  echo "$want" > "$stamp"
fi
