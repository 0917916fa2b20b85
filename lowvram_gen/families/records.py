"""The model families lowvram-gen knows, one record each (families/record.py says what a record holds), and the
list of them at the bottom (`FAMILIES`), as ComfyUI's comfy/supported_models.py lists its models.

SD 1.x and 2.x are two records of one group ('sd': the same pipeline classes, loaders and prompt encoding) because
`plan` knows each as a built-in architecture of its own (sd15, sd21); SD 2.x's eps and v models are the same
record (the scheduler config says which prediction). The SDXL refiner has no record: a refiner file is refused
(models/checkpoint.py), and a refiner folder is the SDXL group's img2img pipeline. PixArt Alpha and Sigma are
recognised for the memory planner (their T5 prompt lengths); they have no built-in configs.
"""

from __future__ import annotations

from typing import Mapping

from lowvram_gen.families import controlnet_shapes, keys
from lowvram_gen.families.record import (GENERIC_KEY, Call, ControlNetFacts, Family, FolderFacts, Guidance, Sampling,
                                         SingleFile, Task, spatial_patch)
from lowvram_gen.families.records_flux2 import FLUX2_KLEIN, FLUX2_KLEIN_9B
from lowvram_gen.families.records_zimage import Z_IMAGE

# --------------------------------------------------------------------------------------------- SD 1.x / 2.x

_SD_TASKS = {
    Task.TXT2IMG.value: "StableDiffusionPipeline",
    Task.IMG2IMG.value: "StableDiffusionImg2ImgPipeline",
    Task.INPAINT.value: "StableDiffusionInpaintPipeline",
    Task.CONTROLNET.value: "StableDiffusionControlNetPipeline",
    Task.CONTROLNET_IMG2IMG.value: "StableDiffusionControlNetImg2ImgPipeline",
    Task.CONTROLNET_INPAINT.value: "StableDiffusionControlNetInpaintPipeline",
}
_SD_OTHERS = (
    "StableDiffusionAdapterPipeline", "StableDiffusionAttendAndExcitePipeline", "StableDiffusionControlNetPAGPipeline",
    "StableDiffusionControlNetPAGInpaintPipeline", "StableDiffusionControlNetXSPipeline",
    "StableDiffusionDepth2ImgPipeline", "StableDiffusionDiffEditPipeline", "StableDiffusionGLIGENPipeline",
    "StableDiffusionGLIGENTextImagePipeline", "StableDiffusionImageVariationPipeline",
    "StableDiffusionInstructPix2PixPipeline", "StableDiffusionLDM3DPipeline", "StableDiffusionLatentUpscalePipeline",
    "StableDiffusionModelEditingPipeline", "StableDiffusionOnnxPipeline", "StableDiffusionPAGPipeline",
    "StableDiffusionPAGImg2ImgPipeline", "StableDiffusionPAGInpaintPipeline", "StableDiffusionPanoramaPipeline",
    "StableDiffusionParadigmsPipeline", "StableDiffusionPix2PixZeroPipeline", "StableDiffusionSAGPipeline",
    "StableDiffusionUpscalePipeline",
)
_SD_FILE = dict(
    pipeline="StableDiffusionPipeline", model_types=("v1", "v2"),
    components=("unet", "vae", "text_encoder", "tokenizer", "scheduler"), quantize_on_load="unet",
    gguf_layout="ldm-unet", architecture_check="file", inpaint_unet=True,
    text_encoder_prefixes={"text_encoder": (keys.CLIP_SD, keys.OPENCLIP_SD2)},
)
_UNET_CONTROLNET = ControlNetFacts(kind="sd", model_class="ControlNetModel")
# what our A1111 layer does for SD 1.x/2.x and SDXL: its own prompt encoding, clip skip, variation seeds, LoRA keys,
# and A1111's default sampler (DPM++ 2M, Automatic schedule) for the request's sampler "default"
_A1111 = dict(clip_skip=True, variation_seeds=True, text_encode_apart="a1111", lora="a1111", splits_decode=True,
              default_sampler="DPM++ 2M")
# their img2img pipelines keep the init image's size (no width/height argument)
_UNET_EXEC = dict(unsized_tasks=(Task.IMG2IMG.value,), textual_inversion=True)


