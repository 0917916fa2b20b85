"""Live previews of the 2026 families (lowvram_gen/preview.py): each tiny folder's run (tests/tiny_qwen.py, tiny_flux2.py,
tiny_zimage.py, tiny_dit.py) gives approximation previews of the image's size from the latents its denoiser holds
(Qwen-Image's and Flux.2's packed into a sequence, Z-Image's and Lumina 2's on their grid); SANA, whose latents have no
published map to RGB, gives none; TAESD, which no family here has a known decoder for, is refused in one sentence.
The packings are checked against diffusers' own
pack functions. Seeded random weights: the images are noise.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
import torch
from preview_checks import tiny_channels
from tiny_dit import BUILDERS
from tiny_flux2 import build_tiny_flux2_klein
from tiny_qwen import build_tiny_qwen_image
from tiny_zimage import build_tiny_zimage

from lowvram_gen import GenerationRequest, families, preview
from lowvram_gen.errors import InvalidRequest
from lowvram_gen.session import Session

BUILD = {"qwen-image": build_tiny_qwen_image, "flux2-klein": build_tiny_flux2_klein, "z-image": build_tiny_zimage,
         "chroma": BUILDERS["chroma"], "lumina2": BUILDERS["lumina2"], "sana": BUILDERS["sana"]}
FORMAT = {"qwen-image": "wan21", "flux2-klein": "flux2", "z-image": "flux", "chroma": "flux", "lumina2": "flux",
          "sana": None}


@pytest.fixture(scope="module")
def folders(tmp_path_factory) -> dict[str, str]:
    out = {}
    for key, build in BUILD.items():
        folder = tmp_path_factory.mktemp(f"tiny-{key}")
        build().save_pretrained(folder, safe_serialization=True)
        out[key] = str(folder)
    return out


def run(folder: str, tmp_path, method: str = "approx") -> list:
    shown = []
    request = GenerationRequest(prompt="a lighthouse", model=folder, width=96, height=64, steps=2, cfg_scale=2.0,
                                seed=5, outdir=str(tmp_path))
    Session(device="cpu").generate(request, on_preview=lambda image, step, total: shown.append((image, step, total)),
                                   preview_every=1, preview_method=method)
    return shown


@pytest.mark.parametrize("key", [k for k in BUILD if FORMAT[k]])
def test_each_familys_run_gives_approx_previews_of_the_image_size(folders, key, tmp_path, monkeypatch):
    record = families.by_key(key)
    assert record.latent_format == FORMAT[key]
    tiny_channels(monkeypatch, folders[key])
    shown = run(folders[key], tmp_path)
    assert [(step, total) for _, step, total in shown] == [(1, 2), (2, 2)]
    for image, _, _ in shown:
        assert image.mode == "RGB" and image.size == (96, 64)
        assert len(np.unique(np.asarray(image).reshape(-1, 3), axis=0)) > 4  # a picture of the latents, not one flat colour


def test_sana_has_no_preview(folders, tmp_path):
    assert families.by_key("sana").latent_format is None and run(folders["sana"], tmp_path, "auto") == []


def test_taesd_is_refused_in_one_sentence_where_no_decoder_is_known(tmp_path):
    pipe = type("QwenImagePipeline", (), {"vae_scale_factor": 8})()
    with pytest.raises(InvalidRequest, match="no TAESD decoder is known for Qwen-Image's latents: use auto or approx"):
        preview.renderer(pipe, "taesd", models=tmp_path)
    assert preview.renderer(pipe, "auto", models=tmp_path)[1] == "approx"


@pytest.mark.parametrize("pipeline", ["Flux2KleinPipeline", "Flux2Pipeline"])
def test_flux2s_patchified_packed_latents_are_unpacked_as_comfyuis_flux2_reads_them(pipeline):
    """diffusers' Flux.2 (Klein, and dev with or without reference images) patchifies 32 channels 2x2 into 128 and
    packs them into a sequence; the preview puts each of the 32 channels back on its grid (ComfyUI's Flux2
    latent_rgb_factors_reshape)."""
    import diffusers

    cls = getattr(diffusers, pipeline)
    grid = torch.randn(1, 32, 8, 12, generator=torch.Generator().manual_seed(0))  # a 64x96 image's VAE latents
    packed = cls._pack_latents(cls._patchify_latents(grid))
    assert packed.shape == (1, 4 * 6, 128)
    fmt = preview.FORMATS[families.by_pipeline(pipeline).latent_format]
    assert len(fmt.factors) == 32 and fmt.packed
    assert torch.equal(preview._unpacked(packed, fmt, 96, 64, 8), grid[0])


@pytest.mark.parametrize("pipeline, channels", [("QwenImagePipeline", 16), ("QwenImageEditPipeline", 16),
                                                 ("QwenImageEditPlusPipeline", 16), ("FluxKontextPipeline", 16)])
def test_packed_latents_are_unpacked_onto_their_grid(pipeline, channels):
    """Qwen-Image's (and its edit models') and FLUX.1 Kontext's 2x2 packing, by the pipeline's own pack function."""
    import diffusers

    grid = torch.randn(1, channels, 8, 12, generator=torch.Generator().manual_seed(1))
    packed = getattr(diffusers, pipeline)._pack_latents(grid, 1, channels, 8, 12)
    record = families.by_pipeline(pipeline)
    fmt = replace(preview.FORMATS[record.latent_format], packed=record.packed_latents)
    assert len(fmt.factors) == channels and fmt.packed
    assert torch.equal(preview._unpacked(packed, fmt, 96, 64, 8), grid[0])


@pytest.mark.parametrize("pipeline, key, channels", [("QwenImagePipeline", "wan21", 16), ("Flux2KleinPipeline", "flux2", 32),
                                                      ("ZImagePipeline", "flux", 16), ("Lumina2Pipeline", "flux", 16)])
def test_the_published_map_at_the_real_channel_count_gives_an_rgb_picture(pipeline, key, channels, tmp_path):
    """Latents of the real models' channel count, laid out as their pipelines hold them (packed for Qwen-Image and
    Flux.2, on the grid for Z-Image and Lumina 2), rendered through the family's record."""
    fmt = preview.FORMATS[key]
    assert len(fmt.factors) == channels and all(len(row) == 3 and np.isfinite(row).all() for row in fmt.factors)
    render, how = preview.renderer(type(pipeline, (), {"vae_scale_factor": 8})(), "auto", models=tmp_path)
    assert how == "approx"
    grid = torch.randn(1, channels, 8, 12, generator=torch.Generator().manual_seed(2))  # a 96x64 image's
    packed = families.by_pipeline(pipeline).packed_latents
    latents = grid.view(1, channels, 4, 2, 6, 2).permute(0, 2, 4, 1, 3, 5).reshape(1, 24, channels * 4) \
        if packed else grid
    image = render(latents, 96, 64)
    assert image.mode == "RGB" and image.size == (96, 64) and len(np.unique(np.asarray(image).reshape(-1, 3), axis=0)) > 10
