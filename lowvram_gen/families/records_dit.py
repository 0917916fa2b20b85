"""The records of three 2025 diffusion transformers (issue 30): SANA, Chroma and Lumina 2 (families/record.py says
what a record holds; records.py lists them in `FAMILIES`).

- SANA (SanaPipeline): a linear-attention transformer over a 32x DC-AE VAE, a Gemma 2 prompt (300 tokens) read by
  cross-attention, CFG as a doubled batch. Its call crashes on `negative_prompt=None`: it is given "" (its own
  default) when the user gave none. diffusers 0.42 has no SANA img2img or inpaint pipeline (SanaSprintImg2Img is
  for the Sprint models, whose call takes no negative prompt: not this record's).
- Chroma (ChromaPipeline): FLUX.1-schnell's layout without CLIP or a guidance input, a T5 prompt (512 tokens) in the
  joint stream, real CFG as two forwards (`guidance_scale` > 1 with the negative prompt); img2img with
  ChromaImg2ImgPipeline, inpaint with ChromaInpaintPipeline (its init latents put back outside the mask after each
  step, as A1111 does with an ordinary model; not joined to the image tokens). That pipeline reads
  `transformer.config.guidance_embeds`, a FLUX.1 entry ChromaTransformer2DModel's config has not (an AttributeError
  in plain diffusers 0.42): `task_configs` sets it False on the loaded transformer as the pipeline is made (only the
  unused `guidance` tensor reads it; ChromaPipeline and ChromaImg2ImgPipeline never do). Its call reads 256 prompt
  tokens where the others read 512: it is given 512, so a prompt reads the same in every task.
- Lumina 2 (Lumina2Pipeline): a unified transformer, a Gemma 2 prompt (256 tokens) beside the image tokens, real
  CFG as two forwards with its normalisation; no img2img or inpaint pipeline in diffusers 0.42.

Their shipped configs (lowvram_gen/configs/<builtin>) are the published repos' (the hub ids below), so `plan` plans
them offline.
"""

from __future__ import annotations

from typing import Mapping

from lowvram_gen.families import controlnet_shapes, keys
from lowvram_gen.families.record import Call, ControlNetFacts, Family, Guidance, Sampling, SingleFile, Task, spatial_patch


def sana_bins(transformer: Mapping) -> tuple[tuple[float, int, int], ...]:
    """The bins SanaPipeline's resolution binning picks by its transformer's sample_size (its __call__'s table: 512,
    1024, 2048 or 4096 px, from the installed diffusers), as (ratio, height, width); () for a size it has none for."""
    from diffusers.pipelines.sana import pipeline_sana

    table = {128: "ASPECT_RATIO_4096_BIN", 64: "ASPECT_RATIO_2048_BIN", 32: "ASPECT_RATIO_1024_BIN",
             16: "ASPECT_RATIO_512_BIN"}.get(int(transformer.get("sample_size") or 0))
    bins = getattr(pipeline_sana, table, {}) if table else {}
    return tuple((float(r), int(h), int(w)) for r, (h, w) in bins.items())


SANA = Family(
    key="sana", group="sana", name="SANA", label="SANA 1600M",
    tasks={Task.TXT2IMG.value: "SanaPipeline", Task.CONTROLNET.value: "SanaControlNetPipeline"},
    other_pipelines=("SanaPAGPipeline",),
    denoiser="transformer", denoiser_classes=("SanaTransformer2DModel",),
    # its transformer alone (ComfyUI's diffusion_models/, a city96 GGUF): models/transformer_file.py
    single_file=SingleFile(pipeline="SanaPipeline", components=("text_encoder", "vae"),
                           gguf_match=keys.sana_transformer),
    builtin="sana", hub_id="Efficient-Large-Model/Sana_1600M_1024px_diffusers",
    aliases=("sana", "sana-1600m", "sana_1600m_1024px", "efficient-large-model/sana_1600m_1024px_diffusers"),
    native_side=1024,
    # cross-attention over the Gemma prompt (its __call__'s max_sequence_length): no text in the image stream
    t5_tokens=300, joint_tokens=0, cfg_batch=True, file_dtype="bfloat16",
    # SanaControlNetPipeline (diffusers folders, as Efficient-Large-Model publishes them): one unit, no guidance window
    controlnet=ControlNetFacts(
        kind="sana", model_class="SanaControlNetModel", label="SANA", img2img=False, guess_mode=False,
        latent_per_token=lambda c: spatial_patch(c.get("patch_size", 1)) ** 2, guidance_window=False, multi=False,
        # a single file in diffusers' layout (a folder's diffusion_pytorch_model.safetensors downloaded alone)
        file_match=controlnet_shapes.is_sana, config_from_shapes=controlnet_shapes.sana_config,
        from_base=controlnet_shapes.sana_from_base, other_layout=controlnet_shapes.sana_other_layout),
    call=Call(Guidance.CFG, empty_negative=""), text_encode_apart="encode_prompt_masks", lora="diffusers",
    textual_inversion=False,
    # its model card (and SanaPipeline's defaults): num_inference_steps=20, guidance_scale=4.5
    sampling=Sampling(20, 4.5, "SANA's model card"),
    # no published linear map of its 32-channel DC-AE latents to RGB (ComfyUI has none either): previews by
    # madebyollin's TAESANA decoder where its file is in models/VAE-approx (preview.py's "dc-ae"), else none
    latent_format="dc-ae",
    # SanaPipeline renders a job at its aspect's bin and resizes the image after: the estimate plans the bin's tokens
    resolution_bins=sana_bins,
)

