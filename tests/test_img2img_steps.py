"""A1111's step counts for passes that start from an image (issue 31, items 1 and 2): img2img and inpaint run
int(steps x denoise) + 1 steps from index steps - t_enc - 1 of a `steps` schedule; hires fix's second pass (and
img2img with A1111's img2img_fix_steps) exactly n steps, the end of a schedule of int(n / denoise).

The counts are the UNet's forward calls on the embedded tiny SD model (a forward pre-hook put on the pipeline's UNet
for each pass by a wrapper of `pipeline.denoise`, the one place every pass runs through), one per step with Euler;
the first timestep it gets is compared with the pass's schedule at A1111's start index.
"""

from __future__ import annotations

import pytest
from PIL import Image, ImageDraw

from lowvram_gen import GenerationRequest
from lowvram_gen.a1111.api_body import map_body
from lowvram_gen.api.state import ApiState
from lowvram_gen.cli.main import build_parser, _request_fields
from lowvram_gen.engines.sd import pipeline as sd_pipeline
from lowvram_gen.errors import InvalidRequest
from lowvram_gen.img2img_steps import (PassSteps, diffusers_count, job_steps, pass_steps, pipeline_counts,
                                       strength_for)
from lowvram_gen.session import Session

SIDE = 64


# ------------------------------------------------------------------------------------------------ the rule


@pytest.mark.parametrize("args, expected", [
    ((10, 0.5), PassSteps(10, 6)),  # img2img 10 at 0.5: t_enc 5, six steps from index 4
    ((20, 0.75), PassSteps(20, 16)),
    ((10, 1.0), PassSteps(10, 10)),  # 0.999 x 10 = 9.99: t_enc 9, the whole schedule
    ((10, 0.5, None, True), PassSteps(20, 10)),  # img2img_fix_steps: exactly the steps
    ((8, 0.3, 6), PassSteps(20, 6)),  # hires: 8 steps, Hires steps 6 at 0.3: 6 of int(6 / 0.3) = 20
    ((20, 0.7, 20), PassSteps(28, 20)),  # hires at A1111's defaults: 20 of 28 (we ran 14)
    ((15, 0.3, 15), PassSteps(50, 15)),  # "Hires steps 15, denoise 0.3" (we ran 4)
    ((20, 1.0, 20), PassSteps(20, 20)),  # int(20 / 0.999) = 20
    ((20, 0.01, 20), PassSteps(1000, 20)),  # int(20 / 0.01) = 2000 steps: cut to the model's 1000 timesteps
    ((10, 0.0), PassSteps(10, 0)),  # 0 keeps the init: nothing runs
])
def test_the_counts_are_a1111s(args, expected):
    assert pass_steps(*args) == expected


def _flow_count(schedule: int, strength: float) -> int:
    """The flow-matching img2img pipelines' rule (SD3, Flux, Qwen-Image, Z-Image): t_start = int(N - N * strength)."""
    return schedule - int(max(schedule - min(schedule * strength, schedule), 0))


@pytest.mark.parametrize("counts", [diffusers_count, _flow_count])
def test_the_strength_runs_exactly_the_count_under_either_rounding(counts):
    """22 x (15 / 22) is 14.999999999999998: the strength is the float next to run / schedule where the pipeline's
    rounding needs it, for every count of every schedule up to 160 steps."""
    for schedule in range(1, 161):
        for run in range(1, schedule + 1):
            assert counts(schedule, strength_for(run, schedule, counts)) == run, (schedule, run)
    assert diffusers_count(22, 15 / 22) == 14  # what handing run / schedule would have run


def test_the_pipelines_own_rule_is_asked():
    """SD's img2img floors N x strength, Flux's floors N - N x strength: a strength for one misses the other."""
    import diffusers

    sd = pipeline_counts(object.__new__(diffusers.StableDiffusionImg2ImgPipeline))
    flux = pipeline_counts(object.__new__(diffusers.FluxImg2ImgPipeline))
    assert sd(22, strength_for(15, 22, sd)) == 15 and flux(22, strength_for(15, 22, flux)) == 15
    assert flux(22, strength_for(15, 22, sd)) != 15  # one float cannot do both here
    assert pipeline_counts(object()) is None  # no get_timesteps: a pipeline that takes no strength


