"""Issue 19, item 4: A1111's variation seeds (Variation seed, Variation seed strength, Seed resize from).

The references here are written out from A1111's modules/rng.py (ImageRNG.first and its slerp) and fed to a plain
diffusers pipeline as `latents`, so the tests check A1111's formula, not only that the image changes."""

from __future__ import annotations

import json

import numpy as np
import pytest
from PIL import Image

from lowvram_gen import GenerationRequest
from lowvram_gen.batch.files import expand, read_entries, request_hash
from lowvram_gen.cli.main import main
from lowvram_gen.a1111.infotext import from_png, request_fields
from lowvram_gen.outputs import a1111_parameters, parse_a1111_parameters, read_png_metadata, save_png
from lowvram_gen.session import Session

from folder_sampler import own_sampler  # tests/folder_sampler.py

SIZE = dict(width=64, height=64, steps=2)


def pixels(path) -> np.ndarray:
    return np.asarray(Image.open(path).convert("RGB")).astype(int)


@pytest.fixture(scope="module")
def session():
    return Session()


def make(session, tmp_path, **fields):
    # the tiny folder's own scheduler by name (PLMS), which `plain_diffusers` runs ("default" is DPM++ 2M since
    # issue 29)
    return session.generate(GenerationRequest(prompt="a lighthouse", outdir=str(tmp_path),
                                              **{"sampler": own_sampler("tiny"), **SIZE, **fields}))


def params_of(path) -> dict:
    return parse_a1111_parameters(read_png_metadata(path)[0])


def a1111_slerp(val, low, high):
    """A1111's modules/rng.py slerp, as it is (norms along dim 1 of one image's (C, H, W) noise)."""
    import torch

    low_norm = low / torch.norm(low, dim=1, keepdim=True)
    high_norm = high / torch.norm(high, dim=1, keepdim=True)
    dot = (low_norm * high_norm).sum(1)
    if dot.mean() > 0.9995:
        return low * val + high * (1 - val)
    omega = torch.acos(dot)
    so = torch.sin(omega)
    return (torch.sin((1.0 - val) * omega) / so).unsqueeze(1) * low + (torch.sin(val * omega) / so).unsqueeze(1) * high


def randn(seed, shape):
    import torch

    return torch.randn(shape, generator=torch.Generator("cpu").manual_seed(seed))


def plain_diffusers(folder, latents, width=64, height=64):
    """The tiny model's image from these initial latents, by diffusers alone (as test_generate's reference)."""
    from diffusers import AutoPipelineForText2Image

    pipe = AutoPipelineForText2Image.from_pretrained(str(folder))
    image = pipe("a lighthouse", width=width, height=height, num_inference_steps=2, guidance_scale=7.0,
                 latents=latents).images[0]
    return np.asarray(image.convert("RGB")).astype(int)


def test_strength_0_is_the_plain_seeds_image_bit_for_bit(session, tmp_path):
    plain = make(session, tmp_path, seed=5)
    zero = make(session, tmp_path, seed=5, subseed=9, subseed_strength=0)
    assert np.array_equal(pixels(plain.images[0]), pixels(zero.images[0]))
    assert "Variation seed" not in params_of(zero.images[0])


def test_strength_1_is_the_subseeds_noise(session, tmp_path):
    """slerp's end: the subseed's noise itself, so the subseed's own image (a sampler that adds no noise later)."""
    other = make(session, tmp_path, seed=9)
    one = make(session, tmp_path, seed=5, subseed=9, subseed_strength=1.0)
    assert np.array_equal(pixels(other.images[0]), pixels(one.images[0]))


def test_a_strength_between_is_a1111s_slerp_of_the_two_noises(session, tmp_path, tiny_path):
    ours = make(session, tmp_path, seed=5, subseed=9, subseed_strength=0.3)
    blended = a1111_slerp(0.3, randn(5, (4, 8, 8)), randn(9, (4, 8, 8)))
    reference = plain_diffusers(tiny_path, blended[None])
    assert np.abs(pixels(ours.images[0]) - reference).max() <= 1
    for seed in (5, 9):
        assert not np.array_equal(pixels(ours.images[0]), pixels(make(session, tmp_path, seed=seed).images[0]))
    params = params_of(ours.images[0])
    assert (params["Seed"], params["Variation seed"], params["Variation seed strength"]) == ("5", "9", "0.3")


