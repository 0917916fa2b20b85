"""The Steps and CFG scale sliders follow the Model box: picking a model whose family runs other defaults (Z-Image
Turbo 9 steps at CFG 0, Qwen-Image 50 at 4, Flux.2 Klein 4 at 1 ...: families/record.py `sampling`) sets the
sliders to them, as Forge sets its per-model defaults; picking another model of the same family leaves what the user
set (as A1111 keeps its sliders). The sliders start at the UI model's family's defaults.

The family is found offline and without loading anything: a local diffusers folder's model_index.json, a hub id's in
the Hugging Face cache (never downloaded here), a short name's record ('z-image'); the embedded tiny models are SD.
A single checkpoint file is not opened here: the sliders stay as they are (the job still runs its family's defaults
where a request leaves them out, as the API's does).
"""

from __future__ import annotations

from pathlib import Path

from lowvram_gen import families
from lowvram_gen.families import sampling
from lowvram_gen.families.spec import index_folder, record_of_index
from lowvram_gen.families.record import A1111_SAMPLING, Family, Sampling

TINY = ("tiny", "tiny-sdxl")  # models/tiny.py's embedded models: SD 1.x and SDXL


def sampling_of(spec) -> Sampling | None:
    """The defaults of the family of the model `spec` names, or None where it cannot be told offline."""
    text = str(spec or "").strip()
    if not text:
        return None
    if text in TINY:
        return A1111_SAMPLING
    path = Path(text).expanduser()
    if not path.is_dir() and (path.exists() or text.startswith((".", "/", "~"))):
        return None  # a single file (or a path that is not there): not read here
    folder = index_folder(text)  # a folder's model_index.json, or a hub id's in the HF cache
    facts = sampling.folder_facts(text, folder)
    record = _record(facts) or families.by_name(text)
    return record.default_sampling(facts) if record is not None else None


def _record(facts) -> Family | None:
    """The record the folder's model_index.json names (families/spec.py, as the Session asks it); a pipeline no
    record claims shows A1111's defaults (GENERIC's), as the job runs them unless its denoiser says a family."""
    if not facts.model_index:
        return None
    return record_of_index(facts.model_index) or families.GENERIC


def on_pick(spec, steps, cfg, shown: tuple | None):
    """What picking `spec` does: (steps, cfg, the defaults now shown) where its family's defaults differ from those
    of the model picked before (`shown`), else the sliders as they are."""
    found = sampling_of(spec)
    if found is None or (shown is not None and tuple(shown) == (found.steps, found.cfg)):
        return steps, cfg, shown
    return found.steps, found.cfg, (found.steps, found.cfg)


def start(model) -> Sampling:
    """The sliders' first values: the defaults of the UI model's family (A1111's where it cannot be told)."""
    return sampling_of(model) or A1111_SAMPLING


def wire(model, steps, cfg, first: Sampling) -> None:
    """Set the sliders from the Model box whenever the user picks a model (call after the three are built, the
    sliders at `first`)."""
    import gradio as gr

    shown = gr.State((first.steps, first.cfg))
    # `input`, not `change`: the user's pick only. A browser's remembered values (ui/remembered.py) and a Send to set
    # the Model box with their own steps and CFG, which a change event would overwrite
    model.input(on_pick, [model, steps, cfg, shown], [steps, cfg, shown], api_visibility="private",
                show_progress="hidden", queue=False)
