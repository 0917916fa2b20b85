"""A1111 1.9+ schedule types as diffusers scheduler config (schedules.py, samplers.py): no generation, only the
schedulers built, and what the PNG text says of them."""

from __future__ import annotations

import pytest

from lowvram_gen.errors import InvalidRequest
from lowvram_gen.samplers import (A1111_AUTOMATIC, SAMPLERS, a1111_name, build_scheduler, infotext_schedule,
                                  make_scheduler, split_sampler)
from lowvram_gen.schedules import SCHEDULE_TYPES

SD15 = {"num_train_timesteps": 1000, "beta_start": 0.00085, "beta_end": 0.012, "beta_schedule": "scaled_linear",
        "steps_offset": 1, "skip_prk_steps": True, "set_alpha_to_one": False}
# what each schedule type diffusers has sets in the built scheduler's config
EXPECTED = {"karras": {"use_karras_sigmas": True, "use_exponential_sigmas": False, "use_beta_sigmas": False},
            "exponential": {"use_exponential_sigmas": True, "use_karras_sigmas": False},
            "beta": {"use_beta_sigmas": True, "use_karras_sigmas": False},
            "sgm-uniform": {"timestep_spacing": "trailing"}, "simple": {"timestep_spacing": "trailing"},
            "normal": {"timestep_spacing": "linspace"},
            "uniform": {"use_karras_sigmas": False}, "automatic": {"use_karras_sigmas": False}}


def pndm():
    from diffusers import PNDMScheduler

    return PNDMScheduler.from_config(SD15)


@pytest.mark.parametrize("schedule", sorted(EXPECTED))
@pytest.mark.parametrize("sampler", ["Euler", "DPM++ 2M", "DPM++ SDE", "DPM++ 3M SDE", "LMS", "UniPC"])
def test_each_schedule_type_reaches_the_scheduler_config(sampler, schedule):
    scheduler, warning = build_scheduler(sampler, schedule, pndm())
    assert warning is None
    assert {key: scheduler.config[key] for key in EXPECTED[schedule]} == EXPECTED[schedule]
    assert type(scheduler).__name__ == SAMPLERS[sampler][0] and a1111_name(scheduler) == sampler
    scheduler.set_timesteps(5)  # and it runs: diffusers refuses some combinations only here


def test_the_new_samplers_are_diffusers_own():
    """DPM++ 3M SDE and 2M SDE Heun are DPMSolverMultistep with solver_order 3 / the heun solver (diffusers' docs)."""
    three = make_scheduler("DPM++ 3M SDE", SD15)
    assert (three.config.solver_order, three.config.algorithm_type) == (3, "sde-dpmsolver++")
    heun = make_scheduler("DPM++ 2M SDE Heun", SD15)
    assert (heun.config.solver_type, heun.config.algorithm_type, heun.config.solver_order) == (
        "heun", "sde-dpmsolver++", 2)
    assert type(make_scheduler("DPM++ SDE", SD15)).__name__ == "DPMSolverSDEScheduler"
    assert type(make_scheduler("DDPM", SD15)).__name__ == "DDPMScheduler"


@pytest.mark.parametrize("sampler, schedule, said", [
    ("Euler a", "karras", "sampler 'Euler a' has no 'Karras' schedule in diffusers: it ran its own schedule"),
    ("DDIM", "exponential", "sampler 'DDIM' has no 'Exponential' schedule"),
    ("DPM++ 2S a", "sgm-uniform", "sampler 'DPM++ 2S a' has no 'SGM Uniform' schedule"),
    ("LCM", "sgm-uniform", "sampler 'LCM' has no 'SGM Uniform' schedule"),  # it takes the key and ignores it
    ("Euler", "polyexponential", "schedule type 'Polyexponential' has no diffusers equivalent"),
    ("DPM++ 2M", "align-your-steps", "schedule type 'Align Your Steps' has no diffusers equivalent"),
    ("default", "karras", "the model's own scheduler (PNDMScheduler) has no 'Karras' schedule"),
])
def test_a_schedule_type_diffusers_lacks_warns_and_runs_the_plain_schedule(sampler, schedule, said):
    scheduler, warning = build_scheduler(sampler, schedule, pndm())
    plain, none = build_scheduler(sampler, "automatic", pndm())
    assert warning is not None and warning.startswith(said) and none is None
    assert dict(scheduler.config) == dict(plain.config)
    name = a1111_name(scheduler)
    assert infotext_schedule(scheduler, name, schedule, applied=False) == ("Uniform" if name in A1111_AUTOMATIC
                                                                           else None)


