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
            "not_flux1": tuple(get("flux2") + get("flux3") + get("chroma")),
            "flux2": tuple(get("flux2")), "flux3": tuple(get("flux3")), "chroma": tuple(get("chroma")),
            "z-image": tuple(get("z-image-turbo")), "lumina2": tuple(get("lumina2")), "sana": tuple(get("sana")),
            "qwen-image-2.1": tuple(get("qwen-image-2.1")),
            # HiDream's marker has no prefixed form in diffusers; Comfy-Org's files may carry ComfyUI's prefix
            "hidream": tuple(get("hidream") + [UNET + k for k in get("hidream")]),
            "controlnet": tuple(get("z-image-turbo-controlnet") + get("z-image-turbo-controlnet-2.x"))}


def _has(keys, *prefixes: str) -> bool:
    return any(k.startswith(prefixes) for k in keys)


def sd3_file(keys) -> bool:
    return any(k in keys for k in diffusers_markers()["sd3"])


def flux1_file(keys) -> bool:
    markers = diffusers_markers()
    return any(k in keys for k in markers["flux"]) and not any(k in keys for k in markers["not_flux1"])


# ----------------------------------- a 2026 family's transformer alone (ComfyUI's diffusion_models/, city96's GGUF)
# Told by diffusers' own marker keys (with or without ComfyUI's `model.diffusion_model.` prefix), in the order
# diffusers' infer_diffusers_model_type tries them: Z-Image's layers share Lumina 2's caption embedder, so Lumina 2
# is "not Z-Image". Qwen-Image has no marker there (its files are in diffusers' own names): its embedders and first
# block.
QWEN_IMAGE_KEYS = ("img_in.weight", "txt_norm.weight", "transformer_blocks.0.img_mod.1.weight")


def _marked(keys, name: str) -> bool:
    return any(k in keys for k in diffusers_markers()[name])


def zimage_transformer(keys) -> bool:
    return _marked(keys, "z-image") and not _marked(keys, "controlnet")


def lumina2_transformer(keys) -> bool:
    return _marked(keys, "lumina2") and not _marked(keys, "z-image")


def flux2_transformer(keys) -> bool:
    return _marked(keys, "flux2") and not _marked(keys, "flux3")


# Flux.2 dev and Klein share the transformer class and diffusers' marker. dev is guidance-distilled: it alone has the
# guidance embedder (`guidance_in`, its config's guidance_embeds; Klein 4B/9B and their base models have none); Klein
# 9B is 4096 wide (img_in: 32 heads x 128), Klein 4B 3072. The real widths: dev 6144, 8 + 48 blocks; Klein 4B 5 + 20,
# Klein 9B 8 + 24 (configs/flux2-*/transformer/config.json).
FLUX2_GUIDANCE = ("guidance_in.", UNET + "guidance_in.")
KLEIN_9B_WIDTH = 4096


def _width(shapes, key: str) -> int:
    """The output width of `key` (with or without ComfyUI's prefix) where `shapes` maps keys to shapes; 0 else."""
    get = getattr(shapes, "get", None)
    shape = (get(key) or get(UNET + key)) if get else None
    return int(shape[0]) if shape else 0


def flux2_dev_transformer(keys) -> bool:
    return flux2_transformer(keys) and _has(keys, *FLUX2_GUIDANCE)


def _klein(keys) -> bool:
    return flux2_transformer(keys) and not _has(keys, *FLUX2_GUIDANCE)


def flux2_klein_transformer(keys) -> bool:
    """Klein 4B (and any Klein-layout file not 9B's width: the tiny test files)."""
    return _klein(keys) and _width(keys, "img_in.weight") != KLEIN_9B_WIDTH


def flux2_klein_9b_transformer(keys) -> bool:
    return _klein(keys) and _width(keys, "img_in.weight") == KLEIN_9B_WIDTH


# Which variant a transformer file is, and which one a components folder's transformer config is, named alike (the
# records' `SingleFile.file_variant` / `config_variant`): variants of one family whose transformers differ in shape
def klein_file_variant(shapes) -> str:
    return "Flux.2 Klein 9B" if _width(shapes, "img_in.weight") == KLEIN_9B_WIDTH else "Flux.2 Klein 4B"


