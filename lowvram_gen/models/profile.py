"""The memory profile of a model, from its configs only (no weights are read): `ModelProfile`, what the
estimate (planning/estimate.py) needs, and the one place profiles are built.

    profile_builtin("sd15" | "sd21" | "sdxl" | "sd3" | "flux")   shipped configs (SD3 = SD3-medium,
                                                 flux = FLUX.1-dev), counts precomputed in calibration.json
    profile_from_folder(path)                    any local diffusers folder, counted on the meta device
    source_profile(source)                       a resolved model: its folder, or a single file's --config
                                                 folder or built-in base architecture
    with_vae(profile, name)                      with the job's VAE file (--vae) in place of the model's own

What is read from which config is the family's business: the record of the folder's pipeline class
(lowvram_gen/families) reads its transformer's shape and says its text encoders' prompt lengths, its joint
tokens and whether CFG doubles the batch. A single file gives the profile of its `--config` folder, or of its
built-in base architecture; a GGUF denoiser keeps its weights quantized, so they count at the bytes its file
stores, not at the dtype's size.

No torch import at module import time: torch, diffusers and transformers are imported inside the
functions that instantiate models on the meta device.
"""

from __future__ import annotations

import functools
import json
import math
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from lowvram_gen import families, safe_json
from lowvram_gen.errors import ModelLoadError
from lowvram_gen.models import gguf_file, transformer_file
from lowvram_gen.models.blocks import block_sizes, fixed_bytes, piece_tree
from lowvram_gen.models.counting import instantiate_meta, sdnq_kept, text_fp32_kept, text_quant_kept
from lowvram_gen.models.filedtype import half_dtype
from lowvram_gen.models.resolve import ModelSource
from lowvram_gen.models.checkpoint import check_config
from lowvram_gen.models.safe_files import safetensors_header

CONFIGS = Path(__file__).resolve().parents[1] / "configs"  # package data: lowvram_gen/configs
CALIBRATION_FILE = CONFIGS / "calibration.json"
DEFAULT_SIDE = 512  # `plan`'s side for a folder whose denoiser matches none of the built-in ones
# Token count of the CLIP text encoders (what the pipelines pad prompts to).
TEXT_TOKENS = 77


