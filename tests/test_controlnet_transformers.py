"""SD3 and Flux ControlNets (issue 20): loading, the job, the memory settings, the plan and the refusals.

The ControlNets are tiny ones for the tiny SD3 and Flux models (tests/tiny_transformers.py): an SD3ControlNetModel
built at the tiny transformer's width, and diffusers' FluxControlNetModel.from_transformer of the tiny Flux
transformer. Their zero-initialised layers (the residual projections, the control input's embedding) get seeded
random values so that a ControlNet changes the image. Each is saved as a diffusers folder and as a single
.safetensors in diffusers' layout (a file's config is derived from its tensors' shapes: nothing is fetched).
Out-of-memory is simulated as the ladder tests do it: a forward pre-hook on the ControlNet raises
torch.OutOfMemoryError.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from PIL import Image
from tiny_transformers import build_tiny_flux, build_tiny_sd3, pixels

import controlnet_files as files  # tests/controlnet_files.py

from lowvram_gen import GenerationRequest
from lowvram_gen.cli.main import main
from lowvram_gen.control.units import ControlNetUnit
from lowvram_gen.engines.sd import apply as apply_mod
from lowvram_gen.errors import InvalidRequest
from lowvram_gen.hardware.device import probe
from lowvram_gen.models import controlnet as models
from lowvram_gen.outputs import read_png_metadata
from lowvram_gen.session import Session
from lowvram_gen.settings import MemorySettings

SIDE, STEPS, SEED = 64, 2, 5
CFG = {"sd3": 5.0, "flux": 3.5}


def _randomize(cn, prefixes: tuple[str, ...], seed: int):
    torch.manual_seed(seed)
    with torch.no_grad():
        for name, param in cn.named_parameters():
            if name.startswith(prefixes):
                param.copy_(torch.randn(param.shape) * 0.05)
    return cn.eval()


def _save(cn, root, name):
    from safetensors.torch import save_file

    cn.save_pretrained(root / name, safe_serialization=True)
    path = root / f"{name}.safetensors"
    save_file({k: v.contiguous() for k, v in cn.state_dict().items()}, str(path))
    return root / name, path


@pytest.fixture(scope="module")
def tf(tmp_path_factory):
    """The tiny SD3 and Flux model folders, a ControlNet for each (folder and single file) and a control image."""
    from diffusers import FluxControlNetModel, SD3ControlNetModel

    root = tmp_path_factory.mktemp("transformer-controlnets")
    sd3, flux = build_tiny_sd3(), build_tiny_flux()
    sd3.save_pretrained(root / "sd3", safe_serialization=True)
    flux.save_pretrained(root / "flux", safe_serialization=True)
    torch.manual_seed(1)
    sd3_cn = SD3ControlNetModel(sample_size=16, patch_size=2, in_channels=16, num_layers=1, attention_head_dim=8,
                                num_attention_heads=2, joint_attention_dim=64, caption_projection_dim=16,
                                pooled_projection_dim=64, pos_embed_max_size=32)  # the tiny SD3 transformer's shape
    sd3_cn = _randomize(sd3_cn, ("controlnet_blocks", "pos_embed_input"), 1)
    flux_cn = FluxControlNetModel.from_transformer(flux.transformer, num_layers=1, num_single_layers=1,
                                                   attention_head_dim=16, num_attention_heads=2)
    flux_cn = _randomize(flux_cn, ("controlnet_blocks", "controlnet_single_blocks", "controlnet_x_embedder"), 2)
    out = {"sd3": str(root / "sd3"), "flux": str(root / "flux")}
    out["sd3_cn"], out["sd3_file"] = _save(sd3_cn, root, "tiny-sd3-cn")
    out["flux_cn"], out["flux_file"] = _save(flux_cn, root, "tiny-flux-cn")
    image = np.zeros((SIDE, SIDE, 3), dtype=np.uint8)
    image[16:48, 16:48] = 255
    Image.fromarray(image).save(root / "control.png")
    out["image"] = root / "control.png"
    return out


def request(tf, family, *units, **fields):
    base = dict(prompt="a boat", model=tf[family], width=SIDE, height=SIDE, steps=STEPS, seed=SEED,
                cfg_scale=CFG[family], outdir=str(fields.pop("outdir")))
    return GenerationRequest(**{**base, **fields}, controlnets=tuple(units))


def reference(tf, family, *nets, img2img=False, **call):
    """Plain diffusers: the family's ControlNet pipeline from the model folder and the ControlNet folders."""
    import diffusers

    cls = {"sd3": "SD3ControlNetModel", "flux": "FluxControlNetModel"}[family]
    loaded = [getattr(diffusers, cls).from_pretrained(str(n)) for n in nets]
    name = {"sd3": "StableDiffusion3ControlNetPipeline", "flux": "FluxControlNet{}Pipeline".format(
        "Img2Img" if img2img else "")}[family]
    extra = dict(text_encoder_3=None, tokenizer_3=None) if family == "sd3" else {}
    pipe = getattr(diffusers, name).from_pretrained(tf[family], controlnet=loaded[0] if len(loaded) == 1 else loaded,
                                                    **extra)
    pipe.set_progress_bar_config(disable=True)
    pipe.vae.enable_slicing()  # as the CPU preset runs: the control image's VAE encode one image at a time
    torch.manual_seed(SEED)  # SD3's pipeline samples the control image's latents from the global random state
    out = pipe("a boat", num_inference_steps=STEPS, width=SIDE, height=SIDE, guidance_scale=CFG[family],
               generator=torch.Generator().manual_seed(SEED), **call)
    return np.asarray(out.images[0].convert("RGB")).astype(int)


