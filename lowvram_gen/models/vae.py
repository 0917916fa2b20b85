"""VAE files a job may decode (and encode) with instead of its model's own: A1111's "SD VAE" setting.

Where: `models/VAE` (`$LOWVRAM_GEN_MODELS/VAE`, A1111's folder; sub-folders too), as A1111 keeps them:
- a `.safetensors` file (its header checked, never unpickled: models/safe_files.py) or a `.pt`/`.ckpt` one
  (unpickled weights-only), in the original LDM layout (`encoder.down.0.block.0.norm1.weight`, with or without
  `first_stage_model.`), converted with diffusers' single-file utilities as models/checkpoint.py converts a
  checkpoint's VAE, or already in diffusers' layout (`encoder.down_blocks.0.resnets.0.norm1.weight`);
- a diffusers AutoencoderKL folder (`config.json` and `diffusion_pytorch_model.safetensors`).

A VAE is named as A1111 names it: its file name (`vae-ft-mse-840000-ema-pruned.safetensors`), its stem too, any
case; a folder by its name. The CLI also takes a path. Two names are no file: "Automatic" and "None", both the
model's own VAE. A1111's "None" is the checkpoint's baked-in VAE; its "Automatic" is a VAE file beside the
checkpoint with the same name (`model.vae.pt`) where there is one, else the baked-in one too; a diffusers model here
always has its own `vae/`, so both are the model's own.

The VAE is built from the model's own VAE config (its scaling factor, its shapes: A1111 keeps the model's scale too)
and its weights loaded strictly: a VAE for another latent space (SD3's or Flux's 16 channels on an SD model) is
refused naming a weight that does not fit. Nothing here imports torch at import time.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from lowvram_gen import safe_json
from lowvram_gen.errors import InvalidRequest, ModelLoadError
from lowvram_gen.networks import files

SUFFIXES = (".safetensors", ".pt", ".ckpt")
AUTOMATIC, NONE = "Automatic", "None"  # A1111's two choices that are no file: both the model's own here
OWN = (AUTOMATIC, NONE)
FOLDER_WEIGHTS = "diffusion_pytorch_model.safetensors"
# what A1111 leaves out of a VAE file besides its weights (sd_vae.py: the trainer's loss and EMA counters)
_NOT_WEIGHTS = ("loss.", "model_ema.")


def vae_dirs() -> list[Path]:
    return files.kind_dirs("VAE")  # --vae-dir first, then models/VAE


def is_own(name: str | None) -> bool:
    """Whether `name` asks for the model's own VAE: empty, "Automatic" or "None" (any case)."""
    return not name or name.strip().lower() in {n.lower() for n in OWN}


def _is_vae_folder(folder: Path) -> bool:
    try:
        config = safe_json.load_file(folder / "config.json")
    except (OSError, ValueError):
        return False
    return isinstance(config, dict) and config.get("_class_name") == "AutoencoderKL"


def available() -> dict[str, Path]:
    """{name: path} of the VAEs in `vae_dirs()`: files by their file name (A1111's names), diffusers folders by
    theirs; sorted by name."""
    found: dict[str, Path] = {}
    for folder in vae_dirs():
        if not folder.is_dir():
            continue
        for path in sorted(files.scan(folder, SUFFIXES).values()):
            if not any(_is_vae_folder(parent) for parent in path.parents if folder in parent.parents):
                found.setdefault(path.name, path)
        for config in sorted(folder.rglob("config.json")):
            if _is_vae_folder(config.parent):
                found.setdefault(config.parent.name, config.parent)
    return dict(sorted(found.items(), key=lambda item: item[0].lower()))


def find(name: str, paths: bool = True) -> Path:
    """The VAE named `name`: a listed name (the file name, or its stem; any case), or with `paths` an existing file
    or diffusers folder. InvalidRequest naming it, the folder looked in and the VAEs there are."""
    text = name.strip() if isinstance(name, str) else ""
    listed = available()
    if text:
        folded = {key.lower(): path for key, path in listed.items()}
        stems = {Path(key).stem.lower(): path for key, path in listed.items() if Path(key).suffix.lower() in SUFFIXES}
        hit = folded.get(text.lower()) or stems.get(text.lower())
        if hit is not None:
            return hit
        direct = Path(text).expanduser()
        if paths and (direct.is_file() and direct.suffix.lower() in SUFFIXES or direct.is_dir() and
                      _is_vae_folder(direct)):
            return direct
    where = ", ".join(str(f.expanduser().resolve()) + ("" if f.is_dir() else " (no such folder)") for f in vae_dirs())
    there = ", ".join(listed) if listed else "none"
    raise InvalidRequest("VAE", name, f"no VAE of that name in {where} (there are: {there}); "
                                      f"{AUTOMATIC} or {NONE} is the model's own")


