"""Memory settings: what a preset asks of a loaded pipeline.

`MemorySettings` is plain data (no torch import). `apply.py` applies it to a loaded pipeline and
can re-apply other settings later without reloading weights.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace

from lowvram_gen.errors import PresetError

DTYPES = ("float32", "float16", "bfloat16")
ATTENTION = ("sdpa", "xformers", "slicing")
OFFLOAD = ("none", "model", "group", "sequential", "budget")
QUANTIZE = ("none", "int8", "int4")
TEXT_ENCODERS = ("kept", "reloaded")


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
    # Weight-only quantization (SD.Next's sdnq) of the denoiser and the text encoders, done on the
    # loaded weights: int8 ~1 byte a weight (per-channel scales), int4 ~0.56 (scales per group of
    # 32-64). Not the VAE: it is small (84M weights in SD 1.5 and SDXL: 8 % and 3 % of the pipeline),
    # it runs once per image (tiling and offload already bound its peak), and its convolutions draw
    # the fine detail that fewer bits would blur.
    # Not with fp8_storage: both store the denoiser's weights in fewer bits; one at a time.
    quantize: str = "none"
    # group/sequential/budget offload on CUDA: diffusers pins a host copy of every streamed group so its
    # copies can overlap compute (about the streamed bytes again in system RAM). false: stream from the
    # weights as they are (diffusers' low_cpu_mem_usage), slower copies, no second copy in RAM. The
    # planner turns it off when the pinned copies would not fit the machine's RAM.
    pin_memory: bool = True
    # Keep every weight in 16 bits as a half-precision checkpoint stores it and compute each layer in
    # `dtype` (float32), upcast as it runs (diffusers' layerwise casting): the same numbers as float32
    # weights loaded from that file, in half the system RAM, the weights memory-mapped from the file.
    # For the cpu preset, where float32 is the compute dtype; the planner adds it (cpu+half) when
    # float32 weights would not fit the RAM.
    half_storage: bool = False
    # "kept": the text encoders stay loaded for the whole session. "reloaded": they are read from their
    # own subfolders of a diffusers folder for each job, encode its prompts, and leave RAM before the
    # denoiser runs (issue 17: FLUX.1's T5-XXL is 9.5 GB in bf16, the difference between fitting a
    # 16 GiB machine and being refused). It costs a read from disk per job; the planner adds it
    # (+te-reload) only when the candidate with kept encoders does not fit the RAM.
    text_encoders: str = "kept"
    # The last rung when even quantized weights do not fit the RAM (issue 17): weights the planner keeps
    # memory-mapped from their files (loaded at the dtype the file stores, or a GGUF denoiser's blocks) are
    # not counted as RAM the job must hold: the kernel drops their pages under pressure and reads them
    # again from disk as the layers run, so a step can read the whole denoiser from disk. Runs as written
    # otherwise (on CUDA it streams without pinned copies, which would be anonymous memory); the planner
    # adds it (+disk) only when no other candidate fits the RAM.
    paged_weights: bool = False

    def check(self, where: str = "settings") -> "MemorySettings":
        for key, allowed in (("dtype", DTYPES), ("attention", ATTENTION), ("offload", OFFLOAD),
                             ("quantize", QUANTIZE), ("text_encoders", TEXT_ENCODERS)):
            value = getattr(self, key)
            if value not in allowed:
                raise PresetError(f"{where}: {key} = {value!r} is not allowed; use one of {', '.join(allowed)}")
        for key in ("vae_slicing", "vae_tiling", "fp8_storage", "pin_memory", "half_storage", "paged_weights"):
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
        if self.half_storage and (self.dtype != "float32" or self.fp8_storage or self.quantize != "none"):
            raise PresetError(f"{where}: half_storage keeps 16-bit weights for float32 compute: it needs dtype = "
                              "'float32', fp8_storage = false and quantize = 'none'")
        if self.paged_weights and self.pin_memory:
            raise PresetError(f"{where}: paged_weights streams the weights from their files' pages, which pinned "
                              "copies would hold in RAM; set pin_memory = false with it")
        if self.fp8_storage and self.quantize != "none":
            raise PresetError(f"{where}: quantize = {self.quantize!r} and fp8_storage = true both shrink the "
                              "denoiser's weights; use one (quantize = 'none' or fp8_storage = false)")
        return self

    def with_quantize(self, quantize: str | None) -> "MemorySettings":
        """These settings with `quantize` forced (--quantize, a batch line, the UI); None keeps the
        preset's. A forced quantization replaces the preset's fp8 storage: both are ~1 byte a weight."""
        if quantize is None:
            return self
        return replace(self, quantize=quantize, fp8_storage=self.fp8_storage and quantize == "none",
                       half_storage=self.half_storage and quantize == "none")

    def as_dict(self) -> dict:
        return asdict(self)
