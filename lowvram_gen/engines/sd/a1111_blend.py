"""A1111's inpaint blend on a UNet inpaint pipeline (SD 1.x/2.x, SDXL; 4- and 9-channel UNets, their ControlNet
inpaint pipelines), in place of diffusers' own.

A1111 (modules/processing.py, sd_samplers_cfg_denoiser.py) keeps the area outside the mask by blending with the
CLEAN init latents (as latent noise / latent nothing made them), never the latents the sampler carries:

* its k-diffusion samplers (Euler, DPM++ 2M, ... and our ksamplers): each model call's denoised estimate, after
  CFG, becomes `denoised * nmask + init * mask` (nmask: the latent mask, mask: 1 - it);
* its timestep samplers (DDIM, PLMS, UniPC: its CFGDenoiserTimesteps sets mask_before_denoising) instead blend the
  x the model is given, `x * nmask + init * mask`, before the call, and take its prediction as it is;
* after the last step, `samples * nmask + init * mask`.

for both kinds of UNet. diffusers blends a 4-channel UNet's latents after each step with the init latents noised to
the next step's level, and does not blend a 9-channel UNet's at all.

One mechanism, on the pipeline's scheduler for the pass (`blend`): its `scale_model_input` records the scale of the
model's input at the call's level (and blends that input for a timestep sampler); its `step` is given the model
output whose denoised estimate is the blended one, so whatever the sampler does with it (Euler's slope, DPM++ 2M's
history, Heun's two calls, DDIM's and PLMS's alphas, our k-diffusion generators) it works from A1111's estimate:
the estimate is linear in the model output at the call's level (epsilon, v or sample prediction; sigma-scaled
samplers, whose input is x / sqrt(sigma^2 + 1), and variance-preserving ones, alpha_t x0 + sigma_t eps). After the
pass's last step its latents are blended with the clean init. The pipeline's own blend is kept out by giving a
4-channel UNet's loop a mask of ones (engines/sd/inpaint.latent_mask).
"""

from __future__ import annotations

import contextlib
import functools

# A1111's samplers that run through its timesteps denoiser, which blends the model's input (sd_samplers_timesteps.py)
INPUT_BLEND = {"DDIM", "PLMS", "UniPC"}


def _level(scheduler, scale, timestep):
    """(alpha, sigma) of the call as x_vp = alpha x0 + sigma eps, x_vp being the model's input: from the input's
    scale where the scheduler scales it (sigma-form samplers: x / sqrt(sigma^2 + 1)), else from the scheduler's
    own levels (DPM-Solver's sigmas, or alphas_cumprod at the timestep)."""
    import torch

    if scale is not None:
        return scale, (1 - scale ** 2) ** 0.5
    if hasattr(scheduler, "_sigma_to_alpha_sigma_t") and getattr(scheduler, "sigmas", None) is not None:
        if scheduler.step_index is None:  # as the scheduler's own step starts
            scheduler._init_step_index(timestep)
        alpha, sigma = scheduler._sigma_to_alpha_sigma_t(scheduler.sigmas[scheduler.step_index])
        return float(alpha), float(sigma)
    t = int(timestep.item() if isinstance(timestep, torch.Tensor) else timestep)
    a = float(scheduler.alphas_cumprod[t])
    return a ** 0.5, (1 - a) ** 0.5


def blended_output(output, sample, scale: float, alpha: float, sigma: float, prediction: str, init, keep):
    """The model output whose denoised estimate at the call's level is A1111's blend of `output`'s: `keep` (1 - the
    latent mask) of it the clean `init`. `sample` is the scheduler's x, `scale` * x the model's input."""
    x = sample.float() * scale
    out = output.float()
    if prediction == "epsilon":
        denoised = (x - sigma * out) / alpha
    elif prediction == "v_prediction":
        denoised = alpha * x - sigma * out
    else:  # "sample": the estimate itself
        denoised = out
    blended = denoised + (init - denoised) * keep
    if prediction == "epsilon":
        made = (x - alpha * blended) / sigma
    elif prediction == "v_prediction":
        made = (alpha * x - blended) / sigma
    else:
        made = blended
    return made.to(output.dtype)


def _batch(tensor, like):
    """`tensor` repeated to the batch of `like` (the model's input is doubled for classifier-free guidance)."""
    return tensor.repeat(like.shape[0] // tensor.shape[0], *([1] * (tensor.ndim - 1))) if like.shape[0] != \
        tensor.shape[0] else tensor


@contextlib.contextmanager
def blend(pipe, weights_of, input_blend: bool):
    """A1111's blend (the module's docstring) on `pipe`'s inpaint pass: `weights_of(latents)` gives the latent mask
    (1 to repaint) for the init latents; `input_blend`: a timestep sampler's (the model's input blended)."""
    from unittest import mock

    import torch

    scheduler = pipe.scheduler
    state = {"init": None, "nmask": None, "scale": None, "calls": 0, "done": False}
    prepare, scale_input, step = pipe.prepare_latents, scheduler.scale_model_input, scheduler.step

    @functools.wraps(prepare)
    def preparing(*args, **kwargs):
        asked = kwargs.get("return_image_latents", False)
        made = prepare(*args, **{**kwargs, "return_image_latents": True})  # the init latents, also for 9 channels
        state["init"] = made[-1].float()
        state["nmask"] = weights_of(made[-1]).float()
        return made if asked else made[:-1]

    @functools.wraps(scale_input)
    def scaling(sample, *args, **kwargs):
        scaled = scale_input(sample, *args, **kwargs)
        if scaled is sample:
            state["scale"] = None
        else:  # x / sqrt(sigma^2 + 1): the ratio, in float64 over the whole batch
            s, y = sample.double(), scaled.double()
            state["scale"] = float((s * y).sum() / (s * s).sum())
        if input_blend and state["init"] is not None:
            init, nmask = _batch(state["init"], scaled), _batch(state["nmask"], scaled)
            scaled = (scaled.float() * nmask + init * (1 - nmask)).to(scaled.dtype)
        return scaled

    @functools.wraps(step)
    def stepping(model_output, timestep, sample, *args, **kwargs):
        if state["init"] is not None and not input_blend and not state["done"]:
            alpha, sigma = _level(scheduler, state["scale"], timestep)
            model_output = blended_output(model_output, sample, 1.0 if state["scale"] is None else state["scale"],
                                          alpha, sigma, scheduler.config.prediction_type, state["init"],
                                          1 - state["nmask"])
        out = step(model_output, timestep, sample, *args, **kwargs)
        state["calls"] += 1
        last = state["calls"] >= getattr(pipe, "_num_timesteps", 0) or getattr(scheduler, "finished", False)
        if state["init"] is None or state["done"] or not last:
            return out
        state["done"] = True  # the pass's end: A1111's blend of the samples with the clean init
        prev = out[0] if isinstance(out, tuple) else out.prev_sample
        with torch.no_grad():
            made = (prev.float() * state["nmask"] + state["init"] * (1 - state["nmask"])).to(prev.dtype)
        if isinstance(out, tuple):
            return (made,) + tuple(out[1:])
        out.prev_sample = made
        return out

    with mock.patch.object(pipe, "prepare_latents", preparing), \
            mock.patch.object(scheduler, "scale_model_input", scaling), mock.patch.object(scheduler, "step", stepping):
        yield
