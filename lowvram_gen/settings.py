"""Memory settings: what a preset asks of a loaded pipeline.

`MemorySettings` is plain data (no torch import). `apply.py` applies it to a loaded pipeline and
can re-apply other settings later without reloading weights.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from lowvram_gen.errors import PresetError

DTYPES = ("float32", "float16", "bfloat16")
ATTENTION = ("sdpa", "xformers", "slicing")
OFFLOAD = ("none", "model", "group", "sequential", "budget")


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
    # streamed in. sequential: every layer streamed in (slowest, least VRAM). budget: the denoiser's
    # first blocks stay on the GPU up to `resident_bytes`, the rest are streamed (planning/residency.py).
    offload: str = "none"
    fp8_storage: bool = False  # keep UNet/transformer weights in float8, upcast per layer
    # offload = "budget" only: bytes of the denoiser's streamable blocks kept on the GPU (its small
    # non-block part, embeddings, norms, conv_in/out, is always resident on top). The planner fills it
    # per job; 0 means no plan decided it, and apply decides from the device (engines/sd/apply.py).
    resident_bytes: int = 0

    def check(self, where: str = "settings") -> "MemorySettings":
        for key, allowed in (("dtype", DTYPES), ("attention", ATTENTION), ("offload", OFFLOAD)):
            value = getattr(self, key)
            if value not in allowed:
                raise PresetError(f"{where}: {key} = {value!r} is not allowed; use one of {', '.join(allowed)}")
        for key in ("vae_slicing", "vae_tiling", "fp8_storage"):
            if not isinstance(getattr(self, key), bool):
                raise PresetError(f"{where}: {key} = {getattr(self, key)!r} must be true or false")
        resident = self.resident_bytes
        if isinstance(resident, bool) or not isinstance(resident, int) or resident < 0:
            raise PresetError(f"{where}: resident_bytes = {resident!r} must be a whole number of bytes, 0 or more "
                              "(0: decided from the device's free memory when applied)")
        if resident and self.offload != "budget":
            raise PresetError(f"{where}: resident_bytes = {resident} only applies to offload = 'budget', "
                              f"not offload = {self.offload!r}; remove it or use offload = 'budget'")
        if self.fp8_storage and self.dtype == "float32":
            raise PresetError(f"{where}: fp8_storage needs dtype float16 or bfloat16 to compute in, not float32")
        return self

    def as_dict(self) -> dict:
        return asdict(self)
