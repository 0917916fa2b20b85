"""The passes of one Stable Diffusion job on the loaded pipeline, and their steps down the ladder on out-of-memory
(`Runner`; engines/sd/job.py turns a request into these passes and saves what they make).

Steps down, cheapest first (docs/DESIGN.md): split the batch; the next preset; a lower resolution with
upscaling afterwards. An out-of-memory in the VAE decode retries only the decode, tiled, with the
latents already computed; one in a hires second pass steps down the presets and keeps the first
pass. The guard itself (leave the except block, free memory, record the attempt) is
`lowvram_gen.ladder.Ladder`, shared with VQGAN-CLIP and the upscalers. The loaded pipeline is
reconfigured, never reloaded (except to restore precision that fp8/half storage lost, which `apply`
reports).
"""

from __future__ import annotations

import logging
import math
import threading
import time
from dataclasses import dataclass, replace
from typing import Callable

from lowvram_gen.hardware.device import DeviceInfo
from lowvram_gen.engines.sd import apply as apply_mod
from lowvram_gen.engines.sd import edit, inpaint
from lowvram_gen.engines.sd import pipeline as sd
from lowvram_gen.engines.sd import refiner, tiling, vae_swap
from lowvram_gen.control.resize import init_resized
from lowvram_gen.errors import BadOutput, Cancelled
from lowvram_gen.inpaint.area import area_for
from lowvram_gen.ladder import Ladder
from lowvram_gen.models.filedtype import half_dtype
from lowvram_gen.models.loading import (LoadedModel, drop_text_encoders, load_text_encoders, reload_components,
                                        text_encoder_names)
from lowvram_gen.oom import free_memory
from lowvram_gen.planning.sizes import capped_size
from lowvram_gen.presets import Preset
from lowvram_gen.request import GenerationRequest
from lowvram_gen.settings import MemorySettings
from lowvram_gen.upscale.upscalers import upscale_images

log = logging.getLogger(__name__)
MAX_RESOLUTION_STEPS = 2  # each halves the pixels; beyond a quarter of the request the upscale is mush
ADVICE = ("Close other programs using the GPU, lower --vram-budget/--reserve-vram, use a smaller size or batch, "
          "or run with --cpu")


@dataclass
class ChunkDone:
    """Images of one pass, finished: at the requested size, with what made them."""

    images: list  # PIL
    seeds: list[int]
    preset: str
    generated_size: tuple[int, int]  # what the model made, before any upscale
    nsfw: list[bool]
    indices: list[int] | None = None  # each image's place in the job (batch count x batch size), for its subseed
    stopped: str | None = None  # sd.INTERRUPT / sd.SKIP: the pass was stopped early and decoded as it was
    only_masked: bool = False  # inpainting: the ladder turned the whole-picture job into an only-masked one


