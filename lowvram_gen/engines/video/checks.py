"""What a video request asks of its model, checked before anything loads: from the family record's Video facts of
the folder (families/records_video.py), never from loaded weights. One sentence each, naming the value and what is
allowed (the nearest valid frame counts and sizes).

Nothing here imports torch or diffusers.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping

from lowvram_gen.errors import InvalidRequest
from lowvram_gen.families import sampling
from lowvram_gen.families.record import Family, FolderFacts, Task, Video
from lowvram_gen.families.spec import read_config, record_of_index
from lowvram_gen.models.resolve import ModelSource
from lowvram_gen.networks.tags import extract_lora_tags
from lowvram_gen.request import GenerationRequest
from lowvram_gen.samplers import DEFAULT
from lowvram_gen.schedules import AUTOMATIC

VIDEO_FAMILIES = "Wan 2.1/2.2 and LTX-Video"
# the samplers a video job takes: the folder's own (flow matching: Wan's UniPC in flow mode, LTX's FlowMatchEuler), or
# another flow-matching one built on its config (pipelines.set_video_sampler); A1111's noise-prediction samplers are not
FLOW_SAMPLERS = (DEFAULT, "Euler", "UniPC", "DPM++ 2M")


@dataclass(frozen=True)
class VideoModel:
    """What the folder of a video job is, read from its configs: its family record, the variant's Video facts, the
    pipeline class its model_index names, and what it takes."""

    record: Family
    video: Video
    facts: FolderFacts
    pipeline: str  # model_index.json's _class_name
    scheduler: Mapping = field(default_factory=dict)  # the folder's scheduler config ({} where it has none)

    @property
    def label(self) -> str:
        return self.video.label or self.record.label or self.record.name

    @property
    def needs_image(self) -> bool:
        """Its folder is an image-to-video one (Wan 2.1 I2V, Wan 2.2 I2V A14B): a clip starts from an init image."""
        img2vid = self.record.pipeline_for(Task.IMG2VID)
        return self.pipeline == img2vid and img2vid != self.record.pipeline_for(Task.TXT2VID)

    @property
    def takes_image(self) -> bool:
        return self.needs_image or self.video.img2vid_on_t2v


def facts_of(source: ModelSource, spec: str) -> tuple[Family | None, FolderFacts]:
    """(the record the folder's model_index names or None, the folder's facts), no weights read."""
    single = source.kind == "single_file"
    facts = sampling.folder_facts(spec, Path(source.config) if single and source.config else None if single
                                  else source.path, name_path=None if source.kind == "hub" else source.path)
    return record_of_index(facts.model_index), facts


def video_model(source: ModelSource, spec: str) -> VideoModel | None:
    """The VideoModel of a resolved source; None where it is not a video family's folder."""
    record, facts = facts_of(source, spec)
    if record is None or not record.is_video:
        return None
    folder = Path(source.path) if source.kind != "single_file" else None
    scheduler = read_config(folder / "scheduler" / "scheduler_config.json") if folder is not None else {}
    return VideoModel(record, record.video_facts(facts), facts, str(facts.model_index.get("_class_name") or ""),
                      scheduler)


def refuse_image_model(spec: str, record: Family | None) -> InvalidRequest:
    """A video request on an image model."""
    what = f"{record.name} makes images" if record is not None and not record.is_generic else "it is no video model"
    return InvalidRequest("model", spec, f"{what}; `video` takes {VIDEO_FAMILIES} (a diffusers folder of one)")


def refuse_video_model(spec: str, model: VideoModel) -> InvalidRequest:
    """An image request (no frames) on a video model."""
    return InvalidRequest("model", spec, f"{model.label} is a video model: make a clip with `lowvram-gen video` "
                                         "(a request with frames), not an image")


def nearest_frames(frames: int, temporal: int) -> list[int]:
    """The valid frame counts (temporal * k + 1) either side of `frames`."""
    below = (frames - 1) // temporal * temporal + 1
    return [n for n in (below, below + temporal) if n >= 1]


def nearest_sides(side: int, multiple: int) -> list[int]:
    below = side // multiple * multiple
    return [n for n in (below, below + multiple) if n >= multiple]


