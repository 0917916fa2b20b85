"""The shapes a plan is made of, as `plan --json` names them (its "shapes" object): the denoiser's width and patch,
the image tokens at the job's size, the text tokens beside them, each text encoder (class, prompt length,
parameters, bytes) and the VAE. All of it comes from the profile (models/profile.py: the configs, no weights), so
`plan --model qwen-image --json` says what the estimate was made of, offline, and a test can hold each family's
numbers against its shipped configs.

No torch import: arithmetic over the profile.
"""

from __future__ import annotations

import math

from lowvram_gen.models.profile import TEXT_TOKENS, ModelProfile
from lowvram_gen.planning.estimate import DTYPE_BYTES, rendered_size, text_encoder_bytes


def image_tokens(profile: ModelProfile, width: int, height: int) -> int:
    """Image tokens one image puts through a transformer denoiser at width x height: its latent pixels in patches of
    `transformer_patch` (the pipeline's 2x2 packing included); 0 for a UNet. As the pipelines round: the latent side
    is the image side over the VAE's scale, the tokens its whole patches."""
    if profile.denoiser != "transformer":
        return 0
    width, height = rendered_size(profile, width, height)  # SANA's resolution bins: the bin's tokens
    sf, p = profile.vae_scale_factor, profile.transformer_patch
    return (height // sf // p) * (width // sf // p)


def model_shapes(profile: ModelProfile, width: int, height: int, dtype: str = "bfloat16",
                 quantize: str = "none", video=None) -> dict:
    """What the estimate of `profile` at width x height was made of, in plain numbers (bytes at `dtype`, with
    `quantize` int8/int4 where the plan's pick stores its weights so). `video`: a clip's planning/video.VideoJob
    (`Plan.video`): its frames, latent frames and tokens, and `tokens` is then the clip's per forward."""
    den = profile.denoiser
    tokens = profile.text_tokens or (TEXT_TOKENS,) * len(profile.text_encoders)
    encoders = [{"name": name, "class": profile.classes.get(name, ""), "tokens": int(t),
                 "hidden": int(h), "layers": int(layers), "params": int(profile.params.get(name, 0)),
                 "bytes": text_encoder_bytes(profile, name, dtype, quantize),
                 "file_bytes": int(profile.file_bytes.get(name, 0))}
                for name, t, h, layers in zip(profile.text_encoders, tokens, profile.text_hidden, profile.text_layers)]
    transformer = den == "transformer"
    sf = profile.vae_scale_factor
    rendered = rendered_size(profile, width, height)
    clip = {"video": video.as_dict()} if video is not None else {}
    return {
        **clip,
        "dtype": dtype, "quantize": quantize,  # what the bytes below are counted at (the plan's pick)
        "denoiser": den, "denoiser_class": profile.denoiser_class,
        "denoiser_params": int(profile.params.get(den, 0)),
        "denoiser_bytes": int(profile.params.get(den, 0)) * DTYPE_BYTES[dtype],
        # transformer: hidden width and the edge in latent pixels one image token covers; a UNet: its widest level
        "width": int(profile.transformer_hidden if transformer else max(profile.unet_channels, default=0)),
        "patch": int(profile.transformer_patch if transformer else 1),
        "latent": [math.ceil(rendered[1] / sf), math.ceil(rendered[0] / sf)],
        "tokens": video.tokens if video is not None else image_tokens(profile, width, height),
        "text_tokens": int(profile.joint_text_tokens),  # carried beside the image tokens (joint attention)
        "cfg_batch": bool(profile.cfg_batch),
        "text_encoders": encoders,
        "vae": {"class": profile.classes.get("vae", ""), "params": int(profile.params.get("vae", 0)),
                "scale_factor": int(sf), "latent_channels": int(profile.latent_channels)},
    }


def shape_lines(shapes: dict) -> list[str]:
    """What `plan` prints of `model_shapes`: the denoiser's shape and tokens, then one line per text encoder."""
    from lowvram_gen.hardware.device import format_size

    den = shapes["denoiser_class"] or shapes["denoiser"]
    if shapes["denoiser"] == "transformer":
        text = f" + {shapes['text_tokens']} text" if shapes["text_tokens"] else ""
        head = (f"shapes: {den} {shapes['denoiser_params'] / 1e9:.2f} B, width {shapes['width']}, patch "
                f"{shapes['patch']}: {shapes['tokens']} image tokens{text}")
    else:
        head = f"shapes: {den} {shapes['denoiser_params'] / 1e9:.2f} B, latent {shapes['latent'][0]}x{shapes['latent'][1]}"
    if shapes.get("video"):
        from lowvram_gen.planning.video import describe

        head = head.replace(" image tokens", " tokens") + "\n" + describe(shapes["video"])
    return [*head.split("\n")] + [f"  {e['name']}: {e['class'] or '?'}, {e['tokens']} tokens, {e['params'] / 1e9:.2f} B "
                     f"({format_size(e['bytes'])})" for e in shapes["text_encoders"]]
