"""The execution side asks the family records (issue 28, item 1): what the records' execution fields say agrees with
the installed diffusers, the engine's call takes CFG and the negative prompt as the record says, previews read the
record's latent format, and a family no record knew runs a job once a record for it is registered, with no other
change (a tiny folder of diffusers' LatentConsistencyModelPipeline, which no built-in record claims)."""

from __future__ import annotations

import inspect
from dataclasses import replace
from types import SimpleNamespace

import diffusers
import pytest
import torch
from PIL import Image

from lowvram_gen import families, preview
from lowvram_gen.engines.sd import controlnet, inpaint
from lowvram_gen.engines.sd import pipeline as sd
from lowvram_gen.errors import InvalidRequest
from lowvram_gen.families import Call, Family, Guidance, Task
from lowvram_gen.families.execution import task_of
from lowvram_gen.networks.embeddings import takes_embeddings
from lowvram_gen.networks.lora import takes_loras
from lowvram_gen.prompting.encode import prompt_encoding
from lowvram_gen.request import GenerationRequest

LCM = "LatentConsistencyModelPipeline"


def _bare(class_name: str):
    """An instance of a diffusers pipeline class without its components (what the lookups read is its class)."""
    cls = getattr(diffusers, class_name)
    return cls.__new__(cls)


# ------------------------------------------------------------------------- the records against diffusers


def test_execution_fields_agree_with_the_installed_pipelines():
    """Each task's width/height and negative prompt (`unsized_tasks`, `no_negative_prompt_tasks`) and the
    textual-inversion loader are what diffusers' pipeline classes take and have."""
    for record in families.all_families():
        for task, name in record.tasks.items():
            params = inspect.signature(getattr(diffusers, name).__call__).parameters
            assert record.takes_size(task) == ({"width", "height"} <= params.keys()), (record.key, task)
            assert record.takes_negative_prompt(task) == ("negative_prompt" in params), (record.key, task)
        if record.textual_inversion is not None:
            cls = getattr(diffusers, record.tasks[(Task.TXT2VID if record.is_video else Task.TXT2IMG).value])
            assert hasattr(cls, "load_textual_inversion") == record.textual_inversion, record.key
    assert families.GENERIC.textual_inversion is None  # an unknown family's pipeline is asked
    assert not families.FLUX1.controlnet.mixes_kinds and families.SD3.controlnet.mixes_kinds


def test_task_of_says_which_task_a_pipeline_class_is():
    assert task_of(_bare("StableDiffusionXLImg2ImgPipeline")) == (families.SDXL, Task.IMG2IMG)
    assert task_of(_bare("StableDiffusionInpaintPipeline")) == (families.SD15, Task.INPAINT)
    assert task_of(_bare("FluxFillPipeline")) == (families.FLUX1, None)  # claimed, no task of ours
    # FLUX.1 Kontext is its own family since issue 30's editing models: txt2img (and edit) on its pipeline
    assert task_of(_bare("FluxKontextPipeline")) == (families.by_key("flux-kontext"), Task.TXT2IMG)
    assert task_of(_bare(LCM)) == (families.GENERIC, None)

    class Mine(diffusers.StableDiffusion3Pipeline):
        pass

    assert task_of(Mine.__new__(Mine)) == (families.SD3, Task.TXT2IMG)


# ------------------------------------------------------------------------- what the engine asks the record


def test_the_built_in_families_keep_their_call_and_decode():
    """Today's behaviour, now from the records: guidance_scale for all, a negative prompt Flux drops, the decode split
    off for SD/SDXL txt2img only, SDXL's VAE upcast, A1111 prompt encoding for SD/SDXL txt2img and img2img."""
    for name in ("StableDiffusionPipeline", "StableDiffusionXLPipeline", "StableDiffusion3Pipeline", "FluxPipeline",
                 "PixArtSigmaPipeline"):
        assert sd.guidance_kwargs(_bare(name), 5.0) == {"guidance_scale": 5.0}, name
    assert sd.ignores_negative_prompt(_bare("FluxPipeline"))
    assert not sd.ignores_negative_prompt(_bare("StableDiffusion3Pipeline"))
    assert [sd.splits_decode(_bare(n)) for n in ("StableDiffusionPipeline", "StableDiffusionXLPipeline",
                                                 "StableDiffusionXLImg2ImgPipeline", "StableDiffusion3Pipeline")] \
        == [True, True, False, False]
    assert [prompt_encoding(_bare(n)) for n in ("StableDiffusionImg2ImgPipeline", "StableDiffusionXLPipeline",
                                                "StableDiffusionInpaintPipeline", "FluxPipeline")] \
        == ["clip", "clip_pair", None, None]
    assert preview.latent_format(_bare("StableDiffusionXLInpaintPipeline")) == "sdxl"
    assert preview.latent_format(_bare("FluxImg2ImgPipeline")) == "flux"
    # a class-name prefix once gave Flux.2 FLUX.1's latent format; its own record (Flux.2 dev) gives it Flux.2's
    if hasattr(diffusers, "Flux2Pipeline"):
        assert preview.latent_format(_bare("Flux2Pipeline")) == "flux2"