def klein_config_variant(config) -> str:
    width = int(config.get("num_attention_heads", 0)) * int(config.get("attention_head_dim", 0))
    return "Flux.2 Klein 9B" if width == KLEIN_9B_WIDTH else "Flux.2 Klein 4B"


def flux1_file_variant(shapes) -> str:
    return "FLUX.1 dev" if flux1_variant(shapes) == "flux-dev" else "FLUX.1 schnell"


def flux1_config_variant(config) -> str:
    return "FLUX.1 dev" if config.get("guidance_embeds") else "FLUX.1 schnell"  # diffusers' default: False


def hidream_transformer(keys) -> bool:
    return _marked(keys, "hidream")


def chroma_transformer(keys) -> bool:
    return _marked(keys, "chroma")


def sana_transformer(keys) -> bool:
    return _marked(keys, "sana")


def qwen_image_transformer(keys) -> bool:
    return (all(k in keys or UNET + k in keys for k in QWEN_IMAGE_KEYS) and not _marked(keys, "qwen-image-2.1"))


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


# ------------------------------------------------------------------ variants (the shipped config folder a file needs)
# Which of the shipped configs (lowvram_gen/configs, models/offline_configs.py) fits a file, from its {key: shape}.

T5_XXL = "text_encoders.t5xxl."  # SD3 / FLUX.1 all-in-one files (ComfyUI's layout): T5-XXL's weights
OPENCLIP_XL_REFINER = "conditioner.embedders.0.model."  # the refiner's only text encoder: OpenCLIP-G at embedders.0
# ComfyUI's (and Forge's) SD 2.x v-prediction test reads this one small tensor (320 values); a "v_pred" key (ComfyUI
# saves one) says it outright
SD2_V_STATISTIC = UNET + "output_blocks.11.1.transformer_blocks.0.norm1.bias"


def sdxl_refiner_file(keys) -> bool:
    """An SDXL refiner: UNet, VAE and OpenCLIP-G alone, at conditioner.embedders.0 (no CLIP-L)."""
    return (has_unet(keys) and _has(keys, *VAE_PREFIXES) and _has(keys, OPENCLIP_XL_REFINER)
            and not _has(keys, "conditioner.embedders.1."))


def sd_variant(shapes, read=None) -> str:
    """'sd15', 'sd2-v' or 'sd2-eps' for a whole SD 1.x/2.x file. SD 2.x's eps and v models have the same keys and
    shapes: a 'v_pred' key decides, else ComfyUI's test on one tensor (`read(key)` gives its values; an inpainting
    UNet, 9 inputs, is eps), else eps as ComfyUI and Forge assume."""
    if not (cross_attention_width(shapes) == 1024 or _has(shapes, OPENCLIP_SD2)):
        return "sd15"
    if "v_pred" in shapes:
        return "sd2-v"
    inputs = tuple(shapes.get(UNET + "input_blocks.0.0.weight", (0, 4)))[1]
    if inputs == 4 and read is not None and SD2_V_STATISTIC in shapes:
        import torch

        values = read(SD2_V_STATISTIC).float()
        if float(torch.std(values, unbiased=False)) > 0.09:
            return "sd2-v"
    return "sd2-eps"


def sdxl_variant(shapes, read=None) -> str:
    """'sdxl' (base) or 'sdxl-refiner'."""
    return "sdxl-refiner" if sdxl_refiner_file(shapes) else "sdxl"


def sd3_variant(shapes, read=None) -> str:
    """'sd3' (3 medium), 'sd35-medium' (MMDiT-X: a second attention, attn2, in its first blocks) or 'sd35-large'
    (38 blocks; q/k norms and no attn2). diffusers tells them by real widths; these keys hold at any width."""
    blocks = ("joint_blocks.", UNET + "joint_blocks.")
    if any(k.startswith(blocks) and ".x_block.attn2." in k for k in shapes):
        return "sd35-medium"
    if any(k.startswith(tuple(p + "37." for p in blocks)) or (k.startswith(blocks) and ".attn.ln_q." in k)
           for k in shapes):
        return "sd35-large"
    return "sd3"


def flux1_variant(shapes, read=None) -> str:
    """'flux-dev' (guidance-distilled: a guidance embedder, guidance_in) or 'flux-schnell' (none), as diffusers."""
    return "flux-dev" if _has(shapes, "guidance_in.", UNET + "guidance_in.") else "flux-schnell"
