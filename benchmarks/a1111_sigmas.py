"""Writes tests/data/a1111_sigmas.json: A1111's noise levels for each schedule type, 10/20/30 steps, on SD 1.x and
SDXL, the numbers tests/test_schedules_a1111.py holds the schedulers to.

A second, separate reading of the published formulas (plain Python floats, no numpy, not lowvram_gen/a1111/sigmas.py), so
that the test compares two implementations; docs/a1111-schedules.md cites each formula's source:
- the model's levels: sigma_t = sqrt((1 - alphas_cumprod_t) / alphas_cumprod_t), SD's "scaled_linear" betas
  (linspace(sqrt(0.00085), sqrt(0.012), 1000) ** 2), which SD 1.x and SDXL share;
- k-diffusion (MIT, crowsonkb/k-diffusion k_diffusion/external.py DiscreteSchedule: get_sigmas, t_to_sigma,
  sigma_to_t; k_diffusion/sampling.py: get_sigmas_karras, get_sigmas_exponential, get_sigmas_polyexponential);
- ComfyUI's simple, normal (and its sgm variant), ddim_uniform, kl_optimal schedulers as A1111 1.10 lists them;
- Beta: Lee et al. 2024, arXiv:2407.12173, alpha = beta = 0.6 (A1111's defaults);
- Align Your Steps: NVIDIA's SD 1.5 / SDXL 10-step tables, log-linearly interpolated.
A1111 steps DPM2, DPM2 a and DPM++ 3M SDE through n + 1 levels with the next-to-last dropped ("discard").

Run: python benchmarks/a1111_sigmas.py   (seconds; needs scipy for Beta's inverse distribution)
"""

from __future__ import annotations

import json
import math
from pathlib import Path

OUT = Path(__file__).resolve().parents[1] / "tests" / "data" / "a1111_sigmas.json"
STEPS = (10, 20, 30)
AYS = {"sd15": [14.615, 6.475, 3.861, 2.697, 1.886, 1.396, 0.963, 0.652, 0.399, 0.152, 0.029],
       "sdxl": [14.615, 6.315, 3.771, 2.181, 1.342, 0.862, 0.555, 0.380, 0.234, 0.113, 0.029]}


def model_levels() -> list[float]:
    lo, hi, count = math.sqrt(0.00085), math.sqrt(0.012), 1000
    product, levels = 1.0, []
    for i in range(count):
        beta = (lo + (hi - lo) * i / (count - 1)) ** 2
        product *= 1 - beta
        levels.append(math.sqrt((1 - product) / product))
    return levels


LEVELS = model_levels()
LOGS = [math.log(s) for s in LEVELS]
SMIN, SMAX = LEVELS[0], LEVELS[-1]


def lin(a: float, b: float, n: int) -> list[float]:
    return [a + (b - a) * i / (n - 1) for i in range(n)] if n > 1 else [a]


def t_to_sigma(t: float) -> float:
    low, high = math.floor(t), math.ceil(t)
    w = t - low
    return math.exp((1 - w) * LOGS[low] + w * LOGS[high])


def sigma_to_t(sigma: float) -> float:
    ls = math.log(sigma)
    low = max(i for i in range(len(LOGS)) if LOGS[i] <= ls) if LOGS[0] <= ls else 0
    low = min(low, len(LOGS) - 2)
    w = min(max((LOGS[low] - ls) / (LOGS[low] - LOGS[low + 1]), 0.0), 1.0)
    return low + w


def schedule(kind: str, n: int, table: str) -> list[float]:
    if kind == "uniform":
        return [t_to_sigma(t) for t in lin(len(LEVELS) - 1, 0, n)] + [0.0]
    if kind == "karras":
        a, b = SMAX ** (1 / 7), SMIN ** (1 / 7)
        return [(a + r * (b - a)) ** 7 for r in lin(0, 1, n)] + [0.0]
    if kind == "exponential":
        return [math.exp(x) for x in lin(math.log(SMAX), math.log(SMIN), n)] + [0.0]
    if kind == "polyexponential":  # rho 1: the same levels as exponential, by the polyexponential formula
        return [math.exp(r * (math.log(SMAX) - math.log(SMIN)) + math.log(SMIN)) for r in lin(1, 0, n)] + [0.0]
    if kind == "sgm-uniform":
        return [t_to_sigma(t) for t in lin(sigma_to_t(SMAX), sigma_to_t(SMIN), n + 1)[:-1]] + [0.0]
    if kind == "normal":
        return [t_to_sigma(t) for t in lin(sigma_to_t(SMAX), sigma_to_t(SMIN), n)] + [0.0]
    if kind == "simple":
        return [LEVELS[-(1 + int(x * (len(LEVELS) / n)))] for x in range(n)] + [0.0]
    if kind == "ddim":
        stride = max(len(LEVELS) // n, 1)
        return [LEVELS[i] for i in range(1, len(LEVELS), stride)][::-1] + [0.0]
    if kind == "kl-optimal":
        return [math.tan(i / n * math.atan(SMIN) + (1 - i / n) * math.atan(SMAX)) for i in range(n + 1)]
    if kind == "beta":
        from scipy.special import betaincinv  # the Beta(0.6, 0.6) distribution's inverse

        return [SMIN + betaincinv(0.6, 0.6, 1 - x) * (SMAX - SMIN) for x in lin(0, 1, n)] + [0.0]
    if kind == "align-your-steps":
        levels = AYS[table]
        if n == len(levels):
            return levels + [0.0]
        logs = [math.log(s) for s in reversed(levels)]
        out = []
        for x in lin(0, 1, n):
            pos = x * (len(logs) - 1)
            i = min(int(pos), len(logs) - 2)
            out.append(math.exp(logs[i] + (pos - i) * (logs[i + 1] - logs[i])))
        return out[::-1] + [0.0]
    raise ValueError(kind)


KINDS = ("uniform", "karras", "exponential", "polyexponential", "sgm-uniform", "kl-optimal", "align-your-steps",
         "simple", "normal", "ddim", "beta")


def main() -> None:
    data = {"note": "written by benchmarks/a1111_sigmas.py; A1111's noise levels, highest first, with the last",
            "plain": {}, "discard": {}}
    for table in ("sd15", "sdxl"):
        for name, extra in (("plain", 0), ("discard", 1)):
            data[name][table] = {}
            for kind in KINDS:
                rows = {}
                for n in STEPS:
                    levels = schedule(kind, n + extra, table)
                    if extra:
                        levels = levels[:-2] + levels[-1:]
                    rows[str(n)] = [float("%.9g" % x) for x in levels]
                data[name][table][kind] = rows
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps(data, indent=None, separators=(",", ":")) + "\n", encoding="utf-8")
    print(f"wrote {OUT}")


if __name__ == "__main__":
    main()
