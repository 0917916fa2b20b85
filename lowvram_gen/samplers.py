"""A1111 sampler names mapped to diffusers schedulers, with A1111 1.9+'s schedule types (schedules.py).

The table follows diffusers' own mapping in its scheduler docs ("A1111 / k-diffusion" column).
"default" is the family's default sampler where its record names one (`Family.default_sampler`): for SD 1.x/2.x
and SDXL, A1111's default, DPM++ 2M with the Automatic schedule type, which for DPM++ 2M is Karras in A1111
1.9+ (`A1111_AUTOMATIC`; it writes `Schedule type: Karras`, and so do we). Elsewhere (flow-matching families:
SD3, FLUX, PixArt) "default" keeps the scheduler saved in the model folder, so the output equals a plain
diffusers pipeline loaded from the same folder; the PNG names that scheduler.

A sampler name with a schedule type's label after it, as A1111 wrote them before 1.9 ("DPM++ 2M Karras",
"DPM++ SDE Karras"), is that sampler and that schedule type.
A1111 samplers diffusers has no scheduler for are ours (lowvram_gen/ksamplers/, `OWN`: DPM++ 2S a, the 2M/3M SDE
samplers' Brownian-tree steps, Restart, DPM fast, DPM adaptive) or refused naming the nearest one offered.
"""

from __future__ import annotations

import inspect

from lowvram_gen import schedules
from lowvram_gen.errors import InvalidRequest
from lowvram_gen.schedules import AUTOMATIC

# name -> (diffusers class name, extra config)
SAMPLERS: dict[str, tuple[str, dict]] = {
    "Euler a": ("EulerAncestralDiscreteScheduler", {}),
    "Euler": ("EulerDiscreteScheduler", {}),
    "LMS": ("LMSDiscreteScheduler", {}),
    "Heun": ("HeunDiscreteScheduler", {}),
    "DPM2": ("KDPM2DiscreteScheduler", {}),
    "DPM2 a": ("KDPM2AncestralDiscreteScheduler", {}),
    "DPM++ 2M": ("DPMSolverMultistepScheduler", {}),
    "DPM++ SDE": ("DPMSolverSDEScheduler", {}),  # needs torchsde (its Brownian-tree noise)
    # ours (ksamplers/): k-diffusion's steps with one Brownian tree per image seed
    "DPM++ 2M SDE": ("DPMSolverMultistepSDEScheduler", {"algorithm_type": "sde-dpmsolver++"}),
    "DPM++ 2M SDE Heun": ("DPMSolverMultistepSDEScheduler", {"algorithm_type": "sde-dpmsolver++",
                                                            "solver_type": "heun"}),
    "DPM++ 3M SDE": ("DPMSolverMultistepSDEScheduler", {"algorithm_type": "sde-dpmsolver++", "solver_order": 3}),
    "DPM++ 2S a": ("DPMPP2SAncestralScheduler", {}),  # ours (ksamplers/): diffusers' 2S is not ancestral
    "DDIM": ("DDIMScheduler", {}),
    "PLMS": ("PNDMScheduler", {"skip_prk_steps": True}),  # A1111's PLMS has no Runge-Kutta warm-up steps
    "UniPC": ("UniPCMultistepScheduler", {"solver_type": "bh1", "solver_order": 3}),  # A1111's uni_pc_* defaults
    "LCM": ("LCMKDiffusionScheduler", {}),  # ours (ksamplers/): A1111's is k-diffusion's, not diffusers'
    "DDPM": ("DDPMScheduler", {}),
    "Restart": ("RestartScheduler", {}),
    "DPM fast": ("DPMSolverFastScheduler", {}),
    "DPM adaptive": ("DPMSolverAdaptiveScheduler", {}),
}
DEFAULT = "default"
# offered under a short name but diffusers' own, not an A1111 sampler (A1111 has no DDPM): the API and UI say so
NOT_A1111 = {"DDPM"}
# the classes of SAMPLERS that are lowvram_gen's own (diffusers has none): class name -> its module
OWN = {"DPMPP2SAncestralScheduler": "lowvram_gen.ksamplers.dpmpp_2s_ancestral",
       "DPMSolverMultistepSDEScheduler": "lowvram_gen.ksamplers.dpm_solver_sde",
       "RestartScheduler": "lowvram_gen.ksamplers.restart", "DPMSolverFastScheduler": "lowvram_gen.ksamplers.dpm_solver",
       "DPMSolverAdaptiveScheduler": "lowvram_gen.ksamplers.dpm_solver",
       "LCMKDiffusionScheduler": "lowvram_gen.ksamplers.lcm"}
