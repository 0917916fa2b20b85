"""OmniGen's record (families/record.py says what a record holds): diffusers' OmniGenPipeline, one Phi-3-shaped
transformer that reads the prompt's token ids itself (no text encoder) beside 2x2 patches of an SDXL-style VAE.

What the record says and why:
- No text encoder: the transformer embeds the tokens, so there is nothing to encode apart from the call and no
  `+te-reload` (text_encode_apart None), and nothing to offload for the prompt.
- CFG is `guidance_scale` with the batch doubled (the pipeline builds its own unconditional prompt); the call takes
  no negative prompt (a user's is ignored with the one-line warning every such family gives).
- Input images (OmniGen's editing and subject tasks, `input_images` with <img><|image_1|></img> placeholders in the
  prompt) are not wired here: txt2img only; img2img, inpaint and edit are refused in one sentence.
- Loading: the auto-pipelines of diffusers 0.42 do not map OmniGenPipeline; models/loading.py loads the folder with
  its own class, as for Bria. No LoRA loader in diffusers 0.42 for it.
- No shipped configs (a cheap record): `plan` reads a local folder's own configs.
"""

from __future__ import annotations

from lowvram_gen.families.record import Call, Family, Guidance, Sampling, Task

OMNIGEN = Family(
    key="omnigen", group="omnigen", name="OmniGen",
    tasks={Task.TXT2IMG.value: "OmniGenPipeline"},
    denoiser="transformer", denoiser_classes=("OmniGenTransformer2DModel",),
    native_side=1024, cfg_batch=True, file_dtype="bfloat16",
    call=Call(Guidance.CFG, negative_prompt=False, takes_negative_prompt=False),
    text_encode_apart=None, lora=None, textual_inversion=False,
    sampling=Sampling(50, 2.5, "diffusers' OmniGenPipeline defaults (OmniGen-v1's model card)"),
)
