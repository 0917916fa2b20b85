"""A1111's img2img "Resize mode" beyond the pixels (issue 31 item 6): "Just resize (latent upscale)" (API 3) and
Crop and resize / Resize and fill with an inpaint mask.

Latent upscale: A1111 encodes the init image at its own size and interpolates the latents to the job's (bilinear)
before the noise. The job's img2img call is watched (its pipeline class's __call__) and called again as plain
diffusers with the same arguments but, as its image, the latents made here by hand: the VAE's posterior mode of the
init image at its own size, normalised as the family's pipeline normalises them, interpolated to the job's latent
size. The two must be equal: SD 1.x, SDXL (they keep the init's size), SD3 and FLUX.1 (a shift factor; FLUX.1's
latents packed; their pipelines resize the init image unless told not to) and Qwen-Image (5-D latents, a mean and
std), and SD's ControlNet img2img pipeline. Z-Image and Chroma run it in tests/test_family_matrix.py.

Masks: the mask is brought to the job's size by the image's mode (A1111's resize_image on the mask), so the
repainted area moves with the picture; its geometry is checked with numbers.

The init image is 96x48 (2:1) for a 64x64 job: a blue ground with a red block.
"""

from __future__ import annotations

import numpy as np
import pytest
from PIL import Image

from lowvram_gen import GenerationRequest
from lowvram_gen.control import resize
from lowvram_gen.control.units import ControlNetUnit
from lowvram_gen.errors import InvalidRequest
from lowvram_gen.session import Session

BLUE, RED = (30, 90, 200), (220, 40, 40)


@pytest.fixture(scope="module")
def wide(tmp_path_factory):
    a = np.zeros((48, 96, 3), dtype=np.uint8)
    a[:] = BLUE
    a[12:36, 36:60] = RED
    path = tmp_path_factory.mktemp("resize-modes") / "wide.png"
    Image.fromarray(a).save(path)
    return str(path)


# ---------------------------------------------------------------------------------------- the latent upscale


def _sd_latents(pipe, image):
    """SD 1.x / SDXL: the mode times the scaling factor."""
    processed = pipe.image_processor.preprocess(image)
    return pipe.vae.encode(processed).latent_dist.mode() * pipe.vae.config.scaling_factor


def _flux_latents(pipe, image):
    processed = pipe.image_processor.preprocess(image)  # its own size: no height or width
    mode = pipe.vae.encode(processed).latent_dist.mode()
    return (mode - pipe.vae.config.shift_factor) * pipe.vae.config.scaling_factor


def _qwen_latents(pipe, image):
    import torch

    processed = pipe.image_processor.preprocess(image).unsqueeze(2)  # one frame
    mode = pipe.vae.encode(processed).latent_dist.mode()
    shape = (1, -1, 1, 1, 1)
    mean = torch.tensor(pipe.vae.config.latents_mean).view(shape)
    std = torch.tensor(pipe.vae.config.latents_std).view(shape)
    return ((mode - mean) / std).squeeze(2)  # 4-D: the pipeline takes [B, C, H, W] latents as its image


def _tiny_flux(tmp_path_factory):
    from tiny_transformers import build_tiny_flux

    path = tmp_path_factory.mktemp("flux")
    build_tiny_flux().save_pretrained(path)
    return str(path)


def _tiny_sd3(tmp_path_factory):
    from tiny_transformers import build_tiny_sd3

    path = tmp_path_factory.mktemp("sd3")
    build_tiny_sd3().save_pretrained(path)
    return str(path)


def _tiny_qwen(tmp_path_factory):
    from tiny_qwen import build_tiny_qwen_image

    path = tmp_path_factory.mktemp("qwen")
    build_tiny_qwen_image().save_pretrained(path)
    return str(path)


CASES = {  # model -> (its img2img pipeline class, the latents by hand, how its folder is made)
    "sd": ("StableDiffusionImg2ImgPipeline", _sd_latents, lambda f: "tiny"),
    # a ControlNet unit beside it (the embedded SD one, the init image as its control image)
    "sd-controlnet": ("StableDiffusionControlNetImg2ImgPipeline", _sd_latents, lambda f: "tiny"),
    "sdxl": ("StableDiffusionXLImg2ImgPipeline", _sd_latents, lambda f: "tiny-sdxl"),
    "sd3": ("StableDiffusion3Img2ImgPipeline", _flux_latents, _tiny_sd3),  # a shift factor too
    "flux": ("FluxImg2ImgPipeline", _flux_latents, _tiny_flux),
    "qwen-image": ("QwenImageImg2ImgPipeline", _qwen_latents, _tiny_qwen),
}


