"""Test utility: tiny seeded video pipelines built offline (issue 33), in the shapes diffusers' own tests use
(tests/pipelines/wan/test_wan.py, test_wan_22.py, test_wan_image_to_video.py, tests/pipelines/ltx/test_ltx.py:
their get_dummy_components), saved as ordinary diffusers folders by `save`.

- Wan 2.1 T2V / I2V: WanTransformer3DModel (patch (1, 2, 2), 2 heads of 12), AutoencoderKLWan (16 latent channels,
  8x spatial and 4x temporal compression), umT5 (UMT5EncoderModel, as the published models; diffusers' tests use
  T5EncoderModel of the same shape). The I2V one has 36 input channels (16 noise + 16 image latents + 4 mask) and a
  CLIP vision encoder.
- Wan 2.2 TI2V 5B: the Wan 2.2 VAE (48 channels, 16x spatial), `expand_timesteps` (a timestep per token); its
  image-to-video is WanImageToVideoPipeline on the same components (no image encoder).
- Wan 2.2 A14B: two experts, `transformer` (high noise) and `transformer_2` (low noise) switched at
  `boundary_ratio` (0.875 T2V, 0.9 I2V), each seeded apart so their outputs differ.
- LTX-Video: LTXVideoTransformer3DModel over AutoencoderKLLTXVideo (8 latent channels here), T5.

The tokenizer is tests/tiny_transformers.t5_tokenizer() (offline). Seeded random weights: the frames are noise.
"""

from __future__ import annotations

from pathlib import Path

from tiny_transformers import t5_tokenizer

TEXT_DIM = 32
# what each builder makes, by name (the folders `save` writes and the tests ask for)
KINDS = ("wan21", "wan21-i2v", "wan22-ti2v", "wan22-a14b", "wan22-a14b-i2v", "ltx", "ltx-i2v")


def _umt5(tokenizer, seed: int = 3):
    import torch
    from transformers import UMT5Config, UMT5EncoderModel

    torch.manual_seed(seed)
    return UMT5EncoderModel(UMT5Config(
        vocab_size=len(tokenizer), d_model=TEXT_DIM, d_kv=8, d_ff=37, num_layers=2, num_heads=4,
        relative_attention_num_buckets=8, feed_forward_proj="gated-gelu", pad_token_id=0, eos_token_id=1,
        decoder_start_token_id=0)).eval()


def _t5(tokenizer, seed: int = 3):
    import torch
    from transformers import T5Config, T5EncoderModel

    torch.manual_seed(seed)
    return T5EncoderModel(T5Config(
        vocab_size=len(tokenizer), d_model=TEXT_DIM, d_kv=8, d_ff=37, num_layers=2, num_heads=4,
        relative_attention_num_buckets=8, feed_forward_proj="gated-gelu", pad_token_id=0, eos_token_id=1,
        decoder_start_token_id=0)).eval()


def _wan_transformer(in_channels: int = 16, out_channels: int = 16, seed: int = 0, image_dim: int | None = None,
                     wide: bool = False):
    """`wide`: 4 heads of 32 (128) and a 256-wide MLP instead of 2 of 12 (24) and 32, which sdnq's int8 skips as too
    narrow to quantize."""
    import torch
    from diffusers import WanTransformer3DModel

    torch.manual_seed(seed)
    return WanTransformer3DModel(
        patch_size=(1, 2, 2), num_attention_heads=4 if wide else 2, attention_head_dim=32 if wide else 12,
        in_channels=in_channels, out_channels=out_channels, text_dim=TEXT_DIM, freq_dim=256,
        ffn_dim=256 if wide else 32, num_layers=2, cross_attn_norm=True, qk_norm="rms_norm_across_heads",
        rope_max_seq_len=32, image_dim=image_dim)


def _wan21_vae():
    import torch
    from diffusers import AutoencoderKLWan

    torch.manual_seed(0)
    return AutoencoderKLWan(base_dim=3, z_dim=16, dim_mult=[1, 1, 1, 1], num_res_blocks=1,
                            temperal_downsample=[False, True, True])