def _sd3_controlnet_from_base(config: dict, base: Mapping) -> None:
    """An SD3 ControlNet without q/k norm does not show its head width in its shapes: the base transformer's."""
    inner = config["num_attention_heads"] * config["attention_head_dim"]
    head = int(base.get("attention_head_dim") or 0)
    if not config.get("qk_norm") and head and inner % head == 0:
        config.update(attention_head_dim=head, num_attention_heads=inner // head)
    for key in ("sample_size", "pos_embed_max_size", "out_channels"):  # and the sizes it shares with the base
        if key in base and key not in config:
            config[key] = base[key]


def _flux_controlnet_from_base(config: dict, base: Mapping) -> None:
    """A Flux ControlNet's rope axes (where they fit its head width) and patch size are the base transformer's."""
    axes = base.get("axes_dims_rope")
    if axes and sum(axes) == config["attention_head_dim"]:
        config["axes_dims_rope"] = list(axes)
    config["patch_size"] = int(base.get("patch_size", 1) or 1)


SD15 = Family(
    key="sd15", group="sd", name="SD 1.x/2.x", label="SD 1.5", version_label="SD 1.x",
    tasks=_SD_TASKS, other_pipelines=_SD_OTHERS, denoiser="unet", denoiser_classes=("UNet2DConditionModel",),
    unet_cross_attention=768,
    # a whole SD 1.x or 2.x file is this record's (one pipeline class; diffusers' model type tells v1 from v2)
    single_file=SingleFile(**_SD_FILE, checkpoint_match=keys.sd_file, offline_variant=keys.sd_variant,
                           gguf_match=lambda s: keys.sd_unet(s) and keys.cross_attention_width(s) != 1024),
    builtin="sd15", hub_id="stable-diffusion-v1-5/stable-diffusion-v1-5",
    aliases=("sd15", "sd1.5", "sd-1.5", "sd1", "v1-5", "stable-diffusion-v1-5",
             "stable-diffusion-v1-5/stable-diffusion-v1-5", "runwayml/stable-diffusion-v1-5"),
    native_side=512, controlnet=_UNET_CONTROLNET,
    latent_format="sd", call=Call(Guidance.CFG), prompt_encoding="clip", **_A1111,
    **_UNET_EXEC,
)

SD21 = Family(
    key="sd21", group="sd", name="SD 1.x/2.x", label="SD 2.1", version_label="SD 2.x",
    tasks=_SD_TASKS, other_pipelines=_SD_OTHERS, denoiser="unet", denoiser_classes=("UNet2DConditionModel",),
    unet_cross_attention=1024,
    single_file=SingleFile(**_SD_FILE, checkpoint_match=None,  # whole files: SD15's record (same pipeline)
                           offline_variant=keys.sd_variant,
                           gguf_match=lambda s: keys.sd_unet(s) and keys.cross_attention_width(s) == 1024),
    builtin="sd21", hub_id="stabilityai/stable-diffusion-2-1",
    aliases=("sd21", "sd2.1", "sd-2.1", "sd2", "stabilityai/stable-diffusion-2-1"),
    native_side=768, controlnet=_UNET_CONTROLNET,
    latent_format="sd", call=Call(Guidance.CFG), prompt_encoding="clip", **_A1111,
    **_UNET_EXEC,
)

# -------------------------------------------------------------------------------------------------- SDXL

SDXL = Family(
    key="sdxl", group="sdxl", name="SDXL", label="SDXL", version_label="SDXL",
    tasks={
        Task.TXT2IMG.value: "StableDiffusionXLPipeline",
        Task.IMG2IMG.value: "StableDiffusionXLImg2ImgPipeline",
        Task.INPAINT.value: "StableDiffusionXLInpaintPipeline",
        Task.CONTROLNET.value: "StableDiffusionXLControlNetPipeline",
        Task.CONTROLNET_IMG2IMG.value: "StableDiffusionXLControlNetImg2ImgPipeline",
        Task.CONTROLNET_INPAINT.value: "StableDiffusionXLControlNetInpaintPipeline",
    },
    other_pipelines=(
        "StableDiffusionXLAdapterPipeline", "StableDiffusionXLControlNetPAGPipeline",
        "StableDiffusionXLControlNetPAGImg2ImgPipeline", "StableDiffusionXLControlNetUnionPipeline",
        "StableDiffusionXLControlNetUnionImg2ImgPipeline", "StableDiffusionXLControlNetUnionInpaintPipeline",
        "StableDiffusionXLControlNetXSPipeline", "StableDiffusionXLInstructPix2PixPipeline",
        "StableDiffusionXLPAGPipeline", "StableDiffusionXLPAGImg2ImgPipeline", "StableDiffusionXLPAGInpaintPipeline",
    ),
    denoiser="unet", denoiser_classes=("UNet2DConditionModel",), unet_cross_attention=2048,
    single_file=SingleFile(
        pipeline="StableDiffusionXLPipeline", model_types=("xl_base", "playground-v2-5"),
        components=("unet", "vae", "text_encoder", "tokenizer", "text_encoder_2", "tokenizer_2", "scheduler"),
        quantize_on_load="unet", checkpoint_match=keys.sdxl_file, gguf_match=keys.sdxl_unet, gguf_layout="ldm-unet",
        architecture_check="file", inpaint_unet=True, offline_variant=keys.sdxl_variant,
        text_encoder_prefixes={"text_encoder": (keys.CLIP_XL,), "text_encoder_2": (keys.OPENCLIP_XL,)}),
    builtin="sdxl", hub_id="stabilityai/stable-diffusion-xl-base-1.0",
    aliases=("sdxl", "sd-xl", "sdxl-base", "stabilityai/stable-diffusion-xl-base-1.0"),
    native_side=1024, vae_force_upcast=True, controlnet=_UNET_CONTROLNET,
    latent_format="sdxl", call=Call(Guidance.CFG), prompt_encoding="clip_pair", **_A1111,
    **_UNET_EXEC,
)

# --------------------------------------------------------------------------------------------------- SD3

SD3 = Family(
    key="sd3", group="sd3", name="SD3", label="SD3-medium",
    tasks={
        Task.TXT2IMG.value: "StableDiffusion3Pipeline",
        Task.IMG2IMG.value: "StableDiffusion3Img2ImgPipeline",
        Task.CONTROLNET.value: "StableDiffusion3ControlNetPipeline",
    },
    other_pipelines=("StableDiffusion3InpaintPipeline", "StableDiffusion3ControlNetInpaintingPipeline",
                     "StableDiffusion3PAGPipeline", "StableDiffusion3PAGImg2ImgPipeline"),
    denoiser="transformer", denoiser_classes=("SD3Transformer2DModel",),
    single_file=SingleFile(pipeline="StableDiffusion3Pipeline", model_types=("sd3", "sd35_medium", "sd35_large"),
                           checkpoint_match=keys.sd3_file, gguf_match=keys.sd3_file, offline_variant=keys.sd3_variant,
                           optional_t5=("text_encoder_3", "tokenizer_3")),
    builtin="sd3", hub_id="stabilityai/stable-diffusion-3-medium-diffusers",
    aliases=("sd3", "sd3-medium", "stabilityai/stable-diffusion-3-medium-diffusers"),
    native_side=1024,
    # its CLIP-L and CLIP-G token embeddings (77) joined with T5's in the stream (MMDiT joint attention)
    t5_tokens=256, joint_tokens=77 + 256, cfg_batch=True,
    controlnet=ControlNetFacts(
        kind="sd3", model_class="SD3ControlNetModel", label="SD3",
        from_transformer={"num_layers": 12, "extra_conditioning_channels": 0}, img2img=False, guess_mode=False,
        latent_per_token=lambda c: spatial_patch(c.get("patch_size", 2)) ** 2,
        file_match=lambda s: "pos_embed_input.proj.weight" in s, global_rng_control_latents=True,
        from_base=_sd3_controlnet_from_base, config_from_shapes=controlnet_shapes.sd3_config),
    latent_format="sd3", call=Call(Guidance.CFG), text_encode_apart="encode_prompt_cfg", lora="diffusers",
  
    textual_inversion=False,
)

# ------------------------------------------------------------------------------------------------ FLUX.1

# FLUX.1-dev: Forge's defaults for it (20 steps, "Distilled CFG Scale" 3.5, FluxPipeline's own guidance_scale); before
# records had sampling defaults it ran A1111's CFG 7 as its guidance, which burns its images
FLUX1_DEV = Sampling(20, 3.5, "Forge's FLUX.1-dev defaults")
# FLUX.1-schnell (no guidance input: guidance_embeds false): its model card's 4 steps, guidance 0
FLUX1_SCHNELL = Sampling(4, 0.0, "FLUX.1-schnell's model card")


def _flux1_sampling(facts: FolderFacts) -> Sampling:
    """schnell where the transformer's config says it takes no guidance (guidance_embeds false), dev otherwise."""
    return FLUX1_SCHNELL if facts.transformer.get("guidance_embeds") is False else FLUX1_DEV


FLUX1 = Family(
    key="flux", group="flux", name="Flux", label="FLUX.1-dev",
    tasks={
        Task.TXT2IMG.value: "FluxPipeline",
        Task.IMG2IMG.value: "FluxImg2ImgPipeline",
        Task.CONTROLNET.value: "FluxControlNetPipeline",
        Task.CONTROLNET_IMG2IMG.value: "FluxControlNetImg2ImgPipeline",
    },
    other_pipelines=("FluxInpaintPipeline", "FluxControlNetInpaintPipeline", "FluxFillPipeline", "FluxControlPipeline",
                     "FluxControlImg2ImgPipeline", "FluxControlInpaintPipeline", "FluxPriorReduxPipeline"),
    denoiser="transformer", denoiser_classes=("FluxTransformer2DModel",),
    single_file=SingleFile(pipeline="FluxPipeline", model_types=("flux-dev", "flux-schnell"),
                           checkpoint_match=keys.flux1_file, gguf_match=keys.flux1_file, gguf_layout="bfl-flux1",
                           architecture_check="gguf", offline_variant=keys.flux1_variant,
                           file_variant=keys.flux1_file_variant, config_variant=keys.flux1_config_variant),
    builtin="flux", hub_id="black-forest-labs/FLUX.1-dev",
    aliases=("flux", "flux-dev", "flux.1-dev", "flux1-dev", "black-forest-labs/flux.1-dev"),
    native_side=1024,
    # T5's tokens only in the stream (CLIP gives a pooled vector). FLUX.1-dev is guidance-distilled (the guidance
    # scale is an input) and schnell needs no guidance: no CFG batch (its optional true CFG, true_cfg_scale > 1 with
    # a negative prompt, runs two separate forwards). schnell's model card suggests max_sequence_length=256, but the
    # pipeline's default (what runs here) is 512
    t5_tokens=512, joint_tokens=512, cfg_batch=False, file_dtype="bfloat16",
    controlnet=ControlNetFacts(
        kind="flux", model_class="FluxControlNetModel", label="Flux",
        from_transformer={"num_layers": 4, "num_single_layers": 10, "attention_head_dim": 128,
                          "num_attention_heads": 24},
        img2img=True, guess_mode=False,
        # 16-channel latents packed 2x2 into its input channels, patch 1 on top
        latent_per_token=lambda c: max(1, int(c.get("in_channels", 64)) // 16) * spatial_patch(c.get("patch_size", 1)) ** 2,
        file_match=lambda s: "txt_norm.weight" not in s and any(  # txt_norm: a Qwen-Image ControlNet's
            k.startswith("controlnet_single_blocks.") or k == "controlnet_x_embedder.weight" for k in s),
        from_base=_flux_controlnet_from_base, config_from_shapes=controlnet_shapes.flux_config,
        mixes_kinds=False),
    latent_format="flux", packed_latents=True,
    call=Call(Guidance.DISTILLED, negative_prompt=False, takes_negative_prompt=True, optional_true_cfg=True),
    text_encode_apart="encode_prompt_pooled", lora="diffusers", lora_widens=True,
    # its ControlNet img2img pipeline takes no negative prompt; its pipelines carry
    # diffusers' textual-inversion loader
    no_negative_prompt_tasks=(Task.CONTROLNET_IMG2IMG.value,), textual_inversion=True,
    sampling=FLUX1_DEV, sampling_for=_flux1_sampling,
)

# ------------------------------------------------------------------------------------------------ PixArt
# Cross-attention transformers over a T5 prompt (the text is not in the image stream); no built-in configs.


def _pixart_bins(tables: Mapping[int, str]):
    """The bins a PixArt pipeline's resolution binning (use_resolution_binning, on by default) picks by its
    transformer's sample_size (`tables`: sample_size -> the name of the table in diffusers' PixArt modules, as its
    __call__ picks it), as (ratio, height, width); () for a size it has none for (its call refuses that size)."""
    def bins(transformer: Mapping) -> tuple[tuple[float, int, int], ...]:
        from diffusers.pipelines.pixart_alpha import pipeline_pixart_alpha, pipeline_pixart_sigma

        name = tables.get(int(transformer.get("sample_size") or 0))
        table = (getattr(pipeline_pixart_sigma, name, None) or getattr(pipeline_pixart_alpha, name, {})) if name else {}
        return tuple((float(r), int(h), int(w)) for r, (h, w) in table.items())

    return bins


_PIXART_ALPHA_BINS = {128: "ASPECT_RATIO_1024_BIN", 64: "ASPECT_RATIO_512_BIN", 32: "ASPECT_RATIO_256_BIN"}

PIXART_SIGMA = Family(
    key="pixart-sigma", group="pixart-sigma", name="PixArt-Sigma",
    tasks={Task.TXT2IMG.value: "PixArtSigmaPipeline"}, other_pipelines=("PixArtSigmaPAGPipeline",),
    denoiser="transformer", denoiser_classes=("PixArtTransformer2DModel",),
    native_side=1024, t5_tokens=300, joint_tokens=0, cfg_batch=True,
    call=Call(Guidance.CFG), lora=None,
    textual_inversion=False,
    resolution_bins=_pixart_bins({256: "ASPECT_RATIO_2048_BIN", **_PIXART_ALPHA_BINS}),
)

PIXART_ALPHA = Family(
    key="pixart-alpha", group="pixart-alpha", name="PixArt-Alpha",
    tasks={Task.TXT2IMG.value: "PixArtAlphaPipeline"},
    denoiser="transformer", denoiser_classes=("PixArtTransformer2DModel",),
    native_side=1024, t5_tokens=120, joint_tokens=0, cfg_batch=True,
    call=Call(Guidance.CFG), lora=None,
    textual_inversion=False,
    resolution_bins=_pixart_bins(_PIXART_ALPHA_BINS),
)

# ------------------------------------------------------------------------------------------------ generic
# A pipeline no record knows: what the code did before there were records. Its denoiser's shapes are read with the
# common transformer layout, a T5 prompt is taken as DEFAULT_T5_TOKENS long, CFG batches, the call gets
# guidance_scale and the negative prompt, its LoRA loader (if it has one) is asked, and nothing A1111-specific acts.

GENERIC = Family(key=GENERIC_KEY, group=GENERIC_KEY, name="", call=Call(Guidance.CFG), lora="diffusers")

# Lookup order: the first record that claims a pipeline class or a file wins (SD 1.5 before SD 2.1 for their shared
# pipeline classes). GENERIC is not in the list: it is what a lookup gives when no record claims the thing.
from lowvram_gen.families.records_dit import DIT_FAMILIES  # noqa: E402  (SANA, Chroma, Lumina 2: issue 30)
from lowvram_gen.families.records_qwen import QWEN_IMAGE  # noqa: E402  (issue 30: one module per family)
from lowvram_gen.families.records_kontext import FLUX_KONTEXT  # noqa: E402  (issue 30: editing models)
from lowvram_gen.families.records_qwen_edit import QWEN_EDIT_FAMILIES  # noqa: E402
from lowvram_gen.families.records_flux2_dev import FLUX2_DEV  # noqa: E402  (after Klein: its denoiser class is Klein's)
from lowvram_gen.families.records_hidream import HIDREAM  # noqa: E402
from lowvram_gen.families.records_cogview4 import COGVIEW4  # noqa: E402
from lowvram_gen.families.records_bria import BRIA  # noqa: E402
from lowvram_gen.families.records_omnigen import OMNIGEN  # noqa: E402
from lowvram_gen.families.records_video import VIDEO_FAMILIES  # noqa: E402  (issue 33: Wan, LTX-Video)

FAMILIES: tuple[Family, ...] = (SD15, SD21, SDXL, SD3, FLUX1, PIXART_SIGMA, PIXART_ALPHA, FLUX2_KLEIN, Z_IMAGE,
                                 *DIT_FAMILIES, QWEN_IMAGE, *QWEN_EDIT_FAMILIES, FLUX_KONTEXT, FLUX2_DEV,
                                 HIDREAM, FLUX2_KLEIN_9B, COGVIEW4, BRIA, OMNIGEN, *VIDEO_FAMILIES)