@pytest.mark.parametrize("case", list(CASES))
def test_latent_upscale_equals_plain_diffusers_given_the_interpolated_latents(case, wide, tmp_path, tmp_path_factory,
                                                                              monkeypatch):
    import diffusers
    import torch
    import torch.nn.functional as F

    class_name, by_hand, folder = CASES[case]
    cls = getattr(diffusers, class_name)
    real = cls.__call__
    seen = {}

    def watch(self, *args, **kwargs):
        out = real(self, *args, **kwargs)
        seen.update(pipe=self, kwargs=kwargs, out=out)
        return out

    monkeypatch.setattr(cls, "__call__", watch)
    units = (ControlNetUnit("tiny-controlnet", wide),) if case == "sd-controlnet" else ()
    request = GenerationRequest(prompt="a boat", model=folder(tmp_path_factory), init_image=wide,
                                resize_mode="latent", width=64, height=64, steps=3, strength=0.6, seed=5,
                                outdir=str(tmp_path), controlnets=units)
    result = Session(device="cpu").generate(request)
    assert (result.width, result.height) == (64, 64) and seen, "the job ran its family's img2img pipeline"
    pipe, kwargs = seen["pipe"], dict(seen["kwargs"])
    assert kwargs["image"][0].size == (96, 48)  # handed over at its own size: no pixel was resized
    with torch.no_grad():
        latents = by_hand(pipe, Image.open(wide).convert("RGB"))
        f = int(pipe.vae_scale_factor)  # 8; the tiny Qwen-Image VAE's 4
        assert latents.shape[-2:] == (48 // f, 96 // f)
        latents = F.interpolate(latents, size=(64 // f, 64 // f), mode="bilinear")
    generator = kwargs["generator"]
    fresh = [torch.Generator().manual_seed(5)] if isinstance(generator, list) else torch.Generator().manual_seed(5)
    monkeypatch.setattr(cls, "__call__", real)
    again = pipe(**{**kwargs, "image": latents, "generator": fresh, "callback_on_step_end": None})
    ours, plain = seen["out"].images, again.images
    if isinstance(ours, torch.Tensor):
        assert torch.allclose(ours, plain, atol=1e-4), float((ours - plain).abs().max())
    else:
        diff = np.abs(np.asarray(ours[0], dtype=int) - np.asarray(plain[0], dtype=int)).max()
        assert diff <= 2, diff


def test_latent_upscale_differs_from_just_resize(wide, tmp_path):
    """The same job in pixels (Just resize) starts from other latents: another image; the PNG says neither mode."""
    session = Session(device="cpu")
    made = {}
    for mode in ("resize", "latent"):
        result = session.generate(GenerationRequest(prompt="a boat", init_image=wide, resize_mode=mode, width=64,
                                                    height=64, steps=3, strength=0.5, seed=5, sampler="Euler",
                                                    outdir=str(tmp_path / mode)))
        made[mode] = np.asarray(Image.open(result.images[0]), dtype=int)
        # A1111 writes no resize mode into the PNG of an img2img job: neither do we
        assert "resize" not in Image.open(result.images[0]).info["parameters"].lower()
    assert np.abs(made["resize"] - made["latent"]).max() > 8


def test_latent_upscale_at_strength_0_is_the_interpolated_init(wide, tmp_path):
    """Nothing denoised: the interpolated latents decoded, at the job's size."""
    result = Session(device="cpu").generate(GenerationRequest(prompt="a boat", init_image=wide, resize_mode=3,
                                                              width=64, height=64, steps=3, strength=0,
                                                              outdir=str(tmp_path)))
    assert Image.open(result.images[0]).size == (64, 64)


# ----------------------------------------------------------------------------------------------- the values


def test_the_modes_by_name_and_number_and_what_is_refused():
    assert [resize.check_init_resize(v) for v in (0, 1, 2, 3, "Just resize (latent upscale)", "latent", 3.0)] == \
        ["resize", "crop", "fill", "latent", "latent", "latent", "latent"]
    assert [resize.check_init_resize(v, masked=True) for v in (0, 1, 2)] == ["resize", "crop", "fill"]
    with pytest.raises(InvalidRequest, match=r"invalid resize mode: 4.*use resize, crop, fill or latent.*0-3"):
        resize.check_init_resize(4)
    with pytest.raises(InvalidRequest, match="latent upscale.* with a mask .*is not built here"):
        resize.check_init_resize(3, masked=True)


def test_the_cli_and_the_api_give_it(tmp_path):
    from lowvram_gen.a1111.api_body import map_body
    from lowvram_gen.cli.main import _request_fields, build_parser

    init = tmp_path / "init.png"
    Image.new("RGB", (64, 64)).save(init)
    args = build_parser().parse_args(["img2img", "x", "--init", str(init), "--resize-mode", "latent"])
    assert GenerationRequest(**_request_fields(args)[0]).validated().resize_mode == "latent"
    args = build_parser().parse_args(["inpaint", "x", "--init", str(init), "--mask", str(init),
                                      "--resize-mode", "fill"])
    assert _request_fields(args)[0]["resize_mode"] == "fill"
    body = map_body(dict(prompt="x", init_images=["<base64>"], resize_mode=3), "img2img", "tiny", 1, str(tmp_path),
                    find_model=lambda title: None, init_image=lambda value, *w: str(init))
    assert body.request.validated().resize_mode == "latent"


def test_the_ui_has_a1111s_resize_mode_radio_in_img2img_and_inpaint(tmp_path):
    """Above the size, Just resize first; the tabs' Generate takes it after img2img_fix_steps and before the
    ControlNet units (img2img: before Tiling, Styles, the refiner's two and the Script controls; Inpaint: before
    Styles; added since, older positional API calls keep working). Inpaint offers no latent upscale (refused with a
    mask)."""
    from lowvram_gen.ui import controlnet
    from lowvram_gen.ui.app import build_app
    from lowvram_gen.ui.context import UiOptions

    app = build_app(Session(outdir=str(tmp_path)), UiOptions(outdir=str(tmp_path)))
    by_name = {f.api_name: f for f in app.fns.values()}
    labels = ["Just resize", "Crop and resize", "Resize and fill", "Just resize (latent upscale)"]
    from lowvram_gen.ui import xyz

    # img2img: Tiling, Styles, the refiner's two and the Script controls (X/Y/Z, Loopback, SD upscale) after it;
    # Inpaint: Styles
    for name, elem, offered, later in (("img2img", "i2i-resize-mode", labels, 4 + len(xyz.inputs("img2img"))),
                                       ("inpaint", "inp-resize-mode", labels[:3], 1)):
        inputs = by_name[name].inputs
        radio = inputs[len(inputs) - len(controlnet.KEYS) - 1 - later]
        assert (radio.elem_id, radio.value, radio.label) == (elem, "resize", "Resize mode")
        assert [label for label, _ in radio.choices] == offered
        assert [key for _, key in radio.choices] == ["resize", "crop", "fill", "latent"][:len(offered)]


# ---------------------------------------------------------------------------------------------------- masks


def _mask(tmp_path, box=(0, 12, 24, 36)):
    """A 96x48 mask white in `box`: by default the left quarter's middle band."""
    m = np.zeros((48, 96), dtype=np.uint8)
    x0, y0, x1, y1 = box
    m[y0:y1, x0:x1] = 255
    path = tmp_path / "mask.png"
    Image.fromarray(m).save(path)
    return str(path)


def test_a_mask_is_resized_as_its_image_is(tmp_path):
    """crop: scaled to 128x64 (96 x 64 // 48), the middle 64 columns kept from x 32: the box x 0-24 (scaled 0-32) is
    cut away entirely; fill: scaled to 64x32 at y 16, the box at x 0-16, y 24-40, and the bands
    above and below are the mask's first and last rows stretched (black here)."""
    mask = Image.open(_mask(tmp_path)).convert("L")
    crop = np.asarray(resize.init_resized(mask, 64, 64, "crop"))
    assert crop.shape == (64, 64) and crop.max() < 128  # the masked band is outside the kept centre
    fill = np.asarray(resize.init_resized(mask, 64, 64, "fill"))
    assert fill.shape == (64, 64) and resize.init_resized(mask, 64, 64, "fill").mode == "L"
    white = np.argwhere(fill > 127)
    assert white[:, 1].min() == 0 and abs(white[:, 1].max() - 15) <= 1
    assert abs(white[:, 0].min() - 24) <= 1 and abs(white[:, 0].max() - 39) <= 1
    assert fill[:16].max() == 0 and fill[48:].max() == 0


@pytest.mark.parametrize("mode", ["crop", "fill"])
def test_an_inpaint_job_resizes_its_init_and_mask_by_the_mode(mode, wide, tmp_path, monkeypatch):
    """The pass gets the init image and the mask as init_resized makes them (mask blur 0); the result keeps the
    resized init outside the mask."""
    from lowvram_gen.engines.sd import pipeline as sd

    mask = _mask(tmp_path, (36, 12, 60, 36))  # the red block
    seen = []
    real = sd.denoise
    monkeypatch.setattr(sd, "denoise", lambda pipe, step, *a, **k: seen.append(step) or real(pipe, step, *a, **k))
    result = Session(device="cpu").generate(GenerationRequest(
        prompt="a boat", init_image=wide, mask=mask, mask_blur=0, resize_mode=mode, width=64, height=64, steps=2,
        strength=0.5, seed=5, outdir=str(tmp_path)))
    image = Image.open(wide).convert("RGB")
    expected_init = resize.init_resized(image, 64, 64, mode)
    expected_mask = resize.init_resized(Image.open(mask).convert("L"), 64, 64, mode)
    assert np.array_equal(np.asarray(seen[0].init[0]), np.asarray(expected_init))
    assert np.array_equal(np.asarray(seen[0].mask), np.asarray(expected_mask))
    out = np.asarray(Image.open(result.images[0]).convert("RGB"), dtype=int)
    keep = np.asarray(expected_mask) == 0  # the overlay doubles the mask: black stays the init's
    assert np.array_equal(out[keep], np.asarray(expected_init, dtype=int)[keep])
    # the mask (the red block, x 36-60, y 12-36) is where the mode put the block: crop scales by 4/3 to x 48-80, y
    # 16-48, kept from x 32 (so x 16-48); fill scales by 2/3 to x 24-40, y 8-24, pasted from y 16 (so y 24-40)
    rows, cols = np.nonzero(np.asarray(seen[0].mask) > 127)
    box = (16, 47, 16, 47) if mode == "crop" else (24, 39, 24, 39)
    assert all(abs(a - b) <= 1 for a, b in zip((cols.min(), cols.max(), rows.min(), rows.max()), box))


def test_only_masked_keeps_a1111s_crop_whatever_the_mode(wide, tmp_path, monkeypatch):
    """A1111's "Only masked" cuts the mask's box to the job's aspect and ignores the resize mode: the same pass."""
    from lowvram_gen.engines.sd import pipeline as sd

    mask = _mask(tmp_path, (36, 12, 60, 36))
    seen = {}
    real = sd.denoise
    session = Session(device="cpu")
    for mode in ("resize", "fill"):
        monkeypatch.setattr(sd, "denoise", lambda pipe, step, *a, **k: seen.setdefault(mode, step) and
                            real(pipe, step, *a, **k))
        session.generate(GenerationRequest(prompt="a boat", init_image=wide, mask=mask, mask_blur=0,
                                           inpaint_area="masked", resize_mode=mode, width=64, height=64, steps=2,
                                           strength=0.5, seed=5, outdir=str(tmp_path / mode)))
    assert np.array_equal(np.asarray(seen["resize"].init[0]), np.asarray(seen["fill"].init[0]))
    assert np.array_equal(np.asarray(seen["resize"].mask), np.asarray(seen["fill"].mask))


def test_the_ladders_only_masked_step_goes_back_by_the_mode():
    """The ladder's only-masked step (inpaint/area.py masked_rung) pastes its box into the canvas, then brings the
    canvas to the job's size as the whole picture was: by the resize mode. A mask in the part Crop and resize cuts
    away (x 0-20 of 96; the centre kept is x 24-72) leaves the job's image the cropped init, as the whole picture's
    pass would."""
    from lowvram_gen.inpaint.area import Area
    from lowvram_gen.inpaint.masks import Prepared

    rng = np.random.default_rng(0)
    canvas = Image.fromarray(rng.integers(0, 255, (48, 96, 3), dtype=np.uint8))
    mask = Image.new("L", canvas.size)
    mask.paste(255, (0, 10, 20, 30))
    whole = Area(canvas, Prepared(mask, mask, None), False, 0, "original", (64, 64), resize="crop")
    area, size = whole.masked_rung((64, 64), 8, 8)
    assert area.only_masked and area.out_size == (64, 64)
    painted = Image.new("RGB", size, (255, 0, 255))  # what the denoiser made of the box
    out = area.finish([painted])[0]
    assert out.size == (64, 64)
    assert np.array_equal(np.asarray(out), np.asarray(resize.init_resized(canvas, 64, 64, "crop")))
    fill = Area(canvas, Prepared(mask, mask, None), False, 0, "original", (64, 64), resize="fill")
    area, size = fill.masked_rung((64, 64), 8, 8)
    out = np.asarray(area.finish([Image.new("RGB", size, (255, 0, 255))])[0], dtype=int)
    assert (out[26:33, 0:10] == (255, 0, 255)).all()  # the box (x 0-20, y 10-30) scaled by 2/3 and put at y 16