# ------------------------------------------------------------------------------------------ loading


@pytest.mark.parametrize("family", ["sd3", "flux"])
def test_a_single_files_config_from_its_shapes_is_the_folders(family, tf):
    """Nothing fetched: the file's header gives the config, and the file loads to the folder's weights."""
    folder, file = (models.resolve_controlnet(str(tf[f"{family}_{k}"])) for k in ("cn", "file"))
    derived = models.config_of(file)
    saved = models.config_of(folder)
    for key, value in derived.items():
        if key not in ("attention_head_dim", "num_attention_heads"):  # the base's, completed at load
            assert saved[key] == value or (key.endswith("layers") and list(saved[key]) == list(value)), key
    import diffusers

    base = dict(getattr(diffusers, "SD3Transformer2DModel" if family == "sd3" else "FluxTransformer2DModel")
                .load_config(tf[family], subfolder="transformer"))
    a = models.load_controlnet(file, base, "float32")
    b = models.load_controlnet(folder, base, "float32")
    assert type(a) is type(b) and a.config.num_attention_heads == b.config.num_attention_heads
    assert all(torch.equal(a.state_dict()[k], v) for k, v in b.state_dict().items())


@pytest.mark.parametrize("cls,fields", [
    ("FluxControlNetModel", dict(conditioning_embedding_channels=3, num_mode=4, guidance_embeds=False)),  # XLabs'
    ("SD3ControlNetModel", dict(qk_norm="rms_norm", dual_attention_layers=(0,), pos_embed_max_size=16)),  # SD3.5's
    ("SD3ControlNetModel", dict(joint_attention_dim=None, use_pos_embed=False, force_zeros_for_pooled_projection=False,
                                caption_projection_dim=16)),  # SD3.5 Large's: the transformer's pos_embed, no text
], ids=["flux-xlabs-union", "sd3.5-qk-norm-dual", "sd3.5-large"])
def test_the_other_kinds_configs_come_from_their_shapes(cls, fields, tmp_path):
    """The variants diffusers' classes have (XLabs' conditioning embedding and a union's mode embedder; SD3.5's q/k
    norm, dual attention, and its Large ControlNets without a context embedder or position table of their own): a
    file's header gives the config each was built with."""
    import diffusers
    from safetensors.torch import save_file

    base = dict(num_layers=2, attention_head_dim=8, num_attention_heads=2, pooled_projection_dim=24)
    if cls == "FluxControlNetModel":
        base.update(num_single_layers=1, in_channels=64, joint_attention_dim=32, axes_dims_rope=(2, 2, 4))
    else:
        base.update(in_channels=16, joint_attention_dim=40, caption_projection_dim=16)
    torch.manual_seed(0)
    model = getattr(diffusers, cls)(**{**base, **fields})
    path = tmp_path / "cn.safetensors"
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(path))
    derived = models.config_of(models.resolve_controlnet(str(path)))
    # without a q/k norm SD3's head width is not in the shapes: the base transformer's, completed at load
    unseen = () if fields.get("qk_norm") or cls.startswith("Flux") else ("attention_head_dim", "num_attention_heads")
    for key, value in derived.items():
        if not key.startswith("_") and key not in unseen:
            made = model.config[key]
            assert (list(made) if isinstance(made, tuple) else made) == value, key
    if fields.get("num_mode"):  # a union ControlNet wants a control type per unit: refused before it loads
        from dataclasses import replace

        from lowvram_gen.models import profile as profiles
        from lowvram_gen.planning.controlnet import check_matches, controlnet_profile

        flux = replace(profiles.profile_builtin("flux"), transformer_hidden=16)
        with pytest.raises(InvalidRequest, match="Flux union ControlNet, which needs a control type"):
            check_matches(flux, controlnet_profile(derived, "union"), "flux")