def check(request: GenerationRequest, model: VideoModel) -> None:
    """Refuse what `model` cannot make of `request` (its video defaults already filled in), one sentence each."""
    video = model.video
    frames = int(request.frames)
    if frames < 1 or (frames - 1) % video.temporal:
        near = " or ".join(str(n) for n in nearest_frames(max(frames, 1), video.temporal))
        raise InvalidRequest("frames", request.frames, f"{model.label} makes {video.temporal}k+1 frames (its VAE "
                                                       f"compresses {video.temporal} frames into one after the first): "
                                                       f"the nearest are {near}")
    multiple = video.size_multiple
    for name, side in (("width", request.width), ("height", request.height)):
        if side % multiple:
            near = " or ".join(str(n) for n in nearest_sides(side, multiple))
            raise InvalidRequest(name, side, f"{model.label} takes sides in multiples of {multiple} (its VAE's "
                                             f"{video.spatial}x times its patch of {video.patch}): the nearest are "
                                             f"{near}")
    if request.fps is not None and request.fps <= 0:
        raise InvalidRequest("fps", request.fps, "frames per second must be above 0")
    if request.init_image and not model.takes_image:
        raise InvalidRequest("init image", request.init_image,
                             f"{model.label} is a text-to-video model with no image-to-video pipeline for its folder "
                             f"(no image encoder); give no init image, or use an image-to-video model (Wan 2.1 I2V, "
                             "Wan 2.2 TI2V 5B or I2V A14B, LTX-Video)")
    if model.needs_image and not request.init_image:
        raise InvalidRequest("init image", None, f"{model.label} is an image-to-video model: give an init image "
                                                 "(the clip's first frame)")
    if model.scheduler.get("shift_terminal") and request.steps < 2 and request.sampler in (DEFAULT, "Euler"):
        # FlowMatchEuler's stretch of the schedule to its terminal shift divides by zero with one step
        raise InvalidRequest("steps", request.steps, f"{model.label}'s scheduler stretches its schedule to a terminal "
                                                     "shift, which takes 2 steps or more")
    if model.scheduler.get("_class_name") == "FlowMatchEulerDiscreteScheduler" and request.sampler in ("UniPC",
                                                                                                      "DPM++ 2M"):
        raise InvalidRequest("sampler", request.sampler, f"{model.label}'s pipeline passes its own sigma schedule, "
                                                         "which only its FlowMatchEuler scheduler takes: use default "
                                                         "or Euler")
    tags = extract_lora_tags(request.prompt or "")[1]
    if request.loras or tags:
        name = request.loras[0] if request.loras else tags[0].name
        raise InvalidRequest("lora", name, "a video job does not apply LoRAs yet: leave out --lora and <lora:...> tags")
    if request.schedule_type != AUTOMATIC:
        raise InvalidRequest("schedule type", request.schedule_type, f"{model.label} runs its scheduler's own "
                                                                    "flow-matching schedule: use automatic")
    if request.sampler not in FLOW_SAMPLERS:
        raise InvalidRequest("sampler", request.sampler,
                             f"{model.label} is a flow-matching model; a video job takes "
                             f"{', '.join(FLOW_SAMPLERS[:-1])} or {FLOW_SAMPLERS[-1]}")


def plan_refusal(plan) -> Exception:
    """The error of a clip the plan refuses (planning/video_fit.py), before anything loads: the system RAM's
    (errors.NotEnoughRam: no candidate fits the RAM, or the preset the user named does not), else the card's
    (errors.ClipTooBigForCard, an OutOfMemoryEverywhere: what an image that fits no rung of the ladder on the card ends in), its message
    saying it is the card's memory that is short."""
    from lowvram_gen.errors import ClipTooBigForCard, NotEnoughRam

    chosen = next((e for e in plan.estimates if e.name == plan.preset.name), None)
    in_ram = any(e.fits_host for e in plan.estimates) and (chosen is None or chosen.fits_host)
    if not in_ram:
        return NotEnoughRam(plan.refusal)
    return ClipTooBigForCard(f"not enough VRAM on the card for this clip: {plan.refusal}")
