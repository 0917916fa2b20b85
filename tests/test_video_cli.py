"""`lowvram-gen video` (issue 33): its flags and their refusals, the refusals between image and video models before
anything loads (`generate` of a Wan folder, `video` of an image model), `plan --frames/--fps/--init-image`, and a clip
made end to end on the tiny Wan 2.1 folder."""

from __future__ import annotations

import json

import pytest
from PIL import Image

from lowvram_gen.cli import main as cli
from lowvram_gen.cli import video as cli_video

# a Wan 2.1 T2V folder as model_index.json says it (what the refusals read); the weights are only needed to run one
WAN_INDEX = {"_class_name": "WanPipeline", "_diffusers_version": "0.42.1", "boundary_ratio": None,
             "expand_timesteps": False, "scheduler": ["diffusers", "UniPCMultistepScheduler"],
             "text_encoder": ["transformers", "UMT5EncoderModel"], "tokenizer": ["transformers", "T5Tokenizer"],
             "transformer": ["diffusers", "WanTransformer3DModel"], "transformer_2": [None, None],
             "vae": ["diffusers", "AutoencoderKLWan"]}


@pytest.fixture
def wan_index(tmp_path):
    folder = tmp_path / "wan21-tiny"
    folder.mkdir()
    (folder / "model_index.json").write_text(json.dumps(WAN_INDEX))
    return folder


@pytest.fixture
def no_session(monkeypatch):
    """Fails the test if a command gets as far as making a Session (what loads torch and the model)."""
    from lowvram_gen import session

    def refused(*args, **kwargs):
        raise AssertionError("the command should have refused before making a Session")

    monkeypatch.setattr(session, "Session", refused)


def _args(*argv):
    return cli.build_parser().parse_args(["video", *argv])


def test_flags_become_the_video_request(wan_index, tmp_path):
    init = tmp_path / "first.png"
    Image.new("RGB", (32, 32), "red").save(init)
    request = cli_video.request_from_args(_args(
        "a fox", "--model", str(wan_index), "--frames", "9", "--fps", "8", "--width", "64", "--height", "80",
        "--steps", "2", "--cfg", "4.5", "--cfg-2", "3", "--negative", "blur", "--seed", "7", "--init-image", str(init),
        "--save-frames", "--allow-upscale", "--quantize", "int8", "--outdir", str(tmp_path / "out")))
    assert request.is_video
    assert (request.frames, request.fps, request.width, request.height, request.steps) == (9, 8.0, 64, 80, 2)
    assert (request.cfg_scale, request.cfg_scale_2, request.negative_prompt, request.seed) == (4.5, 3.0, "blur", 7)
    assert (request.init_image, request.save_frames, request.allow_upscale) == (str(init), True, True)
    assert (request.quantize, request.outdir, request.model) == ("int8", str(tmp_path / "out"), str(wan_index))


def test_left_out_the_model_decides_frames_fps_and_size(wan_index):
    request = cli_video.request_from_args(_args("a fox", "--model", str(wan_index)))
    assert (request.frames, request.fps, request.cfg_scale, request.cfg_scale_2, request.steps) == (0, None, None,
                                                                                                     None, None)
    assert (request.width, request.height) == (832, 480)  # Wan 2.1's own size, not an image's 512x512
    assert not request.save_frames and not request.allow_upscale


def test_cfg_2_alone_is_fine(wan_index):
    request = cli_video.request_from_args(_args("a fox", "--model", str(wan_index), "--cfg-2", "2.5"))
    assert (request.cfg_scale, request.cfg_scale_2) == (None, 2.5)


def test_memory_flags_are_generates(wan_index):
    ours = {a.dest for a in cli.build_parser()._subparsers._group_actions[0].choices["video"]._actions}
    theirs = {a.dest for a in cli.build_parser()._subparsers._group_actions[0].choices["generate"]._actions}
    memory = {"medvram", "lowvram", "novram", "cpu", "preset", "vram_budget", "ram_budget", "reserve_vram", "xformers",
              "no_half", "no_half_vae", "upcast_sampling", "precision", "quantize", "models_dir", "data_dir"}
    assert memory <= ours and memory <= theirs
    args = _args("a fox", "--model", str(wan_index), "--lowvram", "--vram-budget", "6GB", "--ram-budget", "10GiB")
    kwargs = cli._session_kwargs(args)
    assert (kwargs["preset"], kwargs["vram_budget"], kwargs["ram_budget"]) == ("lowvram", 6 * 2**30, 10 * 2**30)


