"""ControlNet on the issue-30 families that diffusers has a ControlNet pipeline for (Qwen-Image's
QwenImageControlNetPipeline, Z-Image's ZImageControlNetPipeline, SANA's SanaControlNetPipeline): a tiny seeded ControlNet of each (tests/tiny_controlnets.py,
diffusers' test shapes at the width of the family's tiny transformer) run from the CLI and compared with plain
diffusers' ControlNet pipeline; the planner counts it with the transformer; a simulated out-of-memory steps down
without loading it again; what diffusers has no pipeline for is refused in one sentence naming the family and the
task. Table-driven: a family added to `FAMILIES` gets every test. Seeded random weights: the images are noise.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Callable

import numpy as np
import pytest
import torch
from controlnet_files import out_of_memory_once, random_image
from PIL import Image
from tiny_controlnets import BUILDERS as CONTROLNETS
from tiny_controlnets import tiny_sana_two_blocks
from tiny_dit import BUILDERS as DIT
from tiny_flux2 import build_tiny_flux2_klein
from tiny_qwen import build_tiny_qwen_image
from tiny_transformers import cli, pixels
from tiny_zimage import build_tiny_zimage

from lowvram_gen import GenerationRequest, families
from lowvram_gen.control.units import ControlNetUnit
from lowvram_gen.errors import InvalidRequest
from lowvram_gen.models import controlnet as models
from lowvram_gen.session import Session

MAX_DIFF = 2  # of 255: "equal to plain diffusers"


@dataclass(frozen=True)
class Case:
    build: Callable
    pipeline: str  # the family's ControlNet pipeline in diffusers
    model_class: str
    call: dict = field(default_factory=lambda: {"guidance_scale": 4.0})  # what `--cfg 4` is in its call


FAMILIES = {
    "qwen-image": Case(build_tiny_qwen_image, "QwenImageControlNetPipeline", "QwenImageControlNetModel",
                       call={"true_cfg_scale": 4.0}),
    "z-image": Case(build_tiny_zimage, "ZImageControlNetPipeline", "ZImageControlNetModel"),
    "sana": Case(tiny_sana_two_blocks, "SanaControlNetPipeline", "SanaControlNetModel"),
}
# families diffusers 0.42 has no ControlNet pipeline for: (builder, the name the refusal gives)
WITHOUT = {"chroma": (DIT["chroma"], "Chroma"), "lumina2": (DIT["lumina2"], "Lumina 2"),
           "flux2-klein": (build_tiny_flux2_klein, "Flux.2 Klein")}


@pytest.fixture(scope="module", params=list(FAMILIES))
def family(request, tmp_path_factory):
    """(family key, its tiny folder, its tiny ControlNet's folder, a control image)."""
    key = request.param
    root = tmp_path_factory.mktemp(f"cn-{key}")
    FAMILIES[key].build().save_pretrained(root / "model", safe_serialization=True)
    CONTROLNETS[key]().save_pretrained(root / "controlnet", safe_serialization=True)
    return key, str(root / "model"), str(root / "controlnet"), random_image(root / "control.png")


def plain(key, folder, controlnet, image, scale=0.8, seed=7) -> np.ndarray:
    """Plain diffusers: the family's ControlNet pipeline from the model folder and the ControlNet folder."""
    import diffusers

    case = FAMILIES[key]
    net = getattr(diffusers, case.model_class).from_pretrained(controlnet)
    pipe = getattr(diffusers, case.pipeline).from_pretrained(folder, controlnet=net)
    pipe.set_progress_bar_config(disable=True)
    out = pipe(prompt="a castle", negative_prompt="fog", width=64, height=64, num_inference_steps=2, **case.call,
               control_image=Image.open(image).convert("RGB"), controlnet_conditioning_scale=scale,
               generator=torch.Generator().manual_seed(seed)).images[0]
    return np.asarray(out.convert("RGB"), dtype=int)


def request(key, folder, controlnet, image, tmp_path, weight=0.8, **kw) -> GenerationRequest:
    base = dict(prompt="a castle", negative_prompt="fog", model=folder, width=64, height=64, steps=2, seed=7,
                cfg_scale=4.0, outdir=str(tmp_path), controlnets=(ControlNetUnit(controlnet, image, weight),))
    return GenerationRequest(**{**base, **kw})


def test_the_records_name_diffusers_controlnet_pipelines():
    for key, case in FAMILIES.items():
        record = families.by_name(key)
        assert record.pipeline_for("controlnet") == case.pipeline
        assert record.controlnet.model_class == case.model_class
        assert families.by_pipeline(case.pipeline) is record
    for key in WITHOUT:
        assert families.by_name(key).controlnet is None and not families.by_name(key).has_task("controlnet")


def test_a_controlnet_run_from_the_cli_equals_plain_diffusers(family, tmp_path, capsys):
    key, folder, controlnet, image = family
    code, out, err = cli(capsys, "generate", "a castle", "--negative", "fog", "--model", folder, "--width", "64",
                         "--height", "64", "--steps", "2", "--seed", "7", "--cfg", "4", "--preset", "cpu",
                         "--outdir", str(tmp_path), "--json", "--controlnet", f"{controlnet}:0.8",
                         "--control-image", image)
    assert code == 0, err
    result = json.loads(out)
    assert result["warnings"] == []
    ours = pixels(result["images"][0])
    assert np.abs(ours - plain(key, folder, controlnet, image)).max() <= MAX_DIFF
    without = Session(preset="cpu").generate(request(key, folder, controlnet, image, tmp_path, controlnets=()))
    assert np.abs(ours - pixels(without.images[0])).max() > 10  # the ControlNet acts


def test_the_plan_counts_the_controlnet_with_the_transformer(family, capsys):
    key, folder, controlnet, _image = family
    args = ["plan", "--json", "--vram", "4GiB", "--model", folder, "--width", "512", "--height", "512"]
    code, out, err = cli(capsys, *args)
    assert code == 0, err
    without = json.loads(out)
    code, out, err = cli(capsys, *args, "--controlnet", controlnet)
    assert code == 0, err
    with_cn = json.loads(out)
    assert with_cn["controlnets"] == [controlnet]
    params = sum(p.numel() for p in CONTROLNETS[key]().parameters())
    rows = {p["name"].split("@")[0]: p for p in without["presets"]}
    for row in with_cn["presets"]:
        b, base = row["breakdown"], rows[row["name"].split("@")[0]]["breakdown"]
        assert b["controlnet_bytes"] in (2 * params, 4 * params), row["name"]  # its weights at 16 or 32 bits
        assert abs(b["denoiser_bytes"] - base["denoiser_bytes"] - b["controlnet_bytes"]) <= 1
        assert b["unet_bytes"] > base["unet_bytes"]  # its residuals beside the transformer's step


def test_out_of_memory_in_a_controlnet_step_steps_down_without_reloading_it(family, tmp_path, monkeypatch):
    """Simulated: the ControlNet's forward raises torch.OutOfMemoryError once at highvram (the GPU ladder run on this
    CPU); the job finishes one rung down with the same ControlNet object, not loaded again, as the job without the
    fault."""
    key, folder, controlnet, image = family
    calls = []
    real = models.load_controlnet
    monkeypatch.setattr(models, "load_controlnet", lambda *a, **k: calls.append(1) or real(*a, **k))
    session = Session(preset="highvram")
    session.generate(request(key, folder, controlnet, image, tmp_path, steps=1))
    net = session.model.pipe.controlnet0
    weight = next(net.parameters())
    failed = out_of_memory_once(net)
    result = session.generate(request(key, folder, controlnet, image, tmp_path))
    assert failed and [(a["preset"], a["stage"], a["outcome"]) for a in result.attempts][:2] == [
        ("highvram", "denoise", "oom"), ("medvram", "denoise", "ok")]
    assert session.model.pipe.controlnet0 is net and next(net.parameters()) is weight and calls == [1]
    assert np.abs(pixels(result.images[0]) - plain(key, folder, controlnet, image)).max() <= MAX_DIFF
    # between jobs no weight of the transformer is the ControlNet's (Z-Image's borrows them for its forward only)
    shared = {id(p) for p in net.parameters()} & {id(p) for p in session.model.pipe.transformer.parameters()}
    assert not shared


def test_offload_and_budget_take_the_controlnet_with_the_transformer(family, tmp_path):
    """apply.py's settings on the family's pipeline with its ControlNet: model offload, group and sequential offload
    and a budget split of both give the image of no offload; the budget splits the planner's blocks."""
    from diffusers.hooks.group_offloading import _is_group_offload_enabled

    from lowvram_gen.engines.sd import apply as apply_mod
    from lowvram_gen.engines.sd import pipeline as sd
    from lowvram_gen.engines.sd.controlnet import use_controlnets
    from lowvram_gen.hardware.device import probe
    from lowvram_gen.models import profile as profiles
    from lowvram_gen.models.loading import load
    from lowvram_gen.models.resolve import resolve
    from lowvram_gen.planning.controlnet import controlnet_profile, with_controlnets
    from lowvram_gen.settings import MemorySettings

    key, folder, controlnet, image = family
    pipe = load(resolve(folder), "float32").pipe
    source = models.resolve_controlnet(controlnet)
    net = models.kept(pipe, source, models.base_config(pipe), "float32")
    use_controlnets(pipe, [net])
    pipe._lowvram_unit_slots = [0]
    req = request(key, folder, controlnet, image, tmp_path).validated()

    def images():
        sd.set_sampler(pipe, "default")
        return np.asarray(sd.denoise(pipe, sd.Pass(req, [7], 64, 64), "cpu").images[0], dtype=float)

    reference = images()
    assert np.abs(reference - plain(key, folder, controlnet, image)).max() <= MAX_DIFF
    for offload in ("model", "group", "sequential"):
        apply_mod.apply_settings(pipe, MemorySettings(dtype="float32", offload=offload), probe("cpu"))
        assert hasattr(net, "_hf_hook") if offload == "model" else _is_group_offload_enabled(net)
        assert np.abs(images() - reference).max() <= 1, offload
    profile = with_controlnets(profiles.profile_from_folder(folder),
                               [controlnet_profile(models.config_of(source), "cn")])
    planned = [(n, c * 4) for n, c in profile.residency_blocks]  # float32: 4 bytes an element
    total = sum(b for _, b in planned)
    split = apply_mod.apply_settings(pipe, MemorySettings(dtype="float32", offload="budget",
                                                          resident_bytes=total // 2), probe("cpu")).residency
    assert sorted([*split.resident, *split.streamed]) == sorted(n for n, _ in planned)
    assert split.resident_bytes + split.streamed_bytes_per_step == total
    assert np.abs(images() - reference).max() <= 1


def test_what_the_pipeline_has_not_is_refused_in_one_sentence(family, tmp_path):
    """Z-Image's and SANA's ControlNet pipelines have no guidance window and run one ControlNet; none has an img2img
    one nor a guess mode; SANA has no ControlNet inpaint one, and Qwen-Image's and Z-Image's take a ControlNet that
    reads the mask (tests/test_controlnet_inpaint_families.py), which these plain ones do not."""
    key, folder, controlnet, image = family
    session = Session(preset="cpu")
    label = families.by_name(key).controlnet.label
    mask = tmp_path / "mask.png"
    Image.new("L", (64, 64), 255).save(mask)
    cases = [(dict(init_image=image), f"diffusers has no {label} ControlNet img2img pipeline"),
             (dict(init_image=image, mask=str(mask)),
              f"{label} ControlNet inpainting takes a ControlNet that reads the image and its mask" if
              families.by_name(key).controlnet.inpaint else f"ControlNet inpainting is not built for {label}"),
             (dict(control_mode="controlnet"), f"not in diffusers' {label} ControlNet pipeline")]
    if key in ("z-image", "sana"):
        cases += [(dict(controlnets=(ControlNetUnit(controlnet, image, 0.8, 0.0, 0.5),)),
                   f"{label} ControlNet pipeline has no guidance start/end"),
                  (dict(controlnets=(ControlNetUnit(controlnet, image),) * 2),
                   f"{label} ControlNet pipeline runs one ControlNet unit, not 2")]
    for fields, words in cases:
        with pytest.raises(InvalidRequest, match=words) as caught:
            session.generate(request(key, folder, controlnet, image, tmp_path, **fields))
        assert len(str(caught.value).splitlines()) == 1


@pytest.mark.parametrize("key", list(WITHOUT))
def test_a_family_without_a_controlnet_pipeline_is_refused_naming_it(key, tmp_path_factory, capsys):
    build, name = WITHOUT[key]
    root = tmp_path_factory.mktemp(f"no-cn-{key}")
    build().save_pretrained(root / "model", safe_serialization=True)
    CONTROLNETS["qwen-image"]().save_pretrained(root / "controlnet", safe_serialization=True)
    code, _out, err = cli(capsys, "generate", "a castle", "--model", str(root / "model"), "--width", "64",
                          "--height", "64", "--steps", "1", "--preset", "cpu", "--outdir", str(root),
                          "--controlnet", str(root / "controlnet"), "--control-image",
                          random_image(root / "control.png"))
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1, err
    assert name in lines[0] and "ControlNet" in lines[0], lines[0]


def test_plan_knows_the_qwen_image_controlnet_diffusers_from_transformer_makes(capsys):
    """`plan --model qwen-image --controlnet qwen-image`: QwenImageControlNetModel.from_transformer's default (5 of
    the real transformer's blocks, InstantX's Union ControlNet's size), counted at bf16 beside the transformer."""
    from accelerate import init_empty_weights
    from diffusers import QwenImageControlNetModel

    code, out, err = cli(capsys, "plan", "--json", "--model", "qwen-image", "--width", "1024", "--height", "1024",
                         "--vram", "8GiB", "--ram", "32GiB", "--controlnet", "qwen-image")
    assert code == 0, err
    with init_empty_weights():
        net = QwenImageControlNetModel(num_layers=5, attention_head_dim=128, num_attention_heads=24,
                                       joint_attention_dim=3584, in_channels=64, axes_dims_rope=(16, 56, 56))
    params = sum(p.numel() for p in net.parameters())
    rows = {row["name"]: row for row in json.loads(out)["presets"]}
    assert rows["highvram"]["breakdown"]["controlnet_bytes"] == 2 * params  # bf16
    code, _out, err = cli(capsys, "plan", "--model", "qwen-image", "--controlnet", "flux")
    assert code == 2 and "it is a ControlNet for Flux and the model 'qwen-image' is Qwen-Image" in err
