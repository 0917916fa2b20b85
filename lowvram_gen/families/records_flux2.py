"""Flux.2 Klein's record (families/record.py says what a record holds): FLUX.2 [klein] 4B/9B, diffusers'
Flux2KleinPipeline. A family of its own, not FLUX.1's: one Qwen3 text encoder (hidden states of three layers side by
side are the text tokens), a 32-channel VAE whose latents the pipeline packs 2x2 into the transformer's 128 input
channels, and a call with no negative prompt at all.

Its `guidance_scale` is what the folder says it is: a step-distilled model (Klein 4B/9B, `is_distilled` in
model_index.json) ignores it (diffusers logs so); the base models run CFG as two separate forwards against an
empty negative prompt the pipeline makes itself (so no CFG batch). A user's negative prompt is never used: the
engine leaves it out of the call and says so in one line.

diffusers 0.42 has no img2img pipeline for it (Flux2KleinPipeline's `image` is a reference image for editing, not
an init image with a strength): img2img and hires fix are refused in one sentence before any step runs. Its inpaint
pipeline (Flux2KleinInpaintPipeline, which the auto-pipelines do not map) is built over the loaded components
(engines/sd/inpaint.inpaint_pipe) and takes our mask options.

Klein 9B (FLUX2_KLEIN_9B) is the same family at another size: its own shipped configs (configs/flux2-klein-9b: a
4096-wide transformer, Qwen3 8B) and names for `plan`, everything else the 4B record's. A loaded Klein pipeline is the
4B record's (the first that claims the class); the two differ in no execution fact.
"""

from __future__ import annotations

from dataclasses import replace

from lowvram_gen.families import keys
from lowvram_gen.families.record import Call, Edit, Family, FolderFacts, Guidance, Sampling, SingleFile, Task

# FLUX.2 [klein] 4B/9B's model cards (the step-distilled models): num_inference_steps=4, guidance_scale=1.0
DISTILLED = Sampling(4, 1.0, "FLUX.2 [klein]'s model card")
# the base models' (Klein Base 4B/9B): Flux2KleinPipeline's own defaults, 50 steps at guidance 4.0
BASE = Sampling(50, 4.0, "Flux2KleinPipeline's defaults (the base models)")


def klein_sampling(facts: FolderFacts) -> Sampling:
    """A distilled model's defaults where model_index.json says `is_distilled` (as the pipeline itself reads it);
    the base models' where it says not. A folder that does not say is the distilled Klein 4B the short names load."""
    distilled = facts.model_index.get("is_distilled")
    return BASE if distilled is False else DISTILLED


FLUX2_KLEIN = Family(
    key="flux2-klein", group="flux2-klein", name="Flux.2 Klein", label="FLUX.2-klein-4B",
    tasks={Task.TXT2IMG.value: "Flux2KleinPipeline", Task.INPAINT.value: "Flux2KleinInpaintPipeline",
           Task.EDIT.value: "Flux2KleinPipeline"},
    other_pipelines=("Flux2KleinKVPipeline",),
    joined_init_tasks=(Task.INPAINT.value,),
    denoiser="transformer", denoiser_classes=("Flux2Transformer2DModel",),
    # its transformer alone (ComfyUI's diffusion_models/, a city96 GGUF): models/transformer_file.py
    single_file=SingleFile(pipeline="Flux2KleinPipeline", components=("text_encoder", "vae"),
                           gguf_match=keys.flux2_klein_transformer, file_variant=keys.klein_file_variant,
                           config_variant=keys.klein_config_variant),
    builtin="flux2-klein", hub_id="black-forest-labs/FLUX.2-klein-4B",
    aliases=("flux2-klein", "flux.2-klein", "flux2-klein-4b", "flux.2-klein-4b", "klein", "klein-4b",
             "black-forest-labs/flux.2-klein-4b"),
    native_side=1024,
    # Qwen3's prompt padded to the call's max_sequence_length (512), carried beside the image tokens (joint
    # attention); CFG (base models only) runs as two forwards, never a doubled batch
    t5_tokens=512, joint_tokens=512, cfg_batch=False, file_dtype="bfloat16",
    call=Call(Guidance.CFG, negative_prompt=False, takes_negative_prompt=False),
    text_encode_apart="encode_prompt_empty_negative", lora="diffusers", textual_inversion=False,
    sampling=DISTILLED, sampling_for=klein_sampling,
    # its 32-channel VAE latents, patchified 2x2 (128 channels) and packed into a sequence: preview.py's "flux2"
    latent_format="flux2", packed_latents=True,
    # reference images (the call's `image`, a list): each made at most 1024x1024 pixels, its latents beside the
    # image's; BFL's model card edits with up to 4 references on Klein (FLUX.2 [dev] takes up to 10)
    edit=Edit(argument="image", max_images=4, resize="cap", pixels=1024 * 1024, needs_image=False),
)

FLUX2_KLEIN_9B = replace(
    FLUX2_KLEIN, key="flux2-klein-9b", label="FLUX.2-klein-9B", builtin="flux2-klein-9b",
    hub_id="black-forest-labs/FLUX.2-klein-9B",
    # its transformer file is told from 4B's by its width (families/keys.py)
    single_file=replace(FLUX2_KLEIN.single_file, gguf_match=keys.flux2_klein_9b_transformer),
    aliases=("flux2-klein-9b", "flux.2-klein-9b", "klein-9b", "black-forest-labs/flux.2-klein-9b"))
