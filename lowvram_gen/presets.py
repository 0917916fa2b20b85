"""Presets: one TOML file per VRAM class in `presets/`, user-editable, strictly validated.

Unlike Fooocus, an unknown key or a wrong type is an error naming the file, key and value: a typo
in a preset must not silently fall back to a default that then runs out of memory.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field, fields
from pathlib import Path

from lowvram_gen.errors import PresetError
from lowvram_gen.settings import MemorySettings

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

# The presets shipped with the project: next to the package in a checkout, inside it when installed.
_CANDIDATES = (Path(__file__).resolve().parent.parent / "presets", Path(__file__).resolve().parent / "presets")
MIN_PIXELS = 64 * 64


@dataclass(frozen=True)
class VqganKnobs:
    cutn_chunk: int = 32  # cutouts per CLIP forward; gradients are accumulated over chunks
    clip_autocast: bool = True  # run CLIP in half precision under autocast
    gradient_checkpointing: bool = False  # recompute VQGAN decoder activations in backward
    clip_text_offload: bool = False  # encode prompts once, then move the text tower off the GPU
    max_pixels: int = 512 * 512  # above this, optimise at the cap and upscale afterwards


@dataclass(frozen=True)
class Preset:
    name: str
    rank: int  # ladder position: 0 is the fastest; the ladder steps to the next higher rank
    device: str  # 'gpu' or 'cpu'
    description: str
    memory: MemorySettings
    max_pixels: int  # resolution cap: above it, generate at the cap and upscale afterwards
    max_batch: int  # images per forward pass
    upscaler: str = "lanczos"
    vqgan: VqganKnobs = field(default_factory=VqganKnobs)
    path: Path | None = None

    def as_dict(self) -> dict:
        return {
            "name": self.name, "rank": self.rank, "device": self.device, "description": self.description,
            "max_pixels": self.max_pixels, "max_batch": self.max_batch, "upscaler": self.upscaler,
            "memory": self.memory.as_dict(), "vqgan": {f.name: getattr(self.vqgan, f.name) for f in fields(VqganKnobs)},
            "path": str(self.path) if self.path else None,
        }


def presets_dir() -> Path:
    for candidate in _CANDIDATES:
        if candidate.is_dir():
            return candidate
    raise PresetError(f"no presets folder found (looked in {', '.join(map(str, _CANDIDATES))})")


_TOP = {"description": str, "rank": int, "device": str, "max_pixels": int, "max_batch": int, "upscaler": str}
_SECTIONS = {"memory": MemorySettings, "vqgan": VqganKnobs}
UPSCALERS = ("lanczos",)  # the upscaling issue adds more; the ladder and caps use these


def _typed(where: str, key: str, value, kind):
    ok = isinstance(value, kind) and not (kind is int and isinstance(value, bool))
    if not ok:
        raise PresetError(f"{where}: {key} = {value!r} must be {'a whole number' if kind is int else kind.__name__}")
    return value


def parse_preset(name: str, data: dict, where: str) -> Preset:
    top: dict = {}
    sections: dict = {}
    for key, value in data.items():
        if key in _TOP:
            top[key] = _typed(where, key, value, _TOP[key])
        elif key in _SECTIONS:
            if not isinstance(value, dict):
                raise PresetError(f"{where}: [{key}] must be a table")
            cls = _SECTIONS[key]
            known = {f.name: f for f in fields(cls)}
            for sub, subvalue in value.items():
                if sub not in known:
                    raise PresetError(f"{where}: unknown key {key}.{sub} = {subvalue!r}; allowed in [{key}]: {', '.join(known)}")
                kind = type(known[sub].default)
                if kind is not str:
                    _typed(where, f"{key}.{sub}", subvalue, kind)
                elif not isinstance(subvalue, str):
                    raise PresetError(f"{where}: {key}.{sub} = {subvalue!r} must be text")
            sections[key] = cls(**value)
        else:
            raise PresetError(f"{where}: unknown key {key} = {value!r}; allowed: {', '.join([*_TOP, *_SECTIONS])}")
    for key in ("rank", "device", "max_pixels", "max_batch"):
        if key not in top:
            raise PresetError(f"{where}: missing key {key}")
    memory = sections.get("memory", MemorySettings()).check(where)
    preset = Preset(name=name, description=top.get("description", ""), memory=memory,
                    vqgan=sections.get("vqgan", VqganKnobs()), path=None,
                    **{k: v for k, v in top.items() if k != "description"})
    _check_combination(preset, where)
    return preset


def _check_combination(p: Preset, where: str) -> None:
    if p.device not in ("gpu", "cpu"):
        raise PresetError(f"{where}: device = {p.device!r}; use 'gpu' or 'cpu'")
    if p.rank < 0:
        raise PresetError(f"{where}: rank = {p.rank} must be 0 or more")
    if p.max_pixels < MIN_PIXELS:
        raise PresetError(f"{where}: max_pixels = {p.max_pixels} is below {MIN_PIXELS} (64x64)")
    if not 1 <= p.max_batch <= 64:
        raise PresetError(f"{where}: max_batch = {p.max_batch} must be from 1 to 64")
    if p.upscaler not in UPSCALERS:
        raise PresetError(f"{where}: upscaler = {p.upscaler!r}; available: {', '.join(UPSCALERS)}")
    if p.device == "cpu" and p.memory.offload != "none":
        raise PresetError(f"{where}: memory.offload = {p.memory.offload!r} with device 'cpu': there is nothing to offload to; use 'none'")
    if p.device == "cpu" and p.memory.attention == "xformers":
        raise PresetError(f"{where}: memory.attention = 'xformers' needs a CUDA GPU, not device 'cpu'")
    if p.vqgan.cutn_chunk < 1 or p.vqgan.max_pixels < MIN_PIXELS:
        raise PresetError(f"{where}: vqgan.cutn_chunk must be >= 1 and vqgan.max_pixels >= {MIN_PIXELS}")


def load_preset_file(path: str | Path) -> Preset:
    path = Path(path)
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise PresetError(f"cannot read preset {path}: {exc.strerror or exc}") from exc
    except tomllib.TOMLDecodeError as exc:
        raise PresetError(f"{path}: not valid TOML ({exc})") from exc
    preset = parse_preset(path.stem, data, str(path))
    return Preset(**{**preset.__dict__, "path": path})


def load_presets(directory: str | Path | None = None) -> dict[str, Preset]:
    """All presets of a folder, by name, in ladder order (fastest first)."""
    directory = Path(directory) if directory else presets_dir()
    found = [load_preset_file(p) for p in sorted(directory.glob("*.toml"))]
    return {p.name: p for p in sorted(found, key=lambda p: (p.device == "cpu", p.rank, p.name))}


def find_preset(spec: str, directory: str | Path | None = None) -> Preset:
    """`--preset NAME|PATH`: a shipped/user preset by name, or a TOML file by path."""
    if spec.endswith(".toml") or "/" in spec or "\\" in spec:
        return load_preset_file(spec)
    presets = load_presets(directory)
    if spec not in presets:
        raise PresetError(f"unknown preset {spec!r}; available: {', '.join(presets)} (or a path to a .toml file)")
    return presets[spec]


def gpu_ladder(presets: dict[str, Preset]) -> list[Preset]:
    """GPU presets, fastest first: the order the retry ladder steps down."""
    return [p for p in presets.values() if p.device == "gpu"]
