"""The retry ladder: run a job and, on out-of-memory, step down until it finishes.

Order of steps, cheapest first (DESIGN.md): split the batch; the next preset down; a lower
resolution with upscaling afterwards. An OOM in the VAE decode retries only the decode, tiled,
with the latents already computed. Recovery happens after the `except` block (the exception's
frames pin the tensors), then `free_memory()`. The loaded pipeline is reconfigured, never reloaded
(except to restore precision that fp8/half storage lost, which `apply` reports).
"""

from __future__ import annotations

import logging
import math
import threading
import time
from dataclasses import asdict, dataclass, field
from typing import Callable

from lowvram_gen.engines.sd import apply as apply_mod
from lowvram_gen.device import DeviceInfo
from lowvram_gen.engines.sd import pipeline as sd
from lowvram_gen.errors import BadOutput, OutOfMemoryEverywhere
from lowvram_gen.models.loading import LoadedModel, reload_components
from lowvram_gen.oom import allocated_bytes, free_memory, is_oom, short_reason
from lowvram_gen.presets import Preset
from lowvram_gen.settings import MemorySettings
from lowvram_gen.upscale.upscalers import upscale_images

log = logging.getLogger(__name__)
MAX_RESOLUTION_STEPS = 2  # each halves the pixels; beyond a quarter of the request the upscale is mush


@dataclass
class Attempt:
    preset: str
    batch: int  # images in the forward pass
    width: int
    height: int
    stage: str  # 'denoise' | 'decode'
    outcome: str  # 'ok' | 'oom' | 'nan' | 'black'
    seconds: float
    detail: str = ""

    def as_dict(self) -> dict:
        return asdict(self)


@dataclass
class ChunkDone:
    images: list  # PIL, at the requested size
    seeds: list[int]
    preset: str
    generated_size: tuple[int, int]  # what the model made, before any upscale
    nsfw: list[bool]


@dataclass
class JobReport:
    attempts: list[Attempt] = field(default_factory=list)
    final_preset: str = ""
    upscaled: bool = False
    generated_size: tuple[int, int] = (0, 0)

    def summary(self, seconds: float) -> str:
        """One line for people: 'out of memory at highvram, batch 4 -> split to 2; finished at medvram in 14.2 s'."""
        parts = []
        for a in self.attempts:
            if a.outcome == "oom":
                parts.append(f"out of memory at {a.preset} ({a.stage}, batch {a.batch}, {a.width}x{a.height})")
            elif a.outcome in ("nan", "black"):
                parts.append(f"{a.outcome} output at {a.preset}: decoded again in float32")
        tail = f"finished at {self.final_preset} in {seconds:.1f} s"
        if self.upscaled:
            tail += f" (generated at {self.generated_size[0]}x{self.generated_size[1]}, upscaled)"
        return "; ".join(parts + [tail])