def _wan22_vae():
    import torch
    from diffusers import AutoencoderKLWan

    torch.manual_seed(0)
    return AutoencoderKLWan(base_dim=3, z_dim=48, in_channels=12, out_channels=12, is_residual=True, patch_size=2,
                            latents_mean=[0.0] * 48, latents_std=[1.0] * 48, dim_mult=[1, 1, 1, 1], num_res_blocks=1,
                            scale_factor_spatial=16, scale_factor_temporal=4, temperal_downsample=[False, True, True])


def _flow_scheduler(shift: float):
    from diffusers import UniPCMultistepScheduler

    # the published Wan folders' scheduler: UniPC in flow mode (Wan 2.1 480p: flow_shift 3.0; 720p 5.0)
    return UniPCMultistepScheduler(prediction_type="flow_prediction", use_flow_sigmas=True, flow_shift=shift,
                                   num_train_timesteps=1000)


def build_wan21(wide: bool = False):
    from diffusers import WanPipeline

    tokenizer = t5_tokenizer()
    return WanPipeline(transformer=_wan_transformer(wide=wide), vae=_wan21_vae(), scheduler=_flow_scheduler(3.0),
                       text_encoder=_umt5(tokenizer), tokenizer=tokenizer)


def build_wan21_i2v():
    import torch
    from diffusers import WanImageToVideoPipeline
    from transformers import CLIPImageProcessor, CLIPVisionConfig, CLIPVisionModel

    tokenizer = t5_tokenizer()
    torch.manual_seed(0)
    image_encoder = CLIPVisionModel(CLIPVisionConfig(hidden_size=4, projection_dim=4, num_hidden_layers=2,
                                                     num_attention_heads=2, image_size=32, intermediate_size=16,
                                                     patch_size=1)).eval()
    return WanImageToVideoPipeline(
        transformer=_wan_transformer(in_channels=36, image_dim=4), vae=_wan21_vae(), scheduler=_flow_scheduler(3.0),
        text_encoder=_umt5(tokenizer), tokenizer=tokenizer, image_encoder=image_encoder,
        image_processor=CLIPImageProcessor(crop_size=32, size=32))


def build_wan22_ti2v(image: bool = False):
    from diffusers import WanImageToVideoPipeline, WanPipeline

    tokenizer = t5_tokenizer()
    parts = dict(transformer=_wan_transformer(48, 48), vae=_wan22_vae(), scheduler=_flow_scheduler(5.0),
                 text_encoder=_umt5(tokenizer), tokenizer=tokenizer, expand_timesteps=True)
    if image:
        return WanImageToVideoPipeline(**parts, image_encoder=None, image_processor=None)
    return WanPipeline(**parts)


def build_wan22_a14b(image: bool = False, wide: bool = False):
    from diffusers import WanImageToVideoPipeline, WanPipeline

    tokenizer = t5_tokenizer()
    channels = 36 if image else 16
    parts = dict(transformer=_wan_transformer(channels, 16, seed=0, wide=wide),
                 transformer_2=_wan_transformer(channels, 16, seed=1, wide=wide),
                 vae=_wan21_vae(), scheduler=_flow_scheduler(3.0), text_encoder=_umt5(tokenizer), tokenizer=tokenizer)
    if image:
        return WanImageToVideoPipeline(**parts, boundary_ratio=0.9, image_encoder=None, image_processor=None)
    return WanPipeline(**parts, boundary_ratio=0.875)


