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
    # FLUX.1 Kontext is a family of its own since issue 30's editing models (families/records_kontext.py)
    assert {families.by_pipeline(n).key for n in flux1 if "Kontext" not in n} == {"flux"}
    assert {families.by_pipeline(n).key for n in flux1 if "Kontext" in n} == {"flux-kontext"}
    # a class-name prefix once gave Flux.2 FLUX.1's facts; Flux.2 dev has its own record now (records_flux2_dev.py)
    assert families.by_pipeline("Flux2Pipeline").key == "flux2-dev"
    # Qwen-Image has its own record since issue 30 (families/records_qwen.py), every Qwen-Image pipeline its
    qwen = [n for n in _pipeline_names() if n.startswith("QwenImage") and not n.startswith("QwenImage21")
            and "Edit" not in n]  # Qwen-Image-Edit's are its own records (families/records_qwen_edit.py)
    assert {families.by_pipeline(n).key for n in qwen} == {"qwen-image"}
    assert families.by_pipeline("StableDiffusionPipeline") is families.SD15  # SD 1.5 first for the shared classes


def test_every_task_class_exists_and_is_claimed_by_its_record():
    for record in families.all_families():
        # an image family makes images from a prompt; a video family (issue 33) clips from one
        assert record.has_task(Task.TXT2VID if record.is_video else Task.TXT2IMG), record.key
        for task, cls in record.tasks.items():
            Task(task)  # a known task
            assert hasattr(diffusers, cls), cls
        for task, arguments in record.task_arguments.items():  # each a parameter of that task's __call__
            params = inspect.signature(getattr(diffusers, record.tasks[task]).__call__).parameters
            assert set(arguments) <= set(params), (record.key, task)
        for task, components in record.task_configs.items():  # each a component of that task's pipeline
            assert set(components) <= set(inspect.signature(getattr(diffusers, record.tasks[task])).parameters)
        for cls in record.other_pipelines:
            assert hasattr(diffusers, cls), cls
        for cls in record.denoiser_classes:
            assert hasattr(diffusers, cls), cls
        if record.controlnet:
            assert hasattr(diffusers, record.controlnet.model_class)


def _main_pipeline(record):
    """The record's prompt-only pipeline class: txt2img, or txt2vid for a video family (Wan, LTX-Video)."""
    return getattr(diffusers, record.tasks["txt2vid" if record.is_video else "txt2img"])


def test_call_styles_agree_with_the_installed_pipelines():
    """What each record says about CFG, the negative prompt and true CFG is what its txt2img (txt2vid) __call__
    takes."""
    for record in families.all_families():
        params = inspect.signature(_main_pipeline(record).__call__).parameters
        call = record.call
        assert ("negative_prompt" in params) == call.takes_negative_prompt, record.key
        assert ("true_cfg_scale" in params) == (call.optional_true_cfg or call.guidance is Guidance.TRUE_CFG), record.key
        if call.cfg_argument:
            assert call.cfg_argument in params, record.key
        if call.negative_prompt:
            assert call.takes_negative_prompt
        # a doubled CFG batch is classic CFG; classic CFG without one runs the prompt and the negative as two
        # forwards (Flux.2 Klein's base models): its __call__ never doubles the latents
        source = inspect.getsource(_main_pipeline(record).__call__)
        doubled = any(s in source for s in ("[latents] * 2", "latents_typed.repeat(2", "[latents] * (num_cfg + 1)"))
        # the batch of two halves (OmniGen: num_cfg + 1 copies, two for a prompt without input images)
        assert record.cfg_batch == (call.guidance is Guidance.CFG and doubled), record.key


def test_t5_lengths_are_the_pipelines_defaults():
    for record in families.all_families():
        if record.t5_tokens is None:
            continue
        params = inspect.signature(_main_pipeline(record).__call__).parameters
        assert params["max_sequence_length"].default == record.t5_tokens, record.key


def test_lora_field_agrees_with_the_pipeline_loader():
    for record in families.all_families():
        cls = _main_pipeline(record)
        assert hasattr(cls, "load_lora_weights") == (record.lora is not None), record.key


