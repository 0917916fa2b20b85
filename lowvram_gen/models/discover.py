"""Models a user already has: the embedded ones, a local models folder, and the Hugging Face cache."""

from __future__ import annotations

from pathlib import Path

from lowvram_gen.models.resolve import SINGLE_FILE_SUFFIXES
from lowvram_gen.networks import files
from lowvram_gen.models.tiny import TINY_MODELS


MODEL_SUFFIXES = (".safetensors", ".gguf", ".ckpt")  # what the Model list offers (pickles load by path only)


def local_models(folder: str | Path, sub_folders: bool = True) -> list[str]:
    """Diffusers folders and single checkpoint files (GGUF denoisers too) inside `folder` (A1111's
    models/Stable-diffusion, ComfyUI's models/checkpoints and diffusion_models), with `sub_folders` in its sub-folders
    too (ComfyUI users sort them so), symlinked ones included; never inside a diffusers folder."""
    root = Path(folder).expanduser()
    levels = files.SUB_FOLDER_LEVELS if sub_folders else 0
    return [str(p) for p in files.model_entries(root, MODEL_SUFFIXES, levels)] if root.is_dir() else []


def cached_hub_models() -> list[str]:
    """Hub repos in the HF cache that hold a diffusers pipeline (they load offline)."""
    try:
        from huggingface_hub import scan_cache_dir

        info = scan_cache_dir()
    except Exception:  # no cache yet, or an unreadable one: nothing to offer
        return []
    repos = []
    for repo in info.repos:
        if repo.repo_type == "model" and any(
            f.file_name == "model_index.json" for rev in repo.revisions for f in rev.files
        ):
            repos.append(repo.repo_id)
    return sorted(repos)


def checkpoint_folders() -> list[Path]:
    """Where checkpoints are listed from and looked up by name: the models root itself (lowvram-gen's own layout),
    then the Stable-diffusion folders (--ckpt-dir first, then models/Stable-diffusion: A1111's layout)."""
    return [files.models_root(), *files.kind_dirs("Stable-diffusion")]


def model_choices(models_folder: str | Path | None = None) -> list[str]:
    """The Model list of the UI and the API: the embedded models, the checkpoints of `models_folder` (default:
    `checkpoint_folders()`), the diffusers pipelines in the HF cache."""
    return list(dict.fromkeys([*TINY_MODELS, *local_checkpoints(models_folder), *cached_hub_models()]))


def local_checkpoints(models_folder: str | Path | None = None) -> list[str]:
    """The checkpoints of `models_folder` (default: `checkpoint_folders()`): the Model list's local entries, and the
    extra-network cards' checkpoints (networks/previews.py)."""
    folders = [models_folder] if models_folder else checkpoint_folders()
    # the models root's own files only: its sub-folders are the other kinds' (loras/, vae/, text_encoders/ ...)
    return [spec for folder in folders
            for spec in local_models(folder, sub_folders=bool(models_folder) or folder != files.models_root())]


__all__ = ["SINGLE_FILE_SUFFIXES", "cached_hub_models", "checkpoint_folders", "local_checkpoints", "local_models",
           "model_choices"]
