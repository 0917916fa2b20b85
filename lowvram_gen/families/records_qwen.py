"""Qwen-Image's record (issue 30): Alibaba's 20B dual-stream MMDiT over a Wan-style 16-channel VAE, with Qwen2.5-VL
7B as its text encoder; diffusers' QwenImagePipeline and its img2img / inpaint pipelines.

What the record says and why:
- CFG is "true" CFG: `--cfg X` is the call's `true_cfg_scale=X` (two forwards per step, the negative one apart, not a
  doubled batch). diffusers runs it only when a negative prompt is given; its model card passes `negative_prompt=" "`,
  and ComfyUI always runs CFG with whatever negative it is given, so with none we pass " " whenever `--cfg` > 1
  (`Call.blank_negative`): `--cfg 1` turns CFG off, as in A1111 and ComfyUI. `guidance_scale` is only for
  guidance-distilled variants (guidance_embeds), which Qwen-Image is not.
- Shapes: the pipeline packs 2x2 latent pixels into one token (64 input channels = 16 latent channels x 2^2), and
  the config's `patch_size` 2 IS that packing, not a patch on top of it: the planner's reader (models/profile.py)
  takes the packing from in_channels / the VAE's channels, so the record reads the patch as 1 (else the image tokens
  came out a quarter of the real ones). 1024x1024: 128x128 latents, 64x64 = 4096 image tokens.
- Text: Qwen2.5-VL's hidden states of the prompt (the chat template's first 34 tokens dropped), at most
  `max_sequence_length` 512 tokens, beside the image tokens in every block (joint attention); the pipeline pads to the
  longest prompt only, so 512 is the bound the planner takes.
- Text encoders reloaded per job (`+te-reload`): the pipeline's encode_prompt gives the embeddings and their masks,
  the negative prompt's too when CFG is on (engines/sd/pipeline.encode_texts, 'encode_prompt_masked').
- ControlNet inpaint: QwenImageControlNetInpaintPipeline's `control_image` IS the image to repaint (with
  `control_mask`, the inpainting ControlNet reads its masked latents and the mask): the job's init image goes there,
  and a unit's other control image is not used (one of the job's warnings, engines/sd/inpaint.job_warnings), nor is
  the denoising strength (it repaints the masked area from noise).
- Configs: lowvram_gen/configs/qwen-image/ holds the published Qwen/Qwen-Image configs, so
  `plan --model qwen-image` plans the real shapes offline.
"""

from __future__ import annotations

from typing import Mapping

from lowvram_gen.families import controlnet_shapes, keys
from lowvram_gen.families.record import (Call, ControlNetFacts, Family, Guidance, Sampling, SingleFile, Task,
                                         transformer_shape)


def _qwen_transformer_shape(config: Mapping) -> tuple[int, int]:
    """(hidden width, patch edge on top of the 2x2 packing): its patch_size is the packing itself (see the doc)."""
    hidden, _patch = transformer_shape(config)
    return hidden, 1


QWEN_IMAGE = Family(
    key="qwen-image", group="qwen-image", name="Qwen-Image", label="Qwen-Image",
    tasks={
        Task.TXT2IMG.value: "QwenImagePipeline",
        Task.IMG2IMG.value: "QwenImageImg2ImgPipeline",
        Task.INPAINT.value: "QwenImageInpaintPipeline",
        Task.CONTROLNET.value: "QwenImageControlNetPipeline",
        Task.CONTROLNET_INPAINT.value: "QwenImageControlNetInpaintPipeline",
    },
    # the edit pipelines are Qwen-Image-Edit's (families/records_qwen_edit.py)
    other_pipelines=("QwenImageLayeredPipeline",),
    denoiser="transformer", denoiser_classes=("QwenImageTransformer2DModel",),
    # its transformer alone (ComfyUI's diffusion_models/, a city96 GGUF): models/transformer_file.py
    single_file=SingleFile(pipeline="QwenImagePipeline", components=("text_encoder", "vae"),
                           gguf_match=keys.qwen_image_transformer),
    builtin="qwen-image", hub_id="Qwen/Qwen-Image",
    aliases=("qwen-image", "qwen", "qwenimage", "qwen/qwen-image"),
    native_side=1328,  # its model card's 1:1 size (1328x1328); 1024x1024 is planned with --width/--height
    transformer_shape=_qwen_transformer_shape,
    t5_tokens=512, joint_tokens=512, cfg_batch=False, file_dtype="bfloat16",
    # its VAE is Wan 2.1's (16 channels; the pipeline holds them normalised by the VAE's latents_mean/std, as
    # ComfyUI's Wan21 format does), packed 2x2 into a sequence as FLUX.1's: preview.py's "wan21"
    latent_format="wan21", packed_latents=True,
    # its model card: num_inference_steps=50, true_cfg_scale=4.0 (QwenImagePipeline's own defaults too)
    sampling=Sampling(50, 4.0, "Qwen-Image's model card"),
    controlnet=ControlNetFacts(
        kind="qwen-image", model_class="QwenImageControlNetModel", label="Qwen-Image",
        from_transformer={"num_layers": 5},  # diffusers' from_transformer default: InstantX's Union ControlNet's size
        img2img=False, guess_mode=False,  # diffusers has no Qwen-Image ControlNet img2img pipeline, nor guess mode
        latent_per_token=lambda c: 4,  # one token: 2x2 latent pixels (its patch_size 2 is that packing)
        file_match=controlnet_shapes.is_qwen_image, config_from_shapes=controlnet_shapes.qwen_image_config,
        other_layout=controlnet_shapes.qwen_image_other_layout,
        from_base=controlnet_shapes.qwen_image_from_base,
        # its ControlNet inpaint pipeline: the image and mask are an inpainting ControlNet's (InstantX's), whose VAE
        # latents it samples from torch's global random state
        multi_union="QwenImageMultiControlNetModel",  # several units: several control images of one ControlNet
        inpaint="control", global_rng_control_latents=True,
        inpaint_model=lambda c: int(c.get("extra_condition_channels") or 0) > 0,  # the mask and masked image's
        inpaint_example="InstantX's Qwen-Image-ControlNet-Inpainting"),
    call=Call(Guidance.TRUE_CFG, negative_prompt=True, takes_negative_prompt=True, blank_negative=" "),
    text_encode_apart="encode_prompt_masked", lora="diffusers", textual_inversion=False,
)
