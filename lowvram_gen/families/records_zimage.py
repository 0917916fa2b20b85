"""Z-Image's record (families/record.py says what a record holds): Tongyi-MAI's Z-Image and Z-Image-Turbo, diffusers'
ZImagePipeline. A single-stream DiT (S3-DiT): the Qwen3 prompt's tokens and the image tokens in one sequence.

Its transformer's config names its width `dim` (3840 for the 6B model) and its patch `all_patch_size` ([2]), not
the heads x head width most diffusers transformers have, so the record reads its shape itself (the common reader
would fall back to PixArt's 1152). CFG is a doubled batch (prompt and negative prompt side by side) whenever the
scale is above 0: Turbo is run at guidance 0 (no CFG) and few steps, as its model card does.

diffusers 0.42 has its img2img (ZImageImg2ImgPipeline) and inpaint (ZImageInpaintPipeline) pipelines, which the
auto-pipelines reach from the txt2img one, its ControlNet and ControlNet inpaint pipelines (engines/sd/controlnet.py);
its Omni pipeline is recognised, not run.
"""

from __future__ import annotations

from typing import Mapping

from lowvram_gen.families import controlnet_shapes, keys
from lowvram_gen.families.record import (Call, ControlNetFacts, Family, FolderFacts, Guidance, Sampling, SingleFile, Task,
                                         spatial_patch)

# Z-Image-Turbo's model card: num_inference_steps=9 (8 forwards: the last sigma is 0), guidance_scale=0.0 (CFG off)
TURBO = Sampling(9, 0.0, "Z-Image-Turbo's model card")
# Z-Image (base)'s model card: num_inference_steps=50, guidance_scale=4 (ZImagePipeline's own defaults: 50 / 5.0)
BASE = Sampling(50, 4.0, "Z-Image's model card")


def zimage_shape(config: Mapping) -> tuple[int, int]:
    """(width, spatial patch edge) of a ZImageTransformer2DModel from its config: `dim` and the first of
    `all_patch_size` (the patch its pipelines run)."""
    patches = config.get("all_patch_size") or [2]
    return int(config.get("dim") or 3840), spatial_patch(list(patches)[0])


def zimage_sampling(facts: FolderFacts) -> Sampling:
    """Turbo's or the base model's defaults. Nothing in their configs tells them apart (one pipeline and transformer
    class, the same shapes), so the name does: the base model's hub id (Tongyi-MAI/Z-Image), or a folder or file
    whose name says 'base'; anything else is Turbo, the model the family's short names ('z-image') load."""
    name = facts.name
    return BASE if "turbo" not in name and (name.endswith("/z-image") or "base" in name) else TURBO


def _zimage_controlnet_stream(config: Mapping) -> tuple[int, int]:
    """(width, residual streams) of a ZImageControlNetModel: its `dim`, one stream per control layer (each is added
    to the transformer layer of its place)."""
    return int(config.get("dim") or 3840), len(config.get("control_layers_places") or ())


Z_IMAGE = Family(
    key="z-image", group="z-image", name="Z-Image", label="Z-Image-Turbo",
    tasks={
        Task.TXT2IMG.value: "ZImagePipeline",
        Task.IMG2IMG.value: "ZImageImg2ImgPipeline",
        Task.INPAINT.value: "ZImageInpaintPipeline",
        Task.CONTROLNET.value: "ZImageControlNetPipeline",
        Task.CONTROLNET_INPAINT.value: "ZImageControlNetInpaintPipeline",
    },
    other_pipelines=("ZImageOmniPipeline",),
    denoiser="transformer", denoiser_classes=("ZImageTransformer2DModel",),
    # its transformer alone (ComfyUI's diffusion_models/, a city96 GGUF): models/transformer_file.py
    single_file=SingleFile(pipeline="ZImagePipeline", components=("text_encoder", "vae"),
                           gguf_match=keys.zimage_transformer),
    builtin="z-image", hub_id="Tongyi-MAI/Z-Image-Turbo",
    aliases=("z-image", "zimage", "z-image-turbo", "zimage-turbo", "tongyi-mai/z-image-turbo"),
    native_side=1024, transformer_shape=zimage_shape,
    # the call's max_sequence_length (512); the pipeline drops the padding, so a prompt's own tokens (at most 512)
    # join the image tokens in the one stream: 512 is the bound the planner takes
    t5_tokens=512, joint_tokens=512, cfg_batch=True, file_dtype="bfloat16",
    # ZImageControlNetPipeline (alibaba-pai's Fun ControlNets as diffusers folders): one unit, no guidance window, no
    # img2img; the ControlNet runs on the transformer's own embedders and refiners (diffusers' from_transformer)
    controlnet=ControlNetFacts(
        kind="z-image", model_class="ZImageControlNetModel", label="Z-Image", img2img=False, guess_mode=False,
        latent_per_token=lambda c: spatial_patch(list(c.get("all_patch_size") or [2])[0]) ** 2,
        guidance_window=False, multi=False, stream=_zimage_controlnet_stream,
        # alibaba-pai's Z-Image-Turbo-Fun-Controlnet-Union files (1.0, 2.0, 2.1) as they download them
        file_match=controlnet_shapes.is_zimage, config_from_shapes=controlnet_shapes.zimage_config,
        config_from_values=controlnet_shapes.zimage_from_values, from_base=controlnet_shapes.zimage_from_base,
        borrows=("t_embedder", "all_x_embedder", "cap_embedder", "noise_refiner", "context_refiner", "x_pad_token",
                 "cap_pad_token"),
        # ZImageControlNetInpaintPipeline: the init image and mask beside the control map, read by a ControlNet whose
        # input is the control latents, the mask and the masked image's latents (16 + 1 + 16 channels; its txt2img
        # pipeline pads the two with zeros)
        inpaint="image", inpaint_model=lambda c: int(c.get("control_in_dim") or 0) > 2 * 16,
        inpaint_example="alibaba-pai's Z-Image-Turbo-Fun-Controlnet-Union-2.0"),
    call=Call(Guidance.CFG), text_encode_apart="encode_prompt_lists", lora="diffusers", textual_inversion=False,
    sampling=TURBO, sampling_for=zimage_sampling,
    latent_format="flux",  # FLUX.1's VAE (scaling 0.3611, shift 0.1159); its latents unpacked: ComfyUI previews it so
)