CHROMA = Family(
    key="chroma", group="chroma", name="Chroma", label="Chroma1-HD",
    tasks={Task.TXT2IMG.value: "ChromaPipeline", Task.IMG2IMG.value: "ChromaImg2ImgPipeline",
           Task.INPAINT.value: "ChromaInpaintPipeline"},
    # ChromaInpaintPipeline's max_sequence_length defaults to 256 (its txt2img and img2img pipelines', the plan's and
    # +te-reload's: 512): the prompt is read as in the other tasks
    task_arguments={Task.INPAINT.value: {"max_sequence_length": 512}},
    # diffusers 0.42's ChromaInpaintPipeline reads `guidance_embeds` off the transformer's config, which
    # ChromaTransformer2DModel has not (FLUX.1's entry; it only decides an unused `guidance` tensor): set False
    task_configs={Task.INPAINT.value: {"transformer": {"guidance_embeds": False}}},
    denoiser="transformer", denoiser_classes=("ChromaTransformer2DModel",),
    # its transformer alone (ComfyUI's diffusion_models/, a city96 GGUF): models/transformer_file.py
    single_file=SingleFile(pipeline="ChromaPipeline", components=("text_encoder", "vae"),
                           gguf_match=keys.chroma_transformer),
    builtin="chroma", hub_id="lodestones/Chroma1-HD",
    aliases=("chroma", "chroma1-hd", "chroma-hd", "lodestones/chroma1-hd"),
    native_side=1024,
    # T5's tokens in the joint stream; CFG runs the negative prompt as a second forward, not a doubled batch
    t5_tokens=512, joint_tokens=512, cfg_batch=False, file_dtype="bfloat16",
    latent_format="flux", packed_latents=True,  # FLUX.1's VAE and its 2x2 packing
    # Chroma1-HD's own demo (lodestones' space): num_inference_steps=40, guidance_scale=3.0 (ChromaPipeline's: 35 / 5.0)
    sampling=Sampling(40, 3.0, "Chroma1-HD's demo"),
    call=Call(Guidance.CFG), text_encode_apart="encode_prompt_masks", lora="diffusers",
    textual_inversion=True,  # its pipelines carry diffusers' TI loader
)

LUMINA2 = Family(
    key="lumina2", group="lumina2", name="Lumina 2", label="Lumina-Image-2.0",
    tasks={Task.TXT2IMG.value: "Lumina2Pipeline"},
    denoiser="transformer", denoiser_classes=("Lumina2Transformer2DModel",),
    # its transformer alone (ComfyUI's diffusion_models/, a city96 GGUF): models/transformer_file.py
    single_file=SingleFile(pipeline="Lumina2Pipeline", components=("text_encoder", "vae"),
                           gguf_match=keys.lumina2_transformer),
    builtin="lumina2", hub_id="Alpha-VLLM/Lumina-Image-2.0",
    aliases=("lumina2", "lumina-2", "lumina-image-2.0", "alpha-vllm/lumina-image-2.0"),
    native_side=1024,
    # the Gemma prompt (its __call__'s max_sequence_length) joins the image tokens; CFG as a second forward
    t5_tokens=256, joint_tokens=256, cfg_batch=False, file_dtype="bfloat16",
    call=Call(Guidance.CFG), text_encode_apart="encode_prompt_masks", lora="diffusers",
    textual_inversion=False,
    # Lumina-Image-2.0's model card: num_inference_steps=50, guidance_scale=4.0 (Lumina2Pipeline's own: 30 / 4.0)
    sampling=Sampling(50, 4.0, "Lumina-Image-2.0's model card"),
    latent_format="flux",  # FLUX.1's VAE, its latents unpacked (ComfyUI's Lumina 2 previews them as Flux's)
)

DIT_FAMILIES: tuple[Family, ...] = (SANA, CHROMA, LUMINA2)
