"""Live previews from latents (lowvram_gen/preview.py): the linear approximation of each latent format, and TAESD
from models/VAE-approx (A1111's file or a diffusers folder) or the Hugging Face cache, built tiny here: the real
decoders are not on this machine, and nothing is downloaded."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from lowvram_gen import preview
from lowvram_gen.errors import InvalidRequest, ModelLoadError

PIPES = {"sd": "StableDiffusionPipeline", "sdxl": "StableDiffusionXLImg2ImgPipeline", "sd3": "StableDiffusion3Pipeline",
         "flux": "FluxPipeline"}


def fake_pipe(class_name: str, vae_scale_factor: int = 8):
    """What a renderer reads of a pipeline: its class name and VAE scale factor."""
    return type(class_name, (), {"vae_scale_factor": vae_scale_factor})()


def latents_for(key: str, width: int, height: int, generator=None):
    channels = len(preview.FORMATS[key].factors)
    grid = torch.randn(1, channels, height // 8, width // 8, generator=generator)
    if not preview.FORMATS[key].packed:
        return grid
    from diffusers import FluxPipeline

    return FluxPipeline._pack_latents(grid, 1, channels, height // 8, width // 8)


@pytest.mark.parametrize("key", list(PIPES))
def test_the_approximation_of_each_latent_format_gives_an_rgb_image_of_the_latents_size_x8(key, tmp_path):
    fmt = preview.FORMATS[key]
    assert len(fmt.factors) == (4 if key in ("sd", "sdxl") else 16)
    assert all(len(row) == 3 and all(np.isfinite(row)) for row in fmt.factors)
    render, how = preview.renderer(fake_pipe(PIPES[key]), "auto", models=tmp_path)
    assert how == "approx"
    image = render(latents_for(key, 96, 64, torch.Generator().manual_seed(0)), 96, 64)
    assert image.mode == "RGB" and image.size == (96, 64)
    assert len(np.unique(np.asarray(image))) > 10  # a picture of the latents, not a flat colour
    broken = render(torch.full_like(latents_for(key, 96, 64), float("nan")), 96, 64)  # a diverged pass: grey
    assert np.asarray(broken).min() >= 0


def test_flux_latents_are_unpacked_onto_their_grid():
    """Flux packs 2x2 latent patches into a sequence; the preview puts each channel back where it was."""
    grid = torch.arange(16 * 4 * 6, dtype=torch.float32).view(1, 16, 4, 6)
    from diffusers import FluxPipeline

    packed = FluxPipeline._pack_latents(grid, 1, 16, 4, 6)
    assert torch.equal(preview._unpacked(packed, preview.FORMATS["flux"], 48, 32, 8), grid[0])


def test_approx_is_the_published_linear_map():
    """One latent pixel: RGB = factors^T . latent + bias, mapped from [-1, 1] to 0..255 (here SDXL's)."""
    fmt = preview.FORMATS["sdxl"]
    latent = torch.tensor([0.5, -0.25, 1.0, 0.1]).view(4, 1, 1)
    rgb = np.asarray(preview.approx(latent, fmt, (1, 1)))[0, 0]
    expected = (np.array(fmt.factors).T @ latent.flatten().numpy() + np.array(fmt.bias)).clip(-1, 1)
    assert np.allclose(rgb, ((expected + 1) * 127.5).round(), atol=1)


def test_pipelines_we_have_no_format_for_and_off_make_no_preview(tmp_path):
    assert preview.renderer(fake_pipe("KandinskyV22Pipeline"), "auto", models=tmp_path) == (None, "off")
    assert preview.renderer(fake_pipe("StableDiffusionPipeline"), "off", models=tmp_path) == (None, "off")
    with pytest.raises(InvalidRequest, match="invalid live preview method: 'Full'; use one of: auto, approx"):
        preview.renderer(fake_pipe("StableDiffusionPipeline"), "Full", models=tmp_path)


# -------------------------------------------------------------------------------------------- TAESD


def tiny_taesd(channels: int = 4):
    from diffusers import AutoencoderTiny

    torch.manual_seed(0)
    return AutoencoderTiny(latent_channels=channels, encoder_block_out_channels=(8, 8, 8, 8),
                           decoder_block_out_channels=(8, 8, 8, 8)).eval()


def as_a1111_file(model, path: Path) -> Path:
    """The original TAESD decoder layout A1111 keeps as taesd_decoder.pt: an nn.Sequential whose entry 0 is the clamp
    (no weights), so diffusers' decoder.layers[i] is its entry i + 1."""
    state = {f"{int(k.split('.', 1)[0]) + 1}.{k.split('.', 1)[1]}": v
             for k, v in model.decoder.layers.state_dict().items()}
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save(state, path)
    return path


def decoded(model, latents) -> np.ndarray:
    """What TAESD itself makes of the latents, as a preview shows it."""
    with torch.inference_mode():
        rgb = model.decode(latents, return_dict=False)[0][0].clamp(-1, 1)
    return ((rgb + 1) * 127.5).round().to(torch.uint8).permute(1, 2, 0).numpy()


@pytest.fixture(autouse=True)
def no_cached_decoders(monkeypatch, tmp_path):
    """An empty HF cache and no decoder loaded by an earlier test."""
    import huggingface_hub.constants

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "hf-cache"))
    monkeypatch.setattr(preview, "_DECODERS", {})


