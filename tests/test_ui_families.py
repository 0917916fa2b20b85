"""The 2026 families in the web UI (issue 30: "each family generates from ... the UI (model picker, browser test for
at least Qwen-Image)").

The Model box lists the families' folders of the models folder (models/discover.py, ui/pickers.py); picked there,
each generates what plain diffusers makes from its folder (gradio_client, as the UI's own event runs it): txt2img, and
for the editing models that need a reference image (Qwen-Image-Edit, Edit-Plus) the img2img tab's edit of its init image
(their reference sizes 64x64: family_folders.small_references). In the
browser (Debian's Chromium, tests/ui_helpers.py): Qwen-Image picked in the Model box after Refresh, generated, its
image and infotext shown; the controls that do not apply to it (clip skip, variation seed) say so in one line in
What ran, never a traceback. Seeded random weights: the images are noise.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from family_folders import BUILDERS, EDIT_ONLY, family_folders, plain_image, small_references
from PIL import Image
from ui_helpers import _fill_job, _gallery_image, _set_slider, browser, needs_browser, page, server  # noqa: F401

folders = family_folders("ui-models")

MAX_DIFF = 2  # of 255
PIPES: dict = {}  # plain diffusers' pipelines, one per folder (family_folders.plain_image)


@pytest.fixture(autouse=True)
def _small_references(monkeypatch):
    small_references(monkeypatch)


def plain(folder: str, seed: int, cfg: float, **kw) -> np.ndarray:
    """Plain diffusers' image, the CFG as the family's call takes it (Qwen-Image: true CFG with the blank negative)."""
    return plain_image(PIPES, folder, seed, cfg, **kw)


@pytest.fixture()
def models_root(folders, monkeypatch) -> Path:
    root = Path(next(iter(folders.values()))).parent
    monkeypatch.setenv("LOWVRAM_GEN_MODELS", str(root))  # the server runs in this process
    return root


def test_the_model_list_has_every_family_folder(models_root, folders):
    from lowvram_gen.models.discover import model_choices

    listed = model_choices()
    assert all(folders[key] in listed for key in BUILDERS)


@pytest.mark.parametrize("key", [key for key in BUILDERS if key not in EDIT_ONLY])
def test_each_family_picked_in_the_model_box_generates_as_plain_diffusers(key, server, models_root, folders):
    """The UI's /generate event with the Model box set to the family's folder (what picking it sends)."""
    from gradio_client import Client

    gallery, info, summary, seed = Client(server.url, verbose=False).predict(
        prompt="a lighthouse", model=folders[key], width=64, height=64, steps=2, cfg_scale=4, seed=31,
        api_name="/generate")
    assert len(gallery) == 1 and "Traceback" not in summary and "finished at" in summary
    made = _newest(server.outdir, 31)
    ours = np.asarray(Image.open(made).convert("RGB"), dtype=int)
    theirs = plain(folders[key], 31, 4.0, prompt="a lighthouse", width=64, height=64, num_inference_steps=2)
    assert np.abs(ours - theirs).max() <= MAX_DIFF
    assert f"Model: {folders[key]}," in info and "CFG scale: 4," in info


@pytest.mark.parametrize("key", EDIT_ONLY)
def test_an_editing_model_picked_in_the_img2img_tab_edits_its_init_image_as_plain_diffusers(key, server, models_root,
                                                                                           folders, tmp_path):
    """The img2img tab's /img2img event with the Model box set to an editing model that needs a reference image: the
    init image is what it edits (the strength unused), as its pipeline edits it."""
    from gradio_client import Client, handle_file

    source = tmp_path / "init.png"
    Image.fromarray(np.random.default_rng(3).integers(0, 255, (64, 64, 3), dtype=np.uint8)).save(source)
    gallery, info, summary, _ = Client(server.url, verbose=False).predict(
        init_image=handle_file(str(source)), prompt="make it blue", strength=0.5, width=64, height=64, steps=2,
        cfg_scale=4, seed=33, sampler="default", model=folders[key], api_name="/img2img")
    assert len(gallery) == 1 and "Traceback" not in summary and "Reference images: " in info
    ours = np.asarray(Image.open(_newest(server.outdir, 33)).convert("RGB"), dtype=int)
    theirs = plain(folders[key], 33, 4.0, prompt="make it blue", width=64, height=64, num_inference_steps=2,
                   references=[Image.open(source).convert("RGB")])
    assert np.abs(ours - theirs).max() <= MAX_DIFF


def _newest(outdir: Path, seed: int) -> Path:
    return max(outdir.rglob(f"*-{seed}-*.png"), key=lambda p: p.stat().st_mtime_ns)


@needs_browser
def test_pick_qwen_image_in_the_model_box_generate_and_see_its_image_and_infotext(page, server, models_root, folders):
    page.click("#model-refresh")
    page.locator("#model input").first.click()
    page.get_by_role("option", name=folders["qwen-image"], exact=True).click()
    _fill_job(page, "a lighthouse", 64, 64, 2)
    _set_slider(page, "cfg", 4)
    _set_slider(page, "clip-skip", 2)  # A1111's clip skip: Qwen-Image has no CLIP encoder
    page.locator("#seed input").first.fill("41")
    page.click("#generate")
    image = _gallery_image(page)
    page.wait_for_function("() => document.querySelector('#info textarea').value.includes('Seed: 41')",
                           timeout=120_000)
    assert image.evaluate("img => [img.naturalWidth, img.naturalHeight]") == [64, 64]
    info = page.locator("#info textarea").input_value()
    assert info.startswith("a lighthouse") and f"Model: {folders['qwen-image']}," in info and "CFG scale: 4," in info
    summary = page.locator("#summary textarea").input_value()
    assert "Traceback" not in summary and "finished at" in summary
    assert "clip skip 2 is not used: QwenImagePipeline encodes its prompts itself" in summary
    made = _newest(server.outdir, 41)
    ours = np.asarray(Image.open(made).convert("RGB"), dtype=int)
    theirs = plain(folders["qwen-image"], 41, 4.0, prompt="a lighthouse", width=64, height=64, num_inference_steps=2)
    assert np.abs(ours - theirs).max() <= MAX_DIFF
    _set_slider(page, "clip-skip", 1)


def test_a_negative_prompt_a_family_has_none_for_is_one_line_in_what_ran(server, models_root, folders):
    """Flux.2 Klein's call takes no negative prompt: the UI's job runs and What ran says it was ignored."""
    from gradio_client import Client

    gallery, _, summary, _ = Client(server.url, verbose=False).predict(
        prompt="a lighthouse", negative_prompt="fog", model=folders["flux2-klein"], width=64, height=64, steps=2,
        seed=32, api_name="/generate")
    assert len(gallery) == 1 and "Traceback" not in summary
    assert "Flux2KleinPipeline does not use a negative prompt (Flux.2 Klein has none): it is ignored" in summary
