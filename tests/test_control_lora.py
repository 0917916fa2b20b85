"""control-LoRA files (issue 20): Stability AI's ControlNets stored as a LoRA over the base model's UNet.

The tests write a tiny control-LoRA in SAI's layout (`write_control_lora`) for a tiny SDXL model whose UNet has 2
layers per block (`xl2`): diffusers' converter reads the original layout with 2 layers per block, as SD 1.x and
SDXL have, and the embedded tiny models have 1. A job with it must equal diffusers' own recipe
(examples/research_projects/control_lora): ControlNetModel.from_unet + load_lora_adapter, then the SDXL ControlNet
pipeline, with the same seed.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from lowvram_gen import GenerationRequest
from lowvram_gen.cli.main import main
from lowvram_gen.control.units import ControlNetUnit
from lowvram_gen.errors import InvalidRequest, ModelLoadError
from lowvram_gen.models import control_lora
from lowvram_gen.models import controlnet as models
from lowvram_gen.outputs import parse_a1111_parameters, read_png_metadata
from lowvram_gen.session import Session

import controlnet_files  # tests/controlnet_files.py
from folder_sampler import own_sampler  # tests/folder_sampler.py

STEPS, SIDE, SEED, CFG, RANK = 3, 64, 5, 7.0, 2
# the original-layout layers SAI stores as up/down pairs (diffusers' CONTROL_LORA_TO_DIFFUSERS names them after
# conversion): attention and feed-forward projections, the resnets' convolutions and time projection, the
# downsamplers, conv_in and the time/label embeddings
LORA_LAYERS = (".to_q", ".to_k", ".to_v", ".to_out.0", ".ff.net.0.proj", ".ff.net.2", ".proj_in", ".proj_out",
               ".in_layers.2", ".out_layers.3", ".emb_layers.1", ".skip_connection", ".op", "time_embed.0",
               "time_embed.2", "label_emb.0.0", "label_emb.0.2", "input_blocks.0.0")
WHOLE = ("input_hint_block.", "zero_convs.", "middle_block_out.")  # what the UNet has no copy of


def write_control_lora(unet, path: Path, seed: int = 0) -> Path:
    """A control-LoRA for `unet` in SAI's layout, seeded random values: the `lora_controlnet` marker, an up/down
    pair for each LoRA layer (plus its bias), the rest (norms, the hint block, the zero convolutions) whole."""
    from safetensors.torch import save_file

    cn = controlnet_files.build(unet, seed=seed)
    ldm = {k[len("control_model."):]: v for k, v in controlnet_files.to_ldm(cn).items()}
    rng = torch.Generator().manual_seed(seed)
    out = {"lora_controlnet": torch.zeros(1)}
    for key, value in sorted(ldm.items()):
        layer, _, leaf = key.rpartition(".")
        if leaf == "weight" and layer.endswith(LORA_LAYERS) and not layer.startswith(WHOLE):
            conv = value.ndim == 4
            out[f"{layer}.up"] = torch.randn((value.shape[0], RANK) + ((1, 1) if conv else ()), generator=rng) * 0.1
            out[f"{layer}.down"] = torch.randn((RANK, *value.shape[1:]), generator=rng) * 0.1
        else:
            out[key] = value + torch.randn(value.shape, generator=rng) * 0.01
    save_file({k: v.contiguous() for k, v in out.items()}, str(path))
    return path


def control_image(path: Path) -> Path:
    rng = np.random.RandomState(0)
    image = np.zeros((SIDE, SIDE, 3), dtype=np.uint8)
    image[16:48, 16:48] = 255
    image = np.clip(image.astype(int) + rng.randint(-20, 20, image.shape), 0, 255).astype(np.uint8)
    Image.fromarray(image).save(path)
    return path


def two_layer_model(tiny: Path, folder: Path, seed: int):
    """The tiny model `tiny` with a seeded UNet of 2 layers per block, saved at `folder`; (folder, its UNet)."""
    from diffusers import DiffusionPipeline, UNet2DConditionModel

    pipe = DiffusionPipeline.from_pretrained(tiny)
    torch.manual_seed(seed)
    unet = UNet2DConditionModel.from_config({**pipe.unet.config, "layers_per_block": 2})
    pipe.register_modules(unet=unet)
    pipe.save_pretrained(folder, safe_serialization=True)
    return folder, unet


@pytest.fixture(scope="module")
def xl2(tmp_path_factory, tiny_sdxl_path):
    """The tiny SDXL model with a UNet of 2 layers per block, a control-LoRA for it, the full ControlNet the same
    UNet makes (from_unet, for the plan), and a control image."""
    root = tmp_path_factory.mktemp("control-lora")
    model, unet = two_layer_model(tiny_sdxl_path, root / "tiny-sdxl-2", 11)
    return {"model": model, "unet": unet,
            "file": write_control_lora(unet, root / "control-lora-tiny-rank2.safetensors", seed=4),
            "full": controlnet_files.save_folder(controlnet_files.build(unet), root / "tiny-xl2-cn"),
            "image": control_image(root / "control.png")}


def pixels(path):
    return np.asarray(Image.open(path).convert("RGB")).astype(int)


def request(tmp_path, *units, **fields):
    # full precision unless a test asks for int8: the planner may otherwise pick cpu+int8 by this machine's learned
    # timings (an int8 job just measured fast), and the comparisons with diffusers' recipe are at full precision
    # and the model folder's own scheduler, which the recipe runs ("default" is DPM++ 2M for SD models)
    base = dict(prompt="a boat", width=SIDE, height=SIDE, steps=STEPS, seed=SEED, cfg_scale=CFG, outdir=str(tmp_path),
                quantize="none", sampler=own_sampler(fields.get("model", "tiny")))
    return GenerationRequest(**{**base, **fields}, controlnets=tuple(units))


def diffusers_recipe(model: Path, control_lora: Path, image: Path, xl: bool = True) -> np.ndarray:
    """Plain diffusers, as its control-LoRA example does it: from_unet, load_lora_adapter, the ControlNet pipeline."""
    import warnings

    import diffusers
    from diffusers import ControlNetModel, UNet2DConditionModel

    unet = UNet2DConditionModel.from_pretrained(model, subfolder="unet")
    controlnet = ControlNetModel.from_unet(unet)
    with warnings.catch_warnings():  # peft: the hint block's conv_in is given whole, as the file means it
        warnings.filterwarnings("ignore", "While injecting the PEFT adapters")
        controlnet.load_lora_adapter(str(control_lora), prefix=None, controlnet_config=controlnet.config)
    cls = diffusers.StableDiffusionXLControlNetPipeline if xl else diffusers.StableDiffusionControlNetPipeline
    pipe = cls.from_pretrained(str(model), unet=unet, controlnet=controlnet)
    pipe.set_progress_bar_config(disable=True)
    out = pipe("a boat", image=Image.open(image), num_inference_steps=STEPS, width=SIDE, height=SIDE,
               guidance_scale=CFG, generator=torch.Generator().manual_seed(SEED))
    return np.asarray(out.images[0].convert("RGB")).astype(int)


@pytest.fixture(scope="module")
def plain(xl2):
    return diffusers_recipe(xl2["model"], xl2["file"], xl2["image"])


def test_a_control_lora_job_equals_diffusers_recipe_and_keeps_a_plain_fused_controlnet(xl2, plain, tmp_path):
    from diffusers import ControlNetModel

    source = models.resolve_controlnet(str(xl2["file"]))
    assert source.kind == "control_lora"
    session = Session(device="cpu")
    ours = session.generate(request(tmp_path, ControlNetUnit(str(xl2["file"]), str(xl2["image"])),
                                    model=str(xl2["model"])))
    assert np.array_equal(pixels(ours.images[0]), plain)
    # fused and unloaded: an ordinary ControlNetModel for the memory layer, no PEFT layer left, the UNet untouched
    kept = session.model.pipe.controlnet0
    assert type(kept) is ControlNetModel and not getattr(kept, "peft_config", None)
    assert not kept._hf_peft_config_loaded
    assert not [n for n, m in kept.named_modules() if type(m).__module__.startswith("peft.")]
    assert torch.equal(session.model.pipe.unet.conv_in.weight, xl2["unet"].conv_in.weight)
    # and it changes the image: without the unit the pixels differ
    without = session.generate(request(tmp_path, model=str(xl2["model"])))
    assert not np.array_equal(pixels(without.images[0]), plain)


def test_an_sd15_control_lora_on_an_sd15_model_equals_the_recipe_too(tmp_path, tiny_path):
    """SD 1.5 control-LoRAs (comfyanonymous' control_lora_rank128_v11p_sd15_*) go through the same converter."""
    model, unet = two_layer_model(tiny_path, tmp_path / "tiny-2", 12)
    file = write_control_lora(unet, tmp_path / "control_lora_rank2_tiny_sd15.safetensors", seed=5)
    image = control_image(tmp_path / "control.png")
    ours = Session(device="cpu").generate(request(tmp_path, ControlNetUnit(str(file), str(image)), model=str(model)))
    # within one 8-bit level: we fuse the LoRA into the ControlNet's weights, the recipe keeps PEFT's layers
    # (W x + B A x), which rounds another way on some CPUs (a Xeon with torch 2.14.1: one value in 12,288)
    assert np.abs(pixels(ours.images[0]) - diffusers_recipe(model, file, image, xl=False)).max() <= 1


def test_under_lowvram_its_blocks_stream_with_the_recipes_pixels(xl2, plain, tmp_path):
    from diffusers.hooks.group_offloading import _is_group_offload_enabled

    session = Session(preset="lowvram")  # the GPU ladder's rung, run on this CPU
    result = session.generate(request(tmp_path, ControlNetUnit(str(xl2["file"]), str(xl2["image"])),
                                      model=str(xl2["model"])))
    assert _is_group_offload_enabled(session.model.pipe.controlnet0)
    assert np.array_equal(pixels(result.images[0]), plain)


def test_int8_quantizes_it_with_the_unet_and_full_precision_makes_it_again_from_the_unet_read_back(
        xl2, plain, tmp_path):
    """With int8 it is made from the quantized UNet and quantized with it; back at full precision both are read
    again, the UNet first, and the image is the recipe's again. First met on a UNet an earlier int8 job left
    quantized (a copy of the file: not kept yet), it is made from it, then again from the UNet read back."""
    from lowvram_gen.models.quantize import kinds

    unit = ControlNetUnit(str(xl2["file"]), str(xl2["image"]))
    session = Session(device="cpu")
    small = session.generate(request(tmp_path, unit, model=str(xl2["model"]), quantize="int8"))
    assert {"unet": "int8", "controlnet0": "int8"}.items() <= kinds(session.model.pipe).items()
    assert not np.array_equal(pixels(small.images[0]), plain)
    again = session.generate(request(tmp_path, unit, model=str(xl2["model"])))
    assert kinds(session.model.pipe) == {}
    assert np.array_equal(pixels(again.images[0]), plain)
    session.generate(request(tmp_path, model=str(xl2["model"]), quantize="int8", steps=1))
    copy = tmp_path / "control-lora-copy.safetensors"
    copy.write_bytes(xl2["file"].read_bytes())
    later = session.generate(request(tmp_path, ControlNetUnit(str(copy), str(xl2["image"])), model=str(xl2["model"])))
    assert np.array_equal(pixels(later.images[0]), plain)


def test_made_from_an_int8_unet_it_is_the_full_precision_one_within_int8s_rounding(xl2):
    import copy

    from lowvram_gen.models.quantize import quantize_module

    unet = copy.deepcopy(xl2["unet"])
    quantize_module(unet, "int8")
    source = models.resolve_controlnet(str(xl2["file"]))
    full = control_lora.control_lora_from_unet(source, xl2["unet"], "float32").state_dict()
    made = control_lora.control_lora_from_unet(source, unet, "float32").state_dict()
    layers = [n for n, m in unet.named_modules() if hasattr(m, "sdnq_dequantizer") and n.startswith("down_blocks")]
    assert layers and any(not torch.equal(made[f"{n}.weight"], full[f"{n}.weight"]) for n in layers)  # int8's rounding
    for key, value in full.items():
        assert torch.allclose(made[key], value, atol=0.02 * float(value.abs().max()) + 1e-6), key


def test_a_lora_the_job_put_on_the_unet_is_not_made_part_of_the_controlnet(xl2):
    """The job's LoRAs are PEFT adapters on the UNet (networks/lora.py, never fused): the ControlNet is made of their
    base layers, so a later job without them does not keep them in its ControlNet."""
    import copy

    from peft import LoraConfig

    unet = copy.deepcopy(xl2["unet"])
    unet.add_adapter(LoraConfig(r=2, target_modules=["to_q", "conv1"], init_lora_weights=False), "style")
    assert any(".base_layer." in k for k in unet.state_dict())
    source = models.resolve_controlnet(str(xl2["file"]))
    with_lora = control_lora.control_lora_from_unet(source, unet, "float32")
    plain = control_lora.control_lora_from_unet(source, xl2["unet"], "float32")
    assert with_lora.state_dict().keys() == plain.state_dict().keys()
    assert all(torch.equal(v, plain.state_dict()[k]) for k, v in with_lora.state_dict().items())


def test_a_control_lora_in_a_pickle_is_refused_in_one_sentence(xl2, tmp_path):
    from safetensors.torch import load_file

    path = tmp_path / "control-lora-tiny.pth"
    torch.save(load_file(str(xl2["file"])), str(path))
    with pytest.raises(ModelLoadError, match="is a control-LoRA in a pickle file: control-LoRAs are read as "
                                             ".safetensors"):
        models.config_of(models.resolve_controlnet(str(path)))


def test_a_gguf_unet_is_refused_in_one_sentence(xl2):
    from lowvram_gen.models.gguf_file import GGUF_BITS

    class Unet:  # all the check reads of a UNet loaded from a GGUF file
        pass

    unet = Unet()
    setattr(unet, GGUF_BITS, 4)
    with pytest.raises(ModelLoadError, match="built from the model's UNet, and this one is a GGUF file's"):
        control_lora.control_lora_from_unet(models.resolve_controlnet(str(xl2["file"])), unet, "float32")


def test_a_control_lora_for_another_base_is_refused_in_one_sentence_before_loading(xl2, tmp_path, capsys,
                                                                                    monkeypatch):
    monkeypatch.setattr(control_lora, "control_lora_from_unet", lambda *a, **k: pytest.fail("nothing may load"))
    session = Session(device="cpu")
    unit = ControlNetUnit(str(xl2["file"]), str(xl2["image"]))
    with pytest.raises(InvalidRequest, match="made for a 64-wide .* and the model 'tiny' is a 32-wide"):
        session.generate(request(tmp_path, unit))  # an SDXL control-LoRA on the SD 1.x model
    with pytest.raises(InvalidRequest, match="2 layers per block .* the model 'tiny-sdxl' has 1"):
        session.generate(request(tmp_path, unit, model="tiny-sdxl"))  # same widths, a UNet the converter cannot read
    assert session.model is None
    code = main(["generate", "a boat", "--controlnet", str(xl2["file"]), "--control-image", str(xl2["image"]),
                 "--outdir", str(tmp_path)])
    err = capsys.readouterr().err.strip()
    assert code == 2 and err.startswith("error: ") and len(err.splitlines()) == 1 and "made for a 64-wide" in err


def test_by_name_in_models_controlnet_with_its_infotext_read_back_by_from_png(xl2, tmp_path, capsys, monkeypatch):
    folder = tmp_path / "models" / "ControlNet"
    folder.mkdir(parents=True)
    copy = folder / xl2["file"].name
    copy.write_bytes(xl2["file"].read_bytes())
    monkeypatch.setenv("LOWVRAM_GEN_MODELS", str(tmp_path / "models"))
    name = copy.stem
    assert models.resolve_controlnet(name).kind == "control_lora" and name in models.available()
    args = ["--control-image", str(xl2["image"]), "--model", str(xl2["model"]), "--steps", str(STEPS), "--width",
            str(SIDE), "--height", str(SIDE), "--seed", "3", "--outdir", str(tmp_path), "--json"]
    assert main(["generate", "a boat", "--controlnet", f"{name}:0.8", *args]) == 0
    first = json.loads(capsys.readouterr().out)["images"][0]
    text = parse_a1111_parameters(read_png_metadata(first)[0])["ControlNet 0"]
    assert text.startswith(f"Module: none, Model: {name} [{models.short_hash(copy)}], Weight: 0.8, ")
    assert main(["generate", "--from-png", first, "--control-image", str(xl2["image"]), "--outdir", str(tmp_path),
                 "--json"]) == 0
    again = json.loads(capsys.readouterr().out)["images"][0]
    assert np.array_equal(pixels(first), pixels(again))
    unit = read_png_metadata(again)[1]["request"]["controlnets"][0]
    assert (unit["model"], unit["weight"]) == (name, 0.8)


def plan_json(capsys, *args):
    assert main(["plan", "--json", *args]) == 0
    return json.loads(capsys.readouterr().out)


def test_plan_counts_the_controlnet_a_control_lora_becomes_from_its_header(xl2, capsys, monkeypatch):
    """The ControlNet from_unet makes of the base UNet: the same weights and activations as that full ControlNet
    saved as a folder, found from the file's header alone (no weight read, nothing built)."""
    from diffusers import ControlNetModel

    import safetensors.torch

    monkeypatch.setattr(safetensors.torch, "load_file", lambda *a, **k: pytest.fail("planning read weights"))
    common = ["--vram", "4GiB", "--model", str(xl2["model"]), "--width", "512", "--height", "512"]
    lora = plan_json(capsys, *common, "--controlnet", str(xl2["file"]))
    full = plan_json(capsys, *common, "--controlnet", str(xl2["full"]))
    params = sum(p.numel() for p in ControlNetModel.from_unet(xl2["unet"]).parameters())
    rows = {p["name"].split("@")[0]: p["breakdown"] for p in full["presets"]}
    assert len(lora["presets"]) == len(full["presets"])
    for row in lora["presets"]:
        b, f = row["breakdown"], rows[row["name"].split("@")[0]]
        assert b["controlnet_bytes"] == f["controlnet_bytes"] > 0 and b["unet_bytes"] == f["unet_bytes"]
    highvram = next(p for p in lora["presets"] if p["name"] == "highvram")["breakdown"]
    assert highvram["controlnet_bytes"] == params * 2  # highvram stores it in float16
