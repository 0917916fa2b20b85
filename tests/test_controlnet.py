"""ControlNet (issue 20): units on the request, the CLI, loading, the denoise call, the memory plan and the PNG text.

The ControlNets are tiny ones made from the tiny models' UNets (tests/controlnet_files.py), saved as diffusers
folders, as a single .safetensors in diffusers' layout and as a .pth in the original layout. Out-of-memory is
simulated as the ladder tests do it: a forward pre-hook on the ControlNet raises torch.OutOfMemoryError.
"""

from __future__ import annotations

import json
import re
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from lowvram_gen import GenerationRequest
from lowvram_gen.cli.main import main
from lowvram_gen.control.units import ControlNetUnit, parse_controlnet_flag, unit_from_text
from lowvram_gen.engines.sd import apply as apply_mod
from lowvram_gen.errors import InvalidRequest
from lowvram_gen.hardware.device import fake, probe
from lowvram_gen.models import controlnet as models
from lowvram_gen.outputs import parse_a1111_parameters, read_png_metadata
from lowvram_gen.session import Session
from lowvram_gen.settings import MemorySettings

import controlnet_files as files  # tests/controlnet_files.py
from controlnet_reference import extension_forward  # tests/controlnet_reference.py
from folder_sampler import own_sampler  # tests/folder_sampler.py

STEPS, SIDE, SEED, CFG = 3, 64, 5, 7.0


@pytest.fixture(scope="module")
def cn(tmp_path_factory, tiny_path, tiny_sdxl_path):
    """Tiny ControlNets for tiny (two) and tiny-sdxl, in every layout, and a control image."""
    from diffusers import UNet2DConditionModel

    root = tmp_path_factory.mktemp("controlnets")
    sd = files.build(UNet2DConditionModel.from_pretrained(tiny_path, subfolder="unet"), seed=1)
    other = files.build(UNet2DConditionModel.from_pretrained(tiny_path, subfolder="unet"), seed=2)
    xl = files.build(UNet2DConditionModel.from_pretrained(tiny_sdxl_path, subfolder="unet"), seed=3)
    rng = np.random.RandomState(0)
    image = np.zeros((SIDE, SIDE, 3), dtype=np.uint8)
    image[16:48, 16:48] = 255  # a white square: canny finds its border
    image = np.clip(image.astype(int) + rng.randint(-20, 20, image.shape), 0, 255).astype(np.uint8)
    Image.fromarray(image).save(root / "control.png")
    return {
        "sd": files.save_folder(sd, root / "tiny-cn"),
        "sd_pth": files.save_ldm_pth(sd, root / "control_tiny_canny.pth"),
        "sd_file": files.save_safetensors(sd, root / "tiny_cn.safetensors"),
        "other": files.save_folder(other, root / "tiny-cn-2"),
        "xl": files.save_folder(xl, root / "tiny-xl-cn"),
        "xl_file": files.save_safetensors(xl, root / "diffusers_xl_tiny_mid.safetensors"),
        "image": root / "control.png",
    }


def pixels(path):
    return np.asarray(Image.open(path).convert("RGB")).astype(int)


def request(tmp_path, *units, **fields):
    base = dict(prompt="a boat", width=SIDE, height=SIDE, steps=STEPS, seed=SEED, cfg_scale=CFG, outdir=str(tmp_path),
                sampler=own_sampler(fields.get("model", "tiny")))  # the folder's own scheduler, as `reference` runs
    return GenerationRequest(**{**base, **fields}, controlnets=tuple(units))


def reference(folder, *nets, **call):
    """Plain diffusers: the ControlNet pipeline of the model folder with these ControlNet folders."""
    import diffusers
    from diffusers import ControlNetModel

    img2img = "control_image" in call
    xl = "xl" in Path(nets[0]).name
    name = f"StableDiffusion{'XL' if xl else ''}ControlNet{'Img2Img' if img2img else ''}Pipeline"
    loaded = [ControlNetModel.from_pretrained(n) for n in nets]
    pipe = getattr(diffusers, name).from_pretrained(str(folder), controlnet=loaded[0] if len(loaded) == 1 else loaded)
    pipe.set_progress_bar_config(disable=True)
    out = pipe("a boat", num_inference_steps=call.pop("steps", STEPS), width=SIDE, height=SIDE, guidance_scale=CFG,
               generator=torch.Generator().manual_seed(SEED), controlnet_conditioning_scale=call.pop("scale", 1.0),
               **call)
    return np.asarray(out.images[0].convert("RGB")).astype(int)


# ------------------------------------------------------------------------------------------ the request


