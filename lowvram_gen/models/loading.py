"""Load a resolved model into a diffusers pipeline, and reload single components from disk."""

from __future__ import annotations

import importlib
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lowvram_gen import families, safe_json
from lowvram_gen.errors import ModelLoadError
from lowvram_gen.models.quantize import check_scales, is_target, sdnq_config
from lowvram_gen.hardware.hostmem import returning_freed_memory
from lowvram_gen.models.checkpoint import check_finite, load_components, load_single_file
from lowvram_gen.models.folders import absent_components
from lowvram_gen.models.quiet import quiet_hub_bars
from lowvram_gen.models.resolve import ModelSource

log = logging.getLogger(__name__)


@dataclass
class LoadedModel:
    source: ModelSource
    pipe: Any  # a diffusers text-to-image pipeline
    dtype: str  # the dtype the weights were loaded at

    @property
    def family(self) -> str:
        """The pipeline's family group ('sd', 'sdxl', 'sd3', 'flux' ...: lowvram_gen/families), or its class name
        where no record claims it; for metadata and the estimator."""
        record = families.of_pipe(self.pipe)
        return type(self.pipe).__name__ if record.is_generic else record.group

    @property
    def name(self) -> str:
        return self.source.spec


def load(source: ModelSource, dtype: str = "float32", quantize: str = "none",
         quantize_on: str | None = None, without_text_encoders: bool = False) -> LoadedModel:
    """A text-to-image pipeline for `source`, weights at `dtype`, on the CPU (placement is apply's job).

    `quantize` "int8"/"int4": from a diffusers folder (tiny, local, hub cache) the denoiser and the text
    encoders (`quantize.is_target`) are quantized while they load, layer by layer, so system RAM never
    holds them at full precision; with a CUDA `quantize_on` the rounding runs there. From a single-file
    checkpoint (.safetensors/.ckpt) only an SD/SDXL UNet is (checkpoint.load_single_file reads it through its
    own class's `from_single_file`, which takes the same config): diffusers builds the text encoders from
    the file's keys, with no `from_pretrained` for a quantizer to hook into, so they (and an SD3/Flux
    transformer) load unquantized and apply.py quantizes them after the load. A GGUF denoiser is never
    quantized again.

    `without_text_encoders` (text_encoders = "reloaded", a diffusers folder): the pipeline is built with its
    text encoders None, never read; `load_text_encoders` brings them in for each job."""
    import torch

    quiet_hub_bars()
    torch_dtype = getattr(torch, dtype)
    with returning_freed_memory():
        if source.kind == "single_file":
            pipe = load_single_file(str(source.path), source.config, torch_dtype, quantize, quantize_on)
        else:
            pipe = _from_folder(source, dtype, quantize, quantize_on, without_text_encoders)
    check_finite(pipe)
    pipe.set_progress_bar_config(disable=True)  # our own progress reporting replaces diffusers' bars
    return LoadedModel(source=source, pipe=pipe, dtype=dtype)


def _from_folder(source: ModelSource, dtype: str, quantize: str = "none", quantize_on: str | None = None,
                 without_text_encoders: bool = False):
    from diffusers import AutoPipelineForText2Image

    import torch

    try:
        left_out = {name: None for name in text_encoder_names(source.path)} if without_text_encoders else {}
        quantized = {} if quantize == "none" else {
            name: load_component(source.path, name, dtype, quantize, quantize_on)
            for name in _index(source.path) if is_target(name) and name not in left_out}
        return _pipeline_class(source.path, AutoPipelineForText2Image).from_pretrained(
            str(source.path), dtype=getattr(torch, dtype), **absent_components(source.path), **quantized, **left_out)
    except (OSError, ValueError, KeyError, EnvironmentError) as exc:
        what = "video" if _is_video_folder(source.path) else "text-to-image"
        raise ModelLoadError(f"could not load {source.spec} as a {what} pipeline: {exc}") from exc


def _is_video_folder(folder) -> bool:
    """The folder's model_index names a video family's pipeline (issue 33)."""
    try:
        name = str(safe_json.load_file(Path(folder) / "model_index.json").get("_class_name") or "")
    except (OSError, ValueError):
        return False
    record = families.find_pipeline(name)
    return record is not None and record.is_video


def _pipeline_class(folder, auto):
    """The class a folder loads with: the text-to-image auto-pipeline, or the folder's own pipeline class where it is
    its family's txt2img pipeline and the auto-pipelines do not map it (an edit model's, QwenImageEditPipeline;
    HiDreamImagePipeline and BriaPipeline, which diffusers 0.42's auto-pipelines do not map), or where it is a video
    family's text- or image-to-video pipeline (WanPipeline, WanImageToVideoPipeline, LTXPipeline: the auto-pipelines
    map no video class)."""
    from diffusers.pipelines.auto_pipeline import AUTO_TEXT2IMAGE_PIPELINES_MAPPING

    name = str(safe_json.load_file(Path(folder) / "model_index.json").get("_class_name") or "")
    record = families.find_pipeline(name)
    mapped = name in (cls.__name__ for cls in AUTO_TEXT2IMAGE_PIPELINES_MAPPING.values())
    video = record is not None and record.is_video and name in (record.pipeline_for(families.Task.TXT2VID),
                                                                record.pipeline_for(families.Task.IMG2VID))
    if not video and (record is None or mapped or record.pipeline_for(families.Task.TXT2IMG) != name):
        return auto  # another task's folder (an SD inpainting one) loads as its family's txt2img pipeline
    import diffusers

    return getattr(diffusers, name, auto)