def test_short_names_hub_ids_and_labels():
    # the first five; issue 30's families follow, each checked in its own tests/test_family_*.py
    assert families.builtin_names()[:5] == ("sd15", "sd21", "sdxl", "sd3", "flux")
    table = families.aliases()
    assert table["sd1.5"] == "sd15" and table["runwayml/stable-diffusion-v1-5"] == "sd15"
    assert table["sd2"] == "sd21" and table["sd-xl"] == "sdxl" and table["sd3-medium"] == "sd3"
    assert table["black-forest-labs/flux.1-dev"] == "flux" and table["flux1-dev"] == "flux"
    assert families.by_name(" FLUX-dev ").hub_id == "black-forest-labs/FLUX.1-dev"
    assert families.by_name("sdxl").native_side == 1024 and families.by_name("sd21").native_side == 768
    assert families.by_name("nope") is None
    assert families.by_arch("custom") is families.GENERIC
    assert [families.by_arch(k).label for k in families.builtin_names()[:5]] == \
        ["SD 1.5", "SD 2.1", "SDXL", "SD3-medium", "FLUX.1-dev"]
    assert families.family_name("StableDiffusionXLImg2ImgPipeline") == "SDXL"
    assert families.family_name("StableDiffusionImg2ImgPipeline") == "SD 1.x/2.x"
    assert families.family_name("SanaPipeline") == "SANA"
    assert families.family_name("AmusedPipeline") == "AmusedPipeline"  # no record: the class itself


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
    assert set(families.controlnet_kinds()) == {"sd", "sd3", "flux", "z-image", "sana", "qwen-image"}
    assert families.FLUX1.controlnet.latent_per_token({"in_channels": 64, "patch_size": 1}) == 4
    assert families.SD3.controlnet.latent_per_token({"patch_size": 2}) == 4
    assert not families.SD3.controlnet.img2img and families.FLUX1.controlnet.img2img
    assert families.by_unet_cross_attention(1024).version_label == "SD 2.x"


def test_a_registered_record_wins_and_goes_away():
    # a pipeline class no shipped record claims (SANA's, used here before issue 30, has a record now)
    fake = Family(key="fake-amused", group="fake-amused", name="aMUSEd", tasks={"txt2img": "AmusedPipeline"},
                  denoiser="transformer", denoiser_classes=("UVit2DModel",))
    assert families.by_pipeline("AmusedPipeline").is_generic
    with families.registered(fake):
        assert families.by_pipeline("AmusedPipeline") is fake
        assert families.by_key("fake-amused") is fake
        with pytest.raises(ValueError):
            families.register(fake)
    assert families.by_pipeline("AmusedPipeline").is_generic
    with pytest.raises(KeyError):
        families.by_key("fake-amused")


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


# ------------------------------------------------------------------------------------- a new family: a record


def _tiny_chroma(folder):
    """A tiny ChromaPipeline folder (seeded random weights), a pipeline class no shipped record claimed (the test
    takes out the one issue 30 added): a Flux-like transformer over 2x2-packed 16-channel latents with one T5 encoder,
    classic CFG run as two forwards."""
    import torch
    from diffusers import ChromaPipeline, ChromaTransformer2DModel, FlowMatchEulerDiscreteScheduler
    from tiny_transformers import T5_DIM, t5_tokenizer, vae_16_channels
    from transformers import T5Config, T5EncoderModel

    tokenizer = t5_tokenizer()
    torch.manual_seed(0)
    transformer = ChromaTransformer2DModel(
        patch_size=1, in_channels=64, num_layers=1, num_single_layers=1, attention_head_dim=16, num_attention_heads=2,
        joint_attention_dim=T5_DIM, axes_dims_rope=(4, 6, 6), approximator_num_channels=8,
        approximator_hidden_dim=32, approximator_layers=1)
    torch.manual_seed(3)
    t5 = T5EncoderModel(T5Config(
        vocab_size=len(tokenizer), d_model=T5_DIM, d_kv=16, d_ff=64, num_layers=1, num_heads=2,
        relative_attention_num_buckets=8, feed_forward_proj="gated-gelu", pad_token_id=0, eos_token_id=1,
        decoder_start_token_id=0))
    pipe = ChromaPipeline(scheduler=FlowMatchEulerDiscreteScheduler(), vae=vae_16_channels(0.3611, 0.1159),
                          text_encoder=t5, tokenizer=tokenizer, transformer=transformer)
    pipe.save_pretrained(folder, safe_serialization=True)
    return folder


@pytest.fixture(scope="module")
def chroma(tmp_path_factory):
    return _tiny_chroma(tmp_path_factory.mktemp("tiny-chroma"))


def _chroma_record(seen: list) -> Family:
    """The fake family: what a new family's author writes. Its transformer reader notes each config it reads, so
    the test sees the planner read the folder's shapes through the record."""

    def shape(config):
        seen.append(dict(config))
        return config["num_attention_heads"] * config["attention_head_dim"], 1  # patch 1 on 2x2-packed latents

    return Family(
        key="test-chroma", group="test-chroma", name="Chroma", tasks={"txt2img": "ChromaPipeline"},
        denoiser="transformer", denoiser_classes=("ChromaTransformer2DModel",), transformer_shape=shape,
        t5_tokens=512, joint_tokens=512, cfg_batch=False, native_side=1024,
        call=families.Call(Guidance.CFG), lora="diffusers", latent_format="flux", packed_latents=True)


