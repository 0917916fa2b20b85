"""The init image's latents as A1111 takes them: the VAE posterior's mode, with no draw from the images' generators.

diffusers' img2img and inpaint pipelines sample the VAE posterior with each image's generator, so the seed's noise is
that generator's second draw. A1111 samples the posterior with its unseeded global RNG (the real VAEs' posterior
spread is ~1e-3 of their latents, so that sample is its mean to within float16) and takes the seed's noise as each
image's first draw. Given the mode, diffusers' pipelines draw their noise first too, so the same seed noises the
image as A1111 does (img2img, inpaint, the hires pass, ControlNet img2img; every family's own pipeline). The masked
image an inpainting model is conditioned on is encoded the same way.
"""

from __future__ import annotations

import contextlib


class Mode:
    """A posterior standing in for the VAE's: `sample` gives its mode and leaves the generator as it was."""

    def __init__(self, dist):
        self.dist = dist

    def __getattr__(self, name):  # mean, std, ... as the posterior has them
        if name == "dist":  # a copy made without __init__ (copy, pickle) has none: no recursion
            raise AttributeError(name)
        return getattr(self.dist, name)

    def mode(self):
        return self.dist.mode()

    def sample(self, generator=None):  # no draw: the generator keeps its state for the noise
        return self.mode()


def moded(out, posterior=Mode):
    """The VAE's encode output with its posterior replaced by `posterior` (`Mode` or a subclass of it; one already
    replaced is kept). An output without a posterior, e.g. SANA's deep-compression autoencoder's latents, is
    deterministic already and passes as it is."""
    def replaced(dist):
        return dist if isinstance(dist, Mode) else posterior(dist)

    if isinstance(out, tuple):
        return (replaced(out[0]),) + tuple(out[1:]) if out and hasattr(out[0], "mode") else out
    if hasattr(out, "latent_dist"):
        out.latent_dist = replaced(out.latent_dist)
    return out


@contextlib.contextmanager
def mode_only(pipe):
    """Inside the block, `pipe`'s VAE encodes to the posterior's mode (set on the instance for the block, then as
    it was; the VAE object is shared with the other pipelines over the same components)."""
    from unittest import mock

    vae = getattr(pipe, "vae", None)
    if vae is None:
        yield
        return
    encode = vae.encode

    def encode_mode(*args, **kwargs):
        return moded(encode(*args, **kwargs))

    with mock.patch.object(vae, "encode", encode_mode):
        yield