class Runner:
    """Runs jobs on one loaded model; keeps what is applied to it between jobs."""

    def __init__(self, model: LoadedModel, device: DeviceInfo, ops_factory=apply_mod.PipelineOps):
        self.model = model
        self.device = device
        self.ops_factory = ops_factory
        self.applied: MemorySettings | None = None
        self.residency = None  # offload = "budget": the denoiser's split as applied (None: another offload)
        self.resident_on_device = False  # where the split's resident part is now (the runner's apply leaves it off)
        self._placing: list = []  # the one-shot forward pre-hooks that will place it (place_resident(True))
        self.refiner = None  # the job's refiner (engines/sd/refiner.Refiner), set by the Session; None: none
        # Wan 2.2 A14B's two experts' residency (engines/video/experts.Experts) of the last video job, set by it
        self.experts = None

    def use(self, settings: MemorySettings) -> None:
        """Reconfigure the loaded pipeline for `settings` (a no-op when they are already applied)."""
        if settings == self.applied:
            return
        pipe = self.model.pipe
        effective, _ = apply_mod.effective_settings(settings, self.device)
        if effective.text_encoders == "reloaded":
            self._drop_encoders()  # loaded with them (an earlier job kept them): they leave now
        elif self.model.source.kind != "single_file":
            absent = [n for n in text_encoder_names(self.model.source.path) if getattr(pipe, n, None) is None]
            if absent:  # a rung that keeps them, after one that reloaded them per job
                half = half_dtype(self.model.source.path) if effective.half_storage else "float16"
                reload_components(self.model, absent, apply_mod.load_dtype(effective, half), effective.quantize,
                                  self.device.torch_device)
                apply_mod.forget_components(pipe, absent)
                self.forget_img2img()
        stale = vae_swap.reload_file(self, apply_mod.needs_reload(pipe, effective))  # a VAE file's: from its file
        if stale:
            half = half_dtype(self.model.source.path) if effective.half_storage else "float16"
            reload_components(self.model, stale, apply_mod.load_dtype(effective, half), effective.quantize,
                              self.device.torch_device)
            apply_mod.forget_components(pipe, stale)
        self._applied(apply_mod.apply_settings(pipe, settings, self.device, self.ops_factory(pipe),
                                               place_resident=False))
        self.applied = settings

    def use_on(self, ladder: Ladder, settings_of: Callable[[Preset], MemorySettings], where: dict) -> None:
        """Apply the ladder's preset (`settings_of(preset)`: the settings the job runs it with). An out-of-memory while
        its weights move onto the device (a preset forced beyond the card, memory another program took: seen on an
        H100 with `--preset highvram --vram-budget 1536MiB` and SD 1.5) steps down the presets as one in a denoise
        does, and the job goes on; the weights stay loaded. `where`: the job's batch/size for the attempt record."""
        while True:
            ok, _ = ladder.attempt("place", lambda: self.use(settings_of(ladder.preset)), lambda: dict(where))
            if ok:
                return
            self.applied = None  # some weights moved and some not: the next rung's apply starts from where they are
            if not ladder.step_preset():
                raise ladder.exhausted(ADVICE)
            ladder.went_down(f"{ladder.preset_name} (its weights placed again)")

    def encode(self, texts: sd.Texts, cfg: bool, hires_cfg: bool | None = None) -> tuple[dict | None, dict | None]:
        """text_encoders = "reloaded" (the applied settings): read the text encoders from disk, encode `texts`
        for one image, and drop the encoders before anything else runs, so the denoiser never has them beside
        it in RAM (planning/host.py's encode phase). Returns the embeddings, which the job keeps for every
        pass and retry, and hires fix's second pass's (`hires_cfg`: whether it runs with CFG; None: no hires fix):
        its own prompts (`texts.hires`) read in the same load, or the first pass's again where they are the same;
        (None, None) when the encoders are kept (the pipeline call encodes the strings itself)."""
        if self.applied is None or self.applied.text_encoders != "reloaded":
            return None, None
        effective, _ = apply_mod.effective_settings(self.applied, self.device)
        names = load_text_encoders(self.model, effective.quantize, self.device.torch_device)
        try:
            apply_mod.prepare_encoders(self.model.pipe, names, self.applied, self.device, self.ops_factory(self.model.pipe))
            first = sd.encode_texts(self.model.pipe, texts, cfg)
            if hires_cfg is None:
                return first, None
            if texts.hires is None and hires_cfg == cfg:
                return first, first
            return first, sd.encode_texts(self.model.pipe, texts.second, hires_cfg)
        finally:
            self._drop_encoders()

    def _drop_encoders(self) -> None:
        names = drop_text_encoders(self.model)
        if names:
            apply_mod.forget_components(self.model.pipe, names)  # no precision to restore: they are gone
            self.forget_img2img()
            free_memory(self.device.kind)

    def forget_img2img(self) -> None:
        """The img2img pipeline made over the components holds them too (pipeline.img2img_pipe): made again."""
        self.model.pipe.__dict__.pop("_lowvram_img2img", None)
        self.model.pipe.__dict__.pop("_lowvram_inpaint", None)  # and the inpaint one (engines/sd/inpaint.py)

    def reapply(self) -> None:
        """Apply the current settings again (after LoRAs or embeddings were loaded with hooks lifted)."""
        self._applied(apply_mod.apply_settings(self.model.pipe, self.applied, self.device,
                                               self.ops_factory(self.model.pipe), place_resident=False))

    def _applied(self, applied: apply_mod.Applied) -> None:
        self._unhook()
        self.residency = applied.residency
        self.resident_on_device = False  # apply_settings(place_resident=False) left it on the host

    def place_resident(self, denoising: bool) -> None:
        """Budget offload: the denoiser's resident part (kept blocks and fixed part) is on the device only
        while the denoiser runs. It goes on at the first forward of the pass's denoiser (or of a ControlNet,
        which runs first), not when the pass starts: the pipeline call encodes the prompts (and an img2img's
        init image) before that, and those phases get the room (planning/estimate.py counts the text phase
        without it). Before the VAE decode or an upscaler it goes to the host, so they get its room too; it
        comes back at the next denoise's first forward. That moves the resident bytes once each way per pass,
        which the plan counts. A no-op under the other offload modes. Under model offload the job's ControlNets
        leave the device here (apply.controlnets_off)."""
        if not denoising:
            self.ops_factory(self.model.pipe).controlnets_off()
            self._unhook()  # a pass that ended before its first forward (stopped, out of memory) placed nothing
        if self.residency is None:
            return
        if self.resident_on_device:  # before the decode; or before a pass, left there by one that died in its steps
            self._move("cpu")
            self.resident_on_device = False  # torch's allocator reuses the freed blocks for the decode
        if denoising and not self._placing:
            # prepend: before diffusers' group-offload hooks and any other pre-hook, so the forward finds it there
            self._placing = [module.register_forward_pre_hook(self._place_now, prepend=True)
                             for _, module in apply_mod._stepped(self.model.pipe)]

    def _place_now(self, *_) -> None:
        """The forward pre-hook of place_resident(True): the resident part onto the device, once."""
        self._unhook()
        if self.residency is not None and not self.resident_on_device:
            self._move(self.device.torch_device)
            self.resident_on_device = True

    def _move(self, device: str) -> None:
        """The resident part to `device`. Outside inference mode even inside the pipeline call (where the moves
        happen): weights copied there would be inference tensors, which a later in-place change of the weights
        outside it (a LoRA fused, a quantization) is refused."""
        import torch

        with torch.inference_mode(False):
            self.ops_factory(self.model.pipe).resident_to(device, self.residency.streamed)

    def _unhook(self) -> None:
        for handle in self._placing:
            handle.remove()
        self._placing = []

    def run(self, request: GenerationRequest, seeds: list[int], presets: list[Preset],
            on_chunk: Callable[[ChunkDone], None], on_step: sd.ProgressFn | None = None,
            cancel: threading.Event | None = None, ladder: Ladder | None = None,
            texts: sd.Texts | None = None, *, skip: threading.Event | None = None,
            preview=None) -> Ladder:
        """Make one image per seed for `request`, starting at `presets[0]`; returns the ladder (where
        the job ended and every attempt). `texts`: what the encoders read, if not the typed prompts.

        The seeds are batch_count batches of batch_size; a pass holds images of one batch only. `cancel` (A1111's
        Interrupt): the running pass stops at its next step, is decoded and handed to `on_chunk` like any, and the
        job ends raising Cancelled; set before a pass starts, the job ends there. `skip`: the running pass stops and
        is kept the same way, then the job goes on with the next batch (the rest of this one is not made); a skip
        from before the batch began is forgotten, as A1111's is. `preview`: live previews of each pass
        (lowvram_gen.preview.Previews)."""
        if not request.sampling_given:  # a caller below the Session (which resolves them): the family record's own
            from lowvram_gen.families import of_pipe

            found = of_pipe(self.model.pipe).default_sampling()
            request = request.with_sampling(found.steps, found.cfg)
        ladder = ladder or Ladder(presets, self.device.kind)
        _Job(self, request, seeds, ladder, on_step, cancel, texts, skip, preview).run(on_chunk)
        return ladder