@dataclass(frozen=True)
class ModelProfile:
    """Everything the estimate needs about a model, taken from its configs."""

    arch: str  # 'sd15' | 'sd21' | 'sdxl' | 'sd3' | 'flux' | 'custom'
    params: dict[str, int]  # parameters per component: unet (or transformer), vae, text_encoder, ...
    denoiser: str = "unet"  # the component that runs every step: 'unet' or 'transformer'
    # UNet, one entry per resolution level (down path order)
    unet_channels: tuple[int, ...] = ()
    unet_attention: tuple[bool, ...] = ()  # level has transformer blocks
    unet_transformer_layers: tuple[int, ...] = ()
    unet_heads: tuple[int, ...] = ()
    unet_layers_per_block: int = 2
    unet_mid_attention: bool = True
    unet_upcast_attention: bool = False
    unet_ff_inner: int = 8  # GEGLU projection width per channel (2 x ff_mult 4)
    cross_attention_dim: int = 768
    # a transformer denoiser (SD3, PixArt, Flux ...): hidden width, and the edge in latent pixels of the
    # patch one image token covers (SD3: patch_size 2; Flux: patch_size 1 on latents the pipeline packs
    # 2x2 into 64 channels, so 2 as well)
    transformer_hidden: int = 0
    transformer_patch: int = 2
    # elements of the transformer's largest pointwise (1x1) convolution weight (SANA's GLUMBConv feed-forward, 2240 x
    # 11200): a copy of it is held during the forward beside the activations (estimate.unet_activation_bytes); 0: none
    pointwise_conv: int = 0
    joint_text_tokens: int = 0  # text tokens carried next to the image tokens (the family record's joint_tokens)
    # latent tokens an edit's reference images add next to the image tokens (engines/sd/edit.planned: the job's, not
    # the model's; 0 for any other job)
    reference_tokens: int = 0
    cfg_batch: bool = True  # CFG doubles the denoiser batch (not for guidance-distilled Flux)
    # (aspect ratio, height, width) of each bin the pipeline's resolution binning renders a job at (the family record's
    # resolution_bins: SANA's); (): the size asked
    resolution_bins: tuple[tuple[float, int, int], ...] = ()
    # VAE
    latent_channels: int = 4
    vae_scale_factor: int = 8
    vae_channels: tuple[int, ...] = (128, 256, 512, 512)
    vae_layers_per_block: int = 2
    vae_sample_size: int = 512  # diffusers' tile_sample_min_size
    vae_force_upcast: bool = False  # SDXL pipelines decode in float32 when the VAE is float16
    # text encoders: hidden width and layer count of each
    text_hidden: tuple[int, ...] = (768,)
    text_layers: tuple[int, ...] = (12,)
    text_tokens: tuple[int, ...] = ()  # prompt length of each (CLIP 77, T5 the pipeline's); () = 77 each
    # weight layout, for offload and fp8 storage (parameter counts)
    largest_layer: dict[str, int] = field(default_factory=dict)  # per component: largest leaf module
    denoiser_blocks: tuple[int, ...] = ()  # block-level group offload groups (ModuleList children)
    denoiser_unmatched: int = 0  # what group offload keeps loaded for the whole step
    fp8_kept: int = 0  # denoiser parameters layerwise casting leaves in the compute dtype
    # denoiser parameters sdnq leaves unquantized (int8/int4): biases, norms, embedders, small layers
    # (quantized_kept()); -1: not counted (an old stored profile), fp8_kept is used instead
    quant_kept: int = -1
    # per text encoder, the parameters sdnq leaves unquantized (text_quant_kept()): its embeddings, norms and
    # the layers the model keeps in float32 (T5's `wo`: 1.0 B of T5-XXL's 4.76 B). Empty: not counted (an
    # old stored profile), the token embedding (largest_layer) alone is taken
    text_quant_kept: dict[str, int] = field(default_factory=dict)
    # per text encoder, the parameters of the layers the model keeps in float32 (`_keep_in_fp32_modules`:
    # T5's `wo`); transformers loads them in float32 when the rest is float16 (text_fp32_kept())
    text_fp32_kept: dict[str, int] = field(default_factory=dict)
    # a GGUF denoiser: how many of its parameters are block-quantized, and their bytes as the file stores
    # them (they stay so; the rest follow the dtype). 0: an ordinary denoiser
    denoiser_quantized: int = 0
    denoiser_quantized_bytes: int = 0
    # partial residency (offload = "budget"): the denoiser's streamable blocks in execution order as
    # (name, elements), each followed by the finer pieces it may be cut into (models.blocks.piece_tree), and the
    # elements outside them (always resident); planning/residency.py
    residency_blocks: tuple[tuple[str, int], ...] = ()
    residency_fixed: int = 0
    # bytes of each component's weight files as the folder stores them (fp32, fp16 ...): what loading
    # reads; empty for the built-in profiles (the published checkpoints: 2 bytes a parameter)
    file_bytes: dict[str, int] = field(default_factory=dict)
    # the 16-bit dtype the denoiser's file stores ("float16" | "bfloat16", read from its safetensors header);
    # "" for the built-in profiles (the published checkpoints: bfloat16 for FLUX.1, float16 for the rest)
    file_dtype: str = ""
    # ControlNets counted as part of the denoiser (planning/controlnet.py with_controlnets): their parameters are
    # in params[denoiser] (and its blocks, fixed part, fp8_kept, quant_kept); these say which part is theirs, and
    # their activations in elements per latent pixel per image (held: their residuals while the UNet runs; peak:
    # their own forward's). 0 / (): none
    controlnet_params: int = 0
    controlnet_quant_kept: int = 0
    controlnet_held: float = 0.0
    controlnet_peak: float = 0.0
    controlnet_units: int = 0
    controlnets: tuple[str, ...] = ()
    # an SD3/Flux ControlNet's width (0: a UNet's): its own forward is a transformer's over the same tokens
    controlnet_hidden: int = 0
    # the denoiser's class (SD3Transformer2DModel, FluxTransformer2DModel, ...): which family's ControlNets fit it
    denoiser_class: str = ""
    # the record key of the folder's pipeline class ('' : none, or not read): a family that shares another's
    # denoiser class (FLUX.1 Kontext FLUX.1's, Flux.2 dev Klein's) is named as itself, not as the first claimant
    family: str = field(default="", compare=False)
    # the UNet's input channels: 4, or 9 for an inpainting UNet (the mask and the masked image's latents beside
    # the latents: inpaint_input_bytes)
    unet_in_channels: int = 4
    # each component's class as the folder's model_index.json names it ({"text_encoder": "T5EncoderModel", ...}):
    # what `plan --json` names its text encoders and VAE by (planning/shapes.py)
    classes: dict[str, str] = field(default_factory=dict, compare=False)  # names only: no count depends on them
    # per text encoder, the most parameters two leaf modules next to each other in module order hold (tied weights
    # once): what leaf-by-leaf streaming has on the device at once, the running leaf and the prefetched next one
    # (a token embedding with the first small layer after it, not twice the embedding). Empty: not counted (an old
    # stored profile), twice the largest layer is taken
    leaf_window: dict[str, int] = field(default_factory=dict)
    # --- video (issue 33; planning/video.py). The model's: the transformer's temporal patch and depth, the VAE's
    # temporal compression and how it decodes a clip ('causal': latent frame by latent frame with a causal feature
    # cache, Wan's; 'whole': every frame at once unless tiled/framewise, LTX's; '': an image VAE), and whether a
    # second expert (`transformer_2`, Wan 2.2 A14B) takes over the low-noise steps (params["transformer_2"])
    transformer_patch_t: int = 1
    transformer_layers: int = 0
    transformer_ffn: int = 0  # its feed-forward's inner width (Wan's ffn_dim; 4 x the width where the config has none)
    transformer_text_dim: int = 0  # the width of the prompt embeddings it takes (Wan's text_dim, LTX's caption_channels)
    vae_temporal: int = 1
    vae_video: str = ""
    # the job's (planning/video.planned sets them; 0 / False for an image job, as reference_tokens): the frames a clip
    # makes and the latent frames its denoiser runs over, whether CFG runs as a second forward (Wan: not a doubled
    # batch), and whether the job runs the image encoder (image-to-video with Wan 2.1 I2V's CLIP vision model)
    video_frames: int = 0
    latent_frames: int = 0
    cfg_two_forwards: bool = False
    image_job: bool = False

    def as_dict(self) -> dict:
        d = asdict(self)
        return {k: list(v) if isinstance(v, tuple) else v for k, v in d.items()}

    @classmethod
    def from_dict(cls, d: dict) -> "ModelProfile":
        known = {f for f in cls.__dataclass_fields__}
        kw = {k: (tuple(v) if isinstance(v, list) else v) for k, v in d.items() if k in known}
        kw["residency_blocks"] = tuple((str(n), int(c)) for n, c in d.get("residency_blocks", ()))
        kw["resolution_bins"] = tuple((float(r), int(h), int(w)) for r, h, w in d.get("resolution_bins", ()))
        kw["params"] = dict(d["params"])
        kw["largest_layer"] = dict(d.get("largest_layer", {}))
        kw["text_quant_kept"] = {str(k): int(v) for k, v in dict(d.get("text_quant_kept", {})).items()}
        kw["text_fp32_kept"] = {str(k): int(v) for k, v in dict(d.get("text_fp32_kept", {})).items()}
        kw["file_bytes"] = {str(k): int(v) for k, v in dict(d.get("file_bytes", {})).items()}
        kw["classes"] = {str(k): str(v) for k, v in dict(d.get("classes", {})).items()}
        kw["leaf_window"] = {str(k): int(v) for k, v in dict(d.get("leaf_window", {})).items()}
        return cls(**kw)

    @property
    def quantized_kept(self) -> int:
        """Denoiser parameters int8/int4 leave at the compute dtype."""
        return self.quant_kept if self.quant_kept >= 0 else self.fp8_kept

    @property
    def text_encoders(self) -> list[str]:
        return [k for k in self.params if k.startswith("text_encoder")]

    @property
    def experts(self) -> int:
        """Denoisers that take turns over the steps: 2 for Wan 2.2 A14B (`transformer_2`), else 1."""
        return 2 if self.params.get("transformer_2") else 1

    @property
    def is_video_job(self) -> bool:
        return self.video_frames > 0