def _index(folder) -> dict[str, tuple[str, str]]:
    """{component: (library, class name)} from the folder's model_index.json, for the components it has."""
    index = safe_json.load_file(Path(folder) / "model_index.json")
    return {name: (value[0], value[1]) for name, value in index.items()
            if not name.startswith("_") and isinstance(value, list) and len(value) == 2 and None not in value}


def text_encoder_names(folder) -> list[str]:
    """The text encoders the diffusers folder has (text_encoder, text_encoder_2, ...)."""
    return sorted(name for name in _index(folder) if name.startswith("text_encoder"))


def _library(name: str):
    """The module model_index.json's library names: diffusers, transformers, or a diffusers pipeline
    package ("stable_diffusion" for SD 1.5's safety checker), as diffusers' own loader resolves it."""
    try:
        return importlib.import_module(name)
    except ImportError:
        return importlib.import_module(f"diffusers.pipelines.{name}")


def load_component(folder, name: str, dtype: str, quantize: str = "none", quantize_on: str | None = None):
    """The component `name` of the diffusers folder, from its own subfolder only, with the class
    model_index.json names (diffusers' or transformers' `from_pretrained`), weights at `dtype`; with
    `quantize` int8/int4 each layer is quantized as it is read (sdnq's quantizer, registered with
    diffusers and transformers) and its scales checked for NaN/Inf as after a post-load quantization."""
    import torch

    quiet_hub_bars()
    library, class_name = _index(folder)[name]
    cls = getattr(_library(library), class_name)
    kwargs = {}
    if quantize != "none":
        kwargs["quantization_config"] = sdnq_config(quantize, quantize_on)
    try:
        module = cls.from_pretrained(str(folder), subfolder=name, torch_dtype=getattr(torch, dtype), **kwargs)
    except (OSError, ValueError, KeyError) as exc:
        raise ModelLoadError(f"could not load the {name} of {folder}: {exc}") from exc
    if quantize != "none":
        check_scales(module, quantize)
    return module


def reload_components(model: LoadedModel, names: list[str], dtype: str, quantize: str = "none",
                      quantize_on: str | None = None) -> None:
    """Replace `names` with fresh copies from disk (after fp8, half precision or int8/int4 cost them bits),
    at `dtype`; the denoiser and text encoders among them quantized to `quantize` while they load.

    From a diffusers folder each component is read from its own subfolder (`load_component`) and nothing
    else is. From a single-file checkpoint each is read from its own keys of the file
    (`checkpoint.load_components`), a UNet quantized while it loads, the text encoders unquantized:
    apply.py quantizes them. The job's ControlNets (`controlnet0`, ...) come from their own files
    (models/controlnet.py)."""
    from lowvram_gen.models import controlnet

    slots = [n for n in names if controlnet.SLOT.fullmatch(n)]
    names = [n for n in names if not controlnet.SLOT.fullmatch(n)]
    if names:
        _reload_own_components(model, names, dtype, quantize, quantize_on)
    for name in slots:  # after the UNet: a control-LoRA's ControlNet is made from the restored one
        fresh = controlnet.reload(model.pipe, getattr(model.pipe, name), dtype, quantize, quantize_on)
        setattr(model.pipe, name, fresh)


def _reload_own_components(model: LoadedModel, names: list[str], dtype: str, quantize: str,
                           quantize_on: str | None) -> None:
    if model.source.kind == "single_file":
        import torch

        with returning_freed_memory():
            modules = load_components(str(model.source.path), model.source.config, names, getattr(torch, dtype),
                                      lambda folder, name: load_component(folder, name, dtype), quantize,
                                      quantize_on)
    else:
        with returning_freed_memory():
            modules = {name: load_component(model.source.path, name, dtype, quantize if is_target(name) else "none",
                                            quantize_on) for name in names}
    for name, module in modules.items():
        log.info("reloading %s of %s from disk to restore its precision", name, model.name)
        model.pipe.register_modules(**{name: module})
    check_finite(model.pipe)
    model.dtype = dtype


def load_text_encoders(model: LoadedModel, quantize: str = "none", quantize_on: str | None = None) -> list[str]:
    """text_encoders = "reloaded": read the diffusers folder's text encoders from their own subfolders into the
    pipeline (at the dtype the rest was loaded at, int8/int4 while loading), for one job's prompts. Returns
    their names. A single-file checkpoint has no per-component files: refused (the planner never offers it)."""
    if model.source.kind == "single_file":
        raise ModelLoadError(f"{model.name} is a single-file checkpoint: its text encoders cannot be read on their "
                             "own, so text_encoders = 'reloaded' does not apply; use 'kept'")
    names = [n for n in text_encoder_names(model.source.path) if getattr(model.pipe, n, None) is None]
    with returning_freed_memory():
        modules = {name: load_component(model.source.path, name, model.dtype, quantize, quantize_on) for name in names}
    for name, module in modules.items():
        log.info("loading %s of %s from disk for this job's prompts", name, model.name)
        model.pipe.register_modules(**{name: module})
    return names


def drop_text_encoders(model: LoadedModel) -> list[str]:
    """Take the text encoders out of the pipeline and give their memory back (glibc's free blocks trimmed):
    they are read again for the next job. Returns the names dropped."""
    import gc

    names = [n for n in model.pipe.components if n.startswith("text_encoder")
             and getattr(model.pipe, n, None) is not None]
    with returning_freed_memory():  # trims the heap when it leaves
        model.pipe.register_modules(**{n: None for n in names})
        gc.collect()
    return names