def test_seed_resize_from_centres_the_smaller_noise(session, tmp_path, tiny_path):
    """Resize from the image's own size changes nothing; from 32x48 the seed's 4x6 noise sits in the centre of the
    seed's own 8x8 noise (A1111's paste), the variation blended in at that smaller size."""
    plain = make(session, tmp_path, seed=5)
    same = make(session, tmp_path, seed=5, seed_resize_from_w=64, seed_resize_from_h=64)
    assert np.array_equal(pixels(plain.images[0]), pixels(same.images[0]))
    assert params_of(same.images[0])["Seed resize from"] == "64x64"

    small = make(session, tmp_path, seed=5, seed_resize_from_w=32, seed_resize_from_h=48)
    latents = randn(5, (4, 8, 8))
    latents[:, 1:7, 2:6] = randn(5, (4, 6, 4))
    assert np.abs(pixels(small.images[0]) - plain_diffusers(tiny_path, latents[None])).max() <= 1
    assert params_of(small.images[0])["Seed resize from"] == "32x48"

    both = make(session, tmp_path, seed=5, subseed=9, subseed_strength=0.5, seed_resize_from_w=32,
                seed_resize_from_h=48)
    latents = randn(5, (4, 8, 8))
    latents[:, 1:7, 2:6] = a1111_slerp(0.5, randn(5, (4, 6, 4)), randn(9, (4, 6, 4)))
    assert np.abs(pixels(both.images[0]) - plain_diffusers(tiny_path, latents[None])).max() <= 1


def test_a_batch_keeps_the_seed_and_counts_the_subseed_up(session, tmp_path):
    """A1111: with a variation strength every image has the same seed and subseed+i; each PNG says its own."""
    batch = make(session, tmp_path, seed=5, subseed=9, subseed_strength=0.3, batch_size=2)
    assert batch.seeds == [5, 5]
    assert [params_of(p)["Variation seed"] for p in batch.images] == ["9", "10"]
    single = make(session, tmp_path, seed=5, subseed=10, subseed_strength=0.3)
    assert np.abs(pixels(batch.images[1]) - pixels(single.images[0])).max() <= 1


def test_a_random_subseed_is_written_and_reruns_the_image(session, tmp_path):
    made = make(session, tmp_path, seed=5, subseed=-1, subseed_strength=0.3)
    subseed = int(params_of(made.images[0])["Variation seed"])
    again = make(session, tmp_path, seed=5, subseed=subseed, subseed_strength=0.3)
    assert np.array_equal(pixels(made.images[0]), pixels(again.images[0]))


def test_img2img_and_hires_fix_vary_their_noise_too(session, tmp_path):
    """A1111 draws img2img's noise (and hires fix's second pass's) the same way: strength 0 is the plain seed's
    image, a strength above 0 another one, the same each time, and strength 1 the subseed's image: the init image
    is encoded to the posterior's mode (no draw), so the noise is each generator's first draw, as in A1111 (and hires
    fix's second pass's: strength 1 is the subseed's image through both passes)."""
    init = tmp_path / "init.png"
    Image.new("RGB", (64, 64), (120, 30, 200)).save(init)
    i2i = dict(init_image=str(init), strength=0.6, steps=4)
    plain = make(session, tmp_path, seed=5, **i2i)
    zero = make(session, tmp_path, seed=5, subseed=9, subseed_strength=0, **i2i)
    between = make(session, tmp_path, seed=5, subseed=9, subseed_strength=0.3, **i2i)
    again = make(session, tmp_path, seed=5, subseed=9, subseed_strength=0.3, **i2i)
    assert np.array_equal(pixels(plain.images[0]), pixels(zero.images[0]))
    assert not np.array_equal(pixels(between.images[0]), pixels(plain.images[0]))
    assert np.array_equal(pixels(between.images[0]), pixels(again.images[0]))
    assert params_of(between.images[0])["Variation seed strength"] == "0.3"
    assert not any("variation" in w for w in between.warnings)
    subseeds = make(session, tmp_path, seed=9, **i2i)
    assert np.array_equal(pixels(subseeds.images[0]),
                          pixels(make(session, tmp_path, seed=5, subseed=9, subseed_strength=1.0, **i2i).images[0]))

    hires = dict(hires_scale=1.5, hires_steps=2)
    plain = make(session, tmp_path, seed=5, **hires)
    one = make(session, tmp_path, seed=9, **hires)
    varied = make(session, tmp_path, seed=5, subseed=9, subseed_strength=1.0, **hires)
    assert np.array_equal(pixels(one.images[0]), pixels(varied.images[0]))  # both passes' noise is the subseed's
    assert not np.array_equal(pixels(plain.images[0]), pixels(varied.images[0]))