@pytest.mark.parametrize("where", ["a1111 file", "diffusers folder", "hf cache"])
def test_taesd_is_used_when_its_weights_are_here_and_runs_on_the_cpu(where, tmp_path):
    model = tiny_taesd()
    models = tmp_path / "models"
    if where == "a1111 file":
        as_a1111_file(model, models / "VAE-approx" / "taesd_decoder.pt")
    elif where == "diffusers folder":
        model.save_pretrained(models / "VAE-approx" / "taesd")
    else:  # what `hf download madebyollin/taesd` leaves in the cache
        repo = tmp_path / "hf-cache" / "models--madebyollin--taesd"
        (repo / "refs").mkdir(parents=True)
        (repo / "refs" / "main").write_text("0" * 40)
        model.save_pretrained(repo / "snapshots" / ("0" * 40))
    latents = torch.randn(1, 4, 8, 12, generator=torch.Generator().manual_seed(1))
    for method in ("auto", "taesd"):
        render, how = preview.renderer(fake_pipe("StableDiffusionPipeline"), method, models=models)
        assert how == "taesd"
        image = render(latents, 96, 64)
        assert image.size == (96, 64) and np.array_equal(np.asarray(image), decoded(model, latents))
    loaded = next(iter(preview._DECODERS.values()))
    assert loaded.device.type == "cpu" and loaded.dtype == torch.float32 and len(preview._DECODERS) == 1


def test_taesd_for_the_model_family_only_and_a_clear_error_when_asked_for_without_weights(tmp_path):
    as_a1111_file(tiny_taesd(), tmp_path / "VAE-approx" / "taesd_decoder.pt")  # SD 1.x's, not SDXL's
    assert preview.renderer(fake_pipe("StableDiffusionXLPipeline"), "auto", models=tmp_path)[1] == "approx"
    with pytest.raises(InvalidRequest, match=r"no TAESD decoder for this model: put taesdxl_decoder\.pt .* or the "
                                             r"diffusers folder taesdxl in .*VAE-approx, or have madebyollin/taesdxl"):
        preview.renderer(fake_pipe("StableDiffusionXLPipeline"), "taesd", models=tmp_path)


def test_a_16_channel_taesd_file_previews_flux_latents(tmp_path):
    model = tiny_taesd(channels=16)
    as_a1111_file(model, tmp_path / "VAE-approx" / "taef1_decoder.pt")
    render, how = preview.renderer(fake_pipe("FluxPipeline"), "taesd", models=tmp_path)
    grid = torch.randn(1, 16, 4, 6, generator=torch.Generator().manual_seed(2))
    from diffusers import FluxPipeline

    image = render(FluxPipeline._pack_latents(grid, 1, 16, 4, 6), 48, 32)
    assert how == "taesd" and np.array_equal(np.asarray(image), decoded(model, grid))


def test_a_file_that_is_not_a_taesd_decoder_is_a_clear_error(tmp_path):
    path = tmp_path / "VAE-approx" / "taesd_decoder.pt"
    path.parent.mkdir()
    torch.save({"encoder.weight": torch.zeros(3)}, path)
    with pytest.raises(ModelLoadError, match="is not a TAESD decoder"):
        preview.renderer(fake_pipe("StableDiffusionPipeline"), "auto", models=tmp_path)


# -------------------------------------------------------------------------------------------- delivery


def test_background_previews_never_hold_the_steps_and_the_newest_waiting_one_is_shown():
    """TAESD's previews are made on a worker thread: while the first is still being made (held here), the steps
    go on posting; each new one replaces the one waiting, and once the worker is free it shows the newest."""
    import threading

    started, release, last = threading.Event(), threading.Event(), threading.Event()
    shown = []

    def render(latents, width, height):
        started.set()
        assert release.wait(30)
        return f"image of step {int(latents)}"

    def show(image, step, total):
        shown.append((image, step))
        if step == 4:
            last.set()

    previews = preview.Previews(1, render, show, background=True)
    previews.post(torch.tensor(1), 8, 8, 1, 4)
    assert started.wait(30)  # step 1's preview is being made
    for step in (2, 3, 4):  # the steps do not wait for it
        previews.post(torch.tensor(step), 8, 8, step, 4)
    release.set()
    assert last.wait(30)
    assert shown == [("image of step 1", 1), ("image of step 4", 4)]


def test_a_failing_preview_is_logged_and_stops_the_previews_not_the_job(caplog):
    calls = []

    def render(latents, width, height):
        calls.append(latents)
        raise RuntimeError("a broken decoder")

    previews = preview.Previews(1, render, lambda *a: calls.append("shown"))
    previews.post("first", 8, 8, 1, 2)
    previews.post("second", 8, 8, 2, 2)
    assert calls == ["first"] and previews.failed
    assert "live preview failed; no more previews for this job" in caplog.text