def test_the_job_counts_the_steps_that_run():
    """What the planner spreads a job's one-off transfers over: the steps its passes run."""
    def req(**kw):
        return GenerationRequest(**{"steps": 10, **kw}).validated()

    assert job_steps(req()) == 10
    assert job_steps(GenerationRequest(steps=10, init_image="x.png", strength=0.5)) == 6
    assert job_steps(GenerationRequest(steps=10, init_image="x.png", strength=0.5, img2img_fix_steps=True)) == 10
    assert job_steps(req(steps=8, hires_scale=2, hires_steps=6, hires_denoise=0.3)) == 14
    assert job_steps(req(steps=8, hires_scale=2, hires_steps=0, hires_denoise=0.3)) == 16


# ------------------------------------------------------------------------------------ the denoiser's calls


@pytest.fixture(scope="module")
def session():
    return Session(device="cpu")


@pytest.fixture()
def calls(monkeypatch):
    """Per pass: the timesteps the UNet was called with, and the pass's full schedule (the scheduler's timesteps
    for the schedule length handed to the pipeline, which the img2img pipeline slices)."""
    seen = []
    real = sd_pipeline.denoise

    def watch(pipe, step, *args, **kwargs):
        ts = []

        def record(module, positional, named):
            t = positional[1] if len(positional) > 1 else named["timestep"]
            ts.append(float(t.flatten()[0]) if hasattr(t, "flatten") else float(t))

        handle = pipe.unet.register_forward_pre_hook(record, with_kwargs=True)
        try:
            out = real(pipe, step, *args, **kwargs)
        finally:
            handle.remove()
        seen.append({"timesteps": ts, "schedule": [float(t) for t in pipe.scheduler.timesteps]})
        return out

    monkeypatch.setattr(sd_pipeline, "denoise", watch)
    return seen


@pytest.fixture(scope="module")
def images(tmp_path_factory):
    root = tmp_path_factory.mktemp("steps")
    init, mask = root / "init.png", root / "mask.png"
    Image.new("RGB", (SIDE, SIDE), (90, 140, 200)).save(init)
    drawn = Image.new("L", (SIDE, SIDE), 0)
    ImageDraw.Draw(drawn).rectangle((16, 16, 47, 47), fill=255)
    drawn.save(mask)
    return {"init": str(init), "mask": str(mask)}


def run(session, tmp_path, **fields):
    base = dict(prompt="a boat", width=SIDE, height=SIDE, seed=3, sampler="Euler", cfg_scale=1.0,
                outdir=str(tmp_path))
    return session.generate(GenerationRequest(**{**base, **fields}))


def _starts_at(seen: dict, schedule: int, run_steps: int) -> None:
    """The pass ran `run_steps` steps, the first at A1111's start index of a `schedule`-step schedule."""
    assert len(seen["schedule"]) == schedule
    assert len(seen["timesteps"]) == run_steps
    assert seen["timesteps"][0] == seen["schedule"][schedule - run_steps]


def test_img2img_runs_int_steps_x_denoise_plus_one(session, tmp_path, calls, images):
    run(session, tmp_path, steps=10, init_image=images["init"], strength=0.5)
    _starts_at(calls[-1], 10, 6)  # A1111: 6 (we ran 5)


def test_img2img_fix_steps_runs_exactly_the_steps(session, tmp_path, calls, images):
    run(session, tmp_path, steps=10, init_image=images["init"], strength=0.5, img2img_fix_steps=True)
    _starts_at(calls[-1], 20, 10)


def test_inpaint_runs_a1111s_count_too(session, tmp_path, calls, images):
    run(session, tmp_path, steps=10, init_image=images["init"], mask=images["mask"], mask_blur=0, strength=0.5)
    _starts_at(calls[-1], 10, 6)


def test_hires_runs_exactly_hires_steps(session, tmp_path, calls):
    """8 steps + Hires steps 6 at denoise 0.3 = 14 calls (we ran 8 + 1)."""
    run(session, tmp_path, steps=8, hires_scale=1.5, hires_steps=6, hires_denoise=0.3)
    assert sum(len(c["timesteps"]) for c in calls) == 14
    _starts_at(calls[-1], 20, 6)


def test_hires_steps_0_runs_steps(session, tmp_path, calls):
    run(session, tmp_path, steps=4, hires_scale=1.5, hires_steps=0, hires_denoise=0.5)
    assert [len(c["timesteps"]) for c in calls] == [4, 4]
    _starts_at(calls[-1], 8, 4)


# ------------------------------------------------------------------------- the option in every front end


def test_the_request_takes_it_as_a_bool_and_names_it():
    assert GenerationRequest(img2img_fix_steps="true").validated().img2img_fix_steps is True
    assert GenerationRequest.from_mapping({"img2img_fix_steps": 1}).img2img_fix_steps is True
    with pytest.raises(InvalidRequest, match="img2img fix steps"):
        GenerationRequest(img2img_fix_steps="sometimes").validated()


