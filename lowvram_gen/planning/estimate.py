"""Estimate the peak device memory of a text-to-image job before running it.

estimate(profile, width, height, batch, settings) -> Estimate, where the profile holds everything the
estimate needs and comes from configs only (no weights are read):

    profile_builtin("sd15" | "sd21" | "sdxl" | "sd3" | "flux")   shipped configs (SD3 = SD3-medium,
                                                 flux = FLUX.1-dev), counts precomputed in calibration.json
    profile_from_folder(path)                    any local diffusers folder, counted on the meta device

The model (docs/benchmarks.md, "Memory estimator", has the numbers behind it):

    peak = max over phases (text encode, one UNet step, VAE decode) of
           weights resident in that phase + activations of that phase,   plus a fixed overhead.

Activations are a shape-derived feature times a fitted coefficient. The UNet feature walks the UNet
config: at each resolution level it adds the skip connections still held for the up path to the
working set of the largest block at that level (a GEGLU transformer block holds ~19 C per token; a
resnet ~3.5 x its input channels). The VAE feature is the largest decoder stage (3 C_in + C_out at
its resolution). Both are elements per latent pixel per image; times pixels, images and bytes per
element, times the coefficient that benchmarks/calibrate_memory.py fits to real forward passes of SD 1.5,
SD 2.1 and SDXL. A transformer denoiser (SD3, Flux, PixArt ...) is a stack of same-width blocks over
one token stream: its feature is (image tokens + the text tokens joint attention carries beside them)
x hidden width per image, and the coefficient (fitted to SD3-medium and FLUX.1-dev blocks) is how
many stream-sized tensors its largest block holds at once. Attention adds no tokens^2 term: SDPA runs
flash / memory-efficient kernels on CUDA and a flash kernel on the CPU, and the measurements grow
linearly in tokens. Built-in architectures (and folders whose denoiser matches one) use their own
fitted coefficient; other models use the coefficient fitted over all of them.

No torch import at module import time: torch, diffusers and transformers are imported inside the
functions that instantiate models on the meta device.
"""

from __future__ import annotations

import functools
import json
import math
import warnings
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from lowvram_gen.planning import residency
from lowvram_gen.settings import MemorySettings

CONFIGS = Path(__file__).resolve().parents[1] / "configs"  # package data: lowvram_gen/configs
CALIBRATION_FILE = CONFIGS / "calibration.json"

BUILTIN_NAMES = ("sd15", "sd21", "sdxl", "sd3", "flux")
ALIASES = {
    "sd15": "sd15", "sd1.5": "sd15", "sd-1.5": "sd15", "sd1": "sd15", "v1-5": "sd15",
    "stable-diffusion-v1-5": "sd15", "stable-diffusion-v1-5/stable-diffusion-v1-5": "sd15",
    "runwayml/stable-diffusion-v1-5": "sd15",
    "sd21": "sd21", "sd2.1": "sd21", "sd-2.1": "sd21", "sd2": "sd21", "stabilityai/stable-diffusion-2-1": "sd21",
    "sdxl": "sdxl", "sd-xl": "sdxl", "sdxl-base": "sdxl", "stabilityai/stable-diffusion-xl-base-1.0": "sdxl",
    "sd3": "sd3", "sd3-medium": "sd3", "stabilityai/stable-diffusion-3-medium-diffusers": "sd3",
    "flux": "flux", "flux-dev": "flux", "flux.1-dev": "flux", "flux1-dev": "flux", "black-forest-labs/flux.1-dev": "flux",
}

# The side each architecture was trained at, in pixels: what `plan` assumes when the user gives no
# --width/--height (SDXL, SD3 and Flux look broken at SD 1.5's 512, and their estimates would be far too low).
NATIVE_SIDE = {"sd15": 512, "sd21": 768, "sdxl": 1024, "sd3": 1024, "flux": 1024}
DEFAULT_SIDE = 512  # any other model (a folder whose denoiser matches none of the built-in ones)

DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2}
FP8_BYTES = 1
# Bytes a weight of a quantized layer takes with its scales (sdnq, weight-only; models/quantize.py),
# measured on real-size fp16 layers: int8 1.004 (one byte plus per-channel scales); int4 0.563 for a
# Linear and 0.625 for a 3x3 convolution (half a byte plus a scale per group). UNets are mostly
# convolutions (68.5 % of SD 1.5's weights), so int4 is counted at 0.61.
# The layers it leaves alone (norms, biases, embeddings: about the layers fp8 storage leaves) stay in
# the compute dtype; one layer is dequantized while it runs.
QUANTIZED_BYTES = {"int8": 1.01, "int4": 0.61}
MiB = 1024**2

# What torch.cuda.max_memory_allocated() does not count but the card must still hold once the job
# runs: kernels loaded lazily on first use (CUDA >= 12.2 loads modules lazily by default, so they land
# after the probe), cuBLAS/cuDNN handles and workspaces (PyTorch's default cuBLAS workspace config
# ":4096:8" alone is 32 MiB per stream), and the caching allocator's rounding of blocks. The CUDA
# context itself is created before the probe and is already missing from its free memory; the OS
# and other programs are device.py's reserve. 384 MiB is a judgement, not a measurement (no GPU
# here), below ComfyUI's minimum_inference_memory() (0.8 GiB + 400 MiB reserve) because that also
# covers activations, which we count separately. See docs/benchmarks.md.
OVERHEAD_BYTES = 384 * MiB