def test_found_by_name_in_models_controlnet_and_as_a_hub_id_from_the_cache(tf, tmp_path, monkeypatch):
    import shutil

    folder = tmp_path / "models" / "ControlNet"
    folder.mkdir(parents=True)
    shutil.copy(tf["sd3_file"], folder / "sd3_canny.safetensors")
    shutil.copytree(tf["flux_cn"], folder / "flux-canny")
    monkeypatch.setenv("LOWVRAM_GEN_MODELS", str(tmp_path / "models"))
    for name, kind, cls in (("sd3_canny", "file", "SD3ControlNetModel"),
                            ("flux-canny", "folder", "FluxControlNetModel")):
        source = models.resolve_controlnet(name)
        assert source.kind == kind and models.config_of(source)["_class_name"] == cls
    snapshot = files.in_hub_cache(tf["flux_cn"], "lowvram-test/flux-cn", tmp_path / "hub", monkeypatch)
    source = models.resolve_controlnet("lowvram-test/flux-cn")
    assert source.path == snapshot.resolve()
    assert models.transformer_config(source)["_class_name"] == "FluxControlNetModel"
    from safetensors.torch import save_file

    from lowvram_gen.errors import ModelLoadError

    xlabs = tmp_path / "flux-canny-controlnet-v3.safetensors"  # XLabs' own layout, not diffusers'
    save_file({"double_blocks.0.img_attn.qkv.weight": torch.zeros(3, 1), "controlnet_blocks.0.weight": torch.zeros(1)},
              str(xlabs))
    with pytest.raises(ModelLoadError, match="another key layout than diffusers'.*give the diffusers version"):
        models.config_of(models.resolve_controlnet(str(xlabs)))
    from safetensors.torch import load_file

    pth = tmp_path / "flux_cn.pth"  # a pickle of one: counted for the plan, refused at load saying what to give
    torch.save(load_file(str(tf["flux_file"])), str(pth))
    source = models.resolve_controlnet(str(pth))
    assert models.config_of(source)["_class_name"] == "FluxControlNetModel"
    with pytest.raises(ModelLoadError, match="is read from a .safetensors file .*not a .pth one"):
        models.load_controlnet(source, {}, "float32")


