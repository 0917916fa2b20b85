"""The video families' records (issue 33): Wan 2.1, Wan 2.2 (TI2V 5B and the two-expert A14B) and LTX-Video, through
diffusers' WanPipeline / WanImageToVideoPipeline and LTXPipeline / LTXImageToVideoPipeline.

What the records say and why:
- One pipeline class, several variants: Wan 2.1 T2V 1.3B/14B, Wan 2.1 I2V 14B, Wan 2.2 TI2V 5B and Wan 2.2 A14B all run
  WanPipeline (WanImageToVideoPipeline for image-to-video). What a folder is comes from its model_index.json, as the
  pipeline itself reads it: `expand_timesteps` (a timestep per token: TI2V 5B, whose VAE compresses 16x), and
  `boundary_ratio` with a `transformer_2` (A14B's two experts, high-noise then low-noise). `video_for` and
  `sampling_for` read those facts; each built-in record (one per published folder shipped in lowvram_gen/configs) falls
  back to its own when the facts say nothing. A loaded Wan pipeline is the first record's (they differ in no execution
  fact that the folder does not say).
- Frames: Wan's VAE compresses time 4x after the first frame (81 frames -> 21 latent frames), LTX's 8x (161 -> 21):
  a clip has 4k+1 (8k+1) frames. Sizes: multiples of the VAE's spatial compression times the transformer's patch (Wan
  2.1 8 x 2 = 16, Wan 2.2 TI2V 16 x 2 = 32, LTX 32 x 1 = 32).
- Guidance: Wan runs CFG as two forwards (cond, then uncond), not a doubled batch; A14B's low-noise expert has its own
  scale (`guidance_scale_2`, `--cfg-2`). LTX doubles the batch.
- Text: Wan's umT5-XXL reads 512 tokens (its call's max_sequence_length), LTX's T5-XXL 128; both by cross-attention
  (no joint tokens).
- Defaults are the model cards' (and diffusers' documentation examples): Wan 2.1 50 steps at CFG 5, 81 frames of
  832x480 at 16 fps; Wan 2.2 A14B 40 steps at CFG 4 / 3 (T2V) and 3.5 / 3.5 (I2V), 81 frames of 1280x720 at 16 fps;
  TI2V 5B 50 steps at CFG 5, 121 frames of 1280x704 at 24 fps; LTX-Video 50 steps at CFG 3, 161 frames of 704x480 at
  24 fps (its call's `frame_rate`, which conditions the model, is the clip's fps).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Mapping

from lowvram_gen.families.record import Call, Family, FolderFacts, Guidance, Sampling, Task, Video

WAN21 = Video(temporal=4, spatial=8, patch=2, frames=81, fps=16.0, size=(832, 480), label="Wan 2.1 T2V")
WAN21_I2V = replace(WAN21, image_encoder=True, label="Wan 2.1 I2V")
WAN22_TI2V = Video(temporal=4, spatial=16, patch=2, frames=121, fps=24.0, size=(1280, 704), img2vid_on_t2v=True,
                   label="Wan 2.2 TI2V 5B")
WAN22_A14B = Video(temporal=4, spatial=8, patch=2, frames=81, fps=16.0, size=(1280, 720), experts=True, cfg_2=3.0,
                   label="Wan 2.2 T2V A14B")
WAN22_A14B_I2V = replace(WAN22_A14B, cfg_2=3.5, label="Wan 2.2 I2V A14B")
LTX = Video(temporal=8, spatial=32, patch=1, frames=161, fps=24.0, size=(704, 480), fps_argument="frame_rate",
            img2vid_on_t2v=True, label="LTX-Video")

WAN21_SAMPLING = Sampling(50, 5.0, "Wan 2.1's model card")
WAN22_A14B_SAMPLING = Sampling(40, 4.0, "Wan 2.2 A14B's model card")
WAN22_A14B_I2V_SAMPLING = Sampling(40, 3.5, "Wan 2.2 I2V A14B's model card")
WAN22_TI2V_SAMPLING = Sampling(50, 5.0, "Wan 2.2 TI2V 5B's model card")
LTX_SAMPLING = Sampling(50, 3.0, "LTX-Video's model card")


def wan_variant(facts: FolderFacts) -> str:
    """'ti2v' | 'a14b' | 'a14b-i2v' | 'i2v' | 't2v' from a folder's model_index.json (and its transformer's config); ''
    where the facts say nothing (no folder read)."""
    index: Mapping = facts.model_index or {}
    if not index and not facts.transformer:
        return ""
    image = index.get("_class_name") == "WanImageToVideoPipeline" or int(facts.transformer.get("in_channels") or 0) == 36
    if index.get("expand_timesteps"):
        return "ti2v"
    if index.get("boundary_ratio") is not None and _named(index.get("transformer_2")):
        return "a14b-i2v" if image else "a14b"
    return "i2v" if image and _named(index.get("image_encoder")) else "t2v"


def _named(entry) -> bool:
    """A model_index.json component entry that names a class (["diffusers", "X"]), not [null, null] / absent."""
    return isinstance(entry, (list, tuple)) and len(entry) == 2 and entry[1] is not None


_WAN_VIDEOS = {"t2v": WAN21, "i2v": WAN21_I2V, "ti2v": WAN22_TI2V, "a14b": WAN22_A14B, "a14b-i2v": WAN22_A14B_I2V}
_WAN_SAMPLINGS = {"t2v": WAN21_SAMPLING, "i2v": WAN21_SAMPLING, "ti2v": WAN22_TI2V_SAMPLING,
                  "a14b": WAN22_A14B_SAMPLING, "a14b-i2v": WAN22_A14B_I2V_SAMPLING}


def _wan(own_video: Video, own_sampling: Sampling):
    """(video_for, sampling_for) of a Wan record: the folder's variant, else the record's own."""
    def video_for(facts: FolderFacts) -> Video:
        return _WAN_VIDEOS.get(wan_variant(facts), own_video)

    def sampling_for(facts: FolderFacts) -> Sampling:
        return _WAN_SAMPLINGS.get(wan_variant(facts), own_sampling)

    return dict(video=own_video, video_for=video_for, sampling=own_sampling, sampling_for=sampling_for)


_WAN_TASKS = {Task.TXT2VID.value: "WanPipeline", Task.IMG2VID.value: "WanImageToVideoPipeline"}
_WAN_COMMON = dict(
    group="wan", tasks=_WAN_TASKS,
    other_pipelines=("WanVideoToVideoPipeline", "WanVACEPipeline", "WanAnimatePipeline"),
    denoiser="transformer", denoiser_classes=("WanTransformer3DModel",),
    # umT5-XXL's 512 tokens by cross-attention; CFG as two forwards (cond, then uncond), never a doubled batch
    t5_tokens=512, joint_tokens=0, cfg_batch=False, file_dtype="bfloat16",
    call=Call(Guidance.CFG, negative_prompt=True, takes_negative_prompt=True),
    latent_format="wan21", lora="diffusers", textual_inversion=False,
)

WAN_T2V_13B = Family(key="wan21-t2v-1.3b", name="Wan", label="Wan2.1-T2V-1.3B", builtin="wan21-t2v-1.3b",
                     hub_id="Wan-AI/Wan2.1-T2V-1.3B-Diffusers", native_side=480,
                     aliases=("wan", "wan2.1", "wan21", "wan-1.3b", "wan2.1-1.3b", "wan2.1-t2v-1.3b",
                              "wan-ai/wan2.1-t2v-1.3b-diffusers"),
                     **_WAN_COMMON, **_wan(WAN21, WAN21_SAMPLING))
WAN_T2V_14B = Family(key="wan21-t2v-14b", name="Wan", label="Wan2.1-T2V-14B", builtin="wan21-t2v-14b",
                     hub_id="Wan-AI/Wan2.1-T2V-14B-Diffusers", native_side=480,
                     aliases=("wan-14b", "wan2.1-14b", "wan2.1-t2v-14b", "wan-ai/wan2.1-t2v-14b-diffusers"),
                     **_WAN_COMMON, **_wan(WAN21, WAN21_SAMPLING))
WAN_I2V_14B = Family(key="wan21-i2v-14b", name="Wan", label="Wan2.1-I2V-14B-480P", builtin="wan21-i2v-14b",
                     hub_id="Wan-AI/Wan2.1-I2V-14B-480P-Diffusers", native_side=480,
                     aliases=("wan-i2v", "wan2.1-i2v", "wan2.1-i2v-14b", "wan-ai/wan2.1-i2v-14b-480p-diffusers"),
                     **_WAN_COMMON, **_wan(WAN21_I2V, WAN21_SAMPLING))
WAN22_TI2V_5B = Family(key="wan22-ti2v-5b", name="Wan", label="Wan2.2-TI2V-5B", builtin="wan22-ti2v-5b",
                       hub_id="Wan-AI/Wan2.2-TI2V-5B-Diffusers", native_side=704,
                       aliases=("wan2.2", "wan22", "wan2.2-5b", "wan2.2-ti2v-5b", "wan-ai/wan2.2-ti2v-5b-diffusers"),
                       **{**_WAN_COMMON, "latent_format": "wan22"}, **_wan(WAN22_TI2V, WAN22_TI2V_SAMPLING))
WAN22_T2V_A14B = Family(key="wan22-t2v-a14b", name="Wan", label="Wan2.2-T2V-A14B", builtin="wan22-t2v-a14b",
                        hub_id="Wan-AI/Wan2.2-T2V-A14B-Diffusers", native_side=720,
                        aliases=("wan2.2-a14b", "wan2.2-t2v-a14b", "wan-ai/wan2.2-t2v-a14b-diffusers"),
                        **_WAN_COMMON, **_wan(WAN22_A14B, WAN22_A14B_SAMPLING))
WAN22_I2V_A14B = Family(key="wan22-i2v-a14b", name="Wan", label="Wan2.2-I2V-A14B", builtin="wan22-i2v-a14b",
                        hub_id="Wan-AI/Wan2.2-I2V-A14B-Diffusers", native_side=720,
                        aliases=("wan2.2-i2v", "wan2.2-i2v-a14b", "wan-ai/wan2.2-i2v-a14b-diffusers"),
                        **_WAN_COMMON, **_wan(WAN22_A14B_I2V, WAN22_A14B_I2V_SAMPLING))

LTX_VIDEO = Family(
    key="ltx-video", group="ltx-video", name="LTX-Video", label="LTX-Video", builtin="ltx-video",
    hub_id="Lightricks/LTX-Video", native_side=480,
    aliases=("ltx", "ltxv", "ltx-video", "lightricks/ltx-video"),
    tasks={Task.TXT2VID.value: "LTXPipeline", Task.IMG2VID.value: "LTXImageToVideoPipeline"},
    other_pipelines=("LTXConditionPipeline", "LTXLatentUpsamplePipeline", "LTXI2VLongMultiPromptPipeline"),
    denoiser="transformer", denoiser_classes=("LTXVideoTransformer3DModel",),
    # T5-XXL's 128 tokens by cross-attention; CFG doubles the batch
    t5_tokens=128, joint_tokens=0, cfg_batch=True, file_dtype="bfloat16",
    call=Call(Guidance.CFG, negative_prompt=True, takes_negative_prompt=True),
    latent_format="ltxv", lora="diffusers", textual_inversion=False,
    video=LTX, sampling=LTX_SAMPLING,
)

# lookup order: the 1.3B record first, so a loaded Wan pipeline is its (see the module doc)
VIDEO_FAMILIES = (WAN_T2V_13B, WAN_T2V_14B, WAN_I2V_14B, WAN22_TI2V_5B, WAN22_T2V_A14B, WAN22_I2V_A14B, LTX_VIDEO)
