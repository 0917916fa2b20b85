"""Weight-only int8/int4 quantization of a loaded pipeline's denoiser and text encoders (sdnq).

Why sdnq (SD.Next's quantization engine; the README's "Weights that fit" compares the candidates):
it quantizes a model that is already loaded, in place, Linear *and* Conv2d layers (68 % of SD 1.5's
UNet weights are convolutions), to int8 or packed int4, on the CPU and on any GPU, in plain PyTorch.
Its quantized layers keep plain int8/uint8 tensors and float scales (no tensor subclass), so model
offload, group offload and leaf-level offload move them like any other weights.

Two choices of ours:
- torch.compile is off unless the user sets SDNQ_USE_TORCH_COMPILE=1 (sdnq reads it at import):
  sdnq compiles its dequantizer per weight shape, which took over a minute on our 2-core CPU for the
  tiny model and needs Triton on a GPU. Eager dequantization costs a little speed, no memory.
- Layers sdnq skips by default stay as they are: those under 16384 weights or 32 channels (scales
  would eat the saving) and each model's own skip list (embeddings, conv_in/conv_out, norms).

Two ways in, one set of settings (`sdnq_config`): `quantize_module` quantizes a loaded model in place
(apply.py, for what could not be quantized while loading: a single file's text encoders and SD3/Flux
transformer, a GGUF checkpoint's text encoders), and models/loading.py passes the same config to
diffusers' and transformers' `from_pretrained` (`quantization_config=`; sdnq registers with both), as
`from_single_file` here does for a single file's UNet (models/checkpoint.py), which quantize each layer
as its weight is read, so the full-precision model never exists in RAM. Both give bit-identical weights
(sdnq's loader calls the same `sdnq_quantize_layer` on the weight after it was cast to the load dtype;
tests compare them).
Which kind a model holds is read off the model itself (`kind_of`: sdnq marks the model in both ways),
so apply.py has no second record of it to keep in step.
"""

from __future__ import annotations

import logging
import importlib.util
import os
from enum import Enum

from lowvram_gen.errors import LowVramError, ModelLoadError

log = logging.getLogger(__name__)

KINDS = ("int8", "int4")
INSTALL = "pip install 'sdnq>=0.2.8' (or reinstall lowvram-gen: ./run.sh and ./test.sh do it)"


class QuantizeUnavailable(LowVramError):
    """The quantization backend is not installed."""

    exit_code = 2


def is_target(name: str) -> bool:
    """Whether quantize applies to the component `name`: the denoiser (Wan 2.2 A14B's two experts, `transformer` and
    `transformer_2`), the ControlNets beside it (models/controlnet.py names them controlnet0, ...) and the text
    encoders, never the VAE."""
    return name in ("unet", "transformer", "transformer_2") or name.startswith(("text_encoder", "controlnet"))


def targets(pipe) -> list[str]:
    """The components quantize applies to that the pipeline has (the job's ControlNets with them)."""
    import torch

    from lowvram_gen.models.attached import attached

    modules = {**pipe.components, **attached(pipe)}
    return sorted(n for n, m in modules.items() if isinstance(m, torch.nn.Module) and is_target(n))


def _sdnq():
    os.environ.setdefault("SDNQ_USE_TORCH_COMPILE", "0")
    # sdnq tries OpenVINO's CPU kernels and warns on every run where OpenVINO is not installed (it falls back
    # to PyTorch's, as it does with this set): ask for them only where they are there
    if importlib.util.find_spec("openvino") is None:
        os.environ.setdefault("SDNQ_USE_OPENVINO_MM", "0")
    try:
        import sdnq
    except ImportError as exc:
        raise QuantizeUnavailable(f"quantize = int8/int4 needs the sdnq package, which is not installed "
                                  f"({exc}); {INSTALL}") from None
    return sdnq


def sdnq_config(kind: str, device: str | None = None):
    """sdnq's settings for `kind`, the same for quantizing while loading and after: convolutions too (most
    of SD 1.5's UNet), sdnq's own skip rules, and with a CUDA `device` the work done there, layer by
    layer, each layer going back where it was (offloaded weights stay in system RAM). A fresh config
    each time: sdnq appends the layers it skipped to it."""
    if kind not in KINDS:
        raise ValueError(f"quantize {kind!r}: use one of {', '.join(KINDS)}")
    sdnq = _sdnq()
    import torch

    on = torch.device(device) if device and torch.device(device).type == "cuda" else None
    return sdnq.SDNQConfig(weights_dtype=kind, quant_conv=True, quantization_device=on)