# Used when calibration.json has no fit (first run of the calibration script); overwritten by the fit.
_DEFAULT_FIT = {
    "unet": {"global": 1.0, "per_call": 0.0},
    "vae": {"global": 1.0, "per_call": 0.0},
    "transformer": {"global": 12.0, "per_call": 0.0},
    "slicing": 1.0,
}

# Token count of the CLIP text encoders (what the pipelines pad prompts to).
TEXT_TOKENS = 77
# What a pipeline family feeds its text encoders and transformer, by the prefix of model_index.json's
# _class_name (FluxImg2ImgPipeline is a "Flux" pipeline). t5: the T5 prompt length, the default
# max_sequence_length of the pipeline's __call__ (our engine never passes one; tests/test_memory.py
# checks these against the installed diffusers). joint: the text tokens the transformer carries next
# to the image tokens through every block (MMDiT joint attention): SD3 concatenates its CLIP-L and
# CLIP-G token embeddings (77) with T5's; Flux uses T5's tokens only (CLIP gives a pooled vector).
# cfg_batch: CFG runs as a doubled batch. FLUX.1-dev is guidance-distilled (the guidance scale is an
# input) and schnell needs no guidance: FluxPipeline batches no CFG (its optional true CFG, with
# true_cfg_scale > 1 and a negative prompt, runs two separate forwards). FLUX.1-schnell's model card
# suggests max_sequence_length=256, but the pipeline's default (what runs here) is 512.
PIPELINE_FAMILIES: dict[str, dict[str, Any]] = {
    "StableDiffusion3": {"t5": 256, "joint": 77 + 256, "cfg_batch": True},
    "Flux": {"t5": 512, "joint": 512, "cfg_batch": False},
    "PixArtSigma": {"t5": 300, "joint": 0, "cfg_batch": True},  # cross-attention: text not in the stream
    "PixArtAlpha": {"t5": 120, "joint": 0, "cfg_batch": True},
}
# A T5 encoder in a pipeline not listed above: its prompts are taken as this long, and a transformer with
# joint attention (a joint_attention_dim in its config) carries them. A guess, not read from anywhere.
DEFAULT_T5_TOKENS = 256
# Block names of ControlNets in a budget split (planning/controlnet.py PREFIX: controlnet0:<block>)
controlnet_prefix = "controlnet"
# Tile overlap of diffusers' AutoencoderKL tiled decode (tile_overlap_factor).
VAE_TILE_OVERLAP = 0.25


# ------------------------------------------------------------------------------------------ profile


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
    joint_text_tokens: int = 0  # text tokens carried next to the image tokens (PIPELINE_FAMILIES)
    cfg_batch: bool = True  # CFG doubles the denoiser batch (not for guidance-distilled Flux)
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
    # (name, elements), and the elements outside them (always resident); planning/residency.py
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
    # the UNet's input channels: 4, or 9 for an inpainting UNet (the mask and the masked image's latents beside
    # the latents: inpaint_input_bytes)
    unet_in_channels: int = 4

    def as_dict(self) -> dict:
        d = asdict(self)
        return {k: list(v) if isinstance(v, tuple) else v for k, v in d.items()}

    @classmethod
    def from_dict(cls, d: dict) -> "ModelProfile":
        known = {f for f in cls.__dataclass_fields__}
        kw = {k: (tuple(v) if isinstance(v, list) else v) for k, v in d.items() if k in known}
        kw["residency_blocks"] = tuple((str(n), int(c)) for n, c in d.get("residency_blocks", ()))
        kw["params"] = dict(d["params"])
        kw["largest_layer"] = dict(d.get("largest_layer", {}))
        kw["text_quant_kept"] = {str(k): int(v) for k, v in dict(d.get("text_quant_kept", {})).items()}
        kw["text_fp32_kept"] = {str(k): int(v) for k, v in dict(d.get("text_fp32_kept", {})).items()}
        kw["file_bytes"] = {str(k): int(v) for k, v in dict(d.get("file_bytes", {})).items()}
        return cls(**kw)

    @property
    def quantized_kept(self) -> int:
        """Denoiser parameters int8/int4 leave at the compute dtype."""
        return self.quant_kept if self.quant_kept >= 0 else self.fp8_kept

    @property
    def text_encoders(self) -> list[str]:
        return [k for k in self.params if k.startswith("text_encoder")]


def _builtin_key(name: str) -> str:
    key = ALIASES.get(str(name).strip().lower())
    if key is None:
        raise ValueError(f"unknown built-in model {name!r}; use one of {', '.join(BUILTIN_NAMES)} "
                         f"(aliases: {', '.join(sorted(a for a in ALIASES if a not in BUILTIN_NAMES))})")
    return key


def native_side(profile: ModelProfile) -> int:
    """The width and height to plan at when none is given: the architecture's training resolution."""
    return NATIVE_SIDE.get(profile.arch, DEFAULT_SIDE)


