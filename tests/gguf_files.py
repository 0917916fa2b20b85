"""Test utility: write a state dict as a GGUF file the way ComfyUI-GGUF's convert script does.

City96's files keep the original (LDM / BFL) key names without the `model.diffusion_model.` prefix,
store 1-D tensors (norms, biases) in F32, block-quantize the 2-D weights whose rows hold whole blocks,
and fall back to F16 for what cannot be block-quantized (convolution kernels: their innermost
dimension is 3 or 1, never a multiple of the 32-value block). `general.architecture` names the model
("sd1", "sdxl", "flux", "sd3"). gguf's own writer and quantizer do the work.
"""

from __future__ import annotations

UNET_PREFIX = "model.diffusion_model."
# below this many values ComfyUI-GGUF keeps a tensor unquantized (QUANTIZATION_THRESHOLD)
QUANTIZATION_THRESHOLD = 1024


def qtype_for(shape: tuple[int, ...], qtype, vectors: str = "F32"):
    """The GGML type a tensor of `shape` is stored as when the file's target type is `qtype`
    (`vectors`: the type of 1-D tensors; some published files store them in F16)."""
    import gguf

    count = 1
    for d in shape:
        count *= d
    if len(shape) <= 1:
        return getattr(gguf.GGMLQuantizationType, vectors)
    block = gguf.GGML_QUANT_SIZES[qtype][0]
    if len(shape) == 2 and shape[-1] % block == 0 and count >= QUANTIZATION_THRESHOLD:
        return qtype
    return gguf.GGMLQuantizationType.F16


def write_gguf(path, state: dict, qtype, arch: str = "sd1", vectors: str = "F32") -> dict:
    """Write `state` (name -> torch tensor) to `path`; returns name -> the GGML type each tensor got."""
    import gguf

    writer = gguf.GGUFWriter(str(path), arch=arch)
    writer.add_quantization_version(gguf.GGML_QUANT_VERSION)
    types = {}
    for name, tensor in state.items():
        data = tensor.detach().float().cpu().numpy()
        kind = qtype_for(tuple(data.shape), qtype, vectors)
        if kind in (gguf.GGMLQuantizationType.F32, gguf.GGMLQuantizationType.F16):
            writer.add_tensor(name, gguf.quants.quantize(data, kind))
        else:
            writer.add_tensor(name, gguf.quants.quantize(data, kind), raw_dtype=kind)
        types[name.removeprefix(UNET_PREFIX)] = kind
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return types


def unet_state(unet) -> dict:
    """A diffusers UNet's weights with ComfyUI-GGUF's names: LDM layout, no `model.diffusion_model.`."""
    import ldm_layout

    return {k.removeprefix(UNET_PREFIX): v.detach().clone().contiguous()
            for k, v in ldm_layout.unet_to_ldm(unet).items()}
