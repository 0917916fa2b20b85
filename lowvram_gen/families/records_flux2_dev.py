"""FLUX.2 [dev]'s record (families/record.py says what a record holds): Black Forest Labs' 32B guidance-distilled
transformer with Mistral Small 3.1 (24B) as its one text encoder, diffusers' Flux2Pipeline. A family of its own, not
FLUX.1's nor Flux.2 Klein's (which shares the transformer class but has a Qwen3 encoder and its own pipeline).

What the record says and why:
- Guidance is distilled: `--cfg X` is the call's `guidance_scale=X`, an input of the transformer (guidance_embeds),
  one forward per step, never a doubled batch. Its model card runs 4 (diffusers' default) at 50 steps.
- The call has no negative prompt at all: a user's negative prompt is left out of the call, with a one-line warning
  (engines' generic rule for `takes_negative_prompt=False`).
- Text: the hidden states of Mistral's layers 10, 20 and 30 side by side (3 x 5120 = the transformer's
  joint_attention_dim 15360) for the prompt padded to `max_sequence_length` 512, beside the image tokens in every
  block (joint attention).
- Shapes: a 32-channel VAE (AutoencoderKLFlux2, 8x) whose latents the pipeline packs 2x2 into the transformer's 128
  input channels (patch_size 1 on top): 1024x1024 is 64x64 = 4096 image tokens; the planner reads the packing from
  in_channels / the VAE's channels (models/profile.py).
- Text encoders reloaded per job (`+te-reload`): the pipeline's encode_prompt gives the embeddings alone
  (engines/sd/pipeline.encode_texts, 'encode_prompt_embeds').
- Tasks: diffusers 0.42 has no img2img or inpaint pipeline for it (Flux2Pipeline's `image` is a reference image for
  editing, not an init image; Flux2KleinInpaintPipeline is Klein's): both are refused in one sentence.
- Configs: lowvram_gen/configs/flux2-dev/ holds the published black-forest-labs/FLUX.2-dev configs (see its
  README.md), so `plan --model flux2-dev` plans the real shapes offline.
"""

from __future__ import annotations

from lowvram_gen.families import keys
from lowvram_gen.families.record import Call, Edit, Family, Guidance, Sampling, SingleFile, Task

FLUX2_DEV = Family(
    key="flux2-dev", group="flux2-dev", name="Flux.2 dev", label="FLUX.2-dev",
    tasks={Task.TXT2IMG.value: "Flux2Pipeline", Task.EDIT.value: "Flux2Pipeline"},
    denoiser="transformer", denoiser_classes=("Flux2Transformer2DModel",),
    # its transformer alone (BFL's flux2-dev.safetensors, ComfyUI's diffusion_models/): models/transformer_file.py;
    # told from Klein's by its guidance embedder (families/keys.py)
    single_file=SingleFile(pipeline="Flux2Pipeline", components=("text_encoder", "vae"),
                           gguf_match=keys.flux2_dev_transformer),
    builtin="flux2-dev", hub_id="black-forest-labs/FLUX.2-dev",
    aliases=("flux2", "flux2-dev", "flux.2", "flux.2-dev", "black-forest-labs/flux.2-dev"),
    native_side=1024,
    # Mistral's prompt padded to the call's max_sequence_length (512), carried beside the image tokens; guidance is
    # an input of the transformer: no CFG batch
    t5_tokens=512, joint_tokens=512, cfg_batch=False, file_dtype="bfloat16",
    # Klein's 32-channel VAE latents, patchified and packed as Klein's (the reference images' joined only in a step)
    latent_format="flux2", packed_latents=True,
    call=Call(Guidance.DISTILLED, negative_prompt=False, takes_negative_prompt=False),
    # FLUX.2 [dev]'s model card and Flux2Pipeline's defaults: 50 steps at (distilled) guidance 4
    sampling=Sampling(50, 4.0, "FLUX.2 [dev]'s model card"),
    text_encode_apart="encode_prompt_embeds", lora="diffusers", textual_inversion=False,
    # reference images (the call's `image`, a list), each made at most 1024x1024 pixels, their latents beside the
    # image's: FLUX.2 [dev]'s model card edits with up to 10
    edit=Edit(argument="image", max_images=10, resize="cap", pixels=1024 * 1024, needs_image=False),
)