def _builtin_key(name: str) -> str:
    family = families.by_name(name)
    if family is None:
        table = families.aliases()
        raise ValueError(f"unknown built-in model {name!r}; use one of {', '.join(families.builtin_names())} "
                         f"(aliases: {', '.join(sorted(a for a in table if a not in families.builtin_names()))})")
    return family.builtin


def is_builtin(name: str) -> bool:
    """`name` is a built-in model `plan` knows offline (a short name, alias or hub id of a family record)."""
    return families.by_name(name) is not None


def native_side(profile: ModelProfile) -> int:
    """The width and height to plan at when none is given: the architecture's training resolution (a folder whose
    denoiser matches no built-in one: DEFAULT_SIDE)."""
    family = families.by_arch(profile.arch)
    return family.native_side if not family.is_generic else DEFAULT_SIDE


def profile_builtin(name: str) -> ModelProfile:
    """Profile of a shipped architecture: 'sd15', 'sd21', 'sdxl', 'sd3' (SD3-medium) or 'flux' (FLUX.1-dev);
    aliases such as 'sd1.5' work."""
    key = _builtin_key(name)
    stored = calibration().get("profiles", {}).get(key)
    if stored is not None:  # counted once (calibration.json); the classes are the shipped model_index.json's
        profile = ModelProfile.from_dict(stored)
        return profile if profile.classes else replace(profile, classes=_index_classes(CONFIGS / key))
    return _profile_for_dir(str(CONFIGS / key), arch=key)


