"""Embedded tiny models: Stable-Diffusion-shaped pipelines with seeded random weights.

They are built on first use and saved as ordinary diffusers folders in the user cache, so they go
through exactly the same loading code as real models. Their output is abstract noise: they exist
so the app runs out of the box and the tests run offline in seconds.

The VAE has four levels (scale factor 8, as in real SD): with two, a 512 px image would give a
256x256 latent and a CPU step would take ~18 s instead of ~0.1 s.

`tiny-controlnet` is a ControlNet for `tiny`, built the same way (from tiny's UNet, seeded), so the ControlNet
accordion and `--controlnet` can be tried offline: models/controlnet.py lists it beside the files of
models/ControlNet and builds it on first use.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import struct
import tempfile
from pathlib import Path

from lowvram_gen import safe_json
from lowvram_gen.models.quiet import quiet_hub_bars
from lowvram_gen.paths import home, models_dir, writable_folder

log = logging.getLogger(__name__)
MARKER = "LOWVRAM_GEN_TINY.json"
# Bump when a builder changes, so old caches are rebuilt instead of silently reused.
VERSION = 1
TINY_MODELS = ("tiny", "tiny-sdxl")
TINY_CONTROLNET = "tiny-controlnet"  # the embedded ControlNet, for `tiny`


def tiny_path(name: str) -> Path:
    return models_dir() / f"{name}-v{VERSION}"


def ensure_tiny(name: str) -> Path:
    """The folder of embedded model `name`, built (atomically) if it is not in the cache yet."""
    if name not in (*TINY_MODELS, TINY_CONTROLNET):
        raise ValueError(f"unknown embedded model {name!r}; embedded models: {', '.join(TINY_MODELS)}")
    target = tiny_path(name)
    index = "config.json" if name == TINY_CONTROLNET else "model_index.json"  # a model's folder, not a pipeline's
    if (target / index).is_file():
        damage = _damage(target)
        if not damage:
            return target
        log.warning("the cached %s model in %s is damaged (%s): building it again", name, target, damage)
        shutil.rmtree(target, ignore_errors=True)
    writable_folder(home(), "LOWVRAM_GEN_HOME (lowvram-gen's own files)")
    writable_folder(target.parent, "the models folder of LOWVRAM_GEN_HOME")
    quiet_hub_bars()
    tmp = Path(tempfile.mkdtemp(prefix=f".{name}-", dir=target.parent))
    try:
        build = {"tiny": build_tiny_sd, "tiny-sdxl": build_tiny_sdxl, TINY_CONTROLNET: build_tiny_controlnet}[name]
        build().save_pretrained(tmp, safe_serialization=True)
        (tmp / MARKER).write_text(
            json.dumps({"name": name, "version": VERSION, "note": "random weights: output is noise"})
        )
        try:
            os.rename(tmp, target)  # atomic; another process may have won the race, which is fine
        except OSError:
            if not (target / index).is_file():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target


def _damage(folder: Path) -> str:
    """What is wrong with a cached tiny model ('' when nothing): the marker of a finished build missing, or a
    safetensors file whose header does not parse or whose size is not what its header says (truncated,
    overwritten). Reads the headers only."""
    if not (folder / MARKER).is_file():
        return f"no {MARKER}"
    for file in sorted(folder.rglob("*.safetensors")):
        try:
            with open(file, "rb") as f:
                (length,) = struct.unpack("<Q", f.read(8))
                header = safe_json.loads(f.read(length), max_bytes=length)  # a ValueError when too deep
            end = max((v["data_offsets"][1] for k, v in header.items() if k != "__metadata__"), default=0)
            if file.stat().st_size != 8 + length + end:
                return f"{file.relative_to(folder)} is {file.stat().st_size} bytes, its header says {8 + length + end}"
        except (OSError, ValueError, KeyError, TypeError, struct.error) as exc:
            return f"{file.relative_to(folder)} is not a safetensors file ({type(exc).__name__})"
    return ""


def _tokenizer():
    """A CLIP tokenizer built offline: byte-level characters as the vocabulary, no merges."""
    from tokenizers.pre_tokenizers import ByteLevel
    from transformers import CLIPTokenizer

    chars = sorted(ByteLevel.alphabet())  # the 256 byte-level characters
    vocab = {c: i for i, c in enumerate(chars)}
    vocab.update({c + "</w>": i + len(chars) for i, c in enumerate(chars)})
    vocab["<|startoftext|>"] = len(vocab)
    vocab["<|endoftext|>"] = len(vocab)
    return CLIPTokenizer(vocab=vocab, merges=[], model_max_length=77)


def _text_encoder(projection: bool, hidden: int = 32, seed: int = 0):
    import torch
    from transformers import CLIPTextConfig, CLIPTextModel, CLIPTextModelWithProjection

    config = CLIPTextConfig(
        vocab_size=1000,
        hidden_size=hidden,
        intermediate_size=hidden * 2,
        num_hidden_layers=2,
        num_attention_heads=2,
        max_position_embeddings=77,
        projection_dim=hidden,
        bos_token_id=512,  # ids of <|startoftext|> and <|endoftext|> in the tokenizer above
        eos_token_id=513,
        pad_token_id=513,
        hidden_act="gelu",
    )
    torch.manual_seed(seed)
    return (CLIPTextModelWithProjection if projection else CLIPTextModel)(config)


def _vae(seed: int = 0):
    import torch
    from diffusers import AutoencoderKL

    torch.manual_seed(seed)
    return AutoencoderKL(
        block_out_channels=(8, 16, 32, 32),  # four levels: latent = image / 8, as in SD
        in_channels=3,
        out_channels=3,
        down_block_types=("DownEncoderBlock2D",) * 4,
        up_block_types=("UpDecoderBlock2D",) * 4,
        latent_channels=4,
        layers_per_block=1,
        norm_num_groups=8,
        sample_size=128,
    )


def build_tiny_sd():
    """SD 1.x shape: UNet with cross-attention, 4-level VAE, one CLIP text encoder."""
    import torch
    from diffusers import PNDMScheduler, StableDiffusionPipeline, UNet2DConditionModel

    torch.manual_seed(0)
    unet = UNet2DConditionModel(
        block_out_channels=(32, 64),
        layers_per_block=1,
        sample_size=64,
        in_channels=4,
        out_channels=4,
        # attention only at the lower resolution keeps a 512 px step fast on a CPU
        down_block_types=("DownBlock2D", "CrossAttnDownBlock2D"),
        up_block_types=("CrossAttnUpBlock2D", "UpBlock2D"),
        cross_attention_dim=32,
        attention_head_dim=8,
        norm_num_groups=8,
    )
    scheduler = PNDMScheduler(  # SD 1.5's own default scheduler and settings
        beta_start=0.00085, beta_end=0.012, beta_schedule="scaled_linear",
        num_train_timesteps=1000, skip_prk_steps=True, set_alpha_to_one=False, steps_offset=1,
    )
    return StableDiffusionPipeline(
        unet=unet, vae=_vae(), text_encoder=_text_encoder(False), tokenizer=_tokenizer(),
        scheduler=scheduler, safety_checker=None, feature_extractor=None, requires_safety_checker=False,
    )


def build_tiny_sdxl():
    """SDXL shape: two text encoders (the second with projection), added time/size conditioning."""
    import torch
    from diffusers import EulerDiscreteScheduler, StableDiffusionXLPipeline, UNet2DConditionModel

    torch.manual_seed(0)
    unet = UNet2DConditionModel(
        block_out_channels=(32, 64),
        layers_per_block=1,
        sample_size=128,
        in_channels=4,
        out_channels=4,
        down_block_types=("DownBlock2D", "CrossAttnDownBlock2D"),
        up_block_types=("CrossAttnUpBlock2D", "UpBlock2D"),
        attention_head_dim=(2, 4),
        use_linear_projection=True,
        addition_embed_type="text_time",
        addition_time_embed_dim=8,
        transformer_layers_per_block=(1, 2),
        projection_class_embeddings_input_dim=80,  # 6 * 8 (time ids) + 32 (pooled text embeds)
        cross_attention_dim=64,  # both encoders' hidden states concatenated: 32 + 32
        norm_num_groups=8,
    )
    scheduler = EulerDiscreteScheduler(  # SDXL base's own default scheduler and settings
        beta_start=0.00085, beta_end=0.012, beta_schedule="scaled_linear", num_train_timesteps=1000,
        steps_offset=1, timestep_spacing="leading", interpolation_type="linear", prediction_type="epsilon",
    )
    return StableDiffusionXLPipeline(
        unet=unet, vae=_vae(), text_encoder=_text_encoder(False, seed=1), text_encoder_2=_text_encoder(True, seed=2),
        tokenizer=_tokenizer(), tokenizer_2=_tokenizer(), scheduler=scheduler, force_zeros_for_empty_prompt=True,
    )


def build_tiny_controlnet():
    """A ControlNet for `tiny`: diffusers' `ControlNetModel.from_unet` of tiny's UNet (built first if need be), seeded
    (`seeded_controlnet`)."""
    from diffusers import UNet2DConditionModel

    return seeded_controlnet(UNet2DConditionModel.from_pretrained(ensure_tiny("tiny"), subfolder="unet"), seed=1)


def seeded_controlnet(unet, seed: int = 0, scale: float = 0.05):
    """diffusers' `ControlNetModel.from_unet(unet)` made with torch seeded by `seed` (its conditioning embedding is
    drawn, not copied), and seeded random values in its zero convolutions (the residual outputs and the conditioning
    embedding's last conv), which `from_unet` leaves at zero: a ControlNet that is all zeros there adds nothing, so
    a wrong one (or none) would not show in the image."""
    import torch
    from diffusers import ControlNetModel

    torch.manual_seed(seed)
    controlnet = ControlNetModel.from_unet(unet)
    zero = ("controlnet_down_blocks", "controlnet_mid_block", "controlnet_cond_embedding.conv_out")
    with torch.no_grad():
        for name, param in controlnet.named_parameters():
            if name.startswith(zero):
                param.copy_(torch.randn(param.shape) * scale)
    return controlnet.eval()
