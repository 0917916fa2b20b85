"""How long one denoising step takes under a candidate's settings: the planner's sort key.

    seconds per step = compute + bytes moved over the bus / bus bandwidth

- compute = FLOPs of one denoiser forward / the card's effective throughput, times a slowdown for
  weights that are dequantized on the fly. FLOPs = coefficient(arch) x denoiser parameters x latent
  pixels x images in the forward; the coefficients are counted by benchmarks/count_flops.py on the
  meta device (calibration.json "flops"; SDXL at 1024 px: 13.5 TFLOP per step with CFG).
- bytes: what the offload hooks stream every step (planning/estimate.py `streamed_bytes_per_step`)
  plus what moves once per job (whole models under model offload), spread over the job's steps.
  Transfers are counted as not overlapping compute: diffusers' group offloading prefetches on a CUDA
  stream and hides part of it, so streamed candidates are estimated a little slow, never fast.

These are the assumed figures; planning/speed.py scales the compute part by what finished jobs measured
on this device, and doctor's measurements of a GPU's throughput and quantized slowdown replace
`GPU_FLOPS` and `SLOWDOWN` (planning/bus.py keeps them beside the bus). The throughputs below are stated
assumptions, not measurements of this card: `BUS_BYTES_PER_S` is PCIe 4.0
x16 in practice (~25 GB/s of its 32 GB/s), used unless `lowvram-gen doctor` measured this GPU's bus
(planning/bus.py passes the measurement in as `bus_bytes_per_s`), `GPU_FLOPS` is what
an 8 GB consumer card sustains in half precision on these models (an RTX 3060 runs SDXL at 1024 px at
about 1.4 s per step: 13.5 TFLOP / 1.4 s = 9.6 TFLOP/s). The ranking they produce depends on their
ratio, not on either alone.
"""

from __future__ import annotations

import math

BUS_BYTES_PER_S = 25e9  # host-to-device, PCIe 4.0 x16, pinned memory
GPU_FLOPS = 10e12  # effective half-precision FLOP/s of a small card on diffusion models
CPU_FLOPS = 0.3e12  # effective float32 FLOP/s of a desktop CPU (the cpu preset)
# bfloat16 on a CPU that has it in hardware, over float32: measured 1.73x on the real SD 1.5 UNet at 512 px
# with AVX512-BF16 (benchmarks/cpu_dtype.py: 5.67 s against 9.80 s a CFG step on 2 cores; AMX would give
# more). The planner offers cpu+bf16 only on such CPUs (device.cpu_native_bf16), and learns the rest.
CPU_BF16_SPEEDUP = 1.7
# Compute slowdown of weights stored narrower than they compute: dequantizing per layer (fp8 layerwise
# casting, int8/int4 weight-only kernels) costs memory traffic and kernel launches on top of the matmul.
# Judgements, not measurements: weight-only int8 kernels run near fp16 speed on recent cards, 4-bit ones
# somewhat slower at diffusion's large batch x tokens shapes.
SLOWDOWN = {"none": 1.0, "fp8": 1.05, "half": 1.05, "int8": 1.1, "int4": 1.25}


def step_flops(profile, width: int, height: int, images: int, coefficients: dict[str, float]) -> float:
    """FLOPs of one denoiser forward over `images` latents (CFG's two halves count as two images); a clip's from its
    tokens and their attention (planning/video.step_flops)."""
    if getattr(profile, "video_frames", 0) and getattr(profile, "transformer_hidden", 0):
        from lowvram_gen.planning import video

        return video.step_flops(profile, width, height, images)
    sf = profile.vae_scale_factor
    pixels = math.ceil(height / sf) * math.ceil(width / sf)
    coef = coefficients.get(profile.arch, coefficients.get("custom", 0.25))
    return coef * profile.params.get(profile.denoiser, 0) * pixels * images


def compute_seconds(flops: float, storage: str = "none", on_gpu: bool = True, dtype: str = "float32",
                    gpu_flops: float | None = None, slowdown: dict[str, float] | None = None) -> float:
    """The compute part of a step: FLOPs over the assumed (or doctor-measured, `gpu_flops`) throughput, times the
    slowdown of weights dequantized on the fly (`slowdown`: doctor's measurement, else SLOWDOWN)."""
    compute = flops / ((gpu_flops or GPU_FLOPS) if on_gpu else CPU_FLOPS)
    compute *= (slowdown or {}).get(storage) or SLOWDOWN.get(storage, 1.0)
    if not on_gpu and dtype == "bfloat16":
        compute /= CPU_BF16_SPEEDUP
    return compute


def transfer_seconds(streamed_bytes_per_step: int, moved_bytes_per_job: int, steps: int, on_gpu: bool = True,
                     bus_bytes_per_s: float = BUS_BYTES_PER_S) -> float:
    """The bus part of a step: what is streamed every step, plus what moves once per job spread over its steps.
    The least a step can take whatever the compute: a learned correction never goes below it."""
    moved = streamed_bytes_per_step + moved_bytes_per_job / max(1, steps)
    return moved / bus_bytes_per_s if on_gpu else 0.0
