"""Memory settings: what a preset asks of a loaded pipeline.

`MemorySettings` is plain data (no torch import). `apply.py` applies it to a loaded pipeline and
can re-apply other settings later without reloading weights.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from lowvram_gen.errors import PresetError

DTYPES = ("float32", "float16", "bfloat16")
ATTENTION = ("sdpa", "xformers", "slicing")
OFFLOAD = ("none", "model", "group", "sequential")


@dataclass(frozen=True)
class MemorySettings:
    # Half precision halves weights and activations; float32 is the CPU default (fp16 on CPU is slow
    # or unsupported for some ops, so GPU-only dtypes are skipped there).
    dtype: str = "float16"
    # PyTorch 2's SDPA is already memory-efficient; slicing on top of it is slower and used *more*
    # memory in our CPU measurement, so slicing is only for back ends without efficient attention.
    attention: str = "sdpa"
    vae_slicing: bool = False  # decode a batch one image at a time
    vae_tiling: bool = False  # decode (and encode) in overlapping tiles: big images on small cards
    # none: all on the GPU. model: one whole model on the GPU at a time. group: blocks of layers
    # streamed in. sequential: every layer streamed in (slowest, least VRAM).
    offload: str = "none"
    fp8_storage: bool = False  # keep UNet/transformer weights in float8, upcast per layer

    def check(self, where: str = "settings") -> "MemorySettings":
        for key, allowed in (("dtype", DTYPES), ("attention", ATTENTION), ("offload", OFFLOAD)):
            value = getattr(self, key)
            if value not in allowed:
                raise PresetError(f"{where}: {key} = {value!r} is not allowed; use one of {', '.join(allowed)}")
        for key in ("vae_slicing", "vae_tiling", "fp8_storage"):
            if not isinstance(getattr(self, key), bool):
                raise PresetError(f"{where}: {key} = {getattr(self, key)!r} must be true or false")
        if self.fp8_storage and self.dtype == "float32":
            raise PresetError(f"{where}: fp8_storage needs dtype float16 or bfloat16 to compute in, not float32")
        return self

    def as_dict(self) -> dict:
        return asdict(self)
