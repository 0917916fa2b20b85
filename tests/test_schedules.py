"""A1111 1.9+ schedule types (schedules.py, samplers.py): A1111's levels handed to the sigma schedulers, diffusers'
config for the flow-matching ones; no generation, only the schedulers built, and what the PNG text says of them."""

from __future__ import annotations

import pytest

from lowvram_gen.errors import InvalidRequest
from lowvram_gen.samplers import SAMPLERS, a1111_name, build_scheduler, infotext_schedule, make_scheduler, split_sampler
from lowvram_gen.schedules import SCHEDULE_TYPES, handed

SD15 = {"num_train_timesteps": 1000, "beta_start": 0.00085, "beta_end": 0.012, "beta_schedule": "scaled_linear",
        "steps_offset": 1, "skip_prk_steps": True, "set_alpha_to_one": False}
# what each schedule type diffusers has sets in a flow-matching scheduler's config (those keep diffusers' schedules)
FLOW_EXPECTED = {"karras": {"use_karras_sigmas": True, "use_exponential_sigmas": False, "use_beta_sigmas": False},
                 "exponential": {"use_exponential_sigmas": True, "use_karras_sigmas": False},
                 "beta": {"use_beta_sigmas": True, "use_karras_sigmas": False}}


def pndm():
    from diffusers import PNDMScheduler

    return PNDMScheduler.from_config(SD15)


def flow():
    from diffusers import FlowMatchEulerDiscreteScheduler

    return FlowMatchEulerDiscreteScheduler()


@pytest.mark.parametrize("sampler, schedule", [
    (sampler, schedule) for sampler in ("Euler", "Euler a", "DPM++ 2M", "DPM++ SDE", "DPM++ 3M SDE", "LMS")
    for schedule in SCHEDULE_TYPES if schedule != "automatic"
    and (sampler, schedule) != ("DPM++ SDE", "kl-optimal")])  # refused: test_schedules_a1111.py
def test_each_schedule_type_is_handed_to_the_scheduler(sampler, schedule):
    """Issue 31: a sampler that steps through noise levels is handed A1111's levels of every schedule type (the
    numbers: test_schedules_a1111.py); the PNG says the type, the sampler is still named as it is."""
    scheduler, warning = build_scheduler(sampler, schedule, pndm())
    assert warning is None and handed(scheduler) == schedule
    assert type(scheduler).__name__ == SAMPLERS[sampler][0] and a1111_name(scheduler) == sampler
    assert infotext_schedule(scheduler, sampler, schedule, applied=True) == SCHEDULE_TYPES[schedule][0]
    scheduler.set_timesteps(5)


@pytest.mark.parametrize("schedule", sorted(FLOW_EXPECTED))
def test_a_flow_matching_scheduler_keeps_diffusers_schedule_config(schedule):
    scheduler, warning = build_scheduler("default", schedule, flow())
    assert warning is None and handed(scheduler) is None
    assert {key: scheduler.config[key] for key in FLOW_EXPECTED[schedule]} == FLOW_EXPECTED[schedule]
    scheduler.set_timesteps(5)


def test_the_new_samplers_are_diffusers_own():
    """DPM++ 3M SDE and 2M SDE Heun are DPMSolverMultistep with solver_order 3 / the heun solver (diffusers' docs)."""
    three = make_scheduler("DPM++ 3M SDE", SD15)
    assert (three.config.solver_order, three.config.algorithm_type) == (3, "sde-dpmsolver++")
    heun = make_scheduler("DPM++ 2M SDE Heun", SD15)
    assert (heun.config.solver_type, heun.config.algorithm_type, heun.config.solver_order) == (
        "heun", "sde-dpmsolver++", 2)
    assert type(make_scheduler("DPM++ SDE", SD15)).__name__ == "DPMSolverSDEScheduler"
    assert type(make_scheduler("DDPM", SD15)).__name__ == "DDPMScheduler"