def test_the_call_style_comes_from_the_record():
    """A record's Call decides the CFG argument and whether the negative prompt is passed."""
    texts = sd.Texts("a cat", "blurry")
    pipe = _bare(LCM)
    base = Family(key="fake-call", group="fake-call", name="Fake", tasks={"txt2img": LCM})
    for call, cfg, negative in ((Call(Guidance.TRUE_CFG), {"true_cfg_scale": 4.0}, True),
                                (Call(Guidance.NONE, negative_prompt=False, takes_negative_prompt=False), {}, False),
                                (Call(Guidance.DISTILLED, negative_prompt=False), {"guidance_scale": 4.0}, True)):
        with families.registered(replace(base, call=call)):
            assert sd.guidance_kwargs(pipe, 4.0) == cfg
            kwargs = sd.text_kwargs(pipe, texts, 2, cfg=True)
            assert kwargs["prompt"] == ["a cat"] * 2
            assert ("negative_prompt" in kwargs) == negative
            assert sd.ignores_negative_prompt(pipe) == (not call.negative_prompt)


def test_flux_controlnet_img2img_gets_no_negative_prompt_and_sd_keeps_it():
    kwargs = {"prompt": ["a"], "negative_prompt": ["b"], "guidance_scale": 3.5}
    assert controlnet.fit_call(_bare("FluxControlNetImg2ImgPipeline"), kwargs) == {"prompt": ["a"],
                                                                                   "guidance_scale": 3.5}
    assert controlnet.fit_call(_bare("FluxControlNetPipeline"), kwargs) == kwargs
    assert controlnet.fit_call(_bare("StableDiffusionControlNetImg2ImgPipeline"), kwargs) == kwargs
    assert controlnet.transformer_controlnet(_bare("FluxImg2ImgPipeline")) is families.FLUX1.controlnet
    assert controlnet.transformer_controlnet(_bare("StableDiffusionXLPipeline")) is None
    assert controlnet.transformer_controlnet(_bare("FluxKontextPipeline")) is None


def test_inpainting_and_networks_are_the_records_tasks_and_loaders():
    mask = SimpleNamespace(mask="mask.png", model="m")
    inpaint.check(_bare("StableDiffusionXLPipeline"), mask)  # SDXL has an inpaint task
    # a family a record knows is named in one sentence (issue 30: not a list of the families that have one)
    with pytest.raises(InvalidRequest, match="invalid task: 'inpaint'; Flux has no inpaint pipeline in diffusers: use txt2img or img2img"):
        inpaint.check(_bare("FluxPipeline"), mask)
    record = Family(key="fake-inpaint", group="fake-inpaint", name="Fake",
                    tasks={"txt2img": LCM, "inpaint": "StableDiffusionInpaintPipeline"})
    with pytest.raises(InvalidRequest):
        inpaint.check(_bare(LCM), mask)
    with families.registered(record):
        inpaint.check(_bare(LCM), mask)  # a record with an inpaint task: the mask is taken
        with families.registered(replace(record, key="fake-2", lora=None, textual_inversion=False)):
            assert not takes_loras(_bare(LCM)) and not takes_embeddings(_bare(LCM))
        # the record says LoRA is diffusers' loader (the default); of embeddings it says nothing: the pipeline is asked
        assert takes_loras(_bare(LCM)) and takes_embeddings(_bare(LCM))
    assert not takes_loras(_bare("PixArtSigmaPipeline")) and takes_loras(_bare("FluxPipeline"))
    assert takes_embeddings(_bare(LCM))  # a family no record knows: its pipeline object has the loader


