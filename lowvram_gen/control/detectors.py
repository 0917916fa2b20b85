"""The model-based preprocessors (A1111 sd-webui-controlnet's modules), run with controlnet_aux's detectors.

controlnet_aux (`pip install 'lowvram-gen[preprocessors]'`) is what the field uses: its detectors carry the
networks A1111's extension runs (the same lllyasviel/ControlNet annotator code), so the weights people already
have load as they are. Depth is its MiDaS (A1111's `depth_midas`, `dpt_hybrid-midas-501f0c75.pt`) rather than a
transformers depth model: that file is what A1111 users have, and transformers' DPT reads only its own layout.

Nothing is ever downloaded. A module's weight files are looked for, in this order:
- `models/ControlNetPreprocessor` (under `./models` or `$LOWVRAM_GEN_MODELS`; Forge's folder, ours too): in the
  module's sub-folder (`openpose/body_pose_model.pth`) or directly in it;
- A1111's extension: `extensions/sd-webui-controlnet/annotator/downloads/<module folder>/` of the webui whose
  `models` folder is the models folder (`$LOWVRAM_GEN_MODELS=/path/to/stable-diffusion-webui/models`);
- the Hugging Face cache (`lllyasviel/Annotators`, `lllyasviel/ControlNet`'s `annotator/ckpts/`), looked up,
  never fetched.

`check(name)` says, before anything loads, whether a module can run here (its library installed, each of its
files found); `run(name, image)` makes the map. Detectors load when a unit first asks for one (controlnet_aux is
imported there: importing lowvram_gen never imports it) and the last two stay loaded for the next job. They run
on the CPU: a map is made once per job and size (control/preprocess.py caches it), the biggest network here
(MiDaS, 123 M weights) takes seconds there, and keeping them off the GPU leaves the planner's budget to the
denoiser, so the plan does not count them (their host RAM is a few hundred MB at most).
"""

from __future__ import annotations

import importlib.util
import os
import sys
import threading
from dataclasses import dataclass
from pathlib import Path

from lowvram_gen.errors import InvalidRequest, ModelLoadError

LIBRARY = "controlnet_aux"
INSTALL = "pip install 'lowvram-gen[preprocessors]'"
HUB_REPOS = (("lllyasviel/Annotators", ""), ("lllyasviel/ControlNet", "annotator/ckpts/"))
LINEART_STANDARD = "lineart_standard (from white bg & black line)"


@dataclass(frozen=True)
class Module:
    """A preprocessor: the detector family that runs it, its weight files and A1111's folder for them."""

    family: str  # midas | openpose | lineart | lineart_anime | lineart_standard
    files: tuple[str, ...] = ()
    folder: str = ""  # the sub-folder of A1111's annotator/downloads (and of models/ControlNetPreprocessor)
    options: tuple = ()  # what the detector is called with (openpose: body, hand, face)


BODY, HAND, FACE = "body_pose_model.pth", "hand_pose_model.pth", "facenet.pth"
MODULES = {
    "depth_midas": Module("midas", ("dpt_hybrid-midas-501f0c75.pt",), "midas"),
    "openpose": Module("openpose", (BODY,), "openpose", (True, False, False)),
    "openpose_hand": Module("openpose", (BODY, HAND), "openpose", (True, True, False)),
    "openpose_face": Module("openpose", (BODY, FACE), "openpose", (True, False, True)),
    "openpose_faceonly": Module("openpose", (BODY, FACE), "openpose", (False, False, True)),
    "openpose_full": Module("openpose", (BODY, HAND, FACE), "openpose", (True, True, True)),
    "lineart_realistic": Module("lineart", ("sk_model.pth",), "lineart"),
    "lineart_coarse": Module("lineart", ("sk_model2.pth",), "lineart"),
    "lineart_anime": Module("lineart_anime", ("netG.pth",), "lineart_anime"),
    LINEART_STANDARD: Module("lineart_standard"),  # no network: a blur difference, but controlnet_aux's (OpenCV)
}
# older or shorter names A1111's extension (and its API users) write for the same modules
ALIASES = {"depth": "depth_midas", "lineart": "lineart_realistic", "lineart_standard": LINEART_STANDARD,
           "openpose_hands": "openpose_hand"}
NAMES = tuple(MODULES)


def canonical(name: str) -> str | None:
    """A1111's module name for `name` (case and an alias forgiven), or None when it is not one of ours."""
    text = str(name).strip().lower()
    return text if text in MODULES else ALIASES.get(text)


def installed() -> bool:
    """Whether controlnet_aux can be imported (looked up, not imported: that takes seconds)."""
    if LIBRARY in sys.modules:
        return sys.modules[LIBRARY] is not None
    try:
        return importlib.util.find_spec(LIBRARY) is not None
    except (ImportError, ValueError):
        return False


def folders(module: Module) -> list[Path]:
    """The folders searched for `module`'s files, in order (the Hugging Face cache comes after them)."""
    from lowvram_gen.networks.files import models_root

    root = models_root()
    ours = root / "ControlNetPreprocessor"
    a1111 = root.parent / "extensions" / "sd-webui-controlnet" / "annotator" / "downloads"
    return [ours / module.folder, ours, a1111 / module.folder]


def _in_hub_cache(file: str) -> Path | None:
    from huggingface_hub import try_to_load_from_cache

    for repo, prefix in HUB_REPOS:
        try:
            found = try_to_load_from_cache(repo, prefix + file)
        except Exception:  # a broken cache entry is as good as none
            found = None
        if isinstance(found, str) and os.path.isfile(found):
            return Path(found)
    return None