def test_flag_units_and_their_ranges_are_checked_before_anything_loads(cn):
    assert parse_controlnet_flag("canny:0.8:0.1:0.9") == ControlNetUnit("canny", None, 0.8, 0.1, 0.9)
    assert parse_controlnet_flag("C:\\models\\cn.safetensors:0.5").model == "C:\\models\\cn.safetensors"
    assert parse_controlnet_flag("org/name").weight == 1.0
    ok = GenerationRequest(prompt="x", controlnets=(ControlNetUnit("m", str(cn["image"]), 2.0, 0.0, 0.5),),
                           control_mode="ControlNet is more important").validated()
    assert ok.control_mode == "controlnet" and ok.controlnets[0].weight == 2.0
    bad = [(dict(weight=2.5), "weight"), (dict(guidance_start=0.6, guidance_end=0.5), "guidance start"),
           (dict(guidance_end=1.5), "guidance end"), (dict(preprocessor="depth_zoe"), "not built here"),
           (dict(preprocessor="sobel"), "use one of none, canny"), (dict(canny_low=220), "high threshold"),
           (dict(image=None), "needs a control image")]
    for change, words in bad:
        unit = ControlNetUnit(**{"model": "m", "image": str(cn["image"]), **change})
        with pytest.raises(InvalidRequest, match=words):
            GenerationRequest(prompt="x", controlnets=(unit,)).validated()
    with pytest.raises(InvalidRequest, match="use balanced, prompt or controlnet"):
        GenerationRequest(prompt="x", control_mode="guess").validated()
    # from a JSON line or a form: the unit's fields as a mapping
    mapped = GenerationRequest.from_mapping({"prompt": "x", "controlnets": [{"model": "m", "image": str(cn["image"]),
                                                                            "weight": "0.5"}]})
    assert mapped.controlnets == (ControlNetUnit("m", str(cn["image"]), 0.5),)


@pytest.mark.parametrize("extra,words", [
    (["--control-image", "{bad}"], "unit 0 control image: .*not a readable image"),
    (["--control-image", "{image}", "--control-image", "{image}"], "give one per --controlnet"),
    (["--control-image", "{image}", "--preprocessor", "canny", "--preprocessor", "none"], "give none"),
], ids=["unreadable-image", "two-images-one-unit", "two-preprocessors"])
def test_cli_refuses_bad_units_with_one_sentence_exit_2(extra, words, cn, tmp_path, capsys, monkeypatch):
    import lowvram_gen.session as session_mod

    monkeypatch.setattr(session_mod, "load", lambda *a, **k: pytest.fail("nothing may load"))
    bad = tmp_path / "not-an-image.png"
    bad.write_text("hello")
    args = [a.format(bad=bad, image=cn["image"]) for a in extra]
    code = main(["generate", "a boat", "--controlnet", str(cn["sd"]), *args, "--outdir", str(tmp_path)])
    err = capsys.readouterr().err.strip()
    assert code == 2 and err.startswith("error: ") and len(err.splitlines()) == 1
    assert re.search(words, err), err