def profile_builtin(name: str) -> ModelProfile:
    """Profile of a shipped architecture: 'sd15', 'sd21', 'sdxl', 'sd3' (SD3-medium) or 'flux' (FLUX.1-dev);
    aliases such as 'sd1.5' work."""
    key = _builtin_key(name)
    stored = _calibration().get("profiles", {}).get(key)
    if stored is not None:
        return ModelProfile.from_dict(stored)
    return _profile_for_dir(str(CONFIGS / key), arch=key)


def profile_from_folder(path) -> ModelProfile:
    """Profile of a local diffusers folder (model_index.json + <component>/config.json).

    Parameters are counted by instantiating each component from its config on the meta device: no
    weight file is read and no memory is allocated. Cached on the resolved path and the configs'
    modification times.
    """
    p = Path(path).expanduser().resolve()
    index = p / "model_index.json"
    if not index.is_file():
        raise ValueError(f"{p} is not a diffusers folder: it has no model_index.json")
    stamps = tuple(sorted((str(f.relative_to(p)), f.stat().st_mtime_ns)
                          for f in [index, *p.glob("*/config.json")]))
    return _profile_cached(str(p), stamps)


@functools.lru_cache(maxsize=32)
def _profile_cached(path: str, stamps: tuple) -> ModelProfile:
    from dataclasses import replace

    profile = _profile_for_dir(path, arch="custom")
    from lowvram_gen.models.filedtype import half_dtype

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
    from dataclasses import replace

    den = profile.denoiser
    for key in BUILTIN_NAMES:
        ref = _calibration().get("profiles", {}).get(key)
        if ref is None:
            continue
        if (ref.get("denoiser", "unet") == den and ref["params"].get(den) == profile.params.get(den)
                and tuple(ref["unet_channels"]) == profile.unet_channels
                and ref.get("transformer_hidden", 0) == profile.transformer_hidden
                and ref["cross_attention_dim"] == profile.cross_attention_dim
                and tuple(ref["vae_channels"]) == profile.vae_channels):
            return replace(profile, arch=key)
    return profile


def _profile_for_dir(path: str, arch: str) -> ModelProfile:
    import torch  # noqa: F401  (imported here, never at module import)

    root = Path(path)
    index = json.loads((root / "model_index.json").read_text())
    components = {k: v for k, v in index.items()
                  if not k.startswith("_") and isinstance(v, list) and len(v) == 2 and v[0] and v[1]}
    params: dict[str, int] = {}
    largest: dict[str, int] = {}
    text_kept: dict[str, int] = {}
    fp32_kept: dict[str, int] = {}
    kw: dict[str, Any] = {}
    text_hidden, text_layers, text_tokens, t5_tokens = [], [], [], []
    family = _pipeline_family(str(index.get("_class_name") or ""))
    joint, in_channels = False, 0
    for name, (library, class_name) in sorted(components.items()):
        cfg_file = root / name / "config.json"
        if not cfg_file.is_file() or name in ("safety_checker", "feature_extractor", "image_encoder"):
            continue
        cfg = json.loads(cfg_file.read_text())
        model = _instantiate_meta(library, class_name, cfg)
        if model is None:
            continue
        params[name] = sum(p.numel() for p in model.parameters())
        largest[name] = max((sum(p.numel() for p in m.parameters(recurse=False)) for m in model.modules()),
                            default=0)
        if name in ("unet", "transformer"):
            kw.update(_denoiser_fields(name, model))
            joint = name == "transformer" and "joint_attention_dim" in cfg
            in_channels = int(cfg.get("in_channels", 4))
        elif name == "vae":
            kw.update(_vae_fields(model))
            # only the SDXL pipelines honour force_upcast (and diffusers defaults it to true when absent)
            kw["vae_force_upcast"] = bool(cfg.get("force_upcast", False)) and "XL" in str(index.get("_class_name"))
        elif name.startswith("text_encoder"):
            text_kept[name] = text_quant_kept(model)
            fp32_kept[name] = text_fp32_kept(model)
            c = model.config
            text_hidden.append(int(getattr(c, "hidden_size", getattr(c, "d_model", 768))))
            text_layers.append(int(getattr(c, "num_hidden_layers", getattr(c, "num_layers", 12))))
            if str(getattr(c, "model_type", "")).startswith("clip"):
                text_tokens.append(int(getattr(c, "max_position_embeddings", TEXT_TOKENS)))
            else:  # T5 (or another sequence encoder): padded to the pipeline's max_sequence_length
                t5_tokens.append(int(family.get("t5", DEFAULT_T5_TOKENS)))
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
            kw["joint_text_tokens"] = int(family.get("joint", sum(t5_tokens)))
        kw["cfg_batch"] = bool(family.get("cfg_batch", True))
    return ModelProfile(arch=arch, params=params, largest_layer=largest, text_quant_kept=text_kept,
                        text_fp32_kept={k: v for k, v in fp32_kept.items() if v},
                        text_hidden=tuple(text_hidden) or (768,),
                        text_layers=tuple(text_layers) or (12,), text_tokens=tuple(text_tokens) or (TEXT_TOKENS,),
                        **kw)


