"""Issue 18, rough edge 11: what other libraries printed on every run."""

from __future__ import annotations

import importlib.util
import io
import re
import subprocess
import sys

import pytest

from lowvram_gen.jobs.console import ProgressBar


def test_the_first_tick_of_the_progress_bar_claims_no_rate(monkeypatch):
    """The bar was made when step 1 had already ended, and showed 1 step over microseconds: 89240 step/s."""
    out = io.StringIO()
    monkeypatch.setattr(sys, "stderr", out)
    bar = ProgressBar()
    bar.update(1, 20)
    text = out.getvalue()
    bar.close()
    assert "1/20" in text and "?step/s" in text
    assert not re.search(r"\d+(\.\d+)?step/s", text), text


@pytest.mark.skipif(importlib.util.find_spec("openvino") is not None, reason="OpenVINO is installed here")
def test_quantizing_without_openvino_prints_no_openvino_warning():
    pytest.importorskip("sdnq")
    code = ("import torch; from lowvram_gen.models.quantize import quantize_module; "
            "layer = torch.nn.Sequential(torch.nn.Linear(64, 64)); quantize_module(layer, 'int8'); "
            "layer(torch.randn(2, 64))")
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    assert "OpenVINO" not in run.stderr + run.stdout
