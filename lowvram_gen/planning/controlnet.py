"""A ControlNet in the memory plan: one more model that runs beside the denoiser at every step.

diffusers' ControlNet pipelines call the ControlNet, then the UNet, at every step; the ControlNet's
residuals (one per skip connection of the UNet's down path, and one for its mid block) are held while the
UNet runs. So the plan counts it as part of the denoiser, exactly as the runner treats it
(engines/sd/apply.py puts it under the same offload hooks):

- weights: its parameters join the denoiser's, so each candidate holds, streams, quantizes (int8/int4) and
  offloads them as it does the UNet's: resident under highvram, moved in beside the UNet under medvram,
  streamed every step under lowvram/novram, and under budget its blocks join the UNet's in one residency
  split (named `controlnetN:<block>`, as apply names them). fp8 storage is the UNet's alone: its parameters
  count at the compute dtype there (`fp8_kept`).
- activations: the UNet's step plus the residuals it is handed (`held`), or the ControlNet's own forward
  (`peak`: its down path, which holds those residuals as it makes them, and its conditioning embedding
  at the image's full resolution), whichever is larger; with several units the residuals summed so far are
  held while the next one runs. Both are elements per latent pixel per image from the ControlNet's config,
  as estimate.unet_feature reads the UNet's, times the UNet's fitted coefficient; plus the control images
  themselves, held for the whole pass.

A ControlNet's profile comes from its config alone (a folder's config.json, or one a single file's tensor
shapes give: models/controlnet.py), instantiated on the meta device; the known sizes (`sd15`, `sdxl`) are
the ControlNets diffusers' `ControlNetModel.from_unet` makes of those UNets, which is what the published
ones are (lllyasviel/control_v11p_sd15_*: 361 M weights, 0.72 GB in fp16; diffusers/controlnet-*-sdxl-1.0:
1.25 B, 2.5 GB). SD3 and Flux ControlNets (a few transformer blocks beside the transformer) are counted the same
way, their activations from their width (see "SD3 and Flux" below). No torch at import; nothing from the engines.
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass, replace

from lowvram_gen import families
from lowvram_gen.errors import InvalidRequest
from lowvram_gen.models import control_lora
from lowvram_gen.models import controlnet as controlnet_files
from lowvram_gen.models.blocks import block_sizes, fixed_bytes, piece_tree
from lowvram_gen.models.counting import instantiate_meta, sdnq_kept
from lowvram_gen.models.profile import ModelProfile
from lowvram_gen.planning import estimate as memory

PREFIX = memory.controlnet_prefix  # block names of the i-th ControlNet in a residency split: controlnet0:<block path>
PIXELS_PER_LATENT = 64  # an SD/SDXL VAE's 8x8 pixels: the conditioning embedding runs at the image's resolution
GEGLU_FF = 3 + 8 * 2  # a transformer block's working set per channel (estimate.unet_feature's)


def block_name(index: int, name: str) -> str:
    return f"{PREFIX}{index}:{name}"


@dataclass(frozen=True)
class ControlNetProfile:
    """What the plan needs of one ControlNet (parameter counts are elements: the dtype comes with the settings)."""

    name: str
    params: int
    cross_attention_dim: int
    channels: tuple[int, ...]
    blocks: tuple[int, ...]  # group offload's block groups (elements of its top-level ModuleLists)
    unmatched: int  # what group offload keeps in its one remaining group
    residency_blocks: tuple[tuple[str, int], ...]  # budget's streamable blocks and their pieces (models.blocks.piece_tree)
    residency_fixed: int
    largest_layer: int
    quant_kept: int  # what sdnq leaves unquantized (estimate.sdnq_kept)
    held: float  # elements per latent pixel per image held while the UNet runs: its residuals
    peak: float  # elements per latent pixel per image at the peak of its own forward
    file_bytes: int = 0
    family: str = "sd"  # "sd" (a UNet's: SD 1.x/2.x, SDXL), "sd3" or "flux" (a transformer's)
    hidden: int = 0  # a transformer ControlNet's width (its forward's working set is estimated from it); 0 for "sd"
    union: bool = False  # a Flux union ControlNet (a control type per unit: not built)

    def as_dict(self) -> dict:
        return {"name": self.name, "params": self.params, "cross_attention_dim": self.cross_attention_dim,
                "channels": list(self.channels), "file_bytes": self.file_bytes}


def controlnet_profile(config: dict, name: str, file_bytes: int = 0) -> ControlNetProfile:
    """The profile of a ControlNet with `config` (counted on the meta device; cached)."""
    return replace(_profile(json.dumps(config, sort_keys=True)), name=name, file_bytes=int(file_bytes))


@functools.lru_cache(maxsize=16)
def _profile(config_json: str) -> ControlNetProfile:
    config = json.loads(config_json)
    if transformer_kind(config) is not None:
        return _transformer_profile(config)
    model = instantiate_meta("diffusers", "ControlNetModel", config)
    if model is None:
        raise ValueError("diffusers has no ControlNetModel")
    blocks, in_blocks, total = block_sizes(model)
    largest = max((sum(p.numel() for p in m.parameters(recurse=False)) for m in model.modules()), default=0)
    channels = tuple(int(c) for c in config.get("block_out_channels", (320, 640, 1280, 1280)))
    cross = config.get("cross_attention_dim", 1280)
    cross = int(max(cross) if isinstance(cross, (list, tuple)) else cross)
    held, peak = _features(config, channels)
    return ControlNetProfile(name="", params=total, cross_attention_dim=cross, channels=channels,
                             blocks=tuple(blocks), unmatched=total - in_blocks,
                             residency_blocks=tuple(piece_tree(model, bytes_per_element=1)),
                             residency_fixed=fixed_bytes(model, bytes_per_element=1), largest_layer=largest,
                             quant_kept=sdnq_kept(model), held=held, peak=peak)


def _features(config: dict, channels: tuple[int, ...]) -> tuple[float, float]:
    """(held, peak) elements per latent pixel per image (see the module doc), from the config's shape: each level's
    resnet outputs and the level above's downsampled output (conv_in's at the first) are kept as residuals, the
    mid block's too; a level's working set is a resnet's (3.5 x channels) or a transformer block's."""
    n = len(channels)
    lpb = config.get("layers_per_block", 2)
    lpb = int(max(lpb) if isinstance(lpb, (list, tuple)) else lpb)
    types = list(config.get("down_block_types") or ["CrossAttnDownBlock2D"] * n)
    res = [4.0 ** -level for level in range(n)]
    held = sum(res[i] * (lpb * channels[i] + (channels[i - 1] if i else channels[0])) for i in range(n))
    held += res[-1] * channels[-1]  # the mid block's residual
    working = max(res[i] * max(3.5 * channels[i], GEGLU_FF * channels[i] if "Attn" in types[i] else 0.0)
                  for i in range(n))
    cond = list(config.get("conditioning_embedding_out_channels") or [16])
    embedding = PIXELS_PER_LATENT * 3 * int(cond[0])  # its first convolutions, at the image's full resolution
    return float(held), float(max(held + working, embedding))


def family_label(cross_attention_dim: int) -> str:
    """A UNet family by its cross-attention width ('SD 1.x', 'SD 2.x', 'SDXL': the records' version_label)."""
    family = families.by_unet_cross_attention(int(cross_attention_dim))
    return family.version_label if family is not None else f"a {cross_attention_dim}-wide cross-attention model"


def check_matches(profile: ModelProfile, cn: ControlNetProfile, model: str) -> None:
    """A ControlNet must be made for the base model: its residuals are added to the UNet's skip connections and
    it reads the same text embeddings, so its block widths and cross-attention width must be the UNet's. One
    sentence naming both otherwise (exit 2), before any weight is read. SD3/Flux: `check_transformer_match`."""
    if is_transformer_kind(cn.family) or profile.denoiser != "unet" or not profile.unet_channels:
        check_transformer_match(profile, cn, model)
        return
    if cn.cross_attention_dim != profile.cross_attention_dim or tuple(cn.channels) != tuple(profile.unet_channels):
        def shape(cross, channels):
            return f"{family_label(cross)} (cross-attention {cross}, blocks {'/'.join(map(str, channels))})"

        raise InvalidRequest("controlnet", cn.name,
                             f"it is made for {shape(cn.cross_attention_dim, cn.channels)} and the model {model!r} is "
                             f"{shape(profile.cross_attention_dim, profile.unet_channels)}: use a ControlNet made for "
                             "that model's family")


def with_controlnets(profile: ModelProfile, cns: list[ControlNetProfile],
                     units: int | None = None) -> ModelProfile:
    """`profile` with the ControlNets `cns` (each model once) counted as part of its denoiser, run for `units`
    units (default one each; two units may share a model: its weights once, its forward and image twice)."""
    if not cns:
        return profile
    den = profile.denoiser
    params = dict(profile.params)
    params[den] = params.get(den, 0) + sum(c.params for c in cns)
    largest = dict(profile.largest_layer)
    largest[den] = max([largest.get(den, 0), *(c.largest_layer for c in cns)])
    files = dict(profile.file_bytes)
    if files.get(den):
        files[den] += sum(c.file_bytes or 2 * c.params for c in cns)  # a known size: a published fp16 file
    blocks = tuple(profile.residency_blocks) + tuple((block_name(i, n), b) for i, c in enumerate(cns)
                                                     for n, b in c.residency_blocks)
    quant_kept = profile.quantized_kept + sum(c.quant_kept for c in cns)
    return replace(
        profile, params=params, largest_layer=largest, file_bytes=files, residency_blocks=blocks,
        residency_fixed=profile.residency_fixed + sum(c.residency_fixed for c in cns),
        denoiser_blocks=tuple(profile.denoiser_blocks) + tuple(b for c in cns for b in c.blocks),
        denoiser_unmatched=profile.denoiser_unmatched + sum(c.unmatched for c in cns),
        fp8_kept=profile.fp8_kept + sum(c.params for c in cns),  # fp8 storage is the UNet's only
        quant_kept=quant_kept,
        controlnet_params=sum(c.params for c in cns), controlnet_quant_kept=sum(c.quant_kept for c in cns),
        controlnet_held=max(c.held for c in cns),
        controlnet_peak=max(c.peak for c in cns), controlnet_units=units or len(cns),
        controlnets=tuple(c.name for c in cns), controlnet_hidden=max(c.hidden for c in cns))


# ------------------------------------------------------------------------------------------ SD3 and Flux
# A transformer ControlNet (diffusers' SD3ControlNetModel, FluxControlNetModel) is a few of the transformer's own
# blocks run over the same token stream, plus the control image's tokens added to its input; each block's output,
# through a zero-initialised linear layer, is added to the hidden states of the transformer's blocks. So:
# - its residuals: one image-token stream (tokens x its width) per block (Flux: its double and single blocks), held
#   while the transformer runs (`held`, elements per latent pixel: one token covers 2x2 latent pixels in both, SD3's
#   patch 2 and Flux's 2x2 packing);
# - its own forward: the transformer's working set at its width over the same tokens (estimate.unet_activation_bytes
#   takes it from `hidden` and the base's token count, with the transformer's fitted coefficient), and at its end its
#   block outputs, their projections and the scaled copies (three residual streams) at once;
# - the control image goes through the VAE's encoder inside the pipeline's call (SD3's, InstantX's Flux ones), or
#   XLabs' conditioning embedding (Flux): counted with the control images, as the SD path counts them.
# Which ControlNets fit which base, their labels and what diffusers builds for them are the family records'
# (`Family.controlnet`): a ControlNet's `family` here is its kind ('sd', 'sd3', 'flux'), the records' `kind`.


def _kind_family(kind: str | None) -> families.Family | None:
    return families.controlnet_kinds().get(kind) if kind else None


def is_transformer_kind(kind: str | None) -> bool:
    """The ControlNet kind is a transformer ControlNet's (SD3's, Flux's), not a UNet's."""
    family = _kind_family(kind)
    return family is not None and family.denoiser == "transformer"


def transformer_kind(config: dict) -> str | None:
    """The kind of a transformer ControlNet's config ('sd3', 'flux'); None for a UNet's (ControlNetModel)."""
    family = families.by_controlnet_class(str(config.get("_class_name", "")))
    return family.controlnet.kind if family is not None and family.denoiser == "transformer" else None


def _transformer_profile(config: dict) -> ControlNetProfile:
    family = transformer_kind(config)
    model = instantiate_meta("diffusers", config["_class_name"], config)
    if model is None:
        raise ValueError(f"diffusers has no {config['_class_name']}")
    blocks, in_blocks, total = block_sizes(model)
    largest = max((sum(p.numel() for p in m.parameters(recurse=False)) for m in model.modules()), default=0)
    facts = _kind_family(family).controlnet
    if facts.stream is not None:  # a config of its own layout (Z-Image's: dim, control_layers_places)
        hidden, residuals = facts.stream(config)
    else:
        hidden = int(config.get("num_attention_heads", 1)) * int(config.get("attention_head_dim", 1))
        residuals = int(config.get("num_layers", 0)) + int(config.get("num_single_layers", 0) or 0)
    # latent pixels per token of its stream: SD3's patch 2; Flux's 2x2 packing of 16-channel latents, patch 1 on top
    latent_per_token = facts.latent_per_token(config)
    return ControlNetProfile(name="", params=total, cross_attention_dim=int(config.get("joint_attention_dim") or 0),
                             channels=(), blocks=tuple(blocks), unmatched=total - in_blocks,
                             residency_blocks=tuple(piece_tree(model, bytes_per_element=1)),
                             residency_fixed=fixed_bytes(model, bytes_per_element=1), largest_layer=largest,
                             quant_kept=sdnq_kept(model), held=residuals * hidden / latent_per_token, peak=0.0,
                             family=family, hidden=hidden, union=config.get("num_mode") is not None)


def base_family(profile: ModelProfile) -> str | None:
    """The ControlNet kind that fits the base model ('sd' for a UNet, 'sd3', 'flux', 'qwen-image', 'sana'), or None
    (another transformer: PixArt, Chroma, ...), from the base model's profile."""
    if profile.denoiser == "unet" and profile.unet_channels:
        unet = next((f for f in families.controlnet_kinds().values() if f.denoiser == "unet"), None)
        return unet.controlnet.kind if unet is not None else None
    family = _record_of(profile)
    return family.controlnet.kind if family is not None and family.controlnet is not None else None


def _record_of(profile: ModelProfile) -> families.Family | None:
    """The record of a transformer base model, from its profile (None: none claims it): its folder's pipeline class
    where read, else its denoiser's class."""
    if profile.family:
        return families.by_key(profile.family)
    return families.by_denoiser_class(profile.denoiser_class) if profile.denoiser_class else \
        families.by_arch(profile.arch)


def _with_controlnets() -> str:
    """The families ControlNet runs with, in the records' order: 'SD 1.x/2.x, SDXL, SD3, Flux, ... and SANA'."""
    names = list(dict.fromkeys(f.name for f in families.FAMILIES if f.controlnet is not None))
    return ", ".join(names[:-1]) + f" and {names[-1]}" if len(names) > 1 else "".join(names)


def _label(family: str | None, profile: ModelProfile | None = None, cn: ControlNetProfile | None = None) -> str:
    if is_transformer_kind(family):
        return _kind_family(family).controlnet.label
    if _kind_family(family) is not None:
        return family_label(cn.cross_attention_dim if cn is not None else profile.cross_attention_dim)
    return "a transformer model without a diffusers ControlNet pipeline"


def check_transformer_match(profile: ModelProfile, cn: ControlNetProfile, model: str) -> None:
    """An SD3 ControlNet goes with an SD3 model and a Flux one with a Flux model, at the transformer's width (its
    residuals are added to the transformer's hidden states); one sentence naming both otherwise (exit 2)."""
    base = base_family(profile)
    if base is None:
        record = _record_of(profile)
        if record is not None and not record.is_generic:
            raise InvalidRequest("controlnet", cn.name, f"diffusers has no ControlNet pipeline for {record.name} (the "
                                                        f"model {model!r}): ControlNet runs with {_with_controlnets()} "
                                                        "models")
    if cn.family != base:
        raise InvalidRequest("controlnet", cn.name, f"it is a ControlNet for {_label(cn.family, cn=cn)} and the "
                                                    f"model {model!r} is {_label(base, profile)}: use a ControlNet "
                                                    "made for that model's family")
    if cn.hidden != profile.transformer_hidden:
        raise InvalidRequest("controlnet", cn.name, f"it is made for a {cn.hidden}-wide {_label(base)} transformer "
                                                    f"and the model {model!r}'s is {profile.transformer_hidden} wide "
                                                    f"(another {_label(base)} model): use a ControlNet made for it")
    if cn.union:
        raise InvalidRequest("controlnet", cn.name, "it is a Flux union ControlNet, which needs a control type per "
                                                    "unit: not built here; use a single-type Flux ControlNet")


def transformer_refusal(family: str, img2img: bool, control_mode: str, inpaint: bool = False) -> str | None:
    """Why diffusers has no pipeline for a transformer ControlNet job of this kind (None: it has): SD3's has no img2img
    (hires fix's second pass is one), neither has a guess mode (A1111's 'ControlNet is more important') nor the
    residuals of a UNet's ControlNet that A1111's 'My prompt is more important' scales; `inpaint` (a mask) runs where
    the family's record has a ControlNet inpaint pipeline (Qwen-Image's, Z-Image's)."""
    facts = _kind_family(family).controlnet
    label = facts.label
    if control_mode != "balanced" and not facts.guess_mode:
        return (f"control mode {control_mode!r} is not in diffusers' {label} ControlNet pipeline: use balanced (A1111's "
                "other modes act on a UNet ControlNet's residuals)")
    if inpaint and facts.inpaint is None:
        return (f"ControlNet inpainting is not built for {label} (diffusers has no {label} ControlNet inpaint "
                f"pipeline): inpaint without ControlNet, or run {label} ControlNets in txt2img")
    if img2img and not inpaint and not facts.img2img:
        return (f"diffusers has no {label} ControlNet img2img pipeline (hires fix's second pass is img2img too)"
                + ("" if facts.inpaint else f" and ControlNet inpainting is not built for {label}")
                + f": run {label} ControlNets in txt2img without hires fix"
                + (" or inpaint with a mask" if facts.inpaint else ""))
    return None


def check_job(cns: list[ControlNetProfile], img2img: bool, hires: bool, control_mode: str,
              inpaint: bool = False) -> None:
    """`transformer_refusal` for the job's transformer ControlNets, before anything loads (one sentence, exit 2);
    `inpaint`: the job has a mask (its first pass is the ControlNet inpaint pipeline, hires fix's second img2img)."""
    for cn in cns:
        if is_transformer_kind(cn.family):
            why = transformer_refusal(cn.family, img2img or hires, control_mode, inpaint and not hires) or \
                union_refusal(cn.family, len(cns))
            if why:
                raise InvalidRequest("controlnet", cn.name, why)


def union_refusal(family: str, models: int) -> str | None:
    """Why `models` distinct ControlNets of `family` cannot run in one job where its multi-ControlNet runs the units
    of one (union) ControlNet alone (Qwen-Image's); None: they can."""
    facts = _kind_family(family).controlnet
    if facts.multi_union is None or models <= 1:
        return None
    return (f"diffusers' {facts.label} ControlNet pipeline runs several units of one ControlNet (a union one, "
            f"{facts.multi_union}), not {models} different ControlNets: give every unit the same ControlNet, each "
            "with its own control image")


def plan_profiles(specs: list[str], base, model: str, known_sizes: bool = False) -> list:
    """The planning profiles of the ControlNets `specs` (models/controlnet.py finds and reads them), each model
    once, each checked against the base model's profile `base` (one sentence, exit 2, for a ControlNet of another
    family): configs only, no weights."""
    out = {}
    for spec in specs:
        source = controlnet_files.resolve_controlnet(spec, known_sizes)
        if source.key not in out:  # two units of one model: its weights once (engines/sd/controlnet.attach_for)
            config = controlnet_files.config_of(source)
            out[source.key] = controlnet_profile(config, spec, controlnet_files.file_bytes(source))
            check_matches(base, out[source.key], model)
            if source.kind == "control_lora":
                out[source.key] = control_lora.control_lora_profile(out[source.key], config, base, model)
    return list(out.values())
