"""Issue 31: UniPC's img2img/inpaint/hires pass as A1111 runs it (its timestep samplers' img2img rule: t_enc UNet
calls from one training step below the level the init is noised to, tests/ksampling_ref_unipc.py) and A1111's
uni_pc_* settings (variant, skip type, order, lower order final) on the tiny SD 1.x and SDXL models."""

from __future__ import annotations

import numpy as np
import pytest
from PIL import Image

from lowvram_gen import GenerationRequest
from lowvram_gen.a1111 import unipc_time
from lowvram_gen.session import Session

import ksampling_ref_unipc as ref

PROMPT = "a lighthouse"


@pytest.fixture(scope="module")
def session():
    return Session()


@pytest.fixture
def unet_times(monkeypatch) -> list:
    """The timestep of every UNet call (the app's and the references'), recorded at the class."""
    from diffusers import UNet2DConditionModel

    times, forward = [], UNet2DConditionModel.forward

    def recorded(self, sample, timestep, *args, **kwargs):
        times.append(float(timestep.reshape(-1)[0]) if hasattr(timestep, "reshape") else float(timestep))
        return forward(self, sample, timestep, *args, **kwargs)

    monkeypatch.setattr(UNet2DConditionModel, "forward", recorded)
    return times


_PIPES: dict = {}


def pipeline(folder):
    from diffusers import AutoPipelineForText2Image

    if str(folder) not in _PIPES:
        _PIPES[str(folder)] = AutoPipelineForText2Image.from_pretrained(str(folder))
    return _PIPES[str(folder)]


def init_image(tmp_path):
    path = tmp_path / "init.png"
    gradient = np.linspace(0, 255, 64 * 64 * 3).reshape(64, 64, 3).astype(np.uint8)
    Image.fromarray(gradient).save(path)
    return str(path)


def made(session, tmp_path, folder, times, cfg=7.0, **fields):
    times.clear()
    result = session.generate(GenerationRequest(prompt=PROMPT, model=str(folder), outdir=str(tmp_path), width=64,
                                                height=64, cfg_scale=cfg, seed=5, batch_size=2, sampler="UniPC",
                                                **fields))
    return [np.asarray(Image.open(p).convert("RGB")).astype(int) for p in result.images], list(times)


def close(got, want) -> bool:
    return all(np.abs(a - b).max() <= 2 for a, b in zip(got, want))


@pytest.mark.parametrize("model, steps, calls", [("tiny_path", 6, 3), ("tiny_path", 10, 5), ("tiny_sdxl_path", 6, 3)])
def test_img2img_runs_a1111s_calls_and_image(session, tmp_path, request, unet_times, posterior_mode, model, steps,
                                             calls):
    """d = 0.5: t_enc = int(0.5 * steps) UNet calls (6: 3, where the slice of the txt2img times made 5)."""
    folder = request.getfixturevalue(model)
    init = init_image(tmp_path)
    unet_times.clear()
    want, ref_calls = ref.img2img(pipeline(folder), init, [5, 6], PROMPT, steps, 0.5)
    got, app = made(session, tmp_path, folder, unet_times, steps=steps, init_image=init, strength=0.5)
    t_enc, _, t_start = ref.img2img_rule(steps, 0.5)
    assert ref_calls == len(app) == calls == t_enc
    assert app[0] == pytest.approx((t_start - 1e-3) * 1000, abs=1e-3)  # one training step below the noise's level
    assert close(got, want)
    assert np.abs(got[0] - got[1]).max() > 10  # two seeds, two images: the comparison can fail


def test_img2img_fix_steps_runs_the_steps_less_one(session, tmp_path, tiny_path, unet_times, posterior_mode):
    """img2img_fix_steps (and any explicit count n): a schedule of int(n / d), t_enc = n - 1 calls."""
    init = init_image(tmp_path)
    want, ref_calls = ref.img2img(pipeline(tiny_path), init, [5, 6], PROMPT, 4, 0.5, fix=True)
    got, app = made(session, tmp_path, tiny_path, unet_times, steps=4, init_image=init, strength=0.5,
                    img2img_fix_steps=True)
    assert ref_calls == len(app) == 3
    assert close(got, want)


