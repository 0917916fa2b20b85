"""A session: one device, one loaded model at a time, one job at a time. The Python API's core.

The CLI, the web UI and the batch script all call `Session.generate()`. A model switch loads the
new model before dropping the old one, so a broken checkpoint leaves the loaded model usable.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable

from lowvram_gen import failures, outputs
from lowvram_gen.device import DEFAULT_RESERVE, DeviceInfo, probe
from lowvram_gen.errors import Cancelled, ModelLoadError
from lowvram_gen.models.loading import LoadedModel, load
from lowvram_gen.models.resolve import ModelSource, resolve
from lowvram_gen.presets import Preset, find_preset, load_presets
from lowvram_gen.request import GenerationRequest
from lowvram_gen.engines.sd.runner import ChunkDone, JobReport, JobSpec, Runner

log = logging.getLogger(__name__)
NOISE_NOTE = "embedded tiny model: random weights, the image is abstract noise; pass --model for real images"


@dataclass
class GenerationResult:
    images: list[str]
    seeds: list[int]
    width: int
    height: int
    steps: int
    sampler: str
    model: str
    model_path: str
    seconds: float
    preset: str
    attempts: list[dict]
    summary: str
    generated_width: int
    generated_height: int
    upscaled: bool
    device: str
    warnings: list[str] = field(default_factory=list)
    nsfw: list[bool] = field(default_factory=list)

    def as_json(self) -> dict:
        return asdict(self)


class Session:
    def __init__(self, device: str | None = None, preset: str | None = None, vram_budget: int | None = None,
                 reserve_vram: int = DEFAULT_RESERVE, outdir: str | None = None, presets_dir: str | None = None,
                 ops_factory=None, xformers: bool = False):
        self.device_pref = device  # 'cpu' forces the CPU (--cpu)
        self.preset_spec = preset  # forced preset (--medvram etc.), None: the planner decides
        self.vram_budget = vram_budget
        self.reserve_vram = reserve_vram
        self.outdir = outdir
        self.presets_dir = presets_dir
        self.ops_factory = ops_factory
        self.xformers = xformers  # --xformers: xformers attention in GPU presets (SDPA where it cannot run)
        self.lock = threading.RLock()  # one GPU, one job at a time
        self.model: LoadedModel | None = None
        self.runner: Runner | None = None
        self._device: DeviceInfo | None = None

    # -- device, presets, model ---------------------------------------------------------------
    def device(self) -> DeviceInfo:
        """Probed per job: free memory changes as other programs come and go."""
        self._device = probe(self.device_pref, reserve_bytes=self.reserve_vram, budget_bytes=self.vram_budget)
        return self._device

    def presets(self) -> dict[str, Preset]:
        return {name: self._flagged(p) for name, p in load_presets(self.presets_dir).items()}

    def forced_preset(self, spec: str | None = None) -> Preset | None:
        spec = spec or self.preset_spec
        if spec is None and self.device_pref == "cpu":
            spec = "cpu"
        return self._flagged(find_preset(spec, self.presets_dir)) if spec else None

    def _flagged(self, preset: Preset) -> Preset:
        if self.xformers and preset.device == "gpu":
            return dataclasses.replace(preset, memory=dataclasses.replace(preset.memory, attention="xformers"))
        return preset

    def load_model(self, spec: str, config: str | None, dtype: str) -> LoadedModel:
        source = resolve(spec, config)
        if self.model is not None and self.model.source == source:
            return self.model
        model = load(source, dtype)  # the old model stays until the new one has loaded
        self.model, self.runner = model, None
        return model

    def free(self) -> None:
        """Unload the model and give its memory back (the UI's 'free VRAM' button)."""
        from lowvram_gen.oom import free_memory

        with self.lock:
            self.model, self.runner = None, None
            free_memory(self._device.kind if self._device else "cpu")

    # -- planning -------------------------------------------------------------------------------
    def profile_for(self, source: ModelSource, model: LoadedModel | None = None):
        from lowvram_gen.planning import estimate as memory

        folder = source.path if source.kind != "single_file" else source.config
        if folder and Path(folder).is_dir():
            try:
                return memory.profile_from_folder(folder)
            except (OSError, ValueError, KeyError, TypeError) as exc:
                raise ModelLoadError(f"could not read the model configs in {folder}: {exc}") from exc
        family = model.family if model else "sd"
        return memory.profile_builtin("sdxl" if family == "sdxl" else "sd15")

    def plan(self, request: GenerationRequest, device: DeviceInfo | None = None, source: ModelSource | None = None):
        from lowvram_gen.planning.planner import plan

        device = device or self.device()
        source = source or resolve(request.model, request.config)
        model = self.model if self.model and self.model.source == source else None
        width, height = request.output_size()  # with hires fix the second pass is the bigger one
        failed = failures.failed_presets(device.name, request.model, width * height, request.batch_size)
        return plan(device, self.profile_for(source, model), width, height, request.batch_size,
                    self.presets(), self.forced_preset(request.preset), failed, cfg=request.cfg_scale > 1)

    # -- generation -----------------------------------------------------------------------------
    def generate(self, request: GenerationRequest, on_step: Callable[[int, int], None] | None = None,
                 cancel: threading.Event | None = None) -> GenerationResult:
        request = request.validated()
        with self.lock:
            return self._generate(request, on_step, cancel)

    def _generate(self, request, on_step, cancel) -> GenerationResult:
        from lowvram_gen.engines.sd import apply as apply_mod
        from lowvram_gen.engines.sd.pipeline import check_request, ignores_negative_prompt, prompt_token_count, set_sampler

        started = time.perf_counter()
        device = self.device()
        source = resolve(request.model, request.config)
        the_plan = self.plan(request, device, source)
        load_dtype = apply_mod.effective_settings(the_plan.preset.memory, device)[0].dtype
        model = self.load_model(request.model, request.config, load_dtype)
        if self.runner is None or self.runner.model is not model:
            kwargs = {"ops_factory": self.ops_factory} if self.ops_factory else {}
            self.runner = Runner(model, device, **kwargs)
        self.runner.device = device
        check_request(model.pipe, request)
        set_sampler(model.pipe, request.sampler)

        warnings = [NOISE_NOTE] if source.is_tiny else []
        for label, text in (("prompt", request.prompt), ("negative prompt", request.negative_prompt)):
            used, limit = prompt_token_count(model.pipe, text)
            if used > limit:
                warnings.append(f"the {label} has {used} tokens; the text encoder takes {limit}, the rest is ignored")
        if request.negative_prompt and ignores_negative_prompt(model.pipe):
            warnings.append(f"{type(model.pipe).__name__} does not use a negative prompt (it runs without CFG): "
                            "it is ignored")
        for w in warnings:
            log.info(w)

        seeds = request.resolved_seeds()
        outdir = Path(request.outdir or self.outdir or outputs.default_outdir())
        saved: list[str] = []
        nsfw: list[bool] = []
        report = JobReport()
        sampler_name = request.sampler if request.sampler != "default" else type(model.pipe.scheduler).__name__

        def save(done: ChunkDone) -> None:
            for image, seed, flagged in zip(done.images, done.seeds, done.nsfw):
                fields = a1111_fields(request, sampler_name, seed, done.preset, done.generated_size)
                if flagged:  # a black square says why in any PNG-info viewer, not only in our JSON chunk
                    fields["Safety checker"] = "blacked out"
                meta = {"request": _request_dict(request), "seed": seed, "preset": done.preset,
                        "attempts": [a.as_dict() for a in report.attempts], "model_path": str(source.path),
                        "generated_size": list(done.generated_size), "device": device.name,
                        "nsfw_filtered": flagged, "version": 1}
                path = outputs.next_image_path(outdir, seed, request.prompt)
                params = outputs.a1111_parameters(request.prompt, request.negative_prompt, fields)
                saved.append(str(outputs.save_png(image, path, params, meta)))
                nsfw.append(flagged)

        init_images = None
        if request.init_image:
            from PIL import Image

            with Image.open(request.init_image) as im:
                init_images = [im.convert("RGB")] * len(seeds)
        job = JobSpec.from_request(request, seeds, init_images)
        try:
            self.runner.run(job, the_plan.ladder, save, on_step, cancel, report)
        except Cancelled as exc:
            raise Cancelled(f"{exc}; {len(saved)} finished image(s) kept", images=saved) from None
        finally:
            for a in report.attempts:
                if a.outcome == "oom":
                    failures.record(device.name, request.model, a.preset, a.width * a.height, a.batch)
        seconds = round(time.perf_counter() - started, 3)
        if any(nsfw):
            warnings.append("the model's safety checker blacked out %d image(s)" % sum(nsfw))
        width, height = request.output_size()
        return GenerationResult(
            images=saved, seeds=seeds, width=width, height=height, steps=request.steps,
            sampler=request.sampler, model=request.model, model_path=str(source.path), seconds=seconds,
            preset=report.final_preset, attempts=[a.as_dict() for a in report.attempts],
            summary=report.summary(seconds), generated_width=report.generated_size[0],
            generated_height=report.generated_size[1], upscaled=report.upscaled, device=device.name,
            warnings=warnings, nsfw=nsfw,
        )

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

    def upscale(self, image: str, scale: float, upscaler: str = "lanczos", outdir: str | None = None) -> dict:
        """Upscale one image file (`lowvram-gen upscale`'s job) on this session's device, one job at a time."""
        from lowvram_gen.upscale.upscalers import run_upscale

        with self.lock:  # the device is shared with generation
            return run_upscale(image, scale, upscaler, outdir or self.outdir, self.device().torch_device)


def a1111_fields(request: GenerationRequest, sampler: str, seed: int, preset: str,
                 generated_size: tuple[int, int]) -> dict:
    """The key-value line of A1111's `parameters` text, in A1111's order, plus what lowvram-gen did."""
    fields = {"Steps": request.steps, "Sampler": sampler, "CFG scale": request.cfg_scale, "Seed": seed,
              "Size": f"{request.width}x{request.height}", "Model": request.model}
    if request.init_image:
        fields["Denoising strength"] = request.strength
    if request.hires:
        fields.update({"Denoising strength": request.hires_denoise, "Hires upscale": request.hires_scale,
                       "Hires steps": request.hires_steps, "Hires upscaler": request.hires_upscaler})
    fields["Lowvram preset"] = preset
    if generated_size != request.output_size():
        fields["Generated size"] = "%dx%d" % generated_size
    return fields


def _request_dict(request: GenerationRequest) -> dict:
    data = asdict(request)
    data.pop("outdir", None)
    return data


_default: Session | None = None


def default_session() -> Session:
    global _default
    if _default is None:
        _default = Session()
    return _default


def generate(request: GenerationRequest, **kwargs) -> GenerationResult:
    """`lowvram_gen.generate(request)`: run one job in the process-wide default session."""
    return default_session().generate(request, **kwargs)