def test_a_wrong_family_is_refused_before_the_model_loads(tf, tmp_path, capsys, monkeypatch):
    import lowvram_gen.session as session_mod

    monkeypatch.setattr(session_mod, "load", lambda *a, **k: pytest.fail("nothing may load"))
    session = Session(device="cpu")
    cases = [("flux", "sd3_cn", "it is a ControlNet for SD3 and the model '.*flux' is Flux"),
             ("sd3", "flux_file", "it is a ControlNet for Flux and the model '.*sd3' is SD3"),
             ("tiny", "sd3_file", "it is a ControlNet for SD3 and the model 'tiny' is a 32-wide")]
    for model, net, words in cases:
        req = GenerationRequest(prompt="x", model=tf.get(model, model), width=SIDE, height=SIDE, outdir=str(tmp_path),
                                controlnets=(ControlNetUnit(str(tf[net]), str(tf["image"])),))
        with pytest.raises(InvalidRequest, match=words):
            session.generate(req)
    from lowvram_gen.models import profile as profiles
    from lowvram_gen.planning.controlnet import check_matches, controlnet_profile

    wider = {**models.config_of(models.resolve_controlnet(str(tf["sd3_cn"]))), "num_attention_heads": 4}
    with pytest.raises(InvalidRequest, match="made for a 32-wide SD3 transformer and the model 'm''s is 16 wide"):
        check_matches(profiles.profile_from_folder(tf["sd3"]), controlnet_profile(wider, "wide"), "m")
    code = main(["generate", "a boat", "--model", "tiny-sdxl", "--controlnet", str(tf["flux_cn"]), "--control-image",
                 str(tf["image"]), "--outdir", str(tmp_path)])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1 and "it is a ControlNet for Flux and the model 'tiny-sdxl'" in err


def test_what_diffusers_has_no_pipeline_for_is_refused_before_the_model_loads(tf, tmp_path, monkeypatch):
    """SD3's ControlNet pipeline has no img2img (so no hires fix), neither family has a guess mode or A1111's soft
    injection."""
    import lowvram_gen.session as session_mod

    monkeypatch.setattr(session_mod, "load", lambda *a, **k: pytest.fail("nothing may load"))
    session = Session(device="cpu")
    sd3 = ControlNetUnit(str(tf["sd3_cn"]), str(tf["image"]))
    flux = ControlNetUnit(str(tf["flux_cn"]), str(tf["image"]))
    for family, unit, fields, words in [
            ("sd3", sd3, dict(init_image=str(tf["image"])), "no SD3 ControlNet img2img pipeline"),
            ("sd3", sd3, dict(hires_scale=2, hires_upscaler="Lanczos"), "hires fix's second pass is img2img"),
            ("flux", flux, dict(control_mode="controlnet"), "not in diffusers' Flux ControlNet pipeline: use balanced"),
            ("sd3", sd3, dict(control_mode="controlnet"), "not in diffusers' SD3 ControlNet pipeline"),
            ("flux", flux, dict(control_mode="prompt"), "control mode 'prompt' is not in diffusers' Flux ControlNet")]:
        with pytest.raises(InvalidRequest, match=words):
            session.generate(request(tf, family, unit, outdir=tmp_path, **fields))


# ------------------------------------------------------------------------------------------ the job


@pytest.mark.parametrize("family,kind", [("sd3", "cn"), ("sd3", "file"), ("flux", "cn"), ("flux", "file")])
def test_a_controlnet_job_equals_plain_diffusers(family, kind, tf, tmp_path):
    unit = ControlNetUnit(str(tf[f"{family}_{kind}"]), str(tf["image"]), 0.8, 0.0, 0.9)
    session = Session(device="cpu")
    ours = session.generate(request(tf, family, unit, outdir=tmp_path))
    plain = reference(tf, family, tf[f"{family}_cn"], control_image=Image.open(tf["image"]),
                      controlnet_conditioning_scale=0.8, control_guidance_end=0.9)
    assert np.array_equal(pixels(ours.images[0]), plain)
    assert 'ControlNet 0: "Module: none, Model: tiny' in read_png_metadata(ours.images[0])[0]
    again = session.generate(request(tf, family, unit, outdir=tmp_path))  # the same seed, the same image
    assert np.array_equal(pixels(again.images[0]), plain)


