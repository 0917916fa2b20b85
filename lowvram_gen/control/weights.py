"""How strongly, and in which steps, a ControlNet unit acts: the rules of A1111's sd-webui-controlnet, as numbers.

Written from the extension's published behaviour (its hook.py and controlnet.py), tested by numbers in
tests/test_controlnet_a1111_rules.py; engines/sd/controlnet.py applies them to diffusers' ControlNet outputs.

- Per-output scales. A UNet ControlNet gives one residual per down block output and one for the mid block (13 on
  SD 1.x/2.x: 12 down, then the mid; 10 on SDXL: 9 down, then the mid). "Balanced" adds each at the unit's
  weight. "Soft injection" multiplies output i by 0.825 ** (12 - i), counted from the first output whatever the
  model (SDXL's 10 take the first 10 factors, its mid block 0.825 ** 3). It is used by "My prompt is more
  important" and "ControlNet is more important", and in hires fix's second pass for units whose preprocessor is a
  canny or an mlsd one (the extension: "use the soft weights with high-res fix can significantly reduce
  artifacts"), whatever their control mode.
- CFG: "ControlNet is more important" adds the residuals to the conditional half of the CFG batch only (zero on
  the unconditional half); the other two modes add them to both halves.
- Guidance start/end: the extension checks a unit before each denoiser call against the fraction
  sampling_step / steps, where sampling_step is the step the sampler last reported (0 before the first report;
  A1111 reports step i after its model call), so call i of a pass sees step max(i - 1, 0): the unit is skipped
  when that fraction is below the start or above the end. `steps` is what the pass runs (img2img and the hires
  pass: their own steps, counted from 0). 0-0.5 of 20 steps runs steps 0-11.

diffusers' `guess_mode` (what the engine asks for "ControlNet is more important": it runs the ControlNet on the
conditional half only) scales output i by 10 ** (-1 + i / (n - 1)) instead (`diffusers_guess_scales`): the
engine replaces those by the extension's.
"""

from __future__ import annotations

SOFT_BASE = 0.825  # the extension's soft-injection base: output i of 13 times SOFT_BASE ** (12 - i)
SOFT_OUTPUTS = 13  # the factors are counted for SD 1.x's 13 outputs; a model with fewer takes the first ones
HIRES_SOFTENED = ("canny", "mlsd")  # preprocessor names (substrings, as the extension tests them) softened in hires


def soft_scales(outputs: int) -> list[float]:
    """The soft-injection factor of each of a ControlNet's `outputs` outputs (down residuals, then the mid)."""
    return [SOFT_BASE ** float(SOFT_OUTPUTS - 1 - i) for i in range(min(outputs, SOFT_OUTPUTS))] + \
        [1.0] * max(0, outputs - SOFT_OUTPUTS)


def diffusers_guess_scales(outputs: int) -> list[float]:
    """The factors diffusers' guess mode puts on the outputs: torch.logspace(-1, 0, outputs), 0.1 to 1."""
    if outputs == 1:
        return [0.1]
    return [10.0 ** (-1.0 + i / (outputs - 1)) for i in range(outputs)]


def is_soft(control_mode: str, preprocessor: str, hires: bool) -> bool:
    """Whether a unit's residuals take the soft factors: any mode but balanced, or hires fix's second pass for a
    canny/mlsd preprocessor."""
    return control_mode != "balanced" or (hires and any(name in str(preprocessor) for name in HIRES_SOFTENED))


def unit_scales(weight: float, outputs: int, control_mode: str, preprocessor: str = "none",
                hires: bool = False) -> list[float]:
    """The scale the extension puts on each of a unit's outputs (its weight included)."""
    if is_soft(control_mode, preprocessor, hires):
        return [weight * f for f in soft_scales(outputs)]
    return [weight] * outputs


def cond_only(control_mode: str) -> bool:
    """Whether the residuals go to the conditional half of the CFG batch only ("ControlNet is more important")."""
    return control_mode == "controlnet"


def runs_at(call: int, steps: int, start: float, end: float) -> bool:
    """Whether the extension runs a unit with guidance `start`-`end` at denoiser step `call` (0-based) of a pass of
    `steps` steps."""
    percent = max(call - 1, 0) / steps
    return not (percent < start or percent > end)


def steps_run(steps: int, start: float, end: float) -> list[int]:
    """The steps (0-based) of a `steps`-step pass that a unit with guidance `start`-`end` acts in."""
    return [i for i in range(steps) if runs_at(i, steps, start, end)]
