"""Peak device memory of a VQGAN-CLIP job under each preset, and the plan that picks where it starts.

An iteration holds, at its peak (CLIP's backward of the last chunk of cutouts):

    weights on the device      VQGAN decoder (+ codebook), CLIP vision tower, and the text tower
                               unless the preset offloads it (the VQGAN encoder is never kept there)
  + decoder activations        everything the decoder saved for its backward, in float32: per resnet
                               ~3 C_in + 3 C_out, per attention ~7 C, per upsample 4 C (at the
                               higher resolution), per element of the latent grid scaled to its level;
                               with gradient checkpointing only the block inputs while CLIP runs,
                               and one recomputed block later, in the decoder's own backward
  + cutouts                    cutn x 3 x S x S in float32, ~3 copies per augmentation, and the grad
  + CLIP activations           one chunk: per layer ~15 x hidden x tokens in float32 (LayerNorms,
                               q/k/v, MLP with quick-GELU); less under autocast on a GPU
  + a fixed overhead           memory.OVERHEAD_BYTES (kernels, workspaces, allocator rounding)

The decoder and CLIP coefficients are checked against CPU peak-RSS measurements of the real
architectures (random weights) in benchmarks/bench_vqgan.py; docs/benchmarks.md has the comparison.
Nothing here imports torch unless a profile is built from a folder or from loaded models.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path

from lowvram_gen import safe_json
from lowvram_gen.models import vqgan_models as vm
from lowvram_gen.planning.estimate import OVERHEAD_BYTES
from lowvram_gen.planning.planner import PresetEstimate, choose
from lowvram_gen.planning.sizes import capped_size
from lowvram_gen.presets import gpu_ladder

RESNET_IN, RESNET_OUT = 3.0, 3.0  # saved tensors per resnet block, in units of its in/out channels
ATTN = 7.0  # saved tensors per attention block (norm, q, k, v, output, projections)
UPSAMPLE = 4.0  # the nearest-upsampled input of the upsample conv (4x the pixels)
FINAL = 3.0  # conv_norm_out, SiLU and conv_out inputs at full resolution
CLIP_PER_LAYER = 15.0  # x hidden x tokens, float32 (measured on ViT-B/32: 60 bytes; see docs/benchmarks.md)
# CLIP under autocast: activations in half precision (LayerNorm inputs and the residual stream stay
# float32), ~0.6 of float32; but every linear layer also keeps its half-precision weight copy for
# the backward (the weights do not require grad, so autocast does not cache them): + the vision
# tower's parameters x 2 bytes per pass. Fitted on the CPU (bfloat16, 8 and 16 cutouts of ViT-B/32);
# CUDA's float16 autocast casts the same ops.
AUTOCAST_FRACTION = 0.6
# Copies of the cutout batch alive at the peak: the resized crops, the noise and the normalised chunk,
# ~3 per kornia augmentation (grids, colour-space intermediates saved for the backward), and the gradient.
CUTOUT_COPIES, CUTOUT_COPIES_PER_AUGMENT = 3.0, 3.0

# Built-in architectures (parameter counts from the configs on the meta device), so `plan` needs no files.
BUILTIN_VQGAN = {
    "vqgan_imagenet_f16_16384": dict(vq_params=76_073_859, vq_encoder_params=29_363_968, n_embed=16384),
    "vqgan_imagenet_f16_1024": dict(vq_params=72_141_699, vq_encoder_params=29_363_968, n_embed=1024),
}
_F16 = dict(channels=(128, 128, 256, 256, 512), layers_per_block=2, latent_channels=256, embed_dim=256,
            attn_levels=(False, False, False, False, True))
BUILTIN_CLIP = {
    "ViT-B/32": dict(clip_vision_params=87_849_216, clip_text_params=63_428_096, clip_hidden=768, clip_layers=12,
                     clip_image_size=224, clip_patch=32),
    "ViT-B/16": dict(clip_vision_params=86_192_640, clip_text_params=63_428_096, clip_hidden=768, clip_layers=12,
                     clip_image_size=224, clip_patch=16),
    "ViT-L/14": dict(clip_vision_params=303_966_208, clip_text_params=123_650_304, clip_hidden=1024, clip_layers=24,
                     clip_image_size=224, clip_patch=14),
    "ViT-L/14@336px": dict(clip_vision_params=304_293_888, clip_text_params=123_650_304, clip_hidden=1024,
                           clip_layers=24, clip_image_size=336, clip_patch=14),
}
DEFAULT_VQGAN, DEFAULT_CLIP = "vqgan_imagenet_f16_16384", "ViT-B/32"
ALIASES = {"f16": "vqgan_imagenet_f16_16384", "f16_16384": "vqgan_imagenet_f16_16384", "imagenet_f16_16384":
           "vqgan_imagenet_f16_16384", "f16_1024": "vqgan_imagenet_f16_1024",
           "openai/clip-vit-base-patch32": "ViT-B/32", "openai/clip-vit-base-patch16": "ViT-B/16",
           "openai/clip-vit-large-patch14": "ViT-L/14", "openai/clip-vit-large-patch14-336": "ViT-L/14@336px"}


@dataclass(frozen=True)
class VqganProfile:
    name: str
    vq_params: int
    vq_encoder_params: int  # encoder + quant_conv: on the device only while encoding an init image
    channels: tuple[int, ...]  # block_out_channels, encoder order
    layers_per_block: int
    latent_channels: int
    embed_dim: int
    n_embed: int
    attn_levels: tuple[bool, ...]
    clip_vision_params: int
    clip_text_params: int
    clip_hidden: int
    clip_layers: int
    clip_image_size: int
    clip_patch: int

    @property
    def factor(self) -> int:
        return 2 ** (len(self.channels) - 1)

    def as_dict(self) -> dict:
        return {k: list(v) if isinstance(v, tuple) else v for k, v in asdict(self).items()}


def profile_builtin(vqgan: str = DEFAULT_VQGAN, clip: str = DEFAULT_CLIP) -> VqganProfile:
    v, c = ALIASES.get(vqgan, vqgan), ALIASES.get(clip, clip)
    if v not in BUILTIN_VQGAN:
        raise ValueError(f"unknown built-in VQGAN {vqgan!r}; use one of {', '.join(BUILTIN_VQGAN)}")
    if c not in BUILTIN_CLIP:
        raise ValueError(f"unknown built-in CLIP {clip!r}; use one of {', '.join(BUILTIN_CLIP)}")
    return VqganProfile(name=f"{v}+{c}", **_F16, **BUILTIN_VQGAN[v], **BUILTIN_CLIP[c])


def _count(modules) -> int:
    return sum(p.numel() for m in modules for p in m.parameters())


def _vq_fields(vq) -> dict:
    cfg = vq.config
    return dict(vq_params=_count([vq]), vq_encoder_params=_count([vq.encoder, vq.quant_conv]),
                channels=tuple(int(c) for c in cfg.block_out_channels), layers_per_block=int(cfg.layers_per_block),
                latent_channels=int(cfg.latent_channels), embed_dim=int(cfg.vq_embed_dim or cfg.latent_channels),
                n_embed=int(cfg.num_vq_embeddings), attn_levels=tuple("Attn" in t for t in cfg.down_block_types))


def _clip_fields(clip_model) -> dict:
    vc = clip_model.config.vision_config
    return dict(clip_vision_params=_count([clip_model.vision_model, clip_model.visual_projection]),
                clip_text_params=_count([clip_model.text_model, clip_model.text_projection]),
                clip_hidden=int(vc.hidden_size), clip_layers=int(vc.num_hidden_layers),
                clip_image_size=int(vc.image_size), clip_patch=int(vc.patch_size))


def profile_from_models(vq, clip_model, name: str = "custom") -> VqganProfile:
    """From a loaded (or meta) diffusers VQModel and transformers CLIPModel."""
    return VqganProfile(name=name, **_vq_fields(vq), **_clip_fields(clip_model))


def profile_from_specs(vqgan: str, clip: str) -> VqganProfile:
    """Built-in names, or anything --vqgan/--clip accept (configs are read on the meta device; no weights)."""
    v, c = ALIASES.get(vqgan, vqgan), ALIASES.get(clip, clip)
    vq_part = {**_F16, **BUILTIN_VQGAN[v]} if v in BUILTIN_VQGAN else None
    clip_part = BUILTIN_CLIP.get(c)
    if vq_part is None or clip_part is None:
        from accelerate import init_empty_weights

        if vq_part is None:
            from diffusers import VQModel

            src = vm.resolve_vqgan(vqgan)
            if src.kind == "taming":
                cfg = vm.diffusers_config(vm.read_taming_config(src.config))
            else:
                cfg = {k: x for k, x in safe_json.load_file(Path(src.path) / "config.json").items()
                       if not k.startswith("_")}
            with init_empty_weights(include_buffers=True):
                vq_part = _vq_fields(VQModel.from_config(cfg))
        if clip_part is None:
            from transformers import CLIPConfig, CLIPModel

            config = CLIPConfig.from_pretrained(str(vm.resolve_clip(clip).path))
            with init_empty_weights(include_buffers=True):
                clip_part = _clip_fields(CLIPModel(config))
    return VqganProfile(name=f"{v}+{c}", **vq_part, **clip_part)


# ------------------------------------------------------------------------------------- estimate


@dataclass(frozen=True)
class VqganEstimate:
    total_bytes: int
    weights_bytes: int
    decoder_bytes: int  # decoder activations kept for the backward
    cutouts_bytes: int
    clip_bytes: int  # CLIP activations of one chunk
    overhead_bytes: int
    peak_phase: str  # 'iterate' | 'text' | 'init'

    def as_dict(self) -> dict:
        return asdict(self)


def decoder_terms(p: VqganProfile, width: int, height: int, checkpointing: bool = False) -> tuple[int, int]:
    """(bytes the decoder holds while CLIP runs over the cutouts, bytes at the peak of its own backward).

    Without checkpointing both are everything it saved for its backward. With it, only the block
    inputs (and the final layers) are held while CLIP runs; the backward then recomputes one block at
    a time, after the CLIP activations and the cutouts' augmentations are gone.
    """
    hw = max(1, height // p.factor) * max(1, width // p.factor)
    rev, attn = list(reversed(p.channels)), list(reversed(p.attn_levels))
    mid = hw * rev[0] * (2 * (RESNET_IN + RESNET_OUT) + ATTN)
    blocks, inputs = [mid], [hw * rev[0]]
    c_in = rev[0]
    for k, c in enumerate(rev):
        pix = hw * 4**k
        act = pix * ((RESNET_IN * c_in + RESNET_OUT * c) + (p.layers_per_block * (RESNET_IN + RESNET_OUT) * c))
        if attn[k]:
            act += pix * ATTN * c * (p.layers_per_block + 1)
        if k < len(rev) - 1:
            act += pix * UPSAMPLE * c
        blocks.append(act)
        inputs.append(pix * c_in)
        c_in = c
    full = hw * 4 ** (len(rev) - 1)
    final = full * (FINAL * rev[-1] + 3 * 3)  # + the image, its clamp and the [0,1] rescale
    transient = 2 * full * rev[-1]  # the largest tensor being made while its input is still held
    if checkpointing:
        held, backward = sum(inputs) + final, sum(inputs) + max(blocks) + transient
    else:
        held = backward = sum(blocks) + final + transient
    return int(4 * held), int(4 * backward)


def decoder_activation_bytes(p: VqganProfile, width: int, height: int, checkpointing: bool = False) -> int:
    """Float32 activations of the VQGAN decoder at the worse of its two moments (see `decoder_terms`)."""
    return max(decoder_terms(p, width, height, checkpointing))


def clip_activation_bytes(p: VqganProfile, cutouts: int, autocast: bool, device_kind: str = "cuda") -> int:
    """CLIP's vision tower over `cutouts` cutouts, with the gradient (`device_kind` kept for callers)."""
    tokens = (p.clip_image_size // p.clip_patch) ** 2 + 1
    per = p.clip_layers * CLIP_PER_LAYER * p.clip_hidden * tokens + 2 * p.clip_hidden * tokens
    if autocast:
        return int(cutouts * per * 4 * AUTOCAST_FRACTION + p.clip_vision_params * 2)
    return int(cutouts * per * 4)


def cutout_bytes(p: VqganProfile, cutn: int, augments: int = 4) -> int:
    return int(cutn * 3 * p.clip_image_size**2 * 4 * (CUTOUT_COPIES + CUTOUT_COPIES_PER_AUGMENT * augments + 1))


def estimate_vqgan(p: VqganProfile, width: int, height: int, cutn: int, knobs, augments: int = 4,
                   init_image: bool = False, device_kind: str = "cuda") -> VqganEstimate:
    """Peak device memory of one iteration with `knobs` (a presets.VqganKnobs or loop.Knobs)."""
    if width <= 0 or height <= 0 or cutn <= 0:
        raise ValueError(f"width, height and cutn must be positive, got {width}x{height}, cutn {cutn}")
    chunk = max(1, min(int(knobs.cutn_chunk), cutn))
    decoder_w = (p.vq_params - p.vq_encoder_params) * 4
    vision_w, text_w = p.clip_vision_params * 4, p.clip_text_params * 4
    resident = decoder_w + vision_w + (0 if knobs.clip_text_offload else text_w)
    held, backward = decoder_terms(p, width, height, knobs.gradient_checkpointing)
    cuts = cutout_bytes(p, cutn, augments)
    clip = clip_activation_bytes(p, chunk, knobs.clip_autocast, device_kind)
    dec = max(held, backward)
    phases = {"iterate": (resident, max(held + cuts + clip, backward)), "text": (decoder_w + vision_w + text_w, 0)}
    if init_image:  # the encoder visits the device once, without gradients
        phases["init"] = (resident + p.vq_encoder_params * 4, decoder_activation_bytes(p, width, height, True) // 4)
    phase, (weights, act) = max(phases.items(), key=lambda kv: kv[1][0] + kv[1][1])
    return VqganEstimate(int(weights + act + OVERHEAD_BYTES), int(weights), dec, cuts, clip, OVERHEAD_BYTES, phase)


def plan_vqgan(device, profile: VqganProfile, width: int, height: int, cutn: int, presets: dict, forced=None,
               failed: frozenset | set = frozenset(), augments: int = 4, init_image: bool = False):
    """planner.plan for VQGAN-CLIP: the fastest preset whose estimate fits, and the cheaper ones below it."""
    ladder = gpu_ladder(presets)
    estimates = []
    for p in ladder:
        w, h = capped_size(width, height, p.vqgan.max_pixels, 16)
        est = estimate_vqgan(profile, w, h, cutn, p.vqgan, augments, init_image, device.kind)
        fits = device.is_accelerator and est.total_bytes <= device.usable_bytes
        reason = "ran out of memory before on this device for a job this size" if p.name in failed else ""
        estimates.append(PresetEstimate(p.name, est.total_bytes, fits, w, h, cutn, reason, est.as_dict()))
    return choose(device, presets, estimates, forced,
                  "the ladder lowers the cutout chunk, then the number of cutouts, if needed")
