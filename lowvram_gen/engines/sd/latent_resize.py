"""A1111's img2img resize mode "Just resize (latent upscale)" (API resize_mode 3) in any img2img pipeline.

A1111 encodes the init image at its own size and interpolates the encoded latents to the job's size (bilinear,
torch's interpolate without aligned corners) before the noise is added; the pixels are never resized. Here the
family's own img2img pipeline does the encoding, as it does for the other modes, with two things changed for the
one call: its image processor keeps the init image's own size (SD 1.x/SDXL's always do; SD3, FLUX.1, Qwen-Image
... resize it to the size they are given), and its VAE's encoding of that image gives the mode of the posterior,
interpolated to the job's latent size. The pipeline then scales, shifts or normalises the latents as it always does
(an affine map per channel, which bilinear interpolation commutes with) and draws its noise at the job's size: the
pass equals the plain pipeline given the interpolated latents as its image (tests/test_img2img_resize_modes.py).
The posterior's mode, not a sample, as `pipeline.encode` (strength 0, the hires pass) takes it: A1111 samples with
the global RNG, which no seed fixes.
"""

from __future__ import annotations

import contextlib
import inspect

from lowvram_gen.engines.sd import posterior


def interpolated(latents, height: int, width: int):
    """`latents` (..., h, w) at height x width, A1111's bilinear interpolation (in float32, then their dtype)."""
    import torch.nn.functional as F

    lead = latents.shape[:-2]
    flat = latents.reshape(1, -1, *latents.shape[-2:]).float()  # 4-D for interpolate; Qwen-Image's are 5-D
    out = F.interpolate(flat, size=(height, width), mode="bilinear")
    return out.reshape(*lead, height, width).to(latents.dtype)


class _Resized(posterior.Mode):
    """An encoded image's posterior standing in for the VAE's: its mode, interpolated, whether sampled or not (no
    draw, as `posterior.Mode`)."""

    def __init__(self, dist, size: tuple[int, int]):
        super().__init__(dist)
        self.size = size

    def mode(self):
        return interpolated(self.dist.mode(), *self.size)


@contextlib.contextmanager
def encoded_at_own_size(i2i, init: list, width: int, height: int):
    """Inside the block, `i2i`'s call given `image=init` (PIL images at their own size) starts from their latents
    interpolated to width x height. Only that image is changed: a control image the same processor and VAE handle
    (FLUX.1's ControlNet img2img) is the job's size already and passes as it did."""
    from unittest import mock  # patch.object: set on the instance for the call, then what it was

    processor, vae = i2i.image_processor, i2i.vae
    factor = int(i2i.vae_scale_factor)
    target = latent_size(i2i, width, height)
    preprocess = processor.preprocess
    signature = inspect.signature(preprocess)
    seen: dict = {}

    def own_size(*args, **kwargs):
        call = signature.bind(*args, **kwargs)
        if call.arguments.get("image") is not init:
            return preprocess(*args, **kwargs)
        call.arguments.update(height=None, width=None)  # its own size, rounded to the processor's multiple
        out = preprocess(*call.args, **call.kwargs)
        seen["size"] = tuple(out.shape[-2:])
        return out

    encode = vae.encode

    def encode_resized(x, *args, **kwargs):
        out = encode(x, *args, **kwargs)
        if seen.get("size") != tuple(x.shape[-2:]) or seen["size"] == (target[0] * factor, target[1] * factor):
            return out
        return posterior.moded(out, lambda dist: _Resized(dist, target))

    with mock.patch.object(processor, "preprocess", own_size), mock.patch.object(vae, "encode", encode_resized):
        yield


def latent_size(pipe, width: int, height: int) -> tuple[int, int]:
    """The latents' (height, width) of a width x height image."""
    factor = int(pipe.vae_scale_factor)  # pixels per latent
    return height // factor, width // factor
