"""Pipelines of other tasks (img2img, inpaint) made over the loaded pipeline's components and kept on it."""

from __future__ import annotations


def kept_pipe(pipe, auto, attr: str, task_class: str | None = None):
    """diffusers' pipeline of another task (`auto`: an AutoPipelineFor... class) over the same components (no copy,
    no reload), made once and kept on `pipe` as `attr` (the runner drops it when the components change). `task_class`:
    the family record's pipeline class for the task, made from the components where the auto-pipeline's mapping does
    not know the family (Chroma's img2img in diffusers 0.42)."""
    made = getattr(pipe, attr, None)
    if made is None:
        made = _from_pipe(pipe, auto, task_class)
        made.set_progress_bar_config(disable=True)
        setattr(pipe, attr, made)
    made.scheduler = pipe.scheduler  # follow the sampler chosen for this job
    return made


def _from_pipe(pipe, auto, task_class: str | None):
    try:
        return auto.from_pipe(pipe)
    except ValueError:  # "AutoPipeline can't find a pipeline linked to ..."
        if not task_class or type(pipe).__name__ == task_class:
            raise
    import diffusers

    cls = getattr(diffusers, task_class)
    # the components the class takes, shared as they are (what the auto-pipelines' from_pipe does: no cast, no copy)
    expected, _ = cls._get_signature_keys(cls)
    return cls(**{k: v for k, v in pipe.components.items() if k in expected})
