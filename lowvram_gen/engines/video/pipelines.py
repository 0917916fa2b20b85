"""The pipeline a video job calls, and its sampler.

- Text-to-video: the loaded pipeline (WanPipeline, LTXPipeline).
- Image-to-video: the loaded one where its folder is an image-to-video one (WanImageToVideoPipeline of Wan 2.1 I2V /
  Wan 2.2 I2V A14B); else the family's IMG2VID pipeline built over the loaded components, as engines/sd builds its
  img2img pipeline: Wan 2.2 TI2V 5B's WanImageToVideoPipeline with the folder's expand_timesteps (no image encoder),
  LTX's LTXImageToVideoPipeline. Nothing is copied: the same modules, hooks and placement.
- The sampler: 'default' keeps the folder's scheduler (Wan's UniPC in flow mode, LTX's FlowMatchEuler); Euler, UniPC
  and DPM++ 2M are built in flow mode on its config (the shift kept); any other is refused before loading
  (checks.py).
"""

from __future__ import annotations

import inspect

from lowvram_gen import families
from lowvram_gen.errors import InvalidRequest
from lowvram_gen.families.record import Task
from lowvram_gen.samplers import DEFAULT

_BASE = "_lowvram_video_scheduler"  # the folder's own scheduler, kept on the pipeline object for 'default'


def call_pipe(pipe, image: bool):
    """The pipeline object a job calls: `pipe` itself, or for an init image the family's IMG2VID class over its
    components (its config's own values, expand_timesteps and boundary_ratio, passed on)."""
    record = families.of_pipe(pipe)
    name = record.pipeline_for(Task.IMG2VID if image else Task.TXT2VID)
    if not image or name is None or type(pipe).__name__ == name:
        return pipe
    import diffusers

    cls = getattr(diffusers, name)
    takes = inspect.signature(cls.__init__).parameters
    parts = {k: v for k, v in pipe.components.items() if k in takes}
    parts.update({k: v for k, v in pipe.config.items() if k in takes and k not in parts and not k.startswith("_")})
    parts.update({k: None for k, p in takes.items()
                  if k not in parts and k != "self" and p.default is inspect.Parameter.empty})
    made = cls(**parts)
    made.set_progress_bar_config(disable=True)
    return made


def set_video_sampler(pipe, sampler: str) -> None:
    """Put `sampler`'s scheduler on `pipe` (checks.FLOW_SAMPLERS; 'default': the folder's own)."""
    base = pipe.__dict__.setdefault(_BASE, pipe.scheduler)
    name = type(base).__name__
    if sampler == DEFAULT or (sampler == "Euler" and name == "FlowMatchEulerDiscreteScheduler") \
            or (sampler == "UniPC" and name == "UniPCMultistepScheduler"):
        pipe.scheduler = base
        return
    import diffusers

    shift = base.config.get("flow_shift") or base.config.get("shift") or 1.0
    if name == "FlowMatchEulerDiscreteScheduler":  # LTX: its call passes its own sigmas, which only this one takes
        raise InvalidRequest("sampler", sampler, f"{type(pipe).__name__} passes its own sigma schedule, which only its "
                                                 "FlowMatchEuler scheduler takes: use default or Euler")
    if sampler == "Euler":
        pipe.scheduler = diffusers.FlowMatchEulerDiscreteScheduler(
            num_train_timesteps=base.config.get("num_train_timesteps", 1000), shift=shift)
        return
    cls = {"UniPC": diffusers.UniPCMultistepScheduler, "DPM++ 2M": diffusers.DPMSolverMultistepScheduler}[sampler]
    pipe.scheduler = cls.from_config(base.config, prediction_type="flow_prediction", use_flow_sigmas=True,
                                     flow_shift=shift)


def sampler_name(pipe, sampler: str) -> str:
    """The sampler as the clip's parameters say it: the name asked, or the folder's scheduler class for 'default'."""
    if sampler != DEFAULT:
        return sampler
    return type(pipe.__dict__.get(_BASE, pipe.scheduler)).__name__