def find(name: str) -> dict[str, Path]:
    """{file: where it is} for the module's files; ModelLoadError naming the first file missing and where it was
    looked for."""
    module = MODULES[name]
    found = {}
    for file in module.files:
        path = next((f / file for f in folders(module) if (f / file).is_file()), None) or _in_hub_cache(file)
        if path is None:
            where = ", ".join(str(f) for f in folders(module))
            raise ModelLoadError(f"the {name} preprocessor needs {file}, found in none of {where} nor the Hugging "
                                 f"Face cache (lllyasviel/Annotators): put the file in {folders(module)[0]}")
        found[file] = path
    return found


def check(field: str, name: str) -> str:
    """`name` as A1111's module name once it can run here: its library installed and its files found (one
    sentence otherwise, before anything loads)."""
    module = canonical(name)
    if module is None:
        raise InvalidRequest(field, name, f"not a preprocessor here; use one of none, canny, {', '.join(NAMES)}")
    if not installed():
        raise ModelLoadError(f"the {module} preprocessor needs {LIBRARY}, which is not installed: {INSTALL}")
    find(module)
    return module


# ------------------------------------------------------------------------------------------------ running

_LOADED: dict = {}  # {(module family, files, their mtimes): detector}; the last KEEP stay loaded
_LOCK = threading.Lock()
KEEP = 2


def _import():
    """controlnet_aux, imported quietly (its import warns about optional packages and timm's renames)."""
    import warnings

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            import controlnet_aux
    except ImportError as exc:
        raise ModelLoadError(f"{LIBRARY} could not be imported ({exc}): {INSTALL}") from None
    return controlnet_aux


def _weights(path: Path) -> dict:
    import torch

    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:
        raise ModelLoadError(f"{path} could not be read as a weights file ({type(exc).__name__}: {exc}); download "
                             "it again") from None
    if isinstance(state, dict) and isinstance(state.get("model"), dict) and "optimizer" in state:
        state = state["model"]  # MiDaS' training checkpoints wrap the weights
    return state


def _midas(paths: dict):
    """MiDaS' DPT-Hybrid, built on the meta device and given the file's tensors (building it for real first would
    spend seconds initialising 123 M weights that are overwritten)."""
    import torch
    from controlnet_aux.midas import MidasDetector
    from controlnet_aux.midas.midas.dpt_depth import DPTDepthModel

    import warnings

    with torch.device("meta"), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # timm: "Mapping deprecated model name vit_base_resnet50_384"
        net = DPTDepthModel(path=None, backbone="vitb_rn50_384", non_negative=True)
    try:
        net.load_state_dict(_weights(next(iter(paths.values()))), assign=True)
    except RuntimeError as exc:
        raise ModelLoadError(f"{next(iter(paths.values()))} is not MiDaS' DPT-Hybrid ({str(exc).splitlines()[0]})"
                             ) from None
    return MidasDetector(net.float().eval())


def _openpose(paths: dict):
    from controlnet_aux.open_pose import OpenposeDetector
    from controlnet_aux.open_pose.body import Body
    from controlnet_aux.open_pose.face import Face
    from controlnet_aux.open_pose.hand import Hand

    return OpenposeDetector(Body(str(paths[BODY])), Hand(str(paths[HAND])) if HAND in paths else None,
                            Face(str(paths[FACE])) if FACE in paths else None)


def _lineart(paths: dict):
    from controlnet_aux.lineart import Generator, LineartDetector

    net = Generator(3, 1, 3)
    net.load_state_dict(_weights(next(iter(paths.values()))))
    net.eval()
    return LineartDetector(net, net)


def _lineart_anime(paths: dict):
    from controlnet_aux.lineart_anime import LineartAnimeDetector

    path = next(iter(paths.values()))
    return LineartAnimeDetector.from_pretrained(str(path.parent), filename=path.name)


def _lineart_standard(_paths: dict):
    from controlnet_aux.lineart_standard import LineartStandardDetector

    return LineartStandardDetector()


LOADERS = {"midas": _midas, "openpose": _openpose, "lineart": _lineart, "lineart_anime": _lineart_anime,
           "lineart_standard": _lineart_standard}


def detector(name: str):
    """The loaded detector of module `name` (loaded now unless one of the last KEEP jobs loaded it)."""
    module = MODULES[name]
    paths = find(name)
    key = (module.family, tuple((f, str(p), p.stat().st_mtime_ns) for f, p in sorted(paths.items())))
    with _LOCK:
        if key in _LOADED:
            _LOADED[key] = _LOADED.pop(key)  # most recently used last
            return _LOADED[key]
        _import()
        try:
            made = LOADERS[module.family](paths)
        except ModelLoadError:
            raise
        except Exception as exc:  # a file of another network: its load_state_dict's first line says which keys
            raise ModelLoadError(f"the {name} preprocessor could not load {', '.join(map(str, paths.values()))}: "
                                 f"{str(exc).splitlines()[0] if str(exc) else type(exc).__name__}") from None
        _LOADED[key] = made
        while len(_LOADED) > KEEP:
            _LOADED.pop(next(iter(_LOADED)))
        return made


def run(name: str, image):
    """Module `name`'s map of a PIL image: RGB, the image's size (the detector runs at its shorter side, as
    A1111's Pixel Perfect does, and its map is resized back to the image's exact size)."""
    import torch
    from PIL import Image

    name = check("preprocessor", name)
    made = detector(name)
    size = min(image.size)
    call = {"detect_resolution": size}
    module = MODULES[name]
    if module.family != "lineart_standard":
        call["image_resolution"] = size
    if module.family == "openpose":
        call.update(zip(("include_body", "include_hand", "include_face"), module.options))
    if module.family == "lineart":
        call["coarse"] = name == "lineart_coarse"
    with torch.inference_mode():
        out = made(image.convert("RGB"), output_type="pil", **call)
    out = out.convert("RGB")
    return out if out.size == image.size else out.resize(image.size, Image.BILINEAR)
