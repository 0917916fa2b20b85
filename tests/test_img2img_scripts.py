"""A1111's img2img scripts Loopback and SD upscale (lowvram_gen/img2img_scripts, issue 32's Forge table).

The rules are checked as data (A1111's loopback strengths per curve, its split_grid positions for several sizes, its
combine_grid feather on hand-made tiles), the logic of seeds, batches and Interrupt with a fake job runner (it saves
a small PNG per job, no model), and the whole on the embedded tiny SD model at 64 px and 2 steps: a loop's init is
the last loop's image, the result equals the passes run by hand through the Session, each SD upscale tile is its own
64 px job, and a simulated out-of-memory in one tile's UNet steps down the ladder while the image still completes.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from lowvram_gen import GenerationRequest, outputs
from lowvram_gen.cli.main import main
from lowvram_gen.errors import Cancelled, InvalidRequest
from lowvram_gen.img2img_scripts import scripts, sd_upscale, tile_grid
from lowvram_gen.img2img_scripts.loopback import run_loopback, strengths
from lowvram_gen.img2img_scripts.sd_upscale import run_sd_upscale
from lowvram_gen.result import GenerationResult
from lowvram_gen.session import Session

SIDE = 64


def pixels(path) -> np.ndarray:
    with Image.open(path) as im:
        return np.asarray(im.convert("RGB"), dtype=np.int16)


@pytest.fixture(scope="module")
def init(tmp_path_factory) -> str:
    """A 64 px gradient: an upscale of it is not flat."""
    path = tmp_path_factory.mktemp("init") / "init.png"
    ramp = np.linspace(0, 255, SIDE, dtype=np.uint8)
    Image.fromarray(np.stack([np.tile(ramp, (SIDE, 1)), np.tile(ramp[:, None], (1, SIDE)),
                              np.full((SIDE, SIDE), 120, np.uint8)], axis=-1)).save(path)
    return str(path)


def request(init, outdir, **fields) -> GenerationRequest:
    base = dict(prompt="a boat", width=SIDE, height=SIDE, steps=2, seed=5, sampler="Euler", cfg_scale=1.0,
                init_image=init, strength=0.6, outdir=str(outdir))
    return GenerationRequest(**{**base, **fields})


def fake_runner(fail_at: int | None = None):
    """A job runner without a model: job k saves a PNG of the job's size, its colour from the seed. `fail_at`: the
    1-based call that is interrupted (Cancelled, its own stopped image kept as the real job keeps it)."""
    calls: list[GenerationRequest] = []

    def run_one(job: GenerationRequest) -> GenerationResult:
        calls.append(job)
        colour = (job.seed * 37 % 256, job.seed * 91 % 256, 60)
        path = outputs.save_png(Image.new("RGB", (job.width, job.height), colour),
                                outputs.next_image_path(job.outdir, job.seed, job.prompt),
                                f"{job.prompt}\nSteps: 1, Seed: {job.seed}, Size: {job.width}x{job.height}", {})
        if fail_at == len(calls):
            raise Cancelled("cancelled at step 1; 1 finished image(s) kept", [str(path)])
        return GenerationResult([str(path)], [job.seed], job.width, job.height, 1, "Euler", "fake", "", 0.0, "cpu",
                                [], "done", job.width, job.height, False, "cpu")

    run_one.calls = calls
    return run_one


# --------------------------------------------------------------------------------------------- Loopback: rules


@pytest.mark.parametrize("curve, expected", [
    # A1111's calculate_denoising_strength(i) for 4 loops from 0.75 to 0.25: p = i / 3 through the curve
    ("Linear", [0.75, 0.5833333333, 0.4166666667, 0.25]),
    ("Aggressive", [0.75, 0.5, 0.3169872981, 0.25]),  # sin(p pi/2): 0, 0.5, 0.866, 1
    ("Lazy", [0.75, 0.6830127019, 0.5, 0.25]),  # 1 - cos(p pi/2): 0, 0.134, 0.5, 1
])
def test_loopback_strengths_per_curve_are_a1111s(curve, expected):
    assert strengths(4, 0.75, 0.25, curve) == pytest.approx(expected, abs=1e-9)
    assert strengths(1, 0.75, 0.25, curve) == [0.75]  # one loop keeps the request's


def test_loopback_seeds_batches_and_grid_as_a1111(init, tmp_path):
    """Batch count 2 of 3 loops: the seed goes on up through the chains, each chain starts from the original init
    at the request's strength, the grid holds each chain's last image; the loops say `loop i/n · batch b/c`."""
    run_one, lines = fake_runner(), []
    result = run_loopback(request(init, tmp_path, batch_count=2, batch_size=3), run_one, loops=3,
                          final_denoising_strength=0.3, on_part=lambda i, n, line: lines.append((i, n, line)))
    calls = run_one.calls
    assert [c.seed for c in calls] == [5, 6, 7, 8, 9, 10]
    assert [c.strength for c in calls] == pytest.approx([0.6, 0.45, 0.3] * 2)
    assert [c.init_image for c in calls] == [init, result.images[0], result.images[1],
                                             init, result.images[3], result.images[4]]
    assert {(c.batch_size, c.batch_count) for c in calls} == {(1, 1)}
    assert lines[0] == (1, 6, "loop 1/3 · batch 1/2") and lines[-1] == (6, 6, "loop 3/3 · batch 2/2")
    assert result.final == [result.images[2], result.images[5]]
    assert any("batch size 3 ran as 1" in w for w in result.warnings)
    grid = pixels(result.grid)
    assert grid.shape == (SIDE, 2 * SIDE, 3)
    assert (grid[:, :SIDE] == pixels(result.images[2])).all() and (grid[:, SIDE:] == pixels(result.images[5])).all()
    assert outputs.read_png_metadata(result.grid)[0] == ""  # A1111 writes no parameters for its loopback grid


def test_loopback_inpaint_repaints_the_original_from_the_second_loop(init, tmp_path):
    mask = tmp_path / "mask.png"
    Image.new("L", (SIDE, SIDE), 255).save(mask)
    run_one = fake_runner()
    run_loopback(request(init, tmp_path, mask=str(mask), masked_content="fill"), run_one, loops=3)
    assert [c.masked_content for c in run_one.calls] == ["fill", "original", "original"]


def test_loopback_interrupt_keeps_the_loops_done(init, tmp_path):
    run_one = fake_runner(fail_at=3)
    with pytest.raises(Cancelled, match=r"Loopback interrupted in loop 3/4: 2 finished loop image\(s\) kept") as got:
        run_loopback(request(init, tmp_path), run_one, loops=4)
    kept = got.value.images
    assert len(kept) == 4  # the grid of the two finished (first, as A1111's), loops 1 and 2, the stopped loop's own
    assert all(Path(p).is_file() for p in kept) and "grid" in Path(kept[0]).name
    assert len(run_one.calls) == 3


@pytest.mark.parametrize("kwargs, match", [
    ({"loops": 0}, "invalid loops: 0; a whole number from 1 to 32"),
    ({"loops": 33}, "invalid loops: 33"),
    ({"final_denoising_strength": 1.5}, "invalid final denoising strength: 1.5; a number from 0 to 1"),
    ({"denoising_curve": "Steep"}, "invalid denoising curve: 'Steep'; one of Aggressive, Linear, Lazy"),
    ({"append_interrogation": "CLIP"}, "interrogate \\(CLIP, DeepBooru\\) is not built"),
])
def test_loopback_bad_input_is_named(init, tmp_path, kwargs, match):
    run_one = fake_runner()
    with pytest.raises(InvalidRequest, match=match):
        run_loopback(request(init, tmp_path), run_one, **kwargs)
    with pytest.raises(InvalidRequest, match="invalid init image: None; Loopback starts from an image"):
        run_loopback(request(None, tmp_path), run_one)
    assert not run_one.calls


# ---------------------------------------------------------------------------------- Loopback on the tiny model


@pytest.fixture(scope="module")
def session():
    return Session(device="cpu")


@pytest.fixture(scope="module")
def looped(session, init, tmp_path_factory):
    seen = []

    def run_one(job):
        seen.append(job)
        return session.generate(job)

    result = run_loopback(request(init, tmp_path_factory.mktemp("loop")), run_one, loops=2)
    return result, seen


def test_each_loop_starts_from_the_last_loops_image(looped):
    result, seen = looped
    assert [j.init_image for j in seen] == [seen[0].init_image, result.images[0]]
    assert result.final == [result.images[1]] and len(result.images) == 2
    text = outputs.read_png_metadata(result.images[1])[0]
    assert "Seed: 6," in text and "Denoising strength: 0.5," in text
    assert text.endswith("Final denoising strength: 0.5, Denoising curve: Linear")  # A1111's labels, not its title
    assert pixels(result.grid).shape == (SIDE, 2 * SIDE, 3)  # one batch: every loop in the grid


def test_loopback_equals_the_passes_run_by_hand(looped, session, init, tmp_path):
    result, _ = looped
    previous = init
    for i, strength in enumerate([0.6, 0.5]):
        made = session.generate(request(previous, tmp_path, seed=5 + i, strength=strength)).images[0]
        assert (pixels(made) == pixels(result.images[i])).all()
        previous = made


# ------------------------------------------------------------------------------------------ SD upscale: rules


@pytest.mark.parametrize("image, tile, overlap, xs, ys", [
    # A1111's split_grid: cols = ceil((W - overlap) / (tile - overlap)), spread evenly, the last flush to the edge
    ((1024, 1024), (512, 512), 64, (0, 256, 512), (0, 256, 512)),
    ((96, 96), (64, 64), 32, (0, 32), (0, 32)),
    ((1000, 600), (512, 512), 64, (0, 244, 488), (0, 88)),
    ((512, 512), (512, 512), 64, (0,), (0,)),
    ((1280, 720), (512, 512), 128, (0, 384, 768), (0, 208)),
    ((1100, 700), (256, 192), 16, (0, 211, 422, 633, 844), (0, 169, 338, 508)),
    ((128, 64), (64, 64), 0, (0, 64), (0,)),
])
def test_the_tile_grid_is_a1111s_split(image, tile, overlap, xs, ys):
    grid = tile_grid.split(*image, *tile, overlap)
    assert grid.rows == tuple((y, xs) for y in ys)
    assert grid.shape == (len(xs), len(ys))
    assert grid.boxes[-1] == (xs[-1], ys[-1], xs[-1] + tile[0], ys[-1] + tile[1])


def test_the_combine_feathers_the_overlap_as_a1111():
    """Hand-made: a black tile then a white one, 8 px tiles overlapping 4 px: A1111's mask over the overlap is
    int(i x 255 / 4) = 0, 63, 127, 191, so those columns (then lines) read exactly that."""
    black, white = Image.new("RGB", (8, 8), 0), Image.new("RGB", (8, 8), (255, 255, 255))
    across = np.asarray(tile_grid.combine(tile_grid.split(12, 8, 8, 8, 4), [black, white]))[:, :, 0]
    assert (across == [0, 0, 0, 0, 0, 63, 127, 191, 255, 255, 255, 255]).all()
    down = np.asarray(tile_grid.combine(tile_grid.split(8, 12, 8, 8, 4), [black, white]))[:, :, 0]
    assert (down.T == [0, 0, 0, 0, 0, 63, 127, 191, 255, 255, 255, 255]).all()
    # 2x2: the rows are joined first, then the bottom row over the top one
    four = np.asarray(tile_grid.combine(tile_grid.split(12, 12, 8, 8, 4), [black, white, white, black]))[:, :, 0]
    assert (four[0] == [0, 0, 0, 0, 0, 63, 127, 191, 255, 255, 255, 255]).all()
    assert (four[11] == [255, 255, 255, 255, 255, 192, 128, 64, 0, 0, 0, 0]).all()
    assert four[6, 0] == round(255 * 127 / 255 + 0 * (1 - 127 / 255))  # line 6: weight 127 of the bottom row
    with_none = np.asarray(tile_grid.combine(tile_grid.split(16, 8, 8, 8, 0), [black, white]))[0, :, 0]
    assert (with_none == [0] * 8 + [255] * 8).all()  # no overlap: pasted side by side


def test_sd_upscale_seeds_go_by_a1111s_batches_of_tiles(init, tmp_path):
    """4 tiles in groups of batch size 2: group i at start + i, tile j of it + j; batch n of the count at seed + n;
    the tiles are never saved, one assembled image per batch is."""
    run_one, lines = fake_runner(), []
    result = run_sd_upscale(request(init, tmp_path / "out", batch_size=2, batch_count=2), run_one, overlap=32,
                            scale_factor=1.5, usable_ram=2**30, on_part=lambda i, n, line: lines.append(line))
    assert [c.seed for c in run_one.calls] == [5, 6, 6, 7, 6, 7, 7, 8]
    assert result.seeds == [5, 6] and [Path(p).name for p in result.images] == ["00000-5-a-boat.png",
                                                                                 "00001-6-a-boat.png"]
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["00000-5-a-boat.png", "00001-6-a-boat.png"]
    assert lines[:2] == ["tile 1/4 · batch 1/2", "tile 2/4 · batch 1/2"]
    assert not Path(run_one.calls[0].init_image).exists()  # the temporary tiles are removed


def test_sd_upscale_interrupt_saves_no_half_image(init, tmp_path, monkeypatch):
    work = tmp_path / "work"
    monkeypatch.setattr(sd_upscale.tempfile, "mkdtemp", lambda prefix: (work.mkdir(), str(work))[1])
    with pytest.raises(Cancelled, match=r"SD upscale interrupted in tile 2/4 · batch 2/2: a half-assembled image is "
                                        r"not saved; 1 finished upscale\(s\) kept") as got:
        run_sd_upscale(request(init, tmp_path / "out", batch_count=2), fake_runner(fail_at=6), overlap=32,
                       scale_factor=1.5, usable_ram=2**30)
    assert [Path(p).name for p in got.value.images] == ["00000-5-a-boat.png"]
    assert [p.name for p in (tmp_path / "out").iterdir()] == ["00000-5-a-boat.png"]
    assert not work.exists()


@pytest.mark.parametrize("fields, kwargs, match", [
    ({}, {"overlap": 64}, "invalid SD upscale overlap: 64; a whole number from 0 to 63 px, smaller than the tile"),
    ({}, {"upscaler": "Latent"}, "invalid SD upscale upscaler: 'Latent'; one of None, Lanczos, Nearest"),
    ({}, {"upscaler": "4x-Nothing"}, "invalid SD upscale upscaler: '4x-Nothing'; one of None, Lanczos"),
    ({}, {"upscaler": 9}, "an index from 0 to"),
    ({}, {"scale_factor": 1}, "invalid SD upscale scale: 1; above 1, at most 8"),
    ({}, {"scale_factor": 9}, "invalid SD upscale scale: 9; a number from 0 to 8"),
    ({}, {"scale_factor": 4, "usable_ram": 10**6}, r"256x256 needs about .* of system RAM and .* is usable"),
    ({"width": 128}, {"upscaler": "None"}, r"invalid width and height: '128x64'; the tile must fit in the image it "
                                           r"cuts \(64x64\)"),
    ({"init_image": None}, {}, "invalid init image: None; SD upscale upscales an image"),
])
def test_sd_upscale_bad_input_is_named(init, tmp_path, fields, kwargs, match):
    run_one = fake_runner()
    with pytest.raises(InvalidRequest, match=match):
        run_sd_upscale(request(init, tmp_path, **fields), run_one, **{"usable_ram": 2**30, "overlap": 32, **kwargs})
    assert not run_one.calls


def test_the_descriptors_take_a1111s_script_args():
    loop = scripts.find("loopback")
    assert loop.title == "Loopback" and loop.defaults() == [4, 0.5, "Linear", "None"]
    assert loop.args_from_script_args([2, 0.3]) == {"loops": 2, "final_denoising_strength": 0.3,
                                                    "denoising_curve": "Linear", "append_interrogation": "None"}
    up = scripts.find("SD Upscale")
    assert up.title == "SD upscale" and up.defaults() == ["", 64, 0, 2.0]
    assert up.args_from_script_args([None, 32, "Lanczos", 1.5]) == {"overlap": 32, "upscaler": "Lanczos",
                                                                     "scale_factor": 1.5}
    assert sd_upscale.check_upscaler(0) == "None" and sd_upscale.check_upscaler("lanczos") == "Lanczos"
    assert scripts.find("x/y/z plot") is None
    with pytest.raises(InvalidRequest, match="Loopback takes at most 4"):
        loop.args_from_script_args([1, 2, 3, 4, 5])


# --------------------------------------------------------------------------------- SD upscale on the tiny model


def test_sd_upscale_runs_each_tile_as_its_own_job(session, init, tmp_path):
    made = []

    def run_one(job):
        result = session.generate(job)
        with Image.open(result.images[0]) as im:
            made.append(im.convert("RGB"))
        return result

    out = tmp_path / "out"
    result = run_sd_upscale(request(init, out, strength=0.3), run_one, overlap=32, upscaler="Lanczos",
                            scale_factor=1.5)
    assert len(result.jobs) == 4
    for job in result.jobs:  # the tile's own plan: every attempt at the tile's 64 px
        assert (job.width, job.height) == (SIDE, SIDE)
        assert {(a["width"], a["height"]) for a in job.attempts} == {(SIDE, SIDE)}
    assert [j.seeds for j in result.jobs] == [[5], [6], [7], [8]]
    image = pixels(result.final[0])
    assert image.shape == (96, 96, 3)  # 64 x 1.5
    grid = tile_grid.split(96, 96, SIDE, SIDE, 32)
    assert (image == np.asarray(tile_grid.combine(grid, made), dtype=np.int16)).all()
    text = outputs.read_png_metadata(result.final[0])[0]
    assert "Seed: 5, Size: 64x64," in text and "Denoising strength: 0.3," in text  # the first tile's, as A1111
    assert text.endswith("SD upscale overlap: 32, SD upscale upscaler: Lanczos")
    assert [p.name for p in out.iterdir()] == [Path(result.final[0]).name]  # the tiles are not saved


def test_an_out_of_memory_in_one_tile_steps_down_and_the_image_completes(init, tmp_path):
    """Simulated: the UNet raises torch.OutOfMemoryError (what CUDA raises) in every step of the second tile's job
    while no offload is applied (highvram); that job steps down to medvram and the image is assembled."""
    session = Session(preset="highvram")
    hooks = []

    def run_one(job):
        if len(hooks) == 0 and session.model is not None:  # the second tile: the model is loaded by the first
            def oom(_module, _args):
                if session.runner.applied.offload == "none":
                    raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB (simulated)")

            hooks.append(session.model.pipe.unet.register_forward_pre_hook(oom))
        try:
            return session.generate(job)
        finally:
            for handle in hooks:
                handle.remove()

    wide = tmp_path / "wide.png"
    Image.new("RGB", (96, SIDE), (200, 100, 50)).save(wide)  # upscaler None: two 64 px tiles of it as it is
    result = run_sd_upscale(request(str(wide), tmp_path / "out"), run_one, overlap=32, upscaler="None",
                            scale_factor=2)
    first, second = result.jobs
    assert [(a["preset"], a["stage"], a["outcome"]) for a in first.attempts] == [
        ("highvram", "denoise", "ok"), ("highvram", "decode", "ok")]
    assert [(a["preset"], a["stage"], a["outcome"]) for a in second.attempts][:2] == [
        ("highvram", "denoise", "oom"), ("medvram", "denoise", "ok")]
    assert pixels(result.final[0]).shape == (SIDE, 96, 3)
    assert result.warnings[0] == "upscaler None upscales nothing (A1111's): scale 2 not used"


# ------------------------------------------------------------------------------------------------------ the CLI


def test_the_cli_runs_loopback_with_json(init, tmp_path, capsys):
    code = main(["img2img", "a boat", "--init", init, "--loopback", "2", "--loopback-curve", "lazy", "--steps", "2",
                 "--width", "64", "--height", "64", "--sampler", "Euler", "--cfg", "1", "--seed", "3",
                 "--outdir", str(tmp_path), "--cpu", "--json"])
    captured = capsys.readouterr()
    assert code == 0
    data = json.loads(captured.out)
    assert data["script"] == "Loopback" and data["seeds"] == [3, 4] and len(data["images"]) == 2
    assert data["final"] == data["images"][-1:] and Path(data["grid"]).is_file()
    assert "loop 1/2" in captured.err and "loop 2/2" in captured.err
    assert outputs.read_png_metadata(data["images"][0])[0].endswith("Denoising curve: Lazy")


def test_the_cli_names_bad_script_input_before_any_job(init, tmp_path, capsys):
    base = ["img2img", "a boat", "--init", init, "--outdir", str(tmp_path), "--cpu"]
    assert main([*base, "--sd-upscale", "1"]) == 2
    assert "error: invalid SD upscale scale: '1'; above 1" in capsys.readouterr().err
    assert main([*base, "--loopback", "40"]) == 2
    assert "error: invalid loops: 40; a whole number from 1 to 32" in capsys.readouterr().err
    with pytest.raises(SystemExit):  # one script at a time
        main([*base, "--loopback", "2", "--sd-upscale", "2"])
    assert "not allowed with argument" in capsys.readouterr().err
    assert not list(tmp_path.iterdir())


def test_the_progress_line_says_the_part_first():
    """jobs/progress.py's PartProgress, the script's on_part: `tile i/n` before the step; the fraction and the ETA
    count the parts to come (a clock of the test's own: one second a step)."""
    from lowvram_gen.jobs.progress import PartProgress

    now = [0.0]
    progress = PartProgress(now=lambda: now[0])
    progress.part(1, 3, "tile 1/3")
    progress.update(1, 4)
    now[0] = 1.0
    progress.update(2, 4)
    assert progress.line() == "tile 1/3 · Step 2/4 · ETA 0:10"  # 2 steps of this tile and 8 of the two to come
    assert progress.fraction() == pytest.approx(0.5 / 3)
    progress.part(2, 3, "tile 2/3")
    now[0] = 5.0
    progress.update(1, 4)
    assert progress.line().startswith("tile 2/3 · Step 1/4 · ETA ")
    assert progress.fraction() == pytest.approx(1.25 / 3)
