"""Issue 32 item 3, A1111's X/Y/Z plot (lowvram_gen/xyz): its value syntax, its axes on the tiny SD model (a cell is
the same image as its request run alone), ours (Preset, VRAM budget, Quantize) with each cell labelled with its
s/step and peak memory, Interrupt keeping the finished cells and their grid, the cell cap, the messages of a bad axis
or value, and the CLI's `--xyz-x/-y/-z` with `--json`."""

from __future__ import annotations

import json
import threading
from dataclasses import replace

import numpy as np
import pytest
from PIL import Image

from lowvram_gen import GenerationRequest
from lowvram_gen.cli.main import main
from lowvram_gen.errors import InvalidRequest
from lowvram_gen.outputs import parse_a1111_parameters, read_png_metadata
from lowvram_gen.session import Session
from lowvram_gen.xyz import axes, grid as grids
from lowvram_gen.xyz.runner import run_grid
from lowvram_gen.xyz.values import float_values, int_values, join_csv, split_csv

BASE = dict(prompt="a red cat", negative_prompt="blurry", width=64, height=64, steps=2, cfg_scale=6.0, seed=11)


def pixels(path) -> np.ndarray:
    with Image.open(path) as image:
        return np.asarray(image.convert("RGB")).astype(int)


@pytest.fixture(scope="module")
def session(tiny_path):
    return Session()


# ---------------------------------------------------------------------------------------------- value syntax


@pytest.mark.parametrize("text,expected", [
    ("1, 2, 3", [1, 2, 3]),
    ("1-5", [1, 2, 3, 4, 5]),
    ("1-10 (+3)", [1, 4, 7, 10]),
    ("1-10 (+4)", [1, 5, 9]),
    ("10-1 (-3)", [10, 7, 4, 1]),
    ("1-10 [4]", [1, 4, 7, 10]),
    ("1-10 [3]", [1, 5, 10]),  # A1111's int(linspace): 5.5 -> 5
    (" -3 - 3 (+3), 7", [-3, 0, 3, 7]),
])
def test_whole_number_values_and_ranges(text, expected):
    assert int_values("Steps", split_csv(text)) == expected


@pytest.mark.parametrize("text,expected", [
    ("5, 7.5", [5.0, 7.5]),
    ("0.5-1 (+0.25)", [0.5, 0.75, 1.0]),
    ("5-8 [4]", [5.0, 6.0, 7.0, 8.0]),
    ("0.1-0.3 (+0.1)", [0.1, 0.2, 0.3]),  # the end counts where the steps reach it, float error or not
    ("1-2 (+0.3)", [1.0, 1.3, 1.6, 1.9]),
])
def test_number_values_and_ranges(text, expected):
    assert float_values("CFG Scale", split_csv(text)) == pytest.approx(expected)


def test_values_are_one_csv_line_with_quotes():
    assert split_csv('cat, "a dog, sitting", bird ') == ["cat", "a dog, sitting", "bird"]
    assert split_csv(join_csv(["a, b", 'say "hi"'])) == ["a, b", 'say "hi"']


@pytest.mark.parametrize("axis,text,said", [
    ("Steps", "1, two", "'two'; a whole number or a range"),
    ("CFG Scale", "5, x7", "'x7'; a number or a range"),
    ("Steps", "1-100000", "at most 1000 values"),
    ("Steps", "5-1 (+1)", "step must go from its start towards its end"),
])
def test_a_bad_value_names_the_axis_the_value_and_what_is_allowed(axis, text, said):
    with pytest.raises(InvalidRequest) as bad:
        grids.build(GenerationRequest(**BASE), (axis, text))
    assert axis in str(bad.value) and said in str(bad.value) and "\n" not in str(bad.value)