def test_a_missing_model_and_a_wrong_family_are_refused_before_the_model_loads(cn, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("LOWVRAM_GEN_MODELS", str(tmp_path / "models"))
    (tmp_path / "models" / "ControlNet").mkdir(parents=True)
    session = Session(device="cpu")
    with pytest.raises(InvalidRequest, match="no .safetensors.* file of that name in .*ControlNet; there are none"):
        session.generate(request(tmp_path, ControlNetUnit("control_v11p_sd15_canny", str(cn["image"]))))
    for spec in (cn["xl"], cn["xl_file"]):  # an SDXL ControlNet on the SD model: from its config / its header
        with pytest.raises(InvalidRequest, match="made for a 64-wide .* and the model 'tiny' is a 32-wide"):
            session.generate(request(tmp_path, ControlNetUnit(str(spec), str(cn["image"]))))
    assert session.model is None  # refused before anything loaded
    code = main(["generate", "a boat", "--model", "tiny-sdxl", "--controlnet", str(cn["sd_pth"]), "--control-image",
                 str(cn["image"]), "--outdir", str(tmp_path)])
    err = capsys.readouterr().err.strip()
    assert code == 2 and "made for a 32-wide" in err and len(err.splitlines()) == 1


def test_a_hub_id_loads_from_the_cache_and_one_not_there_says_how_to_get_it(cn, tmp_path, monkeypatch, capsys):
    snapshot = files.in_hub_cache(cn["sd"], "lowvram-test/tiny-cn", tmp_path / "hub", monkeypatch)
    source = models.resolve_controlnet("lowvram-test/tiny-cn")
    assert (source.kind, source.label, source.path) == ("folder", "lowvram-test/tiny-cn", snapshot.resolve())
    code = main(["generate", "a boat", "--controlnet", "lowvram-test/not-here", "--control-image", str(cn["image"]),
                 "--outdir", str(tmp_path)])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1
    assert "could not get the ControlNet 'lowvram-test/not-here'" in err and "hf download lowvram-test/not-here" in err


# ------------------------------------------------------------------------------------------ the job


@pytest.mark.parametrize("kind", ["sd", "sd_pth", "sd_file", "xl_file"])
def test_a_controlnet_job_equals_plain_diffusers(kind, cn, tmp_path, tiny_path, tiny_sdxl_path):
    """The same seed through the session (a folder, the original-layout .pth, a diffusers-layout .safetensors) and
    through diffusers' own ControlNet pipeline built from the folders: the same pixels."""
    xl = kind.startswith("xl")
    ours = Session(device="cpu").generate(request(tmp_path, ControlNetUnit(str(cn[kind]), str(cn["image"])),
                                                  model="tiny-sdxl" if xl else "tiny"))
    plain = reference(tiny_sdxl_path if xl else tiny_path, cn["xl" if xl else "sd"], image=Image.open(cn["image"]))
    assert np.array_equal(pixels(ours.images[0]), plain)


def test_the_embedded_tiny_controlnet_is_listed_and_runs_a_job_with_no_models_folder(cn, tmp_path, tiny_path,
                                                                                       monkeypatch):
    """Issue 29 item 12: out of the box (no models/ControlNet) the Model list had nothing to pick. `tiny-controlnet`,
    built for `tiny` on first use as `tiny` is, is listed (the CLI's names, the API's model_list) and runs: the same
    pixels as diffusers' ControlNet pipeline with its folder."""
    from lowvram_gen.api.controlnet import model_list
    from lowvram_gen.paths import models_dir

    monkeypatch.setenv("LOWVRAM_GEN_MODELS", str(tmp_path / "no-models"))
    assert list(models.available()) == ["tiny-controlnet"]
    assert model_list()["model_list"] == ["None", "tiny-controlnet"]
    ours = Session(device="cpu").generate(request(tmp_path, ControlNetUnit("tiny-controlnet", str(cn["image"]))))
    source = models.resolve_controlnet("tiny-controlnet")
    assert source.kind == "folder" and source.path.parent == models_dir().resolve()  # in the cache, beside tiny's
    assert np.array_equal(pixels(ours.images[0]), reference(tiny_path, source.path, image=Image.open(cn["image"])))
    text = read_png_metadata(ours.images[0])[0]
    assert 'ControlNet 0: "Module: none, Model: tiny-controlnet, Weight: 1' in text
    plain = Session(device="cpu").generate(request(tmp_path))
    assert not np.array_equal(pixels(ours.images[0]), pixels(plain.images[0]))  # it steers the image


def test_img2img_with_controlnet_mode_equals_plain_diffusers(cn, tmp_path, tiny_path, posterior_mode):
    """"ControlNet is more important": diffusers' guess mode (the ControlNet on the conditional half only) with the
    extension's soft factors in place of guess mode's own (issue 31: they differ, up to 78% on SDXL)."""
    ours = Session(device="cpu").generate(request(tmp_path, ControlNetUnit(str(cn["sd"]), str(cn["image"])), steps=4,
                                                  init_image=str(cn["image"]), strength=0.5, control_mode="controlnet"))
    control = Image.open(cn["image"])
    # denoise 0.5 of 4 steps runs A1111's int(0.5 x 4) + 1 = 3 of 4 (lowvram_gen/img2img_steps.py): diffusers' 0.75
    with extension_forward():
        plain = reference(tiny_path, cn["sd"], image=control, control_image=control, strength=0.75, guess_mode=True,
                          steps=4)
    assert np.array_equal(pixels(ours.images[0]), plain)


def test_my_prompt_is_more_important_scales_the_residuals_as_a1111s_extension(cn, tmp_path, tiny_path):
    """A1111's "My prompt is more important": the ControlNet's outputs (down residuals, then the mid block's) times
    0.825 ** (12 - i), zipped from the first, on both CFG halves. The reference is plain diffusers' balanced
    pipeline with those factors put on its ControlNet's output here; a balanced job after it is balanced again."""
    session = Session(device="cpu")
    unit = ControlNetUnit(str(cn["sd"]), str(cn["image"]))
    balanced = pixels(session.generate(request(tmp_path / "b", unit)).images[0])
    prompt = session.generate(request(tmp_path / "p", unit, control_mode="My prompt is more important"))
    assert 'Control Mode: My prompt is more important' in read_png_metadata(prompt.images[0])[0]
    with extension_forward():
        plain = reference(tiny_path, cn["sd"], image=Image.open(cn["image"]))
    assert np.array_equal(pixels(prompt.images[0]), plain)
    assert not np.array_equal(plain, balanced)
    again = pixels(session.generate(request(tmp_path / "b2", unit)).images[0])
    assert np.array_equal(again, balanced)


def test_lora_and_embeddings_still_apply_with_a_controlnet(cn, tmp_path, monkeypatch):
    """A prompt's <lora:...> and an embedding's word act in a ControlNet job as without one, and the ControlNet still
    acts with them: each of the three changes the image, and the PNG names the LoRA, the embedding and the unit."""
    from safetensors.torch import save_file

    from lora_files import kohya_state, save
    from lowvram_gen.models.loading import load
    from lowvram_gen.models.resolve import resolve

    models_dir = tmp_path / "models"
    monkeypatch.setenv("LOWVRAM_GEN_MODELS", str(models_dir))
    save(kohya_state(load(resolve("tiny"), "float32").pipe, seed=0), models_dir / "Lora" / "cnlora.safetensors")
    (models_dir / "embeddings").mkdir(parents=True)
    vec = torch.randn(1, 32, generator=torch.Generator().manual_seed(0)) * 2
    save_file({"emb_params": vec}, str(models_dir / "embeddings" / "cnemb.safetensors"))
    session = Session(device="cpu")
    unit = ControlNetUnit(str(cn["sd"]), str(cn["image"]))

    def made(prompt, *units):
        result = session.generate(request(tmp_path / str(len(prompt)) / str(len(units)), *units, prompt=prompt))
        return pixels(result.images[0]), read_png_metadata(result.images[0])[0]

    both, text = made("a cnemb boat <lora:cnlora:1>", unit)
    assert "Lora hashes: \"cnlora: " in text and "TI hashes: \"cnemb: " in text and 'ControlNet 0: "Module: none' in text
    assert not np.array_equal(both, made("a cnemb boat <lora:cnlora:1>")[0])  # the ControlNet acts
    assert not np.array_equal(both, made("a cnemb boat", unit)[0])  # the LoRA acts
    assert not np.array_equal(both, made("a boat <lora:cnlora:1>", unit)[0])  # the embedding acts


def test_weight_zero_equals_no_controlnet_and_two_units_run(cn, tmp_path, tiny_path):
    session = Session(device="cpu")
    none = session.generate(request(tmp_path))
    zero = session.generate(request(tmp_path, ControlNetUnit(str(cn["sd"]), str(cn["image"]), weight=0)))
    one = session.generate(request(tmp_path, ControlNetUnit(str(cn["sd"]), str(cn["image"]))))
    assert np.array_equal(pixels(none.images[0]), pixels(zero.images[0]))
    assert not np.array_equal(pixels(none.images[0]), pixels(one.images[0]))  # a ControlNet that does something
    units = (ControlNetUnit(str(cn["sd"]), str(cn["image"]), 0.7, 0.0, 0.3),
             ControlNetUnit(str(cn["other"]), str(cn["image"]), preprocessor="canny"))
    two = session.generate(request(tmp_path, *units))
    from lowvram_gen.control.preprocess import control_map

    # guidance end 0.3 of 3 steps: the extension runs steps 0 and 1 (step i sees max(i - 1, 0) / 3: 0, 0, 1/3). The
    # tiny model's PLMS makes 4 calls for 3 steps (its first step two, as A1111's PLMS does): calls 0-2 run, which
    # diffusers' window runs with an end of 3/4 (its rule over the 4 calls: (i + 1) / 4 <= end)
    plain = reference(tiny_path, cn["sd"], cn["other"], image=[Image.open(cn["image"]), control_map(str(cn["image"]),
                      SIDE, SIDE, "canny")], scale=[0.7, 1.0], control_guidance_start=[0.0, 0.0],
                      control_guidance_end=[3 / 4, 1.0])
    assert np.array_equal(pixels(two.images[0]), plain)
    text = read_png_metadata(two.images[0])[0]
    assert 'ControlNet 0: "Module: none, Model: tiny-cn, Weight: 0.7, Resize Mode: Just Resize, Low Vram: False, ' \
           'Guidance Start: 0, Guidance End: 0.3, Pixel Perfect: True, Control Mode: Balanced, Hr Option: Both, ' \
           'Save Detected Map: False"' in text
    assert 'ControlNet 1: "Module: canny, Model: tiny-cn-2, Weight: 1, Resize Mode: Just Resize, Low Vram: False, ' \
           'Processor Res: 64, Threshold A: 100, Threshold B: 200, Guidance Start: 0' in text


def test_two_units_of_one_model_load_it_once_and_count_its_weights_once(cn, tmp_path, tiny_path, capsys):
    session = Session(device="cpu")
    units = (ControlNetUnit(str(cn["sd"]), str(cn["image"])), ControlNetUnit(str(cn["sd"]), str(cn["image"]), 0.5,
                                                                              preprocessor="canny"))
    result = session.generate(request(tmp_path, *units))
    assert list(models.attached(session.model.pipe)) == ["controlnet0"]
    from lowvram_gen.control.preprocess import control_map

    plain = reference(tiny_path, cn["sd"], cn["sd"], image=[Image.open(cn["image"]), control_map(
        str(cn["image"]), SIDE, SIDE, "canny")], scale=[1.0, 0.5])
    assert np.array_equal(pixels(result.images[0]), plain)
    one = plan_json(capsys, "--vram", "4GiB", "--model", "tiny", "--preset", "highvram", "--controlnet", str(cn["sd"]))
    two = plan_json(capsys, "--vram", "4GiB", "--model", "tiny", "--preset", "highvram", "--controlnet", str(cn["sd"]),
                    "--controlnet", str(cn["sd"]))
    b1, b2 = (next(p for p in o["presets"] if p["name"] == "highvram")["breakdown"] for o in (one, two))
    assert b1["controlnet_bytes"] == b2["controlnet_bytes"] and b2["unet_bytes"] > b1["unet_bytes"]


def test_canny_finds_the_edges_of_a_square_and_its_thresholds_count():
    from lowvram_gen.control.canny import canny, edges

    image = np.zeros((40, 40), dtype=np.uint8)
    image[10:30, 10:30] = 200
    mask = edges(image, 100, 200)
    ring = np.zeros_like(mask)
    ring[8:32, 8:32] = True
    ring[12:28, 12:28] = False
    assert mask.any() and not (mask & ~ring).any()  # edges only along the square's border
    assert mask[10:30, 9:11].any(axis=1).all() and mask[9:11, 10:30].any(axis=0).all()  # all along its sides
    assert not edges(image // 8, 100, 200).any()  # too faint for the thresholds
    assert edges(image // 8, 20, 40).any()
    rgb = canny(Image.fromarray(np.repeat(image[:, :, None], 3, axis=2)))
    assert rgb.mode == "RGB" and set(np.unique(np.asarray(rgb))) <= {0, 255}


def test_a_controlnet_is_loaded_once_kept_between_jobs_and_dropped_with_the_model(cn, tmp_path, monkeypatch):
    calls = []
    real = models.load_controlnet
    monkeypatch.setattr(models, "load_controlnet", lambda *a, **k: calls.append(a[0].spec) or real(*a, **k))
    session = Session(device="cpu")
    unit = ControlNetUnit(str(cn["sd_pth"]), str(cn["image"]))
    session.generate(request(tmp_path, unit, steps=1))
    kept = session.model.pipe.controlnet0
    session.generate(request(tmp_path, steps=1))  # a job without it: off the pipeline, still kept
    assert models.attached(session.model.pipe) == {} and not hasattr(kept, "_hf_hook")
    session.generate(request(tmp_path, unit, steps=1))
    assert session.model.pipe.controlnet0 is kept and calls == [str(cn["sd_pth"])]
    session.generate(request(tmp_path, model="tiny-sdxl", steps=1))  # a model switch drops it with the pipeline
    assert models.attached(session.model.pipe) == {} and not vars(session.model.pipe).get("_lowvram_controlnet_cache")


def test_out_of_memory_in_a_controlnet_step_steps_down_without_reloading_it(cn, tmp_path, monkeypatch):
    """Simulated out-of-memory: the ControlNet's forward raises torch.OutOfMemoryError once (at highvram, the
    GPU ladder run on this CPU); the job finishes one rung down with the same ControlNet, not loaded again."""
    calls = []
    real = models.load_controlnet
    monkeypatch.setattr(models, "load_controlnet", lambda *a, **k: calls.append(1) or real(*a, **k))
    session = Session(preset="highvram")
    unit = ControlNetUnit(str(cn["sd"]), str(cn["image"]))
    session.generate(request(tmp_path, unit, steps=1))
    net = session.model.pipe.controlnet0
    weight = net.conv_in.weight
    failed = files.out_of_memory_once(net)
    result = session.generate(request(tmp_path, unit))
    assert [(a["preset"], a["stage"], a["outcome"]) for a in result.attempts][:2] == [
        ("highvram", "denoise", "oom"), ("medvram", "denoise", "ok")]
    assert session.model.pipe.controlnet0 is net and net.conv_in.weight is weight and calls == [1]
    assert "ControlNet 0" in read_png_metadata(result.images[0])[0]


# ------------------------------------------------------------------------------------- memory settings


@pytest.fixture()
def attached(cn, tiny_path):
    from lowvram_gen.engines.sd.controlnet import use_controlnets
    from lowvram_gen.models.loading import load
    from lowvram_gen.models.resolve import resolve

    model = load(resolve("tiny"), "float32")
    source = models.resolve_controlnet(str(cn["sd"]))
    net = models.kept(model.pipe, source, dict(model.pipe.unet.config), "float32")
    use_controlnets(model.pipe, [net])
    return model.pipe, net


def _latents(pipe, cn):
    from lowvram_gen.engines.sd import pipeline as sd

    req = GenerationRequest(prompt="a boat", width=SIDE, height=SIDE, steps=2, cfg_scale=7.0, seed=SEED,
                            controlnets=(ControlNetUnit(str(cn["sd"]), str(cn["image"])),)).validated()
    sd.set_sampler(pipe, "default")
    return sd.denoise(pipe, sd.Pass(req, [SEED], SIDE, SIDE), "cpu").latents


def test_the_controlnet_pipeline_shares_the_weights_as_they_are(cn, tiny_path):
    """The ControlNet pipeline of a pass is made over the loaded components without copying or casting them
    (DiffusionPipeline.from_pipe would cast them all to float32 in place)."""
    from lowvram_gen.engines.sd import pipeline as sd
    from lowvram_gen.engines.sd.controlnet import for_pass, use_controlnets
    from lowvram_gen.models.loading import load
    from lowvram_gen.models.resolve import resolve

    model = load(resolve("tiny"), "float16")
    net = models.load_controlnet(models.resolve_controlnet(str(cn["sd"])), dict(model.pipe.unet.config), "float16")
    use_controlnets(model.pipe, [net])
    req = GenerationRequest(prompt="x", controlnets=(ControlNetUnit(str(cn["sd"]), str(cn["image"]), 0.5, 0.2),),
                            control_mode="controlnet").validated()
    for init in (None, [Image.open(cn["image"])]):
        control, kwargs = for_pass(model.pipe, sd.Pass(req, [1], SIDE, SIDE, init=init))
        assert type(control).__name__ == ("StableDiffusionControlNetPipeline" if init is None else
                                          "StableDiffusionControlNetImg2ImgPipeline")
        assert control.unet is model.pipe.unet and control.controlnet is net and control.vae is model.pipe.vae
        assert {model.pipe.unet.dtype, net.dtype, model.pipe.text_encoder.dtype} == {torch.float16}
        assert kwargs["image" if init is None else "control_image"].size == (SIDE, SIDE)
        # the guidance window is the extension's (control/weights.py), put on the ControlNet, not diffusers' window
        assert (kwargs["controlnet_conditioning_scale"], kwargs["guess_mode"]) == (0.5, True)
        assert "control_guidance_start" not in kwargs and net._lowvram_rules[0].start == 0.2


def test_offload_presets_put_their_hooks_on_the_controlnet_and_give_the_same_result(attached, cn):
    from diffusers.hooks.group_offloading import _is_group_offload_enabled

    from lowvram_gen.models.blocks import blocks_of

    pipe, net = attached
    reference = _latents(pipe, cn)
    apply_mod.apply_settings(pipe, MemorySettings(dtype="float32", offload="model"), probe("cpu"))
    assert hasattr(net, "_hf_hook") and len(pipe._lowvram_controlnet_hooks) == 1  # model offload: its own hook
    offloaded = []
    monkey = pipe._lowvram_controlnet_hooks[0]
    monkey.offload = lambda: offloaded.append(1)
    apply_mod.PipelineOps(pipe).controlnets_off()  # what the runner calls when the denoiser is done
    assert offloaded == [1]
    assert torch.allclose(_latents(pipe, cn), reference, atol=1e-5)
    for offload in ("group", "sequential"):
        apply_mod.apply_settings(pipe, MemorySettings(dtype="float32", offload=offload), probe("cpu"))
        assert not hasattr(net, "_hf_hook") and _is_group_offload_enabled(net)  # streamed as the UNet is
        assert torch.allclose(_latents(pipe, cn), reference, atol=1e-5)
    # budget: half the UNet's and the ControlNet's blocks resident, the rest streamed, run for real on this CPU
    total = sum(b for _, m in apply_mod._stepped(pipe) for _, b in blocks_of(m))
    applied = apply_mod.apply_settings(pipe, MemorySettings(dtype="float32", offload="budget",
                                                            resident_bytes=total // 2), probe("cpu"))
    streamed = [n.split(":", 1)[1] for n in applied.residency.streamed if n.startswith("controlnet0:")]
    assert streamed and all(_is_group_offload_enabled(net.get_submodule(n)) for n in streamed)
    assert torch.allclose(_latents(pipe, cn), reference, atol=1e-5)
    apply_mod.apply_settings(pipe, MemorySettings(dtype="float32"), probe("cpu"))
    assert not _is_group_offload_enabled(net)


def test_quantize_takes_the_controlnet_with_the_unet(attached, cn):
    from lowvram_gen.models.quantize import kinds

    pipe, _ = attached
    apply_mod.apply_settings(pipe, MemorySettings(dtype="float32", quantize="int8"), probe("cpu"))
    assert kinds(pipe) == {"unet": "int8", "text_encoder": "int8", "controlnet0": "int8"}
    assert torch.isfinite(_latents(pipe, cn)).all()
    assert "controlnet0" in apply_mod.needs_reload(pipe, MemorySettings(dtype="float32"))


def test_budget_splits_the_controlnet_with_the_unet_as_the_planner_counts_it(attached, cn, tiny_path):
    """apply's split of the loaded UNet and ControlNet is the planner's, block for block (names and sizes), so the
    plan's resident bytes are what runs; with a small budget some of the ControlNet's blocks stream."""
    from lowvram_gen.models import profile as profiles
    from lowvram_gen.planning.controlnet import controlnet_profile, with_controlnets

    pipe, net = attached
    source = models.resolve_controlnet(str(cn["sd"]))
    profile = with_controlnets(profiles.profile_from_folder(tiny_path),
                               [controlnet_profile(models.config_of(source), "tiny-cn")])
    planned = [(n, c * 4) for n, c in profile.residency_blocks]  # float32: 4 bytes an element
    total = sum(b for _, b in planned)
    split = apply_mod.budget_split(pipe, MemorySettings(offload="budget", resident_bytes=total // 2), fake(8),
                                   apply_mod.PipelineOps(pipe))
    assert sorted([*split.resident, *split.streamed]) == sorted(n for n, _ in planned)
    assert split.resident_bytes + split.streamed_bytes_per_step == total
    assert any(n.startswith("controlnet0:") for n in split.streamed)
    assert any(n.startswith("controlnet0:") for n in split.resident)


# ------------------------------------------------------------------------------------------ the plan


def plan_json(capsys, *args):
    assert main(["plan", "--json", *args]) == 0
    return json.loads(capsys.readouterr().out)


def test_plan_counts_the_controlnet_weights_and_activations(cn, capsys):
    without = plan_json(capsys, "--vram", "4GiB", "--model", "tiny", "--width", "512", "--height", "512")
    with_cn = plan_json(capsys, "--vram", "4GiB", "--model", "tiny", "--width", "512", "--height", "512",
                        "--controlnet", str(cn["sd"]))
    rows = {p["name"].split("@")[0]: p for p in without["presets"]}  # budget@<resident>: sized per plan
    assert with_cn["controlnets"] == [str(cn["sd"])]
    for row in with_cn["presets"]:
        b = row["breakdown"]
        base = rows[row["name"].split("@")[0]]["breakdown"]
        assert b["controlnet_bytes"] > 0  # part of the denoiser's bytes (int8/int4: counted in fractional bytes)
        assert abs(b["denoiser_bytes"] - base["denoiser_bytes"] - b["controlnet_bytes"]) <= 1
        assert b["controlnet_resident_bytes"] + b["controlnet_streamed_bytes_per_step"] == b["controlnet_bytes"]
        assert b["unet_bytes"] > base["unet_bytes"]  # its residuals beside the UNet's step
        if row["name"] == "highvram":
            assert b["controlnet_resident_bytes"] == b["controlnet_bytes"]
            assert row["estimate_bytes"] >= rows["highvram"]["estimate_bytes"] + b["controlnet_bytes"]
        if row["name"] == "lowvram":
            assert b["controlnet_streamed_bytes_per_step"] == b["controlnet_bytes"]
            assert row["streamed_bytes_per_step"] == rows["lowvram"]["streamed_bytes_per_step"] + b["controlnet_bytes"]


def test_plan_sdxl_with_the_known_sdxl_controlnet_fits_a_6gib_card_at_1024(capsys):
    """Issue 20's done-when (ComfyUI issue 1199: the SDXL UNet and an SDXL ControlNet side by side on 6 GB)."""
    out = plan_json(capsys, "--vram", "6GiB", "--model", "sdxl", "--controlnet", "sdxl")
    chosen = next(p for p in out["presets"] if p["name"] == out["preset"])
    assert (out["width"], out["height"]) == (1024, 1024) and (chosen["width"], chosen["height"]) == (1024, 1024)
    assert chosen["fits"] and not out["refusal"]
    assert 2.4e9 < chosen["breakdown"]["controlnet_bytes"] < 2.6e9  # 1.25 B weights in fp16
    plain = plan_json(capsys, "--vram", "6GiB", "--model", "sdxl")
    assert plain["preset"] == "medvram" and out["preset"] != "medvram"  # it no longer fits beside the UNet whole
    # the activations of one step grow with the pixels, ControlNet included
    small = plan_json(capsys, "--vram", "6GiB", "--model", "sdxl", "--controlnet", "sdxl", "--width", "512",
                      "--height", "512", "--preset", "highvram")["presets"][0]["breakdown"]["unet_bytes"]
    big = next(p for p in out["presets"] if p["name"] == "highvram")["breakdown"]["unet_bytes"]
    assert 3.5 < big / small < 4.5


def test_plan_refuses_a_controlnet_of_another_family(capsys):
    assert main(["plan", "--model", "sd15", "--controlnet", "sdxl"]) == 2
    err = capsys.readouterr().err
    assert "made for SDXL (cross-attention 2048" in err and "'sd15' is SD 1.x" in err


# ------------------------------------------------------------------------------------------ the PNG text


def test_png_text_reads_back_and_needs_its_control_image(cn, tmp_path, capsys, monkeypatch):
    code = main(["generate", "a boat", "--controlnet", f"{cn['sd_pth']}:0.8:0.1:0.9", "--control-image",
                 str(cn["image"]), "--preprocessor", "canny:50:150", "--control-mode", "controlnet", "--steps", "2",
                 "--width", "64", "--height", "64", "--seed", "3", "--outdir", str(tmp_path), "--json"])
    assert code == 0
    first = json.loads(capsys.readouterr().out)["images"][0]
    text = parse_a1111_parameters(read_png_metadata(first)[0])["ControlNet 0"]
    label = f"control_tiny_canny [{models.short_hash(Path(cn['sd_pth']))}]"
    assert text == (f"Module: canny, Model: {label}, Weight: 0.8, Resize Mode: Just Resize, Low Vram: False, "
                    "Processor Res: 64, Threshold A: 50, Threshold B: 150, Guidance Start: 0.1, Guidance End: 0.9, "
                    "Pixel Perfect: True, Control Mode: ControlNet is more important, Hr Option: Both, "
                    "Save Detected Map: False")
    assert main(["generate", "--from-png", first, "--outdir", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "needs a control image" in err and "a PNG's parameters do not hold it" in err
    # with its image (the model by its name in models/ControlNet, as the PNG writes it) the same image comes back
    (tmp_path / "models" / "ControlNet").mkdir(parents=True)
    (tmp_path / "models" / "ControlNet" / Path(cn["sd_pth"]).name).write_bytes(Path(cn["sd_pth"]).read_bytes())
    monkeypatch.setenv("LOWVRAM_GEN_MODELS", str(tmp_path / "models"))
    assert main(["generate", "--from-png", first, "--control-image", str(cn["image"]), "--outdir", str(tmp_path),
                 "--json"]) == 0
    again = json.loads(capsys.readouterr().out)["images"][0]
    assert np.array_equal(pixels(first), pixels(again))
    unit = read_png_metadata(again)[1]["request"]["controlnets"][0]
    assert (unit["model"], unit["weight"], unit["guidance_start"], unit["preprocessor"], unit["canny_low"]) == (
        "control_tiny_canny", 0.8, 0.1, "canny", 50)


def test_an_a1111_controlnet_field_reads_as_a_unit():
    notes = []
    unit, mode = unit_from_text("ControlNet 0", "Module: canny, Model: control_v11p_sd15_canny [d14c016b], Weight: 1, "
                                "Resize Mode: Crop and Resize, Low Vram: False, Processor Res: 512, Threshold A: 100, "
                                "Threshold B: 200, Guidance Start: 0, Guidance End: 1, Pixel Perfect: False, "
                                "Control Mode: My prompt is more important, Hr Option: Both, Save Detected Map: True",
                                notes)
    assert unit == ControlNetUnit("control_v11p_sd15_canny", None, 1.0, 0.0, 1.0, "canny", 100, 200, "crop")
    assert mode == "prompt" and not notes
    assert GenerationRequest(prompt="x", control_mode=mode).validated().control_mode == "prompt"


# ------------------------------------------------------------------------------------------ hires fix


@pytest.mark.parametrize("upscaler", ["Lanczos", "Latent"])
def test_hires_fix_gives_the_second_pass_the_control_map_at_the_hires_size(upscaler, cn, tmp_path, tiny_path,
                                                                            monkeypatch, posterior_mode):
    """As A1111's extension (its "Hr Option: Both"): the first pass gets the control map at the job's size, the hires
    pass the control image resized to the hires size (its preprocessor run there). With a pixel upscaler the
    result equals diffusers' ControlNet txt2img pipeline, its image upscaled (Lanczos), then diffusers' ControlNet
    img2img pipeline on it with the map at the hires size and the extension's soft weights on the ControlNet's
    residuals (it scales a canny unit's in a hires pass: extension_forward)."""
    from lowvram_gen.engines.sd import controlnet as engine

    calls = []
    real = engine.for_pass

    def watched(pipe, step):
        out = real(pipe, step)
        calls.append((step.width, step.height, step.init is not None, out[1]))
        return out

    monkeypatch.setattr(engine, "for_pass", watched)
    unit = ControlNetUnit(str(cn["sd"]), str(cn["image"]), preprocessor="canny")
    hires = dict(hires_scale=2, hires_upscaler=upscaler, hires_denoise=0.5)
    ours = Session(device="cpu").generate(request(tmp_path, unit, **hires))
    assert [(w, h, i2i) for w, h, i2i, _ in calls] == [(SIDE, SIDE, False), (2 * SIDE, 2 * SIDE, True)]
    first, second = calls[0][3]["image"], calls[1][3]["control_image"]
    assert first.size == (SIDE, SIDE) and second.size == (2 * SIDE, 2 * SIDE)
    from lowvram_gen.control.preprocess import control_map

    assert np.array_equal(np.asarray(second), np.asarray(control_map(str(cn["image"]), 2 * SIDE, 2 * SIDE, "canny")))
    assert Image.open(ours.images[0]).size == (2 * SIDE, 2 * SIDE)
    assert 'ControlNet 0: "Module: canny' in read_png_metadata(ours.images[0])[0]
    if upscaler != "Lanczos":
        return
    import diffusers
    from diffusers import ControlNetModel

    net = ControlNetModel.from_pretrained(cn["sd"])
    txt = diffusers.StableDiffusionControlNetPipeline.from_pretrained(str(tiny_path), controlnet=net)
    txt.set_progress_bar_config(disable=True)
    low = txt("a boat", image=control_map(str(cn["image"]), SIDE, SIDE, "canny"), num_inference_steps=STEPS,
              width=SIDE, height=SIDE, guidance_scale=CFG, generator=torch.Generator().manual_seed(SEED)).images[0]
    i2i = diffusers.StableDiffusionControlNetImg2ImgPipeline.from_pipe(txt)
    i2i.set_progress_bar_config(disable=True)
    with extension_forward():
        # hires fix runs exactly its STEPS, the end of a schedule of int(STEPS / 0.5) (A1111's; img2img_steps.py)
        high = i2i("a boat", image=low.resize((2 * SIDE, 2 * SIDE), Image.LANCZOS), control_image=second,
                   strength=0.5, num_inference_steps=2 * STEPS, guidance_scale=CFG,
                   generator=torch.Generator().manual_seed(SEED),
                   controlnet_conditioning_scale=1.0).images[0]  # the unit's weight (the img2img pipeline's: 0.8)
    assert np.array_equal(pixels(ours.images[0]), np.asarray(high.convert("RGB")).astype(int))


# ------------------------------------------------------------------------------------------ the batch script


def test_batch_lines_take_units_with_our_keys_the_extensions_and_its_api_shape(cn, tmp_path):
    """A .jsonl line's `controlnets` (our unit fields, or A1111's extension keys: module, input_image, threshold_a/b,
    control_mode per unit) and A1111's API `alwayson_scripts` give the request the same units; the batch's job
    makes the image a session job with those units makes."""
    from lowvram_gen.batch.files import expand, read_entries
    from lowvram_gen.batch.command import run_batch

    image, model = str(cn["image"]), str(cn["sd"])
    ours = {"model": model, "image": image, "weight": 0.7, "guidance_end": 0.8, "preprocessor": "canny",
            "canny_low": 50, "canny_high": 150}
    theirs = {"enabled": True, "model": f"{model} [d14c016b]", "input_image": image, "weight": 0.7,
              "guidance_start": 0.0, "guidance_end": 0.8, "module": "canny", "threshold_a": 50.0, "threshold_b": 150.0,
              "processor_res": 512, "pixel_perfect": True, "resize_mode": "Just Resize", "control_mode": 2}
    off = {"enabled": False, "model": "not-there", "input_image": "nope.png"}
    base = {"prompt": "a boat", "width": SIDE, "height": SIDE, "steps": STEPS, "seed": SEED, "cfg_scale": CFG,
            "sampler": own_sampler("tiny")}  # as `request` asks
    lines = [{**base, "controlnets": [ours], "control_mode": "controlnet"},
             {**base, "controlnets": [theirs, off]},
             {**base, "alwayson_scripts": {"controlnet": {"args": [theirs]}}},
             {**base, "width": 2 * SIDE, "controlnets": [{**theirs, "resize_mode": "Crop and Resize"}]},
             {**base, "controlnets": [theirs, {**theirs, "control_mode": 0}]}]
    file = tmp_path / "cn.jsonl"
    file.write_text("\n".join(json.dumps(line) for line in lines) + "\n")
    jobs = expand(read_entries(file), {})
    unit = ControlNetUnit(model, image, 0.7, 0.0, 0.8, "canny", 50, 150)
    assert [(j.request.controlnets, j.request.control_mode) for j in jobs.jobs[:3]] == [((unit,), "controlnet")] * 3
    assert [b.line for b in jobs.bad] == [5] and "one control mode for every unit" in jobs.bad[0].error
    assert jobs.jobs[3].request.controlnets == (replace(unit, resize_mode="crop"),)  # Crop and Resize runs

    file.write_text(json.dumps(lines[1]) + "\n")
    out = tmp_path / "out"
    run_batch(file, out, {}, {"device": "cpu"}, session=Session(device="cpu"))
    made = [p for p in out.rglob("*.png") if ".incomplete" not in p.parts]
    alone = Session(device="cpu").generate(request(tmp_path / "alone", unit, control_mode="controlnet")).images[0]
    assert len(made) == 1 and np.array_equal(pixels(made[0]), pixels(alone))
    assert 'ControlNet 0: "Module: canny' in read_png_metadata(made[0])[0]
