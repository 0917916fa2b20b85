"""control-LoRA files as ControlNets (models/controlnet.py finds them; this module makes them).

Stability AI's control-LoRA files (stabilityai/control-lora: control-lora-canny-rank128.safetensors, ...) hold a
ControlNet as a LoRA over the base model's UNet: `up`/`down` pairs for the down path's linear and conv layers
(`input_blocks.1.0.in_layers.2.up`), whole tensors for what the UNet has no copy of (input_hint_block,
zero_convs, middle_block_out, the norms), and a `lora_controlnet` key that marks them (as ComfyUI and diffusers
tell them apart). diffusers' recipe (examples/research_projects/control_lora): ControlNetModel.from_unet(unet),
then load_lora_adapter(file, prefix=None), whose converter (convert_sai_sd_control_lora_state_dict_to_peft)
reads the original layout with 2 layers per block, as SD 1.x and SDXL have. Here the adapter is then fused and
unloaded, so what is kept is an ordinary ControlNetModel: cast, quantized, offloaded and streamed by the memory
layer (engines/sd/apply.py) as any ControlNet, with no PEFT layer in the way. Its config and family come from
the file's header (each up/down pair gives its layer's shape), so the plan counts the ControlNet it becomes and
refuses one for another base before any weight is read.
"""

from __future__ import annotations

from pathlib import Path

from lowvram_gen.errors import InvalidRequest, ModelLoadError
from lowvram_gen.models.controlnet_config import from_unet_config
from lowvram_gen.models.safe_files import check_safetensors, safetensors_header

CONTROL_LORA_KEY = "lora_controlnet"
_UNET_PARTS = ("conv_in.", "time_embedding.", "class_embedding.", "add_embedding.", "down_blocks.", "mid_block.")


def is_control_lora_file(path: Path) -> bool:
    """A .safetensors whose header has the `lora_controlnet` key (no weights read)."""
    if path.suffix.lower() != ".safetensors":
        return False
    try:
        return CONTROL_LORA_KEY in safetensors_header(path)
    except (OSError, ValueError):
        return False  # loading it as a ControlNet file says what is wrong with it


def control_lora_shapes(shapes: dict[str, tuple[int, ...]]) -> dict[str, tuple[int, ...]]:
    """The shapes of the ControlNet a control-LoRA becomes, in the original layout: each `X.up` [out, rank(, 1, 1)]
    and `X.down` [rank, in(, kh, kw)] pair is the weight `X.weight` [out, in(, kh, kw)]."""
    out = {}
    for key, shape in shapes.items():
        if key == CONTROL_LORA_KEY or key.endswith(".down"):
            continue
        if key.endswith(".up"):
            down = shapes.get(key[:-len(".up")] + ".down")
            if down is None or len(down) < 2:
                raise ModelLoadError(f"the control-LoRA's {key} has no matching .down tensor: the file is damaged")
            out[key[:-len(".up")] + ".weight"] = (shape[0], down[1], *down[2:])
        else:
            out[key] = shape
    return out


def control_lora_profile(profile, config: dict, base, model: str):
    """`profile` (the ControlNet a control-LoRA becomes) checked against the base model's profile `base` for
    what diffusers' converter needs, and with the bytes it takes in RAM: the UNet's copy at the base's width."""
    from dataclasses import replace

    lpb = int(config.get("layers_per_block", 2))
    if lpb != 2 or int(getattr(base, "unet_layers_per_block", 2)) != 2:
        raise InvalidRequest("controlnet", profile.name,
                             f"a control-LoRA is read by diffusers for UNets of 2 layers per block (SD 1.x, SDXL); "
                             f"this one is made for {lpb} and the model {model!r} has "
                             f"{getattr(base, 'unet_layers_per_block', 2)}")
    den = base.denoiser
    width = (base.file_bytes.get(den, 0) / base.params[den]) if base.params.get(den) else 0
    return replace(profile, file_bytes=int(profile.params * (round(width) or 2)))


