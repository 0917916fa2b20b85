"""Live previews of the 2026 families (lowvram_gen/preview.py): each tiny folder's run (tests/tiny_qwen.py, tiny_flux2.py,
tiny_zimage.py, tiny_dit.py) gives approximation previews of the image's size from the latents its denoiser holds
(Qwen-Image's and Flux.2's packed into a sequence, Z-Image's and Lumina 2's on their grid); SANA, whose latents have no
published map to RGB, gives TAESANA's where that decoder file is here and none without it; TAESD, which no other
family here has a known decoder for, is refused in one sentence.
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
          "sana": "dc-ae"}


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


@pytest.mark.parametrize("key", [k for k in BUILD if preview.FORMATS[FORMAT[k]].factors])
def test_each_familys_run_gives_approx_previews_of_the_image_size(folders, key, tmp_path, monkeypatch):
    record = families.by_key(key)
    assert record.latent_format == FORMAT[key]
    tiny_channels(monkeypatch, folders[key])
    shown = run(folders[key], tmp_path)
    assert [(step, total) for _, step, total in shown] == [(1, 2), (2, 2)]
    for image, _, _ in shown:
        assert image.mode == "RGB" and image.size == (96, 64)
        assert len(np.unique(np.asarray(image).reshape(-1, 3), axis=0)) > 4  # a picture of the latents, not one flat colour


def test_sana_previews_by_taesana_where_its_file_is_here_else_none(folders, tmp_path, monkeypatch):
    """SANA's DC-AE latents have no published map: no approximation, and no preview without madebyollin's TAESANA
    decoder (taesana_decoder.pth, the 32x "f32" TAESD); with that file in models/VAE-approx (here seeded random
    weights in its layout, the tiny VAE's channel count) each step's latents, on their grid, decode 32x and are shown
    at the asked size, one a step. SanaPipeline renders at the size its aspect-ratio table bins the asked one to (for
    96x64, 608x416) and resizes its image to the asked size: the preview is resized the same way."""
    assert families.by_key("sana").latent_format == "dc-ae"
    models = tmp_path / "models"
    monkeypatch.setenv("LOWVRAM_GEN_MODELS", str(models))
    assert run(folders["sana"], tmp_path, "auto") == [] and run(folders["sana"], tmp_path, "approx") == []
    with pytest.raises(InvalidRequest, match=r"no TAESD decoder for this model: put taesana_decoder\.pt \(or \.pth, "
                                             r"\.safetensors\) in .*VAE-approx; or use auto$"):
        run(folders["sana"], tmp_path, "taesd")
    torch.manual_seed(0)
    decoder = preview.f32_decoder(latent_channels=4)  # the tiny DC-AE's 4 channels (the real one's 32)
    (models / "VAE-approx").mkdir(parents=True)
    torch.save(decoder.state_dict(), models / "VAE-approx" / "taesana_decoder.pth")
    posted = []
    real_post, real_init = preview.Previews.post, preview.Previews.__init__
    monkeypatch.setattr(preview.Previews, "post", lambda self, latents, *a: posted.append(latents.clone())
                        or real_post(self, latents, *a))
    # made in the step, not on the worker thread (test_preview.py checks the thread): every preview is here on return
    monkeypatch.setattr(preview.Previews, "__init__", lambda self, every, render, show, background=False:
                        real_init(self, every, render, show, False))
    shown = run(folders["sana"], tmp_path, "auto")
    assert [(step, total) for _, step, total in shown] == [(1, 2), (2, 2)]
    for (image, _, _), latents in zip(shown, posted):
        assert latents.shape == (1, 4, 13, 19)  # SanaPipeline's latents as they are: 608x416 binned, 32x smaller
        with torch.no_grad():
            rgb = decoder(latents)[0]
        assert rgb.shape == (3, 416, 608)  # on their grid, 32x: the binned size, not a transposed one
        expected = np.asarray(preview._to_image(rgb.clamp(0, 1) * 2 - 1, (96, 64)), dtype=int)
        assert image.size == (96, 64) and np.abs(np.asarray(image, dtype=int) - expected).max() <= 1


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