def test_an_unknown_or_unbuilt_axis_is_refused_naming_the_built_ones():
    with pytest.raises(InvalidRequest, match="invalid X type: 'Sedd'; the txt2img axes are: Nothing, Seed, "):
        grids.build(GenerationRequest(**BASE), ("Sedd", "1"))
    with pytest.raises(InvalidRequest, match="'Sigma Churn'; that A1111 axis is not built in lowvram-gen"):
        grids.build(GenerationRequest(**BASE), (), ("Sigma Churn", "1"))
    with pytest.raises(InvalidRequest, match="invalid Y type: 'Hires steps'; A1111 has it on its txt2img tab only"):
        grids.build(GenerationRequest(**BASE), ("Seed", "1"), ("Hires steps", "1"), tab="img2img")


def test_axes_by_a1111_index_as_its_api_sends_them():
    # A1111's txt2img list: 0 Nothing, 1 Seed, 4 Steps, 6 CFG Scale, 7 Prompt S/R, 9 Sampler ... our three last
    assert [axes.find_axis(i).label for i in (0, 1, 4, 6, 7, 9, 11, 17, 22, 27, 28)] == [
        "Nothing", "Seed", "Steps", "CFG Scale", "Prompt S/R", "Sampler", "Checkpoint name", "Schedule type",
        "Clip skip", "VAE", "Styles"]
    listed = axes.axes_for("txt2img")
    assert [a.label for a in listed[-3:]] == ["Preset", "VRAM budget", "Quantize"] and len(listed) == 41
    img2img = axes.axes_for("img2img")
    assert img2img[6].label == "Image CFG Scale" and img2img[9].label == "Sampler" and img2img[22].label == "Denoising"


def test_prompt_sr_needs_its_first_value_in_the_prompt_and_replaces_it_in_both():
    with pytest.raises(InvalidRequest, match="invalid Prompt S/R value: 'dog'; the first value"):
        grids.build(GenerationRequest(**BASE), ("Prompt S/R", "dog, bird"))
    grid = grids.build(GenerationRequest(**{**BASE, "negative_prompt": "red"}), ("Prompt S/R", "red, blue"))
    assert [(c.request.prompt, c.request.negative_prompt) for c in grid.cells] == [
        ("a red cat", "red"), ("a blue cat", "blue")]
    assert grid.x.legends == ["red", "blue"]  # A1111 draws a Prompt S/R value alone


def test_prompt_order_puts_the_values_back_in_each_order():
    grid = grids.build(GenerationRequest(**{**BASE, "prompt": "cat, red, big"}), ("Prompt order", "cat, big"))
    assert [c.request.prompt for c in grid.cells] == ["cat, red, big", "big, red, cat"]


def test_seed_minus_one_is_drawn_once_per_value_and_the_base_seed_once_per_grid():
    grid = grids.build(GenerationRequest(**{**BASE, "seed": -1}), ("Seed", "-1, 5, -1"), ("CFG Scale", "5, 7"))
    seeds = [c.request.seed for c in grid.cells]
    assert seeds[:3] == seeds[3:] and seeds[1] == 5 and -1 not in seeds
    grid = grids.build(GenerationRequest(**{**BASE, "seed": -1}), ("CFG Scale", "5, 7"))
    assert grid.cells[0].request.seed == grid.cells[1].request.seed >= 0
    kept = grids.build(GenerationRequest(**{**BASE, "seed": -1}), ("CFG Scale", "5, 7"), no_fixed_seeds=True)
    assert {c.request.seed for c in kept.cells} == {-1}  # A1111's "Keep -1 for seeds"


def test_the_cap_is_one_sentence_before_any_cell_and_a_flag_raises_it():
    with pytest.raises(InvalidRequest) as refused:
        grids.build(GenerationRequest(**BASE), ("Seed", "1-9"), ("Steps", "1-8"))
    assert "that is 72 cells and a grid may have at most 64 (raise the cap with --xyz-max-cells)" in str(refused.value)
    assert len(grids.build(GenerationRequest(**BASE), ("Seed", "1-9"), ("Steps", "1-8"), max_cells=72)) == 72


def test_a1111_run_order_puts_the_costliest_axis_outermost():
    grid = grids.build(GenerationRequest(**BASE), ("Checkpoint name", "tiny, tiny"), ("Seed", "1, 2"))
    assert grid.order == (0, 2, 1, 3)  # both seeds of the first checkpoint, then the second's
    plain = grids.build(GenerationRequest(**BASE), ("Seed", "1, 2"), ("Steps", "1, 2"))
    assert plain.order == (0, 1, 2, 3)


