"""Live previews of video latents (issue 33): the middle latent frame through the latent-to-RGB approximation of the
pipeline's format (lowvram_gen/preview.py: Wan 2.1's 16 channels "wan21", Wan 2.2 TI2V's 48 "wan22", LTX-Video's 128
"ltxv"), on the latents the tiny video pipelines (tests/tiny_video.py) hold at a denoising step."""

from __future__ import annotations

import pytest

from lowvram_gen import preview
from lowvram_gen.errors import InvalidRequest

WAN_KINDS = {  # kind -> (width, height): not square, so a swapped width and height shows; multiples of each one's
    "wan21": (48, 32), "wan21-i2v": (48, 32), "wan22-ti2v": (64, 32), "wan22-a14b": (48, 32),
    "wan22-a14b-i2v": (48, 32)}
FORMAT = {"wan21": "wan21", "wan21-i2v": "wan21", "wan22-ti2v": "wan22", "wan22-a14b": "wan21",
          "wan22-a14b-i2v": "wan21"}


def _step_latents(pipe, kind: str, width: int, height: int):
    """The latents the pipeline holds after its first denoising step (its callback's), 9 frames, 2 steps."""
    import torch
    from PIL import Image

    seen = []

    def grab(_pipe, _i, _t, kwargs):
        seen.append(kwargs["latents"].detach().clone())
        return kwargs

    extra = {"image": Image.new("RGB", (width, height), (200, 40, 90))} if kind.endswith("-i2v") else {}
    pipe(prompt="a boat", num_frames=9, width=width, height=height, num_inference_steps=2, output_type="latent",
         generator=torch.Generator().manual_seed(1), callback_on_step_end=grab, **extra)
    return seen[0]


@pytest.fixture(scope="module")
def pipes():
    import tiny_video

    return {}, tiny_video.build


def _pipe(pipes, kind):
    built, build = pipes
    if kind not in built:
        built[kind] = build(kind)
    return built[kind]


@pytest.mark.parametrize("kind", list(WAN_KINDS))
def test_the_middle_frame_preview_of_each_wan_kind_has_the_clip_size_and_its_format(pipes, kind):
    width, height = WAN_KINDS[kind]
    pipe = _pipe(pipes, kind)
    assert preview.video_format(pipe) == preview.latent_format(pipe) == FORMAT[kind]
    render, how = preview.renderer(pipe, "auto")
    assert how == "approx"
    latents = _step_latents(pipe, kind, width, height)[:1].float()
    assert latents.dim() == 5 and latents.shape[2] == 3  # (1, C, 9 frames -> 3 latent frames, h, w)
    image = render(latents, width, height)
    assert image.size == (width, height) and image.mode == "RGB"
    # the middle latent frame, not the first or the last: each makes another picture
    geometry = preview.video_geometry(pipe)
    fmt = preview.FORMATS[FORMAT[kind]]
    frames = [preview.approx(preview.video_frame(latents, geometry, width, height, i), fmt, (width, height))
              for i in range(3)]
    assert image.tobytes() == frames[1].tobytes()
    assert frames[0].tobytes() != frames[1].tobytes() != frames[2].tobytes()


def test_ltx_latents_are_unpacked_with_the_pipelines_own_unpack_and_previewed_at_128_channels(pipes):
    """LTX-Video holds its latents packed (1, frames x h x w, 128). The tiny folder's VAE has 8 channels, for which no
    map is published: its previews are off (never a wrong map); with the published VAE's 128 channels (its config
    said so here) the middle frame is unpacked and approximated."""
    import torch

    pipe = _pipe(pipes, "ltx")
    assert preview.renderer(pipe, "auto") == (None, "off")  # the tiny VAE's 8 channels: no map fits
    width, height = 64, 32
    geometry = preview.video_geometry(pipe)
    assert geometry.unpack is not None and geometry.spatial == pipe.vae_spatial_compression_ratio
    rows, cols = height // geometry.spatial, width // geometry.spatial
    clip = torch.randn(1, 128, 3, rows, cols, generator=torch.Generator().manual_seed(0))
    packed = type(pipe)._pack_latents(clip, geometry.patch, geometry.patch_t)
    assert packed.dim() == 3
    for i in range(3):
        assert torch.equal(preview.video_frame(packed, geometry, width, height, i), clip[0, :, i])

    pipe.vae.register_to_config(latent_channels=128)  # LTX-Video's published VAE
    try:
        assert preview.video_format(pipe) == "ltxv"
        render, how = preview.renderer(pipe, "approx")
        image = render(packed, width, height)
        assert how == "approx" and image.size == (width, height)
        first = preview.approx(clip[0, :, 0], preview.FORMATS["ltxv"], (width, height))
        middle = preview.approx(clip[0, :, 1], preview.FORMATS["ltxv"], (width, height))
        assert image.tobytes() == middle.tobytes() != first.tobytes()
    finally:
        pipe.vae.register_to_config(latent_channels=8)


def test_video_previews_off_and_taesd(pipes):
    pipe = _pipe(pipes, "wan21")
    assert preview.renderer(pipe, "off") == (None, "off")
    with pytest.raises(InvalidRequest, match="no TAESD decoder is known for Wan's video latents: use auto or approx"):
        preview.renderer(pipe, "taesd")


def test_the_formats_have_one_rgb_row_a_latent_channel():
    assert len(preview.FORMATS["wan22"].factors) == 48 and len(preview.FORMATS["ltxv"].factors) == 128
    assert all(len(row) == 3 for key in ("wan22", "ltxv") for row in preview.FORMATS[key].factors)


def test_a_frame_outside_the_clip_is_refused_in_one_sentence():
    import torch

    latents = torch.zeros(1, 16, 3, 2, 2)
    with pytest.raises(ValueError, match="latent frame 3 of a clip of 3 latent frames"):
        preview.video_frame(latents, preview.VideoGeometry(8), 16, 16, 3)
