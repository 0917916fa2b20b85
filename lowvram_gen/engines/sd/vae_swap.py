"""The job's VAE on the loaded pipeline (A1111's "SD VAE", `--vae`, the API's `sd_vae`), without reloading the model.

A VAE file (models/vae.py) replaces the pipeline's `vae` component; the model's own is kept beside the pipeline (on
the CPU) and put back when a job asks for it ("Automatic" or "None"). The VAE read from its file is whole (float32):
the runner's next `use` applies the preset to it as to any component (its dtype, offload, slicing and tiling), and
a rung that wants precision back reads it again from its file, not the model's (`reload_file`).
"""

from __future__ import annotations

import logging
from pathlib import Path

from lowvram_gen.engines.sd import apply as apply_mod
from lowvram_gen.errors import InvalidRequest
from lowvram_gen.models import vae as vae_files

log = logging.getLogger(__name__)

_ON = "_lowvram_vae"  # on the pipeline: the Stamp of the VAE file in its `vae` (absent: the model's own)
_OWN = "_lowvram_own_vae"  # the model's own VAE, kept while a file's is on


def use(runner, name: str) -> tuple[str, str] | None:
    """Put the VAE `name` asks for on `runner`'s pipeline (the model's own for "Automatic"/"None"); returns the
    (name, hash) the PNG writes for a VAE file, None for the model's own. A changed VAE leaves the runner's settings
    unapplied, so its next `use` applies the preset to the pipeline with it."""
    pipe = runner.model.pipe
    path = None if vae_files.is_own(name) else vae_files.find(name)
    if path is not None and not hasattr(getattr(pipe, "vae", None), "decode"):
        raise InvalidRequest("VAE", name, f"{type(pipe).__name__} has no VAE to replace")
    wanted = vae_files.Stamp.of(path) if path is not None else None
    if pipe.__dict__.get(_ON) != wanted:
        _swap(runner, path, wanted)
    return None if path is None else (vae_files.name_of(path), vae_files.short_hash(path))


def _swap(runner, path: Path | None, wanted: vae_files.Stamp | None) -> None:
    pipe = runner.model.pipe
    own = pipe.__dict__.get(_OWN)
    config = (own if own is not None else pipe.vae).config
    module = vae_files.load(path, config) if path is not None else own  # read before anything changes
    runner.ops_factory(pipe).reset()  # offload hooks off the VAE that goes (the preset goes on again after)
    outgoing = pipe.vae
    if own is None:
        pipe.__dict__[_OWN] = outgoing.to("cpu")  # off the device while it waits
    pipe.register_modules(vae=module)
    if wanted is None:
        pipe.__dict__.pop(_OWN, None)
        pipe.__dict__.pop(_ON, None)
    else:
        pipe.__dict__[_ON] = wanted
    if not apply_mod.component_swapped(pipe, "vae"):  # the model's own came back with casting it no longer has
        from lowvram_gen.models.loading import reload_components

        reload_components(runner.model, ["vae"], "float32")
        apply_mod.forget_components(pipe, ["vae"])
    runner.applied = None
    runner.forget_img2img()  # the img2img/inpaint pipelines made over the components hold the old VAE
    log.info("VAE: %s", wanted.path if wanted else "the model's own")


def reload_file(runner, names: list[str]) -> list[str]:
    """`names` (what needs its precision back) less the VAE where a file's is on: that one is read again from its
    file here (the model's files hold another VAE)."""
    pipe = runner.model.pipe
    stamp = pipe.__dict__.get(_ON)
    if stamp is None or "vae" not in names:
        return names
    log.info("reloading VAE %s from its file to restore its precision", stamp.path)
    pipe.register_modules(vae=vae_files.load(Path(stamp.path), pipe.vae.config))
    apply_mod.component_swapped(pipe, "vae")  # whole again; under half storage it gets its casting hooks
    runner.forget_img2img()
    return [n for n in names if n != "vae"]

