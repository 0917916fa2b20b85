"""FLUX.1 Kontext's record (issue 30, editing models): FLUX.1's 12B transformer trained to edit, diffusers'
FluxKontextPipeline. A family of its own beside FLUX.1 (families/records.py), sharing its shapes, text encoders
(CLIP-L's pooled vector and T5-XXL's 512 tokens) and call.

What the record says and why:
- Tasks: edit (one reference image, the call's `image`) and txt2img (the same pipeline without an image: Kontext
  generates as FLUX.1-dev does). No img2img or inpaint pipeline of ours (FluxKontextInpaintPipeline is recognised).
- The pipeline resizes the reference image to the Kontext resolution nearest its aspect (PREFERRED_KONTEXT_RESOLUTIONS,
  about 1024x1024 pixels each) and packs its latents 2x2 beside the image's: (1024/16)^2 = 4096 tokens more in every
  block (what the plan counts).
- CFG is FLUX.1-dev's distilled guidance (`guidance_scale`, an input of the transformer, no CFG batch); its model card
  edits at 2.5 (`Edit.cfg`), where FLUX.1-dev generates at 3.5.
- Text encoders reloaded per job (`+te-reload`): FLUX.1's encode_prompt (embeddings and pooled vector; the reference
  image is not read by the text encoders).
"""

from __future__ import annotations

from lowvram_gen.families.record import Call, Edit, Family, Guidance, Sampling, Task

FLUX_KONTEXT = Family(
    key="flux-kontext", group="flux", name="FLUX.1 Kontext", label="FLUX.1-Kontext-dev",
    tasks={Task.TXT2IMG.value: "FluxKontextPipeline", Task.EDIT.value: "FluxKontextPipeline",
           Task.INPAINT.value: "FluxKontextInpaintPipeline"},
    # inpaint at the size asked, not at the nearest of Kontext's trained resolutions (the call's default)
    task_arguments={Task.INPAINT.value: {"_auto_resize": False}},
    joined_init_tasks=(Task.INPAINT.value,),
    # FLUX.1's transformer class, named here: records.py (FLUX1) imports this module
    denoiser="transformer", denoiser_classes=("FluxTransformer2DModel",),
    # its shipped configs (configs/flux-kontext) are FLUX.1-dev's with this pipeline's model_index.json
    builtin="flux-kontext", hub_id="black-forest-labs/FLUX.1-Kontext-dev", native_side=1024,
    aliases=("kontext", "flux-kontext", "flux.1-kontext-dev", "black-forest-labs/flux.1-kontext-dev"),
    t5_tokens=512, joint_tokens=512, cfg_batch=False, file_dtype="bfloat16",
    latent_format="flux", packed_latents=True,
    call=Call(Guidance.DISTILLED, negative_prompt=False, takes_negative_prompt=True, optional_true_cfg=True),
    # FLUX.1 Kontext [dev]'s model card: 28 steps at (distilled) guidance 2.5
    sampling=Sampling(28, 2.5, "FLUX.1 Kontext [dev]'s model card"),
    text_encode_apart="encode_prompt_pooled", lora="diffusers", textual_inversion=True,
    edit=Edit(argument="image", max_images=1, resize="area", pixels=1024 * 1024, needs_image=False,
              max_area_argument="max_area"),
)