class _Job:
    """One job's state on the ladder: the images still to make, how many per pass, at what size."""

    def __init__(self, runner: Runner, request: GenerationRequest, seeds: list[int], ladder: Ladder,
                 on_step, cancel, texts: sd.Texts | None = None, skip=None, preview=None):
        self.runner, self.request, self.seeds, self.ladder = runner, request, seeds, ladder
        self.texts = texts
        self.on_step, self.cancel, self.skip, self.preview = on_step, cancel, skip, preview
        self.pipe = runner.model.pipe
        self.device = runner.device.torch_device
        runner.use_on(ladder, lambda preset: tiling.untiled(preset.memory, request.tiling),
                      dict(batch=len(seeds), width=request.width, height=request.height, unit="weights"))
        # text_encoders = "reloaded": the prompts encoded once for the job (every pass and retry reuses them),
        # hires fix's second pass's too (its own prompts and CFG scale)
        self.embeds, self.hires_embeds = runner.encode(texts or sd.Texts.of(request), request.cfg_scale > 1,
                                                       request.hires_cfg_scale > 1 if request.hires else None)
        self.multiple = sd.size_multiple(self.pipe)  # the sides this pipeline takes
        # an inpaint pipeline that renders its own size (Qwen-Image-Edit's): no preset caps it, no resolution step
        self.own_size = inpaint.renders_own_size(self.pipe, request)
        self.size = self._capped(request.width, request.height, ladder.preset.max_pixels)
        self.per_batch = max(1, len(seeds) // request.batch_count)  # batch size: a pass holds one batch's images
        self.per_pass = min(self.per_batch, ladder.preset.max_batch)
        self.references = edit.read(request.reference_images) if request.reference_images else None
        if self.references:  # an edit call that takes one prompt makes one image a pass
            self.per_pass = min(self.per_pass, edit.per_call(self.pipe) or self.per_pass)
        self.lowered = 0  # resolution halvings so far
        self.init = _init_image(request)
        self.area = area_for(request, self.init) if self.init is not None else None  # inpainting: the mask's

    def _capped(self, width: int, height: int, pixels: int) -> tuple[int, int]:
        return (width, height) if self.own_size else capped_size(width, height, pixels, self.multiple)

    def where(self, size: tuple[int, int] | None = None) -> dict:
        width, height = size or inpaint.rendered(self.pipe, self.request, self.size)  # what the pass renders
        return dict(batch=self.per_pass, width=width, height=height, unit=f"batch {self.per_pass}")

    def _use(self, settings: MemorySettings, tiled: bool = False) -> None:
        settings = replace(settings, vae_tiling=True, vae_slicing=True) if tiled else settings
        self.runner.use(tiling.untiled(settings, self.request.tiling))  # seamless tiling decodes in one piece

    # -- the job ---------------------------------------------------------------------------------
    def _stop_asked(self) -> str | None:
        if self.cancel is not None and self.cancel.is_set():
            return sd.INTERRUPT
        return sd.SKIP if self.skip is not None and self.skip.is_set() else None

    def run(self, on_chunk: Callable[[ChunkDone], None]) -> None:
        pending = list(range(len(self.seeds)))  # image indices still to make
        per_batch, batch = self.per_batch, None
        while pending:
            if self.cancel is not None and self.cancel.is_set():  # asked while loading, waiting or between passes
                raise Cancelled("cancelled before the first step" if len(pending) == len(self.seeds)
                                else "cancelled after a finished pass")
            if pending[0] // per_batch != batch:  # a new batch of the batch count
                batch = pending[0] // per_batch
                if self.skip is not None:
                    self.skip.clear()  # A1111's skip ends the batch it was asked in, never a later one
            indices = [i for i in pending[:self.per_pass] if i // per_batch == batch]
            seeds = [self.seeds[i] for i in indices]
            first = self._first_pass(seeds)
            if self.request.subseed_strength > 0:  # A1111's variation seeds: image i's is subseed+i
                first.subseeds = [self.request.subseed_for(i) for i in indices]
            started = time.perf_counter()
            ok, out = self.ladder.attempt("denoise", lambda: self._denoise(first), self.where)
            if not ok:
                self._step_down()
                continue
            timed = {"seconds_per_step": round(out.seconds_per_step, 4)} if out.seconds_per_step else {}
            self.ladder.record("denoise", "ok", started, **self.where(), extra=timed)
            size, target = self.size, self.request.output_size()
            if self.area is not None and self.area.out_size is not None:
                target = size  # the ladder's only-masked box: pasted back into the canvas as it was made
            stopped, at = out.stopped, out.stopped_at
            if self.request.hires and (stopped or self._stop_asked()):
                # stopped in (or right after) the first pass: kept as it is, no hires pass, as in A1111
                stopped, target = stopped or self._stop_asked(), (self.request.width, self.request.height)
            elif self.request.hires:
                out, size = self._hires(first, out)
                stopped, at = out.stopped, out.stopped_at
            # what the last pass made: its inpaint pipeline's own size, or `size` (the hires pass's, after one)
            made = inpaint.rendered(self.pipe, self.request, size)
            images, nsfw = (out.images, out.nsfw) if out.decoded else self._decode(out.latents, size)
            del out
            if made != size:  # made at the pipeline's own size: brought to the pass's, as its init image was given
                from PIL import Image

                images = [im.resize(size, Image.LANCZOS) for im in images]
            if size != target and images:
                self.runner.place_resident(False)
                images = upscale_images(images, target, self.ladder.preset.upscaler, self.device, ladder=self.ladder)
            if self.area is not None:  # inpainting: the original kept outside the mask, the crop pasted back
                images = self.area.finish(images)
            on_chunk(ChunkDone(images, seeds, self.ladder.preset_name, made, nsfw, indices, stopped,
                               only_masked=self.area is not None and self.area.out_size is not None))
            pending = [i for i in pending if i not in indices]
            if stopped == sd.INTERRUPT:
                raise Cancelled(f"cancelled at step {at[0]} of {at[1]}" if at else "cancelled before the hires pass")
            if stopped == sd.SKIP:
                pending = [i for i in pending if i // per_batch != batch]  # the rest of this batch is skipped too
                log.info("skipped batch %d at step %s", batch + 1, f"{at[0]} of {at[1]}" if at else "the end of its first pass")

    def _denoise(self, step: sd.Pass) -> sd.Denoised:
        """One pass of the denoiser, with the budget split's resident part on the device only while it runs
        (placed at its first forward, after the pipeline call has encoded the prompts)."""
        self.runner.place_resident(True)
        with tiling.seamless(self.pipe, self.request.tiling), \
                refiner.switching(self.pipe, step, self.runner.refiner, self.device, self.runner):  # per pass
            return sd.denoise(self.pipe, step, self.device, self.on_step, self.cancel,
                              after_last_step=lambda: self.runner.place_resident(False), skip=self.skip,
                              preview=self.preview)

    def _first_pass(self, seeds: list[int]) -> sd.Pass:
        if self.init is None:
            return sd.Pass(self.request, seeds, *self.size, texts=self.texts, embeds=self.embeds,
                           references=self.references)
        if self.area is not None:  # inpainting: the init and mask at this pass's size (the crop, for only masked)
            init, mask = self.area.for_pass(self.size)  # at the job's size, whatever size the pipeline renders
            made = inpaint.rendered(self.pipe, self.request, self.size)
            return sd.Pass(self.request, seeds, *made, init=[init] * len(seeds), strength=self.request.strength,
                           texts=self.texts, embeds=self.embeds, mask=mask, control_crop=self.area.control_crop)
        latent = self.request.resize_mode == "latent" and self.init.size != self.size  # encoded at its own size
        resized = self.init if self.init.size == self.size or latent else self.init.resize(self.size) \
            if self.request.resize_mode in ("resize", "latent") else \
            init_resized(self.init, *self.size, self.request.resize_mode)
        return sd.Pass(self.request, seeds, *self.size, init=[resized] * len(seeds), strength=self.request.strength,
                       texts=self.texts, embeds=self.embeds, latent_resize=latent)

    def _step_down(self) -> None:
        """After a denoise out-of-memory: an inpaint job on a big canvas goes on as only masked (inpaint/area.py),
        then fewer images per pass, the next preset, then fewer pixels."""
        rung = self.area.masked_rung(self.size, self.multiple, self._native_side()) \
            if self.area is not None and not self.own_size else None  # its own size: the box would cost the same
        if rung is not None:
            self.area, self.size = rung
            self.ladder.went_down(f"only masked, {self.size[0]}x{self.size[1]} around the mask, "
                                  f"{self.ladder.preset_name}")
            return
        if self.per_pass > 1:
            self.per_pass = math.ceil(self.per_pass / 2)
        elif self.ladder.step_preset():
            self._use(self.ladder.preset.memory)
            self.size = self._capped(*self.size, self.ladder.preset.max_pixels)
        elif self.lowered < MAX_RESOLUTION_STEPS and min(self.size) > 64 and not self.own_size:
            self.lowered += 1
            self.size = capped_size(*self.size, self.size[0] * self.size[1] // 2, self.multiple)
        else:
            raise self.ladder.exhausted(ADVICE)
        self.ladder.went_down(f"{self.ladder.preset_name}, batch {self.per_pass}, {self.size[0]}x{self.size[1]}")

    def _native_side(self) -> int:
        """The side the denoiser was trained at (SD 1.x 512, SDXL 1024): its sample size in latents, in pixels; a
        transformer's (no UNet: Qwen-Image, Z-Image) is its record's."""
        unet = getattr(self.pipe, "unet", None)
        if unet is None:
            from lowvram_gen import families

            return int(families.of_pipe(self.pipe).native_side)
        return int(unet.config.sample_size) * int(self.pipe.vae_scale_factor)

    def _decode(self, latents, size: tuple[int, int], safety_check: bool = True) -> tuple[list, list[bool]]:
        """Decode; on out-of-memory tiled, then cheaper presets; NaN/black half output again in float32."""
        import torch

        tiled = self.ladder.preset.memory.vae_tiling
        while True:
            started = time.perf_counter()
            self.runner.place_resident(False)  # a retry's re-apply put it back on the device
            ok, decoded = self.ladder.attempt("decode", lambda: self._decode_once(latents, safety_check),
                                              lambda: self.where(size))
            if ok:
                break
            if not tiled and not self.request.tiling:  # a seamless job skips the tiled rung (tiling.py says why)
                tiled = True
            elif not self.ladder.step_preset():
                raise self.ladder.exhausted(ADVICE)
            self._use(self.ladder.preset.memory, tiled=True)
            self.ladder.went_down(f"{self.ladder.preset_name}, "
                                  f"{tiling.SKIPPED_RUNG if self.request.tiling else 'tiled VAE decode'}")
        if decoded.bad and self.pipe.vae.dtype != torch.float32:
            self.ladder.record("decode", decoded.bad, started, "half-precision decode; decoded again in float32",
                               **self.where(size))
            started = time.perf_counter()
            decoded = self._decode_once(latents, safety_check, upcast=True)
        if decoded.bad:
            raise BadOutput(
                f"the model produced {'NaN/Inf' if decoded.bad == 'nan' else 'an all-black image'} even when decoded "
                "in float32; the weights may be broken (check the file) or the VAE needs a fixed version")
        self.ladder.record("decode", "ok", started, **self.where(size))
        return decoded.images, decoded.nsfw

    def _decode_once(self, latents, safety_check: bool, upcast: bool = False):
        with tiling.seamless(self.pipe, self.request.tiling):
            return sd.decode(self.pipe, latents, upcast=upcast, safety_check=safety_check)

    def _hires(self, first: sd.Pass, out: sd.Denoised) -> tuple[sd.Denoised, tuple[int, int]]:
        """A1111's hires fix: upscale the first pass (latents, or pixels) to the hires size (`Hires upscale` or
        `Hires resize`, cropped to the resize's aspect: hires.py), then an img2img pass with the hires sampler,
        schedule type, CFG scale and prompts (the first pass's where they are not set).

        The second pass runs with VAE tiling; on out-of-memory it steps down the presets (the first
        pass is kept, never redone). Over the preset's cap it runs at the cap and the result is
        upscaled to the hires size afterwards. The hires scheduler is the pipeline's only for the second pass:
        the first pass's is back after it, whatever happened (a retry, an error, a cancel)."""
        request = self.request
        geometry = self._hires_geometry(request.hires_geometry(self.multiple, self.size))
        if request.latent_upscale is None:  # pixels: decode the first pass once, before any retry
            pixels = out.images if out.decoded else self._decode(out.latents, self.size, safety_check=False)[0]
        texts = (self.texts or sd.Texts.of(request)).second
        scheduler, _ = sd.hires_scheduler(self.pipe, request)  # its warning was said when the job started
        self._use(self.ladder.preset.memory, tiled=True)
        with sd.scheduler_swapped(self.pipe, scheduler):
            while True:
                target = geometry.size
                init = self._hires_init(out, pixels if request.latent_upscale is None else None, geometry)
                second = sd.Pass(request, first.seeds, *target, init=init, strength=request.hires_denoise,
                                 steps=request.hires_steps or request.steps, texts=texts, embeds=self.hires_embeds,
                                 subseeds=first.subseeds,  # A1111's hires pass draws its noise the same way
                                 cfg_scale=request.hires_cfg_scale, hires=True)
                started = time.perf_counter()
                ok, result = self.ladder.attempt("hires", lambda: self._denoise(second), lambda: self.where(target))
                if ok:
                    self.ladder.record("hires", "ok", started, **self.where(target))
                    return result, target
                del init, second
                if not self.ladder.step_preset():
                    raise self.ladder.exhausted(ADVICE)
                self._use(self.ladder.preset.memory, tiled=True)
                geometry = self._hires_geometry(geometry)
                self.ladder.went_down(f"{self.ladder.preset_name}, hires pass at {geometry.size[0]}x{geometry.size[1]}")

    def _hires_geometry(self, geometry):
        """`geometry` within the current preset's pixel cap."""
        capped = capped_size(*geometry.size, self.ladder.preset.max_pixels, self.multiple)
        return geometry.scaled(*capped, self.multiple)

    def _hires_init(self, out: sd.Denoised, pixels, geometry):
        """The second pass's start: the first pass's latents upscaled with the latent upscaler's mode (A1111's
        `latent_upscale_modes`), or its images with the pixel upscaler; cropped to the hires size where a resize
        asks for another aspect."""
        request = self.request
        if pixels is None:
            import torch.nn.functional as F

            mode, antialias = request.latent_upscale
            (uw, uh), (x, y), (w, h) = geometry.upscale_to, geometry.offset, geometry.size
            latents = out.latents.float() if antialias else out.latents  # torch antialiases float32 on every device
            init = F.interpolate(latents, size=(uh // 8, uw // 8), mode=mode, antialias=antialias).to(out.latents.dtype)
            return init[:, :, y // 8:(y + h) // 8, x // 8:(x + w) // 8].contiguous() if geometry.cropped else init
        self.runner.place_resident(False)
        images = upscale_images(pixels, geometry.upscale_to, request.hires_upscaler, self.device, ladder=self.ladder)
        return [im.crop(geometry.box()) for im in images] if geometry.cropped else images


def _init_image(request: GenerationRequest):
    """The img2img init image as RGB, read once per job (None for txt2img)."""
    if not request.init_image:
        return None
    from PIL import Image

    with Image.open(request.init_image) as im:
        return im.convert("RGB")
