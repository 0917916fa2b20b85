"""The memory profile of a resolved model: what the planner estimates from.

A folder (embedded, hub or local) gives its own configs' profile; a single file the profile of its
`--config` folder, or of its built-in base architecture. A GGUF denoiser keeps its weights quantized,
so they count at the bytes its file stores, not at the dtype's size.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from lowvram_gen.errors import ModelLoadError
from lowvram_gen.models import gguf_file
from lowvram_gen.models.resolve import ModelSource
from lowvram_gen.planning import estimate as memory


def source_profile(source: ModelSource, family: str | None = None) -> memory.ModelProfile:
    """`family`: the loaded pipeline's (LoadedModel.family), for a single file without a config folder."""
    folder = source.path if source.kind != "single_file" else source.config
    gguf = source.kind == "single_file" and gguf_file.is_gguf(source.path)
    if folder and Path(folder).is_dir():
        try:
            profile = memory.profile_from_folder(folder)
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise ModelLoadError(f"could not read the model configs in {folder}: {exc}") from exc
    elif gguf:  # the architecture from the file's keys (no --config folder to read)
        profile = memory.profile_builtin(gguf_file.builtin_arch(source.path))
    else:
        profile = memory.profile_builtin("sdxl" if family == "sdxl" else "sd15")
    if gguf and folder and Path(folder).is_dir():  # an SD folder's profile is no estimate for a Flux GGUF
        from lowvram_gen.models.checkpoint import _check_config

        path = Path(source.path)
        _check_config(Path(folder), gguf_file.pipeline_class(gguf_file.read_header(path), path), path)
    if gguf:
        quantized, stored = gguf_file.stored_sizes(source.path)
        profile = replace(profile, denoiser_quantized=quantized, denoiser_quantized_bytes=stored)
    elif source.kind == "single_file" and profile.unet_channels:
        profile = replace(profile, unet_in_channels=_file_unet_inputs(Path(source.path), profile.unet_in_channels))
    return profile


def _file_unet_inputs(path: Path, default: int) -> int:
    """The UNet's input channels as a .safetensors checkpoint stores them (9: an inpainting model, whatever its
    config folder says), read from its header; `default` for other files (a pickle is not opened for this)."""
    if path.suffix.lower() != ".safetensors":
        return default
    from lowvram_gen.models.checkpoint import _safetensors_header

    try:
        shape = _safetensors_header(path).get("model.diffusion_model.input_blocks.0.0.weight", {}).get("shape")
    except Exception:  # noqa: BLE001 - an unreadable file is the loader's to refuse, with its own words
        return default
    return int(shape[1]) if shape and len(shape) == 4 else default