def test_flux_img2img_and_two_units_equal_plain_diffusers(tf, tmp_path, posterior_mode):
    session = Session(device="cpu")
    unit = ControlNetUnit(str(tf["flux_cn"]), str(tf["image"]))
    ours = session.generate(request(tf, "flux", unit, init_image=str(tf["image"]), strength=0.6, steps=4,
                                    negative_prompt="fog", outdir=tmp_path))  # Flux ignores it (said in warnings)
    control = Image.open(tf["image"])
    import diffusers
    from diffusers import FluxControlNetModel

    pipe = diffusers.FluxControlNetImg2ImgPipeline.from_pretrained(
        tf["flux"], controlnet=FluxControlNetModel.from_pretrained(str(tf["flux_cn"])))
    pipe.set_progress_bar_config(disable=True)
    pipe.vae.enable_slicing()
    # denoise 0.6 of 4 steps runs A1111's (and Forge's, for Flux) int(0.6 x 4) + 1 = 3 of 4: diffusers' 0.75
    plain = pipe("a boat", image=control, control_image=control, strength=0.75, num_inference_steps=4, width=SIDE,
                 height=SIDE, guidance_scale=CFG["flux"], generator=torch.Generator().manual_seed(SEED)).images[0]
    assert np.array_equal(pixels(ours.images[0]), np.asarray(plain.convert("RGB")).astype(int))
    assert any("negative prompt" in w for w in ours.warnings)
    from lowvram_gen.control.preprocess import control_map

    units = (ControlNetUnit(str(tf["flux_cn"]), str(tf["image"]), 0.7, 0.0, 0.8),
             ControlNetUnit(str(tf["flux_file"]), str(tf["image"]), preprocessor="canny"))
    two = session.generate(request(tf, "flux", *units, outdir=tmp_path))
    assert list(models.attached(session.model.pipe)) == ["controlnet0", "controlnet1"]
    plain = reference(tf, "flux", tf["flux_cn"], tf["flux_cn"], control_image=[
        control, control_map(str(tf["image"]), SIDE, SIDE, "canny")], controlnet_conditioning_scale=[0.7, 1.0],
        control_guidance_start=[0.0, 0.0], control_guidance_end=[0.8, 1.0])
    assert np.array_equal(pixels(two.images[0]), plain)


def test_two_sd3_units_of_one_model_equal_plain_diffusers_multi_controlnet(tf, tmp_path):
    """diffusers' SD3MultiControlNetModel over the one loaded ControlNet, a unit each with its own map and weight."""
    from lowvram_gen.control.preprocess import control_map

    session = Session(device="cpu")
    units = (ControlNetUnit(str(tf["sd3_cn"]), str(tf["image"]), 0.6),
             ControlNetUnit(str(tf["sd3_file"]), str(tf["image"]), 1.2, 0.5, 1.0, preprocessor="canny"))
    ours = session.generate(request(tf, "sd3", *units, outdir=tmp_path))
    assert list(models.attached(session.model.pipe)) == ["controlnet0", "controlnet1"]  # a folder and a file: two
    plain = reference(tf, "sd3", tf["sd3_cn"], tf["sd3_cn"], control_image=[
        Image.open(tf["image"]), control_map(str(tf["image"]), SIDE, SIDE, "canny")],
        controlnet_conditioning_scale=[0.6, 1.2], control_guidance_start=[0.0, 0.5], control_guidance_end=[1.0, 1.0])
    assert np.array_equal(pixels(ours.images[0]), plain)


