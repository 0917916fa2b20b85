"""Device probe, sizes, budget and reserve."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from lowvram_gen.hardware.device import GiB, MiB, fake, parse_size, probe
from lowvram_gen.errors import InvalidRequest


@pytest.mark.parametrize("text,expected", [
    ("6GiB", 6 * GiB), ("6G", 6 * GiB), ("6 GB", 6 * GiB), ("512MiB", 512 * MiB), ("512MB", 512 * MiB),
    ("1.5GiB", int(1.5 * GiB)), ("6", 6 * GiB), ("1TB", 1024 * GiB), (1024, 1024),
])
def test_parse_size(text, expected):
    """GB means GiB, as for graphics cards: a "4GB card" has 4096 MiB (README, "Memory")."""
    assert parse_size(text) == expected


@pytest.mark.parametrize("text", ["lots", "-1GiB", "6XB", "", "1e9"])
def test_parse_size_rejects(text):
    with pytest.raises(InvalidRequest, match="6GiB"):
        parse_size(text, "--vram-budget")


def test_usable_is_free_minus_reserve_capped_by_budget():
    assert fake(8, reserve_bytes=1 * GiB).usable_bytes == 7 * GiB
    assert fake(8, reserve_bytes=1 * GiB, budget_bytes=4 * GiB).usable_bytes == 4 * GiB
    assert fake(8, free_bytes=1 * GiB, reserve_bytes=2 * GiB).usable_bytes == 0


def test_cpu_probe():
    dev = probe("cpu")
    assert dev.kind == "cpu" and dev.torch_device == "cpu" and not dev.is_accelerator


def test_allocator_config_is_set_before_cuda_unless_the_user_chose_one():
    code = "import os; from lowvram_gen.hardware.device import probe; probe('cpu'); print(os.environ['PYTORCH_CUDA_ALLOC_CONF'])"
    env = {k: v for k, v in os.environ.items() if k != "PYTORCH_CUDA_ALLOC_CONF"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True).stdout
    assert out.strip() == "expandable_segments:True"
    env["PYTORCH_CUDA_ALLOC_CONF"] = "max_split_size_mb:128"
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True).stdout
    assert out.strip() == "max_split_size_mb:128"


@pytest.mark.cuda
def test_cuda_probe_and_budget_enforced():
    import torch

    dev = probe(budget_bytes=1 * GiB)
    assert dev.kind == "cuda" and dev.total_bytes > 0 and dev.free_bytes <= dev.total_bytes
    with pytest.raises(torch.OutOfMemoryError):
        torch.empty(2 * GiB, dtype=torch.uint8, device="cuda")  # over the 1 GiB budget


def test_doctor_runs_and_reports(capsys):
    from lowvram_gen.cli.main import main

    assert main(["doctor"]) == 0
    out = capsys.readouterr().out
    for word in ("device:", "torch", "diffusers", "sdpa", "sd15 512x512 -> cpu", "sdxl 1024x1024 -> cpu", "failures:"):
        assert word in out
