"""Test utility: tiny seeded ControlNets for the issue-30 families' tiny folders, in the shapes diffusers' own tests
use (tests/pipelines/qwenimage/test_qwenimage_controlnet.py, tests/pipelines/sana/test_sana_controlnet.py; Z-Image's
at its tiny transformer's shapes), each at the width of its family's tiny transformer (tests/tiny_qwen.py,
tests/tiny_zimage.py, tests/tiny_dit.py).

diffusers zero-initialises a ControlNet's output projections (a fresh ControlNet adds nothing); here every weight is
seeded random so a control image changes the picture, as a trained one does. Seeded random weights: the images are
noise.
"""

from __future__ import annotations

import torch


def _randomised(module, seed: int, scale: float = 0.3):
    """Every parameter of `module` drawn from a seeded normal (the zero-initialised projections included)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for _name, param in sorted(module.named_parameters()):
            param.copy_(torch.randn(param.shape, generator=g) * scale)
    return module.eval()


def tiny_qwen_controlnet(seed: int = 0):
    """A QwenImageControlNetModel for tests/tiny_qwen.build_tiny_qwen_image() (3 heads of 16, two blocks)."""
    from diffusers import QwenImageControlNetModel

    return _randomised(QwenImageControlNetModel(
        patch_size=2, in_channels=16, out_channels=4, num_layers=2, attention_head_dim=16, num_attention_heads=3,
        joint_attention_dim=16, axes_dims_rope=(8, 4, 4)), seed)


def tiny_sana_controlnet(seed: int = 0):
    """A SanaControlNetModel for tests/tiny_dit.build_tiny_sana() (2 heads of 4, one block)."""
    from diffusers import SanaControlNetModel

    return _randomised(SanaControlNetModel(
        patch_size=1, in_channels=4, out_channels=4, num_layers=1, num_attention_heads=2, attention_head_dim=4,
        num_cross_attention_heads=2, cross_attention_head_dim=4, cross_attention_dim=8, caption_channels=8,
        sample_size=16), seed, scale=0.2)


def tiny_zimage_controlnet(seed: int = 0):
    """A ZImageControlNetModel for tests/tiny_zimage.build_tiny_zimage() (2 heads, 32 wide): control layers at both
    transformer layers and one control refiner, reading the control image's 16 latent channels. Its embedders and
    refiners are the transformer's (diffusers' from_transformer, as its pipeline is built): not in its files."""
    from diffusers import ZImageControlNetModel

    return _randomised(ZImageControlNetModel(
        control_layers_places=[0, 1], control_refiner_layers_places=[0], control_in_dim=16, all_patch_size=(2,),
        all_f_patch_size=(1,), dim=32, n_refiner_layers=1, n_heads=2, n_kv_heads=2, norm_eps=1e-5, qk_norm=True),
        seed, scale=0.2)


def tiny_sana_two_blocks():
    """tests/tiny_dit.build_tiny_sana() with a transformer of two blocks: SANA's transformer adds the ControlNet's
    i-th output after its block i+1 (diffusers' SanaTransformer2DModel), so a one-block transformer ignores it."""
    from diffusers import SanaTransformer2DModel
    from tiny_dit import build_tiny_sana

    pipe = build_tiny_sana()
    torch.manual_seed(0)
    pipe.register_modules(transformer=SanaTransformer2DModel(**{**dict(pipe.transformer.config), "num_layers": 2}).eval())
    return pipe


BUILDERS = {"qwen-image": tiny_qwen_controlnet, "z-image": tiny_zimage_controlnet, "sana": tiny_sana_controlnet}
