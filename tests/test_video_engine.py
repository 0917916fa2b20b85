"""The video engine (issue 33) through Session.generate: each tiny video folder (tests/tiny_video.py, diffusers' own
test shapes) makes the frames plain diffusers makes at the same seed and precision (float32 here, uint8 frames, max
diff <= 2/255), text- and image-to-video; what a model cannot take is refused in one sentence before it loads; an
interrupted clip is kept.

Sizes are 64x64 (the smallest side a request takes), 9 frames, 2 steps: each clip runs in about a second.
"""

from __future__ import annotations

import dataclasses
import threading
from pathlib import Path

import numpy as np
import pytest
from PIL import Image
from tiny_video import plain_frames, plain_pipeline, save, saved_frames

from lowvram_gen.errors import Cancelled, InvalidRequest
from lowvram_gen.request import GenerationRequest
from lowvram_gen.session import Session

TOLERANCE = 2  # of 255: the "equal to plain diffusers"
SEED = 5


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("tiny-video")
    made = {}

    def folder(kind: str) -> str:
        if kind not in made:
            made[kind] = str(save(kind, root / kind))
        return made[kind]

    return folder


@pytest.fixture(scope="module")
def init_image(tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("init") / "first.png"
    rng = np.random.default_rng(0)
    Image.fromarray(rng.integers(0, 255, (64, 64, 3), dtype=np.uint8)).save(path)
    return str(path)


def video_request(folder: str, outdir, **kw) -> GenerationRequest:
    base = dict(prompt="a red fox in the snow", negative_prompt="blurry", model=folder, frames=9, width=64, height=64,
                steps=2, seed=SEED, cfg_scale=5.0, outdir=str(outdir), save_frames=True)
    return GenerationRequest(**{**base, **kw})


# what the plain call is given beside the prompts, size, frames and steps: the record's defaults the engine fills in
# (Wan 2.2 A14B's low-noise CFG: 3.0 T2V, 3.5 I2V; LTX's frame_rate 24, its fps)
PLAIN_EXTRA = {"wan21": {}, "wan22-ti2v": {}, "wan22-a14b": {"guidance_scale_2": 3.0}, "ltx": {"frame_rate": 24},
               "wan21-i2v": {}, "ltx-i2v": {"frame_rate": 24}, "wan22-a14b-i2v": {"guidance_scale_2": 3.5}}


@pytest.mark.parametrize("kind, image", [
    ("wan21", False), ("wan22-ti2v", False), ("wan22-a14b", False), ("ltx", False),
    ("wan21-i2v", True), ("wan22-ti2v", True), ("ltx-i2v", True), ("wan22-a14b-i2v", True),
])
def test_a_clip_equals_plain_diffusers(kind, image, folders, init_image, tmp_path):
    folder = folders(kind)
    kw = {"init_image": init_image} if image else {}
    result = Session(device="cpu").generate(video_request(folder, tmp_path, **kw))
    assert result.video and result.images == [] and result.frame_count == 9 and len(result.frames) == 9
    ours = saved_frames(result.frames)
    pipe = plain_pipeline(folder, image=image)
    call = dict(prompt="a red fox in the snow", negative_prompt="blurry", num_frames=9, width=64, height=64,
                num_inference_steps=2, guidance_scale=5.0, **PLAIN_EXTRA[kind])
    if image:
        call["image"] = Image.open(init_image).convert("RGB")
    theirs = plain_frames(pipe, SEED, **call)
    assert ours.shape == theirs.shape == (9, 64, 64, 3)
    assert ours.std() > 1  # frames, not a blank clip
    assert np.abs(ours.astype(int) - theirs.astype(int)).max() <= TOLERANCE
    assert not result.upscaled and (result.generated_width, result.generated_height) == (64, 64)


def test_the_model_defaults_fill_frames_fps_and_the_second_cfg(folders, tmp_path):
    """frames 0, fps None, cfg_scale_2 None: the record's (Wan 2.2 A14B: 81 frames at 16 fps, CFG 2 3.0); given ones
    kept. Read from the folder before anything loads."""
    session = Session(device="cpu")
    folder = folders("wan22-a14b")
    filled = session.with_video_defaults(video_request(folder, tmp_path, frames=0).validated())
    assert (filled.frames, filled.fps, filled.cfg_scale_2) == (81, 16.0, 3.0)
    given = session.with_video_defaults(video_request(folder, tmp_path, fps=8, cfg_scale_2=1.5).validated())
    assert (given.frames, given.fps, given.cfg_scale_2) == (9, 8.0, 1.5)
    one = session.with_video_defaults(video_request(folders("ltx"), tmp_path, frames=0).validated())
    assert (one.frames, one.fps, one.cfg_scale_2) == (161, 24.0, None)  # one denoiser: no second CFG
    # a built-in name (`plan --model ...`): from the configs the package ships, nothing downloaded
    builtin = session.with_video_defaults(video_request("wan22-ti2v-5b", tmp_path, frames=0).validated())
    assert (builtin.frames, builtin.fps, builtin.cfg_scale_2) == (121, 24.0, None)
    assert session.model is None


def test_the_clip_says_its_parameters(folders, tmp_path):
    from lowvram_gen.outputs import parse_a1111_parameters
    from lowvram_gen.video_out import read_clip

    result = Session(device="cpu").generate(video_request(folders("wan22-a14b"), tmp_path, cfg_scale_2=2.5, fps=12))
    parameters, meta = read_clip(result.video)
    fields = parse_a1111_parameters(parameters)
    assert fields["prompt"] == "a red fox in the snow" and fields["negative_prompt"] == "blurry"
    assert (fields["Steps"], fields["CFG scale"], fields["CFG scale 2"], fields["Seed"]) == ("2", "5", "2.5", str(SEED))
    assert (fields["Size"], fields["Frames"], fields["FPS"], fields["Preset"]) == ("64x64", "9", "12", result.preset)
    assert meta["seed"] == SEED and meta["request"]["frames"] == 9 and meta["model_path"] == result.model_path
    assert result.fps == 12.0


def test_on_step_and_the_preview_of_the_middle_frame(folders, tmp_path):
    steps, previews = [], []
    Session(device="cpu").generate(video_request(folders("wan21"), tmp_path), on_step=lambda i, n: steps.append((i, n)),
                                   on_preview=lambda im, i, n: previews.append((im.size, i, n)), preview_every=1)
    assert steps == [(1, 2), (2, 2)]
    assert previews == [((64, 64), 1, 2), ((64, 64), 2, 2)]


def test_taesd_previews_are_refused_in_one_sentence_before_any_step(folders, tmp_path):
    """No TAESD decoder is known for video latents: asking for one is the preview module's one sentence, raised before
    the first step (as the image engine does), and nothing is saved."""
    steps = []
    with pytest.raises(InvalidRequest, match=r"^invalid live preview method: 'taesd'; no TAESD decoder is known for "
                                             r"Wan's video latents: use auto or approx$"):
        Session(device="cpu").generate(video_request(folders("wan21"), tmp_path / "out"),
                                       on_step=lambda i, n: steps.append(i), on_preview=lambda *a: None,
                                       preview_every=1, preview_method="taesd")
    assert steps == [] and not any((tmp_path / "out").rglob("*.*"))


def test_no_preview_where_no_latent_map_fits(folders, tmp_path):
    """The tiny LTX folder's VAE has 8 latent channels, for which no map is published: the job shows no preview (not
    a picture made of its first three channels) and still makes its clip."""
    previews = []
    result = Session(device="cpu").generate(video_request(folders("ltx"), tmp_path, save_frames=False),
                                            on_preview=lambda im, i, n: previews.append(i), preview_every=1)
    assert previews == [] and result.video is not None


def test_the_records_name_their_latent_formats():
    from lowvram_gen import families, preview

    assert families.by_key("wan22-ti2v-5b").latent_format == "wan22"
    assert families.by_key("ltx-video").latent_format == "ltxv"
    assert families.by_key("wan21-t2v-1.3b").latent_format == "wan21"
    assert {"wan21", "wan22", "ltxv"} <= set(preview.FORMATS)


def test_interrupt_keeps_the_clip_as_it_was(folders, tmp_path):
    """Interrupt at the end of step 1 of 3: the steps stop, the clip is decoded as it was and saved, and the job ends
    raising Cancelled with it."""
    cancel = threading.Event()
    forwards = []
    session = Session(device="cpu")

    def on_step(i, n):
        if i == 1:
            cancel.set()

    request = video_request(folders("wan21"), tmp_path, steps=3)
    with pytest.raises(Cancelled, match="step 1 of 3") as caught:
        session.generate(request, on_step=on_step, cancel=cancel)
    kept = caught.value.images
    assert len(kept) == 1 and kept[0].endswith((".mp4", ".webp"))
    assert (tmp_path / kept[0].rsplit("/", 1)[1]).exists()
    frames = sorted((tmp_path / (kept[0].rsplit("/", 1)[1].rsplit(".", 1)[0] + "-frames")).glob("*.png"))
    assert len(frames) == 9


def test_a_cancel_before_the_job_starts_loads_nothing(folders, tmp_path):
    cancel = threading.Event()
    cancel.set()
    session = Session(device="cpu")
    with pytest.raises(Cancelled):
        session.generate(video_request(folders("wan21"), tmp_path), cancel=cancel)
    assert session.model is None


# -- refusals, one sentence each, before anything loads ------------------------------------------------------------

@pytest.mark.parametrize("kind, change, field, words", [
    ("wan21", {"frames": 10}, "frames", "9 or 13"),
    ("wan21", {"frames": 12}, "frames", "9 or 13"),
    ("ltx", {"frames": 12}, "frames", "9 or 17"),
    ("wan21", {"width": 72}, "width", "64 or 80"),  # Wan 2.1: 8x VAE x patch 2 = 16
    ("wan22-ti2v", {"height": 80}, "height", "64 or 96"),  # Wan 2.2 TI2V: 16 x 2 = 32
    ("wan21", {"sampler": "Euler a"}, "sampler", "default, Euler, UniPC or DPM++ 2M"),
    ("ltx", {"steps": 1}, "steps", "2 steps or more"),  # diffusers' FlowMatchEuler would divide by zero
    ("wan21", {"schedule_type": "karras"}, "schedule type", "use automatic"),
    ("wan21", {"prompt": "a fox <lora:style:0.8>"}, "lora", "does not apply LoRAs yet"),
])
def test_what_the_model_cannot_make_is_refused_before_loading(kind, change, field, words, folders, tmp_path):
    session = Session(device="cpu")
    with pytest.raises(InvalidRequest) as caught:
        session.generate(video_request(folders(kind), tmp_path, **change))
    assert caught.value.field == field and words in str(caught.value)
    assert str(caught.value).count(". ") == 0  # one sentence
    assert session.model is None


@pytest.mark.parametrize("kind", ["wan21", "wan22-a14b"])
def test_an_init_image_for_a_text_only_model_is_refused(kind, folders, init_image, tmp_path):
    session = Session(device="cpu")
    with pytest.raises(InvalidRequest, match="text-to-video model") as caught:
        session.generate(video_request(folders(kind), tmp_path, init_image=init_image))
    assert caught.value.field == "init image" and session.model is None


def test_an_image_to_video_model_needs_an_init_image(folders, tmp_path):
    session = Session(device="cpu")
    with pytest.raises(InvalidRequest, match="give an init image"):
        session.generate(video_request(folders("wan21-i2v"), tmp_path))
    assert session.model is None


def test_an_image_request_on_a_video_model_points_to_video(folders, tmp_path):
    session = Session(device="cpu")
    with pytest.raises(InvalidRequest, match="lowvram-gen video") as caught:
        session.generate(GenerationRequest(prompt="a fox", model=folders("wan21"), width=64, height=64, steps=2,
                                           outdir=str(tmp_path)))
    assert caught.value.field == "model" and session.model is None


def test_a_video_request_on_an_image_model_is_refused(tiny_path, tmp_path):
    session = Session(device="cpu")
    with pytest.raises(InvalidRequest, match="Wan 2.1/2.2 and LTX-Video") as caught:
        session.generate(video_request("tiny", tmp_path))
    assert caught.value.field == "model" and session.model is None


def test_the_flow_matching_samplers(folders, tmp_path):
    """'default' and UniPC are the Wan folder's own (UniPC in flow mode); Euler (FlowMatchEuler) and DPM++ 2M (in
    flow mode, the folder's shift kept) make other clips from the same noise; the clip says which ran."""
    session = Session(device="cpu")
    folder = folders("wan21")
    frames = {}
    for sampler in ("default", "UniPC", "Euler", "DPM++ 2M"):
        result = session.generate(video_request(folder, tmp_path / sampler, sampler=sampler))
        frames[sampler] = saved_frames(result.frames).astype(int)
        assert result.sampler == ("UniPCMultistepScheduler" if sampler == "default" else sampler)
        assert frames[sampler].std() > 1
    assert np.abs(frames["UniPC"] - frames["default"]).max() == 0
    assert np.abs(frames["Euler"] - frames["default"]).max() > TOLERANCE
    assert np.abs(frames["DPM++ 2M"] - frames["default"]).max() > TOLERANCE


def test_ltx_takes_its_own_euler_only(folders, tmp_path):
    session = Session(device="cpu")
    with pytest.raises(InvalidRequest, match="use default or Euler"):
        session.generate(video_request(folders("ltx"), tmp_path, sampler="UniPC"))
    assert session.model is None  # refused before loading


def test_a_batch_count_makes_one_clip_per_seed(folders, tmp_path):
    result = Session(device="cpu").generate(video_request(folders("wan21"), tmp_path, batch_count=2))
    assert result.seeds == [SEED, SEED + 1]
    clips = sorted(p for p in tmp_path.iterdir() if p.suffix in (".mp4", ".webp"))
    assert len(clips) == 2 and str(clips[0]) == result.video
    first, second = saved_frames(result.frames[:9]).astype(int), saved_frames(result.frames[9:]).astype(int)
    assert np.abs(first - second).max() > TOLERANCE  # another seed, another clip
    assert any("2 clips made" in w for w in result.warnings)


def test_the_rng_source_draws_the_noise(folders, tmp_path):
    """cpu and gpu are the same generator on this CPU; nv draws an NVIDIA card's noise: another clip from the seed."""
    session = Session(device="cpu")
    folder = folders("wan21")
    frames = {rng: saved_frames(session.generate(video_request(folder, tmp_path / rng, rng=rng)).frames).astype(int)
              for rng in ("gpu", "cpu", "nv")}
    assert np.abs(frames["cpu"] - frames["gpu"]).max() == 0
    assert np.abs(frames["nv"] - frames["gpu"]).max() > TOLERANCE


def test_a_batch_count_of_two_gives_every_clip_in_the_result_the_cli_and_the_api(folders, tmp_path, capsys):
    """batch_count 2 on tiny Wan 2.1: two clips from two seeds; `videos` names both (`video` the first), `video --json`
    and its paths print both, and the API's answer carries both in base64 (`videos`)."""
    import base64
    from types import SimpleNamespace

    from lowvram_gen.api import video as api_video
    from lowvram_gen.cli.output import print_result

    request = video_request(folders("wan21"), tmp_path, batch_count=2, save_frames=False, steps=1)
    result = Session(device="cpu").generate(request)
    assert len(result.videos) == 2 and result.video == result.videos[0] != result.videos[1]
    assert all(Path(p).is_file() for p in result.videos) and len(set(result.seeds)) == 2
    assert result.as_json()["videos"] == result.videos
    print_result(result, False, list(result.videos))
    assert capsys.readouterr().out.splitlines() == result.videos
    answered = api_video.answer(request, SimpleNamespace(error=None, result=result), "test")
    assert [base64.b64decode(v) for v in answered["videos"]] == [Path(p).read_bytes() for p in result.videos]
    assert base64.b64decode(answered["video"]) == Path(result.videos[0]).read_bytes()
    one = dataclasses.replace(result, videos=result.videos[:1])
    assert "videos" not in api_video.answer(request, SimpleNamespace(error=None, result=one), "test")


def test_a_clip_too_big_for_the_card_is_refused_as_the_cards_before_loading(folders, tmp_path, monkeypatch):
    """A simulated 1 GiB card with 64 GiB of RAM (Session.device answers the planner's simulated device, as `plan
    --vram/--ram` makes it): the plan refuses the clip for VRAM, and the job says it is the card, with the error an
    image that fits no rung on the card ends in (OutOfMemoryEverywhere), not NotEnoughRam; nothing loads."""
    from lowvram_gen.errors import NotEnoughRam, OutOfMemoryEverywhere

    real_device = Session.device
    monkeypatch.setattr(Session, "device", lambda self, **kw: real_device(self, vram="1GiB", ram="64GiB"))
    session = Session()
    request = video_request(folders("wan21"), tmp_path, frames=121, width=2048, height=2048)
    plan = session.plan(request.validated(), session.device())
    assert plan.refusal and any(e.fits_host for e in plan.estimates)  # the RAM holds it, the card does not
    with pytest.raises(OutOfMemoryEverywhere, match=r"^not enough VRAM on the card for this clip: .*VRAM") as caught:
        session.generate(request)
    assert not isinstance(caught.value, NotEnoughRam) and session.model is None
    from lowvram_gen.batch.report import retry_or_fix
    from lowvram_gen.errors import ClipTooBigForCard

    # a batch line of such a clip is told what to fix (a retry fails the same way), not "run it again"
    assert isinstance(caught.value, ClipTooBigForCard) and "would fit" in retry_or_fix(caught.value)
