"""Test utility: the sampler name that runs the scheduler a model folder ships as a plain diffusers pipeline loaded
from that folder runs it.

Since issue 29 the request's sampler "default" is A1111's default (DPM++ 2M, Karras) for SD 1.x/2.x and SDXL, no
longer the folder's scheduler; a test that compares a job with plain diffusers from the folder asks for the folder's
scheduler by this name. Since issue 31 an A1111 name of a sampler that steps through noise levels (Euler) runs
A1111's levels, so such a folder's scheduler is asked for by its diffusers class name (EulerDiscreteScheduler for
tiny-sdxl's); and since DDIM and PLMS step through A1111's own timesteps (one model call fewer, no warm-up), so is
a DDIM or PNDM folder's (PNDMScheduler for the tiny model's).
"""

from __future__ import annotations

import json
from pathlib import Path


def own_sampler(model) -> str:
    """The sampler name of the scheduler of `model` as diffusers runs it: an embedded model's name ("tiny") or a
    diffusers folder."""
    import diffusers

    from lowvram_gen.models.tiny import TINY_MODELS, ensure_tiny
    from lowvram_gen.samplers import A1111_TIMESTEPS, SAMPLERS, SIGMA_CLASSES, a1111_name

    folder = ensure_tiny(str(model)) if str(model) in TINY_MODELS else Path(model)
    config = json.loads((folder / "scheduler" / "scheduler_config.json").read_text(encoding="utf-8"))
    own_timesteps = {SAMPLERS[name][0] for name in A1111_TIMESTEPS}  # the classes A1111's DDIM and PLMS run
    if config["_class_name"] in SIGMA_CLASSES or config["_class_name"] in own_timesteps:
        return config["_class_name"]
    name = a1111_name(getattr(diffusers, config["_class_name"]).from_config(config))
    assert not name.endswith("Scheduler"), f"{folder}'s {name} has no A1111 name: compare it another way"
    return name
