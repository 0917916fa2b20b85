"""The model family records (lowvram_gen/families): lookups, what each record says against the installed
diffusers, single-file recognition, and a registry a test can extend."""

from __future__ import annotations

import inspect
import subprocess
import sys

import diffusers
import pytest

from lowvram_gen import families
from lowvram_gen.families import Family, Guidance, Task, keys


def _pipeline_names():
    return [n for n in dir(diffusers) if n.endswith("Pipeline") and "Modular" not in n]


@pytest.mark.parametrize("prefix, group", [("StableDiffusionXL", "sdxl"), ("StableDiffusion3", "sd3"),
                                            ("PixArtSigma", "pixart-sigma"), ("PixArtAlpha", "pixart-alpha")])
def test_every_installed_pipeline_of_a_family_is_claimed(prefix, group):
    names = [n for n in _pipeline_names() if n.startswith(prefix)]
    assert names
    assert {n: families.by_pipeline(n).group for n in names} == {n: group for n in names}


def test_sd_and_flux1_pipelines_are_claimed_and_flux2_is_not():
    sd = [n for n in _pipeline_names() if n.startswith("StableDiffusion") and not n.startswith(("StableDiffusionXL",
                                                                                                 "StableDiffusion3"))]
    assert {families.by_pipeline(n).group for n in sd} == {"sd"}
    flux1 = [n for n in _pipeline_names() if n.startswith("Flux") and not n.startswith(("Flux2", "Flux3"))]
    assert {families.by_pipeline(n).key for n in flux1} == {"flux"}
    # a class-name prefix once gave Flux.2 FLUX.1's facts; no record claims it now
    assert families.by_pipeline("Flux2Pipeline") is families.GENERIC
    assert families.by_pipeline("QwenImagePipeline").is_generic
    assert families.by_pipeline("StableDiffusionPipeline") is families.SD15  # SD 1.5 first for the shared classes


def test_every_task_class_exists_and_is_claimed_by_its_record():
    for record in families.all_families():
        assert record.has_task(Task.TXT2IMG), record.key
        for task, cls in record.tasks.items():
            Task(task)  # a known task
            assert hasattr(diffusers, cls), cls
        for cls in record.other_pipelines:
            assert hasattr(diffusers, cls), cls
        for cls in record.denoiser_classes:
            assert hasattr(diffusers, cls), cls
        if record.controlnet:
            assert hasattr(diffusers, record.controlnet.model_class)


def test_call_styles_agree_with_the_installed_pipelines():
    """What each record says about CFG, the negative prompt and true CFG is what its txt2img __call__ takes."""
    for record in families.all_families():
        params = inspect.signature(getattr(diffusers, record.tasks["txt2img"]).__call__).parameters
        call = record.call
        assert ("negative_prompt" in params) == call.takes_negative_prompt, record.key
        assert ("true_cfg_scale" in params) == (call.optional_true_cfg or call.guidance is Guidance.TRUE_CFG), record.key
        if call.cfg_argument:
            assert call.cfg_argument in params, record.key
        if call.negative_prompt:
            assert call.takes_negative_prompt
        # a doubled CFG batch is classic CFG
        assert record.cfg_batch == (call.guidance is Guidance.CFG), record.key


def test_t5_lengths_are_the_pipelines_defaults():
    for record in families.all_families():
        if record.t5_tokens is None:
            continue
        params = inspect.signature(getattr(diffusers, record.tasks["txt2img"]).__call__).parameters
        assert params["max_sequence_length"].default == record.t5_tokens, record.key


def test_lora_field_agrees_with_the_pipeline_loader():
    for record in families.all_families():
        cls = getattr(diffusers, record.tasks["txt2img"])
        assert hasattr(cls, "load_lora_weights") == (record.lora is not None), record.key


def test_short_names_hub_ids_and_labels():
    assert families.builtin_names() == ("sd15", "sd21", "sdxl", "sd3", "flux")
    table = families.aliases()
    assert table["sd1.5"] == "sd15" and table["runwayml/stable-diffusion-v1-5"] == "sd15"
    assert table["sd2"] == "sd21" and table["sd-xl"] == "sdxl" and table["sd3-medium"] == "sd3"
    assert table["black-forest-labs/flux.1-dev"] == "flux" and table["flux1-dev"] == "flux"
    assert families.by_name(" FLUX-dev ").hub_id == "black-forest-labs/FLUX.1-dev"
    assert families.by_name("sdxl").native_side == 1024 and families.by_name("sd21").native_side == 768
    assert families.by_name("nope") is None
    assert families.by_arch("custom") is families.GENERIC
    assert [families.by_arch(k).label for k in families.builtin_names()] == \
        ["SD 1.5", "SD 2.1", "SDXL", "SD3-medium", "FLUX.1-dev"]
    assert families.family_name("StableDiffusionXLImg2ImgPipeline") == "SDXL"
    assert families.family_name("StableDiffusionImg2ImgPipeline") == "SD 1.x/2.x"
    assert families.family_name("SanaPipeline") == "SanaPipeline"