def _index_classes(root: Path) -> dict[str, str]:
    """{component: class name} of a diffusers folder's model_index.json (the components it loads)."""
    index = safe_json.load_file(root / "model_index.json")
    return {k: str(v[1]) for k, v in index.items()
            if not k.startswith("_") and isinstance(v, list) and len(v) == 2 and v[0] and v[1]}


def profile_from_folder(path) -> ModelProfile:
    """Profile of a local diffusers folder (model_index.json + <component>/config.json).

    Parameters are counted by instantiating each component from its config on the meta device: no
    weight file is read and no memory is allocated. Cached on the resolved path, the configs' modification
    times and the registered family records (a record registered later reads the folder anew).
    """
    p = Path(path).expanduser().resolve()
    index = p / "model_index.json"
    if not index.is_file():
        raise ValueError(f"{p} is not a diffusers folder: it has no model_index.json")
    stamps = tuple(sorted((str(f.relative_to(p)), f.stat().st_mtime_ns)
                          for f in [index, *p.glob("*/config.json")]))
    return _profile_cached(str(p), stamps, tuple(f.key for f in families.all_families()))


@functools.lru_cache(maxsize=32)
def _profile_cached(path: str, stamps: tuple, records: tuple) -> ModelProfile:
    profile = _profile_for_dir(path, arch="custom")
    files = weight_file_bytes(Path(path), profile.params)
    return replace(_with_matched_arch(profile), file_bytes=files,
                   file_dtype=half_dtype(path) if files.get(profile.denoiser) else "")


def weight_file_bytes(root: Path, components) -> dict[str, int]:
    """Bytes of each component's weight files in a diffusers folder, as diffusers picks them: the
    files without a variant infix (x.safetensors, not x.fp16.safetensors) when there are any."""
    out = {}
    for name in components:
        files = [f for f in (root / name).glob("*.safetensors") if f.is_file()]
        plain = [f for f in files if "." not in f.name[: -len(".safetensors")]]  # no .fp16 infix
        chosen = plain or files
        if chosen:
            out[name] = sum(f.stat().st_size for f in chosen)
    return out


