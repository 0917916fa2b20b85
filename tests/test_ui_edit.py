"""The web UI's img2img tab with an editing model (issue 30, editing models): the init image is the reference image
the model edits (engines/sd/edit.img2img_as_edit), through the tab's own handler on a running server: called as
Gradio's client calls it (its `/img2img` endpoint, the API order of the tab's inputs), and in the browser (chromium:
the model typed into the tab's Model box, the init image uploaded, Ctrl+Enter)."""

from __future__ import annotations

import numpy as np
import pytest
from PIL import Image
from ui_helpers import _set_slider, browser, needs_browser, page, server  # noqa: F401  (fixtures)

from lowvram_gen.outputs import parse_a1111_parameters


@pytest.fixture(scope="module")
def kontext(tmp_path_factory) -> str:
    from tiny_edit import build_tiny_kontext

    folder = tmp_path_factory.mktemp("tiny-kontext")
    build_tiny_kontext().save_pretrained(folder, safe_serialization=True)
    return str(folder)


def test_img2img_tab_with_an_editing_model_edits_the_init_image(server, kontext, tmp_path):  # noqa: F811
    import diffusers
    import torch
    from gradio_client import Client, handle_file

    folder = kontext
    source = tmp_path / "init.png"
    Image.fromarray(np.random.default_rng(1).integers(0, 255, (64, 64, 3), dtype=np.uint8)).save(source)
    client = Client(server.url, verbose=False)
    gallery, info, summary, _ = client.predict(init_image=handle_file(str(source)), prompt="make it blue",
                                               strength=0.5, width=64, height=64, steps=2, cfg_scale=2.5, seed=4,
                                               sampler="default", model=str(folder), api_name="/img2img")
    params = parse_a1111_parameters(info)
    assert params["Reference images"].endswith(".png")  # the upload, under the name Gradio stored it as
    assert "Denoising strength" not in params  # an edit: the strength is not used
    assert len(gallery) == 1
    pipe = diffusers.FluxKontextPipeline.from_pretrained(folder)
    pipe.set_progress_bar_config(disable=True)
    # Kontext's preferred resolutions resize a 64x64 reference to 1024x1024, as the server's job did
    theirs = pipe(image=Image.open(source).convert("RGB"), prompt="make it blue", width=64, height=64,
                  max_area=64 * 64, num_inference_steps=2, guidance_scale=2.5,
                  generator=torch.Generator().manual_seed(4)).images[0]
    image = gallery[0]["image"] if isinstance(gallery[0], dict) else gallery[0]
    path = image if isinstance(image, str) else image.get("path")
    ours = np.asarray(Image.open(path).convert("RGB"), dtype=int)
    assert np.abs(ours - np.asarray(theirs, dtype=int)).max() <= 2


@needs_browser
def test_the_img2img_tab_in_the_browser_edits_with_an_editing_model(page, kontext, tmp_path):  # noqa: F811
    source = tmp_path / "init.png"
    Image.fromarray(np.random.default_rng(2).integers(0, 255, (64, 64, 3), dtype=np.uint8)).save(source)
    page.get_by_role("tab", name="img2img").click()
    page.locator("#i2i-init input[type=file]").first.set_input_files(str(source))
    page.locator("#i2i-init img").first.wait_for(timeout=30_000)
    page.locator("#i2i-model input").first.fill(kontext)
    page.locator("#i2i-model input").first.press("Enter")
    page.locator("#i2i-prompt textarea").fill("make it blue")
    _set_slider(page, "i2i-steps", 1)
    page.locator("#i2i-prompt textarea").press("Control+Enter")
    page.locator("#i2i-gallery img").first.wait_for(timeout=180_000)
    page.wait_for_function("() => document.querySelector('#i2i-info textarea') &&"
                           " document.querySelector('#i2i-info textarea').value.includes('Reference images')",
                           timeout=60_000)
    info = page.locator("#i2i-info textarea").input_value()
    assert info.startswith("make it blue") and "Denoising strength" not in info
