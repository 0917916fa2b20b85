"""Weight-only int8/int4 quantization (models/quantize.py, sdnq): NaN/Inf weights are refused after
quantizing, where the load-time check can no longer see them (docs/FAULTS.md 6). CPU only."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("sdnq")

from lowvram_gen.hardware.device import probe  # noqa: E402
from lowvram_gen.engines.sd import apply as apply_mod  # noqa: E402
from lowvram_gen.models.quantize import quantize_module  # noqa: E402
from lowvram_gen.errors import ModelLoadError  # noqa: E402
from lowvram_gen.settings import MemorySettings  # noqa: E402


def _two_linears(dtype=torch.float32):
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.Linear(256, 256)).to(dtype)  # 65536 weights: quantized


@pytest.mark.parametrize("kind", ["int8", "int4"])
@pytest.mark.parametrize("value", [float("nan"), float("inf"), float("-inf")])
def test_a_nan_or_inf_weight_is_refused_after_quantizing_naming_the_layer(kind, value):
    module = _two_linears()
    with torch.no_grad():
        module[1].weight[3, 7] = value
    with pytest.raises(ModelLoadError) as err:
        quantize_module(module, kind)
    text = str(err.value)
    assert "layer '1'" in text and "1 NaN/Inf scale value(s)" in text and kind in text
    assert err.value.exit_code == 2


@pytest.mark.parametrize("kind", ["int8", "int4"])
@pytest.mark.parametrize("dtype,big", [(torch.float32, 3e38), (torch.bfloat16, 3e38), (torch.float16, 60000.0)])
def test_large_finite_weights_quantize_without_complaint(kind, dtype, big):
    module = _two_linears(dtype)
    with torch.no_grad():
        module[0].weight[0, 0] = big
    quantize_module(module, kind)
    assert module[0].weight.dtype in (torch.int8, torch.uint8)  # quantized, and accepted


def test_apply_refuses_a_unet_whose_weights_went_non_finite_after_load(tiny_path):
    """Through the preset path (apply_settings -> PipelineOps.quantize): a weight that became Inf after
    the load-time check (as a float16 cast overflows one) is named instead of making black images."""
    from lowvram_gen.models.loading import load
    from lowvram_gen.models.resolve import resolve

    pipe = load(resolve("tiny"), "float32").pipe
    target = "down_blocks.1.attentions.0.transformer_blocks.0.ff.net.0.proj"
    with torch.no_grad():
        pipe.unet.get_submodule(target).weight[0, 0] = float("inf")
    with pytest.raises(ModelLoadError, match=f"layer '{target}' of the UNet2DConditionModel"):
        apply_mod.apply_settings(pipe, MemorySettings(dtype="float32", quantize="int8"), probe("cpu"))


def test_cli_exits_2_naming_the_layer(tiny_path, tmp_path, capsys):
    """The same at the CLI, where a planned int8 job quantizes the UNet while it loads: a NaN weight in the
    file gives a NaN scale, named in a clear sentence with exit 2, no traceback, no image."""
    import shutil

    from safetensors.torch import load_file, save_file

    from lowvram_gen.cli.main import main

    folder = tmp_path / "damaged"
    shutil.copytree(tiny_path, folder)
    weights = folder / "unet" / "diffusion_pytorch_model.safetensors"
    state = load_file(weights)
    state["down_blocks.1.attentions.0.transformer_blocks.0.ff.net.2.weight"][1, 2] = float("nan")
    save_file(state, weights)
    code = main(["generate", "a fox", "--model", str(folder), "--quantize", "int8", "--width", "64", "--height", "64",
                 "--steps", "2", "--cpu", "--outdir", str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert code == 2, err
    assert "ff.net.2" in err and "NaN/Inf scale" in err and "Traceback" not in err
    assert not list((tmp_path / "out").rglob("*.png"))
