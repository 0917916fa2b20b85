#!/usr/bin/env bash
# Set up (or check) the virtual environment at .venv; fast when nothing changed.
#
# - torch: a torch already importable by $PYTHON is kept (the venv sees it through
#   --system-site-packages); otherwise torch 2.14.1 + torchvision 0.29.1 are installed
#   (override with TORCH_PACKAGES="torch==X torchvision==Y [--index-url URL]", e.g. for the
#   CPU-only or a ROCm build). PyPI's Linux torch carries CUDA's libraries (about 5.5 GB): where no
#   NVIDIA driver is found, the set-up says so and gives the one-line override for the CPU build.
# - then the package itself, editable, with its test extras.
#
# `bash scripts/setup.sh --plan` prints what would be installed and why, and changes nothing.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
VENV=.venv
DEFAULT_TORCH="torch==2.14.1 torchvision==0.29.1"
CPU_TORCH="$DEFAULT_TORCH --index-url https://download.pytorch.org/whl/cpu"
TORCH_PACKAGES=${TORCH_PACKAGES:-$DEFAULT_TORCH}
PLAN_ONLY=0
[ "${1:-}" = "--plan" ] && PLAN_ONLY=1

say() { echo "setup: $*" >&2; }

nvidia_driver() {
  # the driver's kernel module, or its tool on PATH (WSL has only the tool)
  [ -e "${NVIDIA_PROC:-/proc/driver/nvidia/version}" ] || command -v nvidia-smi >/dev/null 2>&1
}

# What installing torch will cost, said before pip starts: pip prints nothing for minutes while it
# downloads gigabytes, which looks like a hang.
explain_torch() {
  if [ "$TORCH_PACKAGES" != "$DEFAULT_TORCH" ]; then
    say "installing torch as TORCH_PACKAGES says: $TORCH_PACKAGES"
  elif [ "$(uname -s)" = Linux ] && [ "$(uname -m)" = x86_64 ]; then
    if nvidia_driver; then
      say "installing $DEFAULT_TORCH with CUDA's libraries: about 5.5 GB, several minutes (once)"
    else
      say "installing $DEFAULT_TORCH: about 5.5 GB, several minutes (once), most of it CUDA's libraries"
      say "no NVIDIA driver was found, so those libraries would go unused. For the CPU-only build"
      say "(about 200 MB) stop now (Ctrl+C) and run instead:"
      say "  TORCH_PACKAGES=\"$CPU_TORCH\" ${SETUP_FOR:-./run.sh}"
      say "(an AMD GPU: the ROCm build, e.g. --index-url https://download.pytorch.org/whl/rocm6.4)"
    fi
  else
    say "installing $DEFAULT_TORCH (once; a few hundred MB on $(uname -s) $(uname -m))"
  fi
}

if ! "$PYTHON" -c 'import sys; sys.exit(sys.version_info < (3, 10))' 2>/dev/null; then
  echo "lowvram-gen needs Python 3.10 or newer; set PYTHON=/path/to/python3.x" >&2
  exit 1
fi
if [ "$PLAN_ONLY" = 1 ]; then
  if [ -x "$VENV/bin/python" ] && "$VENV/bin/python" -c 'import torch' 2>/dev/null; then
    say "$VENV has torch $("$VENV/bin/python" -c 'import torch; print(torch.__version__)'): nothing to install for it"
  elif [ ! -x "$VENV/bin/python" ] && "$PYTHON" -c 'import torch' 2>/dev/null; then
    say "would reuse the torch of $PYTHON ($("$PYTHON" -c 'import torch; print(torch.__version__)'))"
  else
    explain_torch
  fi
  exit 0
fi
if [ ! -x "$VENV/bin/python" ]; then
  if "$PYTHON" -c 'import torch' 2>/dev/null; then
    say "reusing the torch of $PYTHON ($("$PYTHON" -c 'import torch; print(torch.__version__)'))"
    "$PYTHON" -m venv --system-site-packages "$VENV"
  else
    say "creating $VENV"
    "$PYTHON" -m venv "$VENV"
  fi
  "$VENV/bin/python" -m pip install -q --upgrade pip
fi
PIP=("$VENV/bin/python" -m pip install --disable-pip-version-check)
if ! "$VENV/bin/python" -c 'import torch' 2>/dev/null; then
  explain_torch
  # not quiet: pip's download progress is the only sign of life for minutes
  # shellcheck disable=SC2086
  "${PIP[@]}" --progress-bar on $TORCH_PACKAGES
fi
stamp="$VENV/.lowvram-gen-installed"
want=$(sha256sum pyproject.toml | cut -d' ' -f1)
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  say "installing lowvram-gen and its dependencies into $VENV (diffusers, transformers, gradio, ...)"
  "${PIP[@]}" -q -e ".[test]"
  echo "$want" > "$stamp"
  say "done. To type \`lowvram-gen\` without the .venv/bin/ prefix: source .venv/bin/activate"
fi