def _pipeline_family(class_name: str) -> dict[str, Any]:
    """PIPELINE_FAMILIES' entry for a pipeline class name (the longest matching prefix), or {}."""
    hits = [k for k in PIPELINE_FAMILIES if class_name.startswith(k)]
    return PIPELINE_FAMILIES[max(hits, key=len)] if hits else {}


def _instantiate_meta(library: str, class_name: str, cfg: dict):
    """Build a model from its config with every tensor on the meta device (nothing allocated)."""
    from accelerate import init_empty_weights

    if library == "diffusers":
        import diffusers

        cls = getattr(diffusers, class_name, None)
        if cls is None or not hasattr(cls, "from_config"):
            return None
        # diffusers' own deprecations inside its classes (FluxControlNetModel imports FluxPosEmbed from where it
        # warns) are not the user's to read on every `plan`
        with init_empty_weights(include_buffers=True), warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)
            return cls.from_config(cfg)
    if library == "transformers":
        import transformers

        cls = getattr(transformers, class_name, None)
        if cls is None or not hasattr(cls, "config_class"):
            return None
        config = cls.config_class.from_dict(cfg)
        with init_empty_weights(include_buffers=True):
            return cls(config)
    return None


def _as_list(value, n: int) -> list:
    return list(value) if isinstance(value, (list, tuple)) else [value] * n


def block_sizes(model) -> tuple[list[int], int, int]:
    """The parameter counts of a denoiser's (or ControlNet's) blocks, the units group offload and the budget stream:
    each block of its ModuleLists/Sequentials, the sum of those, and the model's whole count."""
    import torch

    blocks = [sum(p.numel() for p in block.parameters())
              for child in model.children() if isinstance(child, (torch.nn.ModuleList, torch.nn.Sequential))
              for block in child]
    return blocks, sum(blocks), sum(p.numel() for p in model.parameters())


def _denoiser_fields(name: str, model) -> dict:
    import torch

    cfg = model.config
    out: dict[str, Any] = {"denoiser": name, "denoiser_class": type(model).__name__}
    blocks, in_blocks, total = block_sizes(model)
    out["denoiser_blocks"] = tuple(blocks)
    out["denoiser_unmatched"] = total - in_blocks
    out["residency_blocks"] = tuple(residency.blocks_of(model, bytes_per_element=1))
    out["residency_fixed"] = residency.fixed_bytes(model, bytes_per_element=1)
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
    else:
        heads = int(cfg.get("num_attention_heads", 0) or 0)
        head_dim = int(cfg.get("attention_head_dim", 0) or 0)
        hidden = heads * head_dim or int(cfg.get("hidden_size", 0) or cfg.get("inner_dim", 0) or 1152)
        out.update(transformer_hidden=hidden, transformer_patch=int(cfg.get("patch_size", 2) or 2),
                   latent_channels=int(cfg.get("in_channels", 4)))
    return out


def sdnq_kept(model) -> int:
    """Parameters sdnq leaves unquantized: all but the weights of Linear and Conv2d layers, the embedders'
    (x_embedder, time_text_embed ...), and layers under 16384 weights or 32 output channels (its defaults).
    Checked against sdnq's own result: SD 1.5's UNet at int8 0.815 GiB counted vs 0.811 measured, a FLUX.1
    transformer cut to 2+4 blocks at int4 0.803 GiB vs 0.810 (layerwise casting's fp8_kept, which keeps
    every norm's linear, counted 1.21 GiB there)."""
    import torch

    kept = 0
    for name, mod in model.named_modules():
        for pname, p in mod.named_parameters(recurse=False):
            quantized = (isinstance(mod, (torch.nn.Linear, torch.nn.Conv2d)) and pname == "weight"
                         and "embed" not in name and p.numel() >= 16384 and p.shape[0] >= 32)
            kept += 0 if quantized else p.numel()
    return kept


def text_quant_kept(model) -> int:
    """A text encoder's parameters sdnq leaves unquantized: `sdnq_kept`'s, plus the layers the transformers
    model names in `_keep_in_fp32_modules`, which sdnq's quantizer honours (use_keep_in_fp32_modules). T5's
    are its feed-forward output projections `wo` (24 x 10240 x 4096 = 1.0 B of T5-XXL's 4.76 B): measured on
    the real-size T5-XXL loaded at bfloat16 with int8: 3.38 GiB of int8 and 2.37 GiB of bfloat16 weights (that
    build's embeddings were untied, two copies: 2.12 GiB counted here for the tied model), where counting the
    embedding alone as unquantized said 4.3 and 0.25 (docs/benchmarks.md, "FLUX.1"). A tied weight counts once."""
    import torch

    keep = tuple(getattr(model, "_keep_in_fp32_modules", None) or ())
    kept, seen = 0, set()
    for name, mod in model.named_modules():
        for pname, p in mod.named_parameters(recurse=False):
            if id(p) in seen:  # a tied weight (T5's encoder.embed_tokens is its `shared`): one tensor
                continue
            seen.add(id(p))
            quantized = (isinstance(mod, (torch.nn.Linear, torch.nn.Conv2d)) and pname == "weight"
                         and "embed" not in name and p.numel() >= 16384 and p.shape[0] >= 32
                         and not any(k in name.split(".") for k in keep))
            kept += 0 if quantized else p.numel()
    return kept


