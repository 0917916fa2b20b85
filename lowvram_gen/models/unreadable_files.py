"""Files as ComfyUI keeps them that diffusers and transformers cannot read, refused in one sentence saying what to
give instead: weights in ComfyUI's scaled fp8 format (a `scaled_fp8` marker key, a `*.scale_weight` beside each
weight: ComfyUI multiplies them back at compute; diffusers would load the raw fp8 values unscaled), and a text
encoder on its own (ComfyUI's text_encoders/ or clip/ folder) given where a model or a components folder is wanted.
"""

from __future__ import annotations

from pathlib import Path
from typing import Iterable

from lowvram_gen.errors import ModelLoadError

SCALED_FP8_MARKER = "scaled_fp8"
SCALE_SUFFIXES = (".scale_weight", ".scale_input")
# where the weights of the text encoders ComfyUI users download sit, with or without a wrapper prefix: Qwen2.5-VL /
# Qwen3 / Gemma / Llama (model.layers), T5 (encoder.block), CLIP (text_model.encoder, transformer.resblocks)
TEXT_ENCODER_PARTS = ("model.layers.0.self_attn.", "model.embed_tokens.", "language_model.model.",
                      "encoder.block.0.layer.0.", "text_model.encoder.", "transformer.resblocks.0.")
INSTEAD = ("give the diffusers folder of the same model instead (--components FOLDER for a transformer file's text "
           "encoders and VAE), or its fp16/bf16 or GGUF file")


def scaled_fp8(keys: Iterable[str]) -> bool:
    return any(k == SCALED_FP8_MARKER or k.endswith(SCALE_SUFFIXES) for k in keys)


def text_encoder(keys: Iterable[str]) -> bool:
    """Only a text encoder's weights: a language model's or T5's / CLIP's layers, and no image model's."""
    keys = list(keys)
    image = ("model.diffusion_model.", "double_blocks.", "transformer_blocks.", "layers.0.adaLN_modulation.",
             "first_stage_model.", "decoder.", "blocks.0.cross_attn.")
    return (any(part in k for k in keys for part in TEXT_ENCODER_PARTS)
            and not any(k.startswith(image) or "lora" in k.lower() for k in keys))


def refuse(path, keys: Iterable[str]) -> None:
    """A ModelLoadError of one sentence for a file no loader of ours or diffusers' can read as a model."""
    keys = list(keys)
    name = Path(path).name
    encoder = text_encoder(keys)
    if scaled_fp8(keys):
        what = "text encoder" if encoder else "model"
        raise ModelLoadError(f"{name} is a {what} saved in ComfyUI's scaled fp8 format ('scaled_fp8' / *.scale_weight "
                             f"keys), which diffusers and transformers cannot read: {INSTEAD}")
    if encoder:
        raise ModelLoadError(f"{name} is a text encoder on its own (ComfyUI's text_encoders/ or clip/ folder), not an "
                             "image model: give the transformer or checkpoint file as --model and the diffusers folder "
                             "of its family, which holds the text encoders, as --components FOLDER")


def refuse_file_as_folder(option: str, value: str) -> None:
    """A file given where a diffusers folder is wanted (--components / --config), refused in one sentence."""
    path = Path(value).expanduser()
    if path.is_file():
        raise ModelLoadError(f"{option} {value} is a file, but it takes a diffusers folder (model_index.json beside "
                             "text_encoder/, vae/, ...) or a hub id: ComfyUI's text_encoders/, clip/ and vae/ files "
                             "cannot stand in for one, give the diffusers folder (or hub id) of the same model")