# ------------------------------------------------------------------------- each axis on the tiny SD model

HIRES = dict(hires_scale=1.5, hires_steps=1)
# axis -> (values, the base's extra fields, the second value's fields in a request built by hand)
AXES = {
    "Seed": ("3, 4", {}, {"seed": 4}),
    "Var. seed": ("3, 4", {"subseed_strength": 0.5}, {"subseed": 4}),
    "Var. strength": ("0.2, 0.6", {"subseed": 9}, {"subseed_strength": 0.6}),
    "Steps": ("1, 3", {}, {"steps": 3}),
    "Hires steps": ("1, 2", HIRES, {"hires_steps": 2}),
    "CFG Scale": ("5, 9", {}, {"cfg_scale": 9.0}),
    "Prompt S/R": ("red, blue", {}, {"prompt": "a blue cat"}),
    "Sampler": ("Euler, Euler a", {}, {"sampler": "Euler a"}),
    "Schedule type": ("Automatic, Karras", {"sampler": "Euler"}, {"schedule_type": "karras"}),
    "Clip skip": ("1, 2", {}, {"clip_skip": 2}),
    "Denoising": ("0.3, 0.6", HIRES, {"hires_denoise": 0.6}),
    "Hires upscaler": ("Latent, Lanczos", HIRES, {"hires_upscaler": "Lanczos"}),
    "VAE": ("Automatic, None", {}, {"vae": "None"}),  # both the model's own: no VAE file in a test home
    "UniPC Order": ("1, 2", {"sampler": "UniPC", "steps": 3}, {"unipc_order": 2}),
    "RNG source": ("GPU, CPU", {}, {"rng": "cpu"}),
    "Checkpoint name": ("tiny, tiny", {}, {"model": "tiny"}),
    "Preset": ("cpu, medvram", {}, {"preset": "medvram"}),
    "Quantize": ("auto, none", {}, {"quantize": "none"}),
    "VRAM budget": ("none, 2GB", {}, {}),  # a budget is the card's: on a CPU the image is the same
}


@pytest.mark.parametrize("label", list(AXES))
def test_each_axis_cell_is_the_same_image_as_its_request_run_alone(label, session, tmp_path):
    values, base, second = AXES[label]
    request = GenerationRequest(**{**BASE, **base})
    result = run_grid(session, grids.build(request, (label, values)), str(tmp_path / "grid"))
    assert [bool(c.images) and not c.error for c in result.cells] == [True, True]
    alone = session.generate(replace(request, outdir=str(tmp_path / "alone"), **second))
    assert np.array_equal(pixels(result.cells[1].images[0]), pixels(alone.images[0]))
    with Image.open(result.grid) as drawn:  # the grid holds both cells, a legend above them
        assert drawn.width == 2 * alone.width and drawn.height > alone.height


STYLES_CSV = ('name,prompt,negative_prompt\r\n"oil","{prompt}, oil painting","photo"\r\n'
              '"dark","dark night","bright"\r\n')


def test_styles_axis_adds_each_values_styles_to_the_requests(tmp_path):
    (tmp_path / "styles.csv").write_text(STYLES_CSV, encoding="utf-8")
    styled = Session(styles_file=str(tmp_path / "styles.csv"))
    request = GenerationRequest(**BASE, styles=("oil",))
    grid = grids.build(request, ("Styles", '"dark", oil'))
    assert [c.request.styles for c in grid.cells] == [("oil", "dark"), ("oil",)]
    result = run_grid(styled, grid, str(tmp_path / "grid"))
    assert [bool(c.images) and not c.error for c in result.cells] == [True, True]
    alone = styled.generate(replace(request, styles=("oil", "dark"), outdir=str(tmp_path / "alone")))
    assert np.array_equal(pixels(result.cells[0].images[0]), pixels(alone.images[0]))
    assert not np.array_equal(pixels(result.cells[0].images[0]), pixels(result.cells[1].images[0]))
    prompt = parse_a1111_parameters(read_png_metadata(result.cells[0].images[0])[0])["prompt"]
    assert prompt == "a red cat, oil painting, dark night"