@pytest.mark.parametrize("schedule, said", [
    ("polyexponential", "schedule type 'Polyexponential' has no diffusers equivalent"),
    ("align-your-steps", "schedule type 'Align Your Steps' has no diffusers equivalent"),
    ("kl-optimal", "schedule type 'KL Optimal' has no diffusers equivalent"),
])
def test_a_type_a_flow_matching_scheduler_lacks_warns_and_runs_its_plain_schedule(schedule, said):
    """The flow-matching families keep diffusers' schedulers: a type with no config there runs the plain schedule and
    the warning says so (the A1111 samplers, which would take it, are refused on those models: pipeline.py)."""
    scheduler, warning = build_scheduler("default", schedule, flow())
    plain, none = build_scheduler("default", "automatic", flow())
    assert warning is not None and warning.startswith(said) and none is None
    assert dict(scheduler.config) == dict(plain.config)


def test_a_type_a_timestep_scheduler_cannot_take_is_refused():
    """The model folder's own PNDM (A1111's PLMS) steps through timesteps of its own: Karras asked of it is refused,
    naming it, where it used to run its own schedule with a warning."""
    with pytest.raises(InvalidRequest, match="sampler 'PLMS' steps through timesteps of its own"):
        build_scheduler("default", "karras", pndm())


def test_default_keeps_the_models_own_scheduler_unless_the_schedule_type_changes_it():
    from diffusers import EulerDiscreteScheduler

    own = EulerDiscreteScheduler.from_config({**SD15, "use_karras_sigmas": True})
    assert build_scheduler("default", "automatic", own) == (own, None)
    exponential = build_scheduler("default", "exponential", own)[0]
    assert handed(exponential) == "exponential" and exponential is not own
    assert handed(build_scheduler("default", "uniform", own)[0]) == "uniform"
    # a named sampler says its schedule: the model folder's Karras flag is not carried over to it
    assert handed(build_scheduler("Euler", "automatic", own)[0]) == "automatic"
    assert infotext_schedule(own, "Euler", "automatic", applied=True) == "Karras"  # what the folder's config runs


def test_default_is_the_familys_default_sampler_with_its_a1111_automatic_schedule():
    """Issue 29: an SD family's "default" is A1111's DPM++ 2M, Automatic being Karras for it (A1111 1.9+); another
    schedule type goes with it; a family without one (the flow-matching ones) keeps the folder's scheduler."""
    scheduler, warning = build_scheduler("default", "automatic", pndm(), "DPM++ 2M")
    assert warning is None and type(scheduler).__name__ == "DPMSolverMultistepScheduler"
    assert handed(scheduler) == "karras" and a1111_name(scheduler) == "DPM++ 2M"
    assert infotext_schedule(scheduler, "DPM++ 2M", "automatic", applied=True) == "Karras"
    assert handed(build_scheduler("default", "beta", pndm(), "DPM++ 2M")[0]) == "beta"
    own = pndm()
    assert build_scheduler("default", "automatic", own, None) == (own, None)


def test_what_the_png_says_of_the_schedule():
    euler = make_scheduler("Euler", SD15, "karras")
    assert infotext_schedule(euler, "Euler", "karras", applied=True) == "Karras"
    assert infotext_schedule(make_scheduler("Euler", SD15, "simple"), "Euler", "simple", applied=True) == "Simple"
    assert infotext_schedule(make_scheduler("Euler", SD15), "Euler", "automatic", applied=True) is None
    # issue 31: DPM++ 2M on Automatic runs A1111's Automatic for it, Karras, and says so as A1111 does
    assert infotext_schedule(make_scheduler("DPM++ 2M", SD15), "DPM++ 2M", "automatic", applied=True) == "Karras"
    assert infotext_schedule(make_scheduler("DPM++ 2M SDE", SD15), "DPM++ 2M SDE", "automatic",
                             applied=True) == "Exponential"


def test_every_a1111_schedule_type_has_an_entry():
    labels = [label for label, _ in SCHEDULE_TYPES.values()]
    assert labels == ["Automatic", "Uniform", "Karras", "Exponential", "Polyexponential", "SGM Uniform", "KL Optimal",
                      "Align Your Steps", "Simple", "Normal", "DDIM", "Beta"]


@pytest.mark.parametrize("name, nearest", [("Euler a CFG++", "Euler a"), ("DDIM CFG++", "DDIM")])
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
