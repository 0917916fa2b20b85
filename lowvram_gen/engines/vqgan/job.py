"""One VQGAN-CLIP job, from a validated request to saved PNGs: `run_job()` -> VqganResult.

The session (its `generate_vqgan`) validates, probes the device, holds the VQGAN/CLIP pair
(`load_models`: in RAM between jobs, on the device only while a job runs, so they never crowd a
Stable Diffusion model out of a small card), plans (`plan`: the fastest preset whose estimate fits)
and builds the ladder; this module optimises each image (loop.py, with its out-of-memory steps on
the shared ladder) and saves progress images, the final image (upscaled when a preset capped the
size) and optionally a progress video (video.py), all with A1111-style metadata.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from lowvram_gen import outputs
from lowvram_gen.a1111.fields import VQGAN_ENGINE
from lowvram_gen.a1111.infotext import vqgan_fields
from lowvram_gen.engines.vqgan.loop import VqganLoop
from lowvram_gen.engines.vqgan.request import VqganRequest
from lowvram_gen.engines.vqgan.video import write_progress_video
from lowvram_gen.errors import Cancelled
from lowvram_gen.ladder import Ladder
from lowvram_gen.models import vqgan_models as vm
from lowvram_gen.planning import vqgan as memory_vqgan
from lowvram_gen.planning.sizes import capped_size
from lowvram_gen.result import GenerationResult
from lowvram_gen.upscale.upscalers import upscale_images

log = logging.getLogger(__name__)
NOISE_NOTE = ("embedded tiny VQGAN and CLIP: random weights, the image is abstract noise; pass --vqgan (e.g. "
              "vqgan_imagenet_f16_16384.ckpt) and --clip (e.g. ViT-B/32) for real images")
MAX_VIDEO_FRAMES = 240  # frames kept for the progress video (halved by dropping every other one)
ImageFn = Callable[[str, int, bool], None]  # (path, iteration, final)


@dataclass
class VqganResult(GenerationResult):
    """`generate`'s fields (steps = iterations, sampler = optimizer) and VQGAN-CLIP's own."""

    iterations: int = 0
    clip: str = ""
    clip_path: str = ""
    cutn: int = 0  # cutouts per iteration at the end (lower than asked only if memory forced it)
    progress_images: list[str] = field(default_factory=list)
    videos: list[str] = field(default_factory=list)
    losses: list[list[float]] = field(default_factory=list)  # final loss per prompt, per image


@dataclass
class VqganModels:
    key: tuple
    vqgan_source: Any
    clip_source: Any
    vq: Any
    clip: Any  # vqgan_models.LoadedClip


def load_models(request: VqganRequest, current: VqganModels | None = None) -> VqganModels:
    """The VQGAN and CLIP this request names: `current` (the pair the session holds) where it is the
    same, else loaded; a model of the pair that did not change is kept, not loaded again."""
    vsrc, csrc = vm.resolve_vqgan(request.vqgan, request.vqgan_config), vm.resolve_clip(request.clip)
    if current is not None and current.key == (vsrc, csrc):
        return current
    vq = current.vq if current is not None and current.vqgan_source == vsrc else vm.load_vqgan(vsrc)
    clip = current.clip if current is not None and current.clip_source == csrc else vm.load_clip(csrc)
    return VqganModels((vsrc, csrc), vsrc, csrc, vq, clip)


def plan(request: VqganRequest, models: VqganModels, device, presets: dict, forced=None,
         failed: frozenset | set = frozenset()):
    """The fastest preset whose estimate fits this job (planning.vqgan), from the loaded models' sizes."""
    profile = memory_vqgan.profile_from_models(models.vq, models.clip.model, request.model_name)
    return memory_vqgan.plan_vqgan(device, profile, request.width, request.height, request.cutn, presets, forced,
                                   failed, len(request.augments), bool(request.init_image))


def failure_key(request: VqganRequest) -> str:
    """How remembered out-of-memory failures name this job's models (beside SD model names)."""
    return f"vqgan:{request.model_name}"


def run_job(request: VqganRequest, models: VqganModels, ladder: Ladder, device, outdir: Path,
            on_step: Callable[[int, int], None] | None = None, cancel: threading.Event | None = None,
            on_image: ImageFn | None = None, ops=None) -> VqganResult:
    """Optimise and save `batch_size` images for `request` (validated), starting at `ladder.preset`."""
    started = time.perf_counter()
    requested = (request.width, request.height)
    size = capped_size(*requested, ladder.preset.vqgan.max_pixels, 16)
    warnings = [NOISE_NOTE] if models.vqgan_source.is_tiny or models.clip_source.is_tiny else []
    saver = _Saver(request, outdir, models, device, size, on_image)
    loop = None
    for seed in request.resolved_seeds():
        loop = VqganLoop(models.vq, models.clip, request, seed, size, ladder, device, ops, on_step, cancel, None,
                         previous=loop)  # the next image starts where the last one ended up
        loop.on_image = lambda image, iteration, loop=loop, seed=seed: saver.save(image, seed, iteration, loop)
        if request.video:
            loop.on_start = saver.frame
        try:
            image = loop.run()
        except Cancelled as exc:
            if loop.state is not None and loop.state.iteration > 0:
                saver.save(loop.current_image(), seed, loop.state.iteration, loop, final=True, note=str(exc))
            raise Cancelled(f"{exc}; {len(saver.images)} image(s) kept", images=saver.images) from None
        finally:
            loop.close()
        saver.save(image, seed, request.iterations, loop, final=True)
    seconds = round(time.perf_counter() - started, 3)
    warnings += list(dict.fromkeys(loop.warnings if loop else [])) + saver.warnings
    return VqganResult(
        images=saver.images, seeds=saver.seeds, width=request.width, height=request.height, steps=request.iterations,
        sampler=request.optimizer, model=request.vqgan, model_path=str(models.vqgan_source.path), seconds=seconds,
        preset=ladder.preset_name, attempts=[a.as_dict() for a in ladder.attempts],
        summary=ladder.summary(seconds, size, requested, resumed=True), generated_width=size[0],
        generated_height=size[1], upscaled=size != requested, device=device.name, warnings=warnings,
        nsfw=[False] * len(saver.images), iterations=request.iterations, clip=request.clip,
        clip_path=str(models.clip_source.path), cutn=loop.cutn, progress_images=saver.progress, videos=saver.videos,
        losses=saver.losses)


