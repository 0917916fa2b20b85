"""Importing the package and asking for help stay light: no torch, no gradio, no CUDA."""

from __future__ import annotations

import subprocess
import sys


def _run(code: str) -> str:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout


def test_import_has_no_heavy_side_effects():
    out = _run("import sys, lowvram_gen, lowvram_gen.cli.main, lowvram_gen.request, lowvram_gen.presets, "
               "lowvram_gen.hardware.device, lowvram_gen.outputs, lowvram_gen.planning.planner; "
               "print(sorted(m for m in ('torch', 'gradio', 'diffusers', 'transformers') if m in sys.modules))")
    assert out.strip() == "[]"


def test_help_answers_without_torch():
    out = _run("import sys; from lowvram_gen.cli.main import main\n"
               "try:\n    main(['--help'])\nexcept SystemExit:\n    pass\n"
               "print('TORCH' if 'torch' in sys.modules else 'LIGHT')")
    assert "usage: lowvram-gen" in out and out.strip().endswith("LIGHT")


def test_python_dash_m_and_subcommand_help():
    result = subprocess.run([sys.executable, "-m", "lowvram_gen", "generate", "--help"], capture_output=True, text=True)
    assert result.returncode == 0
    for flag in ("--negative", "--sampler", "--medvram", "--lowvram", "--novram", "--cpu", "--vram-budget", "--json"):
        assert flag in result.stdout