def _with_matched_arch(profile: ModelProfile) -> ModelProfile:
    """A fine-tune keeps its base's architecture: give it that architecture's calibration."""
    den = profile.denoiser
    for key in families.builtin_names():
        ref = calibration().get("profiles", {}).get(key)
        if ref is None:
            continue
        if (ref.get("denoiser", "unet") == den and ref["params"].get(den) == profile.params.get(den)
                and tuple(ref["unet_channels"]) == profile.unet_channels
                and ref.get("transformer_hidden", 0) == profile.transformer_hidden
                and ref["cross_attention_dim"] == profile.cross_attention_dim
                and tuple(ref["vae_channels"]) == profile.vae_channels):
            # its base's counts too where the stored profile predates one (leaf_window): the same plans as the base
            return replace(profile, arch=key, leaf_window=dict(ref.get("leaf_window", {})))
    return profile


def _profile_for_dir(path: str, arch: str) -> ModelProfile:
    import torch  # noqa: F401  (imported here, never at module import)

    root = Path(path)
    index = safe_json.load_file(root / "model_index.json")
    components = {k: v for k, v in index.items()
                  if not k.startswith("_") and isinstance(v, list) and len(v) == 2 and v[0] and v[1]}
    classes: dict[str, str] = {}
    windows: dict[str, int] = {}
    params: dict[str, int] = {}
    largest: dict[str, int] = {}
    text_kept: dict[str, int] = {}
    fp32_kept: dict[str, int] = {}
    kw: dict[str, Any] = {}
    text_hidden, text_layers, text_tokens, t5_tokens = [], [], [], []
    # the family's record reads its shapes and says its text encoders' prompt lengths (families/records.py)
    family = families.by_pipeline(str(index.get("_class_name") or ""))
    joint, in_channels = False, 0
    for name, (library, class_name) in sorted(components.items()):
        cfg_file = root / name / "config.json"
        # an image encoder counts where it is a video family's (Wan 2.1 I2V's CLIP vision model, image-to-video)
        skipped = ("safety_checker", "feature_extractor") + (() if family.is_video else ("image_encoder",))
        if not cfg_file.is_file() or name in skipped:
            continue
        cfg = safe_json.load_file(cfg_file)
        model = instantiate_meta(library, class_name, cfg)
        if model is None:
            continue
        params[name] = sum(p.numel() for p in model.parameters())
        classes[name] = str(class_name)
        largest[name] = max((sum(p.numel() for p in m.parameters(recurse=False)) for m in model.modules()),
                            default=0)
        if name in ("unet", "transformer"):
            kw.update(_denoiser_fields(name, model, family))
            # text in the image stream: a joint_attention_dim, or the record says so (Lumina 2's cap_feat_dim, Z-Image)
            joint = name == "transformer" and ("joint_attention_dim" in cfg or bool(family.joint_tokens))
            if name == "transformer" and family.resolution_bins is not None:
                kw["resolution_bins"] = family.resolution_bins(cfg)
            in_channels = int(cfg.get("in_channels", 4))
        elif name == "vae":
            vae = _vae_fields(model)
            if not family.is_video:  # a clip's decode facts only for a video family (Qwen-Image has Wan's VAE)
                vae = {k: v for k, v in vae.items() if k not in ("vae_temporal", "vae_video")}
            kw.update(vae)
            # only some pipelines honour force_upcast (SDXL's; and diffusers defaults it to true when absent)
            kw["vae_force_upcast"] = bool(cfg.get("force_upcast", False)) and family.vae_force_upcast
        elif name.startswith("text_encoder"):
            text_kept[name] = text_quant_kept(model)
            windows[name] = leaf_window(model)
            fp32_kept[name] = text_fp32_kept(model)
            c = getattr(model.config, "text_config", None) or model.config  # Qwen2.5-VL's: its language model's
            text_hidden.append(int(getattr(c, "hidden_size", getattr(c, "d_model", 768))))
            text_layers.append(int(getattr(c, "num_hidden_layers", getattr(c, "num_layers", 12))))
            if str(getattr(c, "model_type", "")).startswith("clip"):
                text_tokens.append(int(getattr(c, "max_position_embeddings", TEXT_TOKENS)))
            else:  # T5 (or another sequence encoder): padded to the pipeline's max_sequence_length
                t5_tokens.append(family.t5_prompt_tokens())
                text_tokens.append(t5_tokens[-1])
        del model
    if "denoiser" not in kw:
        raise ValueError(f"{root}: no unet or transformer component with a config.json")
    if kw["denoiser"] == "transformer":
        # the pipeline packs n x n latent pixels into one input token when the transformer takes n^2 x
        # the VAE's latent channels (Flux: 64 = 4 x 16); a patch_size > 1 patchifies on top of that
        packed = in_channels / kw.get("latent_channels", in_channels)
        n = math.isqrt(int(packed)) if packed >= 1 and float(packed).is_integer() else 1
        kw["transformer_patch"] = kw["transformer_patch"] * (n if n * n == packed else 1)
        if joint:  # text tokens in the stream: the family's, else the T5 (non-CLIP) encoders' prompts
            kw["joint_text_tokens"] = family.joint_text_tokens(t5_tokens)
        kw["cfg_batch"] = family.cfg_batch
    return ModelProfile(arch=arch, params=params, largest_layer=largest, text_quant_kept=text_kept,
                        text_fp32_kept={k: v for k, v in fp32_kept.items() if v},
                        text_hidden=tuple(text_hidden) or (768,),
                        text_layers=tuple(text_layers) or (12,), text_tokens=tuple(text_tokens) or (TEXT_TOKENS,),
                        classes=classes, leaf_window=windows, family="" if family.is_generic else family.key, **kw)