def capped_size(width: int, height: int, max_pixels: int, multiple: int = 8) -> tuple[int, int]:
    """The largest size within `max_pixels` with the same aspect ratio, sides multiples of `multiple`
    (what the pipeline takes: sd.size_multiple, 16 for SD3), at least 64 px."""
    if width * height <= max_pixels:
        return width, height
    scale = math.sqrt(max_pixels / (width * height))
    least = -(-64 // multiple) * multiple
    return max(least, int(width * scale) // multiple * multiple), max(least, int(height * scale) // multiple * multiple)


@dataclass
class JobSpec:
    """One job as the runner sees it: what to make, whatever front end asked for it."""

    prompt: str
    negative_prompt: str
    width: int
    height: int
    steps: int
    cfg_scale: float
    seeds: list[int]
    init_images: list | None = None  # img2img: one PIL image per seed
    strength: float = 1.0
    hires_scale: float = 1.0
    hires_upscaler: str = "latent"
    hires_steps: int = 0
    hires_denoise: float = 0.7

    @classmethod
    def from_request(cls, request, seeds: list[int], init_images: list | None = None) -> "JobSpec":
        return cls(request.prompt, request.negative_prompt, request.width, request.height, request.steps,
                   request.cfg_scale, seeds, init_images, request.strength, request.hires_scale,
                   request.hires_upscaler, request.hires_steps, request.hires_denoise)

    def hires_size(self, base: tuple[int, int], multiple: int = 8) -> tuple[int, int]:
        return (int(base[0] * self.hires_scale) // multiple * multiple,
                int(base[1] * self.hires_scale) // multiple * multiple)

    def final_size(self) -> tuple[int, int]:
        return self.hires_size((self.width, self.height)) if self.hires_scale > 1 else (self.width, self.height)

    def chunk(self, indices: list[int], size: tuple[int, int]) -> sd.Chunk:
        init = None
        if self.init_images is not None:
            init = [im.convert("RGB").resize(size) if im.size != size else im.convert("RGB")
                    for im in (self.init_images[i] for i in indices)]
        return sd.Chunk(self.prompt, self.negative_prompt, size[0], size[1], self.steps, self.cfg_scale,
                        [self.seeds[i] for i in indices], init=init,
                        strength=self.strength if init is not None else 1.0)


class Runner:
    """Runs chunks of one job on one loaded model, stepping down the ladder on OOM."""

    def __init__(self, model: LoadedModel, device: DeviceInfo, ops_factory=apply_mod.PipelineOps):
        self.model = model
        self.device = device
        self.ops_factory = ops_factory
        self.applied: MemorySettings | None = None

    # -- presets ---------------------------------------------------------------------------
    def use(self, settings: MemorySettings) -> None:
        """Reconfigure the loaded pipeline for `settings` (a no-op when they are already applied)."""
        if settings == self.applied:
            return
        pipe = self.model.pipe
        effective, _ = apply_mod.effective_settings(settings, self.device)
        stale = apply_mod.needs_reload(pipe, effective)
        if stale:
            reload_components(self.model, stale, effective.dtype)
            apply_mod.forget_components(pipe, stale)
        apply_mod.apply_settings(pipe, settings, self.device, self.ops_factory(pipe))
        self.applied = settings

    # -- the job -----------------------------------------------------------------------------
    def run(self, job: "JobSpec", ladder: list[Preset], on_chunk: Callable[[ChunkDone], None],
            on_step: sd.ProgressFn | None = None, cancel: threading.Event | None = None,
            report: JobReport | None = None) -> JobReport:
        report = report or JobReport()
        rung, lowered = 0, 0
        preset = ladder[0]
        self.use(preset.memory)
        multiple = sd.size_multiple(self.model.pipe)  # the sides this pipeline takes
        size = capped_size(job.width, job.height, preset.max_pixels, multiple)
        per_pass = min(len(job.seeds), preset.max_batch)
        pending = list(range(len(job.seeds)))  # image indices still to make
        while pending:
            batch = pending[:per_pass]
            chunk = job.chunk(batch, size)
            started = time.perf_counter()
            baseline = allocated_bytes(self.device.kind)
            oom = None
            try:
                latents = sd.denoise(self.model.pipe, chunk, self.device.torch_device, on_step, cancel)
            except Exception as exc:  # noqa: BLE001 - anything but OOM is re-raised
                if not is_oom(exc):
                    raise
                oom = short_reason(exc)
            if oom is not None:
                report.attempts.append(Attempt(preset.name, per_pass, *size, "denoise", "oom", _since(started), oom))
                free_memory(self.device.kind, baseline)
                if per_pass > 1:
                    per_pass = math.ceil(per_pass / 2)
                elif rung + 1 < len(ladder):
                    rung += 1
                    preset = ladder[rung]
                    self.use(preset.memory)
                    size = capped_size(*size, preset.max_pixels, multiple)
                elif lowered < MAX_RESOLUTION_STEPS and min(size) > 64:
                    lowered += 1
                    size = capped_size(*size, size[0] * size[1] // 2, multiple)
                else:
                    raise OutOfMemoryEverywhere(_everything_failed(report.attempts), report.attempts)
                log.warning("out of memory at %s; retrying with %s, batch %d, %dx%d", report.attempts[-1].preset,
                            preset.name, per_pass, *size)
                continue
            report.attempts.append(Attempt(preset.name, per_pass, *size, "denoise", "ok", _since(started)))
            target = job.final_size()
            if job.hires_scale > 1:
                latents, size, preset, rung = self._hires(job, chunk, latents, size, ladder, rung, preset,
                                                         per_pass, on_step, cancel, report)
            if sd.splits_decode(self.model.pipe):
                decoded, preset, rung = self._decode(latents, ladder, rung, preset, per_pass, size, report)
                images, nsfw = decoded.images, decoded.nsfw
            else:  # the pipeline decoded (and safety-checked) its images itself
                images, nsfw = latents.images, latents.nsfw
            del latents
            upscaled = size != target
            if upscaled:
                images = upscale_images(images, target, preset.upscaler, self.device.torch_device)
            report.final_preset, report.generated_size = preset.name, size
            report.upscaled = report.upscaled or upscaled
            on_chunk(ChunkDone(images, chunk.seeds, preset.name, size, nsfw))
            pending = pending[per_pass:]
        return report

    def _hires(self, job, chunk, latents, size, ladder, rung, preset, per_pass, on_step, cancel, report):
        """A1111's hires fix: upscale the first pass (latents or pixels), then an img2img pass.

        The second pass runs with VAE tiling; on OOM it steps down the presets (the first pass's
        latents are kept, so it is never redone). Over the preset's cap it runs at the cap and the
        result is upscaled to the hires size afterwards.
        """
        import torch.nn.functional as F

        multiple = sd.size_multiple(self.model.pipe)
        target = capped_size(*job.hires_size(size, multiple), preset.max_pixels, multiple)
        self.use(_with_tiling(preset.memory))
        while True:
            started = time.perf_counter()
            baseline = allocated_bytes(self.device.kind)
            oom = None
            try:
                if job.hires_upscaler == "latent":
                    init = F.interpolate(latents, size=(target[1] // 8, target[0] // 8), mode="bilinear")
                else:
                    if sd.splits_decode(self.model.pipe):
                        first, _, _ = self._decode(latents, ladder, rung, preset, per_pass, size, report,
                                                   safety_check=False)
                    else:
                        first = latents  # the pipeline decoded its first pass itself (sd.Decoded)
                    init = upscale_images(first.images, target, job.hires_upscaler, self.device.torch_device)
                second = sd.Chunk(chunk.prompt, chunk.negative_prompt, *target, job.hires_steps or job.steps,
                                  chunk.cfg_scale, chunk.seeds, init=init, strength=job.hires_denoise)
                result = sd.denoise(self.model.pipe, second, self.device.torch_device, on_step, cancel)
            except Exception as exc:  # noqa: BLE001
                if not is_oom(exc):
                    raise
                oom = short_reason(exc)
            if oom is None:
                report.attempts.append(Attempt(preset.name, per_pass, *target, "hires", "ok", _since(started)))
                return result, target, preset, rung
            report.attempts.append(Attempt(preset.name, per_pass, *target, "hires", "oom", _since(started), oom))
            free_memory(self.device.kind, baseline)
            if rung + 1 >= len(ladder):
                raise OutOfMemoryEverywhere(_everything_failed(report.attempts), report.attempts)
            rung += 1
            preset = ladder[rung]
            self.use(_with_tiling(preset.memory))
            target = capped_size(*target, preset.max_pixels, multiple)

    def _decode(self, latents, ladder, rung, preset, per_pass, size, report, safety_check: bool = True):
        """Decode with retries: tiled on OOM, then cheaper presets; float32 on NaN/black half output."""
        pipe = self.model.pipe
        tiled = preset.memory.vae_tiling
        while True:
            started = time.perf_counter()
            baseline = allocated_bytes(self.device.kind)
            oom = None
            try:
                decoded = sd.decode(pipe, latents, safety_check=safety_check)
            except Exception as exc:  # noqa: BLE001
                if not is_oom(exc):
                    raise
                oom = short_reason(exc)
            if oom is None:
                break
            report.attempts.append(Attempt(preset.name, per_pass, *size, "decode", "oom", _since(started), oom))
            free_memory(self.device.kind, baseline)
            if not tiled:
                tiled = True
                self.use(_with_tiling(preset.memory))
            elif rung + 1 < len(ladder):
                rung += 1
                preset = ladder[rung]
                self.use(_with_tiling(preset.memory))
            else:
                raise OutOfMemoryEverywhere(_everything_failed(report.attempts), report.attempts)
        if decoded.bad and pipe.vae.dtype != _float32():
            report.attempts.append(Attempt(preset.name, per_pass, *size, "decode", decoded.bad, _since(started),
                                           "half-precision decode; retrying in float32"))
            started = time.perf_counter()
            decoded = sd.decode(pipe, latents, upcast=True, safety_check=safety_check)
        if decoded.bad:
            raise BadOutput(
                f"the model produced {'NaN/Inf' if decoded.bad == 'nan' else 'an all-black image'} even when decoded "
                "in float32; the weights may be broken (check the file) or the VAE needs a fixed version"
            )
        report.attempts.append(Attempt(preset.name, per_pass, *size, "decode", "ok", _since(started)))
        return decoded, preset, rung


def _with_tiling(settings: MemorySettings) -> MemorySettings:
    from dataclasses import replace

    return replace(settings, vae_tiling=True, vae_slicing=True)


def _float32():
    import torch

    return torch.float32


def _since(t: float) -> float:
    return round(time.perf_counter() - t, 3)


def _everything_failed(attempts: list[Attempt]) -> str:
    tried = ", ".join(f"{a.preset} (batch {a.batch}, {a.width}x{a.height}, {a.stage})" for a in attempts if a.outcome == "oom")
    return (
        f"out of memory at every step of the ladder; tried: {tried}. "
        "Close other programs using the GPU, lower --vram-budget/--reserve-vram, use a smaller size or batch, "
        "or run with --cpu"
    )