def test_an_unknown_style_on_the_axis_is_refused_before_the_first_cell(tmp_path):
    (tmp_path / "styles.csv").write_text(STYLES_CSV, encoding="utf-8")
    styled = Session(styles_file=str(tmp_path / "styles.csv"))
    grid = grids.build(GenerationRequest(**BASE), ("Seed", "1, 2"), ("Styles", "dark, neon"))
    ran = []
    with pytest.raises(InvalidRequest) as bad:
        run_grid(styled, grid, str(tmp_path), on_cell=lambda i, n: ran.append(i))
    said = str(bad.value)
    assert "Y axis Styles value: 'neon'" in said and "the styles there: oil, dark" in said and ran == []


# ------------------------------------------------------------------------------- memory axes, labelled cells


def test_a_preset_grid_labels_each_cell_with_its_seconds_per_step_and_peak_memory(session, tmp_path):
    grid = grids.build(GenerationRequest(**BASE), ("Preset", "cpu, medvram, lowvram"), ("Seed", "1, 2"))
    result = run_grid(session, grid, str(tmp_path))
    assert [c.preset for c in result.cells] == ["cpu", "medvram", "lowvram"] * 2
    for cell in result.cells:
        assert cell.seconds_per_step > 0 and cell.peak_kind == "host" and cell.peak_bytes > 50 * 2**20
        assert cell.caption().startswith(f"{cell.seconds_per_step:.3g} s/step, peak ") and "host" in cell.caption()
    with Image.open(result.grid) as drawn:
        # a caption band under each 64 px cell: the rows are taller than the cells
        assert drawn.width > 3 * 64 and drawn.height > 2 * (64 + 10)
    data = json.loads(json.dumps(result.as_json()))
    assert data["cells"][0]["peak_kind"] == "host" and data["cells"][4]["labels"] == ["Preset: medvram", "Seed: 2", ""]
    unlabelled = run_grid(session, grids.build(GenerationRequest(**BASE), ("Seed", "1, 2")), str(tmp_path))
    with Image.open(unlabelled.grid) as plain:
        assert plain.width == 2 * 64  # no memory axis: the cells as they are, as A1111's


def test_the_grid_png_has_the_first_cells_infotext_and_a1111s_script_fields(session, tmp_path):
    result = run_grid(session, grids.build(GenerationRequest(**BASE), ("Seed", "1, 2"), ("CFG Scale", "5, 7")),
                      str(tmp_path))
    text, _ = read_png_metadata(result.grid)
    first, _ = read_png_metadata(result.cells[0].images[0])
    fields = parse_a1111_parameters(text)
    assert fields["Script"] == "X/Y/Z plot" and fields["X Type"] == "Seed" and fields["X Values"] == "1, 2"
    assert fields["Y Type"] == "CFG Scale" and fields["Fixed X Values"] == "1, 2"
    assert {k: v for k, v in parse_a1111_parameters(first).items()}.items() <= fields.items()
    assert result.grid.split("/")[-1].startswith(f"{int(result.cells[-1].images[0].split('/')[-1][:5]) + 1:05d}-1-xyz-grid")


def test_a_z_axis_draws_grids_side_by_side_and_sub_grids_when_asked(session, tmp_path):
    grid = grids.build(GenerationRequest(**BASE), ("Seed", "1, 2"), (), ("CFG Scale", "5, 7"), include_sub_grids=True)
    result = run_grid(session, grid, str(tmp_path))
    assert len(result.sub_grids) == 2 and result.shape == (2, 1, 2)
    with Image.open(result.grid) as whole, Image.open(result.sub_grids[0]) as sub:
        assert whole.width == 2 * sub.width and whole.height > sub.height  # Z titles on top