def leaf_window(model) -> int:
    """The most parameters two consecutive parameter-holding leaf modules of `model` hold, in module order (a tied
    weight counted at its first module only): the device's share of leaf-by-leaf streaming with one prefetch."""
    seen: set[int] = set()
    sizes = []
    for module in model.modules():
        if next(module.children(), None) is not None:
            continue
        own = [p for p in module.parameters(recurse=False) if id(p) not in seen]
        seen.update(id(p) for p in own)
        if own:
            sizes.append(sum(p.numel() for p in own))
    return max((a + b for a, b in zip(sizes, sizes[1:])), default=sum(sizes))


def _denoiser_fields(name: str, model, family: families.Family = families.GENERIC) -> dict:
    import torch

    cfg = model.config
    out: dict[str, Any] = {"denoiser": name, "denoiser_class": type(model).__name__}
    blocks, in_blocks, total = block_sizes(model)
    out["denoiser_blocks"] = tuple(blocks)
    out["denoiser_unmatched"] = total - in_blocks
    out["residency_blocks"] = tuple(piece_tree(model, bytes_per_element=1))
    out["residency_fixed"] = fixed_bytes(model, bytes_per_element=1)
    try:
        model.enable_layerwise_casting(storage_dtype=torch.float8_e4m3fn, compute_dtype=torch.bfloat16)
        out["fp8_kept"] = sum(p.numel() for p in model.parameters() if p.dtype != torch.float8_e4m3fn)
    # not a diffusers ModelMixin (no such method), or casting unsupported: everything kept in compute dtype. Not a
    # bare Exception: a mistake here (a NameError) once read as "all kept" and went unseen
    except (AttributeError, NotImplementedError, RuntimeError, TypeError, ValueError):
        out["fp8_kept"] = total
    out["quant_kept"] = sdnq_kept(model)
    if name == "unet" and "block_out_channels" in cfg:
        channels = [int(c) for c in cfg["block_out_channels"]]
        n = len(channels)
        down = list(cfg["down_block_types"])
        heads = cfg.get("num_attention_heads") or cfg.get("attention_head_dim") or 8
        layers = cfg.get("transformer_layers_per_block", 1)
        layers = [int(x if not isinstance(x, (list, tuple)) else max(x)) for x in _as_list(layers, n)]
        out.update(
            unet_channels=tuple(channels),
            unet_attention=tuple("Attn" in t for t in down),
            unet_transformer_layers=tuple(layers),
            unet_heads=tuple(int(h) for h in _as_list(heads, n)),
            unet_layers_per_block=int(max(_as_list(cfg.get("layers_per_block", 2), n))),
            unet_mid_attention="CrossAttn" in str(cfg.get("mid_block_type") or "UNetMidBlock2DCrossAttn"),
            unet_upcast_attention=bool(cfg.get("upcast_attention") or False),
            cross_attention_dim=int(max(_as_list(cfg.get("cross_attention_dim", 768), n))),
            latent_channels=int(cfg.get("in_channels", 4)),
            unet_in_channels=int(cfg.get("in_channels", 4)),
        )
    else:  # a transformer: its width and patch as the family's record reads its config (a 3-D patch: the spatial)
        hidden, patch = family.transformer_shape(cfg)
        if family.is_video:  # what a clip's estimate reads (planning/video.py)
            patch_3d = cfg.get("patch_size")
            out.update(  # a video transformer's (t, h, w) patch (Wan's (1, 2, 2)), or LTX's patch_size_t
                transformer_patch_t=int(patch_3d[0]) if isinstance(patch_3d, (list, tuple)) and len(patch_3d) == 3
                else int(cfg.get("patch_size_t") or 1),
                transformer_layers=int(cfg.get("num_layers") or 0),
                transformer_ffn=int(cfg.get("ffn_dim") or 4 * int(hidden)),
                transformer_text_dim=int(cfg.get("text_dim") or cfg.get("caption_channels") or 0))
        out.update(transformer_hidden=int(hidden), transformer_patch=int(patch),
                   latent_channels=int(cfg.get("in_channels", 4)),
                   pointwise_conv=max((m.weight.numel() for m in model.modules() if isinstance(m, torch.nn.Conv2d)
                                       and m.kernel_size == (1, 1) and m.groups == 1), default=0))
    return out


