"""Test utility: plain diffusers' ControlNets giving A1111's sd-webui-controlnet outputs, the reference for its soft
control modes.

Written from the extension's rule (its hook.py): output i (the down residuals, then the mid block's) times the unit's
weight x 0.825 ** (12 - i), zipped from the first output. Guess mode's own factors are left out: a pipeline's guess
mode then only runs the ControlNet on the conditional half, as "ControlNet is more important" does.
"""

from __future__ import annotations

import contextlib


@contextlib.contextmanager
def extension_forward():
    """diffusers' ControlNetModel.forward giving the extension's soft outputs while the block runs."""
    from diffusers import ControlNetModel

    from lowvram_gen.control.weights import soft_scales

    forward = ControlNetModel.forward

    def soft(self, *args, conditioning_scale=1.0, guess_mode=False, **kwargs):
        down, mid = forward(self, *args, conditioning_scale=1.0, **kwargs)
        outs = [r * (conditioning_scale * f) for r, f in zip([*down, mid], soft_scales(len(down) + 1))]
        return tuple(outs[:-1]), outs[-1]

    ControlNetModel.forward = soft
    try:
        yield
    finally:
        ControlNetModel.forward = forward
