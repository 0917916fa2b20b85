"""Finding a family's record: by pipeline class (a loaded pipeline, or model_index.json's _class_name), by a
short name or built-in architecture, by a single file's keys, by its denoiser's or ControlNet's class.

The registry starts with `records.FAMILIES`; `register` (or the `registered` context manager, for tests) adds a
record in front of them, so a new family is a record plus its tests. A pipeline no record claims gets
`records.GENERIC`, which behaves as the code did before there were records.
"""

from __future__ import annotations

import contextlib
from typing import Iterator, Mapping

from lowvram_gen.families.record import GENERIC_KEY, Family
from lowvram_gen.families.records import FAMILIES, GENERIC

_registry: list[Family] = list(FAMILIES)


def all_families() -> tuple[Family, ...]:
    """Every registered record, in lookup order (GENERIC not among them)."""
    return tuple(_registry)


def register(record: Family) -> None:
    """Add `record` in front of the others (it wins where it claims what another does); one key once."""
    if record.key == GENERIC_KEY or any(r.key == record.key for r in _registry):
        raise ValueError(f"a family {record.key!r} is already registered")
    _registry.insert(0, record)


def unregister(key: str) -> None:
    """Remove the record `key` (a test's, or one added by `register`)."""
    _registry[:] = [r for r in _registry if r.key != key]


@contextlib.contextmanager
def registered(record: Family) -> Iterator[Family]:
    """`record` registered inside the block, removed after it whatever happens."""
    register(record)
    try:
        yield record
    finally:
        unregister(record.key)


def by_key(key: str) -> Family:
    """The record `key` ('sd15', 'flux', ...); GENERIC for 'generic'. KeyError for an unknown key."""
    if key == GENERIC_KEY:
        return GENERIC
    for record in _registry:
        if record.key == key:
            return record
    raise KeyError(key)


def find_pipeline(class_name: str) -> Family | None:
    """The record that claims the pipeline class `class_name` (exact name), or None."""
    return _first(lambda r: class_name in r.tasks.values() or class_name in r.other_pipelines)


def by_pipeline(class_name: str) -> Family:
    """The record of the pipeline class `class_name`; GENERIC when none claims it."""
    return find_pipeline(str(class_name or "")) or GENERIC


def of_pipe(pipe) -> Family:
    """The record of a loaded pipeline object: its class, else the nearest base class a record claims (a
    subclass of StableDiffusionPipeline is SD's); GENERIC when none does."""
    for cls in type(pipe).__mro__:
        found = find_pipeline(cls.__name__)
        if found is not None:
            return found
    return GENERIC


def by_name(name: str) -> Family | None:
    """The built-in record a short name, alias or hub id names ('sd1.5', 'flux-dev', ...; case-insensitive)."""
    text = str(name).strip().lower()
    for record in _registry:
        if record.builtin and (text == record.builtin or text in (a.lower() for a in record.aliases)):
            return record
    return None


def by_arch(arch: str) -> Family:
    """The record of a profile's architecture (a built-in key such as 'sdxl'); GENERIC for 'custom' and others."""
    for record in _registry:
        if record.builtin and record.builtin == arch:
            return record
    return GENERIC


def builtin_families() -> tuple[Family, ...]:
    """The records `plan` knows offline (with shipped configs), in lookup order."""
    return tuple(r for r in _registry if r.builtin)


def builtin_names() -> tuple[str, ...]:
    return tuple(r.builtin for r in builtin_families())


def aliases() -> dict[str, str]:
    """Every short name (lower case) -> its built-in architecture."""
    out: dict[str, str] = {}
    for record in builtin_families():
        for alias in (record.builtin, *record.aliases):
            out.setdefault(alias.lower(), record.builtin)
    return out


def _first(claims) -> Family | None:
    """The first registered record for which `claims(record)` is true (None: none)."""
    return next((record for record in _registry if claims(record)), None)


def by_checkpoint(shapes: Mapping[str, tuple]) -> Family | None:
    """The record whose whole original-layout file these {key: shape} are (None: no record's)."""
    return _first(lambda r: bool(r.single_file and r.single_file.checkpoint_match
                                 and r.single_file.checkpoint_match(shapes)))


def by_gguf(shapes: Mapping[str, tuple]) -> Family | None:
    """The record whose denoiser a GGUF file holds, from its {key: shape} (UNet prefix added); None: no record's."""
    return _first(lambda r: bool(r.single_file and r.single_file.gguf_match and r.single_file.gguf_match(shapes)))


def by_single_file_pipeline(class_name: str) -> Family | None:
    """The record whose single files build the pipeline `class_name` (the first: SD 1.5 for SD 1.x/2.x)."""
    return _first(lambda r: bool(r.single_file and r.single_file.pipeline == class_name))


def by_denoiser_class(class_name: str) -> Family | None:
    """The first record whose denoiser is of class `class_name` (None: no record's)."""
    return _first(lambda r: class_name in r.denoiser_classes)


def by_controlnet_class(class_name: str) -> Family | None:
    """The first record whose ControlNets are of class `class_name`."""
    return _first(lambda r: bool(r.controlnet and r.controlnet.model_class == class_name))


def controlnet_kinds() -> dict[str, Family]:
    """ControlNet kind ('sd', 'sd3', 'flux') -> the first record of that kind."""
    out: dict[str, Family] = {}
    for record in _registry:
        if record.controlnet:
            out.setdefault(record.controlnet.kind, record)
    return out


def by_unet_cross_attention(width: int) -> Family | None:
    """The UNet family of a cross-attention width (768 SD 1.x, 1024 SD 2.x, 2048 SDXL)."""
    return _first(lambda r: bool(r.unet_cross_attention) and r.unet_cross_attention == int(width))


def family_name(class_name: str) -> str:
    """How a message names the family of the pipeline class `class_name` ('SDXL'; the class itself when unknown)."""
    return by_pipeline(class_name).name or str(class_name)
