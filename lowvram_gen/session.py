"""A session: one device, one loaded model at a time, one job at a time. The Python API's core.

The CLI, the web UI and the batch script call its methods (`generate`, `generate_vqgan`,
`upscale`, `plan`, `free`, ...) and nothing else: the session is the sole owner of the device
settings, the presets, the loaded Stable Diffusion model, the VQGAN/CLIP pair and the lock that
keeps one job on the GPU. Each method goes down the layers once: validate -> probe -> plan ->
load -> the engine's job (which saves the images) -> remember what ran out of memory.

`lowvram-gen plan` asks it too, so the plan it prints is the one `generate` makes with the same flags (presets
folder, forced preset, --xformers, remembered failures), on the probed device or a simulated one, from the models'
configs without reading a weight.

A model switch loads the new model before dropping the old one, so a broken checkpoint leaves the
loaded model usable.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Sequence

from lowvram_gen import failures, families, img2img_steps, outputs
from lowvram_gen import preview as previews
from lowvram_gen.families import sampling
from lowvram_gen.hardware.device import DEFAULT_RESERVE, DeviceInfo, probe, simulated
from lowvram_gen.hardware.hostmem import probe_host, simulated_host
from lowvram_gen.engines.sd import apply as apply_mod
from lowvram_gen.engines.sd import edit, inpaint, refiner, tiling
from lowvram_gen.families.spec import record_of_index, record_of_spec
from lowvram_gen.engines.sd.controlnet import attach_for
from lowvram_gen.engines.video import checks as video_checks
from lowvram_gen.engines.sd.job import run_job
from lowvram_gen.engines.sd.stepdown import Runner
from lowvram_gen.errors import Cancelled, InvalidRequest, NotEnoughRam
from lowvram_gen.ladder import Ladder
from lowvram_gen.models.filedtype import half_dtype
from lowvram_gen.models.attached import attached
from lowvram_gen.planning.controlnet import plan_profiles
from lowvram_gen.models.loading import LoadedModel, load
from lowvram_gen.models import profile as profiles
from lowvram_gen.models import gguf_file
from lowvram_gen.models.profile import source_profile
from lowvram_gen.models.resolve import ModelSource, resolve
from lowvram_gen.networks.job import request_uses_networks
from lowvram_gen.prompting.schedule import edits_prompts, editing_refusal
from lowvram_gen.networks.names import check_names
from lowvram_gen.oom import free_memory
from lowvram_gen.paths import writable_folder
from lowvram_gen.planning import speed
from lowvram_gen.planning import vqgan as memory_vqgan
from lowvram_gen.planning import video_fit
from lowvram_gen.planning.controlnet import check_job, with_controlnets
from lowvram_gen.planning.planner import Plan, plan, step_parts
from lowvram_gen.planning.refiner import RefinerLoad, plan_refiner
from lowvram_gen.presets import Preset, find_preset, load_presets
from lowvram_gen.prompting import styles
from lowvram_gen.prompting.styles import Style, StyleBook, StylesFile
from lowvram_gen.request import MAX_STEPS, GenerationRequest, as_int
from lowvram_gen.result import GenerationResult
from lowvram_gen.settings import Precision, precision_suffix
from lowvram_gen.upscale.command import run_upscale
from lowvram_gen.upscale.upscalers import forget_models

if TYPE_CHECKING:
    from lowvram_gen.engines.vqgan.job import VqganModels

log = logging.getLogger(__name__)
ProgressFn = Callable[[int, int], None]
PreviewFn = Callable[[object, int, int], None]  # (PIL image, step, total)

__all__ = ["GenerationResult", "Session", "default_session", "generate"]


class Session:
    def __init__(self, device: str | None = None, preset: str | None = None, vram_budget: int | None = None,
                 reserve_vram: int = DEFAULT_RESERVE, outdir: str | None = None, presets_dir: str | None = None,
                 ops_factory=None, xformers: bool = False, ram_budget: int | None = None,
                 precision: Precision | None = None, styles_file: str | None = None):
        self.device_pref = device  # 'cpu' forces the CPU (--cpu)
        self.preset_spec = preset  # forced preset (--medvram etc.), None: the planner decides
        self.vram_budget = vram_budget
        self.ram_budget = ram_budget  # --ram-budget: cap on the system RAM a job may plan to use
        self.reserve_vram = reserve_vram
        self.outdir = outdir
        self.presets_dir = presets_dir
        self.ops_factory = ops_factory
        self.xformers = xformers  # --xformers: xformers attention in GPU presets (SDPA where it cannot run)
        # --no-half, --no-half-vae, --upcast-sampling, --precision: over every preset, a named one too
        self.precision = precision or Precision()
        self.styles_file = StylesFile(styles_file)  # --styles-file; A1111's styles.csv in the folder it runs in
        self.lock = threading.RLock()  # one GPU, one job at a time
        self.model: LoadedModel | None = None  # the Stable Diffusion model
        self.runner: Runner | None = None  # over `model`, keeps what is applied to it
        self.vqgan: VqganModels | None = None  # the VQGAN/CLIP pair
        self.refiner: refiner.Refiner | None = None  # the last job's refiner, held in RAM (engines/sd/refiner.py)
        self._device: DeviceInfo | None = None

    # -- device, presets, models -----------------------------------------------------------------
    def device(self, vram: str | None = None, ram: str | None = None) -> DeviceInfo:
        """Probed per job: free memory changes as other programs come and go. `vram`, `ram` (plan --vram, --ram): a
        simulated card, a simulated machine with that much free, in place of what is probed; for a plan only."""
        if not vram and not ram:
            self._device = probe(self.device_pref, reserve_bytes=self.reserve_vram, budget_bytes=self.vram_budget,
                                 ram_budget_bytes=self.ram_budget)
            return self._device
        if vram:
            found = simulated(vram, reserve_bytes=self.reserve_vram, budget_bytes=self.vram_budget)
        else:
            found = probe(self.device_pref, reserve_bytes=self.reserve_vram, budget_bytes=self.vram_budget)
        return dataclasses.replace(found, host=simulated_host(ram) if ram else probe_host(self.ram_budget))

    def presets(self, quantize: str | None = None) -> dict[str, Preset]:
        return {name: self._flagged(p, quantize) for name, p in load_presets(self.presets_dir).items()}

    def forced_preset(self, spec: str | None = None, quantize: str | None = None) -> Preset | None:
        spec = spec or self.preset_spec
        if spec is None and self.device_pref == "cpu":
            spec = "cpu"
        return self._flagged(find_preset(spec, self.presets_dir), quantize) if spec else None

    def _flagged(self, preset: Preset, quantize: str | None = None) -> Preset:
        """The preset with the session's and the request's forced settings (--xformers, --quantize, the precision
        flags); a precision flag that changes what runs is in its name (medvram+no-half), so the plan, "What ran"
        and the PNG's Preset field say it."""
        memory = preset.memory.with_quantize(quantize).with_precision(self.precision)
        if self.xformers and preset.device == "gpu":
            memory = dataclasses.replace(memory, attention="xformers")
        if memory == preset.memory:
            return preset
        return dataclasses.replace(preset, memory=memory, name=preset.name + precision_suffix(preset.memory, memory))

    def load_model(self, spec: str, config: str | None, dtype: str, quantize: str = "none",
                   quantize_on: str | None = None, without_text_encoders: bool = False) -> LoadedModel:
        """The model, loaded at `dtype` with the denoiser and text encoders quantized to `quantize` while they
        load (so a planned int8 job never holds them at full precision); a model already loaded is kept.
        `without_text_encoders` (text_encoders = "reloaded"): a diffusers folder's encoders are not read now
        (the runner reads them for each job)."""
        source = resolve(spec, config)
        if self.model is not None and self.model.source == source:
            return self.model
        model = load(source, dtype, quantize, quantize_on,  # the old model stays until the new one has loaded
                     without_text_encoders=without_text_encoders and source.kind != "single_file")
        self.model, self.runner = model, None
        return model

    def _refiner(self, request: GenerationRequest, dtype: str, whole: bool, quantize: str = "none",
                 quantize_on: str | None = None) -> refiner.Refiner | None:
        """The request's refiner, loaded on the host at the model's dtype and kept for the next job that names it;
        None where the job runs none (the one held stays: a job without it does not unload it). `whole`: the job's
        first preset moves it whole (refiner.load)."""
        if not refiner.runs(request):
            return None
        if self.refiner is not None and self.refiner.spec != request.refiner:  # one refiner in RAM at a time
            self.refiner = self.runner.refiner = None
        self.refiner = refiner.load(request.refiner, dtype, self.refiner, whole, quantize, quantize_on)
        return self.refiner

    def free(self) -> None:
        """Unload every model (Stable Diffusion, VQGAN/CLIP, upscalers) and give their memory back."""
        with self.lock:
            self.model, self.runner, self.vqgan, self.refiner = None, None, None, None
            forget_models()
            free_memory(self._device.kind if self._device else "cpu")

    def _outdir(self, request_outdir: str | None) -> Path:
        """The job's output folder, checked writable before any model work (a read-only folder or a file there
        would otherwise be found after the whole job has run)."""
        return writable_folder(request_outdir or self.outdir or outputs.default_outdir(), "the output folder")

    def _remember(self, device: DeviceInfo, model: str, ladder: Ladder, size_of=None) -> None:
        """Remember the presets that ran out of memory on this GPU, so the next comparable job starts
        below them (failures.record keeps nothing for a CPU: its out-of-memory is not a card's)."""
        for a in ladder.failed_presets():
            failures.record(device.name, model, a.preset, a.width * a.height, size_of(a) if size_of else a.batch,
                            kind=device.kind)

    # -- Stable Diffusion ------------------------------------------------------------------------------
    def profile_for(self, source: ModelSource, model: LoadedModel | None = None,
                    request: GenerationRequest | None = None):
        """The model's memory profile; with the request's ControlNets counted as part of its denoiser
        (planning/controlnet.py), each refused here, before any weight is read, when it is for another family."""
        profile = source_profile(source, model.family if model else None)
        if request is not None:  # a VAE file (--vae): its size, and the model's own kept beside it
            profile = profiles.with_vae(profile, request.vae)
        if request is not None and request.controlnets:
            cns = plan_profiles([u.model for u in request.controlnets], profile, request.model)
            check_job(cns, request.init_image is not None, bool(request.hires), request.control_mode,
                      inpaint=request.mask is not None)
            profile = with_controlnets(profile, cns, len(request.controlnets))
        return profile

    def model_profile(self, spec: str, config: str | None = None,
                      controlnets: Sequence[str] = ()) -> tuple[profiles.ModelProfile, bool]:
        """What `lowvram-gen plan` estimates a model by, from its configs only (no weight is read): a built-in name
        ('sd15', 'sdxl', ...) by the configs shipped with the package, nothing downloaded; anything else as resolved.
        `controlnets` (plan --controlnet) are counted with its denoiser, a known size such as 'sd15' too. Also
        whether it is a diffusers folder (not a single file): its text encoders can be read again per job."""
        if profiles.is_builtin(spec):  # known offline: no download, no weights
            profile, folder = profiles.profile_builtin(spec), True
        else:
            source = resolve(spec, config)
            profile, folder = source_profile(source), source.kind != "single_file"
        if controlnets:
            profile = with_controlnets(profile, plan_profiles(list(controlnets), profile, spec, known_sizes=True),
                                       len(controlnets))
        return profile, folder

    def plan(self, request: GenerationRequest, device: DeviceInfo | None = None,
             source: ModelSource | None = None,
             profile: tuple[profiles.ModelProfile, bool] | None = None) -> Plan:
        """The plan `generate` runs `request` by: the presets (this session's folder, --xformers, the request's
        --quantize), the forced preset, and the presets that ran out of memory for a job like it on this device.
        `profile`: (profile, is a folder) of `model_profile`, for `lowvram-gen plan`, which loads no model."""
        device = device or self.device()
        request = self.with_sampling_defaults(request, source, profile[0] if profile else None)
        if profile is None:
            source = source or resolve(request.model, request.config)
            model = self.model if self.model and self.model.source == source else None
            profile = self.profile_for(source, model, request), source.kind != "single_file"
        found, folder = profile
        # +te-reload needs the family's prompts encoded apart from the call (its record's text_encode_apart); the
        # folder's pipeline class says the family first (Qwen-Image-Edit shares Qwen-Image's transformer class), a
        # built-in name its record (`plan --model kontext`: FLUX.1's transformer class); a single file's its config
        # folder's (a Kontext file has FLUX.1's keys), else its keys' (a Flux.2 dev file is Klein's class)
        record = ((source and (record_of_spec(str(source.path)) or source.config and record_of_spec(source.config)
                               or source.kind == "single_file" and gguf_file.single_file_family(source.path)))
                  or (source is None and families.by_name(request.model))
                  or families.by_denoiser_class(found.denoiser_class))
        if record is not None and record.prompt_encoding is None and edits_prompts(request):  # before any loading
            raise InvalidRequest("prompt", request.prompt, editing_refusal(record.name))
        refiner.check_prompts(request)  # prompt editing with a refiner: refused before any loading
        found = edit.planned(found, record, request)  # an edit's reference images: tokens beside the image's
        # an inpaint pipeline that renders its own size (Qwen-Image-Edit's): that size, never capped, its init beside
        found, own = inpaint.planned(found, record, request)
        apart = record is None or record.text_encode_apart is not None
        width, height = own or request.output_size()  # with hires fix the second pass is the bigger one
        # a clip's failures are recorded by its frames (generate_video's size_of): pixels x frames is its work
        failed = failures.failed_presets(device.name, request.model, width * height,
                                         request.frames or 1 if request.is_video else request.batch_size)
        presets, forced = self.presets(request.quantize), self.forced_preset(request.preset, request.quantize)
        if request.tiling:  # seamless tiling decodes in one piece (engines/sd/tiling.py): planned so
            presets, forced = tiling.untiled_presets(presets, forced)
        load = RefinerLoad(request.refiner, self._refiner_profile(request)) if refiner.runs(request) else None
        # a clip (planning/video_fit.py): its frames counted, never capped unless upscaling is allowed; a video pipeline
        # encodes its prompts apart from the call (encode_prompt's embeddings), so +te-reload is offered
        clip = request.is_video and record is not None and record.is_video

        def plan_at(prof, w, h):
            return plan(device, prof, w, h, request.batch_size, presets, forced, failed,
                        cfg=request.cfg_scale > 1 or request.hires and request.hires_cfg_scale > 1,
                        steps=img2img_steps.job_steps(request),  # the steps that run: img2img's and hires fix's counts
                        quantize_forced=request.quantize is not None, model=request.model,
                        reloadable=folder and (apart or clip) and not request_uses_networks(request)
                        and not edits_prompts(request), single_file=not folder, full_precision=self.precision.full,
                        own_size=own is not None or clip and not request.allow_upscale, refiner=load)
        if clip:
            facts = video_fit.folder_video(record, request.model, None if source is None or source.kind == "single_file"
                                           else source.path)
            return video_fit.plan_clip(plan_at, found, facts, request, record.label or request.model, forced is not None)
        result = plan_at(found, width, height)
        return self._with_refiner(result, request, found, load.profile) if load is not None else result

    @staticmethod
    def _refiner_profile(request: GenerationRequest):
        """The refiner's ModelProfile (a built-in name's, else read from its files without loading them)."""
        return profiles.profile_builtin(request.refiner) if profiles.is_builtin(request.refiner) \
            else source_profile(resolve(request.refiner))

    @staticmethod
    def _with_refiner(result: Plan, request: GenerationRequest, found, own) -> Plan:
        """The plan with its refiner's part (planning/refiner.py): the swap at the switch, its RAM, its bus time."""
        chosen = result.preset
        part = plan_refiner(request.refiner, found, own, chosen.memory.dtype,
                            chosen.device == "gpu" and chosen.memory.offload == "none", result.bus.bytes_per_s,
                            request.batch_count)
        return dataclasses.replace(result, refiner=part, warnings=[*result.warnings, part.describe()])

    def style_book(self) -> StyleBook:
        """The styles of this session's styles file (read again when it changed on disk)."""
        return self.styles_file.book()

    def save_style(self, name: str, prompt: str, negative_prompt: str) -> StyleBook:
        """Save a style (A1111's "save as style") in this session's styles file, the others kept."""
        return self.styles_file.save(Style(name, prompt or "", negative_prompt or ""))

    def with_styles(self, request: GenerationRequest) -> GenerationRequest:
        """`request` (validated) with its styles applied to its prompts: the one place every front's `styles`
        become text, before the plan; a request without styles is returned as it is."""
        if not request.styles:
            return request
        return styles.expanded(request, self.style_book()).validated()

    def with_sampling_defaults(self, request: GenerationRequest, source: ModelSource | None = None,
                               profile: profiles.ModelProfile | None = None) -> GenerationRequest:
        """`request` with the steps and CFG scale it left out (None) set to its model family's, for the variant the
        model folder is (families/sampling.py); given ones are kept. `profile`: a built-in model's (`plan --model
        z-image`), planned from the configs the package ships."""
        if request.sampling_given:
            return request
        if profile is not None and source is None and profiles.is_builtin(request.model):
            record = families.by_name(request.model) or families.by_arch(profile.arch)
            facts = sampling.folder_facts(request.model, profiles.CONFIGS / record.builtin if record.builtin else None)
        else:
            source = source or resolve(request.model, request.config)
            single = source.kind == "single_file"
            facts = sampling.folder_facts(request.model, Path(source.config) if single and source.config else
                                          None if single else source.path,
                                          name_path=None if source.kind == "hub" else source.path)  # hub: its id
            record = record_of_index(facts.model_index)  # the same reader as plan's record_of_spec
            if record is None:  # a single file without a config folder, or a pipeline no record claims: the family
                # its keys or its denoiser's class (its profile) say, as plan takes it
                found = source_profile(source, self.model.family if self.model and self.model.source == source
                                       else None)
                record = (single and gguf_file.single_file_family(source.path)
                          or families.by_denoiser_class(found.denoiser_class) or families.by_arch(found.arch))
        chosen = record.default_sampling(facts)
        return request.with_sampling(chosen.steps, chosen.cfg)

    def _learn(self, device: DeviceInfo, request: GenerationRequest, source: ModelSource, ladder: Ladder) -> None:
        """Record the measured step time of each finished denoising pass, with what the planner's estimate of it
        is made of, so the next plan on this device uses it (planning/speed.py)."""
        profile = self.profile_for(source, self.model, request)
        by_name = {p.name: p for p in ladder.presets}
        for a in ladder.attempts:
            measured = a.extra.get("seconds_per_step")
            if a.stage != "denoise" or a.outcome != "ok" or not measured or a.preset not in by_name:
                continue
            parts = step_parts(device, profile, by_name[a.preset], a.width, a.height, a.batch, request.cfg_scale > 1,
                               img2img_steps.job_steps(request), request.model)
            speed.record(dataclasses.replace(parts, measured_s=float(measured)))

    def _planned_and_loaded(self, request: GenerationRequest, device: DeviceInfo, source, refused):
        """The plan of `request` (made again after giving the loaded model back, where its RAM was what stood in the
        way), `refused(plan)` raised when nothing fits, then the model loaded for the plan's first preset and the
        runner on it (self.runner). Returns (plan, device, the first preset's effective settings, the load dtype)."""
        the_plan = self.plan(request, device, source)
        if the_plan.refusal and self.model is not None and self.model.source != source:
            # the loaded model's RAM counts as the process's: give it back and plan again
            log.info("unloading %s to make room in system RAM for %s", self.model.name, request.model)
            self.model, self.runner = None, None
            free_memory(device.kind)
            device = self.device()
            the_plan = self.plan(request, device, source)
        if the_plan.refusal:
            raise refused(the_plan)
        first = apply_mod.effective_settings(the_plan.preset.memory, device)[0]
        load_dtype = apply_mod.load_dtype(first, half_dtype(source.path) if first.half_storage else "float16")
        model = self.load_model(request.model, request.config, load_dtype, first.quantize, device.torch_device,
                                without_text_encoders=first.text_encoders == "reloaded")
        if self.runner is None or self.runner.model is not model:
            self.runner = Runner(model, device, **({"ops_factory": self.ops_factory} if self.ops_factory else {}))
        self.runner.device = device
        return the_plan, device, first, load_dtype

    def generate(self, request: GenerationRequest, on_step: ProgressFn | None = None,
                 cancel: threading.Event | None = None, *, skip: threading.Event | None = None,
                 on_preview: PreviewFn | None = None, preview_every: int = 0,
                 preview_method: str = "auto") -> GenerationResult:
        """Make the images of a txt2img/img2img request (hires fix, batch count included) and save them.

        `cancel` (A1111's Interrupt): the running pass stops at its next step, is decoded and saved like any image,
        and the job ends raising Cancelled (its `images`: every image kept); set while the job waits for the GPU or
        loads, the job ends before its first step. `skip` (A1111's Skip): the running pass stops and is kept the same
        way, the event is cleared, and the job goes on with the next batch of the batch count. `on_preview(image,
        step, total)`: every `preview_every` steps (0: never) an RGB preview of the pass's first image, made on the
        CPU by `preview_method` (lowvram_gen/preview.py: auto, approx, taesd, off).

        A video request (`request.is_video`: frames given) makes a clip on a video model instead
        (`generate_video`); an image request on a video model is refused, pointing to `lowvram-gen video`."""
        request = request.validated()
        if request.is_video:
            return self.generate_video(request, on_step, cancel, on_preview=on_preview, preview_every=preview_every,
                                       preview_method=preview_method)
        request = self.with_styles(request)
        preview_every = as_int("live preview every", preview_every, 0, MAX_STEPS, " steps (0: off)")
        preview_method = previews.check_method(preview_method)
        check_names(request.prompt, request.negative_prompt, request.loras)  # an unknown LoRA: before the model loads
        if request.hires:
            check_names(*request.hires_texts)
        outdir = self._outdir(request.outdir)
        with self.lock:
            if cancel is not None and cancel.is_set():  # cancelled while it waited for the GPU
                raise Cancelled("cancelled before the first step; 0 finished image(s) kept")
            device = self.device()
            source = resolve(request.model, request.config)
            video = video_checks.video_model(source, request.model)
            if video is not None:  # a video model asked for an image: before it loads
                raise video_checks.refuse_video_model(request.model, video)
            request = self.with_sampling_defaults(request, source)  # once: the plan and the job see the numbers
            the_plan, device, first, load_dtype = self._planned_and_loaded(
                request, device, source, lambda plan: NotEnoughRam(plan.refusal))
            model = self.runner.model
            self.runner.refiner = self._refiner(request, load_dtype, first.offload not in refiner.STREAMING,
                                                first.quantize, device.torch_device)
            if (request.controlnets or attached(model.pipe)) and attach_for(model.pipe, request, load_dtype,
                                                                              first.quantize, device.torch_device):
                self.runner.applied = None  # the pipeline's ControlNets changed: its memory settings go on again
            ladder = Ladder(the_plan.ladder, device.kind)
            try:
                result = run_job(self.runner, request, ladder, source, device, outdir, on_step, cancel,
                                 [the_plan.loss_note] if the_plan.loss_note else [], skip=skip, on_preview=on_preview,
                                 preview_every=preview_every, preview_method=preview_method)
                self._learn(device, request, source, ladder)
                return result
            finally:
                self._remember(device, request.model, ladder)

    # -- video (issue 33) -------------------------------------------------------------------------------------
    def with_video_defaults(self, request: GenerationRequest, source: ModelSource | None = None) -> GenerationRequest:
        """`request` (a video one) with what it left to the model set to the model's (its family record's Video facts
        for the folder): frames 0 -> its frame count, fps None -> its fps, cfg_scale_2 None -> its low-noise expert's
        CFG (Wan 2.2 A14B; None for a model with one denoiser). An image request, or a model that is no video
        family's, is returned as it is (generate_video refuses the latter)."""
        if not request.is_video:
            return request
        if source is None and profiles.is_builtin(request.model):  # `plan --model wan22-t2v-a14b`: shipped configs
            record = families.by_name(request.model)
            facts = record.video_facts(sampling.folder_facts(
                request.model, profiles.CONFIGS / record.builtin if record.builtin else None)) if record else None
        else:
            source = source or resolve(request.model, request.config)
            video = video_checks.video_model(source, request.model)
            facts = video.video if video is not None else None
        if facts is None:
            return request
        cfg_2 = request.cfg_scale_2
        if facts.experts and cfg_2 is None:
            cfg_2 = facts.cfg_2 if facts.cfg_2 is not None else request.cfg_scale
        return dataclasses.replace(request, frames=request.frames or facts.frames,
                                   fps=request.fps if request.fps is not None else facts.fps,
                                   cfg_scale_2=cfg_2 if facts.experts else None)

    def generate_video(self, request: GenerationRequest, on_step: ProgressFn | None = None,
                       cancel: threading.Event | None = None, *, on_preview: PreviewFn | None = None,
                       preview_every: int = 0, preview_method: str = "auto") -> GenerationResult:
        """Make and save the clip of a video request (`generate` sends one here): checked against the model's video
        facts before anything loads (engines/video/checks.py), planned (Session.plan counts its frames), loaded by
        its folder's pipeline class, and run on the Runner and the Ladder as images are (engines/video/job.py).
        `cancel`: the steps stop at the next one, the clip as it was is saved, and Cancelled is raised with it.
        `on_preview(image, step, total)`: the middle frame every `preview_every` steps."""
        from lowvram_gen.engines.video.job import run_video_job

        request = self.with_styles(request.validated())
        preview_every = as_int("live preview every", preview_every, 0, MAX_STEPS, " steps (0: off)")
        preview_method = previews.check_method(preview_method)
        if not request.is_video:
            raise InvalidRequest("frames", None, "a video job needs frames (0: the model's own count)")
        outdir = self._outdir(request.outdir)
        with self.lock:
            if cancel is not None and cancel.is_set():  # cancelled while it waited for the GPU
                raise Cancelled("cancelled before the first step; no clip made")
            source = resolve(request.model, request.config)
            video = video_checks.video_model(source, request.model)
            if video is None:
                record, _ = video_checks.facts_of(source, request.model)
                raise video_checks.refuse_image_model(request.model, record)
            request = self.with_video_defaults(self.with_sampling_defaults(request, source), source)
            video_checks.check(request, video)  # frames, size, init image, sampler: before any loading
            device = self.device()
            # the RAM's refusal (NotEnoughRam) or the card's (ClipTooBigForCard)
            the_plan, device, _, _ = self._planned_and_loaded(request, device, source, video_checks.plan_refusal)
            ladder = Ladder(the_plan.ladder, device.kind)
            try:
                return run_video_job(self.runner, request, ladder, source, device, outdir, video, on_step, cancel,
                                     [the_plan.loss_note] if the_plan.loss_note else [], on_preview=on_preview,
                                     preview_every=preview_every, preview_method=preview_method)
            finally:  # a clip's work is its pixels times its frames (the plan looks failures up so)
                self._remember(device, request.model, ladder, size_of=lambda a: request.frames)

    # -- VQGAN-CLIP ------------------------------------------------------------------------------------
    def vqgan_models(self, request):
        """The VQGAN/CLIP pair for `request` (an engines.vqgan.request.VqganRequest), loaded once and
        kept in RAM between jobs; a changed half of the pair is loaded before the old one is dropped."""
        self.vqgan = _vqgan_job().load_models(request, self.vqgan)
        return self.vqgan

    def plan_vqgan(self, request, device: DeviceInfo | None = None, profile=None):
        """The plan `generate_vqgan` runs `request` by. `profile` (`lowvram-gen plan --engine vqgan`): the
        planning.vqgan profile of its models' specs, so no model loads; without it the models load (and stay)."""
        device = device or self.device()
        failed = failures.failed_presets(device.name, _vqgan_job().failure_key(request), request.width * request.height,
                                         request.cutn)
        if profile is not None:
            return memory_vqgan.plan_vqgan(device, profile, request.width, request.height, request.cutn,
                                           self.presets(), self.forced_preset(request.preset), failed,
                                           len(request.augments), bool(request.init_image))
        return _vqgan_job().plan(request, self.vqgan_models(request), device, self.presets(),
                        self.forced_preset(request.preset), failed)

    def generate_vqgan(self, request, on_step: ProgressFn | None = None, cancel: threading.Event | None = None,
                       on_image=None, presets: list[Preset] | None = None, ops=None):
        """Optimise and save the images of a VQGAN-CLIP request. `presets` and `ops` are for tests."""
        request = request.validated()
        outdir = self._outdir(request.outdir)
        with self.lock:
            device = self.device()
            models = self.vqgan_models(request)
            the_plan = self.plan_vqgan(request, device)
            if device.is_accelerator and self.model is not None and the_plan.estimates \
                    and not the_plan.estimates[0].fits:
                log.info("unloading the Stable Diffusion model to make room for VQGAN-CLIP")
                self.model, self.runner = None, None  # its weights would take the room the fastest preset needs
                free_memory(device.kind)
                device = self.device()
                the_plan = self.plan_vqgan(request, device)
            ladder = Ladder(presets or the_plan.ladder, device.kind)
            try:
                return _vqgan_job().run_job(request, models, ladder, device, outdir, on_step, cancel,
                                   on_image, ops)
            finally:
                self._remember(device, _vqgan_job().failure_key(request), ladder,
                               size_of=lambda a: a.extra.get("cutn", a.batch))

    # -- upscaling -------------------------------------------------------------------------------------
    def upscale(self, image: str, scale, upscaler: str = "lanczos", outdir: str | None = None) -> dict:
        """Upscale one image file (`lowvram-gen upscale`'s job) on this session's device, one job at a time."""
        with self.lock:  # the device is shared with generation
            return run_upscale(image, scale, upscaler, outdir or self.outdir, self.device().torch_device)

    # -- for the web UI (lowvram_gen/ui): what it reads and sets, so it never touches the fields or the lock --
    def loaded_model_name(self) -> str | None:
        """The name (spec) of the loaded model; None when none is loaded."""
        model = self.model
        return model.name if model is not None else None

    def vram_limits(self) -> tuple[int | None, int]:
        """(budget in bytes, None for no cap; reserve in bytes): what the next job's device probe applies."""
        return self.vram_budget, self.reserve_vram

    def set_vram_limits(self, budget_bytes: int | None, reserve_bytes: int) -> None:
        """Set the VRAM budget (None or 0: no cap) and the reserve; the next job's probe applies them. Not under
        the lock: a running job keeps the limits it started with, and the UI must not wait for it to end."""
        if reserve_bytes < 0 or (budget_bytes is not None and budget_bytes < 0):
            raise ValueError(f"negative VRAM limits: budget {budget_bytes}, reserve {reserve_bytes}")
        self.vram_budget, self.reserve_vram = (budget_bytes or None), int(reserve_bytes)


def _vqgan_job():
    """engines/vqgan/job.py, imported when a VQGAN-CLIP job or plan needs it: it loads torch, which a Stable
    Diffusion plan on a simulated card (`lowvram-gen plan --vram 4GB`) does not need and answered without."""
    from lowvram_gen.engines.vqgan import job

    return job


_default: Session | None = None


def default_session() -> Session:
    global _default
    if _default is None:
        _default = Session()
    return _default


def generate(request: GenerationRequest, **kwargs) -> GenerationResult:
    """`lowvram_gen.generate(request)`: run one job in the process-wide default session."""
    return default_session().generate(request, **kwargs)