@pytest.mark.parametrize("argv, message", [
    (["--fps", "0"], "invalid fps: '0'; frames per second must be above 0"),
    (["--fps", "-2"], "invalid fps: -2.0; a number from 0 to 240"),
    (["--frames", "-1"], "invalid frames: -1; a whole number from 0 to 1025 (0: the model's own count)"),
    (["--frames", "nine"], "invalid frames: 'nine'"),
    (["--cfg-2", "99"], "invalid cfg scale 2: 99.0; a number from 0 to 30"),
    (["--init-image", "missing.png"], "invalid init image: 'missing.png'"),
])
def test_bad_input_is_one_sentence_and_exit_2_before_loading(wan_index, no_session, capsys, argv, message):
    assert cli.main(["video", "a fox", "--model", str(wan_index), *argv]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: {message}") and err.count("\n") == 1


def test_a_model_is_required(capsys):
    with pytest.raises(SystemExit) as exc:
        cli.main(["video", "a fox"])
    assert exc.value.code == 2 and "--model" in capsys.readouterr().err


@pytest.mark.parametrize("spec, family", [("tiny", "SD 1.x/2.x"), ("tiny-sdxl", "SDXL"), ("sd15", "SD 1.x/2.x"),
                                          ("flux", "Flux")])
def test_video_refuses_an_image_model_by_name(spec, family, no_session, capsys):
    assert cli.main(["video", "a fox", "--model", spec]) == 2
    assert capsys.readouterr().err == (f"error: invalid model: {spec!r}; {family} makes images; `video` takes Wan "
                                       "2.1/2.2 and LTX-Video (a diffusers folder of one)\n")


def test_video_refuses_the_tiny_sd_folder(tiny_path, no_session, capsys):
    assert cli.main(["video", "a fox", "--model", str(tiny_path), "--frames", "9"]) == 2
    assert "makes images; `video` takes Wan 2.1/2.2 and LTX-Video" in capsys.readouterr().err


@pytest.mark.parametrize("command", ["generate", "img2img"])
def test_generate_refuses_a_wan_folder_pointing_to_video(wan_index, no_session, capsys, tmp_path, command):
    init = tmp_path / "init.png"
    Image.new("RGB", (32, 32)).save(init)
    extra = ["--init", str(init)] if command == "img2img" else []
    assert cli.main([command, "a fox", "--model", str(wan_index), *extra]) == 2
    err = capsys.readouterr().err
    assert err == (f"error: invalid model: {str(wan_index)!r}; Wan 2.1 T2V is a video model: make a clip with "
                   "`lowvram-gen video` (a request with frames), not an image\n")


def test_generate_refuses_a_builtin_video_name(no_session, capsys):
    assert cli.main(["generate", "a fox", "--model", "ltx-video"]) == 2
    assert "LTX-Video is a video model: make a clip with `lowvram-gen video`" in capsys.readouterr().err


def test_what_a_model_is_before_loading(wan_index, tmp_path):
    assert cli_video.is_video_model(str(wan_index)) is True
    assert cli_video.is_video_model("wan22-ti2v-5b") is True and cli_video.is_video_model("ltx-video") is True
    assert cli_video.is_video_model("tiny") is False and cli_video.is_video_model("sdxl") is False
    single = tmp_path / "model.safetensors"
    single.write_bytes(b"")
    assert cli_video.is_video_model(str(single)) is None  # a single file: its keys say it once loaded
    assert cli_video.default_size("wan22-ti2v-5b") == (1280, 704) and cli_video.default_size("sd15") is None


# ------------------------------------------------------------------------------------------------------- plan


class _Planned(Exception):
    """Raised by the stand-in Session.plan with the request it was given (the plan itself is helper "plan"'s)."""


@pytest.fixture
def plan_request(monkeypatch):
    """Session.plan replaced: records its request and stops the command there; model_profile answers a profile of
    the image kind (what it is for a video model is the planner's business, not these flags')."""
    from lowvram_gen.models import profile as profiles
    from lowvram_gen.session import Session

    seen = []

    def plan(self, request, device=None, source=None, profile=None):
        seen.append(request)
        raise _Planned()

    monkeypatch.setattr(Session, "plan", plan)
    monkeypatch.setattr(Session, "model_profile", lambda self, spec, config=None, controlnets=(): (
        profiles.profile_builtin("sd15"), True))
    return seen


def test_plan_frames_fps_and_init_image_reach_the_request(wan_index, plan_request, tmp_path):
    init = tmp_path / "first.png"
    Image.new("RGB", (32, 32)).save(init)
    with pytest.raises(_Planned):
        cli.main(["plan", "--model", str(wan_index), "--frames", "81", "--fps", "16", "--init-image", str(init),
                  "--vram", "8GiB", "--ram", "32GiB"])
    request = plan_request[0]
    assert (request.frames, request.fps, request.init_image) == (81, 16.0, str(init))
    assert (request.width, request.height) == (832, 480)  # the clip's own size where none is given
    with pytest.raises(_Planned):
        cli.main(["plan", "--model", str(wan_index), "--frames", "9", "--width", "64", "--height", "64"])
    assert (plan_request[1].frames, plan_request[1].fps, plan_request[1].width) == (9, None, 64)


def test_plan_without_frames_is_an_image_plan(plan_request):
    with pytest.raises(_Planned):
        cli.main(["plan", "--model", "sd15"])
    assert plan_request[0].frames is None and not plan_request[0].is_video


@pytest.mark.parametrize("argv, message", [
    (["--model", "sd15", "--fps", "8"], "invalid --fps: '8'; it plans a clip: give --frames N too"),
    (["--model", "sd15", "--frames", "9"], "invalid model: 'sd15'; SD 1.x/2.x makes images"),
    (["--model", "wan21-t2v-1.3b", "--frames", "9", "--fps", "0"], "invalid fps: '0'; frames per second must be above"),
    (["--model", "wan21-t2v-1.3b", "--frames", "-1"], "invalid frames: -1; a whole number from 0 to 1025"),
])
def test_plan_refuses_bad_video_flags(argv, message, capsys, no_session):
    assert cli.main(["plan", *argv]) == 2
    assert capsys.readouterr().err.startswith(f"error: {message}")


def test_plan_says_the_clip_on_its_job_line():
    from lowvram_gen.request import GenerationRequest

    assert cli_video.clip_words(GenerationRequest(frames=81, fps=16.0, init_image="a.png")) == (
        ", 81 frames at 16 fps, from a.png")
    assert cli_video.clip_words(GenerationRequest(frames=0)) == ", the model's frame count"
    assert cli_video.clip_words(GenerationRequest()) == ""


# ---------------------------------------------------------------------------------------------- a clip, end to end


@pytest.fixture(scope="module")
def wan21(tmp_path_factory):
    import tiny_video

    return tiny_video.save("wan21", tmp_path_factory.mktemp("video") / "wan21")


def test_video_makes_an_mp4_with_its_frames_and_json(wan21, tmp_path, capsys):
    av = pytest.importorskip("av", reason="PyAV (the video extra) is not installed")
    import numpy as np

    out = tmp_path / "out"
    assert cli.main(["video", "a fox in snow", "--model", str(wan21), "--frames", "9", "--width", "64", "--height",
                     "64", "--steps", "2", "--seed", "7", "--fps", "8", "--save-frames", "--json", "--outdir",
                     str(out), "--cpu"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert {"video", "frames", "preset", "attempts", "seconds", "warnings", "fps", "frame_count"} <= set(data)
    assert data["video"] == str(out / "00000-7-a-fox-in-snow.mp4") and data["images"] == []
    assert (data["frame_count"], data["fps"], data["preset"]) == (9, 8.0, "cpu")
    assert data["frames"] == [str(out / "00000-7-a-fox-in-snow-frames" / f"{i:05d}.png") for i in range(9)]
    assert {a["stage"] for a in data["attempts"]} == {"denoise", "decode"}
    with av.open(data["video"]) as container:
        stream = container.streams.video[0]
        assert stream.average_rate == 8
        assert container.metadata["comment"].startswith("a fox in snow\nSteps: 2")
        decoded = [f.to_ndarray(format="rgb24") for f in container.decode(video=0)]
    pngs = []
    for path in data["frames"]:
        with Image.open(path) as im:
            pngs.append(np.asarray(im.convert("RGB"), dtype=np.int16))
    assert len(decoded) == len(pngs) == 9
    assert all(p.shape == d.shape == (64, 64, 3) for p, d in zip(pngs, decoded))
    assert max(float(np.abs(p - d).mean()) for p, d in zip(pngs, decoded)) < 6  # H.264's loss at crf 18
    sidecar = json.loads((out / "00000-7-a-fox-in-snow.json").read_text())
    assert sidecar["frame_count"] == 9 and sidecar["meta"]["seed"] == 7
    # the frames the command saved are plain diffusers' at the same seed and precision (the issue's 2/255), with the
    # steps, CFG and negative prompt the command ran (the family's CFG 5 where --cfg is not given; no negative)
    import tiny_video

    theirs = tiny_video.plain_frames(tiny_video.plain_pipeline(wan21), 7, prompt="a fox in snow", num_frames=9,
                                     width=64, height=64, num_inference_steps=2, guidance_scale=5.0)
    assert np.abs(tiny_video.saved_frames(data["frames"]).astype(int) - theirs.astype(int)).max() <= 2


def test_video_prints_the_clip_path_without_json(wan21, tmp_path, capsys):
    pytest.importorskip("av")
    out = tmp_path / "out"
    assert cli.main(["video", "fox", "--model", str(wan21), "--frames", "5", "--width", "64", "--height", "64",
                     "--steps", "1", "--seed", "3", "--outdir", str(out), "--cpu"]) == 0
    assert capsys.readouterr().out == f"{out / '00000-3-fox.mp4'}\n"
    assert sorted(p.name for p in out.iterdir()) == ["00000-3-fox.json", "00000-3-fox.mp4"]  # no frames unasked


def test_video_refuses_frames_the_model_cannot_make(wan21, capsys):
    assert cli.main(["video", "fox", "--model", str(wan21), "--frames", "10", "--width", "64", "--height", "64",
                     "--cpu"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: invalid frames: 10; Wan 2.1 T2V makes 4k+1 frames") and "9 or 13" in err


def test_plan_of_a_real_clip_says_its_frames_and_tokens(capsys):
    """The planner's count (helper "plan"'s) as `plan --frames` shows it, at Wan 2.1 1.3B's published shapes."""
    assert cli.main(["plan", "--model", "wan21-t2v-1.3b", "--frames", "81", "--fps", "16", "--vram", "4GiB", "--ram",
                     "32GiB"]) == 0
    out = capsys.readouterr().out
    assert "job: wan21-t2v-1.3b 832x480, batch 1, 81 frames at 16 fps\n" in out
    assert "video: 81 frames -> 21 latent frames, 32760 tokens per forward" in out
    assert cli.main(["plan", "--model", "wan21-t2v-1.3b", "--frames", "33", "--width", "480", "--height", "320",
                     "--vram", "4GiB", "--ram", "32GiB", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert (data["frames"], data["fps"], data["width"], data["height"]) == (33, None, 480, 320)
    assert (data["video"]["frames"], data["video"]["latent_frames"], data["video"]["tokens"]) == (33, 9, 9 * 20 * 30)


def test_ctrl_c_keeps_the_clip_so_far(wan21, tmp_path, capsys, monkeypatch):
    """A Ctrl-C (SIGINT sent to this process) during the first step stops the job at the next one: the clip as it
    was is saved and printed, and the exit code is 130."""
    import signal

    from lowvram_gen.jobs.console import ProgressBar

    real = ProgressBar.update

    def interrupted(self, step, total):
        real(self, step, total)
        if step == 1:
            signal.raise_signal(signal.SIGINT)  # the user's Ctrl-C, in the middle of the job

    monkeypatch.setattr(ProgressBar, "update", interrupted)
    out = tmp_path / "out"
    assert cli.main(["video", "fox", "--model", str(wan21), "--frames", "5", "--width", "64", "--height", "64",
                     "--steps", "3", "--seed", "3", "--outdir", str(out), "--cpu"]) == 130
    captured = capsys.readouterr()
    assert captured.out == f"{out / '00000-3-fox.mp4'}\n" and (out / "00000-3-fox.mp4").is_file()
    assert "stopping at the next step and keeping the clip so far" in captured.err
    assert "cancelled at step 1 of 3" in captured.err
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # the handler is put back


def test_an_init_image_on_a_text_only_model_is_refused_before_loading(wan21, tmp_path, capsys, monkeypatch):
    from lowvram_gen.session import Session

    def no_loading(*args, **kwargs):
        raise AssertionError("the refusal must come before the model loads")

    monkeypatch.setattr(Session, "load_model", no_loading)
    init = tmp_path / "first.png"
    Image.new("RGB", (64, 64), "red").save(init)
    assert cli.main(["video", "fox", "--model", str(wan21), "--frames", "5", "--width", "64", "--height", "64",
                     "--init-image", str(init), "--cpu"]) == 2
    assert capsys.readouterr().err.startswith(f"error: invalid init image: {str(init)!r}; Wan 2.1 T2V is a "
                                              "text-to-video model")


def test_image_to_video_on_wan22_ti2v(tmp_path, capsys):
    """--init-image on the tiny Wan 2.2 TI2V folder: its image mode makes a clip whose first frame starts from it."""
    pytest.importorskip("av")
    import tiny_video

    folder = tiny_video.save("wan22-ti2v", tmp_path / "wan22-ti2v")
    init = tmp_path / "first.png"
    Image.new("RGB", (64, 64), (200, 40, 40)).save(init)
    out = tmp_path / "out"
    assert cli.main(["video", "a red fox", "--model", str(folder), "--frames", "5", "--width", "64", "--height", "64",
                     "--steps", "2", "--seed", "5", "--init-image", str(init), "--outdir", str(out), "--json",
                     "--cpu"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["video"] == str(out / "00000-5-a-red-fox.mp4") and data["frame_count"] == 5 and data["fps"] == 24.0
    sidecar = json.loads((out / "00000-5-a-red-fox.json").read_text())
    assert sidecar["meta"]["request"]["init_image"] == str(init)


def test_plan_of_a_tiny_clip_counts_the_clips_tokens_in_text_and_json(wan21, capsys):
    """`plan --frames` on the tiny Wan 2.1 folder: the shapes line and the JSON's `shapes.tokens` are the clip's tokens
    (every latent frame's), not one frame's; worked out here from the folder's own VAE and transformer configs."""
    vae = json.loads((wan21 / "vae" / "config.json").read_text())
    patch = json.loads((wan21 / "transformer" / "config.json").read_text())["patch_size"]
    temporal, spatial = 2 ** sum(map(bool, vae["temperal_downsample"])), 2 ** len(vae["temperal_downsample"])
    frames, side = 9, 64
    per_frame = (side // spatial // patch[1]) * (side // spatial // patch[2])
    clip = ((frames - 1) // temporal + 1) * per_frame
    argv = ["plan", "--model", str(wan21), "--frames", str(frames), "--width", str(side), "--height", str(side),
            "--vram", "4GiB", "--ram", "16GiB"]
    assert cli.main(argv) == 0
    out = capsys.readouterr().out
    shapes = next(ln for ln in out.splitlines() if ln.startswith("shapes:"))
    assert shapes.endswith(f": {clip} tokens") and "image tokens" not in out
    assert out.count(f"video: {frames} frames -> {(frames - 1) // temporal + 1} latent frames, {clip} tokens") == 1
    assert cli.main([*argv, "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["shapes"]["tokens"] == data["video"]["tokens"] == clip != per_frame
    assert data["shapes"]["video"]["latent_frames"] == (frames - 1) // temporal + 1
