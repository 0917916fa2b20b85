"""Test utility: the tiny seeded folder of every 2026 family that has a record (issue 30), built once per test module
into one models folder, as a user keeps them (`<root>/<family key>/model_index.json`).

The builders are the families' own test utilities (tests/tiny_qwen.py, tiny_flux2.py, tiny_zimage.py, tiny_dit.py,
tiny_flux2_dev.py, tiny_hidream.py, tiny_cogview4.py, tiny_bria.py, tiny_edit.py): diffusers' own test shapes, seeded,
offline. Flux.2 Klein 9B's folder is the step-distilled Klein (as the 9B is; the 4B base folder runs CFG): a loaded
Klein pipeline is the 4B record's, the two differ in no execution fact (families/records_flux2.py), so it is read as
`flux2-klein` (READ_AS). `plain_image` is plain diffusers' image from one of them, the call as the family takes it. `family_folders()` makes a module-scoped `folders` fixture:
{family key: folder path}. Not a test module: test modules import from here, never from each other.
"""

from __future__ import annotations

import json

import pytest
from functools import partial

from tiny_bria import build_tiny_bria
from tiny_cogview4 import build_tiny_cogview4
from tiny_dit import build_tiny_chroma, build_tiny_lumina2, build_tiny_sana
from tiny_edit import build_tiny_kontext, build_tiny_qwen_image_edit
from tiny_flux2 import build_tiny_flux2_klein
from tiny_flux2_dev import build_tiny_flux2_dev
from tiny_hidream import build_tiny_hidream
from tiny_qwen import build_tiny_qwen_image
from tiny_zimage import build_tiny_zimage

# family key (families/records_*.py) -> the builder of its tiny pipeline
BUILDERS = {
    "qwen-image": build_tiny_qwen_image,
    "z-image": build_tiny_zimage,
    "flux2-klein": build_tiny_flux2_klein,
    "sana": build_tiny_sana,
    "chroma": build_tiny_chroma,
    "lumina2": build_tiny_lumina2,
    "flux2-dev": build_tiny_flux2_dev,
    "flux2-klein-9b": partial(build_tiny_flux2_klein, distilled=True),
    "hidream": build_tiny_hidream,
    "cogview4": build_tiny_cogview4,
    "bria": build_tiny_bria,
    "flux-kontext": build_tiny_kontext,
    "qwen-image-edit": build_tiny_qwen_image_edit,
    "qwen-image-edit-plus": partial(build_tiny_qwen_image_edit, plus=True),
}
# a folder whose pipeline class is another key's record (see the module doc)
READ_AS = {"flux2-klein-9b": "flux2-klein"}
# the editing models that need a reference image: no txt2img (families/records_qwen_edit.py)
EDIT_ONLY = ("qwen-image-edit", "qwen-image-edit-plus")


def record_of(folder: str):
    """The family record the folder's pipeline class is."""
    from pathlib import Path

    from lowvram_gen import families

    return families.by_pipeline(json.loads((Path(folder) / "model_index.json").read_text())["_class_name"])


def family_folders(name: str = "family-models", keys=tuple(BUILDERS)):
    """A module-scoped fixture: the tiny folders of `keys` saved under one temporary models folder."""

    @pytest.fixture(scope="module")
    def folders(tmp_path_factory) -> dict[str, str]:
        root = tmp_path_factory.mktemp(name)
        out = {}
        for key in keys:
            BUILDERS[key]().save_pretrained(root / key, safe_serialization=True)
            assert record_of(str(root / key)).key == READ_AS.get(key, key)  # the folder is read as its family
            out[key] = str(root / key)
        return out

    return folders


SMALL_REFERENCE = 64 * 64  # pixels


def small_references(monkeypatch) -> None:
    """The editing pipelines' reference-image sizes made 64x64 in diffusers' modules, for ours and plain diffusers'
    alike: they resize every reference image to about 1024x1024 pixels before their VAE encodes it (Kontext to its
    preferred resolutions), a minute a call on a CPU for Qwen-Image-Edit's video-style VAE. What is compared is
    unchanged: the same pipeline code, called by us and by hand."""
    import diffusers.pipelines.flux.pipeline_flux_kontext as kontext
    import diffusers.pipelines.qwenimage.pipeline_qwenimage_edit as edit
    import diffusers.pipelines.qwenimage.pipeline_qwenimage_edit_inpaint as edit_inpaint
    import diffusers.pipelines.qwenimage.pipeline_qwenimage_edit_plus as plus

    original = edit.calculate_dimensions
    monkeypatch.setattr(edit, "calculate_dimensions", lambda _area, ratio: original(SMALL_REFERENCE, ratio))
    # Qwen-Image-Edit's inpaint renders that area too (our plan and result read the same function)
    monkeypatch.setattr(edit_inpaint, "calculate_dimensions", lambda _area, ratio: original(SMALL_REFERENCE, ratio))
    monkeypatch.setattr(plus, "VAE_IMAGE_SIZE", SMALL_REFERENCE)
    monkeypatch.setattr(plus, "CONDITION_IMAGE_SIZE", SMALL_REFERENCE)
    monkeypatch.setattr(kontext, "PREFERRED_KONTEXT_RESOLUTIONS", [(64, 64), (96, 64), (64, 96)])


def plain_image(pipes: dict, folder: str, seed: int, cfg: float, negative: str | None = None, task: str = "txt2img",
                references: list | None = None, **kw):
    """Plain diffusers' image (int RGB) for our job, from the folder's pipeline loaded as a user would (from_pretrained;
    the task's pipeline with from_pipe), kept in `pipes`: the CFG as the family's call takes it (Qwen-Image and its
    edit models: `true_cfg_scale`, with the model card's blank negative where none is given), the negative prompt
    where the call takes one, an edit's reference images (one image or a list, as the call takes them) and the output
    area where the call rescales the asked size (Kontext's `max_area`: the asked one)."""
    import diffusers
    import numpy as np
    import torch

    record = record_of(folder)
    if (folder, "txt2img") not in pipes:
        pipes[folder, "txt2img"] = diffusers.DiffusionPipeline.from_pretrained(folder)
    if (folder, task) not in pipes:
        pipes[folder, task] = getattr(diffusers, record.pipeline_for(task)).from_pipe(pipes[folder, "txt2img"])
    pipe = pipes[folder, task]
    pipe.set_progress_bar_config(disable=True)
    call, edit = record.call, record.edit
    if call.cfg_argument == "true_cfg_scale":
        kw.update(true_cfg_scale=cfg, negative_prompt=negative or call.blank_negative)
    else:
        kw.update(guidance_scale=cfg)
        if negative and call.takes_negative_prompt:
            kw["negative_prompt"] = negative
    if edit is not None and edit.max_area_argument:
        kw[edit.max_area_argument] = kw["width"] * kw["height"]
    if references:
        kw[edit.argument] = references[0] if edit.max_images == 1 else list(references)
    image = pipe(generator=torch.Generator().manual_seed(seed), **kw).images[0]
    return np.asarray(image.convert("RGB"), dtype=int)