def _as_list(value, n: int) -> list:
    return list(value) if isinstance(value, (list, tuple)) else [value] * n


def _vae_fields(model) -> dict:
    cfg = model.config
    if "z_dim" in cfg and "base_dim" in cfg:  # a Wan-style causal 3-D VAE (Qwen-Image's): its own config names
        down = cfg.get("temperal_downsample", (False, True, True))
        return {
            "latent_channels": int(cfg["z_dim"]),
            "vae_channels": tuple(int(cfg["base_dim"]) * int(m) for m in cfg.get("dim_mult", (1, 2, 4, 4))),
            "vae_layers_per_block": int(cfg.get("num_res_blocks", 2)),
            # Wan 2.2's VAE patchifies 2x2 before its 8x: scale_factor_spatial 16 (diffusers' spatial_compression_ratio)
            "vae_scale_factor": int(cfg.get("scale_factor_spatial") or 2 ** len(down)),
            "vae_sample_size": 512,
            "vae_temporal": int(cfg.get("scale_factor_temporal") or 2 ** sum(bool(d) for d in down)),
            "vae_video": "causal",
        }
    if "spatio_temporal_scaling" in cfg:  # LTX-Video's AutoencoderKLLTXVideo: its compression as diffusers computes it
        scaling = sum(bool(s) for s in cfg["spatio_temporal_scaling"])
        stages = cfg.get("decoder_block_out_channels") or cfg.get("block_out_channels") or (128, 256, 512, 512)
        return {
            "latent_channels": int(cfg.get("latent_channels", 128)),
            "vae_channels": tuple(int(c) for c in stages),
            "vae_layers_per_block": int(max(_as_list(cfg.get("decoder_layers_per_block")
                                                     or cfg.get("layers_per_block", 4), 1))),
            "vae_scale_factor": int(cfg.get("spatial_compression_ratio")
                                    or int(cfg.get("patch_size", 4)) * 2 ** scaling),
            "vae_sample_size": 512,  # its tile_sample_min_height
            "vae_temporal": int(cfg.get("temporal_compression_ratio")
                                or int(cfg.get("patch_size_t", 1)) * 2 ** scaling),
            "vae_video": "whole",
        }
    # a DC-AE (SANA's AutoencoderDC) names its stages per side: each halves the side, as an AutoencoderKL's do (32x)
    stages = cfg.get("block_out_channels") or cfg.get("decoder_block_out_channels") or (128, 256, 512, 512)
    channels = tuple(int(c) for c in stages)
    return {
        "latent_channels": int(cfg.get("latent_channels", 4)),
        "vae_channels": channels,
        "vae_layers_per_block": int(cfg.get("layers_per_block", 2)),
        "vae_scale_factor": 2 ** (len(channels) - 1),
        "vae_sample_size": int(_as_list(cfg.get("sample_size", 512), 1)[0]),
    }


