"""A guess at what a file is when its keys are no model's we load (a LoRA, diffusers-layout weights, a VAE or an
embedding on its own), for the refusal's words. Shared by checkpoint.py (safetensors and pickles) and gguf_file.py
(GGUF denoisers), so that neither imports the other; which keys make which family is the family records' business
(lowvram_gen/families/keys.py).
"""

from __future__ import annotations


def layout_hint(keys: list[str]) -> str:
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
