"""A1111 1.9+ schedule types (`Schedule type: Karras`): A1111's own noise levels handed to diffusers' schedulers.

A1111 1.9 split the old combined sampler names ("DPM++ 2M Karras") into a sampler and a schedule type
(the noise levels the sampler steps through). For the schedulers that step through noise levels (sigmas) of a
discrete noise-prediction model (Euler, LMS, Heun, DPM2, DPM++, UniPC: `samplers.SIGMA_CLASSES`), `hand_over` makes
the scheduler step through exactly A1111's levels for every step count it is set to (sigmas.py computes them from
the model's own alphas_cumprod): this is the one place they are handed to diffusers.

The flow-matching schedulers keep diffusers' own schedules (`overrides`, the config keys of diffusers' scheduler
docs, "Noise schedules and schedule types": Karras, Exponential and Beta are `use_karras_sigmas`,
`use_exponential_sigmas`, `use_beta_sigmas`; SGM Uniform and Simple `timestep_spacing="trailing"`; Normal
`timestep_spacing="linspace"`); a type with no config there runs the plain schedule with a warning.

Standard library only at import (the request validates with it before torch loads).
"""

from __future__ import annotations

import inspect
import types

from lowvram_gen.errors import InvalidRequest

AUTOMATIC = "automatic"
# key (what --schedule-type takes) -> (A1111's label, the diffusers config of a flow-matching scheduler, or None where
# diffusers has none); every key but Automatic is a function of sigmas.py for the sigma schedulers
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
    Beta, SGM Uniform, or the one `hand_over` gave it); None for its plain schedule."""
    if handed(scheduler) is not None:
        return None if handed(scheduler) == AUTOMATIC else label(handed(scheduler))
    config, takes = scheduler.config, _takes(type(scheduler))
    for flag, key in zip(SIGMA_FLAGS, ("karras", "exponential", "beta")):
        if flag in takes and config.get(flag):
            return label(key)
    if "timestep_spacing" in takes and config.get("timestep_spacing") == "trailing":
        return label("sgm-uniform")
    return None


# A1111's label of the schedule a scheduler was handed (`hand_over`); absent: the scheduler's own config says it
HANDED = "_a1111_schedule"


def handed(scheduler) -> str | None:
    """The schedule type `hand_over` gave `scheduler` (AUTOMATIC where A1111's Automatic is the plain Uniform), or
    None where it runs its own config's schedule."""
    return getattr(scheduler, HANDED, None)


def align_table(unet_config) -> str:
    """Which Align Your Steps table a UNet takes: SDXL's where it takes SDXL's added size/crop embedding (A1111's
    `is_sdxl`), else SD 1.5's."""
    get = getattr(unet_config, "get", None)
    return "sdxl" if get is not None and get("addition_embed_type") == "text_time" else "sd15"


def hand_over(scheduler, schedule_type: str, *, interleaved: bool, discard_penultimate: bool = False,
              table: str = "sd15"):
    """Make `scheduler` (a sigma scheduler) step through A1111's noise levels of `schedule_type` (a key of
    SCHEDULE_TYPES; AUTOMATIC: A1111's plain Uniform) at whatever step count it is set to; returns it.

    The class builds its own derived arrays from the levels (a second-order class, `interleaved`, repeats each one
    for its two model calls, DPM2 its midpoints): set to `use_exponential_sigmas`, its `_convert_to_exponential`
    gives A1111's levels in place of diffusers' exponential ones. A one-call-per-level class then gets the levels and
    their continuous timesteps as they are (diffusers' DPM-Solver and UniPC cast the timesteps the UNet is given to
    whole numbers; A1111 gives the UNet t as it is, and the last level where it is not 0: KL Optimal).
    The first noise is the first level times the seed's noise, as A1111 draws it (diffusers' "leading" spacing and
    its DPM-Solver start sqrt(1 + sigma^2) times it)."""
    import numpy as np
    import torch

    from lowvram_gen.a1111 import sigmas

    kind = "uniform" if schedule_type == AUTOMATIC else schedule_type
    # the model's levels: its alphas_cumprod (LCM's: those of the 50 timesteps it is distilled on, ksamplers/lcm.py)
    alphas = getattr(scheduler, "level_alphas", scheduler.alphas_cumprod).double().cpu().numpy()
    own = type(scheduler).set_timesteps
    takes = _takes(type(scheduler))
    door = getattr(type(scheduler), "set_levels", None)  # lowvram_gen.ksamplers' classes take the levels as they are
    if interleaved and door is None and "use_exponential_sigmas" not in takes:
        raise ValueError(f"{type(scheduler).__name__} cannot be handed a schedule")
    # the class's own exponential branch is the door A1111's levels come in by; "linspace" makes a k-diffusion
    # class's init_noise_sigma the first level (a property of the class that reads the spacing)
    scheduler.register_to_config(**{key: value for key, value in (
        ("use_exponential_sigmas", True), ("use_karras_sigmas", False), ("use_beta_sigmas", False),
        ("timestep_spacing", "linspace")) if key in takes})
    vp_start = not isinstance(getattr(type(scheduler), "init_noise_sigma", None), property)

    def set_timesteps(self, num_inference_steps=None, device=None, **kwargs):
        if num_inference_steps is None or any(v is not None for v in kwargs.values()):
            raise ValueError(f"the {label(schedule_type)} schedule is set by a step count alone, not {kwargs}")
        levels = sigmas.a1111(kind, int(num_inference_steps), alphas, discard_penultimate=discard_penultimate,
                              table=table)
        if door is not None:
            return door(self, levels, device=device)
        self._convert_to_exponential = lambda in_sigmas, num_inference_steps=None: np.array(levels[:-1])
        # A1111's DDIM type has more levels than steps where the count does not divide 1000: the class is set to them
        own(self, len(levels) - 1, device=device)
        if vp_start:  # DPM-Solver and UniPC step x / sqrt(1 + sigma^2): the first level's noise in those units
            self.init_noise_sigma = levels[0] / (1 + levels[0] ** 2) ** 0.5
        if interleaved:
            return
        model = sigmas.Discrete(alphas)
        self.sigmas = torch.tensor(levels, dtype=torch.float32)
        self.timesteps = torch.from_numpy(model.sigma_to_t(levels[:-1])).to(device=device, dtype=torch.float32)

    # bound to the scheduler (a copy of it binds to the copy): pipelines call scheduler.set_timesteps(steps, device=)
    scheduler.set_timesteps = types.MethodType(set_timesteps, scheduler)
    setattr(scheduler, HANDED, schedule_type)
    return scheduler


def a1111_timesteps(steps: int, train_steps: int = 1000) -> list[int]:
    """The timesteps A1111 1.6+ steps DDIM and PLMS through (its sd_samplers_timesteps), highest first: 1 + k *
    (T // steps) for k = 0, 1, ... below T, clipped to T - 1. The lowest is where the last step ends, so there is one
    UNet call fewer than timesteps: steps - 1 calls where steps divides T (20: 951 .. 51, ending at 1), more where it
    does not (30: 991 .. 34)."""
    stride = train_steps // steps
    return [min(1 + k, train_steps - 1) for k in range(0, train_steps, stride)][::-1]


def a1111_calls(timesteps: list[int], plms: bool) -> list[tuple[int, int, int]]:
    """A1111's DDIM/PLMS steps through `timesteps` (highest first; its txt2img list, or img2img's first t_enc of
    them): (the timestep the UNet is given, the level the step starts from, the one it ends at) per UNet call. DDIM
    steps from each to the next down (one call fewer than timesteps); PLMS's first step takes one more call, its
    warm-up at the next timestep down (the lowest one's, for a single step)."""
    moves = [(t, t, down) for t, down in zip(timesteps, timesteps[1:])]
    if plms and moves:
        return moves[:1] + [(moves[0][2], *moves[0][1:])] + moves[1:]
    return moves


IMG2IMG = "_a1111_img2img"  # an img2img pass's t_enc, for the next set_timesteps (`pass_of`)


def pass_of(scheduler, plan, request):
    """The img2img pass `plan` (img2img_steps.PassSteps: A1111's schedule and the steps a k-diffusion sampler runs
    of it) as `scheduler` runs it: a scheduler handed one of A1111's timestep samplers runs that sampler's own rule
    (its `a1111_pass(plan, request)`: DDIM/PLMS, `hand_over_timesteps`; UniPC, a1111/unipc_time.hand_over), any other
    the plan as it is."""
    door = getattr(scheduler, "a1111_pass", None)
    return plan if door is None or plan.run <= 0 else door(plan, request)


def hand_over_timesteps(scheduler):
    """Make a DDIM or PLMS scheduler (diffusers' DDIMScheduler, PNDMScheduler with skip_prk_steps) step through
    A1111's timesteps (`a1111_timesteps`) for whatever step count it is set to; returns it.

    A1111's timesteps are 1 + k * (T // steps), the top one clipped to T - 1 (3, 9, 27, 37 steps...), so a step
    may be shorter than the T // steps the class steps back by: each step runs the class's own update on a two-entry
    table of alphas_cumprod, the level A1111 steps from and the one it steps to (`a1111_calls`). img2img (A1111's
    sample_img2img): `a1111_pass` takes the pass's t_enc; the steps are the first t_enc timesteps, from the init
    noised to timestep t_enc (one above the first call's: `add_noise` is given that level); the pipeline is handed
    the schedule's length with the calls as the tail of its timesteps. Where A1111 makes no call (t_enc <= 1: the
    init comes back noised), one call steps in place (a step from a level to itself), for the same image."""
    import dataclasses

    import torch

    own_set, own_step, own_noise = (getattr(type(scheduler), name) for name in ("set_timesteps", "step", "add_noise"))
    train = scheduler.config.num_train_timesteps
    plms = type(scheduler).__name__ == "PNDMScheduler"
    # A1111's DDIM takes the predicted x0 as it is: diffusers' DDIM clips it to [-1, 1] by default (a folder whose
    # own scheduler is PNDM, as SD 1.x's, says nothing of it)
    scheduler.register_to_config(**{key: False for key in ("clip_sample", "thresholding")
                                    if key in _takes(type(scheduler))})

    def set_timesteps(self, num_inference_steps=None, device=None, **kwargs):
        own_set(self, num_inference_steps, device=device, **kwargs)  # the class's own state (PLMS's counter)
        every = a1111_timesteps(int(num_inference_steps), train)
        t_enc = self.__dict__.pop(IMG2IMG, None)
        steps = a1111_calls(every if t_enc is None else every[len(every) - t_enc:], plms)
        noised = None if t_enc is None else every[len(every) - t_enc - 1]
        if t_enc is not None and not steps:  # A1111 steps nowhere (t_enc <= 1): the noised init, by a step in place
            steps = [(noised, noised, noised)]
        calls = [t for t, _, _ in steps]
        # img2img: the pipeline runs the tail of a list of the schedule's length (the rest never runs)
        filler = [] if t_enc is None else [noised] * (int(num_inference_steps) - len(calls))
        self.timesteps = torch.tensor(filler + calls, dtype=torch.int64, device=device)
        self._a1111_steps = {"steps": steps, "done": 0, "noised": None if not calls else (calls[0], noised)}

    def step(self, model_output, timestep, sample, *args, **kwargs):
        state = self._a1111_steps
        _, start, end = state["steps"][state["done"]]
        state["done"] += 1
        table, count = self.alphas_cumprod, self.num_inference_steps
        # the class steps from timestep 1 back by T // T = 1 (PLMS's warm-up adds the step to its timestep: 0)
        self.alphas_cumprod, self.num_inference_steps = torch.stack([table[end], table[start]]), train
        try:
            return own_step(self, model_output, 0 if plms and self.counter == 1 else 1, sample, *args, **kwargs)
        finally:
            self.alphas_cumprod, self.num_inference_steps = table, count

    def add_noise(self, original_samples, noise, timesteps):
        first = getattr(self, "_a1111_steps", {}).get("noised")
        if first is not None:  # A1111 noises the init to the timestep above its first call
            timesteps = torch.where(timesteps == first[0], torch.full_like(timesteps, first[1]), timesteps)
        return own_noise(self, original_samples, noise, timesteps)

    def a1111_pass(self, plan, _request=None):
        t_enc = plan.run - 1  # A1111's sample_img2img: setup_img2img_steps' t_enc (k-diffusion runs t_enc + 1)
        # where A1111 makes no call (t_enc <= 1) the pipeline still needs one: a step in place (`set_timesteps`)
        calls = max(len(a1111_calls(list(range(t_enc)), plms)), 1)
        self.__dict__[IMG2IMG] = t_enc
        return dataclasses.replace(plan, run=calls)

    for name, method in (("set_timesteps", set_timesteps), ("step", step), ("add_noise", add_noise),
                         ("a1111_pass", a1111_pass)):  # bound to the scheduler (a copy binds to the copy)
        setattr(scheduler, name, types.MethodType(method, scheduler))
    return scheduler
