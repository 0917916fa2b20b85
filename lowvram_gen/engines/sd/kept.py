"""Pipelines of other tasks (img2img, inpaint) made over the loaded pipeline's components and kept on it."""

from __future__ import annotations


def kept_pipe(pipe, auto, attr: str):
    """diffusers' pipeline of another task (`auto`: an AutoPipelineFor... class) over the same components (no copy,
    no reload), made once and kept on `pipe` as `attr` (the runner drops it when the components change)."""
    made = getattr(pipe, attr, None)
    if made is None:
        made = auto.from_pipe(pipe)
        made.set_progress_bar_config(disable=True)
        setattr(pipe, attr, made)
    made.scheduler = pipe.scheduler  # follow the sampler chosen for this job
    return made
