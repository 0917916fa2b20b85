"""HiDream-I1's record (families/record.py says what a record holds): HiDream.ai's 17B sparse (mixture-of-experts)
diffusion transformer, diffusers' HiDreamImagePipeline, with four text encoders: CLIP-L and CLIP-G (their pooled
projections side by side, 768 + 1280 = the transformer's text_emb_dim 2048), T5-XXL and Llama 3.1 8B Instruct.

What the record says and why:
- CFG is classic: `guidance_scale`, prompt and negative prompt as a doubled batch (HiDream-I1-Full runs 5 at 50
  steps; the distilled Dev and Fast run without CFG, guidance 0, at 28 and 16 steps). The call takes four prompts
  (prompt .. prompt_4, one per encoder) and four negatives; we pass `prompt` and `negative_prompt`, which the
  pipeline gives every encoder (its own fallback for the others).
- Text: T5's and Llama's prompts are padded to the call's `max_sequence_length` 128; the transformer carries T5's
  tokens, the last Llama layer's and, per block, one more Llama layer's beside the image tokens: 3 x 128 = 384 text
  tokens in the stream (joint attention). The CLIP encoders give pooled vectors only.
- Shapes: FLUX.1's 16-channel VAE, the transformer's patch 2 on unpacked latents (in_channels 16): 1024x1024 is
  64x64 = 4096 image tokens; 20 heads x 128 = 2560 wide.
- Text encoders reloaded per job (`+te-reload`): the pipeline's encode_prompt gives its six tensors
  (engines/sd/pipeline.encode_texts, 'encode_prompt_four'); Llama's are (layers, batch, tokens, width), which
  `for_images` repeats along their batch axis.
- Size: the pipeline scales every width x height to its native area (1024x1024 at real size), keeping the aspect,
  to multiples of 16: what it renders is said in one warning when it is not the size asked (`rendered_size`).
- Loading: the auto-pipelines of diffusers 0.42 do not map HiDreamImagePipeline; models/loading.py loads the folder
  with its own class when a record claims it. diffusers has no img2img or inpaint pipeline for it: refused in one
  sentence.
- Configs: lowvram_gen/configs/hidream/ holds HiDream-I1-Full's (see its README.md); Dev and Fast have the same
  shapes (their hub ids plan the same configs).
"""

from __future__ import annotations

import math

from lowvram_gen.families import keys
from lowvram_gen.families.record import Call, Family, FolderFacts, Guidance, Sampling, SingleFile, Task


# HiDreamImagePipeline's default_sample_size (latent pixels a side), whatever its VAE
DEFAULT_SAMPLE_SIZE = 128


def hidream_size(pipe, width: int, height: int) -> tuple[int, int]:
    """What HiDreamImagePipeline renders when asked for width x height: its __call__ scales the size to the area of
    its default sample size, keeping the aspect, to multiples of twice the VAE's scale factor. `pipe`: the pipeline,
    or anything with its VAE's `vae_scale_factor` (the planner's stand-in: the pipeline's default sample size)."""
    division = pipe.vae_scale_factor * 2
    sample = getattr(pipe, "default_sample_size", DEFAULT_SAMPLE_SIZE)
    scale = math.sqrt((sample * pipe.vae_scale_factor) ** 2 / (width * height))
    return int(width * scale // division * division), int(height * scale // division * division)


# HiDream-I1's model cards: Full runs 50 steps at CFG 5; Dev (28 steps) and Fast (16) are guidance-distilled (CFG 0).
# One pipeline class and one config for the three: the model's name tells them apart
FULL = Sampling(50, 5.0, "HiDream-I1-Full's model card")
DEV = Sampling(28, 0.0, "HiDream-I1-Dev's model card")
FAST = Sampling(16, 0.0, "HiDream-I1-Fast's model card")


def hidream_sampling(facts: FolderFacts) -> Sampling:
    """Dev's or Fast's defaults where the model's name says so; Full's otherwise (what the short names load)."""
    name = facts.name.rsplit("/", 1)[-1]
    return DEV if "-dev" in name else FAST if "-fast" in name else FULL


HIDREAM = Family(
    key="hidream", group="hidream", name="HiDream-I1", label="HiDream-I1-Full",
    tasks={Task.TXT2IMG.value: "HiDreamImagePipeline"},
    denoiser="transformer", denoiser_classes=("HiDreamImageTransformer2DModel",),
    # its transformer alone (Comfy-Org's hidream_i1_*.safetensors, in diffusers' own names): models/transformer_file.py
    single_file=SingleFile(pipeline="HiDreamImagePipeline",
                           components=("text_encoder", "text_encoder_2", "text_encoder_3", "text_encoder_4", "vae"),
                           gguf_match=keys.hidream_transformer),
    builtin="hidream", hub_id="HiDream-ai/HiDream-I1-Full",
    # Dev's and Fast's hub ids plan the same shapes (and load as given); no short names for them, which would load
    # the record's hub id (Full's)
    aliases=("hidream", "hidream-i1", "hidream-i1-full", "hidream-ai/hidream-i1-full", "hidream-ai/hidream-i1-dev",
             "hidream-ai/hidream-i1-fast"),
    native_side=1024,
    # T5 and Llama padded to max_sequence_length 128; T5's, the last Llama layer's and one Llama layer per block in
    # the stream: 384
    t5_tokens=128, joint_tokens=384, cfg_batch=True, file_dtype="bfloat16",
    call=Call(Guidance.CFG), text_encode_apart="encode_prompt_four", lora="diffusers", textual_inversion=False,
    sampling=FULL, sampling_for=hidream_sampling,
    rendered_size=hidream_size,
)
