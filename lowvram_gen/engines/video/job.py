"""One video job, from a validated request (its video defaults filled in) to a saved clip: `run_video_job()`.

The Session has probed the device, planned the presets, loaded the model and built the ladder; this module puts the
first preset on (Runner.use_on), runs the denoise through diffusers' own pipeline call with output_type="latent"
(every argument as the plain pipeline takes it: num_frames, size, steps, guidance_scale and Wan 2.2 A14B's
guidance_scale_2, the negative prompt, a generator seeded as images are, LTX's frame_rate), then the decode as a stage
of its own (decode.py), and saves the clip (lowvram_gen.video_out.save_clip).

The ladder for a clip (the same Ladder, the same attempts list as images):
- an out-of-memory in the denoise: the next preset (the loaded weights reconfigured, never reloaded), from the first
  step again; below the last preset, only when the request allows it (`allow_upscale`), a lower resolution whose
  frames are upscaled to the asked size after (the result's `upscaled` and warnings say so). A clip is never made
  shorter or smaller in silence (FAULTS 37): without that permission the job stops, saying what was tried.
- an out-of-memory in the decode: the same latents decoded again tiled (and LTX frame by frame), then at cheaper
  presets; the denoise never runs again.

`cancel` (Interrupt): the steps stop at the next one; the clip as it was is decoded and saved, and the job ends
raising Cancelled with it.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from pathlib import Path
from typing import Callable

from lowvram_gen import outputs
from lowvram_gen import preview as previews
from lowvram_gen.engines.sd import apply as apply_mod
from lowvram_gen.engines.sd import rng_source
from lowvram_gen.engines.sd.rng_source import generators
from lowvram_gen.engines.video import decode as decoding
from lowvram_gen.engines.video.checks import VideoModel
from lowvram_gen.engines.video.experts import Experts
from lowvram_gen.engines.video.pipelines import call_pipe, sampler_name, set_video_sampler
from lowvram_gen.errors import BadOutput, Cancelled
from lowvram_gen.hardware.device import DeviceInfo
from lowvram_gen.ladder import Ladder
from lowvram_gen.models.resolve import ModelSource
from lowvram_gen.request import GenerationRequest
from lowvram_gen.result import GenerationResult
from lowvram_gen.video_out import save_clip

log = logging.getLogger(__name__)
MAX_RESOLUTION_STEPS = 2  # each halves the pixels (only with allow_upscale)
ADVICE = ("Close other programs using the GPU, lower --vram-budget/--reserve-vram, ask for fewer frames or a smaller "
          "size, pass --allow-upscale (a smaller clip upscaled after), or run with --cpu")
UPSCALED_NOTE = ("the clip was made at {w}x{h} to fit in memory and its frames upscaled to {W}x{H} after "
                 "(--allow-upscale)")
NOISE_NOTE = "embedded tiny model: random weights, the clip is abstract noise; pass --model for a real one"


@dataclasses.dataclass
class _Denoised:
    latents: object
    seconds_per_step: float
    stopped_at: tuple[int, int] | None = None  # (step, total) where a cancel stopped the steps


def run_video_job(runner, request: GenerationRequest, ladder: Ladder, source: ModelSource, device: DeviceInfo,
                  outdir: Path, model: VideoModel, on_step: Callable[[int, int], None] | None = None,
                  cancel: threading.Event | None = None, plan_notes: list[str] = (), *, on_preview=None,
                  preview_every: int = 0, preview_method: str = "auto") -> GenerationResult:
    """Make and save the clip of `request` on `runner`'s loaded video model (see the module doc)."""
    return _VideoJob(runner, request, ladder, source, device, model, on_step, cancel, on_preview, preview_every,
                     preview_method).run(outdir, list(plan_notes))