# diffusers' `from_single_file` makes its quantizer as if the file's weights were quantized already
# (`pre_quantized`, right for a GGUF file, diffusers/loaders/single_file_model.py): sdnq then builds its
# quantized layers empty and copies the file's floats into them unrounded, its scales left on the meta
# device. `_ROUNDING` names a quantizer that is sdnq's own, told the weights are floats to round, as
# `from_pretrained` tells it; `from_single_file` lends the config that name for one load.
_ROUNDING = "sdnq_from_float"


def _rounding_quantizer():
    from diffusers.quantizers import auto

    if _ROUNDING not in auto.AUTO_QUANTIZER_MAPPING:
        sdnq_quantizer = _sdnq().SDNQQuantizer  # sdnq's own (diffusers' "sdnq" entry is a factory for it)

        def __init__(self, config, **kwargs):
            sdnq_quantizer.__init__(self, config, **{**kwargs, "pre_quantized": False})

        auto.AUTO_QUANTIZER_MAPPING[_ROUNDING] = type("SDNQRoundingQuantizer", (sdnq_quantizer,),
                                                      {"__init__": __init__})


class _Method(str, Enum):  # diffusers reads the method's `.value`
    ROUNDING = _ROUNDING


def from_single_file(cls, source, kind: str, device: str | None = None, **kwargs):
    """`cls.from_single_file(source, **kwargs)` (a diffusers model class; `source` a file or a state dict) with
    each layer quantized to `kind` as its weight is read (see `sdnq_config` for `device`), its scales checked:
    the same weights as `quantize_module` on the model loaded whole (tests compare them)."""
    config = sdnq_config(kind, device)
    _rounding_quantizer()
    method, config.quant_method = config.quant_method, _Method.ROUNDING
    try:
        module = cls.from_single_file(source, quantization_config=config, **kwargs)
    finally:
        config.quant_method = method
    stamped = module.config.get("quantization_config")  # sdnq copies the config into the model's at the end
    if isinstance(stamped, dict) and stamped.get("quant_method") == _ROUNDING:
        stamped["quant_method"] = method  # as a folder's int8 model reads: sdnq's, nothing of this loan left
    check_scales(module, kind)
    return module


def quantize_module(module, kind: str, device: str | None = None) -> None:
    """Quantize the loaded `module`'s weights to `kind` in place (see `sdnq_config` for `device`)."""
    config = sdnq_config(kind, device)
    _sdnq().sdnq_post_load_quant(module, quantization_config=config)
    check_scales(module, kind)


def check_scales(module, kind: str) -> None:
    """Refuse weights that were NaN/Inf when they were quantized (docs/FAULTS.md 6): sdnq's scale of such a
    row is NaN/Inf (finite weights, even 3e38, give finite scales: measured), and int8 values hide it from
    the load-time check, which reads floating tensors only. The load checked the file's weights, so this
    catches what came after it, a cast to float16 that overflowed a weight over 65504 to Inf. Cheap: the
    scales are one float per output row (or group), a small fraction of the weights."""
    import torch

    for lname, layer in module.named_modules():
        if getattr(layer, "sdnq_dequantizer", None) is None:
            continue
        for pname, t in [*layer.named_parameters(recurse=False), *layer.named_buffers(recurse=False)]:
            if t.is_floating_point() and t.device.type != "meta":
                bad = int((~torch.isfinite(t)).sum())
                if bad:
                    raise ModelLoadError(
                        f"quantize {kind}: layer {lname!r} of the {type(module).__name__} has {bad} NaN/Inf "
                        f"{pname} value(s) after quantizing, so its weights held NaN/Inf: a cast to float16 "
                        "overflowed them (use dtype bfloat16 or float32) or the model file is damaged")


def is_quantized(module) -> bool:
    return getattr(module, "quantization_method", None) is not None and hasattr(module, "quantization_config")


def kind_of(module) -> str | None:
    """"int8"/"int4" for a model sdnq quantized (while loading or after), None otherwise (a GGUF model too)."""
    if getattr(module, "quantization_method", None) != "sdnq":  # sdnq's QuantizationMethod is a str enum
        return None
    return getattr(getattr(module, "quantization_config", None), "weights_dtype", None)


def kinds(pipe) -> dict[str, str]:
    """{component: kind} of the pipeline's quantized components."""
    found = {n: kind_of(getattr(pipe, n)) for n in targets(pipe)}
    return {n: k for n, k in found.items() if k is not None}