def name_of(path: Path) -> str:
    """The name A1111 writes (`VAE: ...`) and lists for a VAE: its file's or folder's name."""
    return Path(path).name


def weights_file(path: Path) -> Path:
    """The file that holds a VAE's weights: the file itself, or a diffusers folder's safetensors."""
    path = Path(path)
    if path.is_dir():
        weights = path / FOLDER_WEIGHTS
        if not weights.is_file():
            raise ModelLoadError(f"VAE folder {path} has no {FOLDER_WEIGHTS} (only safetensors weights are read "
                                 "from a folder)")
        return weights
    return path


def short_hash(path: Path) -> str:
    """A1111's `VAE hash`: the first 10 hex digits of its file's sha256 (a folder: of its weights file)."""
    return files.sha256(weights_file(path))[:10]


def file_bytes(path: Path) -> int:
    """The bytes of a VAE's weights as its file stores them (what loading it reads)."""
    return weights_file(path).stat().st_size


@dataclass(frozen=True)
class Stamp:
    """Which VAE file is on a pipeline: a changed file is loaded again."""

    path: str
    mtime_ns: int
    size: int

    @classmethod
    def of(cls, path: Path) -> "Stamp":
        st = weights_file(path).stat()
        return cls(str(Path(path).resolve()), st.st_mtime_ns, st.st_size)


def read_state(path: Path) -> dict:
    """The tensors of a VAE file or folder, read safely, in diffusers' layout or still in the LDM one."""
    from lowvram_gen.models.safe_files import check_safetensors, load_pickle_weights_only

    weights = weights_file(path)
    if weights.suffix.lower() == ".safetensors":
        check_safetensors(weights)
        from safetensors.torch import load_file

        return load_file(str(weights))
    return load_pickle_weights_only(weights)


def _diffusers_layout(state: dict) -> bool:
    return any(".down_blocks." in k or ".up_blocks." in k or k.startswith("decoder.mid_block.") for k in state)


def to_diffusers(state: dict, config: dict) -> dict:
    """`state` in diffusers' AutoencoderKL layout: an LDM one converted as a checkpoint's VAE is converted."""
    state = {k: v for k, v in state.items() if not k.startswith(_NOT_WEIGHTS)}
    if _diffusers_layout(state):
        return state
    from diffusers.loaders.single_file_utils import convert_ldm_vae_checkpoint

    return convert_ldm_vae_checkpoint(state, config)


def load(path: Path, config: dict, dtype: str = "float32"):
    """An AutoencoderKL of the model's VAE `config` with the weights of `path`, at `dtype`, on the CPU; its weights
    checked finite. A VAE whose weights do not fit that config is refused naming one that does not."""
    import torch
    from diffusers import AutoencoderKL

    state = to_diffusers(read_state(Path(path)), dict(config))
    with torch.device("meta"):
        vae = AutoencoderKL.from_config(dict(config))
    expected = {k: tuple(v.shape) for k, v in vae.state_dict().items()}
    missing = sorted(set(expected) - set(state))
    unexpected = sorted(set(state) - set(expected))
    shapes = [k for k in sorted(set(expected) & set(state)) if tuple(state[k].shape) != expected[k]]
    name = name_of(path)
    if missing or shapes:
        what = (f"{shapes[0]} is {list(state[shapes[0]].shape)} in the file but {list(expected[shapes[0]])} in "
                f"the model's VAE" if shapes else f"{len(missing)} of the model's VAE weights are not in it, e.g. "
                                                   f"{missing[0]}")
        raise ModelLoadError(f"VAE {name} does not fit this model's VAE (is it for another model family, with "
                             f"another latent space?): {what} ({path})")
    if unexpected and len(unexpected) == len(state):
        raise ModelLoadError(f"VAE {name} holds no VAE weights this model's VAE has (e.g. {unexpected[0]}) ({path})")
    vae.load_state_dict({k: state[k].to(getattr(torch, dtype)) for k in expected}, assign=True)
    vae.eval()
    bad = [k for k, v in vae.state_dict().items() if v.is_floating_point() and not torch.isfinite(v).all()]
    if bad:
        raise ModelLoadError(f"VAE {name} has NaN or infinite weights ({bad[0]}): the file is damaged ({path})")
    return vae
