"""A1111 sampler names mapped to diffusers schedulers.

The table follows diffusers' own mapping in its scheduler docs ("A1111 / k-diffusion" column).
"default" keeps the scheduler saved in the model folder, so our output equals a plain diffusers
pipeline loaded from the same folder.
"""

from __future__ import annotations

from lowvram_gen.errors import InvalidRequest

# name -> (diffusers class name, extra config)
SAMPLERS: dict[str, tuple[str, dict]] = {
    "Euler a": ("EulerAncestralDiscreteScheduler", {}),
    "Euler": ("EulerDiscreteScheduler", {}),
    "LMS": ("LMSDiscreteScheduler", {}),
    "LMS Karras": ("LMSDiscreteScheduler", {"use_karras_sigmas": True}),
    "Heun": ("HeunDiscreteScheduler", {}),
    "DPM2": ("KDPM2DiscreteScheduler", {}),
    "DPM2 a": ("KDPM2AncestralDiscreteScheduler", {}),
    "DPM++ 2M": ("DPMSolverMultistepScheduler", {}),
    "DPM++ 2M Karras": ("DPMSolverMultistepScheduler", {"use_karras_sigmas": True}),
    "DPM++ 2M SDE": ("DPMSolverMultistepScheduler", {"algorithm_type": "sde-dpmsolver++"}),
    "DPM++ 2M SDE Karras": (
        "DPMSolverMultistepScheduler",
        {"algorithm_type": "sde-dpmsolver++", "use_karras_sigmas": True},
    ),
    "DPM++ 2S a": ("DPMSolverSinglestepScheduler", {}),
    "DDIM": ("DDIMScheduler", {}),
    "PLMS": ("PNDMScheduler", {}),
    "UniPC": ("UniPCMultistepScheduler", {}),
    "LCM": ("LCMScheduler", {}),
}
DEFAULT = "default"
_BY_KEY = {name.lower().replace(" ", ""): name for name in SAMPLERS}


def check_sampler(name: object) -> str:
    """The canonical sampler name (case and spaces ignored), or a clear error listing the names."""
    if isinstance(name, str):
        key = name.strip().lower().replace(" ", "").replace("_", "")
        if key in ("", DEFAULT):
            return DEFAULT
        if key in _BY_KEY:
            return _BY_KEY[key]
    raise InvalidRequest("sampler", name, "use 'default' or one of: " + ", ".join(SAMPLERS))


def make_scheduler(name: str, base_config: dict):
    """A scheduler for `name` built from the model's own scheduler config (betas, timestep spacing)."""
    import diffusers

    cls_name, extra = SAMPLERS[check_sampler(name)]
    cls = getattr(diffusers, cls_name)
    return cls.from_config(base_config, **extra)


# The config keys that tell two A1111 samplers of one diffusers class apart, with diffusers' defaults.
_DISTINGUISHING = {"use_karras_sigmas": False, "algorithm_type": "dpmsolver++"}


def a1111_name(scheduler) -> str:
    """The A1111 name of a scheduler, for the PNG text, where one matches (a model folder's own
    PNDMScheduler with skip_prk_steps is A1111's PLMS); otherwise its diffusers class name."""
    cls, config = type(scheduler).__name__, scheduler.config
    if cls == "PNDMScheduler" and not config.get("skip_prk_steps", False):
        return cls  # PNDM with its Runge-Kutta warm-up steps is not A1111's PLMS
    for name, (cls_name, extra) in SAMPLERS.items():
        if cls_name != cls:
            continue
        wanted = {**_DISTINGUISHING, **extra}
        if all(config.get(key, default) == wanted[key] for key, default in _DISTINGUISHING.items()
               if key in config or key in extra):
            return name
    return cls
