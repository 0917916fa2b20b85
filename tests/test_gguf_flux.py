"""FLUX.1 GGUF single files (city96 layout) as a --model, end to end on a tiny Flux (issue 10).

city96's FLUX.1-dev-Q4_0.gguf / Q8_0.gguf hold the transformer alone in Black Forest Labs' original
layout (`double_blocks.0.img_attn.qkv.weight`, `single_blocks.0.linear1.weight`, ...); the VAE, CLIP and
T5 come from a diffusers folder (--config). Here the tiny Flux of tests/tiny_transformers.py is written
that way (tests/gguf_flux.py: diffusers -> BFL names; tests/gguf_files.py: gguf's writer, 2-D weights
Q8_0 or Q4_0, 1-D ones F32, general.architecture "flux") and loaded through the normal route.
CPU only, offline, 64x64 images, 2 steps.
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).parent))

torch = pytest.importorskip("torch")
gguf = pytest.importorskip("gguf")

import gguf_files  # noqa: E402
import gguf_flux  # noqa: E402
from tiny_transformers import build_tiny_flux, cli, pixels  # noqa: E402

from lowvram_gen.cli.main import main  # noqa: E402
from lowvram_gen.models.loading import load  # noqa: E402
from lowvram_gen.models.resolve import resolve  # noqa: E402

Q = gguf.GGMLQuantizationType
SMALL = ["--width", "64", "--height", "64", "--steps", "2", "--seed", "5", "--cpu"]

# How far the quantized tiny Flux may be from the fp32 one: the relative L2 error of one transformer
# output. Q8_0 stores each block of 32 weights as int8 times one scale (absmax / 127): a weight is off by
# at most half a step, RMS step / sqrt(12) = absmax / 440; the tiny model's weights are uniform, RMS
# absmax / sqrt(3), so ~0.4% of a weight's size. Q4_0 has 16 levels per block (step absmax / 8): ~6%.
# The output's error is that of the weights carried through a few chained layers (measured 0.53% and
# 8.7%), so each tolerance is ~3x the per-weight error. Only the 2-D weights are quantized (1-D: F32).
REL_TOLERANCE = {"Q8_0": 0.015, "Q4_0": 0.20}


# ---------------------------------------------------------------------------------------- fixtures


@pytest.fixture(scope="module")
def flux_folder(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("tiny-flux")
    build_tiny_flux().save_pretrained(folder, safe_serialization=True)
    return folder


@pytest.fixture(scope="module")
def reference(flux_folder):
    return load(resolve(str(flux_folder)), "float32").pipe


@pytest.fixture(scope="module")
def bfl(reference) -> dict:
    """The tiny transformer's weights under BFL's names, as a city96 file holds them."""
    return gguf_flux.flux_to_bfl(reference.transformer.state_dict())


@pytest.fixture(scope="module")
def files(tmp_path_factory, bfl):
    root = tmp_path_factory.mktemp("gguf-flux")
    out = {"dir": root}
    for name, qtype in (("Q8_0", Q.Q8_0), ("Q4_0", Q.Q4_0)):
        path = root / f"tiny-flux-{name}.gguf"
        out[f"{name}_types"] = gguf_files.write_gguf(path, bfl, qtype, arch="flux")
        out[name] = path
    return out


def _load(path, config):
    return load(resolve(str(path), str(config)), "float32").pipe


def _quantized(module) -> dict:
    """name -> GGML type of every weight held block-quantized."""
    from diffusers.quantizers.gguf.utils import GGUFParameter

    return {k: p.quant_type.name for k, p in module.named_parameters() if isinstance(p, GGUFParameter)}


def _transformer_output(transformer):
    """One seeded call of the transformer on a 64x64 image's 16 packed latent tokens and 8 text tokens."""
    from diffusers import FluxPipeline

    gen = torch.Generator().manual_seed(0)
    hidden, text = torch.randn(1, 16, 64, generator=gen), torch.randn(1, 8, 32, generator=gen)
    pooled = torch.randn(1, 32, generator=gen)
    img_ids = FluxPipeline._prepare_latent_image_ids(1, 4, 4, "cpu", torch.float32)
    with torch.no_grad():
        return transformer(hidden_states=hidden, encoder_hidden_states=text, pooled_projections=pooled,
                           timestep=torch.tensor([0.5]), img_ids=img_ids, txt_ids=torch.zeros(8, 3),
                           guidance=torch.tensor([3.5])).sample


def _rel_error(transformer, reference) -> float:
    want = _transformer_output(reference.transformer)
    return float((_transformer_output(transformer) - want).norm() / want.norm())