class _VideoJob:
    def __init__(self, runner, request, ladder, source, device, model, on_step, cancel, on_preview, preview_every,
                 preview_method):
        self.runner, self.request, self.ladder, self.source, self.device = runner, request, ladder, source, device
        self.model, self.on_step, self.cancel = model, on_step, cancel
        self.on_preview = on_preview if preview_every > 0 and preview_method != "off" else None
        self.preview_every = preview_every
        self.preview_method = preview_method
        self.render = None  # the preview's renderer (preview.renderer), set before the first step
        self.pipe = runner.model.pipe
        self.size = (request.width, request.height)
        self.lowered = 0

    def where(self, size=None) -> dict:
        w, h = size or self.size
        return dict(batch=1, width=w, height=h, unit=f"{self.request.frames} frames")

    def run(self, outdir: Path, warnings: list[str]) -> GenerationResult:
        started = time.perf_counter()
        request, pipe = self.request, self.pipe
        if self.cancel is not None and self.cancel.is_set():
            raise Cancelled("cancelled before the first step; no clip made")
        set_video_sampler(pipe, request.sampler)
        self.runner.use_on(self.ladder, lambda preset: preset.memory, self.where())
        experts = Experts(self.runner)
        experts.reset()  # the high-noise expert first, the other off the device
        self.runner.experts = experts  # the residency record of the last job (tests read it)
        image = _init_image(request)
        call = call_pipe(pipe, image is not None)
        if self.on_preview is not None:
            # as the image engine: the format's approximation of the middle latent frame, no preview where no map
            # fits the latents (never a made-up picture), and "taesd" refused in one sentence before any step
            self.render = previews.renderer(call, self.preview_method)[0]
        seeds = request.resolved_seeds()  # one clip per seed: batch count clips (a video job's batch size is 1)
        if self.source.is_tiny:
            warnings.append(NOISE_NOTE)
        target = (request.width, request.height)
        clips, frames, count = [], [], 0
        for index, seed in enumerate(seeds):
            if index and self.cancel is not None and self.cancel.is_set():
                raise Cancelled(f"cancelled after {index} finished clip(s), kept", images=clips)
            with experts:
                out = self._denoise_stage(call, image, seed)
            latents = decoding.Latents(out.latents, request.frames, *self.size)
            del out.latents
            made = self._decode_stage(latents)
            generated = self.size
            if generated != target:
                made = self._upscaled(made, target)
                note = UPSCALED_NOTE.format(w=generated[0], h=generated[1], W=target[0], H=target[1])
                warnings += [note] if note not in warnings else []
            saved = self._save(made, seed, outdir, generated, warnings)
            clips.append(str(saved.path))
            frames += [str(f) for f in saved.frames]
            count = len(made)
            if out.stopped_at is not None:
                step, total = out.stopped_at
                raise Cancelled(f"cancelled at step {step} of {total}; the clip is kept as it was ({saved.path})",
                                images=clips)
        if len(clips) > 1:
            warnings.append(f"{len(clips)} clips made (batch count): {', '.join(clips)}")
        seconds = round(time.perf_counter() - started, 3)
        return GenerationResult(
            images=[], seeds=seeds, width=target[0], height=target[1], steps=request.steps,
            sampler=sampler_name(pipe, request.sampler), model=request.model, model_path=str(self.source.path),
            seconds=seconds, preset=self.ladder.preset_name, attempts=[a.as_dict() for a in self.ladder.attempts],
            summary=self.ladder.summary(seconds, self.size, target), generated_width=self.size[0],
            generated_height=self.size[1], upscaled=self.size != target, device=self.device.name,
            warnings=warnings, video=clips[0], videos=clips, frames=frames, frame_count=count, fps=request.fps)

    # -- denoise ------------------------------------------------------------------------------------------------
    def _denoise_stage(self, call, image, seed: int) -> _Denoised:
        from lowvram_gen.planning.sizes import capped_size

        while True:
            started = time.perf_counter()
            ok, out = self.ladder.attempt("denoise", lambda: self._denoise(call, image, seed), self.where)
            if ok:
                self.ladder.record("denoise", "ok", started, **self.where(),
                                   extra={"seconds_per_step": round(out.seconds_per_step, 4)})
                return out
            if self.ladder.step_preset():
                self.runner.use_on(self.ladder, lambda preset: preset.memory, self.where())
            elif self.request.allow_upscale and self.lowered < MAX_RESOLUTION_STEPS and min(self.size) > 64:
                self.lowered += 1
                multiple = self.model.video.size_multiple
                self.size = capped_size(*self.size, self.size[0] * self.size[1] // 2, multiple)
            else:
                raise self.ladder.exhausted(ADVICE)
            self.ladder.went_down(f"{self.ladder.preset_name}, {self.size[0]}x{self.size[1]}, "
                                  f"{self.request.frames} frames")

    def _denoise(self, call, image, seed: int) -> _Denoised:
        import torch

        request = self.request
        self.runner.place_resident(True)
        ends: list[float] = []
        stop: dict = {}
        steps = request.steps

        def step_end(pipe, i, _t, kwargs):
            ends.append(time.perf_counter())
            done = i + 1
            if self.on_step is not None:
                self.on_step(done, steps)
            latents = kwargs.get("latents")
            if self.on_preview is not None and latents is not None and done % self.preview_every == 0:
                self._preview(call, latents, done, steps)
            if done < steps and self.cancel is not None and self.cancel.is_set() and not stop:
                stop["at"] = (done, steps)
                pipe._interrupt = True  # the loop's remaining steps do nothing; the call returns its latents
            return kwargs

        kwargs = dict(num_frames=request.frames, width=self.size[0], height=self.size[1], num_inference_steps=steps,
                      guidance_scale=request.cfg_scale, output_type="latent", callback_on_step_end=step_end,
                      generator=generators([seed], self.device.torch_device, request.rng)[0])
        kwargs.update(self._texts(call))
        if call.config.get("boundary_ratio") is not None:
            kwargs["guidance_scale_2"] = request.cfg_scale_2
        if self.model.video.fps_argument:
            kwargs[self.model.video.fps_argument] = request.fps
        if image is not None:
            kwargs["image"] = image  # the pipeline resizes it to the clip's size, its own way
        began = time.perf_counter()
        try:
            # the request's RNG source (gpu, cpu, nv: engines/sd/rng_source.py) draws the clip's noise as an image's
            with torch.inference_mode(), rng_source.drawing(request.rng, call, call.scheduler):
                latents = call(**kwargs).frames
        finally:
            self.runner.place_resident(False)
        per_step = (ends[-1] - began) / len(ends) if ends else 0.0
        return _Denoised(latents, per_step, stop.get("at"))

    def _texts(self, call) -> dict:
        """The prompts as the call takes them: the strings (its encoders run in the call), or, with text_encoders =
        "reloaded", the embeddings encoded here with the encoders read from disk and dropped before any step."""
        import inspect

        request = self.request
        applied = self.runner.applied
        effective = apply_mod.effective_settings(applied, self.device)[0] if applied is not None else None
        if effective is None or effective.text_encoders != "reloaded":
            return dict(prompt=request.prompt, negative_prompt=request.negative_prompt)
        from lowvram_gen.models.loading import load_text_encoders

        length = inspect.signature(type(call).__call__).parameters["max_sequence_length"].default
        names = load_text_encoders(self.runner.model, effective.quantize, self.device.torch_device)
        try:
            apply_mod.prepare_encoders(self.pipe, names, applied, self.device, self.runner.ops_factory(self.pipe))
            call.register_modules(**{n: getattr(self.pipe, n) for n in names})
            import torch

            with torch.inference_mode():
                encoded = call.encode_prompt(prompt=request.prompt, negative_prompt=request.negative_prompt,
                                             do_classifier_free_guidance=request.cfg_scale > 1,
                                             max_sequence_length=length, device=self.device.torch_device)
        finally:
            self.runner._drop_encoders()
            if call is not self.pipe:
                call.register_modules(**{n: None for n in names})
        if len(encoded) == 4:  # LTX: embeddings and their attention masks
            keys = ("prompt_embeds", "prompt_attention_mask", "negative_prompt_embeds",
                    "negative_prompt_attention_mask")
        else:
            keys = ("prompt_embeds", "negative_prompt_embeds")
        return {k: v for k, v in zip(keys, encoded) if v is not None}

    def _preview(self, call, latents, step: int, total: int) -> None:
        """A PIL preview of the middle frame, made on the CPU from the latents (none where the format has no map)."""
        if self.render is None:
            return
        try:
            image = self.render(latents.detach().to("cpu").float(), *self.size)
        except (ValueError, RuntimeError) as exc:  # a preview never stops the job
            log.info("no preview: %s", exc)
            return
        self.on_preview(image, step, total)

    # -- decode -------------------------------------------------------------------------------------------------
    def _decode_stage(self, latents: decoding.Latents):
        tiled = False
        while True:
            started = time.perf_counter()
            self.runner.place_resident(False)
            ok, decoded = self.ladder.attempt("decode", lambda: decoding.decode(self.pipe, latents), self.where)
            if ok:
                return self._checked(latents, *decoded, started)
            if not tiled:
                tiled = True
                what = "tiled VAE decode"
            elif self.ladder.step_preset():
                self.runner.use_on(self.ladder, lambda preset: dataclasses.replace(
                    preset.memory, vae_tiling=True, vae_slicing=True), self.where())
                what = f"{self.ladder.preset_name}, tiled VAE decode"
            else:
                raise self.ladder.exhausted(ADVICE)
            decoding.tiled(self.pipe)
            self.ladder.went_down(what)

    def _checked(self, latents: decoding.Latents, frames, bad: str | None, started: float):
        """The decoded frames; where a 16-bit VAE made NaN/Inf or black frames, decoded again in float32 (as images
        are); still bad: BadOutput, in one sentence."""
        import torch

        if bad and self.pipe.vae.dtype != torch.float32:
            self.ladder.record("decode", bad, started, "half-precision decode; decoded again in float32",
                               **self.where())
            started = time.perf_counter()
            frames, bad = decoding.decode(self.pipe, latents, upcast=True)
        if bad:
            raise BadOutput(f"the model made {'NaN/Inf' if bad == 'nan' else 'all-black frames'} even when decoded "
                            "in float32; the weights may be broken (check the files)")
        self.ladder.record("decode", "ok", started, **self.where())
        return frames

    def _upscaled(self, frames, target: tuple[int, int]):
        import numpy as np
        from PIL import Image

        from lowvram_gen.upscale.upscalers import upscale_images

        images = upscale_images([Image.fromarray(f) for f in frames], target, self.ladder.preset.upscaler,
                                self.device.torch_device, ladder=self.ladder)
        return np.stack([np.asarray(im.convert("RGB")) for im in images])

    # -- saving -------------------------------------------------------------------------------------------------
    def _save(self, frames, seed: int, outdir: Path, generated: tuple[int, int], warnings: list[str]):
        request = self.request
        fields = {"Steps": request.steps, "Sampler": sampler_name(self.pipe, request.sampler),
                  "CFG scale": request.cfg_scale}
        if request.cfg_scale_2 is not None:
            fields["CFG scale 2"] = request.cfg_scale_2
        fields.update({"Seed": seed, "Size": f"{request.width}x{request.height}", "Frames": len(frames),
                       "FPS": f"{request.fps:g}", "Model": Path(str(self.source.path)).name or request.model,
                       "Preset": self.ladder.preset_name})
        if generated != (request.width, request.height):
            fields["Generated size"] = f"{generated[0]}x{generated[1]}"
        parameters = outputs.a1111_parameters(request.prompt, request.negative_prompt, fields)
        data = dataclasses.asdict(request)
        data.pop("outdir", None)
        meta = {"request": data, "seed": seed, "preset": self.ladder.preset_name,
                "attempts": [a.as_dict() for a in self.ladder.attempts], "model_path": str(self.source.path),
                "device": self.device.name, "generated_size": list(generated), "warnings": list(warnings),
                "version": 1}
        saved = save_clip(frames, outdir, seed, request.prompt, request.fps, parameters, meta,
                          save_frames=request.save_frames)
        if saved.note:
            warnings.append(saved.note)
        return saved


def _init_image(request: GenerationRequest):
    if not request.init_image:
        return None
    from PIL import Image

    with Image.open(request.init_image) as im:
        return im.convert("RGB")
