"""A1111 1.9+ schedule types (`Schedule type: Karras`) as diffusers scheduler config.

A1111 1.9 split the old combined sampler names ("DPM++ 2M Karras") into a sampler and a schedule type
(the noise levels the sampler steps through). diffusers has no schedule object: a scheduler class takes
the schedule as config keys, and not every class has every key. Mapped here (diffusers' scheduler docs,
"Noise schedules and schedule types"): Karras, Exponential and Beta are `use_karras_sigmas`,
`use_exponential_sigmas`, `use_beta_sigmas`; SGM Uniform and Simple are `timestep_spacing="trailing"`;
Normal (timesteps evenly spaced from the first to the last, k-diffusion's and ComfyUI's) is
`timestep_spacing="linspace"`. Automatic and Uniform keep the model's own timestep spacing.
Polyexponential, KL Optimal, Align Your Steps and DDIM have no diffusers config: they run the sampler's
plain schedule, with a warning, as does a type the chosen sampler's class lacks (Karras on Euler a).

Standard library only (the request validates with it before torch loads); `overrides` reads the
scheduler class it is given.
"""

from __future__ import annotations

import inspect

from lowvram_gen.errors import InvalidRequest

AUTOMATIC = "automatic"
# key (what --schedule-type takes) -> (A1111's label, the diffusers config, or None where diffusers has none)
SCHEDULE_TYPES: dict[str, tuple[str, dict | None]] = {
    "automatic": ("Automatic", {}),
    "uniform": ("Uniform", {}),
    "karras": ("Karras", {"use_karras_sigmas": True}),
    "exponential": ("Exponential", {"use_exponential_sigmas": True}),
    "polyexponential": ("Polyexponential", None),
    "sgm-uniform": ("SGM Uniform", {"timestep_spacing": "trailing"}),
    "kl-optimal": ("KL Optimal", None),
    "align-your-steps": ("Align Your Steps", None),
    "simple": ("Simple", {"timestep_spacing": "trailing"}),
    "normal": ("Normal", {"timestep_spacing": "linspace"}),
    "ddim": ("DDIM", None),
    "beta": ("Beta", {"use_beta_sigmas": True}),
}
SIGMA_FLAGS = ("use_karras_sigmas", "use_exponential_sigmas", "use_beta_sigmas")
# config keys a class takes but does not use when it sets its timesteps (LCM steps its own origin steps)
_IGNORED_KEYS = {"LCMScheduler": {"timestep_spacing"}}


def _key(text: str) -> str:
    return text.strip().lower().replace(" ", "").replace("_", "").replace("-", "")


_BY_KEY = {**{_key(k): k for k in SCHEDULE_TYPES}, **{_key(label): k for k, (label, _) in SCHEDULE_TYPES.items()}}
SUPPORTED = [k for k, (_, config) in SCHEDULE_TYPES.items() if config is not None and k != AUTOMATIC]


def label(key: str) -> str:
    return SCHEDULE_TYPES[key][0]


def find(text: str) -> str | None:
    """The schedule type `text` names (our key, A1111's label or its name: `sgm_uniform`, `SGM Uniform`,
    `SGMUniform`; case ignored), or None."""
    return _BY_KEY.get(_key(text)) if isinstance(text, str) else None


def check_schedule_type(value: object, field: str = "schedule type") -> str:
    """Our key of a schedule type ('' and None: automatic), or a clear error listing them."""
    if value is None or (isinstance(value, str) and not value.strip()):
        return AUTOMATIC
    found = find(value) if isinstance(value, str) else None
    if found is None:
        raise InvalidRequest(field, value, "use one of: " + ", ".join(SCHEDULE_TYPES))
    return found


def _takes(cls) -> set[str]:
    # the settings a scheduler class takes (schedulers are shared by every family): no family decision
    return set(inspect.signature(cls.__init__).parameters) - _IGNORED_KEYS.get(cls.__name__, set())


def overrides(cls, key: str, named: bool = True) -> tuple[dict, bool]:
    """The config that gives scheduler class `cls` schedule type `key`, and whether it can have it.

    `named`: the sampler was picked by name, so a Karras/Exponential/Beta flag in the model folder's own config
    is cleared (the name and the schedule type say what runs); with the model's own scheduler ('default') and
    Automatic, nothing changes. Where the type cannot be had, the config of the sampler's own schedule comes back
    (and False)."""
    takes = _takes(cls)
    clear = {flag: False for flag in SIGMA_FLAGS if flag in takes}
    unchanged = clear if named else {}
    config = SCHEDULE_TYPES[key][1]
    if key == AUTOMATIC:
        return unchanged, True
    if config is None or not set(config) <= takes:
        return unchanged, False
    return {**clear, **config}, True


def applied_label(scheduler) -> str | None:
    """The A1111 label of the schedule a built scheduler runs, where its config says one (Karras, Exponential,
    Beta, SGM Uniform); None for its plain schedule."""
    config, takes = scheduler.config, _takes(type(scheduler))
    for flag, key in zip(SIGMA_FLAGS, ("karras", "exponential", "beta")):
        if flag in takes and config.get(flag):
            return label(key)
    if "timestep_spacing" in takes and config.get("timestep_spacing") == "trailing":
        return label("sgm-uniform")
    return None
