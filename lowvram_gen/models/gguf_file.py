"""GGUF single files: a block-quantized UNet or transformer on its own (ComfyUI-GGUF / city96 files).

Such a file holds only the denoiser, in the original key layout (LDM `input_blocks.*` for SD 1.x/2.x
and SDXL UNets, BFL `double_blocks.*` for FLUX.1, `joint_blocks.*` for SD3, the 2026 families' own: Z-Image's
`layers.*`, Flux.2's, Qwen-Image's diffusers names), usually without the
`model.diffusion_model.` prefix. The VAE, text encoders, tokenizers and scheduler come from a diffusers
folder of the same base model (`--config`, or the base model in the HF cache), as for any single file
(checkpoint.load_single_file is the one route; this module is its GGUF part). Which family a file's denoiser
is, its class and how its keys become diffusers' are the family record's (`SingleFile.gguf_match`, `gguf_layout`).

The header is read with the `gguf` package (memory-mapped: no tensor data is read); the weights are
mapped from the file (`mapped_checkpoint`: diffusers' own reader copies them) and built by diffusers' own
GGUF support (`GGUFQuantizationConfig`, `<Model>.from_single_file`), which keeps them quantized and
dequantizes one layer at a time at compute.
Before the model is built, the blocks' float16 scales are checked for NaN/Inf (`check_finite_blocks`): the
load-time check of float tensors cannot see inside them. LoRAs apply to such a denoiser as to any other
(peft wraps diffusers' GGUF layers; tests/test_gguf.py), and every offload mode moves its blocks as stored.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from lowvram_gen import families
from lowvram_gen.errors import ModelLoadError
from lowvram_gen.families.keys import UNET
from lowvram_gen.models.checkpoint_keys import layout_hint

GGUF_SUFFIX = ".gguf"
# Attribute set on a denoiser loaded from a GGUF file: the widest plain float type the file stores
# (32 for F32, 16 for F16). Precision above that was never in the file, so the memory layer never
# reloads the denoiser to get it back (engines/sd/apply.needs_reload).
GGUF_BITS = "_lowvram_gguf_bits"
# The types diffusers loads as plain tensors, which then follow the dtype; every other type (the block
# quantizations, and BF16) stays as stored and is dequantized per layer.
_PLAIN_BITS = {"F32": 32, "F16": 16}
_PLAIN = tuple(_PLAIN_BITS)
# Byte offsets of the float16 fields in one block of each block type diffusers dequantizes (ggml's block
# structs: the scale `d`, and the minimum `m` / `dmin` where the type has one). They are the only values of
# a block-quantized tensor that can be NaN/Inf: the quants and the K types' sub-scales are integers, so a
# block decodes to NaN/Inf exactly when one of these does. tests/test_gguf.py checks the table against
# gguf's own dequantizer.
F16_FIELDS = {"Q4_0": (0,), "Q4_1": (0, 2), "Q5_0": (0,), "Q5_1": (0, 2), "Q8_0": (0,),
              "Q2_K": (80, 82), "Q3_K": (108,), "Q4_K": (0, 2), "Q5_K": (0, 2), "Q6_K": (208,),
              "IQ4_NL": (0,), "IQ4_XS": (0,)}


@dataclass(frozen=True)
class GgufHeader:
    """What the planner and the loader need from a GGUF file, read from its header alone."""

    shapes: dict[str, tuple[int, ...]]  # each tensor's logical shape, torch order, names as stored
    types: dict[str, str]  # each tensor's GGML type name: F32, F16, Q8_0, Q4_K, ...
    quantized_params: int  # values held by the tensors kept as stored (block-quantized, BF16)
    quantized_bytes: int  # their bytes as stored
    tensor_bytes: int  # bytes of all tensors as stored
    float_bits: int  # widest plain float type, F32 or F16 (0: none)
    architecture: str | None  # general.architecture: sd1, sdxl, flux, sd3, t5encoder, llama ...


def is_gguf(path) -> bool:
    return Path(path).suffix.lower() == GGUF_SUFFIX


def read_header(path) -> GgufHeader:
    """The tensors a GGUF file holds (names, shapes, types, sizes), checked against the file's size.

    Anything that is not a whole GGUF file is a ModelLoadError naming the file: empty, random bytes
    with a .gguf name, a download cut short. Read once per file version: every job's plan asks for it
    (the profile, the architecture, the stored sizes), and a FLUX.1 file lists ~780 tensors.
    """
    p = Path(path)
    try:
        stat = p.stat()
    except OSError as exc:
        raise ModelLoadError(f"cannot read {p}: {exc.strerror or exc}") from exc
    return _read_header(str(p), stat.st_mtime_ns, stat.st_size)


@lru_cache(maxsize=8)
def _read_header(path: str, _mtime_ns: int, size: int) -> GgufHeader:
    import gguf

    p = Path(path)
    try:
        with open(p, "rb") as f:
            magic = f.read(4)
    except OSError as exc:
        raise ModelLoadError(f"cannot read {p}: {exc.strerror or exc}") from exc
    if size == 0:
        raise ModelLoadError(f"{p} is empty (0 bytes): a failed or unfinished download?")
    if magic != b"GGUF":
        raise ModelLoadError(f"{p} is not a GGUF file: it does not start with the GGUF magic bytes "
                             f"(it starts with {magic!r}); download it again or check the file type")
    try:
        reader = gguf.GGUFReader(str(p))
        tensors = list(reader.tensors)
        end = max((t.data_offset + int(t.n_bytes) for t in tensors), default=0)
    except Exception as exc:  # noqa: BLE001 - a cut header makes the reader fail in many ways
        reason = str(exc).strip().splitlines()[0][:160] if str(exc).strip() else type(exc).__name__
        raise ModelLoadError(f"{p} is a truncated or damaged GGUF file ({reason}); download it again") from None
    if end > size:
        raise ModelLoadError(f"{p} is a truncated GGUF file: its header promises {end} bytes, the file has {size}; "
                             "download it again")
    if not tensors:
        raise ModelLoadError(f"{p} is a GGUF file without tensors")
    shapes, types = {}, {}
    q_params = q_bytes = total = bits = 0
    for t in tensors:
        name, kind = str(t.name), t.tensor_type.name
        shapes[name] = tuple(int(d) for d in reversed(t.shape.tolist()))  # GGUF lists dimensions innermost first
        types[name] = kind
        total += int(t.n_bytes)
        if kind in _PLAIN_BITS:
            bits = max(bits, _PLAIN_BITS[kind])
        elif kind not in ("I8", "I16", "I32", "I64"):
            q_params += int(t.n_elements)
            q_bytes += int(t.n_bytes)
    field = reader.get_field("general.architecture")
    try:
        arch = field.contents() if field is not None else None
    except Exception:  # noqa: BLE001 - an odd metadata type only loses a hint
        arch = None
    return GgufHeader(shapes, types, q_params, q_bytes, total, bits, arch if isinstance(arch, str) else None)


def checkpoint_shapes(header: GgufHeader) -> dict[str, tuple[int, ...]]:
    """The shapes under the names a full original-layout checkpoint uses: a UNet's keys get the
    `model.diffusion_model.` prefix city96's files drop (diffusers' UNet converter needs it; the
    SD3 / Flux converters take both forms and strip it themselves)."""
    shapes = header.shapes
    unet = any(k.removeprefix(UNET).startswith(("input_blocks.", "output_blocks.")) for k in shapes)
    return {(UNET + k if unet and not k.startswith(UNET) else k): v for k, v in shapes.items()}


def family_of(header: GgufHeader, path) -> families.Family:
    """The family record of the denoiser a GGUF holds; a clear refusal for anything else."""
    found = families.by_gguf(checkpoint_shapes(header))
    if found is not None:
        return found
    name = Path(path).name
    what = _not_a_denoiser(list(header.shapes), header.architecture)
    shown = ", ".join(repr(k) for k in list(header.shapes)[:4])
    arch = f", general.architecture {header.architecture!r}" if header.architecture else ""
    raise ModelLoadError(
        f"{name} is a GGUF file but not a UNet or transformer we can load{what}: keys such as {shown} "
        f"({len(header.shapes)} tensors{arch}). --model takes a GGUF of an SD 1.x/2.x or SDXL UNet (keys "
        "input_blocks.*), a FLUX.1 transformer (double_blocks.*), an SD3 transformer (joint_blocks.*) or a Z-Image, "
        "Qwen-Image, Flux.2, Chroma, Lumina 2, SANA or HiDream-I1 transformer, as ComfyUI-GGUF publishes them; the VAE "
        "and text encoders come from --config."
    )


def _not_a_denoiser(keys: list[str], arch: str | None) -> str:
    """A short guess at what else the file holds, for the error message."""
    top = {k.split(".", 1)[0] for k in keys}
    if (arch or "").lower().startswith(("t5", "clip", "umt5")) or top & {"enc", "text_model", "shared"} or \
            any(k.startswith(("encoder.block.", "transformer.resblocks.", "cond_stage_model.")) for k in keys):
        return (" (it looks like a text encoder: text encoders come from the --config folder, and the "
                "GGUF route loads only the denoiser)")
    if top <= {"encoder", "decoder", "quant_conv", "post_quant_conv", "first_stage_model", "vae"}:
        return " (it looks like a VAE: the VAE comes from the --config folder)"
    if "token_embd" in top or any(k.startswith("blk.") for k in keys):
        return f" (it looks like a language model{f' ({arch})' if arch else ''}, not an image model)"
    return layout_hint(keys)


def load_denoiser(path, header: GgufHeader, family: families.Family, folder: Path, torch_dtype):
    """The UNet or transformer of `path`, its weights kept GGUF-quantized (compute in `torch_dtype`)."""
    import diffusers
    from diffusers import GGUFQuantizationConfig
    from diffusers.quantizers.gguf.utils import SUPPORTED_GGUF_QUANT_TYPES

    supported = {t.name for t in SUPPORTED_GGUF_QUANT_TYPES} | set(_PLAIN)
    odd = sorted({t for t in header.types.values() if t not in supported})
    if odd:
        raise ModelLoadError(f"{Path(path).name} uses the GGUF type(s) {', '.join(odd)}, which diffusers cannot "
                             f"dequantize; supported: {', '.join(sorted(supported))}")
    name, model_cls = family.denoiser, family.denoiser_classes[0]
    layout = family.single_file.gguf_layout if family.single_file else ""
    state = mapped_checkpoint(path)
    check_finite_blocks(state, path)
    if layout == "ldm-unet":
        state = {(UNET + k if not k.startswith(UNET) else k): v for k, v in state.items()}
    elif layout == "bfl-flux1":  # converted here: diffusers' converter assumes FLUX.1's width (flux_checkpoint)
        model_class = getattr(diffusers, model_cls)
        state = flux_checkpoint(state, model_class.load_config(str(folder), subfolder=name, local_files_only=True))
    model = getattr(diffusers, model_cls).from_single_file(
        state, config=str(folder), subfolder=name, local_files_only=True, torch_dtype=torch_dtype,
        quantization_config=GGUFQuantizationConfig(compute_dtype=torch_dtype),
    )
    setattr(model, GGUF_BITS, header.float_bits)
    return name, model


def mapped_checkpoint(path) -> dict:
    """The tensors of a GGUF file as diffusers' `load_gguf_checkpoint` gives them (a GGUFParameter for each
    block-quantized tensor, plain tensors for F32/F16), but backed by the file's pages instead of a copy.

    diffusers copies every tensor out of its memory map (`tensor.data.copy()`), so a 6.8 GB Q4 FLUX.1 file
    held 6.8 GB of anonymous memory that only the OOM killer could take back (issue 17). Here the map is
    copy-on-write (`GGUFReader(mode="c")`): the quantized blocks stay file pages, which the kernel reads
    on first use and can drop under pressure, and a write (nothing writes to the blocks; a LoRA wraps the
    layer) would get a private page, never touch the file. F16 tensors that follow the compute dtype are
    converted anyway (`follow_dtype`): only those become anonymous memory."""
    import torch
    from diffusers.quantizers.gguf.utils import GGUFParameter
    from gguf import GGMLQuantizationType, GGUFReader

    plain = (GGMLQuantizationType.F32, GGMLQuantizationType.F16)
    state = {}
    for tensor in GGUFReader(str(path), mode="c").tensors:
        weights = torch.from_numpy(tensor.data)
        state[tensor.name] = weights if tensor.tensor_type in plain else GGUFParameter(weights,
                                                                                       quant_type=tensor.tensor_type)
    return state


def non_finite_blocks(data, kind: str) -> int:
    """How many blocks of a tensor stored as GGML type `kind` (`data`: its raw bytes, uint8, as
    `load_gguf_checkpoint` keeps them) decode to NaN/Inf; for BF16, how many values are NaN/Inf.

    Reads one byte per float16 field: an f16 is NaN/Inf when its five exponent bits are all ones, and
    they sit in its high byte (bits 2-6; GGUF is little-endian). Nothing is dequantized, so the cost is a
    strided pass over 1 byte in every 34 (Q8_0) to 210 (Q6_K), with no copy of the weights.
    """
    import gguf
    import torch

    raw = torch.Tensor._make_subclass(torch.Tensor, data) if type(data) is not torch.Tensor else data
    if kind == "BF16":  # a plain format diffusers keeps as stored: every value is a float
        return int((~torch.isfinite(raw.contiguous().view(torch.bfloat16))).sum())
    _, type_size = gguf.GGML_QUANT_SIZES[getattr(gguf.GGMLQuantizationType, kind)]
    blocks = raw.reshape(-1, type_size)
    bad = None
    for offset in F16_FIELDS[kind]:
        field = (blocks[:, offset + 1] & 0x7C) == 0x7C
        bad = field if bad is None else bad | field
    return int(bad.sum())


def check_finite_blocks(state: dict, path) -> None:
    """Refuse a GGUF file whose quantized tensors decode to NaN/Inf (docs/FAULTS.md 6), naming the file and
    the tensor. The load-time check (models/checkpoint.check_finite) sees floating tensors only, and GGUF's
    quantized weights are uint8 blocks whose float16 scales it cannot read; the plain F32/F16 tensors are
    left to it. A damaged scale would otherwise show only as black or noise images."""
    for name, tensor in state.items():
        kind = getattr(getattr(tensor, "quant_type", None), "name", None)
        if kind is None or (kind not in F16_FIELDS and kind != "BF16"):
            continue
        bad = non_finite_blocks(tensor, kind)
        if bad:
            what = (f"{bad} NaN/Inf value(s)" if kind == "BF16" else
                    f"{bad} block(s) whose float16 scale is NaN/Inf, so all their weights decode to NaN/Inf")
            raise ModelLoadError(f"{Path(path).name} is damaged: its tensor {name!r} ({kind}, shape "
                                 f"{tuple(getattr(tensor, 'quant_shape', tensor.shape))}) has {what}; "
                                 "download it again or use another copy")


def flux_checkpoint(state: dict, config) -> dict:
    """A FLUX.1 transformer's weights in BFL's layout (city96's files) under diffusers' names, by
    diffusers' own converter; works on GGUF-quantized tensors (rows split whole) and on the meta device.

    diffusers' converter (0.42) splits each single block's fused `linear1` (q, k, v, MLP input) at FLUX.1's
    width, 3072, whatever the config says, so a narrower transformer (Flux-derived small models, the tiny
    test model) fails. Here `linear1` is split at the config's width (heads x head dim; the MLP part is the
    rest) and the converter gets FLUX.1-width stand-ins on the meta device in its place, whose outputs are
    replaced. At width 3072 the result is exactly diffusers' own. Should diffusers split at the config's
    width one day, the stand-ins no longer fit and tests/test_gguf_flux.py fails: then drop this wrapper.
    """
    import re

    import torch
    from diffusers.loaders.single_file_utils import convert_flux_transformer_checkpoint_to_diffusers

    width, flux1 = config["num_attention_heads"] * config["attention_head_dim"], 3072
    state = {k.removeprefix(UNET): v for k, v in state.items()}
    split = {}
    for key in [k for k in state if re.fullmatch(r"single_blocks\.\d+\.linear1\.(weight|bias)", k)]:
        fused = state.pop(key)
        block, part = key.split(".")[1], key.rsplit(".", 1)[1]
        mlp = fused.shape[0] - 3 * width  # <= 0: a file of another width; the shape check names it
        parts = torch.split(fused, [width] * 3 + [mlp], dim=0) if mlp > 0 else (fused,) * 4
        for name, value in zip(("attn.to_q", "attn.to_k", "attn.to_v", "proj_mlp"), parts):
            split[f"single_transformer_blocks.{block}.{name}.{part}"] = value
        stand_in = 3 * flux1 + 4 * flux1  # q, k, v and the 4x-wide MLP input, as diffusers splits it
        state[key] = torch.empty((stand_in, *fused.shape[1:]), device="meta")
    converted = convert_flux_transformer_checkpoint_to_diffusers(state)
    return {**converted, **split}


def load_pipeline(path, header: GgufHeader, family: families.Family, folder: Path, torch_dtype):
    """The pipeline of `folder` with the GGUF denoiser of `path` in place of its own (a 2026 family's: the folder's
    own pipeline class, models/transformer_file.py)."""
    from lowvram_gen.models import transformer_file

    alone = family.denoiser == "transformer" and family.single_file.checkpoint_match is None
    pipeline = (transformer_file.folder_pipeline(folder, family, Path(path), checkpoint_shapes(header)) if alone
                else transformer_file.file_pipeline(folder, family))  # FLUX.1 Kontext's: its folder says so
    name, model = load_denoiser(path, header, family, folder, torch_dtype)
    return transformer_file.pipeline_around(pipeline, folder, torch_dtype, name, model)


def follow_dtype(module, dtype) -> None:
    """Run a GGUF denoiser in `dtype`: its unquantized tensors (norms, biases, convolutions) are cast and
    its quantized layers dequantize to `dtype`; the quantized blocks themselves stay as stored.

    diffusers refuses `.to(dtype)` on a quantized model; torch's own `Module.to` converts floating-point
    tensors only, and the quantized blocks are uint8, so it leaves them as they are.
    """
    import torch
    from diffusers.quantizers.gguf.utils import GGUFLinear

    torch.nn.Module.to(module, dtype=dtype)
    for sub in module.modules():
        if isinstance(sub, GGUFLinear):
            sub.compute_dtype = dtype


def gguf_bits(module) -> int | None:
    """For a denoiser loaded from a GGUF file: the widest float type its file stores; None otherwise."""
    return getattr(module, GGUF_BITS, None)


def stored_sizes(path) -> tuple[int, int]:
    """(values, bytes as stored) of the tensors a GGUF file's denoiser keeps as stored (block-quantized,
    BF16): the memory estimate counts them at this size and the rest of the denoiser at the dtype."""
    header = read_header(path)
    return header.quantized_params, header.quantized_bytes


def planned_components(path) -> Path | None:
    """The components folder a GGUF transformer's plan reads where no --config is given, as its loader finds it (the
    family's repo in the HF cache, else a diffusers folder of it among the user's models:
    transformer_file.planned_components); None for a UNet's GGUF and where there is none (the plan then reads the
    family's shipped real-size configs)."""
    from lowvram_gen.models import transformer_file

    family = family_of(read_header(path), path)
    return transformer_file.planned_components(family, None) if family.denoiser == "transformer" else None


def single_file_family(path) -> families.Family | None:
    """The family of a single file whose keys alone tell it where its denoiser class does not (a Flux.2 dev file is
    Flux2Transformer2DModel as Klein's is): a GGUF denoiser's, or a transformer file's (models/transformer_file.py);
    None for others."""
    from lowvram_gen.models import transformer_file

    if is_gguf(path):
        try:
            return family_of(read_header(path), path)
        except ModelLoadError:
            return None  # the loader refuses it with its own words
    return transformer_file.file_family(path)


def builtin_arch(path) -> str:
    """The built-in architecture (models/profile.py profile_builtin) of a GGUF denoiser, for a plan without
    --config: its family's (SD 2.x told from SD 1.x by its 1024-wide cross-attention, in the records)."""
    family = family_of(read_header(path), path)
    if not family.builtin:
        raise ModelLoadError(f"{Path(path).name}: a GGUF {family.name} denoiser needs --config (a diffusers folder of "
                             "its base model) to be planned")
    return family.builtin
