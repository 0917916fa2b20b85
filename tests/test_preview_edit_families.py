"""Live previews of the editing models (Qwen-Image-Edit, Qwen-Image-Edit-Plus, FLUX.1 Kontext, Flux.2 Klein and
Flux.2 dev with reference images): each tiny folder (tests/tiny_edit.py, tiny_flux2.py, tiny_flux2_dev.py) edited
through the session with previews every step gives one preview a step, of the asked size, made from the latents the
pipeline's own step ends with (checked against plain diffusers' callback at the same seed), unpacked as that
pipeline packs them (checked against its own pack functions). The reference images' latents are joined to the
image's only inside a step, so what a step ends with is the output image's alone. Seeded random weights: the images
are noise.

The pipelines resize every reference image to about 1024x1024 pixels before their VAE encodes it: `small_refs`
makes those sizes 64x64 in diffusers' modules for both sides of every comparison, as tests/test_family_edit.py does.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from PIL import Image
from preview_checks import distinct_colours, tiny_channels

from lowvram_gen import GenerationRequest, families, preview
from lowvram_gen.session import Session

WIDTH, HEIGHT = 96, 64  # not square: rows and columns swapped would show


@pytest.fixture(autouse=True)
def small_refs(monkeypatch):
    import diffusers.pipelines.flux.pipeline_flux_kontext as kontext
    import diffusers.pipelines.qwenimage.pipeline_qwenimage_edit as edit
    import diffusers.pipelines.qwenimage.pipeline_qwenimage_edit_plus as plus

    original = edit.calculate_dimensions
    monkeypatch.setattr(edit, "calculate_dimensions", lambda _area, ratio: original(64 * 64, ratio))
    for name in ("VAE_IMAGE_SIZE", "CONDITION_IMAGE_SIZE"):
        monkeypatch.setattr(plus, name, 64 * 64)
    monkeypatch.setattr(kontext, "PREFERRED_KONTEXT_RESOLUTIONS", [(64, 64), (96, 64), (64, 96)])


def _qwen_edit(plus: bool):
    from tiny_edit import build_tiny_qwen_image_edit

    return build_tiny_qwen_image_edit(plus=plus)


def _kontext():
    from tiny_edit import build_tiny_kontext

    return build_tiny_kontext()


def _klein():
    from tiny_flux2 import build_tiny_flux2_klein

    return build_tiny_flux2_klein()


def _flux2_dev():
    from tiny_flux2_dev import build_tiny_flux2_dev

    return build_tiny_flux2_dev()


# family key -> (builder, reference images, what plain diffusers is called with for `--cfg 4`)
EDITS = {
    "qwen-image-edit": (lambda: _qwen_edit(False), 1, {"true_cfg_scale": 4.0, "negative_prompt": " "}),
    "qwen-image-edit-plus": (lambda: _qwen_edit(True), 2, {"true_cfg_scale": 4.0, "negative_prompt": " "}),
    "flux-kontext": (_kontext, 1, {"guidance_scale": 4.0, "max_area": WIDTH * HEIGHT}),
    "flux2-klein": (_klein, 2, {"guidance_scale": 4.0}),
    "flux2-dev": (_flux2_dev, 2, {"guidance_scale": 4.0}),
}
FORMAT = {"qwen-image-edit": "wan21", "qwen-image-edit-plus": "wan21", "flux-kontext": "flux", "flux2-klein": "flux2",
          "flux2-dev": "flux2"}


@pytest.fixture(scope="module")
def refs(tmp_path_factory) -> list[str]:
    path = tmp_path_factory.mktemp("refs")
    rng = np.random.default_rng(0)
    out = []
    for i, (w, h) in enumerate([(96, 64), (64, 64)]):
        Image.fromarray(rng.integers(0, 255, (h, w, 3), dtype=np.uint8)).save(path / f"ref{i}.png")
        out.append(str(path / f"ref{i}.png"))
    return out


@pytest.fixture(scope="module", params=list(EDITS))
def edit_folder(request, tmp_path_factory):
    key = request.param
    folder = tmp_path_factory.mktemp(f"tiny-{key}")
    EDITS[key][0]().save_pretrained(folder, safe_serialization=True)
    return key, str(folder)


def plain_latents(folder: str, images: list, call: dict) -> tuple:
    """Plain diffusers' pipeline and the first image's latents at the end of each step of its run of the edit."""
    import diffusers

    pipe = diffusers.DiffusionPipeline.from_pretrained(folder)
    pipe.set_progress_bar_config(disable=True)
    seen = []

    def step_end(_pipe, _i, _t, kwargs):
        seen.append(kwargs["latents"][:1].detach().float().clone())
        return kwargs

    image = images[0] if len(images) == 1 else images
    pipe(prompt="make it blue", image=image, width=WIDTH, height=HEIGHT, num_inference_steps=2,
         generator=torch.Generator().manual_seed(5), callback_on_step_end=step_end, **call)
    return pipe, seen


def test_each_edit_model_has_its_familys_preview_format():
    for key, fmt in FORMAT.items():
        record = families.by_key(key)
        assert record.latent_format == fmt and record.packed_latents, key


def test_an_edit_gives_a_preview_a_step_of_the_asked_size_from_the_pipelines_own_latents(edit_folder, refs, tmp_path,
                                                                                         monkeypatch):
    key, folder = edit_folder
    _build, count, call = EDITS[key]
    tiny_channels(monkeypatch, folder)
    posted, shown = [], []
    real_post = preview.Previews.post
    monkeypatch.setattr(preview.Previews, "post", lambda self, latents, *a: posted.append(latents.clone())
                        or real_post(self, latents, *a))
    request = GenerationRequest(prompt="make it blue", model=folder, width=WIDTH, height=HEIGHT, steps=2, seed=5,
                                cfg_scale=4.0, outdir=str(tmp_path), reference_images=tuple(refs[:count]))
    session = Session(device="cpu")
    session.generate(request, on_preview=lambda image, step, total: shown.append((image, step, total)),
                     preview_every=1, preview_method="auto")
    assert [(step, total) for _, step, total in shown] == [(1, 2), (2, 2)]
    pipe, theirs = plain_latents(folder, [Image.open(p).convert("RGB") for p in refs[:count]], call)
    assert len(posted) == len(theirs) == 2
    render, how = preview.renderer(pipe, "approx")  # plain diffusers' pipeline: the family's format, unpacked
    for (image, _, _), ours, plain in zip(shown, posted, theirs):
        assert ours.shape == plain.shape  # the output image's tokens only, not the reference images'
        assert torch.allclose(ours, plain, atol=1e-4), key
        assert image.mode == "RGB" and image.size == (WIDTH, HEIGHT)
        assert distinct_colours(image) > 4  # a picture of the latents, not one flat colour
        expected = np.asarray(render(plain, WIDTH, HEIGHT), dtype=int)
        assert np.abs(np.asarray(image, dtype=int) - expected).max() <= 1, key