# ------------------------------------------------------------------------------ the file's layout


def test_bfl_layout_round_trips_through_diffusers_converter(bfl, reference):
    """The test file's BFL names are the ones diffusers converts from: back through the app's converter
    (diffusers' own, with single blocks' linear1 split at the config's width) every diffusers key comes
    back with its shape and values, and diffusers' Flux marker key is among the BFL names."""
    from diffusers.loaders.single_file_utils import CHECKPOINT_KEY_NAMES

    from lowvram_gen.models.gguf_file import flux_checkpoint

    want = reference.transformer.state_dict()
    assert CHECKPOINT_KEY_NAMES["flux"][0] in bfl and not any(k in bfl for k in want)
    assert sum(v.numel() for v in bfl.values()) == sum(v.numel() for v in want.values())
    back = flux_checkpoint(dict(bfl), reference.transformer.config)
    assert set(back) == set(want)
    for key, value in want.items():
        assert back[key].shape == value.shape and torch.equal(back[key], value), key


def test_at_flux1_width_the_conversion_is_diffusers_own():
    """Real FLUX.1 files are 3072 wide, the width diffusers' converter assumes: there the app's split of
    linear1 must give exactly diffusers' result (on the meta device: FLUX.1's width, two blocks each)."""
    from diffusers import FluxTransformer2DModel
    from diffusers.loaders.single_file_utils import convert_flux_transformer_checkpoint_to_diffusers

    from lowvram_gen.models.gguf_file import flux_checkpoint

    with torch.device("meta"):
        model = FluxTransformer2DModel(num_layers=2, num_single_layers=2, guidance_embeds=True)
    assert model.config.num_attention_heads * model.config.attention_head_dim == 3072
    want = {k: v.shape for k, v in model.state_dict().items()}
    bfl = gguf_flux.flux_to_bfl(model.state_dict())
    theirs = {k: v.shape for k, v in convert_flux_transformer_checkpoint_to_diffusers(dict(bfl)).items()}
    ours = {k: v.shape for k, v in flux_checkpoint(dict(bfl), model.config).items()}
    assert ours == theirs == want


def test_header_types_and_architecture(files):
    from lowvram_gen import families
    from lowvram_gen.models.gguf_file import builtin_arch, family_of, read_header

    header = read_header(files["Q8_0"])
    assert header.architecture == "flux" and family_of(header, files["Q8_0"]) is families.FLUX1
    assert builtin_arch(files["Q8_0"]) == "flux"
    types = {k: t.name for k, t in files["Q8_0_types"].items()}
    assert header.types == types and set(types.values()) == {"Q8_0", "F32"}
    # every 2-D weight has rows of whole 32-value blocks here: all are quantized, every 1-D tensor is F32
    assert all((t == "Q8_0") == (len(header.shapes[k]) == 2) for k, t in types.items())
    assert header.shapes["single_blocks.0.linear1.weight"] == (3 * 32 + 128, 32)  # q, k, v, MLP in, fused


# --------------------------------------------------------------------------------------- loading


@pytest.mark.parametrize("qtype", ["Q8_0", "Q4_0"])
def test_loads_with_config_keeping_the_transformer_quantized(files, flux_folder, reference, qtype):
    from lowvram_gen.models.gguf_file import read_header

    pipe = _load(files[qtype], flux_folder)
    assert type(pipe).__name__ == "FluxPipeline"
    quantized = _quantized(pipe.transformer)
    # the file's fused weights are split in diffusers' names: more quantized tensors than the file has
    in_file = [k for k, t in files[f"{qtype}_types"].items() if t.name == qtype]
    assert set(quantized.values()) == {qtype} and len(quantized) > len(in_file)
    params = dict(pipe.transformer.named_parameters())
    assert all(params[k].dtype == torch.uint8 for k in quantized)
    # held at the file's stored size, well under the float weights they stand for
    header = read_header(files[qtype])
    held = sum(params[k].numel() for k in quantized)  # uint8: one byte each
    assert held == header.quantized_bytes
    weights = [v for k, v in reference.transformer.state_dict().items() if k in quantized]
    assert sum(v.numel() for v in weights) == header.quantized_params
    assert held < sum(v.numel() * v.element_size() for v in weights) / 2  # fp32 bytes; below even fp16's
    # the rest is the config folder's own weights
    for name in ("vae", "text_encoder", "text_encoder_2"):
        for key, value in getattr(reference, name).state_dict().items():
            assert torch.equal(getattr(pipe, name).state_dict()[key], value), f"{name}.{key}"


