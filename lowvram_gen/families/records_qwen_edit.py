"""Qwen-Image-Edit's records (issue 30, editing models): Qwen-Image's 20B MMDiT trained to edit, diffusers'
QwenImageEditPipeline (one reference image) and QwenImageEditPlusPipeline (Qwen-Image-Edit-2509/2511: several).

What the records say and why:
- Task: edit (Task.EDIT). Its txt2img task names the same class, as every record's does, but the call reads the
  reference image's size before anything else, so it cannot run without one: txt2img and img2img are refused in one
  sentence (`Edit.needs_image`, engines/sd/edit.py); they are Qwen-Image's.
- Inpaint (Qwen-Image-Edit only): QwenImageEditInpaintPipeline, the init image being the image it edits and repaints
  inside the mask. Its call ignores width and height: it renders about 1024x1024 pixels at the init image's aspect
  (its module's calculate_dimensions), and its VAE latents of the init image join the image tokens in every block
  (as an edit's reference). `rendered_sizes` says so, so the plan counts that size twice over, no preset caps it, the
  ladder takes no resolution step, and the image, made at that size, is resized to the asked one (its PNG's
  "Generated size" says what was made).
- The reference images go to the call's `image` argument. The pipeline resizes each to about 1024x1024 pixels (its
  aspect kept) for its VAE, whatever the output size, so each adds (1024/16)^2 = 4096 latent tokens beside the image
  tokens in every block (what the plan counts); Edit-Plus also gives Qwen2.5-VL each image at 384x384.
- CFG as Qwen-Image's: `--cfg X` is the call's `true_cfg_scale` (two forwards), with the model card's blank negative
  prompt " " when the user gives none, so `--cfg` acts without one (families/records_qwen.py says why).
- Its text encoder (Qwen2.5-VL) reads the reference images with the prompt, so the prompts cannot be encoded apart
  from the call: no `+te-reload` (text_encode_apart None; the planner does not offer it).
- How many images: the Edit-Plus model card's "1 to 3 input images" is what it was trained on; the original takes one.
"""

from __future__ import annotations

from lowvram_gen.families.record import Call, Edit, Family, Guidance, Sampling, Task
from lowvram_gen.families.records_qwen import QWEN_IMAGE

EDIT_AREA = 1024 * 1024  # the pixels QwenImageEditInpaintPipeline renders, whatever the size asked


def edit_inpaint_size(width: int, height: int) -> tuple[int, int]:
    """What QwenImageEditInpaintPipeline renders for an init image of width x height: its call sets width and height
    from the image's aspect, calculate_dimensions(1024 * 1024, aspect) (multiples of 32; the multiple of its VAE's
    scale factor x 2 it rounds down to after divides them). diffusers' own function, read from its module as the call
    reads it."""
    from diffusers.pipelines.qwenimage import pipeline_qwenimage_edit_inpaint as module

    w, h, _ = module.calculate_dimensions(EDIT_AREA, width / height)
    return int(w), int(h)

_COMMON = dict(
    denoiser="transformer", denoiser_classes=QWEN_IMAGE.denoiser_classes, native_side=1024,
    transformer_shape=QWEN_IMAGE.transformer_shape, t5_tokens=512, joint_tokens=512, cfg_batch=False,
    file_dtype="bfloat16",
    # Qwen-Image's latents (Wan 2.1's VAE, packed 2x2 into a sequence): the reference images' latents are joined to
    # them only inside each step, so the latents a step ends with are the output image's alone
    latent_format="wan21", packed_latents=True,
    call=Call(Guidance.TRUE_CFG, negative_prompt=True, takes_negative_prompt=True, blank_negative=" "),
    text_encode_apart=None, lora="diffusers", textual_inversion=False,
    # Qwen-Image-Edit's and -2509's model cards: 50 steps at true CFG 4
    sampling=Sampling(50, 4.0, "Qwen-Image-Edit's model card"),
)

QWEN_IMAGE_EDIT = Family(
    key="qwen-image-edit", group="qwen-image-edit", name="Qwen-Image-Edit", label="Qwen-Image-Edit",
    tasks={Task.TXT2IMG.value: "QwenImageEditPipeline", Task.EDIT.value: "QwenImageEditPipeline",
           Task.INPAINT.value: "QwenImageEditInpaintPipeline"},
    rendered_sizes={Task.INPAINT.value: edit_inpaint_size},
    joined_init_tasks=(Task.INPAINT.value,),
    # its shipped configs (configs/qwen-image-edit) are Qwen-Image's with this pipeline's model_index.json
    builtin="qwen-image-edit", hub_id="Qwen/Qwen-Image-Edit", aliases=("qwen-image-edit", "qwen/qwen-image-edit"),
    # its call refuses more than one prompt too (the processor wants an image per prompt's image token)
    edit=Edit(argument="image", max_images=1, resize="area", pixels=1024 * 1024, needs_image=True,
              text_reads_images=True, batches=False),
    **_COMMON,
)

QWEN_IMAGE_EDIT_PLUS = Family(
    key="qwen-image-edit-plus", group="qwen-image-edit", name="Qwen-Image-Edit-Plus", label="Qwen-Image-Edit-2509",
    tasks={Task.TXT2IMG.value: "QwenImageEditPlusPipeline", Task.EDIT.value: "QwenImageEditPlusPipeline"},
    builtin="qwen-image-edit-plus", hub_id="Qwen/Qwen-Image-Edit-2509",
    aliases=("qwen-image-edit-plus", "qwen-image-edit-2509", "qwen/qwen-image-edit-2509"),
    edit=Edit(argument="image", max_images=3, resize="area", pixels=1024 * 1024, needs_image=True,
              text_reads_images=True, batches=False),  # its call refuses more than one prompt
    **_COMMON,
)

QWEN_EDIT_FAMILIES = (QWEN_IMAGE_EDIT, QWEN_IMAGE_EDIT_PLUS)