def test_default_keeps_the_models_own_scheduler_unless_the_schedule_type_changes_it():
    from diffusers import EulerDiscreteScheduler

    own = EulerDiscreteScheduler.from_config({**SD15, "use_karras_sigmas": True})
    assert build_scheduler("default", "automatic", own) == (own, None)
    karras_too = build_scheduler("default", "exponential", own)[0]
    assert (karras_too.config.use_exponential_sigmas, karras_too.config.use_karras_sigmas) == (True, False)
    assert build_scheduler("default", "uniform", own)[0].config.use_karras_sigmas is False
    # a named sampler says its schedule: the model folder's Karras flag is not carried over to it
    assert build_scheduler("Euler", "automatic", own)[0].config.use_karras_sigmas is False
    assert infotext_schedule(own, "Euler", "automatic", applied=True) == "Karras"  # what the folder's config runs


def test_default_is_the_familys_default_sampler_with_its_a1111_automatic_schedule():
    """Issue 29: an SD family's "default" is A1111's DPM++ 2M, Automatic being Karras for it (A1111 1.9+); another
    schedule type goes with it; a family without one (the flow-matching ones) keeps the folder's scheduler."""
    scheduler, warning = build_scheduler("default", "automatic", pndm(), "DPM++ 2M")
    assert warning is None and type(scheduler).__name__ == "DPMSolverMultistepScheduler"
    assert scheduler.config.use_karras_sigmas and a1111_name(scheduler) == "DPM++ 2M"
    assert infotext_schedule(scheduler, "DPM++ 2M", "automatic", applied=True) == "Karras"
    beta = build_scheduler("default", "beta", pndm(), "DPM++ 2M")[0]
    assert (beta.config.use_beta_sigmas, beta.config.use_karras_sigmas) == (True, False)
    own = pndm()
    assert build_scheduler("default", "automatic", own, None) == (own, None)


def test_what_the_png_says_of_the_schedule():
    euler = make_scheduler("Euler", SD15, "karras")
    assert infotext_schedule(euler, "Euler", "karras", applied=True) == "Karras"
    assert infotext_schedule(make_scheduler("Euler", SD15, "simple"), "Euler", "simple", applied=True) == "Simple"
    assert infotext_schedule(make_scheduler("Euler", SD15), "Euler", "automatic", applied=True) is None
    # A1111 reads a DPM++ 2M with no schedule type as Karras (its Automatic): ours says the Uniform that ran
    assert infotext_schedule(make_scheduler("DPM++ 2M", SD15), "DPM++ 2M", "automatic", applied=True) == "Uniform"


def test_every_a1111_schedule_type_has_an_entry():
    labels = [label for label, _ in SCHEDULE_TYPES.values()]
    assert labels == ["Automatic", "Uniform", "Karras", "Exponential", "Polyexponential", "SGM Uniform", "KL Optimal",
                      "Align Your Steps", "Simple", "Normal", "DDIM", "Beta"]


@pytest.mark.parametrize("name, nearest", [("Restart", "Heun"), ("DPM fast", "DPM++ 2M"), ("DPM adaptive", "DPM++ 2M"),
                                           ("Euler a CFG++", "Euler a")])
def test_a1111_samplers_diffusers_lacks_are_refused_naming_the_nearest(name, nearest):
    with pytest.raises(InvalidRequest) as err:
        split_sampler(name)
    assert f"{name} has no diffusers scheduler; the nearest offered is {nearest!r}" in str(err.value)
    assert nearest in SAMPLERS


def test_the_readme_lists_every_sampler_and_schedule_type():
    from pathlib import Path

    from lowvram_gen.samplers import REFUSED

    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text(encoding="utf-8")
    section = readme[readme.index("- `--sampler default`"):readme.index("- Images are written to")]
    missing = [name for name in [*SAMPLERS, *REFUSED, *SCHEDULE_TYPES] if f"`{name}`" not in section]
    assert not missing, f"README's sampler section does not name {missing}"