def test_the_cli_flag(tmp_path):
    parser = build_parser()
    args = parser.parse_args(["img2img", "x", "--init", "in.png", "--img2img-fix-steps"])
    assert _request_fields(args)[0]["img2img_fix_steps"] is True
    assert "img2img_fix_steps" not in _request_fields(parser.parse_args(["img2img", "x", "--init", "in.png"]))[0]
    assert parser.parse_args(["inpaint", "x", "--init", "a", "--mask", "b", "--img2img-fix-steps"]).img2img_fix_steps


def _body(tmp_path, body, fix_steps=False):
    init = tmp_path / "init.png"
    Image.new("RGB", (SIDE, SIDE)).save(init)
    return map_body(dict(prompt="x", steps=10, width=SIDE, height=SIDE, init_images=["<base64>"], **body), "img2img",
                    "tiny", 1, str(tmp_path), find_model=lambda title: None, init_image=lambda value, *w: str(init),
                    fix_steps=fix_steps)


def test_override_settings_and_the_api_options_set_it(tmp_path):
    assert _body(tmp_path, {}).request.img2img_fix_steps is False
    assert _body(tmp_path, {}, fix_steps=True).request.img2img_fix_steps is True  # the API's option
    one = _body(tmp_path, {"override_settings": {"img2img_fix_steps": True}})
    assert one.request.img2img_fix_steps is True and one.keep_settings == () and not one.warnings
    kept = _body(tmp_path, {"override_settings": {"img2img_fix_steps": True},
                            "override_settings_restore_afterwards": False})
    assert kept.keep_settings == ("img2img_fix_steps",)
    with pytest.raises(InvalidRequest, match="override_settings.img2img_fix_steps"):
        _body(tmp_path, {"override_settings": {"img2img_fix_steps": "maybe"}})
    state = ApiState(model="tiny", outdir=str(tmp_path))
    assert state.options()["img2img_fix_steps"] is False
    assert state.set_options({"img2img_fix_steps": True}) == []
    assert state.options()["img2img_fix_steps"] is True and state.fix_steps() is True
    state.keep({"img2img_fix_steps": False})  # what a job's override_settings not restored does
    assert state.fix_steps() is False


def test_a1111_writes_nothing_of_it_and_neither_do_we(session, tmp_path, images):
    from lowvram_gen.outputs import read_png_metadata

    made = run(session, tmp_path, steps=2, init_image=images["init"], strength=0.5, img2img_fix_steps=True)
    text = read_png_metadata(made.images[0])[0]
    assert "fix" not in text.lower() and "exact" not in text.lower()


def test_a_batch_line_takes_it(tmp_path):
    from lowvram_gen.batch.files import expand, read_entries

    Image.new("RGB", (SIDE, SIDE)).save(tmp_path / "a.png")
    path = tmp_path / "jobs.jsonl"
    line = '{"prompt": "x", "init_image": "%s"%s}\n'
    path.write_text(line % (tmp_path / "a.png", ', "img2img_fix_steps": true') + line % (tmp_path / "a.png", ""))
    jobs = expand(read_entries(path), {})
    assert not jobs.bad and [j.request.img2img_fix_steps for j in jobs.jobs] == [True, False]
    assert jobs.jobs[0].request_hash != jobs.jobs[1].request_hash  # another job, resumed apart


def test_the_ui_has_a_checkbox_for_it_in_img2img_and_inpaint(tmp_path):
    """Under Denoising strength, off as A1111's setting is; the tabs' Generate takes it before the resize mode (and
    img2img's Tiling, the refiner's two and the Script controls, and Styles, added after both) and the ControlNet
    units (older positional API calls keep working)."""
    from lowvram_gen.ui import controlnet
    from lowvram_gen.ui.app import build_app
    from lowvram_gen.ui.context import UiOptions

    app = build_app(Session(outdir=str(tmp_path)), UiOptions(outdir=str(tmp_path)))
    by_name = {f.api_name: f for f in app.fns.values()}
    from lowvram_gen.ui import xyz

    # img2img: the resize mode, Tiling, Styles, the refiner's two and the Script controls (X/Y/Z, Loopback, SD upscale) after it
    for name, elem, later in (("img2img", "i2i-fix-steps", 5 + len(xyz.inputs("img2img"))), ("inpaint", "inp-fix-steps", 2)):
        inputs = by_name[name].inputs
        # the resize mode after it (img2img: and Tiling), Styles, (img2img:) the refiner's checkpoint and switch
        box = inputs[len(inputs) - len(controlnet.KEYS) - 1 - later]
        assert (box.elem_id, box.value) == (elem, False)
