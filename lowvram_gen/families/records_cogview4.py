"""CogView4's record (families/record.py says what a record holds): Zhipu AI's CogView4-6B, diffusers'
CogView4Pipeline. A joint-attention DiT (28 blocks, 4096 wide) over a 16-channel VAE, GLM-4 9B's hidden states
(its second-to-last layer) as the text tokens.

What the record says and why:
- CFG is classic `guidance_scale` with the negative prompt, run as two forwards per step (the conditional and the
  unconditional apart: no doubled batch); CFG acts above 1, its model card runs 3.5 at 50 steps.
- Text: the prompt is padded to the longest in the batch (then to a multiple of 16) and cut at the call's
  `max_sequence_length` 1024; those tokens join the image tokens in every block, so 1024 is the bound the planner
  takes (a short prompt carries far fewer).
- Text encoders reloaded per job (`+te-reload`): its encode_prompt takes the same arguments as Z-Image's and gives
  the prompt's and the negative's embeddings ('encode_prompt_lists'; tensors here, not lists).
- Tasks: diffusers 0.42 has no CogView4 img2img or inpaint pipeline (CogView4ControlPipeline is recognised, not run):
  refused in one sentence.
- Configs: lowvram_gen/configs/cogview4/ holds THUDM/CogView4-6B's (see its README.md).
"""

from __future__ import annotations

from lowvram_gen.families.record import Call, Family, Guidance, Sampling, Task

COGVIEW4 = Family(
    key="cogview4", group="cogview4", name="CogView4", label="CogView4-6B",
    tasks={Task.TXT2IMG.value: "CogView4Pipeline"}, other_pipelines=("CogView4ControlPipeline",),
    denoiser="transformer", denoiser_classes=("CogView4Transformer2DModel",),
    builtin="cogview4", hub_id="THUDM/CogView4-6B",
    aliases=("cogview4", "cogview4-6b", "cogview-4", "thudm/cogview4-6b", "zai-org/cogview4-6b"),
    native_side=1024,
    t5_tokens=1024, joint_tokens=1024, cfg_batch=False, file_dtype="bfloat16",
    call=Call(Guidance.CFG), text_encode_apart="encode_prompt_lists", lora="diffusers", textual_inversion=False,
    sampling=Sampling(50, 3.5, "CogView4-6B's model card"),
)