@functools.lru_cache(maxsize=1)
def calibration() -> dict:
    """configs/calibration.json: the built-in profiles, the estimate's fit, the measurements behind it."""
    try:
        return json.loads(CALIBRATION_FILE.read_text())
    except FileNotFoundError:
        return {}


def reload_calibration() -> None:
    """Forget the cached calibration.json (the calibration script calls this after writing it)."""
    calibration.cache_clear()
    _profile_cached.cache_clear()


def source_profile(source: ModelSource, family: str | None = None) -> ModelProfile:
    """`family`: the loaded pipeline's (LoadedModel.family: its family group), for a single file without a config
    folder: the profile of that group's built-in architecture (SD 1.5 when it has none)."""
    folder = source.path if source.kind != "single_file" else source.config
    gguf = source.kind == "single_file" and gguf_file.is_gguf(source.path)
    if folder and Path(folder).is_dir():
        try:
            profile = profile_from_folder(folder)
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise ModelLoadError(f"could not read the model configs in {folder}: {exc}") from exc
    elif gguf:  # no --config: the folder its loader finds, else the architecture from the file's keys
        found = gguf_file.planned_components(source.path)
        profile = profile_from_folder(found) if found else profile_builtin(gguf_file.builtin_arch(source.path))
    elif source.kind == "single_file" and (alone := transformer_file.file_family(source.path)) is not None:
        found = transformer_file.planned_components(alone, source.config)  # a 2026 family's transformer file
        profile = profile_from_folder(found) if found else profile_builtin(alone.builtin)
    else:
        builtin = next((r.builtin for r in families.builtin_families() if r.group == family), None)
        profile = profile_builtin(builtin or families.SD15.builtin)
    if gguf and folder and Path(folder).is_dir():  # an SD folder's profile is no estimate for a Flux GGUF
        path = Path(source.path)
        check_config(Path(folder), gguf_file.family_of(gguf_file.read_header(path), path), path)
    if gguf:
        quantized, stored = gguf_file.stored_sizes(source.path)
        profile = replace(profile, denoiser_quantized=quantized, denoiser_quantized_bytes=stored)
    elif source.kind == "single_file" and profile.unet_channels:
        profile = replace(profile, unet_in_channels=_file_unet_inputs(Path(source.path), profile.unet_in_channels))
    return profile


def with_vae(profile: ModelProfile, name: str) -> ModelProfile:
    """The profile of a job that decodes with the VAE `name` (models/vae.py; "Automatic"/"None": the model's own,
    unchanged): the file's weights are what loading its VAE reads, and the model's own VAE stays in RAM beside it
    (kept to switch back, engines/sd/vae_swap.py), counted as `vae_own`. An unknown name is refused here, before
    any model loads."""
    from lowvram_gen.models import vae as vae_files

    if vae_files.is_own(name) or "vae" not in profile.params:
        return profile
    path = vae_files.find(name)
    return replace(profile, params={**profile.params, "vae_own": profile.params["vae"]},
                   file_bytes={**profile.file_bytes, "vae": vae_files.file_bytes(path)})


def _file_unet_inputs(path: Path, default: int) -> int:
    """The UNet's input channels as a .safetensors checkpoint stores them (9: an inpainting model, whatever its
    config folder says), read from its header; `default` for other files (a pickle is not opened for this)."""
    if path.suffix.lower() != ".safetensors":
        return default
    try:
        shape = safetensors_header(path).get("model.diffusion_model.input_blocks.0.0.weight", {}).get("shape")
    except Exception:  # noqa: BLE001 - an unreadable file is the loader's to refuse, with its own words
        return default
    return int(shape[1]) if shape and len(shape) == 4 else default