@pytest.mark.parametrize("qtype", ["Q8_0", "Q4_0"])
def test_quantized_transformer_is_close_to_the_fp32_one_not_equal(files, flux_folder, reference, qtype):
    rel = _rel_error(_load(files[qtype], flux_folder).transformer, reference)
    assert 0 < rel < REL_TOLERANCE[qtype], rel  # 0 would mean the weights were not quantized at all


def test_q4_is_further_from_fp32_than_q8(files, flux_folder, reference):
    errors = {q: _rel_error(_load(files[q], flux_folder).transformer, reference) for q in ("Q8_0", "Q4_0")}
    assert errors["Q8_0"] < errors["Q4_0"]


def test_bfloat16_with_offload_keeps_the_file_blocks(files, flux_folder):
    """The memory layer casts what is float (norms, biases) and leaves the quantized blocks as stored; they
    are dequantized to bfloat16 per layer, also when the transformer is moved on and off the device."""
    from lowvram_gen.hardware.device import probe
    from lowvram_gen.engines.sd import apply as apply_mod
    from lowvram_gen.settings import MemorySettings

    pipe = _load(files["Q8_0"], flux_folder)
    quantized = _quantized(pipe.transformer)
    blocks = {k: p.detach().clone() for k, p in pipe.transformer.named_parameters() if k in quantized}
    applied = apply_mod.apply_settings(pipe, MemorySettings(dtype="bfloat16", offload="model"), probe("cpu"))
    assert applied.effective.offload == "model" and any("GGUF" in s for s in applied.skipped)
    for key, value in pipe.transformer.named_parameters():
        if key in blocks:
            assert value.dtype == torch.uint8 and torch.equal(value.detach(), blocks[key]), key
    assert pipe.transformer.x_embedder.bias.dtype == torch.bfloat16 and pipe.text_encoder_2.dtype == torch.bfloat16
    image = pipe("a lighthouse", num_inference_steps=1, width=64, height=64, output_type="np",
                 generator=torch.Generator().manual_seed(3)).images[0]
    assert image.shape == (64, 64, 3) and np.isfinite(image).all()


# -------------------------------------------------------------------------- CLI, batch, UI picker


def test_cli_generate_with_a_flux_gguf_is_close_to_the_folder(files, flux_folder, tmp_path, capsys):
    """The same command with the folder's fp32 transformer and with its Q8_0 GGUF: pixels (0-255) within
    a few levels. The transformer's ~0.1% error, through 2 steps and the VAE, moves a pixel by well under
    1% of its range; 8 levels is ~3%."""
    def generate(*model):
        code, out, err = cli(capsys, "generate", "a lighthouse", *model, *SMALL, "--outdir", str(tmp_path), "--json")
        assert code == 0, err
        return json.loads(out)

    result = generate("--model", str(files["Q8_0"]), "--config", str(flux_folder))
    assert result["model_path"] == str(files["Q8_0"]) and len(result["images"]) == 1
    got, want = pixels(result["images"][0]), pixels(generate("--model", str(flux_folder))["images"][0])
    assert got.shape == want.shape == (64, 64, 3)
    assert np.abs(got - want).max() <= 8


def test_batch_script_with_a_flux_gguf(files, flux_folder, tmp_path, capsys, batch_script):
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("a red fox\n")
    code = batch_script.run([str(prompts), "--model", str(files["Q4_0"]), "--config", str(flux_folder), *SMALL,
                       "--outdir", str(tmp_path / "out"), "--json"])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    summary = json.loads(captured.out)
    assert (summary["done"], summary["failed"]) == (1, 0)
    assert len(list((tmp_path / "out").rglob("*.png"))) == 1


def test_model_picker_lists_a_flux_gguf_and_the_session_generates(files, flux_folder, tmp_path):
    from lowvram_gen.models.discover import model_choices
    from lowvram_gen.request import GenerationRequest
    from lowvram_gen.session import Session

    models = tmp_path / "models"
    models.mkdir()
    shutil.copy(files["Q8_0"], models / "tiny-flux-Q8_0.gguf")
    picked = [c for c in model_choices(models) if c.endswith(".gguf")]
    assert picked == [str(models / "tiny-flux-Q8_0.gguf")]
    result = Session(device="cpu", outdir=str(tmp_path / "out")).generate(GenerationRequest(
        prompt="a fox", model=picked[0], config=str(flux_folder), width=64, height=64, steps=2, seed=1))
    assert len(result.images) == 1 and Path(result.images[0]).is_file()


# ----------------------------------------------------------------------------------- the estimate