def test_inpaint_runs_a1111s_calls_from_a1111s_time(session, tmp_path, tiny_path, unet_times, posterior_mode):
    """Inpaint 6 at 0.5 (the tiny SD 1.x model: a 4-channel UNet, the init blended back each step): 3 calls at the
    reference's times."""
    init = init_image(tmp_path)
    mask = np.zeros((64, 64), dtype=np.uint8)
    mask[16:48, 16:48] = 255
    Image.fromarray(mask).save(tmp_path / "mask.png")
    _, app = made(session, tmp_path, tiny_path, unet_times, steps=6, init_image=init, strength=0.5,
                  mask=str(tmp_path / "mask.png"))
    vp = ref.VP(pipeline(tiny_path).scheduler.alphas_cumprod.double().numpy())
    t_enc, _, t_start = ref.img2img_rule(6, 0.5)
    assert app == pytest.approx([(t - 1e-3) * 1000 for t in vp.times("time_uniform", t_start, t_enc)[:-1]], abs=1e-3)


@pytest.mark.parametrize("model", ["tiny_path", "tiny_sdxl_path"])
def test_hires_second_pass_runs_a1111s_times(session, tmp_path, request, unet_times, model):
    """Hires steps 6 at 0.5: a schedule of 12, t_enc = 5 calls from ts[4] = 333 (+ the first pass's 4 for 3 steps)."""
    folder = request.getfixturevalue(model)
    _, app = made(session, tmp_path, folder, unet_times, steps=3, hires_scale=1.5, hires_steps=6, hires_denoise=0.5)
    vp = ref.VP(pipeline(folder).scheduler.alphas_cumprod.double().numpy())
    t_enc, _, t_start = ref.img2img_rule(3, 0.5, explicit=6)
    want = [(t - 1e-3) * 1000 for t in vp.times("time_uniform", t_start, t_enc)[:-1]]
    assert len(app) == 4 + 5 and t_enc == 5
    assert app[4:] == pytest.approx(want, abs=1e-3)


OPTIONS = [dict(variant="bh2"), dict(skip_type="time_quadratic"), dict(skip_type="logSNR"), dict(order=2),
           dict(lower_order_final=False)]


@pytest.mark.parametrize("option", OPTIONS, ids=lambda o: "-".join(f"{k}={v}" for k, v in o.items()))
def test_each_setting_changes_the_image_as_the_reference_does(session, tmp_path, tiny_path, unet_times, option):
    """txt2img 6 steps (7 calls: A1111's range(0, 1000, 166)) with one setting off its default; CFG 30, where the
    tiny model's images tell the settings apart by more than twice the comparison's tolerance."""
    pipe = pipeline(tiny_path)
    default, _ = ref.txt2img(pipe, [5, 6], PROMPT, 6, cfg=30.0)
    want, calls = ref.txt2img(pipe, [5, 6], PROMPT, 6, cfg=30.0, **option)
    fields = {f"unipc_{k}": v for k, v in option.items()}
    got, app = made(session, tmp_path, tiny_path, unet_times, cfg=30.0, steps=6, **fields)
    assert calls == len(app) == 7
    assert close(got, want)
    assert max(np.abs(a - b).max() for a, b in zip(want, default)) > 4  # the setting changes the image


def test_a_setting_changes_img2img_as_the_reference_does(session, tmp_path, tiny_path, unet_times, posterior_mode):
    """img2img 10 at 0.5 with time_quadratic: its own times, from the same start."""
    init = init_image(tmp_path)
    want, _ = ref.img2img(pipeline(tiny_path), init, [5, 6], PROMPT, 10, 0.5, skip_type="time_quadratic")
    got, app = made(session, tmp_path, tiny_path, unet_times, steps=10, init_image=init, strength=0.5,
                    unipc_skip_type="time_quadratic")
    vp = ref.VP(pipeline(tiny_path).scheduler.alphas_cumprod.double().numpy())
    t_enc, _, t_start = ref.img2img_rule(10, 0.5)
    assert app == pytest.approx([(t - 1e-3) * 1000 for t in vp.times("time_quadratic", t_start, t_enc)[:-1]],
                                abs=1e-3)
    assert close(got, want)


@pytest.mark.parametrize("skip_type", ["time_quadratic", "logSNR"])
def test_txt2img_skip_types_step_through_the_references_times(session, tmp_path, tiny_path, unet_times, skip_type):
    made(session, tmp_path, tiny_path, unet_times, steps=5, unipc_skip_type=skip_type)
    vp = ref.VP(pipeline(tiny_path).scheduler.alphas_cumprod.double().numpy())
    n = unipc_time.a1111_steps(5)
    assert unet_times == pytest.approx([(t - 1e-3) * 1000 for t in vp.times(skip_type, 1.0, n)[:-1]], abs=1e-3)
