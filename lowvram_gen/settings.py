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
    # A1111's --no-half-vae: the VAE kept and computed in float32 while the rest runs in `dtype` (half-precision
    # VAEs decode to NaN, black images, on GTX 16xx cards and with some SD 1.x/SDXL VAEs). Its inputs are cast to
    # float32 and the latents it encodes back to `dtype` (engines/sd/apply.py), so every pipeline runs with it.
    vae_float32: bool = False
    # A1111's --upcast-sampling: the denoiser's attention scores and softmax computed in float32 (diffusers'
    # Attention.upcast_attention / upcast_softmax, the switch SD 2.x's configs turn on) with 16-bit weights.
    upcast_attention: bool = False

    def check(self, where: str = "settings") -> "MemorySettings":
        for key, allowed in (("dtype", DTYPES), ("attention", ATTENTION), ("offload", OFFLOAD),
                             ("quantize", QUANTIZE), ("text_encoders", TEXT_ENCODERS)):
            value = getattr(self, key)
            if value not in allowed:
                raise PresetError(f"{where}: {key} = {value!r} is not allowed; use one of {', '.join(allowed)}")
        for key in ("vae_slicing", "vae_tiling", "fp8_storage", "pin_memory", "half_storage", "paged_weights",
                    "vae_float32", "upcast_attention"):
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

    def with_precision(self, precision: "Precision") -> "MemorySettings":
        """These settings under the launch's precision flags (`Precision`), which win over the preset's own dtype,
        as A1111's --no-half wins over everything: float32 weights and compute (fp8 storage, 16-bit only, goes)."""
        if precision.full:
            return replace(self, dtype="float32", fp8_storage=False)
        if precision.upcast_sampling:
            return replace(self, vae_float32=True, upcast_attention=True)
        return replace(self, vae_float32=True) if precision.no_half_vae else self

    def as_dict(self) -> dict:
        return asdict(self)


def precision_suffix(before: MemorySettings, after: MemorySettings) -> str:
    """How a preset's name says what the precision flags changed in it ('' for nothing that runs otherwise), so
    that `plan`, "What ran" and the PNG's Preset field name it: +no-half, +upcast, +no-half-vae. A preset in
    float32 already changes nothing that runs."""
    if before.dtype == "float32" and after.dtype == "float32":
        return ""
    if after.dtype == "float32":
        return "+no-half"
    if after.upcast_attention and not before.upcast_attention:
        return "+upcast"
    return "+no-half-vae" if after.vae_float32 and not before.vae_float32 else ""


PRECISIONS = ("full", "autocast")  # A1111's --precision


@dataclass(frozen=True)
class Precision:
    """A1111's precision launch flags: --no-half (and --precision full: the same), --no-half-vae,
    --upcast-sampling. They apply over every preset, a named one too (`MemorySettings.with_precision`);
    --no-half wins over the others, as in A1111 (its --upcast-sampling has "no effect with --no-half")."""

    full: bool = False  # --no-half / --precision full: weights and compute in float32
    no_half_vae: bool = False  # --no-half-vae: the VAE in float32
    upcast_sampling: bool = False  # --upcast-sampling: 16-bit weights, the VAE and attention upcast to float32

    @classmethod
    def from_flags(cls, no_half: bool = False, no_half_vae: bool = False, upcast_sampling: bool = False,
                   precision: str | None = None) -> "Precision":
        """The flags as given; --precision autocast (A1111's default, half compute) beside --no-half asks for both
        and is refused, naming both flags (a bare --precision autocast changes nothing)."""
        if precision is not None and precision not in PRECISIONS:
            raise PresetError(f"--precision {precision!r}: use one of {', '.join(PRECISIONS)}")
        if precision == "autocast" and no_half:
            raise PresetError("--precision autocast computes in half precision and --no-half in float32: give one "
                              "(--precision full is --no-half)")
        return cls(full=no_half or precision == "full", no_half_vae=no_half_vae, upcast_sampling=upcast_sampling)