def test_plan_counts_the_stored_bytes(files, flux_folder, capsys):
    from lowvram_gen.models.profile import source_profile

    reader = gguf.GGUFReader(str(files["Q8_0"]))
    quantized = [t for t in reader.tensors if t.tensor_type == Q.Q8_0]
    profile = source_profile(resolve(str(files["Q8_0"]), str(flux_folder)))
    assert profile.denoiser_quantized_bytes == sum(int(t.n_bytes) for t in quantized)
    assert profile.denoiser_quantized == sum(int(t.n_elements) for t in quantized)

    def plan(*argv):
        assert main(["plan", *argv, "--width", "64", "--height", "64", "--vram", "4GB", "--json"]) == 0
        return {e["name"]: e for e in json.loads(capsys.readouterr().out)["presets"]}

    folder = plan("--model", str(flux_folder))
    from_gguf = plan("--model", str(files["Q8_0"]), "--config", str(flux_folder))
    assert from_gguf["highvram"]["estimate_bytes"] < folder["highvram"]["estimate_bytes"]
    plan("--model", str(files["Q8_0"]))  # no --config: FLUX.1's built-in profile, from the file's keys


# ------------------------------------------------------------------------------------- bad files


def _write(tmp_path, name: str, state: dict) -> Path:
    path = tmp_path / name
    gguf_files.write_gguf(path, state, Q.Q8_0, arch="flux")
    return path


def _refused(capsys, path, config, *words) -> str:
    assert main(["generate", "a fox", "--model", str(path), "--config", str(config), *SMALL]) == 2
    err = capsys.readouterr().err
    assert path.name in err and "Traceback" not in err, err
    for word in words:
        assert word in err, (word, err)
    return err


def test_a_flux_gguf_missing_a_key_is_refused_naming_it(bfl, flux_folder, tmp_path, capsys):
    state = {k: v for k, v in bfl.items() if k != "single_blocks.0.linear2.weight"}
    _refused(capsys, _write(tmp_path, "cut.gguf", state), flux_folder, "missing",
             "single_blocks.0.linear2.weight", str(flux_folder))


def test_a_flux_gguf_of_another_width_is_refused_naming_the_shapes(bfl, flux_folder, tmp_path, capsys):
    """txt_in takes T5's width: a file for a 64-wide T5 with this folder's 32-wide one."""
    state = {**bfl, "txt_in.weight": torch.ones(32, 64)}
    _refused(capsys, _write(tmp_path, "wide.gguf", state), flux_folder, "wrong shape",
             "context_embedder.weight [32, 64] vs [32, 32]")


def test_a_dev_gguf_with_a_schnell_config_is_refused(files, flux_folder, tmp_path, capsys):
    """FLUX.1-dev has a guidance embedder, schnell none: the guidance weights have nowhere to go."""
    schnell = tmp_path / "schnell"
    shutil.copytree(flux_folder, schnell)
    config = schnell / "transformer" / "config.json"
    config.write_text(json.dumps({**json.loads(config.read_text()), "guidance_embeds": False}))
    _refused(capsys, files["Q8_0"], schnell, "unexpected", "guidance_embedder")


@pytest.mark.parametrize("keys,family", [
    (["input_blocks.0.0.weight", "output_blocks.0.0.in_layers.0.weight"], "StableDiffusionPipeline"),
    (["joint_blocks.0.context_block.adaLN_modulation.1.bias", "x_embedder.proj.weight"],
     "StableDiffusion3Pipeline"),
])
def test_a_gguf_of_another_architecture_with_a_flux_config_is_refused(flux_folder, tmp_path, capsys, keys, family):
    path = _write(tmp_path, "other.gguf", {k: torch.ones(32, 4, 3, 3) for k in keys})  # SD's 4-channel conv_in
    _refused(capsys, path, flux_folder, "FluxPipeline", family, "--config")


def test_a_flux_gguf_with_an_sd_config_is_refused_by_generate_and_plan(files, tiny_path, capsys):
    """plan reads only configs and the GGUF header, but an SD folder's profile would be a wrong estimate
    for a Flux transformer: it is refused with the same sentence as loading."""
    _refused(capsys, files["Q8_0"], tiny_path, "FluxPipeline", "StableDiffusionPipeline", "--config")
    assert main(["plan", "--model", str(files["Q8_0"]), "--config", str(tiny_path), "--vram", "4GB"]) == 2
    err = capsys.readouterr().err
    assert files["Q8_0"].name in err and "FluxPipeline" in err and "StableDiffusionPipeline" in err, err
