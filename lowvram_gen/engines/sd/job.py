"""One Stable Diffusion job, from a validated request to saved PNGs: `run_job()`.

The session has already probed the device, planned the presets, loaded the model and built the ladder; this
module checks what the pipeline can do with the request, sets the sampler and the VAE (vae_swap.py), runs the
passes (stepdown.py: Runner) and saves each finished pass (A1111 `parameters` text, a1111/infotext.py, plus our JSON), and returns the result.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Callable

from lowvram_gen import families, outputs
from lowvram_gen import preview as previews
from lowvram_gen.a1111.infotext import a1111_fields, safety_field
from lowvram_gen.hardware.device import DeviceInfo
from lowvram_gen.engines.sd import controlnet, edit, inpaint, prompt_steps, refiner, tiling, vae_swap
from lowvram_gen.engines.sd import pipeline as sd
from lowvram_gen.engines.sd.stepdown import ChunkDone, Runner
from lowvram_gen.errors import Cancelled, InvalidRequest
from lowvram_gen.inpaint.masks import size_note as mask_size_note
from lowvram_gen.ladder import Ladder
from lowvram_gen.models.resolve import ModelSource
from lowvram_gen.networks import job as networks
from lowvram_gen.prompting.encode import check_clip_skip, plain_prompt_for, prompt_encoding, syntax_warnings
from lowvram_gen.prompting.schedule import edits_prompts
from lowvram_gen.request import GenerationRequest
from lowvram_gen.result import GenerationResult
from lowvram_gen.samplers import DEFAULT, a1111_name, infotext_schedule

log = logging.getLogger(__name__)
NOISE_NOTE = "embedded tiny model: random weights, the image is abstract noise; pass --model for real images"
INT4_NOTE = ("int4 weights (quantize = int4) lose detail and can shift colours and composition; int8 keeps "
             "the image close to full precision")


@dataclass
class Prepared:
    """What a job needs besides the request: the text the encoders read, the LoRA/embedding fields
    for the PNG, and what the user should know."""

    texts: sd.Texts
    fields: dict
    warnings: list[str]
    schedule_applied: bool = True  # False: the schedule type asked for could not be had (a warning says so)
    hires_schedule_applied: bool = True  # the same for hires fix's own schedule type
    vae: tuple[str, str] | None = None  # (name, hash) of the VAE file the job decodes with; None: the model's own


def prepare(runner: Runner, request: GenerationRequest, source: ModelSource, ladder: Ladder) -> Prepared:
    """Refuse what this pipeline cannot do (clear errors before any step), set the sampler, switch the
    job's LoRAs and embeddings on, and say what the user should know (the tiny model, A1111 syntax we
    do not follow, truncated prompts where the encoder cannot take more, ignored negative prompts)."""
    pipe = runner.model.pipe
    sd.check_request(pipe, request)
    schedule_warning = sd.set_sampler(pipe, request.sampler, request.schedule_type)
    hires_warning = sd.hires_scheduler(pipe, request)[1]  # a hires sampler this model cannot run: refused now
    check_clip_skip(pipe, request.clip_skip)
    tiling.check(pipe, request)  # seamless tiling: convolutional denoisers only
    refiner.check(pipe, request, runner.refiner)  # a refiner: after a UNet, in its latent space
    vae = vae_swap.use(runner, request.vae)  # before the preset: it goes on the VAE the job decodes with
    # the first preset goes on before any LoRA: restoring precision reloads components from disk,
    # which would drop adapters loaded before it
    runner.use_on(ladder, lambda preset: tiling.untiled(preset.memory, request.tiling),
                  dict(batch=request.batch_size, width=request.width, height=request.height, unit="weights"))
    if ladder.preset.memory.text_encoders == "reloaded" and networks.request_uses_networks(request):
        raise InvalidRequest("preset", ladder.preset.name,
                             "its text encoders are read from disk for each job (text_encoders = 'reloaded'), which "
                             "would leave out the LoRAs' text-encoder layers and the embeddings; use a preset with "
                             "text_encoders = 'kept' (the planner does so for a job with LoRAs or embeddings)")
    if edits_prompts(request) and prompt_encoding(pipe) is None:  # SD3, Flux, ...: T5 and other encoders
        raise InvalidRequest("prompt", request.prompt, prompt_steps.refusal(pipe))
    if edits_prompts(request) and ladder.preset.memory.text_encoders == "reloaded":
        raise InvalidRequest("preset", ladder.preset.name, "prompt editing, alternation and AND encode their prompts "
                             "per pass, which needs the text encoders kept (text_encoders = 'kept'; the planner "
                             "picks so for such a prompt)")
    own = sd.Texts.of(request).hires  # hires fix's own prompts, where they differ from the first pass's
    nets = networks.prepare(pipe, request.prompt, request.negative_prompt, request.loras, runner.reapply,
                            hires=(own.prompt, own.negative_prompt) if own else None)
    hires = sd.Texts(*nets.hires, request.clip_skip) if nets.hires else None
    texts = sd.Texts(nets.prompt, nets.negative_prompt, request.clip_skip, hires)
    warnings = ([NOISE_NOTE] if source.is_tiny else []) + [w for w in (schedule_warning, hires_warning) if w] \
        + nets.warnings + refiner.networks(runner.refiner, request, texts)  # the job's LoRAs on the refiner too
    prompts = [("prompt", texts.prompt), ("negative prompt", texts.negative_prompt)]
    if hires:
        prompts += [("hires prompt", hires.prompt), ("hires negative prompt", hires.negative_prompt)]
    if prompt_encoding(pipe) is not None:  # SD/SDXL: A1111 weights, and long prompts in 75-token chunks
        warnings += syntax_warnings(texts.prompt, texts.negative_prompt)
        if hires:
            warnings += [w for w in syntax_warnings(hires.prompt, hires.negative_prompt) if w not in warnings]
    else:
        if request.clip_skip > 1:  # the PNG leaves it out too (_Saver)
            warnings.append(f"clip skip {request.clip_skip} is not used: {type(pipe).__name__} encodes its prompts "
                            "itself (clip skip is for SD 1.x/2.x and SDXL)")
        for label, text in prompts:
            plain, more = plain_prompt_for(pipe, text)
            warnings += [w for w in more if w not in warnings]
            used, limit = sd.prompt_token_count(pipe, plain)
            if used > limit:
                warnings.append(f"the {label} has {used} tokens; the text encoder takes {limit}, the rest is ignored")
    if (request.negative_prompt or hires and hires.negative_prompt) and sd.ignores_negative_prompt(pipe):
        record = families.of_pipe(pipe)  # FLUX.1 takes one only for a true CFG we never run; Flux.2 takes none
        why = "it runs without CFG" if record.call.takes_negative_prompt else f"{record.name or 'its call'} has none"
        warnings.append(f"{type(pipe).__name__} does not use a negative prompt ({why}): it is ignored")
    elif request.negative_prompt and request.cfg_scale <= 1 and \
            families.of_pipe(pipe).call.guidance is families.Guidance.TRUE_CFG:  # Qwen-Image: diffusers drops it
        warnings.append(f"CFG scale {request.cfg_scale:g} turns {type(pipe).__name__}'s true CFG off: the negative "
                        "prompt is ignored (give a CFG scale above 1 to use it)")
    rendered = families.of_pipe(pipe).rendered_size  # HiDream: every size scaled to its native area
    made = rendered(pipe, request.width, request.height) if rendered else None
    if made and made != (request.width, request.height):
        warnings.append(f"{type(pipe).__name__} renders {made[0]}x{made[1]} when asked for {request.width}x"
                        f"{request.height} (it scales every size to its native area, keeping the aspect)")
    warnings += inpaint.job_warnings(pipe, request)  # its own size; a ControlNet inpaint's unused strength and image
    for w in warnings:
        log.info(w)
    if request.mask:
        resized = mask_size_note(request)
        warnings += [resized] if resized else []
    fields = {**controlnet.infotext_fields(pipe, request), **edit.infotext_fields(request), **nets.fields}
    # (A1111 writes ControlNet units first)
    return Prepared(texts, fields, warnings, schedule_warning is None, hires_warning is None, vae)


def run_job(runner: Runner, request: GenerationRequest, ladder: Ladder, source: ModelSource, device: DeviceInfo,
            outdir: Path, on_step: Callable[[int, int], None] | None = None,
            cancel: threading.Event | None = None, plan_notes: list[str] = (), *,
            skip: threading.Event | None = None, on_preview=None, preview_every: int = 0,
            preview_method: str = "auto") -> GenerationResult:
    """Make and save the images of `request` (validated) on `runner`'s loaded model. `plan_notes`: what the
    planner said of its choice (a lossy weight storage picked for speed), for the result and the PNGs. `cancel`,
    `skip` and the live previews (`on_preview(image, step, total)` every `preview_every` steps, made by
    `preview_method`): Runner.run and lowvram_gen/preview.py."""
    started = time.perf_counter()
    pipe = runner.model.pipe
    prepared = prepare(runner, request, source, ladder)
    preview = None
    if on_preview is not None and preview_every > 0:
        render, how = previews.renderer(pipe, preview_method)  # "taesd" without its weights: an error before any step
        preview = previews.Previews(preview_every, render, on_preview, background=how == "taesd") if render else None
    warnings = list(plan_notes) + prepared.warnings
    request, note = _variation(pipe, request)
    warnings += [note] if note else []
    seeds = request.resolved_seeds()
    sampler = request.sampler if request.sampler != DEFAULT else a1111_name(pipe.scheduler)
    schedule = infotext_schedule(pipe.scheduler, sampler, request.schedule_type, prepared.schedule_applied)
    saver = _Saver(request, (sampler, schedule), ladder, source, device, outdir, prepared.fields, list(plan_notes),
                   clip_skip=request.clip_skip if families.of_pipe(pipe).clip_skip else 1,
                   hires_sampler=_hires_sampler(pipe, request, prepared.hires_schedule_applied), vae=prepared.vae)
    saver.refiner = runner.refiner.title if runner.refiner is not None else None
    try:
        runner.run(request, seeds, ladder.presets, saver.save, on_step, cancel, ladder, prepared.texts, skip=skip,
                   preview=preview)
    except Cancelled as exc:
        kept = (f"{len(saver.images)} image(s) kept, the interrupted pass's as it was" if saver.stopped.get(sd.INTERRUPT)
                else f"{len(saver.images)} finished image(s) kept")
        raise Cancelled(f"{exc}; {kept}", images=saver.images) from None
    if saver.stopped.get(sd.SKIP):
        warnings.append(f"{saver.stopped[sd.SKIP]} image(s) skipped before their last step, kept as they were")
    seconds = round(time.perf_counter() - started, 3)
    if "int4" in saver.quantized:
        warnings.append(INT4_NOTE)
    if any(saver.nsfw):
        warnings.append("the model's safety checker blacked out %d image(s)" % sum(saver.nsfw))
    width, height = request.output_size()
    generated = saver.generated_size or (width, height)
    return GenerationResult(
        images=saver.images, seeds=seeds, width=width, height=height, steps=request.steps,
        sampler=sampler, schedule_type=request.schedule_type, model=request.model,  # the sampler that ran, by name
        model_path=str(source.path), seconds=seconds,
        preset=ladder.preset_name, attempts=[a.as_dict() for a in ladder.attempts],
        summary=ladder.summary(seconds, generated, (width, height)), generated_width=generated[0],
        generated_height=generated[1], upscaled=saver.upscaled, device=device.name, warnings=warnings,
        nsfw=saver.nsfw)


def _hires_sampler(pipe, request: GenerationRequest, applied: bool) -> tuple[str, str | None] | None:
    """(A1111 name, schedule type label or None) of hires fix's own sampler, as the PNG writes them (as the first
    pass's are found); None where the second pass runs the first pass's scheduler."""
    scheduler = sd.hires_scheduler(pipe, request)[0]
    if scheduler is None:
        return None
    sampler, schedule_type = request.hires_sampling
    name = sampler if sampler != DEFAULT else a1111_name(scheduler)
    return name, infotext_schedule(scheduler, name, schedule_type, applied)


def _variation(pipe, request: GenerationRequest) -> tuple[GenerationRequest, str | None]:
    """The request with its variation seed fixed (-1: a random one, then written to the PNG), or, where
    variation seeds are not made here (pipelines other than SD 1.x/2.x and SDXL, which draw and pack their noise
    their own way), without them and a warning that says so (the PNG does not claim them)."""
    if request.subseed_strength == 0 and request.seed_resize_from is None:
        return request, None
    if families.of_pipe(pipe).variation_seeds:
        return request.with_subseed(), None
    return (replace(request, subseed_strength=0.0, seed_resize_from_w=0, seed_resize_from_h=0),
            f"variation seed and seed resize are not used: {type(pipe).__name__} draws its noise its own way "
            "(they are made for SD 1.x/2.x and SDXL)")


class _Saver:
    """Writes each finished pass's images as they come, so a cancel or a crash keeps them."""

    def __init__(self, request: GenerationRequest, sampler: tuple[str, str | None], ladder: Ladder,
                 source: ModelSource, device: DeviceInfo, outdir: Path, network_fields: dict,
                 plan_notes: list[str] = (), clip_skip: int = 1, hires_sampler: tuple[str, str | None] | None = None,
                 vae: tuple[str, str] | None = None):
        self.request, self.sampler, self.ladder, self.source, self.device = request, sampler, ladder, source, device
        self.hires_sampler = hires_sampler  # hires fix's own sampler and schedule type, as the PNG says them
        self.vae = vae  # (name, hash) of the VAE file that decoded, as the PNG says it; None: the model's own
        self.refiner: str | None = None  # the refiner's `name [hash]`, as the PNG says it (run_job sets it)
        self.clip_skip = clip_skip  # what the encoders used: 1 where the pipeline encodes its prompts itself
        self.plan_notes = list(plan_notes)  # about the planned preset: written into the PNGs it made
        self.network_fields = network_fields  # Lora hashes, TI hashes
        self.outdir = outdir
        self.images: list[str] = []
        self.nsfw: list[bool] = []
        self.generated_size: tuple[int, int] | None = None
        self.upscaled = False
        self.quantized: set[str] = set()  # the quantize settings that made saved images
        self.stopped: dict[str, int] = {}  # sd.INTERRUPT / sd.SKIP -> images saved from passes stopped early

    def save(self, done: ChunkDone) -> None:
        request = self.request
        self.generated_size = done.generated_size
        # the ladder's only-masked box is pasted into the canvas at its own scale: nothing was upscaled
        self.upscaled = self.upscaled or (done.generated_size != request.output_size() and not done.only_masked)
        quantize = self.ladder.preset.memory.quantize  # the preset that made this pass
        self.quantized.add(quantize)
        if done.stopped:
            self.stopped[done.stopped] = self.stopped.get(done.stopped, 0) + len(done.images)
        indices = done.indices or range(len(self.images), len(self.images) + len(done.images))
        made = done.generated_size
        if done.only_masked:  # the ladder's only-masked step: the PNG says what ran, as A1111 writes only masked
            request, made = replace(request, inpaint_area="masked"), request.output_size()
        for image, seed, flagged, index in zip(done.images, done.seeds, done.nsfw, indices):
            fields = a1111_fields(request, self.sampler, seed, done.preset, made, quantize,
                                  self.clip_skip, subseed=request.subseed_for(index),
                                  hires_sampler=self.hires_sampler, vae=self.vae, refiner=self.refiner)
            fields.update(self.network_fields)
            fields.update(request.extra.get("script_params", {}))  # an img2img script's (img2img_scripts/base.py)
            if flagged:
                fields.update(safety_field())
            meta = {"request": _request_dict(request), "seed": seed, "preset": done.preset,
                    "attempts": [a.as_dict() for a in self.ladder.attempts], "model_path": str(self.source.path),
                    "generated_size": list(done.generated_size), "device": self.device.name,
                    "nsfw_filtered": flagged, "version": 1}
            if self.plan_notes and done.preset == self.ladder.presets[0].name:
                meta["plan_notes"] = self.plan_notes
            path = outputs.next_image_path(self.outdir, seed, request.prompt, decoration=self.decoration(seed, index))
            params = outputs.a1111_parameters(request.prompt, request.negative_prompt, fields)
            self.images.append(str(outputs.save_png(image, path, params, meta)))
            self.nsfw.append(flagged)


    def decoration(self, seed: int, index: int) -> str:
        """The name's part after the counter by the request's file name pattern; "" (today's names) without one."""
        if not self.request.filename_pattern:
            return ""
        from datetime import datetime

        from lowvram_gen import filename_pattern

        self.started = getattr(self, "started", None) or datetime.now()
        return filename_pattern.decoration(self.request.filename_pattern, filename_pattern.values(
            self.request, seed, sampler=self.sampler[0], index=index,
            model_path=self.source.path if self.source.kind == "single_file" else None,
            started=self.started))


def _request_dict(request: GenerationRequest) -> dict:
    data = asdict(request)
    data.pop("outdir", None)
    return data