def test_a_new_family_is_a_record_the_planner_loader_and_request_checks_use(chroma, tmp_path, monkeypatch):
    """The issue's test: a record for a pipeline class no shipped record knows (Chroma), registered in the test and
    nowhere else, and resolve, the profile the planner estimates from, the plan, the loader, the request checks and
    the live preview take it with no other change; without it the folder is the generic record's (what the code did
    before). tests/test_families_exec.py shows the pipeline call (CFG, negative prompt) following a record too."""
    import dataclasses

    from lowvram_gen import GenerationRequest, preview
    from lowvram_gen.engines.sd.pipeline import check_request
    from lowvram_gen.errors import InvalidRequest
    from lowvram_gen.hardware.device import simulated
    from lowvram_gen.models.loading import load
    from lowvram_gen.models.profile import native_side, profile_from_folder, source_profile
    from lowvram_gen.models.resolve import resolve
    from lowvram_gen.planning.estimate import estimate
    from lowvram_gen.planning.planner import plan
    from lowvram_gen.presets import find_preset, load_presets

    # Chroma has a shipped record since issue 30 (families/records_dit.py): taken out here, the class is one no
    # record knows again, as it was when this test was written
    from lowvram_gen.families import registry

    monkeypatch.setattr(registry, "_registry", [r for r in registry.all_families() if r.key != "chroma"])
    source = resolve(str(chroma))
    assert source.kind == "folder"
    generic = profile_from_folder(chroma)  # no record: the generic one's guesses
    assert generic.joint_text_tokens == families.DEFAULT_T5_TOKENS and generic.cfg_batch
    seen: list = []
    with families.registered(_chroma_record(seen)) as record:
        assert families.by_pipeline("ChromaPipeline") is record
        profile = source_profile(source)  # the planner's profile of the resolved model
        assert profile is profile_from_folder(chroma) and profile is not generic  # read anew with the record
        assert [c["_class_name"] for c in seen] == ["ChromaTransformer2DModel"]  # the shapes came through the record
        assert profile.transformer_hidden == 32 and profile.transformer_patch == 2  # 1 x the pipeline's 2x2 packing
        assert profile.text_tokens == (512,) and profile.joint_text_tokens == 512 and not profile.cfg_batch
        assert profile.denoiser == "transformer" and profile.denoiser_class == "ChromaTransformer2DModel"
        # the estimate follows: more text tokens in the stream, and CFG runs no doubled batch
        memory = find_preset("highvram").memory
        ours = estimate(profile, 256, 256, 1, memory)
        assert ours.unet_bytes < estimate(dataclasses.replace(profile, cfg_batch=True), 256, 256, 1, memory).unet_bytes
        assert ours.unet_bytes > estimate(dataclasses.replace(profile, joint_text_tokens=256, cfg_batch=False), 256,
                                          256, 1, memory).unet_bytes
        assert native_side(profile) == 512  # not a built-in: plan's default side stays the generic one
        result = plan(simulated("4GiB"), profile, 256, 256, 1, load_presets())
        assert result.preset is not None and result.estimates

        # the loader: the pipeline loads, and its family is the record's
        model = load(source)
        assert type(model.pipe).__name__ == "ChromaPipeline" and model.family == "test-chroma"
        assert families.of_pipe(model.pipe) is record
        # the request checks: its grid (2x2-packed latents: multiples of 16), and no inpainting (not among its tasks)
        check_request(model.pipe, GenerationRequest(prompt="x", model=str(chroma), width=64, height=64))
        with pytest.raises(InvalidRequest) as err:
            check_request(model.pipe, GenerationRequest(prompt="x", model=str(chroma), width=72, height=64))
        assert "multiples of 16" in str(err.value)
        assert not record.has_task("inpaint")
        # the live preview: the record's latent format (FLUX.1's 16 channels, packed 2x2) draws the step's latents
        assert preview.latent_format(model.pipe) == "flux"
        render, _ = preview.renderer(model.pipe, "approx")
        import torch

        packed = torch.randn(1, (64 // 16) * (64 // 16), 64)  # a 64x64 job's latents as the pipeline packs them
        assert render(packed, 64, 64).size == (64, 64)
    assert families.by_pipeline("ChromaPipeline").is_generic
    assert preview.latent_format(model.pipe) is None  # no record, no preview (not another family's format)
    assert profile_from_folder(chroma) == generic  # gone with the record


def test_models_import_nothing_from_planning():
    """One direction between the two: planning/ imports models/ (profiles, blocks, counts), never the reverse,
    not even inside a function."""
    import pathlib

    import lowvram_gen.models

    for source in pathlib.Path(lowvram_gen.models.__path__[0]).glob("*.py"):
        assert "lowvram_gen.planning" not in source.read_text(), source.name
