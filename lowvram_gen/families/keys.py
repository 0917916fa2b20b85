"""What an original-layout file's keys say about its family: the small predicates the records' `SingleFile`
hold (a whole checkpoint's keys, or a GGUF denoiser's with the UNet prefix added). Each takes the file's
{key: shape} (or any collection of its keys).

SD3 and FLUX.1 are told by diffusers' own marker keys (single_file_utils.CHECKPOINT_KEY_NAMES, read when asked
so they follow its releases); SD 1.x/2.x and SDXL by their UNet, VAE and text encoder prefixes.
"""

from __future__ import annotations

from functools import lru_cache

UNET, VAE_PREFIXES = "model.diffusion_model.", ("first_stage_model.", "vae.")
CLIP_SD, OPENCLIP_SD2 = "cond_stage_model.transformer.", "cond_stage_model.model."
CLIP_XL, OPENCLIP_XL = "conditioner.embedders.0.transformer.", "conditioner.embedders.1.model."
# SDXL's UNet alone has the "text_time" addition embedding (label_emb); SD 1.x/2.x's has none
SDXL_UNET_MARKER = UNET + "label_emb.0.0.weight"
# SD 2.x: 1024-wide cross-attention (diffusers' own "v2" marker); SD 1.x's is 768 wide
SD2_CROSS_ATTENTION = UNET + "input_blocks.2.1.transformer_blocks.0.attn2.to_k.weight"


@lru_cache(maxsize=1)
def diffusers_markers() -> dict[str, tuple[str, ...]]:
    """SD3 / FLUX.1 marker keys, taken from diffusers so they follow its releases."""
    try:
        from diffusers.loaders.single_file_utils import CHECKPOINT_KEY_NAMES as names
    except ImportError:  # pragma: no cover - diffusers is a dependency
        names = {}

    def get(name):
        v = names.get(name, [])
        return [v] if isinstance(v, str) else list(v)

    return {"sd3": tuple(get("sd3") + get("sd35_large")), "flux": tuple(get("flux")),
            "not_flux1": tuple(get("flux2") + get("flux3") + get("chroma"))}


def _has(keys, *prefixes: str) -> bool:
    return any(k.startswith(prefixes) for k in keys)


def sd3_file(keys) -> bool:
    return any(k in keys for k in diffusers_markers()["sd3"])


def flux1_file(keys) -> bool:
    markers = diffusers_markers()
    return any(k in keys for k in markers["flux"]) and not any(k in keys for k in markers["not_flux1"])


def has_unet(keys) -> bool:
    return _has(keys, UNET + "input_blocks.") and _has(keys, UNET + "output_blocks.")


def sdxl_file(keys) -> bool:
    """A whole SDXL checkpoint: UNet, VAE and both text encoders."""
    return has_unet(keys) and _has(keys, *VAE_PREFIXES) and _has(keys, CLIP_XL) and _has(keys, OPENCLIP_XL)


def sd_file(keys) -> bool:
    """A whole SD 1.x/2.x checkpoint: UNet, VAE and a CLIP (1.x) or OpenCLIP (2.x) text encoder."""
    return has_unet(keys) and _has(keys, *VAE_PREFIXES) and _has(keys, CLIP_SD, OPENCLIP_SD2)


def sdxl_unet(keys) -> bool:
    return has_unet(keys) and SDXL_UNET_MARKER in keys


def sd_unet(keys) -> bool:
    return has_unet(keys) and SDXL_UNET_MARKER not in keys


def cross_attention_width(shapes: dict) -> int:
    """The width of an SD UNet's cross-attention (768 SD 1.x, 1024 SD 2.x) from a file's shapes; 0 when absent."""
    shape = shapes.get(SD2_CROSS_ATTENTION)
    return int(shape[-1]) if shape else 0
