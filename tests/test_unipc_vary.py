"""Issue 31: A1111's UniPC variant vary_coeff (the paper's varying-coefficient UniPC, lowvram_gen/a1111/unipc_vary.py)
against the reference written from the paper (tests/ksampling_ref_unipc.py's vary_coeff path) on the tiny SD 1.x and
SDXL models, at CFG 30 where the tiny models' images tell the variants apart; and its PNG label read back."""

from __future__ import annotations

import numpy as np
import pytest

from lowvram_gen import GenerationRequest
from lowvram_gen.a1111 import unipc_vary
from lowvram_gen.outputs import parse_a1111_parameters, read_png_metadata
from lowvram_gen.session import Session

import ksampling_ref_unipc as ref
from a1111_png import rerun_with_no_unused_note
from test_unipc_a1111 import PROMPT, close, init_image, made, pipeline, session, unet_times  # noqa: F401 (fixtures)


def differs(a, b) -> int:
    return max(np.abs(x - y).max() for x, y in zip(a, b))


@pytest.mark.parametrize("model, steps, option", [("tiny_path", 6, {}), ("tiny_sdxl_path", 5, {}),
                                                  ("tiny_path", 6, dict(order=2, lower_order_final=False))])
def test_txt2img_is_the_references_vary_coeff_and_not_bh1(session, tmp_path, request, unet_times, model, steps,
                                                          option):
    """vary_coeff's image is the reference's (within 2/255) and another than bh1's by more than twice that."""
    folder = request.getfixturevalue(model)
    pipe = pipeline(folder)
    want, calls = ref.txt2img(pipe, [5, 6], PROMPT, steps, cfg=30.0, variant="vary_coeff", **option)
    bh1, _ = ref.txt2img(pipe, [5, 6], PROMPT, steps, cfg=30.0, **option)
    fields = {f"unipc_{k}": v for k, v in option.items()}
    got, app = made(session, tmp_path, folder, unet_times, cfg=30.0, steps=steps, unipc_variant="vary_coeff",
                    **fields)
    assert calls == len(app) == len(range(0, 1000, 1000 // steps))
    assert close(got, want)
    assert differs(want, bh1) > 4 and differs(got, bh1) > 2  # the variant changes the image
    assert differs(got[:1], got[1:]) > 10  # two seeds, two images


def test_img2img_is_the_references_vary_coeff(session, tmp_path, tiny_path, unet_times, posterior_mode):
    """img2img 10 at 0.5: A1111's 5 calls from one training step below the init's level, with vary_coeff."""
    init = init_image(tmp_path)
    want, calls = ref.img2img(pipeline(tiny_path), init, [5, 6], PROMPT, 10, 0.5, cfg=30.0, variant="vary_coeff")
    bh1, _ = ref.img2img(pipeline(tiny_path), init, [5, 6], PROMPT, 10, 0.5, cfg=30.0)
    got, app = made(session, tmp_path, tiny_path, unet_times, cfg=30.0, steps=10, init_image=init, strength=0.5,
                    unipc_variant="vary_coeff")
    assert calls == len(app) == 5
    assert close(got, want)
    assert differs(want, bh1) > 4


def test_the_bound_updates_last_one_call():
    """The scheduler's own B(h) updates are back after a vary_coeff call (a bh1 call after it is bh1's)."""
    from diffusers import UniPCMultistepScheduler

    scheduler = UniPCMultistepScheduler()
    own = scheduler.multistep_uni_p_bh_update.__func__
    with unipc_vary.updates(scheduler, "vary_coeff"):
        assert scheduler.multistep_uni_p_bh_update.__func__ is unipc_vary.predictor
        assert scheduler.multistep_uni_c_bh_update.__func__ is unipc_vary.corrector
    assert scheduler.multistep_uni_p_bh_update.__func__ is own
    with unipc_vary.updates(scheduler, "bh2"):
        assert scheduler.multistep_uni_p_bh_update.__func__ is own


def test_the_request_takes_it_and_an_a1111_png_with_it_reruns_with_no_unused_note(tmp_path, capsys):
    assert GenerationRequest(unipc_variant="vary_coeff").validated().unipc_variant == "vary_coeff"
    text = ("a fox\nSteps: 2, Sampler: UniPC, CFG scale: 7, Seed: 5, Size: 64x64, Model: tiny, "
            "UniPC variant: vary_coeff")
    out = rerun_with_no_unused_note(text, (64, 64), tmp_path, capsys)
    written, ours = read_png_metadata(out["images"][0])
    assert parse_a1111_parameters(written)["UniPC variant"] == "vary_coeff"
    assert ours["request"]["unipc_variant"] == "vary_coeff"


def _fake_eps(denoiser, x, model_time):
    """A smooth made-up noise prediction of x and the UNet's time, for the float-level check (no model)."""
    import torch

    return torch.tanh(x * (1 + model_time / 1000.0)) * 0.7 + 0.1 * torch.sin(torch.as_tensor(model_time) / 90.0)


# (order 4 kept to the end, 8 steps, rounds float32 to ~5e-4 of 46 on its last step to t = 1/N: bh1's too)
@pytest.mark.parametrize("variant, steps, order, lower_order_final", [
    ("vary_coeff", 6, 3, True), ("vary_coeff", 8, 4, True), ("vary_coeff", 8, 3, False), ("vary_coeff", 5, 1, True),
    ("bh1", 8, 4, True)])  # order 4 on the app's order-3 class: its history list was sized at its init (IndexError)
def test_the_schedulers_steps_are_the_references_to_float_precision(monkeypatch, variant, steps, order,
                                                                    lower_order_final):
    """The handed-over scheduler's steps on a made-up model are the reference's within float32 rounding (finer than
    the images: a wrong row or phi in vary_coeff's corrector's last term moves these by far more), and another
    variant's are not."""
    import types

    import torch
    from diffusers import UniPCMultistepScheduler

    import ksampling_ref_singlestep
    from lowvram_gen.a1111 import unipc_time

    monkeypatch.setattr(ksampling_ref_singlestep, "eps", _fake_eps)
    scheduler = unipc_time.hand_over(UniPCMultistepScheduler(beta_start=0.00085, beta_end=0.012, solver_order=3,
                                                             beta_schedule="scaled_linear"))
    request = types.SimpleNamespace(unipc_variant=variant, unipc_order=order, unipc_skip_type="time_uniform",
                                    unipc_lower_order_final=lower_order_final)
    noise = torch.randn((2, 4, 8, 8), generator=torch.Generator().manual_seed(5))
    with unipc_time.options(scheduler, request):
        scheduler.set_timesteps(steps)
        x = noise * scheduler.init_noise_sigma
        for t in scheduler.timesteps:
            x = scheduler.step(_fake_eps(None, x, float(t)), t, x).prev_sample
    vp = ref.VP(scheduler.alphas_cumprod.double().numpy())
    times = vp.times("time_uniform", 1.0, unipc_time.a1111_steps(steps))
    want = ref.unipc(None, noise.double(), vp, times, variant=variant, order=order,
                     lower_order_final=lower_order_final)
    other = ref.unipc(None, noise.double(), vp, times, variant="bh1" if variant == "vary_coeff" else "vary_coeff",
                      order=order, lower_order_final=lower_order_final)
    assert torch.allclose(x.double(), want, rtol=1e-4, atol=1e-4), float((x.double() - want).abs().max())
    assert float((want - other).abs().max()) > 1e-2