# ------------------------------------------------------------------------- a new family, by its record alone


@pytest.fixture(scope="module")
def lcm():
    """A tiny LatentConsistencyModelPipeline (a diffusers class no built-in record claims) as the embedded tiny SD
    model is built (models/tiny.py), its UNet with the guidance embedding LCM reads, saved and loaded as a folder."""
    from diffusers import LatentConsistencyModelPipeline, LCMScheduler, UNet2DConditionModel

    from lowvram_gen.models import tiny

    torch.manual_seed(0)
    unet = UNet2DConditionModel(
        block_out_channels=(32, 64), layers_per_block=1, sample_size=8, in_channels=4, out_channels=4,
        down_block_types=("DownBlock2D", "CrossAttnDownBlock2D"), up_block_types=("CrossAttnUpBlock2D", "UpBlock2D"),
        cross_attention_dim=32, attention_head_dim=8, norm_num_groups=8, time_cond_proj_dim=32)
    scheduler = LCMScheduler(beta_start=0.00085, beta_end=0.012, beta_schedule="scaled_linear")
    return LatentConsistencyModelPipeline(
        vae=tiny._vae(), text_encoder=tiny._text_encoder(False), tokenizer=tiny._tokenizer(), unet=unet,
        scheduler=scheduler, safety_checker=None, feature_extractor=None, requires_safety_checker=False)


# the new family's record: no negative prompt in its call, its CFG as guidance_scale, SD's latents for previews
FAKE_LCM = Family(key="fake-lcm", group="fake-lcm", name="LCM", tasks={"txt2img": LCM},
                  call=Call(Guidance.CFG, negative_prompt=False, takes_negative_prompt=False), latent_format="sd",
                  lora=None)


def _job(pipe, monkeypatch, **kw):
    """Run a 2-step pass of `pipe` at 64x64 with live previews every step; (what the call got, the pass, previews)."""
    calls, shown = [], []
    original = type(pipe).__call__

    def recording(self, *args, **kwargs):
        calls.append(dict(kwargs))
        return original(self, *args, **kwargs)

    monkeypatch.setattr(type(pipe), "__call__", recording)
    request = GenerationRequest(prompt="a red cube", negative_prompt="blurry", steps=2, cfg_scale=3.0, width=64,
                                height=64, **kw)
    render, how = preview.renderer(pipe, "approx")
    previews = preview.Previews(1, render, lambda image, step, total: shown.append((image.size, step))) \
        if render else None
    out = sd.denoise(pipe, sd.Pass(request, [7], 64, 64), "cpu", preview=previews)
    return calls, out, shown, how


def test_a_registered_record_decides_the_call_and_the_previews_of_a_new_family(lcm, monkeypatch):
    """Issue 28's "done when": a record for a pipeline class no record knew, and the engine's call (CFG argument,
    negative prompt) and the previews (latent format) follow it, with no other change."""
    # no record: the generic one passes the negative prompt (swallowed by LCM's **kwargs) and shows no preview
    calls, out, shown, how = _job(lcm, monkeypatch)
    assert calls[0]["negative_prompt"] == ["blurry"] and calls[0]["guidance_scale"] == 3.0
    assert how == "off" and shown == []
    assert out.decoded and len(out.images) == 1  # the pipeline decodes itself (no split decode for it)
    with families.registered(FAKE_LCM):
        calls, out, shown, how = _job(lcm, monkeypatch)
        assert "negative_prompt" not in calls[0] and calls[0]["guidance_scale"] == 3.0
        assert calls[0]["prompt"] == ["a red cube"] and calls[0]["width"] == 64
        assert how == "approx" and shown == [((64, 64), 1), ((64, 64), 2)]
        assert out.decoded and out.images[0].size == (64, 64) and isinstance(out.images[0], Image.Image)
        # the same record with its CFG under another name: the call gets that name and nothing else
        with families.registered(replace(FAKE_LCM, key="fake-lcm-2", call=Call(Guidance.NONE, negative_prompt=False,
                                                                                takes_negative_prompt=False))):
            calls, *_ = _job(lcm, monkeypatch)
            assert "guidance_scale" not in calls[0] and "negative_prompt" not in calls[0]