def test_flux_hires_fix_gives_the_second_pass_the_control_map_at_the_hires_size(tf, tmp_path, monkeypatch):
    from lowvram_gen.engines.sd import controlnet as engine

    seen = []
    real = engine.transformer_pass

    def spy(pipe, step, modules):
        control, kwargs = real(pipe, step, modules)
        seen.append((type(control).__name__, kwargs["control_image"].size))
        return control, kwargs

    monkeypatch.setattr(engine, "transformer_pass", spy)
    result = Session(device="cpu").generate(request(tf, "flux", ControlNetUnit(str(tf["flux_cn"]), str(tf["image"])),
                                                    hires_scale=2, hires_upscaler="Lanczos", outdir=tmp_path))
    assert Image.open(result.images[0]).size == (2 * SIDE, 2 * SIDE)
    assert seen == [("FluxControlNetPipeline", (SIDE, SIDE)), ("FluxControlNetImg2ImgPipeline", (2 * SIDE, 2 * SIDE))]


def test_weight_zero_is_no_controlnet_for_sd3_and_for_flux_is_diffusers_weight_zero(tf, tmp_path):
    """SD3: weight 0 adds zeros, so the image is the one without a ControlNet. Flux (InstantX's kind): diffusers'
    pipeline draws the control image's VAE latents from the call's generators before the noise, so the noise, and
    the image, differ from a job without one; it equals diffusers' own at weight 0, which is what runs."""
    session = Session(device="cpu")
    for family in ("sd3", "flux"):
        none = session.generate(request(tf, family, outdir=tmp_path))
        zero = session.generate(request(tf, family, ControlNetUnit(str(tf[f"{family}_cn"]), str(tf["image"]),
                                                                   weight=0), outdir=tmp_path))
        assert np.array_equal(pixels(none.images[0]), pixels(zero.images[0])) == (family == "sd3")
    plain = reference(tf, "flux", tf["flux_cn"], control_image=Image.open(tf["image"]),
                      controlnet_conditioning_scale=0.0)
    assert np.array_equal(pixels(zero.images[0]), plain)


# ------------------------------------------------------------------------------------------ the memory layer


@pytest.mark.parametrize("family", ["sd3", "flux"])
def test_the_controlnet_pipeline_shares_the_weights_as_they_are(family, tf):
    """The pass's ControlNet pipeline is made over the loaded components (from_pipe) without copying or casting them:
    float16 weights stay float16 (DiffusionPipeline.from_pipe would cast them all to float32 in place)."""
    from lowvram_gen.engines.sd import pipeline as sd
    from lowvram_gen.engines.sd.controlnet import for_pass, use_controlnets
    from lowvram_gen.models.loading import load
    from lowvram_gen.models.resolve import resolve

    pipe = load(resolve(tf[family]), "float16").pipe
    source = models.resolve_controlnet(str(tf[f"{family}_file"]))
    net = models.kept(pipe, source, models.base_config(pipe), "float16")
    use_controlnets(pipe, [net])
    req = GenerationRequest(prompt="x", model=tf[family], controlnets=(
        ControlNetUnit(str(source.path), str(tf["image"]), 0.5, 0.2),)).validated()
    names = {"sd3": ["StableDiffusion3ControlNetPipeline"],
             "flux": ["FluxControlNetPipeline", "FluxControlNetImg2ImgPipeline"]}[family]
    for name, init in zip(names, (None, [Image.open(tf["image"])])):
        control, kwargs = for_pass(pipe, sd.Pass(req, [1], SIDE, SIDE, init=init))
        assert type(control).__name__ == name
        assert control.transformer is pipe.transformer and control.controlnet is net and control.vae is pipe.vae
        assert {pipe.transformer.dtype, net.dtype, pipe.vae.dtype} == {torch.float16}
        assert kwargs["control_image"].size == (SIDE, SIDE)
        assert (kwargs["controlnet_conditioning_scale"], kwargs["control_guidance_start"]) == (0.5, 0.2)