def _unet_weights(unet, dtype) -> dict:
    """Copies of the UNet's weights that ControlNetModel.from_unet takes (conv_in, the embeddings, the down path,
    the mid block) on the CPU at `dtype`: a LoRA the job put on the UNet as a PEFT layer left out (its base layer
    taken), fp8/half storage read as stored, an int8/int4 layer (sdnq) dequantized as its forward does, the UNet's
    own layer left quantized. Copies: fusing the control-LoRA writes into them."""
    import torch

    quantized = {name: m for name, m in unet.named_modules() if hasattr(m, "sdnq_dequantizer")}
    out = {}
    with torch.no_grad():
        for key, value in unet.state_dict().items():
            layer = key.rpartition(".")[0]
            if key.startswith(_UNET_PARTS) and ".lora_" not in key and layer not in quantized:
                out[key.replace(".base_layer.", ".")] = value.detach().to(device="cpu", dtype=dtype, copy=True)
        if quantized:
            from sdnq.utils import get_sdnq_params

            for name, m in quantized.items():
                if not name.startswith(_UNET_PARTS):
                    continue
                weight = m.sdnq_dequantizer(**get_sdnq_params(m), skip_quantized_matmul=m.sdnq_dequantizer.
                                            use_quantized_matmul)
                out[f"{name}.weight".replace(".base_layer.", ".")] = weight.to(device="cpu", dtype=dtype, copy=True)
                if getattr(m, "bias", None) is not None:
                    out[f"{name}.bias".replace(".base_layer.", ".")] = m.bias.detach().to(device="cpu", dtype=dtype,
                                                                                          copy=True)
    return out


def control_lora_from_unet(source, unet, dtype: str, quantize: str = "none", quantize_on: str | None = None):
    """The ControlNetModel the control-LoRA `source` (a models/controlnet.ControlNetSource) makes of the base
    pipeline's `unet`, at `dtype` on the CPU (int8/int4 after, with `quantize`): diffusers' from_unet +
    load_lora_adapter, fused and unloaded."""
    import torch
    from accelerate import init_empty_weights
    from diffusers import ControlNetModel

    from lowvram_gen.models.gguf_file import gguf_bits
    from lowvram_gen.models.quantize import quantize_module
    from lowvram_gen.models.quiet import libraries_silenced

    if gguf_bits(unet) is not None:
        raise ModelLoadError(f"the control-LoRA {source.spec} is built from the model's UNet, and this one is a GGUF "
                             "file's: use the model's .safetensors or diffusers folder")
    torch_dtype = getattr(torch, dtype)
    try:
        check_safetensors(source.path)
        from safetensors.torch import load_file

        state = load_file(str(source.path))
        with init_empty_weights():  # from_unet's layout without its random init: every weight is set below
            module = ControlNetModel.from_config(from_unet_config(dict(unet.config)))
        weights = _unet_weights(unet, torch_dtype)
        for key, meta in module.state_dict().items():  # what the file sets (from_unet's zero/random init)
            weights.setdefault(key, torch.zeros(meta.shape, dtype=torch_dtype))
        module.load_state_dict(weights, strict=True, assign=True)
        with libraries_silenced("While injecting the PEFT adapters"):  # the hint block's conv_in: whole, as meant
            module.load_lora_adapter(state, prefix=None, adapter_name="control_lora", controlnet_config=module.config)
            module.fuse_lora(adapter_names=["control_lora"])
            module.unload_lora()
    except (OSError, ValueError, KeyError, RuntimeError, TypeError) as exc:
        if isinstance(exc, ModelLoadError):
            raise
        why = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise ModelLoadError(f"could not load the control-LoRA {source.spec} onto the model's UNet: {why}") from exc
    left = [n for n, m in module.named_modules() if type(m).__module__.startswith("peft.")]
    if left:
        raise ModelLoadError(f"the control-LoRA {source.spec} left PEFT layers after fusing ({left[0]}): "
                             "this diffusers/peft version is not supported for control-LoRAs")
    if quantize != "none":
        quantize_module(module, quantize, quantize_on)
    module.eval()
    module._lowvram_source = source
    return module


def make(pipe, source, dtype: str, quantize: str, quantize_on: str | None):
    """The control-LoRA's ControlNet made of `pipe`'s UNet, carrying the precision that UNet has lost (`_unet_floor`)
    as the floor engines/sd/apply.py keeps per component: when a later job wants it back, the ControlNet is made
    again after the UNet is read back (models/loading.reload_components), not kept with what it inherited."""
    module = control_lora_from_unet(source, pipe.unet, dtype, quantize, quantize_on)
    floor = _unet_floor(pipe)
    if floor is not None:
        module._lowvram_floor = floor
    return module


def _unet_floor(pipe) -> int | None:
    """The bits of precision the loaded UNet's weights have lost to an earlier job's settings, None when none: int8
    or int4 (sdnq), or the floor engines/sd/apply.py records on the pipeline (`_lowvram_state`) for a cast. fp8
    storage counts as half precision: kept across jobs (settings.fp8_storage), an 8 would remake the ControlNet at
    every job from the same fp8 weights."""
    from lowvram_gen.models.quantize import kind_of

    kind = kind_of(pipe.unet)
    if kind is not None:
        return 4 if kind == "int4" else 8
    floor = ((vars(pipe).get("_lowvram_state") or {}).get("floor") or {}).get("unet")
    return None if floor is None or floor >= 32 else max(int(floor), 16)
