"""What the keys of an original-layout checkpoint say it is: the pipeline classes, diffusers' marker keys
for SD3 and Flux, and a guess at a file that is none of them. Shared by checkpoint.py (safetensors and
pickles) and gguf_file.py (GGUF denoisers), so that neither imports the other.
"""

from __future__ import annotations

SD, SDXL, SD3, FLUX = "StableDiffusionPipeline", "StableDiffusionXLPipeline", "StableDiffusion3Pipeline", "FluxPipeline"


def _diffusers_markers() -> dict[str, list[str]]:
    """SD3 / Flux marker keys, taken from diffusers so they follow its releases."""
    try:
        from diffusers.loaders.single_file_utils import CHECKPOINT_KEY_NAMES as names
    except ImportError:  # pragma: no cover - diffusers is a dependency
        names = {}

    def get(name):
        v = names.get(name, [])
        return [v] if isinstance(v, str) else list(v)

    return {"sd3": get("sd3") + get("sd35_large"), "flux": get("flux"),
            "not_flux1": get("flux2") + get("flux3") + get("chroma")}


def _layout_hint(keys: list[str]) -> str:
    """A short guess at what the file is, for the error message."""
    if any("lora" in k.lower() for k in keys[:2000]):
        return " (it looks like a LoRA: it needs a base model and is not a model on its own)"
    top = {k.split(".", 1)[0] for k in keys}
    if top & {"down_blocks", "up_blocks", "mid_block", "unet", "text_encoder", "transformer"}:
        return " (it looks like diffusers-layout weights: load the whole diffusers folder instead)"
    if top <= {"encoder", "decoder", "quant_conv", "post_quant_conv"}:
        return " (it looks like a VAE on its own)"
    if top <= {"string_to_param", "string_to_token", "emb_params", "name", "step", "clip_l", "clip_g"}:
        return " (it looks like a textual-inversion embedding)"
    return ""
