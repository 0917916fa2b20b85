"""Issue 18, item 8: the set-up says what it installs before pip goes quiet for minutes, and where no NVIDIA
driver is found it gives the one-line override for the CPU-only torch. `setup.sh --plan` changes nothing."""

from __future__ import annotations

import os
import platform
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
linux_x86 = pytest.mark.skipif(platform.system() != "Linux" or platform.machine() != "x86_64",
                               reason="PyPI's CUDA-carrying torch is a Linux x86_64 matter")


def _checkout(tmp_path: Path) -> Path:
    """The script and what it reads, without a .venv: as a fresh clone has them."""
    (tmp_path / "scripts").mkdir(parents=True)
    shutil.copy(ROOT / "scripts" / "setup.sh", tmp_path / "scripts" / "setup.sh")
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    return tmp_path


def _python_without_torch(tmp_path: Path) -> str:
    """A Python 3.10+ that cannot import torch (no site-packages), so the script plans to install it."""
    wrapper = tmp_path / "python-without-site"
    wrapper.write_text(f"#!/bin/sh\nexec {sys.executable} -S \"$@\"\n")
    wrapper.chmod(0o755)
    return str(wrapper)


def _plan(tmp_path: Path, nvidia: bool, **env) -> subprocess.CompletedProcess:
    repo = _checkout(tmp_path / "repo")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    if nvidia:
        (bin_dir / "nvidia-smi").write_text("#!/bin/sh\nexit 0\n")
        (bin_dir / "nvidia-smi").chmod(0o755)
    full = {k: v for k, v in os.environ.items() if k not in ("TORCH_PACKAGES", "SETUP_FOR")}
    full.update(PYTHON=_python_without_torch(tmp_path), NVIDIA_PROC=str(tmp_path / "no-driver"),
                PATH=f"{bin_dir}:/usr/bin:/bin", **env)
    return subprocess.run(["bash", str(repo / "scripts" / "setup.sh"), "--plan"], capture_output=True, text=True,
                          env=full, timeout=60)


@linux_x86
@pytest.mark.skipif(Path("/usr/bin/nvidia-smi").exists() or Path("/bin/nvidia-smi").exists(),
                    reason="an NVIDIA driver's tool is on the system PATH here")
def test_without_an_nvidia_driver_the_cpu_build_is_offered_in_one_line(tmp_path):
    run = _plan(tmp_path, nvidia=False, SETUP_FOR="./test.sh")
    assert run.returncode == 0, run.stderr
    assert "about 5.5 GB" in run.stderr and "no NVIDIA driver was found" in run.stderr
    override = [line for line in run.stderr.splitlines() if "TORCH_PACKAGES=" in line]
    assert override and "--index-url https://download.pytorch.org/whl/cpu" in override[0]
    assert override[0].rstrip().endswith("./test.sh")
    assert not (tmp_path / "repo" / ".venv").exists()  # --plan changes nothing


@linux_x86
def test_with_an_nvidia_driver_the_cuda_build_is_explained_without_the_cpu_hint(tmp_path):
    run = _plan(tmp_path, nvidia=True)
    assert run.returncode == 0, run.stderr
    assert "with CUDA's libraries: about 5.5 GB" in run.stderr
    assert "TORCH_PACKAGES=" not in run.stderr


def test_a_torch_chosen_by_the_user_is_named_as_given(tmp_path):
    run = _plan(tmp_path, nvidia=False, TORCH_PACKAGES="torch==2.13.0")
    assert run.returncode == 0, run.stderr
    assert "installing torch as TORCH_PACKAGES says: torch==2.13.0" in run.stderr
    assert "no NVIDIA driver" not in run.stderr