def test_interrupt_keeps_the_finished_cells_and_their_grid(session, tmp_path):
    cancel, cells = threading.Event(), []

    def on_cell(i, n):
        cells.append(i)

    def on_step(step, total):
        if len(cells) == 3 and step == 1:
            cancel.set()  # Interrupt during the third cell's first step

    grid = grids.build(GenerationRequest(**{**BASE, "steps": 3}), ("Seed", "1, 2, 3, 4"))
    result = run_grid(session, grid, str(tmp_path), on_cell=on_cell, on_step=on_step, cancel=cancel)
    assert result.interrupted and cells == [1, 2, 3]
    assert [bool(c.images) for c in result.cells] == [True, True, True, False]  # the third as it was when stopped
    assert result.grid and "interrupted: 3 of 4 cells" in result.summary
    with Image.open(result.grid) as drawn:
        assert drawn.width == 4 * 64
        assert np.asarray(drawn.convert("RGB"))[-1, -32:].max() == 0  # the missing cell is blank


def test_the_plan_of_the_largest_cell_is_checked_before_the_first(session, tmp_path, monkeypatch):
    monkeypatch.setenv("LOWVRAM_GEN_RAM_BUDGET", "")
    big = Session(ram_budget=64 * 2**20)  # 64 MiB of system RAM: no plan fits it
    grid = grids.build(GenerationRequest(**BASE), ("Seed", "1, 2"))
    ran = []
    with pytest.raises(Exception) as refused:
        run_grid(big, grid, str(tmp_path), on_cell=lambda i, n: ran.append(i))
    assert "X/Y/Z plot cell (Seed: 1)" in str(refused.value) and ran == [] and not list(tmp_path.iterdir())


# ------------------------------------------------------------------------------------------------ CLI


def test_cli_xyz_with_json(tiny_path, tmp_path, capsys):
    code = main(["generate", "a red cat", "--width", "64", "--height", "64", "--steps", "2", "--seed", "5",
                 "--outdir", str(tmp_path), "--xyz-x", "Seed: 1, 2", "--xyz-y", "CFG Scale: 5, 7", "--json"])
    out = capsys.readouterr()
    assert code == 0 and "cell 4/4" in out.err
    data = json.loads(out.out)
    assert data["shape"] == [2, 2, 1] and len(data["cells"]) == 4 and len(data["images"]) == 4
    assert data["grid"].endswith(".png") and Image.open(data["grid"]).size[0] > 2 * 64 - 1
    assert [c["labels"][:2] for c in data["cells"]] == [["Seed: 1", "CFG Scale: 5"], ["Seed: 2", "CFG Scale: 5"],
                                                        ["Seed: 1", "CFG Scale: 7"], ["Seed: 2", "CFG Scale: 7"]]
    code = main(["generate", "a red cat", "--outdir", str(tmp_path), "--xyz-x", "Seed: 1-70"])
    assert code == 2 and "at most 64" in capsys.readouterr().err
    code = main(["generate", "a red cat", "--outdir", str(tmp_path), "--xyz-x", "Seed 1, 2"])
    assert code == 2 and 'write it as "AXIS: VALUES"' in capsys.readouterr().err


def test_cli_img2img_takes_the_xyz_flags(tiny_path, tmp_path, capsys):
    init = tmp_path / "in.png"
    Image.new("RGB", (64, 64), "gray").save(init)
    code = main(["img2img", "a red cat", "--init", str(init), "--width", "64", "--height", "64", "--steps", "2",
                 "--outdir", str(tmp_path / "out"), "--xyz-x", "Denoising: 0.3, 0.6"])
    out = capsys.readouterr().out.split()
    assert code == 0 and len(out) == 3 and "xyz-grid" in out[0]


def test_a_grids_progress_line_says_the_cell():
    from lowvram_gen.jobs.progress import PartProgress

    clock = iter(range(100)).__next__
    progress = PartProgress(4, now=clock)
    progress.cell(2, 4)
    progress.update(1, 2)
    assert progress.line() == "cell 2/4 · Step 1/2" and progress.fraction() == pytest.approx((1 + 0.5) / 4)
    progress.update(2, 2)
    assert progress.line().startswith("cell 2/4 · Step 2/2 · ETA ")
    progress.cell(3, 4)
    assert progress.line() == "cell 3/4 · Step 0/0" and progress.fraction() == pytest.approx(2 / 4)