def text_fp32_kept(model) -> int:
    """Parameters of the layers a transformers text encoder names in `_keep_in_fp32_modules` (T5's `wo`, 1.0 B of
    T5-XXL's 4.76 B): transformers loads them in float32 when the model is loaded in float16 (T5 overflows in
    float16 there), quantized or not; in bfloat16 they follow the dtype (checked on a tiny T5)."""
    keep = tuple(getattr(model, "_keep_in_fp32_modules", None) or ())
    if not keep:
        return 0
    return sum(p.numel() for name, mod in model.named_modules() if any(k in name.split(".") for k in keep)
               for p in mod.parameters(recurse=False))


def text_encoder_bytes(profile: "ModelProfile", name: str, dtype: str, quantize: str = "none") -> int:
    """Bytes of the text encoder `name` as loaded at `dtype` (with `quantize` int8/int4, while loading): what sdnq
    leaves unquantized (text_quant_kept: embeddings, norms, the float32-kept layers) stays at the dtype, and
    in a float16 load the float32-kept layers are float32. One count for the VRAM estimate and the host's."""
    n = profile.params.get(name, 0)
    b = DTYPE_BYTES[dtype]
    fp32 = profile.text_fp32_kept.get(name, 0) if dtype == "float16" else 0
    q = QUANTIZED_BYTES.get(quantize)
    if q:
        kept = max(profile.text_quant_kept.get(name) or profile.largest_layer.get(name, 0), fp32)
        return int((n - kept) * q + (kept - fp32) * b + fp32 * 4)
    return int((n - fp32) * b + fp32 * 4)


def _vae_fields(model) -> dict:
    cfg = model.config
    channels = tuple(int(c) for c in cfg.get("block_out_channels", (128, 256, 512, 512)))
    return {
        "latent_channels": int(cfg.get("latent_channels", 4)),
        "vae_channels": channels,
        "vae_layers_per_block": int(cfg.get("layers_per_block", 2)),
        "vae_scale_factor": 2 ** (len(channels) - 1),
        "vae_sample_size": int(_as_list(cfg.get("sample_size", 512), 1)[0]),
    }


# ------------------------------------------------------------------------------------ calibration


@functools.lru_cache(maxsize=1)
def _calibration() -> dict:
    try:
        return json.loads(CALIBRATION_FILE.read_text())
    except FileNotFoundError:
        return {}


def reload_calibration() -> None:
    """Forget the cached calibration.json (the calibration script calls this after writing it)."""
    _calibration.cache_clear()
    _profile_cached.cache_clear()


def _fit() -> dict:
    return _calibration().get("fit") or _DEFAULT_FIT


def _fit_table(kind: str) -> dict:
    return _fit().get(kind) or _DEFAULT_FIT[kind]


def _coefficient(kind: str, arch: str) -> float:
    table = _fit_table(kind)
    return float(table.get(arch, table["global"]))


def _per_call(kind: str) -> float:
    """Images' worth of activations a forward needs whatever its batch (fitted from batch pairs)."""
    return float(_fit_table(kind).get("per_call", 0.0))


# ------------------------------------------------------------------------------------ features
# Elements per latent pixel per image (the UNet and VAE features), before the fitted coefficient.


def _unet_levels(profile: ModelProfile):
    """Per resolution level (up path, where the most skips are held): (resolution factor, skips held,
    channels, input channels of the first resnet, has attention, heads)."""
    c = profile.unet_channels
    n = len(c)
    lpb = profile.unet_layers_per_block
    res = [4.0**-level for level in range(n)]
    # skips consumed by the up block of each level, all at that level's resolution
    skips = [res[i] * (lpb * c[i] + (c[i - 1] if i > 0 else c[0])) for i in range(n)]
    for i in range(n):
        c_prev = c[i + 1] if i + 1 < n else c[-1]
        attn = profile.unet_attention[i] or (i == n - 1 and profile.unet_mid_attention)
        yield res[i], sum(skips[: i + 1]), c[i], c_prev + c[i], attn, profile.unet_heads[i]


def unet_feature(profile: ModelProfile) -> float:
    """Peak live elements of one UNet forward, per latent pixel per image, from the UNet's shape."""
    if not profile.unet_channels:  # a transformer denoiser: see transformer_feature
        return float(profile.transformer_hidden) / profile.transformer_patch**2
    ff = 3 + profile.unet_ff_inner * 2  # residuals + norm + GEGLU projection + gelu(gate) + product
    best = 0.0
    for res, held, c, c_in, attn, _ in _unet_levels(profile):
        best = max(best, held + res * max(3.5 * c_in, ff * c if attn else 0.0))
    return best


def transformer_tokens(profile: ModelProfile, hw: int) -> float:
    """Tokens one image puts through every transformer block: hw latent pixels in patches, plus the
    text tokens that joint attention (SD3, Flux) carries beside them."""
    return hw / profile.transformer_patch**2 + profile.joint_text_tokens


def transformer_feature(profile: ModelProfile, hw: int) -> float:
    """Elements of one image's token stream (tokens x hidden): what a transformer block's working set
    is a multiple of. The fitted coefficient is that multiple (see docs/benchmarks.md)."""
    return transformer_tokens(profile, hw) * profile.transformer_hidden