# those of them that run a k-diffusion sampler written as a generator (ksamplers/stepper.py): sigma schedulers whose
# calls per level are their own (not in SIGMA_CLASSES)
KSAMPLERS = {"RestartScheduler", "DPMSolverFastScheduler", "DPMSolverAdaptiveScheduler",
             "LCMKDiffusionScheduler"}
# A1111 1.9+'s "Automatic" schedule type of a sampler where it is not Uniform (its sd_samplers_kdiffusion.py):
# a PNG that says `Schedule type: Automatic` means this one, and ours says Uniform where that is what ran
A1111_AUTOMATIC = {"DPM++ 2M": "karras", "DPM++ SDE": "karras", "DPM++ 2M SDE": "exponential",
                   "DPM++ 2M SDE Heun": "exponential", "DPM++ 3M SDE": "exponential", "DPM++ 2S a": "karras",
                   "DPM2": "karras", "DPM2 a": "karras", "Restart": "karras"}
# the Python package a sampler's diffusers class needs beyond diffusers' own dependencies (the Brownian-tree noise)
NEEDS = {name: "torchsde" for name in ("DPM++ SDE", "DPM++ 2M SDE", "DPM++ 2M SDE Heun", "DPM++ 3M SDE")}
# A1111/Forge samplers diffusers has no scheduler for: the nearest one offered, and why
REFUSED = {
    "Euler CFG++": ("Euler", "CFG++ changes the guidance, which diffusers' schedulers do not do"),
    "Euler a CFG++": ("Euler a", "CFG++ changes the guidance, which diffusers' schedulers do not do"),
    "DDIM CFG++": ("DDIM", "CFG++ changes the guidance, which diffusers' schedulers do not do"),
}


def _key(text: str) -> str:
    return text.strip().lower().replace(" ", "").replace("_", "")


_BY_KEY = {_key(name): name for name in SAMPLERS}
# a diffusers class named as the sampler ("EulerDiscreteScheduler"): that class on the model folder's config as plain
# diffusers runs it (its own timestep spacing, schedule types as config keys: `schedules.overrides`), not A1111's
# (diffusers' deterministic DPM++ 2S too, which "DPM++ 2S a" ran before issue 31)
AS_DIFFUSERS = sorted({cls for cls, _ in SAMPLERS.values()} - set(OWN)
                      | {"DPMSolverSinglestepScheduler", "LCMScheduler"})
_AS_DIFFUSERS_BY_KEY = {_key(name): name for name in AS_DIFFUSERS}
_REFUSED_BY_KEY = {_key(name): name for name in REFUSED}


def refusal(name: str) -> str:
    nearest, why = REFUSED[name]
    return f"{name} has no diffusers scheduler; the nearest offered is {nearest!r} ({why})"


def split_sampler(name: object, field: str = "sampler") -> tuple[str, str | None]:
    """(the canonical sampler name, the schedule type its name ends with or None): "dpm++ 2m karras" is
    ("DPM++ 2M", "karras"); case and spaces are ignored. A name we do not offer is a clear error: the
    nearest offered sampler for A1111's that diffusers lacks (Euler a CFG++), else the list."""
    if isinstance(name, str):
        key = _key(name)
        if key in ("", DEFAULT):
            return DEFAULT, None
        if key in _BY_KEY:
            return _BY_KEY[key], None
        if key in _AS_DIFFUSERS_BY_KEY:
            return _AS_DIFFUSERS_BY_KEY[key], None
        if key in _REFUSED_BY_KEY:
            raise InvalidRequest(field, name, refusal(_REFUSED_BY_KEY[key]))
        for schedule in sorted(schedules.SCHEDULE_TYPES, key=lambda k: -len(schedules.label(k))):
            suffix = _key(schedules.label(schedule)).replace("-", "")
            if schedule != AUTOMATIC and key.endswith(suffix) and key[: -len(suffix)] in _BY_KEY:
                return _BY_KEY[key[: -len(suffix)]], schedule
    raise InvalidRequest(field, name, "use 'default' or one of: " + ", ".join(SAMPLERS)
                         + " (a schedule type may follow the name, as A1111 wrote them: 'DPM++ 2M Karras'; a "
                         "diffusers class name, 'EulerDiscreteScheduler', runs it as plain diffusers does)")