class _Saver:
    """Progress images in `outdir/progress/`, final images in `outdir/`, the video beside them."""

    def __init__(self, request: VqganRequest, outdir: Path, models: VqganModels, device, size, on_image):
        self.request, self.outdir, self.models, self.device, self.size = request, outdir, models, device, size
        self.on_image = on_image
        self.images: list[str] = []
        self.seeds: list[int] = []
        self.progress: list[str] = []
        self.videos: list[str] = []
        self.losses: list[list[float]] = []
        self.warnings: list[str] = []
        self.frames: list = []

    def _texts(self, seed: int, iteration: int, loop, final: bool, note: str) -> tuple[str, dict]:
        r = self.request
        fields = vqgan_fields({
            "iterations": r.iterations, "optimizer": r.optimizer, "seed": seed, "size": f"{r.width}x{r.height}",
            "vqgan": r.vqgan, "clip": r.clip, "engine": VQGAN_ENGINE, "cutn": loop.cutn, "cut_pow": r.cut_pow,
            "lr": r.lr, "preset": loop.preset.name,
            "image_prompts": " | ".join(r.image_prompts) if r.image_prompts else None,
            "init_image": Path(r.init_image).name if r.init_image else None,
            "init_weight": r.init_weight or None,
            "init_noise": r.init_noise if r.init_noise != "none" and not r.init_image else None,
            "generated_size": "%dx%d" % self.size if self.size != (r.width, r.height) else None,
            "iteration": iteration if not final or note else None})
        request = dataclasses.asdict(r)
        request.pop("outdir", None)
        meta = {"engine": "vqgan", "request": request, "seed": seed, "preset": loop.preset.name,
                "attempts": [a.as_dict() for a in loop.ladder.attempts], "model_path": str(self.models.vqgan_source.path),
                "clip_path": str(self.models.clip_source.path), "generated_size": list(self.size),
                "device": self.device.name, "iteration": iteration, "iterations": r.iterations, "cutn": loop.cutn,
                "losses": list(loop.state.losses) if loop.state else [], "final": final, "note": note, "version": 1}
        title = r.prompt or "image prompt: " + " | ".join(Path(p).name for p in r.image_prompts)
        return outputs.a1111_parameters(title, "", fields), meta

    def frame(self, image) -> None:
        """A frame of the progress video only (no PNG): the image before the first iteration, so a run shorter
        than --save-every still has a video (its start and its end), as VQGAN-CLIP's own videos start there."""
        self._keep(image)

    def _keep(self, image) -> None:
        self.frames.append(image.copy())
        if len(self.frames) > MAX_VIDEO_FRAMES:
            self.frames = self.frames[::2]

    def save(self, image, seed: int, iteration: int, loop, final: bool = False, note: str = "") -> str:
        params, meta = self._texts(seed, iteration, loop, final, note)
        if self.request.video:
            self._keep(image)
        slug = self.request.prompt or "image prompt"
        if final:
            requested = (self.request.width, self.request.height)
            if self.size == requested:
                shown = image
            else:  # the preset capped the size: the same upscalers as Stable Diffusion's caps
                shown = upscale_images([image], requested, loop.preset.upscaler, self.device.torch_device,
                                       ladder=loop.ladder)[0]
            path = str(outputs.save_png(shown, outputs.next_image_path(self.outdir, seed, slug), params, meta))
            self.images.append(path)
            self.seeds.append(seed)
            self.losses.append(list(loop.state.losses) if loop.state else [])
            if self.request.video and len(self.frames) > 1:
                self._video(Path(path))
            elif self.request.video:  # said, never an empty `videos` with nothing said
                self.warnings.append(f"no progress video for {Path(path).name}: there is only {len(self.frames)} "
                                     "frame (the final image); a video needs two")
            self.frames = []
        else:
            planned = outputs.next_image_path(self.outdir / "progress", seed, slug)
            planned = planned.with_name(f"{planned.stem}-it{iteration:05d}.png")
            path = str(outputs.save_png(image, planned, params, meta))
            self.progress.append(path)
        if self.on_image is not None:
            self.on_image(path, iteration, final)
        return path

    def _video(self, png: Path) -> None:
        try:
            video = write_progress_video(self.frames, png)
        except (OSError, ValueError) as exc:
            self.warnings.append(f"no progress video for {png.name}: {exc}")
            return
        self.videos.append(str(video))
        if video.suffix == ".webp":
            self.warnings.append("progress video written as an animated WebP; for mp4 install the video extra "
                                 "(pip install 'lowvram-gen[video]', PyAV)")
