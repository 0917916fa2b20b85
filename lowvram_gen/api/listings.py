"""What the API lists, in A1111's entry shapes, from the same sources as the web UI's pickers:
models (models/discover.py: the UI's Model box), samplers and schedule types (samplers.py, schedules.py),
LoRAs and embeddings (networks/: the UI's LoRA and embedding pickers), VAEs (models/vae.py), upscalers (a1111/upscaler_names.py).

Each call scans anew (the UI's Refresh buttons do the same), so a file dropped into models/ shows up at the
next call; A1111's refresh routes are answered, with nothing cached to drop.

A model's title is what A1111 users pick it by: the file or folder name for one in the models folder, the
hub id, or the embedded name (`tiny`); without a computed hash, as A1111 lists a checkpoint it has not hashed.
"""

from __future__ import annotations

from pathlib import Path

from lowvram_gen.models.discover import model_choices
from lowvram_gen.models.tiny import TINY_MODELS
from lowvram_gen.samplers import DEFAULT, NOT_A1111, SAMPLERS, check_installed
from lowvram_gen.schedules import SCHEDULE_TYPES


def _is_path(spec: str) -> bool:
    return spec not in TINY_MODELS and (Path(spec).expanduser().exists() or "\\" in spec or spec.startswith(
        (".", "/", "~")))


def model_entry(spec: str) -> dict:
    """A1111's sd-models entry of a model spec."""
    if _is_path(spec):
        path = Path(spec).expanduser()
        title, name, filename = path.name, path.stem if path.is_file() else path.name, str(path.resolve())
    else:
        title, name, filename = spec, spec, spec
    return {"title": title, "model_name": name, "hash": None, "sha256": None, "filename": filename, "config": None}


def sd_models(default: str, models_folder: str | None = None) -> list[dict]:
    """The models the UI's Model box offers, and `default` (the API's model) when it is not among them."""
    specs = model_choices(models_folder)
    if default not in specs:
        specs = [default, *specs]
    return [model_entry(spec) for spec in specs]


def find_model(name: str, default: str, models_folder: str | None = None) -> str | None:
    """The spec of the model an A1111 client names: by title, model name or file name (as A1111's checkpoint
    aliases), then the same ignoring case; None when no model has that name."""
    name = name.strip()
    entries = [(spec, model_entry(spec)) for spec in dict.fromkeys([default, *model_choices(models_folder)])]
    for fold in (False, True):
        for spec, entry in entries:
            keys = {spec, entry["title"], entry["model_name"], entry["filename"]}
            if name in keys or (fold and name.lower() in {k.lower() for k in keys}):
                return spec
    return None


def title_of(spec: str) -> str:
    return model_entry(spec)["title"]


def sd_vae() -> list[dict]:
    """A1111's /sd-vae: the VAEs of models/VAE by the names a body's sd_vae takes (Automatic and None are not
    listed, as A1111 lists only files)."""
    from lowvram_gen.models import vae

    return [{"model_name": name, "filename": str(path.resolve())} for name, path in vae.available().items()]


def samplers() -> list[dict]:
    """A1111's /samplers: the samplers a request takes ('default': DPM++ 2M for SD 1.x/2.x and SDXL, the model
    folder's own scheduler for the others: samplers.py)."""
    out = []
    for name in [*SAMPLERS, DEFAULT]:
        try:
            check_installed(name)
        except Exception:  # noqa: BLE001 - its package is missing: a request for it is refused, so not listed
            continue
        cls = SAMPLERS[name][0] if name in SAMPLERS else "DPMSolverMultistepScheduler (SD, SDXL) or the model's own"
        out.append({"name": name, "aliases": [], "options": {"diffusers_scheduler": cls,
                                                             "a1111": name not in NOT_A1111}})
    return out


def schedulers() -> list[dict]:
    """A1111 1.9+'s /schedulers: every schedule type a request takes (those diffusers lacks run the sampler's own
    schedule, with a warning, as the README says)."""
    return [{"name": key.replace("-", "_"), "label": label, "aliases": [key] if "-" in key else None,
             "default_rho": None, "need_inner_model": False} for key, (label, _) in SCHEDULE_TYPES.items()]


def loras() -> list[dict]:
    """A1111's /loras (its Lora extension's): name, alias, path and the file's metadata (a .safetensors header's)."""
    from lowvram_gen.networks.lora import available_loras

    return [{"name": name, "alias": name, "path": str(path), "metadata": _metadata(path)}
            for name, path in sorted(available_loras().items(), key=lambda item: item[0].lower())]


def _metadata(path: Path) -> dict:
    if path.suffix.lower() != ".safetensors":
        return {}
    from lowvram_gen.models.safe_files import safetensors_header as _safetensors_header

    try:
        meta = _safetensors_header(path).get("__metadata__")
    except Exception:  # noqa: BLE001 - a damaged file is listed (a job naming it says what is wrong)
        return {}
    return meta if isinstance(meta, dict) else {}


def embeddings() -> dict:
    """A1111's /embeddings: `loaded` the files that read as embeddings (whether one fits the model is known when a
    prompt uses it), `skipped` those that do not read."""
    from lowvram_gen.networks.embeddings import available_embeddings, read_embedding

    loaded, skipped = {}, {}
    for name, path in sorted(available_embeddings().items(), key=lambda item: item[0].lower()):
        try:
            vectors = next(iter(read_embedding(path).values()))
        except Exception:  # noqa: BLE001 - unreadable or not an embedding: listed as skipped
            skipped[name] = _embedding_item(0, 0)
            continue
        loaded[name] = _embedding_item(int(vectors.shape[-1]), int(vectors.shape[0]))
    return {"loaded": loaded, "skipped": skipped}


def _embedding_item(shape: int, vectors: int) -> dict:
    return {"step": None, "sd_checkpoint": None, "sd_checkpoint_name": None, "shape": shape, "vectors": vectors}


def upscalers() -> list[dict]:
    """A1111's /upscalers: the upscalers an image takes (Lanczos, Nearest, ESRGAN-family files, sd-x4 when it is
    here), in A1111's spelling; a hires pass also takes the latent modes (/latent-upscale-modes) and None."""
    from lowvram_gen.a1111.upscaler_names import PIXEL, SD_X4, SD_X4_REPO, available, model_path

    out = []
    for name in available():
        path = None if name in PIXEL or name == SD_X4 else model_path(name)
        out.append({"name": name, "model_name": SD_X4_REPO if name == SD_X4 else (path.stem if path else None),
                    "model_path": str(path) if path else None, "model_url": None,
                    "scale": 4 if name == SD_X4 else None})
    return out


def latent_upscale_modes() -> list[dict]:
    """A1111's /latent-upscale-modes: the latent hires upscalers (Latent, Latent (bicubic), ...)."""
    from lowvram_gen.a1111.upscaler_names import LATENT_MODES

    return [{"name": name} for name in LATENT_MODES]