def check_installed(sampler: str) -> None:
    """A sampler whose scheduler needs a package that is not installed is refused naming it (no torch import)."""
    from importlib.util import find_spec

    package = NEEDS.get(sampler)
    if package and find_spec(package) is None:
        raise InvalidRequest("sampler", sampler, f"its diffusers scheduler needs the {package} package, which is "
                                                 f"not installed: pip install {package}")


def _class(sampler: str):
    check_installed(sampler)
    return class_named(SAMPLERS[sampler][0])


def class_named(name: str):
    """The scheduler class of a SAMPLERS entry: diffusers' own, or ours (`OWN`)."""
    import importlib

    return getattr(importlib.import_module(OWN.get(name, "diffusers")), name)


# diffusers' classes that step through a discrete model's noise levels as k-diffusion's samplers do, handed A1111's
# levels (schedules.hand_over); True: second order, two model calls per level (diffusers repeats each level)
SIGMA_CLASSES = {"EulerDiscreteScheduler": False, "EulerAncestralDiscreteScheduler": False,
                 "LMSDiscreteScheduler": False, "HeunDiscreteScheduler": True, "KDPM2DiscreteScheduler": True,
                 "KDPM2AncestralDiscreteScheduler": True, "DPMSolverMultistepScheduler": False,
                 "DPMSolverSinglestepScheduler": False, "DPMSolverSDEScheduler": True, "UniPCMultistepScheduler": False,
                 "DPMPP2SAncestralScheduler": False,  # ours takes the levels as they are: KL Optimal runs
                 "DPMSolverMultistepSDEScheduler": False}
# A1111's samplers that step through timesteps of their own (its sd_samplers_timesteps.py; UniPC's class takes levels
# too): their Automatic is the class's own schedule (UniPC's: A1111's times, OWN_TIMES)
TIMESTEP_SAMPLERS = {"DDIM", "PLMS", "UniPC", "DDPM"}
# those of them whose A1111 times are handed to the class (UniPC: bh1 cannot step to a level of 0): Automatic only
OWN_TIMES = {"UniPC"}
# diffusers' DPM-Solver steps its last step (its last two below 15 steps) at first order and wherever its config's
# final level is "zero"; k-diffusion's 2M only where the next level is 0 (KL Optimal ends above 0): configured so
K_ORDER_AT_THE_END = {"DPM++ 2M"}
# A1111's timestep samplers whose class is handed A1111's timesteps (schedules.hand_over_timesteps)
A1111_TIMESTEPS = {"DDIM", "PLMS"}
# A1111's samplers with `discard_next_to_last_sigma`: one more level computed, the next-to-last dropped
DISCARD_PENULTIMATE = {"DPM2", "DPM2 a", "DPM++ 3M SDE"}


def timestep_only() -> list[str]:
    """The samplers whose class steps through timesteps of its own: they take the Automatic schedule type only."""
    return [name for name, (cls, _) in SAMPLERS.items()
            if (cls not in SIGMA_CLASSES and cls not in KSAMPLERS) or name in OWN_TIMES]


def make_scheduler(name: str, base_config: dict, schedule_type: str = AUTOMATIC, table: str = "sd15"):
    """A scheduler for sampler `name` built from the model's own scheduler config (betas, prediction type) that steps
    through A1111's levels of `schedule_type` (`build_scheduler` says when it cannot)."""
    cls = _class(name)
    changes = schedules.overrides(cls, AUTOMATIC)[0]  # the folder's Karras/Exponential/Beta flags cleared
    try:
        scheduler = cls.from_config(base_config, **SAMPLERS[name][1], **changes)
    except ImportError as exc:  # a backend diffusers checks itself (NEEDS names the ones we know first)
        raise InvalidRequest("sampler", name, f"its diffusers scheduler cannot load: {exc}") from None
    return _handed(scheduler, name, schedule_type, table)