def test_spatial_patch_of_a_3d_patch():
    assert families.spatial_patch([1, 2, 2]) == 2
    assert families.spatial_patch((2, 2)) == 2
    assert families.spatial_patch(1) == 1 and families.spatial_patch(None) == 2
    assert families.transformer_shape({"num_attention_heads": 4, "attention_head_dim": 8, "patch_size": [1, 2, 2]}) \
        == (32, 2)
    assert families.transformer_shape({"hidden_size": 64}) == (64, 2)
    assert families.transformer_shape({}) == (1152, 2)


def _whole(prefixes, extra=()):
    return {f"{p}x.weight": (1,) for p in prefixes} | {k: (1,) for k in extra}


def test_single_file_recognition():
    unet = (keys.UNET + "input_blocks.", keys.UNET + "output_blocks.")
    sd = _whole([*unet, "first_stage_model.", keys.CLIP_SD])
    xl = _whole([*unet, "first_stage_model.", keys.CLIP_XL, keys.OPENCLIP_XL])
    assert families.by_checkpoint(sd) is families.SD15
    assert families.by_checkpoint(xl) is families.SDXL
    assert families.by_checkpoint(_whole(unet)) is None  # no VAE, no text encoder
    markers = keys.diffusers_markers()
    assert families.by_checkpoint({markers["sd3"][0]: (1,)}) is families.SD3
    assert families.by_checkpoint({markers["flux"][0]: (1,)}) is families.FLUX1
    if markers["not_flux1"]:  # a Flux.2 / Chroma file is no FLUX.1
        assert families.by_checkpoint({markers["flux"][0]: (1,), markers["not_flux1"][0]: (1,)}) is None
    # a GGUF denoiser alone
    gguf_unet = _whole(unet)
    assert families.by_gguf(gguf_unet) is families.SD15
    assert families.by_gguf({**gguf_unet, keys.SD2_CROSS_ATTENTION: (320, 1024)}) is families.SD21
    assert families.by_gguf({**gguf_unet, keys.SDXL_UNET_MARKER: (1,)}) is families.SDXL
    assert families.by_gguf({markers["flux"][0]: (1,)}).single_file.gguf_layout == "bfl-flux1"
    assert families.by_single_file_pipeline("StableDiffusionPipeline") is families.SD15


def test_controlnet_facts():
    assert families.by_controlnet_class("FluxControlNetModel") is families.FLUX1
    assert families.by_denoiser_class("SD3Transformer2DModel") is families.SD3
    assert set(families.controlnet_kinds()) == {"sd", "sd3", "flux"}
    assert families.FLUX1.controlnet.latent_per_token({"in_channels": 64, "patch_size": 1}) == 4
    assert families.SD3.controlnet.latent_per_token({"patch_size": 2}) == 4
    assert not families.SD3.controlnet.img2img and families.FLUX1.controlnet.img2img
    assert families.by_unet_cross_attention(1024).version_label == "SD 2.x"


def test_a_registered_record_wins_and_goes_away():
    fake = Family(key="fake-sana", group="fake-sana", name="Sana", tasks={"txt2img": "SanaPipeline"},
                  denoiser="transformer", denoiser_classes=("SanaTransformer2DModel",), t5_tokens=300)
    assert families.by_pipeline("SanaPipeline").is_generic
    with families.registered(fake):
        assert families.by_pipeline("SanaPipeline") is fake
        assert families.by_key("fake-sana") is fake
        with pytest.raises(ValueError):
            families.register(fake)
    assert families.by_pipeline("SanaPipeline").is_generic
    with pytest.raises(KeyError):
        families.by_key("fake-sana")


def test_of_pipe_walks_the_class_hierarchy():
    class Mine(diffusers.StableDiffusionXLPipeline):
        pass

    assert families.of_pipe(Mine.__new__(Mine)) is families.SDXL
    assert families.of_pipe(object()) is families.GENERIC


def test_families_import_nothing_heavy_and_nothing_above_it():
    """families/ sits at the bottom: importing it (after the package itself) brings in no torch or diffusers and
    nothing of models/, planning/, the engines, the session or a front end."""
    code = ("import sys, lowvram_gen; before = set(sys.modules); import lowvram_gen.families; "
            "new = set(sys.modules) - before; "
            "bad = [m for m in new if m.split('.')[0] in ('torch', 'diffusers', 'transformers') or "
            "(m.startswith('lowvram_gen.') and not m.startswith('lowvram_gen.families'))]; "
            "print(bad); assert not bad")
    subprocess.run([sys.executable, "-c", code], check=True)
    for path in (families.__path__[0],):
        import pathlib

        for source in pathlib.Path(path).glob("*.py"):
            text = source.read_text()
            for layer in ("planning", "engines", "session", "models", "ui", "api", "cli", "batch", "control"):
                assert f"lowvram_gen.{layer}" not in text, (source.name, layer)