def _denoiser_elements(profile: ModelProfile, hw: int) -> tuple[str, float]:
    """(calibration kind, elements per image with coefficient 1) of one denoiser forward."""
    if profile.unet_channels:
        return "unet", unet_feature(profile) * hw
    return "transformer", transformer_feature(profile, hw)


def _sliced_attention_terms(profile: ModelProfile, hw: float):
    """Per attention level: (elements per latent pixel per image live during self-attention,
    score elements of one slice). pipe.enable_attention_slicing('auto') computes heads // 2 rows of
    the (batch x heads, tokens, tokens) score matrix at a time, whatever the batch."""
    for res, held, c, _, attn, heads in _unet_levels(profile):
        if attn:
            tokens = hw * res
            yield held + res * 8 * c, max(1, heads // 2) * tokens * tokens


def vae_feature(profile: ModelProfile) -> float:
    """Peak live elements of the VAE decode, per latent pixel per image."""
    rev = list(reversed(profile.vae_channels))
    best, c_in = 0.0, rev[0]
    for i, c_out in enumerate(rev):
        scale = 4.0**i
        resnet = scale * (3 * c_in + c_out)
        upsample = scale * c_out * 9 if i < len(rev) - 1 else 0.0  # input + interpolated + conv output
        best = max(best, resnet, upsample)
        c_in = c_out
    return best


def _score_bytes(profile: ModelProfile, dtype_bytes: int) -> int:
    """Bytes per attention score held at the peak of diffusers' get_attention_scores: two score-sized
    tensors at once (the baddbmm input buffer and the scores, then the scores and the probabilities),
    in float32 when the UNet upcasts attention (SD 2.1)."""
    return 2 * (4 if profile.unet_upcast_attention else dtype_bytes)


# ------------------------------------------------------------------------------------- estimate


@dataclass(frozen=True)
class Estimate:
    total_bytes: int  # predicted peak device memory of the job
    weights_bytes: int  # weights resident on the device at the peak
    unet_bytes: int  # activations of one denoiser step, UNet or transformer (CFG doubles the batch)
    vae_bytes: int  # activations of the VAE decode
    overhead_bytes: int  # fixed allowance: kernels, cuBLAS/cuDNN workspaces, allocator rounding
    peak_phase: str = "unet"  # 'text' | 'unet' (the denoiser, UNet or transformer) | 'vae'
    # bytes the offload hooks move host-to-device: every denoising step (streamed blocks or layers),
    # and once per job (whole models moved in when they run, the resident part of a budget split moved
    # in before the denoise and out before the decode)
    streamed_bytes_per_step: int = 0
    moved_bytes_per_job: int = 0
    resident_bytes: int = 0  # offload = "budget": the denoiser's blocks kept on the GPU (after the split)
    denoiser_bytes: int = 0  # the denoiser's weights as stored (fp8/int8/int4/GGUF: fewer bytes)
    # the ControlNets' part of the denoiser (planning/controlnet.py): their weights as stored, and of those the bytes
    # on the GPU for the whole denoise and the bytes streamed in every step
    controlnet_bytes: int = 0
    controlnet_resident_bytes: int = 0
    controlnet_streamed_bytes_per_step: int = 0

    def as_dict(self) -> dict:
        return asdict(self)


def unet_activation_bytes(profile: ModelProfile, width: int, height: int, images: int, dtype_bytes: int,
                          attention: str = "sdpa") -> int:
    """Activations of one denoiser forward over `images` latents (CFG: 2 per image)."""
    sf = profile.vae_scale_factor
    hw = math.ceil(height / sf) * math.ceil(width / sf)
    kind, elements = _denoiser_elements(profile, hw)
    coef = _coefficient(kind, profile.arch)
    n = images + _per_call(kind)
    act = coef * elements * n * dtype_bytes
    if attention == "slicing" and profile.unet_channels:
        # the score slices are live during self-attention, not at the feed-forward peak: the peak is
        # the larger of the two
        for working, scores in _sliced_attention_terms(profile, hw):
            act = max(act, coef * working * hw * n * dtype_bytes
                      + _fit()["slicing"] * scores * _score_bytes(profile, dtype_bytes))
    inpaint = inpaint_input_bytes(profile, hw, n, dtype_bytes)
    act += inpaint
    if profile.controlnet_units and profile.controlnet_hidden:  # an SD3/Flux ControlNet (planning/controlnet.py)
        held = profile.controlnet_held * hw * n * dtype_bytes  # its residual streams, as they are (no working set)
        summed = held if profile.controlnet_units > 1 else 0.0
        working = coef * transformer_tokens(profile, hw) * profile.controlnet_hidden * n * dtype_bytes
        own = max(working + held, 3 * held) + summed
        images = profile.controlnet_units * 3 * hw * sf * sf * n * dtype_bytes
        act = max(act + held, own) + images
    elif profile.controlnet_units:  # planning/controlnet.py: its residuals beside the UNet's step, or its own forward
        held = coef * profile.controlnet_held * hw * n * dtype_bytes
        summed = held if profile.controlnet_units > 1 else 0.0  # the residuals of the units before it
        # an inpainting UNet's mask and masked-image latents are held while the ControlNet runs too (half of
        # inpaint_input_bytes: the other half is the UNet step's concatenated input)
        own = coef * profile.controlnet_peak * hw * n * dtype_bytes + summed + inpaint / 2
        images = profile.controlnet_units * 3 * hw * sf * sf * n * dtype_bytes  # the control images, whole pass
        act = max(act + held, own) + images
    return int(act)


def inpaint_input_bytes(profile: ModelProfile, hw: int, n: float, dtype_bytes: int) -> int:
    """An inpainting UNet's inputs beyond the latents (in_channels 9: the mask and the masked image's latents),
    counted twice: held for the whole pass, and again in the step's concatenated input. 0 for a 4-channel UNet."""
    extra = profile.unet_in_channels - 4 if profile.unet_channels else 0
    return int(2 * max(0, extra) * hw * n * dtype_bytes)


def vae_activation_bytes(profile: ModelProfile, width: int, height: int, images: int, dtype_bytes: int,
                         slicing: bool = False, tiling: bool = False, tile_px: int | None = None) -> int:
    """Activations of decoding `images` latents, with diffusers' VAE slicing and tiling (tiles of
    `tile_px` pixels, as apply.vae_tile_size picks them; None: the VAE config's own tile size)."""
    sf = profile.vae_scale_factor
    lh, lw = math.ceil(height / sf), math.ceil(width / sf)
    coef = _coefficient("vae", profile.arch) * vae_feature(profile) * dtype_bytes
    image = 3 * (lh * sf) * (lw * sf) * dtype_bytes  # one decoded image

    def decode(h: int, w: int, n: int) -> float:
        return coef * h * w * (n + _per_call("vae"))

    best = decode(lh, lw, images)
    per_call = images
    if slicing and images > 1:
        # one image at a time; the decoded slices and their torch.cat stay until the end
        best = min(best, decode(lh, lw, 1) + 2 * images * image)
        per_call = 1
    tile = max(1, (tile_px or profile.vae_sample_size) // sf)
    if tiling and (lh > tile or lw > tile):
        # one tile decoded at a time; the decoded tiles (overlapping) and the blended result stay
        tiles_kept = per_call * image / (1 - VAE_TILE_OVERLAP) ** 2
        extra_slices = 2 * images * image if per_call == 1 and images > 1 else 0
        best = min(best, decode(min(lh, tile), min(lw, tile), per_call) + tiles_kept + per_call * image + extra_slices)
    return int(best)


def text_activation_bytes(profile: ModelProfile, prompts: int, dtype_bytes: int) -> int:
    """Text encoders: their prompt length (CLIP 77, T5 the pipeline's), every hidden state kept (SDXL
    reads the penultimate one). Not calibrated; the text phase is the peak only when its weights are."""
    tokens = profile.text_tokens or (TEXT_TOKENS,) * len(profile.text_hidden)
    return int(sum(prompts * t * h * (layers + 16) * dtype_bytes
                   for h, layers, t in zip(profile.text_hidden, profile.text_layers, tokens)))


def estimate(profile: ModelProfile, width: int, height: int, batch: int, settings: MemorySettings,
             cfg: bool = True, vae_tile: int | None = None) -> Estimate:
    """Peak device memory of generating `batch` images of width x height in one forward pass each step
    (`vae_tile`: the VAE tile edge in pixels when the settings tile the VAE; None: the VAE's default)."""
    if width <= 0 or height <= 0 or batch <= 0:
        raise ValueError(f"width, height and batch must be positive, got {width}x{height}, batch {batch}")
    if settings.dtype not in DTYPE_BYTES:
        raise ValueError(f"dtype {settings.dtype!r} is not one of {', '.join(DTYPE_BYTES)}")
    b = DTYPE_BYTES[settings.dtype]
    cfg = cfg and profile.cfg_batch  # Flux: no CFG batch whatever the guidance scale
    images = batch * (2 if cfg else 1)
    # SDXL-style pipelines decode in float32 when the VAE is float16 and its config says force_upcast
    vae_b = 4 if (settings.dtype == "float16" and profile.vae_force_upcast) else b

    unet_act = unet_activation_bytes(profile, width, height, images, b, settings.attention)
    vae_act = vae_activation_bytes(profile, width, height, batch, vae_b, settings.vae_slicing, settings.vae_tiling,
                                   vae_tile)
    text_act = text_activation_bytes(profile, 2 if cfg else 1, b)

    den = profile.denoiser
    p = profile.params
    te_names = profile.text_encoders
    q_bytes = QUANTIZED_BYTES.get(settings.quantize)
    te_each = [text_encoder_bytes(profile, n, settings.dtype, settings.quantize) for n in te_names]
    den_full = p.get(den, 0) * b
    # the denoiser's weights as stored; narrower storage adds the one layer dequantized while it runs
    if q_bytes and not profile.denoiser_quantized:  # weight-only int8/int4 (models/quantize.py)
        den_stored = (p.get(den, 0) - profile.quantized_kept) * q_bytes + profile.quantized_kept * b
    elif profile.denoiser_quantized:  # GGUF: the stored size
        den_stored = (p.get(den, 0) - profile.denoiser_quantized) * b + profile.denoiser_quantized_bytes
    elif settings.fp8_storage:  # (a GGUF denoiser is never given fp8 storage: engines/sd/apply.py)
        den_stored = (p.get(den, 0) - profile.fp8_kept) * FP8_BYTES + profile.fp8_kept * b
    else:
        den_stored = den_full
    narrow = den_stored != den_full
    scratch = profile.largest_layer.get(den, 0) * b if narrow else 0  # the layer dequantized while it runs
    den_w = den_stored + scratch
    den_scale = den_stored / den_full if den_full else 1.0  # bytes as stored per byte at the dtype
    vae_w = p.get("vae", 0) * b
    vae_w_decode = p.get("vae", 0) * vae_b
    cn_n, cn_kept = profile.controlnet_params, profile.controlnet_quant_kept
    cn_w = int((cn_n - cn_kept) * q_bytes + cn_kept * b if q_bytes and not profile.denoiser_quantized else cn_n * b)
    cn_resident, cn_streamed = (cn_w, 0) if settings.offload in ("none", "model") else (0, cn_w)

    off = settings.offload
    streamed, per_job, resident = 0, 0, 0
    if off == "model":
        per_job = sum(te_each) + den_w + vae_w_decode
    elif off in ("group", "sequential"):
        streamed, per_job = den_w, sum(te_each) + vae_w_decode
    if off == "none":
        rest = sum(te_each) + den_w
        phases = {"text": (rest + vae_w, text_act), "unet": (rest + vae_w, unet_act),
                  "vae": (rest + max(vae_w, vae_w_decode), vae_act)}
    else:
        model_phases = {"text": (max(te_each, default=0), text_act), "unet": (den_w, unet_act),
                        "vae": (vae_w_decode, vae_act)}
        phases = model_phases
        if off in ("group", "sequential", "budget"):
            def leaf(name: str, nbytes: float) -> float:
                # the running layer and the prefetched one; under fp8 storage each is upcast to
                # the compute dtype while it runs, so count them at that size
                return 2 * profile.largest_layer.get(name, 0) * nbytes

            blocks = sorted(profile.denoiser_blocks, reverse=True) or [p.get(den, 0)]
            # the unmatched top-level group stays loaded; one block group runs while the next is
            # prefetched on a CUDA stream (two blocks resident)
            group_den = (profile.denoiser_unmatched + sum(blocks[:2])) * b * den_scale + scratch
            # text encoders are offloaded leaf by leaf under both modes (apply.PipelineOps.group_offload)
            te_leaf = max((leaf(n, b) for n in te_names), default=0)
            group = {"text": (min(te_leaf, model_phases["text"][0]), text_act),
                     "unet": (min(group_den, den_w), unet_act), "vae": model_phases["vae"]}
            phases = group
            if off == "budget":
                # blocks kept on the GPU for the whole job (the planner's split, planning/residency.py);
                # the rest streamed one block at a time with the next one prefetched
                bpe = b * den_scale  # bytes per denoiser element as stored (fp8 or quantized: fewer)
                blocks = [(n, int(c * bpe)) for n, c in profile.residency_blocks]
                split = residency.split(blocks, settings.resident_bytes)
                kept = int(profile.residency_fixed * bpe) + split.resident_bytes
                if cn_n:  # the ControlNets' blocks in the same split (planning/controlnet.py names them); their
                    # fixed part (embeddings, conv_in, the last zero convolution) stays with the resident part
                    on_gpu = set(split.resident)
                    cn_streamed = min(cn_w, sum(c for n, c in blocks
                                                if n.startswith(controlnet_prefix) and n not in on_gpu))
                    cn_resident = cn_w - cn_streamed
                streamed, resident = split.streamed_bytes_per_step, split.resident_bytes
                # the resident part is on the GPU only while the denoiser runs: moved in before the
                # denoise and out before the VAE decode (engines/sd/runner.py), so the decode has its room
                per_job = sum(te_each) + vae_w_decode + 2 * kept
                phases = {"text": (kept + group["text"][0], text_act),
                          "unet": (min(kept + split.in_flight_bytes + scratch, den_w), unet_act),
                          "vae": group["vae"]}
            if off == "sequential":
                den_leaf = leaf(den, b)
                phases = {"text": (min(te_leaf, group["text"][0]), text_act),
                          "unet": (min(den_leaf, group["unet"][0]), unet_act),
                          "vae": (min(leaf("vae", vae_b), group["vae"][0]), vae_act)}
    phase, (weights, act) = max(phases.items(), key=lambda kv: kv[1][0] + kv[1][1])
    weights = int(weights)
    total = weights + int(act) + OVERHEAD_BYTES
    return Estimate(total_bytes=total, weights_bytes=weights, unet_bytes=unet_act, vae_bytes=vae_act,
                    overhead_bytes=OVERHEAD_BYTES, peak_phase=phase, streamed_bytes_per_step=int(streamed),
                    moved_bytes_per_job=int(per_job), resident_bytes=int(resident), denoiser_bytes=int(den_stored),
                    controlnet_bytes=cn_w, controlnet_resident_bytes=int(cn_resident),
                    controlnet_streamed_bytes_per_step=int(cn_streamed))