def _sigma_scheduler(scheduler) -> bool:
    config = scheduler.config  # the scheduler object's kind and settings (any family's folder may hold one)
    return (type(scheduler).__name__ in set(SIGMA_CLASSES) | KSAMPLERS
            and config.get("prediction_type") != "flow_prediction"
            and not config.get("use_flow_sigmas"))


def _handed(scheduler, sampler: str, schedule_type: str, table: str):
    """`scheduler` (A1111 sampler `sampler`) set to step through A1111's levels of `schedule_type`: Automatic is the
    sampler's A1111 Automatic (DPM++ 2M: Karras; Euler: Uniform); a timestep sampler's Automatic is its class's own
    schedule; a type the sampler cannot take is refused in one sentence."""
    label = schedules.label(schedule_type)
    if not _sigma_scheduler(scheduler):
        if schedule_type == AUTOMATIC:
            return schedules.hand_over_timesteps(scheduler) if sampler in A1111_TIMESTEPS else scheduler
        raise InvalidRequest("schedule type", label, f"sampler {sampler!r} steps through timesteps of its own, so it "
                                                     "cannot take a schedule type (A1111 ignores one there): "
                                                     "use Automatic")
    if sampler in OWN_TIMES:  # A1111's UniPC: time-uniform continuous times (a1111/unipc_time.py)
        if schedule_type != AUTOMATIC:
            raise InvalidRequest("schedule type", label, f"sampler {sampler!r} steps through timesteps of its own, so "
                                                         "it cannot take a schedule type (A1111 ignores one there): "
                                                         "use Automatic")
        from lowvram_gen.a1111 import unipc_time

        return unipc_time.hand_over(scheduler)
    if schedule_type == AUTOMATIC:
        if sampler in TIMESTEP_SAMPLERS:
            return scheduler
        schedule_type = A1111_AUTOMATIC.get(sampler, AUTOMATIC)
    # ksamplers' Restart (order 2) makes two calls a step as Heun does, and, as Heun's, refuses KL Optimal
    interleaved = SIGMA_CLASSES.get(type(scheduler).__name__, scheduler.order == 2)
    if schedule_type == "kl-optimal" and interleaved:
        raise InvalidRequest("schedule type", label, f"sampler {sampler!r} cannot take it: KL Optimal ends at the "
                                                     "model's lowest noise level instead of 0, which diffusers' "
                                                     "second-order schedulers step once where A1111 steps twice")
    if sampler in K_ORDER_AT_THE_END:  # k-diffusion: first order only where the next level is 0
        scheduler.register_to_config(lower_order_final=False, final_sigmas_type="sigma_min" if schedule_type ==
                                     "kl-optimal" else "zero")
    return schedules.hand_over(scheduler, schedule_type, interleaved=interleaved,
                               discard_penultimate=sampler in DISCARD_PENULTIMATE, table=table)


def default_sampling(sampler: str, schedule_type: str, family_default: str | None) -> tuple[str, str]:
    """(sampler, schedule type) that run for the request's: 'default' is `family_default` where the family has one
    (`Family.default_sampler`), with A1111's Automatic schedule type of that sampler (DPM++ 2M: Karras) where the
    request's is Automatic; otherwise they are the request's."""
    if sampler != DEFAULT or family_default is None:
        return sampler, schedule_type
    if schedule_type == AUTOMATIC:
        schedule_type = A1111_AUTOMATIC.get(family_default, AUTOMATIC)
    return family_default, schedule_type


