"""Bria 3.2's record (families/record.py says what a record holds): Bria AI's BriaPipeline, a FLUX.1-like transformer
(2x2-packed 16-channel latents, double- and single-stream blocks) over a T5-XXL prompt, trained on licensed data.

What the record says and why:
- CFG is classic `guidance_scale` with the negative prompt as a doubled batch; with no negative prompt the pipeline
  takes zeros as the unconditional embeddings (its own rule). Its model card runs 5 at 30 steps.
- Text: T5's prompt padded to the call's `max_sequence_length` 128, beside the image tokens (joint attention).
- Text encoders reloaded per job (`+te-reload`): its encode_prompt gives the prompt's and the negative's embeddings
  (and text ids the call makes again): 'encode_prompt_pair'.
- Loading: the auto-pipelines of diffusers 0.42 do not map BriaPipeline; models/loading.py loads the folder with its
  own class. No LoRA loader, no img2img or inpaint pipeline in diffusers 0.42: refused in one sentence.
- Configs: lowvram_gen/configs/bria/ holds briaai/BRIA-3.2's (see its README.md), so `plan --model bria` plans the
  real 4B transformer (2304 wide, 8 double- and 28 single-stream blocks) and T5-XXL offline.
"""

from __future__ import annotations

from lowvram_gen.families.record import Call, Family, Guidance, Sampling, Task

BRIA = Family(
    key="bria", group="bria", name="Bria",
    tasks={Task.TXT2IMG.value: "BriaPipeline"},
    denoiser="transformer", denoiser_classes=("BriaTransformer2DModel",),
    builtin="bria", hub_id="briaai/BRIA-3.2", label="Bria 3.2",
    aliases=("bria", "bria-3.2", "bria3.2", "bria-3", "briaai/bria-3.2"),
    native_side=1024, t5_tokens=128, joint_tokens=128, cfg_batch=True, file_dtype="bfloat16",
    call=Call(Guidance.CFG), text_encode_apart="encode_prompt_pair", lora=None, textual_inversion=False,
    sampling=Sampling(30, 5.0, "BRIA 3.2's model card"),
)
