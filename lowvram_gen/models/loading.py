"""Load a resolved model into a diffusers pipeline, and reload single components from disk."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from lowvram_gen.errors import ModelLoadError
from lowvram_gen.models.checkpoint import check_finite, load_single_file
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
        """'sdxl', 'sd' or the pipeline class name, for metadata and the estimator."""
        name = type(self.pipe).__name__
        if name.startswith("StableDiffusionXL"):
            return "sdxl"
        if name.startswith("StableDiffusion") and not name.startswith("StableDiffusion3"):
            return "sd"
        return name

    @property
    def name(self) -> str:
        return self.source.spec


def load(source: ModelSource, dtype: str = "float32") -> LoadedModel:
    """A text-to-image pipeline for `source`, weights at `dtype`, on the CPU (placement is apply's job)."""
    import torch

    quiet_hub_bars()
    torch_dtype = getattr(torch, dtype)
    if source.kind == "single_file":
        pipe = load_single_file(str(source.path), source.config, torch_dtype)
    else:
        pipe = _from_folder(source, torch_dtype)
    check_finite(pipe)
    pipe.set_progress_bar_config(disable=True)  # our own progress reporting replaces diffusers' bars
    return LoadedModel(source=source, pipe=pipe, dtype=dtype)


def _from_folder(source: ModelSource, torch_dtype):
    from diffusers import AutoPipelineForText2Image

    try:
        return AutoPipelineForText2Image.from_pretrained(str(source.path), dtype=torch_dtype,
                                                         **absent_components(source.path))
    except (OSError, ValueError, KeyError, EnvironmentError) as exc:
        raise ModelLoadError(f"could not load {source.spec} as a text-to-image pipeline: {exc}") from exc




def reload_components(model: LoadedModel, names: list[str], dtype: str) -> None:
    """Replace `names` with fresh copies from disk (after fp8 or half precision cost them bits)."""
    fresh = load(model.source, dtype).pipe
    for name in names:
        log.info("reloading %s of %s from disk to restore its precision", name, model.name)
        setattr(model.pipe, name, getattr(fresh, name))
        model.pipe.register_modules(**{name: getattr(fresh, name)})
    model.dtype = dtype