def test_infotext_reads_a1111s_fields_and_old_resize_off():
    text = ("a cat\nSteps: 20, Sampler: Euler a, CFG scale: 7, Seed: 1, Size: 512x512, Model: x, Variation seed: 5, "
            "Variation seed strength: 0.3, Seed resize from: 512x768, Denoising strength: 0.5")
    fields = request_fields(parse_a1111_parameters(text)).fields
    assert (fields["subseed"], fields["subseed_strength"]) == (5, 0.3)
    assert (fields["seed_resize_from_w"], fields["seed_resize_from_h"]) == (512, 768)
    old = request_fields(parse_a1111_parameters("a cat\nSteps: 20, Seed: 1, Seed resize from: -1x-1")).fields
    assert (old["seed_resize_from_w"], old["seed_resize_from_h"]) == (0, 0)


def test_from_png_reruns_an_a1111_variation_without_a_not_used_note(tmp_path, capsys):
    a1111 = tmp_path / "a1111.png"
    save_png(Image.new("RGB", (64, 64)), a1111, a1111_parameters("a fox", "", {
        "Steps": 2, "Sampler": "Euler", "CFG scale": 7, "Seed": 3, "Size": "64x64", "Model": "tiny",
        "Variation seed": 5, "Variation seed strength": 0.3}), None)
    assert main(["generate", "--from-png", str(a1111), "--outdir", str(tmp_path / "o"), "--json", "--cpu"]) == 0
    captured = capsys.readouterr()
    assert "Variation seed" not in captured.err, captured.err
    made = json.loads(captured.out)["images"][0]
    params = params_of(made)
    assert (params["Seed"], params["Variation seed"], params["Variation seed strength"]) == ("3", "5", "0.3")
    back = from_png(made)
    assert (back.fields["subseed"], back.fields["subseed_strength"]) == (5, 0.3) and not back.ignored


def test_cli_flags_reach_the_png_and_bad_values_exit_2(tmp_path, capsys):
    args = ["generate", "a fox", "--width", "64", "--height", "64", "--steps", "1", "--seed", "5",
            "--outdir", str(tmp_path), "--json", "--cpu"]
    assert main([*args, "--subseed", "9", "--subseed-strength", "0.25", "--seed-resize-from", "48x32"]) == 0
    params = params_of(json.loads(capsys.readouterr().out)["images"][0])
    assert (params["Variation seed"], params["Variation seed strength"], params["Seed resize from"]) == \
        ("9", "0.25", "48x32")
    for flag, bad, said in (("--subseed-strength", "1.5", "invalid variation seed strength: 1.5"),
                            ("--subseed-strength", "some", "invalid variation seed strength: 'some'"),
                            ("--subseed", "-2", "invalid variation seed: -2"),
                            ("--seed-resize-from", "500x512", "invalid seed resize from width: 500"),
                            ("--seed-resize-from", "512", "must be WIDTHxHEIGHT")):
        assert main([*args, flag, bad]) == 2
        err = capsys.readouterr().err
        assert said in err, err


def test_batch_lines_take_the_fields_and_old_job_hashes_stay(tmp_path):
    path = tmp_path / "p.txt"
    path.write_text("--prompt a fox --subseed 9 --subseed_strength 0.3 --seed_resize_from_w 32 "
                    "--seed_resize_from_h 48\n--prompt b --seed_resize_from 48x64\na cat\n")
    jobs = expand(read_entries(path), {"model": "tiny", "width": 64, "height": 64}).jobs
    first, second, third = (j.request for j in jobs)
    assert (first.subseed, first.subseed_strength, first.seed_resize_from) == (9, 0.3, (32, 48))
    assert second.seed_resize_from == (48, 64) and third.subseed_strength == 0
    jsonl = tmp_path / "p.jsonl"
    jsonl.write_text('{"prompt": "a", "subseed_strength": 0.5, "subseed": 2}\n'
                     '{"prompt": "v", "engine": "vqgan", "subseed_strength": 0.5}\n')
    assert not expand(read_entries(jsonl), {"model": "tiny"}).bad
    assert request_hash("sd", GenerationRequest(prompt="a cat", seed=5).validated()) == "3888bfeb5c2d8f9b"
    assert request_hash("sd", GenerationRequest(prompt="a cat", seed=5, subseed_strength=0.1).validated()) \
        != "3888bfeb5c2d8f9b"