def build_ltx(image: bool = False):
    import torch
    from diffusers import (AutoencoderKLLTXVideo, FlowMatchEulerDiscreteScheduler, LTXImageToVideoPipeline,
                           LTXPipeline, LTXVideoTransformer3DModel)

    tokenizer = t5_tokenizer()
    torch.manual_seed(0)
    transformer = LTXVideoTransformer3DModel(in_channels=8, out_channels=8, patch_size=1, patch_size_t=1,
                                             num_attention_heads=4, attention_head_dim=8, cross_attention_dim=32,
                                             num_layers=1, caption_channels=TEXT_DIM)
    torch.manual_seed(0)
    vae = AutoencoderKLLTXVideo(latent_channels=8, block_out_channels=(8, 8, 8, 8),
                                spatio_temporal_scaling=(True, True, False, False), layers_per_block=(1, 1, 1, 1, 1),
                                # the decoder's own sizes (diffusers' test leaves them at the real model's, 0.9 GB)
                                decoder_block_out_channels=(8, 8, 8, 8), decoder_layers_per_block=(1, 1, 1, 1, 1),
                                decoder_spatio_temporal_scaling=(True, True, False, False),
                                decoder_inject_noise=(False, False, False, False, False),
                                upsample_residual=(False, False, False, False), upsample_factor=(1, 1, 1, 1),
                                patch_size=1, patch_size_t=1, encoder_causal=True, decoder_causal=False)
    # LTX-Video's scheduler config (the published one: shift by sequence length)
    scheduler = FlowMatchEulerDiscreteScheduler(use_dynamic_shifting=True, base_shift=0.95, max_shift=2.05,
                                                base_image_seq_len=1024, max_image_seq_len=4096, shift_terminal=0.1)
    cls = LTXImageToVideoPipeline if image else LTXPipeline
    return cls(transformer=transformer, vae=vae, scheduler=scheduler, text_encoder=_t5(tokenizer), tokenizer=tokenizer)


BUILDERS = {
    "wan21": build_wan21, "wan21-i2v": build_wan21_i2v, "wan22-ti2v": build_wan22_ti2v,
    "wan22-a14b": build_wan22_a14b, "wan22-a14b-i2v": lambda: build_wan22_a14b(image=True),
    "ltx": build_ltx, "ltx-i2v": lambda: build_ltx(image=True),
    # transformers wide enough for int8 (tests/test_video_engine_memory.py); not among KINDS
    "wan21-wide": lambda: build_wan21(wide=True), "wan22-a14b-wide": lambda: build_wan22_a14b(wide=True),
}


def build(kind: str):
    """The tiny pipeline `kind` (one of KINDS), float32 on the CPU."""
    if kind not in BUILDERS:
        raise ValueError(f"tiny video kind {kind!r}: one of {', '.join(BUILDERS)}")
    return BUILDERS[kind]()


def save(kind: str, dest) -> Path:
    """`kind`'s pipeline saved as an ordinary diffusers folder at `dest` (safetensors), once; returns the folder."""
    dest = Path(dest)
    if not (dest / "model_index.json").exists():
        build(kind).save_pretrained(dest, safe_serialization=True)
    return dest


# -- plain diffusers, for the engine's tests (tests/test_video_engine*.py) ----------------------------------------


def plain_pipeline(folder, image: bool = False):
    """Plain diffusers' pipeline from `folder` (float32, CPU): the class its model_index names; with `image` on a
    text-to-video folder, the family's image-to-video class over its components as diffusers documents them (Wan 2.2
    TI2V: WanImageToVideoPipeline with expand_timesteps and no image encoder; LTX: LTXImageToVideoPipeline)."""
    import json

    import diffusers

    name = json.loads((Path(folder) / "model_index.json").read_text())["_class_name"]
    pipe = getattr(diffusers, name).from_pretrained(str(folder))
    if image and name == "WanPipeline":
        pipe = diffusers.WanImageToVideoPipeline(**pipe.components, image_encoder=None, image_processor=None,
                                                 expand_timesteps=pipe.config.expand_timesteps)
    elif image and name == "LTXPipeline":
        pipe = diffusers.LTXImageToVideoPipeline(**pipe.components)
    pipe.set_progress_bar_config(disable=True)
    return pipe


def plain_frames(pipe, seed: int, **kw):
    """The frames of plain diffusers' call as uint8 (F, H, W, 3): its "np" output, [0, 1], scaled and rounded."""
    import numpy as np
    import torch

    video = pipe(generator=torch.Generator().manual_seed(seed), output_type="np", **kw).frames[0]
    return (np.clip(video, 0.0, 1.0) * 255).round().astype(np.uint8)


def saved_frames(paths):
    """The PNG frames a job saved (save_frames) as uint8 (F, H, W, 3)."""
    import numpy as np
    from PIL import Image

    return np.stack([np.asarray(Image.open(p).convert("RGB")) for p in paths])