@pytest.mark.parametrize("family", ["sd3", "flux"])
def test_out_of_memory_in_a_controlnet_step_steps_down_without_reloading_it(family, tf, tmp_path, monkeypatch):
    """Simulated out-of-memory: the ControlNet's forward raises torch.OutOfMemoryError once (at highvram, the GPU
    ladder run on this CPU); the job finishes one rung down with the same ControlNet, not loaded again."""
    calls = []
    real = models.load_controlnet
    monkeypatch.setattr(models, "load_controlnet", lambda *a, **k: calls.append(1) or real(*a, **k))
    session = Session(preset="highvram")
    unit = ControlNetUnit(str(tf[f"{family}_file"]), str(tf["image"]))
    session.generate(request(tf, family, unit, steps=1, outdir=tmp_path))
    net = session.model.pipe.controlnet0
    weight = next(net.parameters())
    failed = files.out_of_memory_once(net)
    result = session.generate(request(tf, family, unit, outdir=tmp_path))
    assert [(a["preset"], a["stage"], a["outcome"]) for a in result.attempts][:2] == [
        ("highvram", "denoise", "oom"), ("medvram", "denoise", "ok")]
    assert session.model.pipe.controlnet0 is net and next(net.parameters()) is weight and calls == [1]


@pytest.mark.parametrize("family", ["sd3", "flux"])
def test_offload_quantize_and_budget_take_the_controlnet_with_the_transformer(family, tf):
    """apply.py's settings on a transformer pipeline with its ControlNet: offload hooks on it, the same latents
    under each; int8 with the transformer; budget's split of both is the planner's, block for block."""
    from diffusers.hooks.group_offloading import _is_group_offload_enabled

    from lowvram_gen.engines.sd import pipeline as sd
    from lowvram_gen.engines.sd.controlnet import use_controlnets
    from lowvram_gen.models.loading import load
    from lowvram_gen.models.quantize import kinds
    from lowvram_gen.models.resolve import resolve
    from lowvram_gen.models import profile as profiles
    from lowvram_gen.planning.controlnet import controlnet_profile, with_controlnets

    model = load(resolve(tf[family]), "float32")
    pipe = model.pipe
    source = models.resolve_controlnet(str(tf[f"{family}_cn"]))
    net = models.kept(pipe, source, models.base_config(pipe), "float32")
    use_controlnets(pipe, [net])
    req = GenerationRequest(prompt="a boat", model=tf[family], width=SIDE, height=SIDE, steps=2, seed=SEED,
                            cfg_scale=CFG[family], controlnets=(ControlNetUnit(str(source.path), str(tf["image"])),))
    req = req.validated()
    pipe._lowvram_unit_slots = [0]

    def images():
        sd.set_sampler(pipe, "default")
        return np.asarray(sd.denoise(pipe, sd.Pass(req, [SEED], SIDE, SIDE), "cpu").images[0], dtype=float)

    reference = images()
    apply_mod.apply_settings(pipe, MemorySettings(dtype="float32", offload="model"), probe("cpu"))
    assert hasattr(net, "_hf_hook") and len(pipe._lowvram_controlnet_hooks) == 1
    assert np.abs(images() - reference).max() <= 1
    for offload in ("group", "sequential"):
        apply_mod.apply_settings(pipe, MemorySettings(dtype="float32", offload=offload), probe("cpu"))
        assert not hasattr(net, "_hf_hook") and _is_group_offload_enabled(net)
        assert np.abs(images() - reference).max() <= 1
    profile = with_controlnets(profiles.profile_from_folder(tf[family]),
                               [controlnet_profile(models.config_of(source), "cn")])
    planned = [(n, c * 4) for n, c in profile.residency_blocks]  # float32: 4 bytes an element
    total = sum(b for _, b in planned)
    applied = apply_mod.apply_settings(pipe, MemorySettings(dtype="float32", offload="budget",
                                                            resident_bytes=total // 2), probe("cpu"))
    split = applied.residency
    assert sorted([*split.resident, *split.streamed]) == sorted(n for n, _ in planned)
    assert split.resident_bytes + split.streamed_bytes_per_step == total
    streamed = [n.split(":", 1)[1] for n in split.streamed if n.startswith("controlnet0:")]
    assert streamed and all(_is_group_offload_enabled(net.get_submodule(n)) for n in streamed)
    assert np.abs(images() - reference).max() <= 1
    apply_mod.apply_settings(pipe, MemorySettings(dtype="float32", quantize="int8"), probe("cpu"))
    assert kinds(pipe)["controlnet0"] == "int8" and kinds(pipe)["transformer"] == "int8"
    assert "controlnet0" in apply_mod.needs_reload(pipe, MemorySettings(dtype="float32"))


# ------------------------------------------------------------------------------------------ the plan


def plan_json(capsys, *args):
    assert main(["plan", "--json", *args]) == 0
    return json.loads(capsys.readouterr().out)


@pytest.mark.parametrize("family", ["sd3", "flux"])
def test_plan_counts_the_controlnet_weights_and_activations(family, tf, capsys):
    args = ["--vram", "4GiB", "--model", tf[family], "--width", "512", "--height", "512"]
    without = plan_json(capsys, *args)
    with_cn = plan_json(capsys, *args, "--controlnet", str(tf[f"{family}_file"]))
    rows = {p["name"].split("@")[0]: p for p in without["presets"]}
    assert with_cn["controlnets"] == [str(tf[f"{family}_file"])]
    for row in with_cn["presets"]:
        b = row["breakdown"]
        base = rows[row["name"].split("@")[0]]["breakdown"]
        assert b["controlnet_bytes"] > 0
        assert abs(b["denoiser_bytes"] - base["denoiser_bytes"] - b["controlnet_bytes"]) <= 1
        assert b["controlnet_resident_bytes"] + b["controlnet_streamed_bytes_per_step"] == b["controlnet_bytes"]
        assert b["unet_bytes"] > base["unet_bytes"]  # its residuals and its own forward beside the transformer's
        if row["name"] == "highvram":
            assert b["controlnet_resident_bytes"] == b["controlnet_bytes"]
        if row["name"] == "lowvram":
            assert b["controlnet_streamed_bytes_per_step"] == b["controlnet_bytes"]
    code = main(["plan", "--model", "flux", "--controlnet", str(tf["sd3_cn"])])
    assert code == 2 and "it is a ControlNet for SD3 and the model 'flux' is Flux" in capsys.readouterr().err


def test_plan_knows_the_sizes_diffusers_from_transformer_makes(capsys):
    """`plan --model flux --controlnet flux`: FluxControlNetModel.from_transformer's default (4 double and 10 single
    blocks) of FLUX.1-dev, 2.95 B weights, counted as stored; the SD3 one on Flux is refused."""
    out = plan_json(capsys, "--vram", "12GiB", "--model", "flux", "--controlnet", "flux", "--preset", "lowvram")
    b = next(p for p in out["presets"] if p["name"] == "lowvram")["breakdown"]
    assert out["controlnets"] == ["flux"] and 2.9e9 * 2 < b["controlnet_bytes"] < 3.0e9 * 2  # 16-bit weights
    assert b["controlnet_streamed_bytes_per_step"] == b["controlnet_bytes"]
    sd3 = plan_json(capsys, "--vram", "12GiB", "--model", "sd3", "--controlnet", "sd3", "--preset", "highvram")
    assert 1.0e9 * 2 < next(p for p in sd3["presets"] if p["name"] == "highvram")["breakdown"]["controlnet_bytes"] \
        < 1.1e9 * 2
    assert main(["plan", "--model", "flux", "--controlnet", "sd3"]) == 2
    assert "it is a ControlNet for SD3 and the model 'flux' is Flux" in capsys.readouterr().err
    assert main(["plan", "--model", "flux", "--controlnet", "sd15"]) == 2  # a UNet's ControlNet on a transformer
    assert "it is a ControlNet for SD 1.x and the model 'flux' is Flux" in capsys.readouterr().err
    assert main(["plan", "--model", "sdxl", "--controlnet", "flux"]) == 2
    assert "it is a ControlNet for Flux and the model 'sdxl' is SDXL" in capsys.readouterr().err