def build_scheduler(sampler: str, schedule_type: str, base, family_default: str | None = None,
                    table: str = "sd15") -> tuple:
    """(the scheduler, a warning or None) for `sampler` and `schedule_type` on the model's own scheduler `base`:
    'default' is the family's default sampler (`default_sampling`) where it has one, else `base` itself, rebuilt
    only where the schedule type changes it. A sigma scheduler steps through A1111's levels (`_handed`; `table`: the
    model's Align Your Steps table, schedules.align_table); a flow-matching one keeps diffusers' schedule, where a
    type its class does not have runs its own schedule and the warning says so."""
    sampler, schedule_type = default_sampling(sampler, schedule_type, family_default)
    if sampler in AS_DIFFUSERS:
        import diffusers

        cls = getattr(diffusers, sampler)
        changes, supported = schedules.overrides(cls, schedule_type, named=False)
        return cls.from_config(base.config, **changes), None if supported else _unsupported(sampler, cls,
                                                                                              schedule_type)
    if sampler != DEFAULT and not _flow(base):  # a noise-prediction model: A1111's samplers as A1111 runs them
        return make_scheduler(sampler, base.config, schedule_type, table), None
    if sampler == DEFAULT and not _flow(base):
        if schedule_type == AUTOMATIC:
            return base, None
        name = a1111_name(base)
        return _handed(type(base).from_config(base.config), name, schedule_type, table), None
    named = sampler != DEFAULT
    if SAMPLERS.get(sampler, ("",))[0] in KSAMPLERS:  # k-diffusion's samplers step a noise-prediction model's levels
        raise InvalidRequest("sampler", sampler, "it runs on noise-prediction models (SD 1.x/2.x, SDXL) only; this "
                                                 "flow-matching model keeps its own sampler: use 'default'")
    cls = _class(sampler) if named else type(base)
    changes, supported = schedules.overrides(cls, schedule_type, named)
    warning = None if supported else _unsupported(sampler, cls, schedule_type)
    if named:
        return cls.from_config(base.config, **SAMPLERS[sampler][1], **changes), warning
    return (cls.from_config(base.config, **changes) if changes else base), warning


def _flow(scheduler) -> bool:
    name = type(scheduler).__name__  # the scheduler object's kind (any family's folder may hold one), not a family
    return name.startswith("FlowMatch") or scheduler.config.get("prediction_type") == "flow_prediction" \
        or bool(scheduler.config.get("use_flow_sigmas"))


def _unsupported(sampler: str, cls, schedule_type: str) -> str:
    name = schedules.label(schedule_type)
    who = f"sampler {sampler!r}" if sampler != DEFAULT else f"the model's own scheduler ({cls.__name__})"
    if schedules.SCHEDULE_TYPES[schedule_type][1] is None:
        have = ", ".join(schedules.label(k) for k in schedules.SUPPORTED)
        return f"schedule type {name!r} has no diffusers equivalent: {who} ran its own schedule (diffusers has {have})"
    return (f"{who} has no {name!r} schedule in diffusers: it ran its own schedule (the samplers with it: "
            f"{', '.join(with_schedule(schedule_type))})")


def with_schedule(schedule_type: str) -> list[str]:
    """The samplers whose diffusers class has `schedule_type` (a sampler whose package is missing is left out)."""
    names = []
    for name, (cls_name, _) in SAMPLERS.items():
        if _installed(name) and schedules.overrides(class_named(cls_name), schedule_type)[1]:
            names.append(name)
    return names


def _installed(sampler: str) -> bool:
    try:
        check_installed(sampler)
    except InvalidRequest:
        return False
    return True


def a1111_name(scheduler) -> str:
    """The A1111 sampler name of a scheduler, for the PNG text, where one matches (a model folder's own
    PNDMScheduler with skip_prk_steps is A1111's PLMS); otherwise its diffusers class name. The schedule
    type is `schedules.applied_label`'s."""
    cls, config = type(scheduler).__name__, scheduler.config
    if cls == "PNDMScheduler" and not config.get("skip_prk_steps", False):
        return cls  # PNDM with its Runge-Kutta warm-up steps is not A1111's PLMS
    params = inspect.signature(type(scheduler).__init__).parameters  # the scheduler class's settings, not a family
    same_class = [(name, extra) for name, (cls_name, extra) in SAMPLERS.items() if cls_name == cls]
    telling = {key for _, extra in same_class for key in extra}  # the keys that tell them apart
    for name, extra in same_class:
        if all(config.get(key, params[key].default if key in params else None) == extra.get(key, params[key].default)
               for key in telling if key in params):
            return name
    return cls


def infotext_schedule(scheduler, sampler: str, schedule_type: str, applied: bool) -> str | None:
    """What the PNG's `Schedule type` says of a job that ran `scheduler` as A1111 sampler `sampler` (its A1111
    name): the schedule type asked for where it ran, else the one the scheduler's config runs; for the plain
    schedule 'Uniform' where A1111 would read no schedule type as another (DPM++ 2M: Karras), else nothing."""
    if applied and schedule_type != AUTOMATIC:
        return schedules.label(schedule_type)
    found = schedules.applied_label(scheduler)
    if found:
        return found
    return schedules.label("uniform") if sampler in A1111_AUTOMATIC else None
