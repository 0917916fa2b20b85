"""Issue 31, item 3: every sampler x schedule type steps through A1111's noise levels, on the tiny SD 1.x and SDXL
models' own scheduler configs, for 10, 20 and 30 steps, with A1111's number of model calls.

The expected levels are numbers in tests/data/a1111_sigmas.json, written once by benchmarks/a1111_sigmas.py from
the published formulas (a second implementation, not lowvram_gen/a1111/sigmas.py; docs/a1111-schedules.md cites them).
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from lowvram_gen.errors import InvalidRequest
from lowvram_gen.samplers import (A1111_AUTOMATIC, DISCARD_PENULTIMATE, OWN_TIMES, SAMPLERS, SIGMA_CLASSES,
                                  TIMESTEP_SAMPLERS, build_scheduler, infotext_schedule, make_scheduler)
from lowvram_gen.schedules import AUTOMATIC, SCHEDULE_TYPES

DATA = json.loads((Path(__file__).parent / "data" / "a1111_sigmas.json").read_text(encoding="utf-8"))
STEPS = (10, 20, 30)
# the tiny folders' own scheduler configs (models/tiny.py: SD 1.5's PNDM and SDXL base's Euler, "leading" spacing)
SD15 = {"_class_name": "PNDMScheduler", "beta_start": 0.00085, "beta_end": 0.012, "beta_schedule": "scaled_linear",
        "num_train_timesteps": 1000, "skip_prk_steps": True, "set_alpha_to_one": False, "steps_offset": 1}
SDXL = {"_class_name": "EulerDiscreteScheduler", "beta_start": 0.00085, "beta_end": 0.012,
        "beta_schedule": "scaled_linear", "num_train_timesteps": 1000, "steps_offset": 1, "timestep_spacing": "leading",
        "interpolation_type": "linear", "prediction_type": "epsilon"}
MODELS = {"sd15": SD15, "sdxl": SDXL}
# UniPC steps through A1111's own UniPC times, Automatic only (test_samplers_singlestep_a1111.py)
SIGMA_SAMPLERS = [name for name, (cls, _) in SAMPLERS.items() if cls in SIGMA_CLASSES and name not in OWN_TIMES]
# A1111: two model calls a step, one where the next level is 0
SECOND_ORDER = {"Heun", "DPM2", "DPM2 a", "DPM++ SDE", "DPM++ 2S a"}
# KL Optimal's last level is not 0: refused for diffusers' second-order classes (ours, DPM++ 2S a, takes it)
KL_REFUSED = SECOND_ORDER - {"DPM++ 2S a"}


def expected(sampler: str, schedule: str, table: str, steps: int) -> list[float]:
    kind = A1111_AUTOMATIC.get(sampler, "uniform") if schedule == AUTOMATIC else schedule
    kind = "uniform" if kind == AUTOMATIC else kind
    return DATA["discard" if sampler in DISCARD_PENULTIMATE else "plain"][table][kind][str(steps)]


def stepped(scheduler) -> list[float]:
    """The levels a scheduler steps through, once each: diffusers' second-order classes repeat each level for their
    second call (Heun and DPM++ SDE: [s0, s1, s1, ..., s(n-1), s(n-1), sn]; DPM2: every level twice, then 0)."""
    levels = scheduler.sigmas.double().numpy()
    name = type(scheduler).__name__
    if name in ("HeunDiscreteScheduler", "DPMSolverSDEScheduler"):
        return [*levels[0::2], levels[-1]]
    if name.startswith("KDPM2"):
        return list(levels[0::2])
    if name == "DPMPP2SAncestralScheduler":  # ours: the levels, and per call the sigma it is called at (a midpoint)
        return list(scheduler.levels.numpy())
    return list(levels)


def offered(sampler: str) -> list[str]:
    return [key for key in SCHEDULE_TYPES if not (key == "kl-optimal" and sampler in KL_REFUSED)
            and not (key == AUTOMATIC and sampler in TIMESTEP_SAMPLERS)]


def relative(got, want) -> float:
    got, want = np.asarray(got, dtype=float), np.asarray(want, dtype=float)
    return float(np.max(np.abs(got - want) / np.maximum(np.abs(want), 1e-12)))


@pytest.mark.parametrize("table", sorted(MODELS))
@pytest.mark.parametrize("sampler", SIGMA_SAMPLERS)
def test_every_schedule_type_steps_through_a1111s_levels(sampler, table):
    """Levels within 1e-4 (relative) of A1111's, the first noise drawn at the first level (A1111: noise times
    sigmas[0]), one model call per level (per timestep the pipeline loops over) as A1111 makes them. SD 1.x and SDXL
    share their training noise levels, so on SDXL only the types whose levels differ are built again (diffusers'
    DPM2 classes take seconds to build on a busy CPU: they set 1000 steps in __init__)."""
    import torch

    for schedule in [k for k in offered(sampler) if table == "sd15" or k in (AUTOMATIC, "align-your-steps")]:
        scheduler = build_scheduler(sampler, schedule, _base(table), table=table)[0]
        for steps in STEPS:
            scheduler.set_timesteps(steps)
            want = expected(sampler, schedule, table, steps)
            got = stepped(scheduler)
            assert len(got) == len(want) and relative(got, want) <= 1e-4, (sampler, schedule, steps, got[:3], want[:3])
            levels = len(want) - 1  # A1111's steps (DDIM's type: more than asked where the count does not divide 1000)
            calls = 2 * levels - (want[-1] == 0) if sampler in SECOND_ORDER else levels
            assert len(scheduler.timesteps) == calls, (sampler, schedule, steps)
            start = float(scheduler.init_noise_sigma)
            if not isinstance(getattr(type(scheduler), "init_noise_sigma", None), property):
                start = start / math.sqrt(1 - start ** 2)  # DPM-Solver/UniPC: x / sqrt(1 + sigma^2) units
            assert start == pytest.approx(want[0], rel=1e-5), (sampler, schedule)
        # and it steps: the whole loop runs on a stand-in model's zero output
        scheduler.set_timesteps(10)
        x = torch.ones(1, 4, 8, 8) * scheduler.init_noise_sigma
        import inspect

        noise = {"generator": torch.Generator().manual_seed(0)} if "generator" in inspect.signature(
            scheduler.step).parameters else {}
        for t in scheduler.timesteps:
            scheduler.scale_model_input(x, t)
            x = scheduler.step(torch.zeros_like(x), t, x, **noise).prev_sample
        assert torch.isfinite(x).all(), (sampler, schedule)


def _base(table: str):
    import diffusers

    config = MODELS[table]
    return getattr(diffusers, config["_class_name"]).from_config(config)


@pytest.mark.parametrize("sampler", ["Euler", "Heun", "DPM++ 2M", "DPM2", "DPM++ 2S a"])
def test_img2img_starts_at_the_level_of_its_start_index(sampler):
    """img2img slices the timesteps (diffusers' get_timesteps) and sets the begin index: the first step's level is
    A1111's level at that index."""
    import torch

    scheduler = make_scheduler(sampler, SD15, "karras")
    scheduler.set_timesteps(10)
    order = scheduler.order
    want = expected(sampler, "karras", "sd15", 10)
    for start in (0, 4, 9):
        scheduler.set_timesteps(10)
        scheduler.set_begin_index(start * order)
        t = scheduler.timesteps[start * order:][0]
        noised = scheduler.add_noise(torch.zeros(1, 4, 2, 2), torch.ones(1, 4, 2, 2), t[None])
        level = float(noised.flatten()[0])
        if not isinstance(getattr(type(scheduler), "init_noise_sigma", None), property):
            level = level / math.sqrt(1 - level ** 2)  # alpha * 0 + sigma_vp * 1 in DPM-Solver's units
        assert level == pytest.approx(want[start], rel=1e-4), (sampler, start)


@pytest.mark.parametrize("sampler, schedule, said", [
    ("DDIM", "karras", "sampler 'DDIM' steps through timesteps of its own, so it cannot take a schedule type"),
    ("PLMS", "uniform", "sampler 'PLMS' steps through timesteps of its own"),
    ("UniPC", "karras", "sampler 'UniPC' steps through timesteps of its own"),
    ("Heun", "kl-optimal", "sampler 'Heun' cannot take it: KL Optimal ends at the model's lowest noise level"),
    ("DPM2", "kl-optimal", "sampler 'DPM2' cannot take it"),
])
def test_a_type_a_sampler_cannot_take_is_refused_in_one_sentence(sampler, schedule, said):
    with pytest.raises(InvalidRequest) as err:
        build_scheduler(sampler, schedule, _base("sd15"))
    text = str(err.value)
    assert said in text and SCHEDULE_TYPES[schedule][0] in text and text.count(". ") == 0


def test_automatic_is_the_samplers_a1111_schedule_and_the_png_says_it_as_a1111_does():
    """A1111's Automatic: DPM++ 2M Karras (written "Schedule type: Karras"), Euler the plain Uniform (written as
    nothing); Uniform asked for is written; a timestep sampler's Automatic is its own schedule (nothing written)."""
    two_m = make_scheduler("DPM++ 2M", SD15)
    two_m.set_timesteps(10)
    assert relative(two_m.sigmas.double().numpy(), DATA["plain"]["sd15"]["karras"]["10"]) <= 1e-4
    assert infotext_schedule(two_m, "DPM++ 2M", AUTOMATIC, applied=True) == "Karras"
    euler = make_scheduler("Euler", SD15)
    euler.set_timesteps(10)
    assert float(euler.sigmas[0]) == pytest.approx(14.6146, rel=1e-4)  # the model's sigma_max, not 11.03
    assert float(euler.sigmas[-2]) == pytest.approx(0.029167, rel=1e-4)  # and its sigma_min, not 0.041
    assert infotext_schedule(euler, "Euler", AUTOMATIC, applied=True) is None
    assert infotext_schedule(make_scheduler("Euler", SD15, "uniform"), "Euler", "uniform", applied=True) == "Uniform"
    ddim = make_scheduler("DDIM", SD15)
    assert infotext_schedule(ddim, "DDIM", AUTOMATIC, applied=True) is None


def test_the_sdxl_unet_takes_sdxls_align_your_steps_table():
    from lowvram_gen.schedules import align_table

    assert align_table({"addition_embed_type": "text_time"}) == "sdxl"
    assert align_table({"addition_embed_type": None}) == align_table(None) == "sd15"
    sd15 = make_scheduler("Euler", SD15, "align-your-steps", table="sd15")
    sdxl = make_scheduler("Euler", SDXL, "align-your-steps", table="sdxl")
    sd15.set_timesteps(11)
    sdxl.set_timesteps(11)  # 11 steps: NVIDIA's table as it is, as A1111 takes it
    assert float(sd15.sigmas[1]) == pytest.approx(6.475) and float(sdxl.sigmas[1]) == pytest.approx(6.315)


def test_the_sigma_module_needs_no_torch():
    code = "import sys, lowvram_gen.a1111.sigmas as s; s.a1111('karras', 3, [0.99, 0.5, 0.01]); print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         cwd=Path(__file__).resolve().parents[1])
    assert out.stdout.strip() == "False"


def test_a_tiny_pipeline_makes_a1111s_model_calls(tiny_path, tiny_sdxl_path):
    """On the tiny SD 1.x and SDXL pipelines (the scheduler set as a job sets it), 3 steps: Heun with Karras makes 5
    UNet calls (A1111: 2 a step, 1 for the last), DPM2 (A1111 drops its next-to-last level) 5, at A1111's levels."""
    import torch
    from diffusers import DiffusionPipeline

    from lowvram_gen.engines.sd.pipeline import set_sampler

    for path, sampler, schedule, table in ((tiny_path, "Heun", "karras", "sd15"),
                                           (tiny_sdxl_path, "DPM2", AUTOMATIC, "sdxl")):
        pipe = DiffusionPipeline.from_pretrained(path)
        calls = []
        pipe.unet.register_forward_pre_hook(lambda module, args, kwargs: calls.append(float(args[1])), with_kwargs=True)
        assert set_sampler(pipe, sampler, schedule) is None
        pipe("x", num_inference_steps=3, height=64, width=64, output_type="latent",
             generator=torch.Generator().manual_seed(0))
        assert len(calls) == 5, (path.name, sampler, calls)
        # both start at the model's sigma_max, which the UNet is given as its last training step
        assert stepped(pipe.scheduler)[0] == pytest.approx(DATA["plain"][table]["karras"]["10"][0], rel=1e-4)
        assert calls[0] == pytest.approx(999.0, abs=1e-3)
