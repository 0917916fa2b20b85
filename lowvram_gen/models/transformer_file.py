"""A transformer on its own, as ComfyUI and BFL publish it (`models/diffusion_models/*.safetensors`: Z-Image,
Qwen-Image, Flux.2 dev and Klein 4B/9B, Chroma, Lumina 2, SANA, HiDream-I1; SD3's and FLUX.1's without their text
encoders and VAE), with the text encoders, VAE, tokenizer and scheduler taken from a diffusers folder of the same
family (`--config` / `--components FOLDER`, else the family's repo in the HF cache, else a diffusers folder of the
family among the user's models: `local_components`, so the UI's Model list runs the file).

Which family a file's transformer is comes from its keys (the record's `SingleFile.gguf_match`, the same test a
city96 GGUF of it passes: families/keys.py); diffusers' own `<Transformer>.from_single_file` converts the original
layout (ComfyUI's / BFL's names) to its own, with the folder's transformer config. A GGUF of the same transformer
takes models/gguf_file.py's route, which ends in `pipeline_around` too. Nothing is copied: the file is read where it is.

A components folder runs the file where its pipeline's denoiser is the file's class and, if its record reads files of
its own, of the file's family group (`runs_in`: a Flux.2 Klein folder does not run a Flux.2 dev file), and of the
file's variant where the record tells its variants apart (`refuse_other_variant`: Klein 9B / 4B, FLUX.1 dev /
schnell). FLUX.1 Kontext's files have FLUX.1's keys: a Kontext folder's model_index.json makes a FLUX.1 file Kontext's
(`file_pipeline`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Mapping

from lowvram_gen import families, safe_json
from lowvram_gen.errors import ModelLoadError


# where whole files keep what is not the denoiser: ComfyUI's all-in-one text encoders (SD3's, FLUX.1's), the VAE
NOT_DENOISER = ("text_encoders.", "cond_stage_model.", "conditioner.", "first_stage_model.", "vae.")


def family_of(shapes: Mapping[str, tuple]) -> families.Family | None:
    """The record whose transformer alone a .safetensors file's {key: shape} are: a family without whole-file
    checkpoints whose denoiser is a transformer (told by its keys: `SingleFile.gguf_match`), or SD3's / FLUX.1's
    transformer with nothing else (BFL's flux1-dev.safetensors, ComfyUI's diffusion_models/: no text encoder or VAE
    keys; a whole file of theirs stays `by_checkpoint`'s); None for any other file."""
    found = families.by_gguf(shapes)
    if found is not None and found.denoiser == "transformer" and found.single_file.checkpoint_match is None:
        return found
    whole = families.by_checkpoint(shapes)
    if whole is not None and whole.denoiser == "transformer" and not any(k.startswith(NOT_DENOISER) for k in shapes):
        return whole
    return None


def runs_in(family: families.Family, pipeline: str) -> bool:
    """A components folder of the pipeline class `pipeline` runs this family's transformer file: its denoiser is of the
    same class, and where the folder's record reads transformer files of its own, it is of the same family group (a
    Flux.2 Klein folder does not take a Flux.2 dev file, though both are Flux2Transformer2DModel; a Qwen-Image-Edit
    folder, which reads none, takes a Qwen-Image file)."""
    theirs = families.by_pipeline(pipeline)
    own_files = theirs.single_file is not None and theirs.single_file.gguf_match is not None
    return family.denoiser_classes[0] in theirs.denoiser_classes and (not own_files or theirs.group == family.group)


def local_components(family: families.Family) -> Path | None:
    """A diffusers folder whose pipeline runs this family's transformer, among the models the Model list offers (the
    models root and its checkpoint folders: networks/files.kind_dirs), the first by path; None when there is none, and
    for UNet families. Asked only for a file that holds the denoiser alone (a 2026 family's transformer file, a GGUF
    of FLUX.1's or SD3's): a whole checkpoint's configs are found as before (models/checkpoint.py)."""
    from lowvram_gen.networks import files

    if family.denoiser != "transformer" or family.single_file is None:
        return None
    found = []
    for root in [files.models_root(), *files.kind_dirs("Stable-diffusion")]:
        if not root.is_dir():
            continue
        for entry in files.model_entries(root, ()):
            try:
                theirs = str(safe_json.load_file(entry / "model_index.json").get("_class_name", ""))
            except (OSError, ValueError):
                continue
            if runs_in(family, theirs):
                found.append((families.by_pipeline(theirs).key != family.key, entry))
    # the family's own folder before one of another record that runs it (a FLUX.1 file: FLUX.1's, not Kontext's)
    return min(found, key=lambda f: f[0])[1] if found else None


def planned_components(family: families.Family, config: str | None) -> Path | None:
    """The components folder a transformer file's plan reads, as the loader finds it: `config` (--components; a file
    there is refused in one sentence), else the family's repo in the HF cache, else `local_components`; None: none
    here (the plan then reads the family's shipped real-size configs)."""
    from lowvram_gen.models.unreadable_files import refuse_file_as_folder

    if config:
        refuse_file_as_folder("--components", config)
        return None  # a hub id not in the cache, or no such folder: the loader says which
    try:
        from huggingface_hub import snapshot_download

        cached = Path(snapshot_download(family.hub_id, allow_patterns=["*.json"], local_files_only=True))
    except Exception:  # noqa: BLE001 - not cached, offline, no hub id: all mean "not here"
        cached = None
    if cached is not None and (cached / "model_index.json").is_file():
        return cached
    return local_components(family)


def file_family(path) -> families.Family | None:
    """`family_of` a .safetensors file, from its header alone (for a plan without --components); None for others."""
    from lowvram_gen.models.safe_files import safetensors_header

    if Path(path).suffix.lower() != ".safetensors":
        return None
    try:
        header = safetensors_header(path)
    except Exception:  # noqa: BLE001 - an unreadable file is the loader's to refuse, with its own words
        return None
    return family_of({k: tuple(v["shape"]) for k, v in header.items() if k != "__metadata__"})


def file_pipeline(folder: Path, family: families.Family) -> str:
    """The pipeline class a single file of `family` (a whole file, or its denoiser as a GGUF) builds with the config
    folder `folder`: the family's own, or the folder's where that is another record of the same group that reads no
    files of its own. FLUX.1 Kontext's files have FLUX.1's keys and nothing else tells them apart (ComfyUI loads both
    with one loader and leaves Kontext to the workflow), so a Kontext folder's model_index.json says it is Kontext."""
    own = family.single_file.pipeline
    try:
        theirs = str(safe_json.load_file(folder / "model_index.json").get("_class_name", ""))
    except (OSError, ValueError):
        return own  # the config check refuses an unreadable folder in its own words
    record = families.by_pipeline(theirs)
    if record.key != family.key and record.group == family.group and record.single_file is None:
        return theirs
    return own


def folder_pipeline(folder: Path, family: families.Family, path: Path,
                    shapes: Mapping[str, tuple[int, ...]] | None = None) -> str:
    """The pipeline class of the components folder, which must be one whose transformer is this file's class (a
    Qwen-Image-Edit folder takes a Qwen-Image transformer file; a Flux.2 dev folder a Flux.2 file): refused in one
    sentence otherwise, naming both; and of the file's variant (`refuse_other_variant`; `shapes`: a GGUF's, read by
    its loader, else the .safetensors header's)."""
    try:
        theirs = str(safe_json.load_file(folder / "model_index.json").get("_class_name", "?"))
    except (OSError, ValueError) as exc:
        raise ModelLoadError(f"cannot read {folder / 'model_index.json'}: {exc}") from None
    wanted = family.denoiser_classes[0]
    if not runs_in(family, theirs):
        raise ModelLoadError(f"{path.name} is a {family.name} transformer ({wanted}), but the components folder "
                             f"{folder} is a {theirs}: pass --components with a diffusers folder of {family.name}")
    refuse_other_variant(folder, family, path, shapes)
    return theirs


def refuse_other_variant(folder: Path, family: families.Family, path: Path,
                         shapes: Mapping[str, tuple[int, ...]] | None = None) -> None:
    """Refuse, before any weight is read, a components folder of another variant of the file's family whose
    transformer has other shapes (a Klein 9B file with a Klein 4B folder, a FLUX.1 schnell file with a dev folder:
    diffusers would fail late on a size mismatch naming the file alone), from the record's variant facts
    (`SingleFile.file_variant` of the file's keys and shapes: `shapes` where the caller read them, a GGUF's logical
    shapes under the original names; else a .safetensors header's), `config_variant` of the folder's transformer
    config. A file or folder config that cannot be read is left to the loader."""
    single = family.single_file
    if single is None or single.file_variant is None or single.config_variant is None:
        return
    try:
        shapes = _header_shapes(Path(path)) if shapes is None else shapes
        config = safe_json.load_file(folder / family.denoiser / "config.json")
    except Exception:  # noqa: BLE001 - an unreadable file or config is the loader's to refuse, in its own words
        return
    if shapes is None:
        return
    mine = single.file_variant(shapes)
    theirs = single.config_variant(config)
    if mine != theirs:
        raise ModelLoadError(f"{Path(path).name} is a {mine} transformer, but the components folder {folder} holds a "
                             f"{theirs} one: pass --components with a diffusers folder of {mine}")


def _header_shapes(path: Path) -> dict[str, tuple[int, ...]] | None:
    """Each tensor's shape by its name as stored, from a .safetensors header alone; None for another kind of file."""
    from lowvram_gen.models.safe_files import safetensors_header

    if path.suffix.lower() != ".safetensors":
        return None
    return {k: tuple(v["shape"]) for k, v in safetensors_header(path).items() if k != "__metadata__"}


def load_denoiser(path, family: families.Family, folder: Path, torch_dtype, quantize: str = "none",
                  quantize_on: str | None = None):
    """The transformer of `path`, converted by diffusers from the file's own layout with the folder's config;
    int8/int4 quantized as each layer loads (models/quantize.from_single_file), so RAM never holds it whole."""
    import diffusers

    from lowvram_gen.models import quantize as quantize_mod

    cls = getattr(diffusers, family.denoiser_classes[0])
    kwargs = dict(config=str(folder), subfolder=family.denoiser, torch_dtype=torch_dtype, local_files_only=True)
    source = without_comfy_prefix(path)
    if quantize == "none":
        model = cls.from_single_file(source, **kwargs)
    else:
        model = quantize_mod.from_single_file(cls, source, quantize, quantize_on, **kwargs)
    empty = [k for k, v in model.state_dict().items() if v.device.type == "meta"]
    if empty:  # diffusers leaves the weights a file lacks on the meta device instead of failing
        raise ModelLoadError(f"{Path(path).name} has no weights for {len(empty)} of the {family.name} transformer's "
                             f"tensors ({', '.join(empty[:3])}): a cut download, or a file of another model")
    return model


def without_comfy_prefix(path):
    """The file (its path), or where its keys carry ComfyUI's `model.diffusion_model.` prefix (a model saved by
    ComfyUI's own nodes) its tensors without it: diffusers' Flux.2 converter and Qwen-Image's identity mapping keep the
    prefix and then match no key. diffusers reads a path into the same whole dict, so this costs no more memory."""
    from safetensors import safe_open

    from lowvram_gen.families.keys import UNET

    with safe_open(str(path), framework="pt") as f:
        keys = list(f.keys())
        if not any(k.startswith(UNET) for k in keys):
            return str(path)
        return {k.removeprefix(UNET): f.get_tensor(k) for k in keys}


def pipeline_around(pipeline: str, folder: Path, torch_dtype, name: str, model):
    """The pipeline `pipeline` of `folder` with `model` as its component `name` (the folder's own is never read)."""
    import diffusers

    from lowvram_gen.models.folders import absent_components

    return getattr(diffusers, pipeline).from_pretrained(str(folder), dtype=torch_dtype, local_files_only=True,
                                                        **{**absent_components(folder), name: model})


def load_pipeline(path, family: families.Family, folder: Path, torch_dtype, quantize: str = "none",
                  quantize_on: str | None = None):
    """The components folder's pipeline with the transformer of `path` in place of its own."""
    pipeline = folder_pipeline(folder, family, Path(path))
    model = load_denoiser(path, family, folder, torch_dtype, quantize, quantize_on)
    return pipeline_around(pipeline, folder, torch_dtype, family.denoiser, model)
