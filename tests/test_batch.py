"""Batch prompt files: formats, bad lines, the manifest, resume after SIGKILL, several processes.

docs/FAULTS.md 26-28. Most logic is tested in-process with a fake session that saves tiny PNGs the way
`Session.generate` does (no model: fast); end-to-end runs use the embedded tiny model at 64x64 and
1 step. The SIGKILL and `accelerate launch` tests run real subprocesses (marked slow).
"""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
from PIL import Image

from lowvram_gen.batch import manifest as bm
from lowvram_gen.batch.command import run_batch
from lowvram_gen.batch.files import BatchError, expand, parse_options, read_entries, request_hash
from lowvram_gen.cli.main import main
from lowvram_gen.errors import (Cancelled, InvalidRequest, LowVramError, ModelLoadError, NotEnoughRam,
                                OutOfMemoryEverywhere)
from lowvram_gen.outputs import next_image_path, read_png_metadata, save_png
from lowvram_gen.request import GenerationRequest

ROOT = Path(__file__).resolve().parent.parent
TINY = {"width": "64", "height": "64", "steps": "1"}
SMALL = ["--width", "64", "--height", "64", "--steps", "1"]


def write(tmp_path: Path, name: str, text: str | bytes) -> Path:
    path = tmp_path / name
    path.write_bytes(text if isinstance(text, bytes) else text.encode("utf-8"))
    return path


def jobs_of(path, defaults=None, **kw):
    return expand(read_entries(path), {**TINY, "model": "tiny", **(defaults or {})}, **kw)


class FakeSession:
    """Saves one small PNG per image, with the metadata `Session.generate` writes; can fail."""

    def __init__(self, fail_prompts=(), fail_after_images=None, fail_with=None):
        self.calls = []
        self.fail_prompts = set(fail_prompts)
        self.fail_after_images = fail_after_images
        self.fail_with = fail_with  # the error a failing prompt raises (default: its model does not load)

    def generate(self, request):
        self.calls.append(request)
        seeds = [request.seed + i if request.seed >= 0 else 1000 + len(self.calls) * 16 + i
                 for i in range(request.image_count)]
        if request.prompt in self.fail_prompts:
            raise (self.fail_with or ModelLoadError(f"cannot load {request.prompt}"))
        images = []
        for i, seed in enumerate(seeds):
            if self.fail_after_images is not None and i >= self.fail_after_images:
                raise LowVramError("out of memory at every preset (simulated)")
            meta = {"request": {"prompt": request.prompt, "extra": request.extra}, "seed": seed, "preset": "fake",
                    "attempts": []}
            path = next_image_path(request.outdir, seed, request.prompt)
            images.append(str(save_png(Image.new("RGB", (8, 8), (seed % 256, 0, 0)), path, "p", meta)))
        return SimpleNamespace(images=images, seeds=seeds, preset="fake", attempts=[], seconds=0.0, warnings=[])


def run(file, outdir, session, defaults=None, **kw):
    return run_batch(Path(file), Path(outdir), {**TINY, "model": "tiny", **(defaults or {})}, {"device": "cpu"},
                     session=session, **kw)


def records(outdir: Path) -> list[dict]:
    return bm.read_records(bm.current_manifests(outdir))


def result_files(outdir: Path) -> set[str]:
    """Every image that counts as a result: PNGs not hidden, not in .incomplete/."""
    return {str(p.relative_to(outdir)) for p in outdir.rglob("*.png")
            if not any(part.startswith(".") for part in p.relative_to(outdir).parts)}


# ---------------------------------------------------------------------------------- formats


def test_txt_plain_lines_comments_and_a1111_options(tmp_path):
    path = write(tmp_path, "p.txt", "\ufeff# a comment\n\na red fox\n   \n"
                 '--prompt "a blue whale" --negative_prompt "blurry, dark" --steps 3 --seed 5 --width 128 '
                 '--sampler_name "DPM++ 2M Karras" --cfg_scale 6.5 --batch_size 2\n'
                 "--prompt a green tree at dawn --negative ugly --n_iter 2 --seed=10\r\n"
                 "a prompt with -- dashes # and a hash\n")
    result = jobs_of(path)
    assert not result.bad
    fox, whale, tree0, tree1, dashes = result.jobs
    assert (fox.line, fox.request.prompt, fox.request.seed, fox.request.width) == (3, "a red fox", -1, 64)
    w = whale.request
    assert (whale.line, w.prompt, w.negative_prompt, w.steps, w.seed, w.width, w.height) == (
        5, "a blue whale", "blurry, dark", 3, 5, 128, 64)
    assert (w.sampler, w.schedule_type, w.cfg_scale, w.batch_size) == ("DPM++ 2M", "karras", 6.5, 2)
    assert tree0.request.prompt == "a green tree at dawn" and tree0.request.negative_prompt == "ugly"
    assert [tree0.request.seed, tree1.request.seed] == [10, 11] and tree1.repeat == 1
    assert dashes.request.prompt == "a prompt with -- dashes # and a hash"


def test_clip_skip_in_every_format_and_as_a_default_and_old_job_hashes_stay(tmp_path):
    """A line's clip_skip (A1111 option style in .txt, a field in .jsonl, a column in .csv) and the command line's
    --clip-skip reach the request; a VQGAN-CLIP line leaves it out; a bad one is an invalid line; a job without it
    keeps the hash it had before the field existed (a batch started then still resumes)."""
    txt = jobs_of(write(tmp_path, "p.txt", "--prompt a fox --clip_skip 2\na cat\n--prompt x --clip_skip 0\n"))
    assert [j.request.clip_skip for j in txt.jobs] == [2, 1]
    assert [b.line for b in txt.bad] == [3] and "invalid clip skip: 0" in txt.bad[0].error
    jsonl = jobs_of(write(tmp_path, "p.jsonl", '{"prompt": "a", "clip_skip": 3}\n{"prompt": "b"}\n'
                                               '{"prompt": "v", "engine": "vqgan"}\n'), {"clip_skip": "2"})
    assert not jsonl.bad and [j.request.clip_skip for j in jsonl.jobs[:2]] == [3, 2]
    csv = jobs_of(write(tmp_path, "p.csv", "prompt,clip_skip\na,2\nb,\n"))
    assert [j.request.clip_skip for j in csv.jobs] == [2, 1]
    assert request_hash("sd", GenerationRequest(prompt="a cat", seed=5).validated()) == "3888bfeb5c2d8f9b"
    assert request_hash("sd", GenerationRequest(prompt="a cat", seed=5, clip_skip=2).validated()) != "3888bfeb5c2d8f9b"


def test_hires_fields_with_a1111s_api_names_in_every_format_and_old_job_hashes_stay(tmp_path):
    """Issue 19: hires fix's resize, sampler, schedule type, CFG and prompts on a line, by A1111's API names (hr_*)
    or ours; a .txt line's --hr_prompt takes the words up to the next option, as --prompt does. A line without them,
    or with the upscaler spelt as before A1111's names, keeps its job's hash."""
    txt = jobs_of(write(tmp_path, "p.txt", '--prompt a fox --hr_scale 2 --hr_resize_x 128 --hr_sampler_name "DPM++ 2M" '
                                           "--hr_scheduler Karras --hr_cfg 4 --hr_prompt a red fox --hr_negative_prompt "
                                           "blur --hr_upscaler 'Latent (bicubic)' --hr_second_pass_steps 3\n"
                                           "--prompt b --hires_resize 0x96\n--prompt c --hr_resize_x 100\n"))
    first = txt.jobs[0].request
    assert (first.hires_scale, first.hires_resize_w, first.hires_resize_h, first.hires_sampler,
            first.hires_schedule_type, first.hires_cfg, first.hires_prompt, first.hires_negative,
            first.hires_upscaler, first.hires_steps) == (2.0, 128, 0, "DPM++ 2M", "karras", 4.0, "a red fox", "blur",
                                                        "Latent (bicubic)", 3)
    assert (txt.jobs[1].request.hires_resize_h, txt.jobs[1].request.output_size()) == (96, (96, 96))
    assert [b.line for b in txt.bad] == [3] and "hires resize width: 100" in txt.bad[0].error
    jsonl = jobs_of(write(tmp_path, "p.jsonl", '{"prompt": "a", "hr_resize_y": 128, "hires_cfg": 3}\n'))
    assert (jsonl.jobs[0].request.hires_resize_h, jsonl.jobs[0].request.hires_cfg) == (128, 3.0)
    csv = jobs_of(write(tmp_path, "p.csv", "prompt,hr_prompt,hr_sampler_name\na,a cat,Euler a\n"))
    assert (csv.jobs[0].request.hires_prompt, csv.jobs[0].request.hires_sampler) == ("a cat", "Euler a")
    old = GenerationRequest(prompt="a cat", seed=5, hires_upscaler="latent").validated()
    assert old.hires_upscaler == "Latent" and request_hash("sd", old) == "3888bfeb5c2d8f9b"
    assert request_hash("sd", GenerationRequest(prompt="a cat", seed=5, hires_cfg=3).validated()) != "3888bfeb5c2d8f9b"


def test_cli_clip_skip_default_reaches_every_line_and_a_bad_one_exits_2(tmp_path, capsys):
    path = write(tmp_path, "p.jsonl", '{"prompt": "a fox", "seed": 1}\n{"prompt": "a cat", "seed": 1, "clip_skip": 3}\n')

    def keys(*flags):
        assert main(["batch", str(path), *flags, "--outdir", str(tmp_path / "o"), "--dry-run", "--json"]) == 0
        return [job["job"] for job in json.loads(capsys.readouterr().out)["jobs"]]

    plain, two, one = keys(), keys("--clip-skip", "2"), keys("--clip-skip", "1")
    assert one == plain and two[0] != plain[0] and two[1] == plain[1]  # a line's own value wins
    assert two[0] == request_hash("sd", GenerationRequest(prompt="a fox", seed=1, clip_skip=2).validated()) + ":0"
    assert main(["batch", str(path), "--clip-skip", "0", "--outdir", str(tmp_path / "o")]) == 2
    assert "invalid clip skip: 0; a whole number from 1 to 12" in capsys.readouterr().err


@pytest.mark.parametrize("line,error", [
    ('--prompt "unterminated', "check the quotes"),
    ("--steps", "needs a value"),
    ("--prompt x --script_name 'X/Y/Z plot'", "invalid script_name: 'X/Y/Z plot'; lowvram-gen runs A1111's \"x/y/z plot\" and img2img's \"loopback\" and \"sd upscale\" from the API's script_name"),
    ("--prompt x --wings 2", "unknown option --wings"),
    ("--prompt x --steps 2 --steps 3", "given twice"),
    ("--prompt x --width 100", "multiple of 8"),
    ("--prompt x --steps 0", "invalid steps"),
    ("--prompt x --seed 99999999999", "invalid seed"),
    ("--prompt x --cfg_scale nan", "invalid cfg scale"),
    ("--prompt x --sampler_name Bogus", "invalid sampler"),
    ("--prompt x --outdir /tmp", "whole batch"),
])
def test_txt_malformed_line_is_reported_with_its_number_and_skipped(tmp_path, line, error):
    path = write(tmp_path, "p.txt", f"first\n{line}\nthird\n")
    result = jobs_of(path)
    assert [j.request.prompt for j in result.jobs] == ["first", "third"]
    assert [b.line for b in result.bad] == [2] and error in result.bad[0].error


def test_txt_a1111_bookkeeping_options_are_ignored_with_a_warning(tmp_path):
    fields, warnings = parse_options('--prompt "x" --do_not_save_grid true --prompt_for_display y')
    assert fields == {"prompt": "x"} and len(warnings) == 2


def test_a_line_that_is_not_utf8_is_skipped(tmp_path):
    path = write(tmp_path, "p.txt", b"good\n\xff\xfe bad bytes\nalso good\n")
    result = jobs_of(path)
    assert [j.request.prompt for j in result.jobs] == ["good", "also good"]
    assert result.bad[0].line == 2 and "UTF-8" in result.bad[0].error


def test_jsonl_lines_engines_and_errors(tmp_path):
    path = write(tmp_path, "p.jsonl", "\n".join([
        '{"prompt": "a cat", "steps": 2, "seed": 3, "repeat": 2}',
        '{"prompt": "a vqgan dream", "engine": "vqgan", "iterations": 100}',
        "not json",
        '["a list"]',
        '{"prompt": "x", "wings": 2}',
        '{"prompt": "x", "engine": "dalle"}',
        '{"prompt": "a dog", "negative": "fur", "cfg": 4, "seed": null, "engine": "SD"}',
        "",
    ]))
    result = jobs_of(path)
    assert [(j.line, j.request.prompt, j.request.seed) for j in result.jobs] == [
        (1, "a cat", 3), (1, "a cat", 4), (2, "a vqgan dream", -1), (7, "a dog", -1)]
    vqgan = result.jobs[2]
    assert (vqgan.engine, vqgan.request.iterations, vqgan.request.width) == ("vqgan", 100, 64)
    assert result.jobs[3].request.negative_prompt == "fur" and result.jobs[3].request.cfg_scale == 4.0
    bad = {b.line: b.error for b in result.bad}
    assert 2 not in bad
    assert "not valid JSON" in bad[3] and "JSON object" in bad[4]
    assert "'wings'" in bad[5] and "engine" in bad[5]  # the allowed list names engine and repeat too
    assert "invalid engine" in bad[6]


def test_jsonl_unknown_field_lists_the_fields_of_both_engines_labelled(tmp_path):
    """A VQGAN-CLIP field without "engine": "vqgan" (or a typo on a vqgan line) names what each engine takes."""
    path = write(tmp_path, "p.jsonl", '{"prompt": "x", "engine": "vqgan", "wings": 2}\n{"prompt": "x", "cutn": 64}\n')
    bad = {b.line: b.error for b in jobs_of(path).bad}
    for line, key in ((1, "wings"), (2, "cutn")):
        sd, vqgan, every = bad[line].split("; ")[1:]
        assert bad[line].startswith(f"invalid field: {key!r}; ")
        assert sd.startswith("Stable Diffusion lines take ") and "cfg_scale" in sd and "cutn" not in sd
        assert vqgan.startswith('"engine": "vqgan" lines take ') and "cutn" in vqgan and "iterations" in vqgan
        assert "steps" in vqgan and "cfg_scale" not in vqgan
        assert every == "every line takes engine, repeat"


def test_csv_header_cells_and_line_numbers(tmp_path):
    path = write(tmp_path, "p.csv", 'Prompt,Negative Prompt,seed,steps\n'
                 '"a cat",,1,\n'
                 '"a dog, running","blurry",2,3\n'
                 '"a prompt\non two lines",,3,2\n'
                 'too,many,cells,2,extra\n'
                 '"bad steps",,4,zero\n'
                 ',,,\n')
    result = jobs_of(path)
    cat, dog, two = result.jobs
    assert (cat.line, cat.request.prompt, cat.request.seed, cat.request.steps) == (2, "a cat", 1, 1)
    assert (dog.request.prompt, dog.request.negative_prompt, dog.request.steps) == ("a dog, running", "blurry", 3)
    assert two.line == 4 and two.request.prompt == "a prompt\non two lines"
    assert [(b.line, "cells" in b.error or "steps" in b.error) for b in result.bad] == [(6, True), (7, True)]


def test_csv_unknown_column_stops_before_anything_runs(tmp_path):
    path = write(tmp_path, "p.csv", "prompt,wingspan\na,1\n")
    with pytest.raises(BatchError, match="wingspan"):
        read_entries(path)


# ------------------------------------------------------------------------- seeds and identity


def test_seed_start_repeat_and_job_identity(tmp_path):
    path = write(tmp_path, "p.txt", "a\n--prompt b --batch_size 2\n--prompt c --seed 7\n--prompt bad --width 9\nd\n")
    result = jobs_of(path, seed_start=100, repeat=2)
    seeds = [(j.request.prompt, j.request.seed) for j in result.jobs]
    # a: 100, 101; b: batch 2 -> 102, 104; c: its own seed, repeats step by its batch; the bad line
    # keeps its place (2 repeats x 1 image) so fixing it does not change d's seeds
    assert seeds == [("a", 100), ("a", 101), ("b", 102), ("b", 104), ("c", 7), ("c", 8), ("d", 108), ("d", 109)]
    assert len({j.key for j in result.jobs}) == len(result.jobs)


def test_a_lines_batch_count_is_one_job_of_all_its_images_and_the_seeds_after_it_follow(tmp_path, capsys):
    """A line's batch_count (A1111's n_iter is `repeat` here: one job per copy) makes one job of batch_count x
    batch_size images: the next line's seeds start after all of them, and after a crash its images are adopted."""
    path = write(tmp_path, "p.txt", "a\n--prompt b --batch_size 2 --batch_count 2\nc\n")
    jobs = jobs_of(path, seed_start=100).jobs
    assert [(j.request.prompt, j.request.seed) for j in jobs] == [("a", 100), ("b", 101), ("c", 105)]
    assert jobs[0].request_hash == request_hash("sd", jobs[0].request) != request_hash(
        "sd", dataclasses.replace(jobs[0].request, batch_count=2))  # a count of 1 keeps the hash jobs had before it
    out = tmp_path / "out"
    run(path, out, FakeSession(), seed_start=100)
    assert [len(r["outputs"]) for r in sorted(records(out), key=lambda r: r["line"])] == [1, 4, 1]
    manifest = bm.manifest_path(out, 0)
    manifest.write_bytes(manifest.read_bytes().splitlines(keepends=True)[0])  # b's and c's records lost
    again = FakeSession()
    capsys.readouterr()
    assert run(path, out, again, seed_start=100, as_json=True) == 0
    assert again.calls == [] and json.loads(capsys.readouterr().out)["recovered"] == 2


def test_identical_random_lines_are_distinct_jobs_and_keys_are_stable(tmp_path):
    one = jobs_of(write(tmp_path, "a.txt", "same\nsame\nother\n"))
    assert [j.key.split(":")[1] for j in one.jobs] == ["0", "1", "0"]
    two = jobs_of(write(tmp_path, "b.txt", "# new comment\nother\n\nsame\nsame\n"))
    assert {j.key for j in one.jobs} == {j.key for j in two.jobs}  # comments, blank lines, order: same jobs
    changed = jobs_of(write(tmp_path, "c.txt", "same\nsame\nother\n"), {"steps": "2"})
    assert not {j.key for j in one.jobs} & {j.key for j in changed.jobs}
    assert request_hash("sd", one.jobs[0].request) == one.jobs[0].request_hash


def test_schedule_types_in_prompt_files_and_the_hashes_of_old_sampler_names(tmp_path):
    """Issue 19: a line's schedule type (A1111's API calls it `scheduler`); an old combined name on a line wins over
    --schedule-type as on the command line; and a line that said 'DPM++ 2M Karras' before requests had a schedule
    type keeps its job identity (a resumed batch does not redo it)."""
    import dataclasses
    import hashlib
    import json

    path = write(tmp_path, "p.txt", '--prompt a --sampler_name "DPM++ 2M Karras"\n'
                                    '--prompt b --scheduler "SGM Uniform"\n--prompt c --sampler_name Euler\n')
    old, sgm, euler = jobs_of(path, {"schedule_type": "exponential"}).jobs
    assert (old.request.sampler, old.request.schedule_type) == ("DPM++ 2M", "karras")
    assert sgm.request.schedule_type == "sgm-uniform" and euler.request.schedule_type == "exponential"
    data = dataclasses.asdict(old.request)
    for key in ("outdir", "extra", "quantize", "schedule_type", "clip_skip", "subseed", "subseed_strength",
                "seed_resize_from_w", "seed_resize_from_h", "hires_resize_w", "hires_resize_h", "hires_sampler",
                "hires_schedule_type", "hires_cfg", "hires_prompt", "hires_negative", "controlnets",
                "control_mode", "batch_count", "mask", "mask_blur", "inpaint_area", "mask_padding",
                "masked_content", "invert_mask", "vae", "reference_images", "rng", "ensd",
                "img2img_fix_steps", "resize_mode", "mask_round", "unipc_variant", "unipc_skip_type", "unipc_order",
                "unipc_lower_order_final", "tiling", "styles", "refiner", "refiner_switch_at",
                "filename_pattern", "frames", "fps", "cfg_scale_2", "save_frames", "allow_upscale"):  # added since, at defaults
        data.pop(key)
    data["cfg_scale"] = 7.0  # a line without it ran A1111's CFG 7 before families had defaults
    text = json.dumps({"engine": "sd", **data, "sampler": "DPM++ 2M Karras", "hires_upscaler": "latent"},
                      sort_keys=True, separators=(",", ":"), ensure_ascii=True)  # spelt so before A1111's names
    assert old.request_hash == hashlib.sha256(text.encode()).hexdigest()[:16]  # as before schedule types
    assert len({old.request_hash, sgm.request_hash, euler.request_hash}) == 3
    assert request_hash("sd", dataclasses.replace(old.request, schedule_type="exponential")) != old.request_hash


# ------------------------------------------------------------------------------------ CLI


@pytest.mark.parametrize("argv,message", [
    (["--width", "100"], "invalid width"),
    (["--repeat", "0"], "invalid --repeat"),
    (["--seed-start", "-5"], "invalid --seed-start"),
])
def test_cli_bad_defaults_exit_2_before_any_work(tmp_path, capsys, argv, message):
    path = write(tmp_path, "p.txt", "a cat\n")
    assert main(["batch", str(path), "--outdir", str(tmp_path / "o"), *argv]) == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "o").exists()


def test_cli_missing_file_and_unknown_format_exit_2(tmp_path, capsys):
    assert main(["batch", str(tmp_path / "nope.txt")]) == 2
    assert "cannot read the prompt file" in capsys.readouterr().err
    path = write(tmp_path, "p.yaml", "a\n")
    assert main(["batch", str(path)]) == 2
    assert "--format" in capsys.readouterr().err
    assert main(["batch", str(path), "--format", "txt", "--dry-run", "--outdir", str(tmp_path / "o")]) == 0


def test_batch_modules_and_help_stay_light():
    code = ("import sys; import lowvram_gen.batch.command, lowvram_gen.batch.files, lowvram_gen.batch.manifest, "
            "lowvram_gen.batch.report; print(sorted(m for m in ('torch', 'diffusers', 'accelerate') if m in sys.modules))")
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip() == "[]"
    result = subprocess.run([sys.executable, str(ROOT / "scripts" / "batch_prompts.py"), "--help"],
                            capture_output=True, text=True)
    assert result.returncode == 0
    for flag in ("--repeat", "--seed-start", "--restart", "--json", "--outdir", "--lowvram", "--dry-run", ".jsonl"):
        assert flag in result.stdout


def test_cli_seed_and_seed_start_are_exclusive(tmp_path, capsys):
    with pytest.raises(SystemExit):
        main(["batch", "p.txt", "--seed", "1", "--seed-start", "2"])


def test_dry_run_lists_jobs_and_loads_nothing(tmp_path, capsys):
    path = write(tmp_path, "p.txt", "a cat\n--prompt bad --steps 0\n")
    code = main(["batch", str(path), "--outdir", str(tmp_path / "o"), "--dry-run", "--json", "--seed-start", "3"])
    out = json.loads(capsys.readouterr().out)
    assert code == 1  # an invalid line is a failure of the batch
    assert [(j["prompt"], j["seed"], j["done"]) for j in out["jobs"]] == [("a cat", 3, False)]
    assert out["invalid_lines"][0]["line"] == 2


# --------------------------------------------------------------------------- runs (fake session)


def test_run_records_every_job_and_resume_skips_done_ones(tmp_path, capsys):
    path = write(tmp_path, "p.txt", "a\n--prompt b --batch_size 2\n--prompt bad --steps 0\nc\n")
    out = tmp_path / "out"
    session = FakeSession()
    assert run(path, out, session, as_json=True) == 1  # the bad line makes the exit code say so
    summary = json.loads(capsys.readouterr().out)
    assert (summary["done"], summary["failed"], summary["invalid"], summary["images"]) == (3, 0, 1, 4)
    recs = records(out)
    assert [r["line"] for r in recs] == [1, 2, 4] and all(r["status"] == "ok" for r in recs)
    assert {o for r in recs for o in r["outputs"]} == result_files(out)
    assert recs[1]["seeds"] == read_png_seeds(out, recs[1]["outputs"])

    again = FakeSession()
    assert run(path, out, again, as_json=True) == 1
    summary = json.loads(capsys.readouterr().out)
    assert again.calls == [] and (summary["already_done"], summary["done"]) == (3, 0)

    fixed = write(tmp_path, "p.txt", "a\n--prompt b --batch_size 2\n--prompt bad --steps 2\nc\n")
    third = FakeSession()
    assert run(fixed, out, third) == 0
    assert [r.prompt for r in third.calls] == ["bad"]  # only the fixed line runs


def test_only_invalid_lines_skipped_still_exit_1_and_the_advice_is_to_fix_them(tmp_path, capsys):
    path = write(tmp_path, "p.txt", "a\n--prompt bad --steps 0\n")
    assert run(path, tmp_path / "out", FakeSession()) == 1  # every valid job done; README: 1 for an invalid line
    err = capsys.readouterr().err
    assert f"fix the invalid line(s) of {path} listed above, then run the same command again" in err
    assert "retry" not in err  # running again as it is would skip the same line again


def test_a_failed_job_and_an_invalid_line_get_both_pieces_of_advice(tmp_path, capsys):
    path = write(tmp_path, "p.txt", "a\nbroken\n--prompt bad --steps 0\n")
    oom = OutOfMemoryEverywhere("out of memory at every preset (simulated)")
    assert run(path, tmp_path / "out", FakeSession(fail_prompts={"broken"}, fail_with=oom)) == 1
    err = capsys.readouterr().err
    assert "run the same command again to retry the failed jobs" in err and "fix the invalid line(s)" in err


@pytest.mark.parametrize("error", [OutOfMemoryEverywhere("out of memory at every preset"),
                                   Cancelled("cancelled by the user"), OSError(28, "No space left on device")])
def test_a_failure_a_retry_may_fix_gets_the_retry_advice(tmp_path, capsys, error):
    path = write(tmp_path, "p.txt", "a\nbroken\n")
    assert run(path, tmp_path / "out", FakeSession(fail_prompts={"broken"}, fail_with=error), as_json=True) == 1
    captured = capsys.readouterr()
    assert "run the same command again to retry the failed jobs (finished ones are skipped): line(s) 2" in captured.err
    assert "will fail again" not in captured.err
    [failure] = json.loads(captured.out)["failures"]
    assert failure["retry"] is True and failure["fix"] is None


@pytest.mark.parametrize("error,fix", [
    (InvalidRequest("LoRA", "nosuch", "no .safetensors file of that name in models/Lora"), "fix the value the error names"),
    (ModelLoadError("LoRA x.safetensors is for another base model"), "fix or replace the model or LoRA file"),
    (NotEnoughRam("needs about 9 GiB of system RAM; this machine has 4 GiB"), "free some"),
    (RuntimeError("something nobody expected"), "-v to see its traceback"),
])
def test_a_failure_a_retry_cannot_fix_says_what_to_fix_instead(tmp_path, capsys, error, fix):
    """Issue 18: 'run the same command again to retry' was said for failures that fail the same way again."""
    path = write(tmp_path, "p.txt", "a\nbroken\nc\n")
    assert run(path, tmp_path / "out", FakeSession(fail_prompts={"broken"}, fail_with=error), as_json=True) == 1
    captured = capsys.readouterr()
    assert "again to retry" not in captured.err
    [said] = [ln for ln in captured.err.splitlines() if ln.startswith("  line 2 will fail again as it is: ")]
    assert fix in said
    [failure] = json.loads(captured.out)["failures"]
    assert failure["retry"] is False and fix in failure["fix"]


def test_retryable_and_unfixable_failures_in_one_batch_each_get_their_advice(tmp_path, capsys):
    path = write(tmp_path, "p.txt", "a\noom\nbad model\n")

    class Mixed(FakeSession):
        def generate(self, request):
            if request.prompt == "oom":
                raise OutOfMemoryEverywhere("out of memory at every preset")
            return super().generate(request)

    assert run(path, tmp_path / "out", Mixed(fail_prompts={"bad model"})) == 1
    err = capsys.readouterr().err
    assert "to retry the failed jobs (finished ones are skipped): line(s) 2 may succeed then" in err
    assert "  line 3 will fail again as it is: fix or replace the model or LoRA file" in err


def read_png_seeds(out, rels):
    return [read_png_metadata(out / rel)[1]["seed"] for rel in rels]


def test_failed_job_is_listed_others_run_and_retry_runs_only_it(tmp_path, capsys):
    path = write(tmp_path, "p.txt", "a\nbroken\nc\n")
    out = tmp_path / "out"
    assert run(path, out, FakeSession(fail_prompts={"broken"}), as_json=True) == 1
    captured = capsys.readouterr()
    summary = json.loads(captured.out)
    assert summary["done"] == 2 and summary["failures"][0]["line"] == 2
    assert "cannot load broken" in summary["failures"][0]["error"] and "p.txt:2: failed" in captured.err
    assert [r["status"] for r in records(out)] == ["ok", "failed", "ok"]
    retry = FakeSession()
    assert run(path, out, retry) == 0
    assert [r.prompt for r in retry.calls] == ["broken"]


def test_images_of_a_job_that_fails_half_way_are_moved_to_incomplete(tmp_path):
    path = write(tmp_path, "p.txt", "--prompt pair --batch_size 2 --seed 4\n")
    out = tmp_path / "out"
    assert run(path, out, FakeSession(fail_after_images=1)) == 1
    assert result_files(out) == set()  # the half job is no result
    (failed,) = records(out)
    assert failed["status"] == "failed" and failed["incomplete"] == [".incomplete/00000-4-pair.png"]
    assert run(path, out, FakeSession()) == 0
    assert result_files(out) == set(records(out)[-1]["outputs"]) and len(result_files(out)) == 2


def test_restart_ignores_the_manifest_and_keeps_the_old_one(tmp_path):
    path = write(tmp_path, "p.txt", "a\nb\n")
    out = tmp_path / "out"
    run(path, out, FakeSession())
    second = FakeSession()
    assert run(path, out, second, restart=True) == 0
    assert len(second.calls) == 2 and len(records(out)) == 2
    assert len(list(out.glob("manifest.rank0.jsonl.*"))) == 1
    assert len(result_files(out)) == 4  # nothing overwritten
    third = FakeSession()
    run(path, out, third)  # old images are recorded in the archived manifest: nothing to adopt or move
    assert third.calls == [] and len(result_files(out)) == 4


def test_a_second_batch_on_the_same_folder_is_refused(tmp_path, capsys):
    out = tmp_path / "out"
    held = bm.Manifest(out, 0)
    try:
        path = write(tmp_path, "p.txt", "a\n")
        assert main(["batch", str(path), "--outdir", str(out)]) == 2
        assert "another batch is running" in capsys.readouterr().err
        assert main(["batch", str(path), "--outdir", str(out), "--restart"]) == 2
        assert "another batch is running" in capsys.readouterr().err
        assert bm.current_manifests(out) == [held.path]  # --restart did not pull it away either
    finally:
        held.close()


# ---------------------------------------------------------------------------- crash recovery


def test_torn_manifest_line_is_cut_and_its_images_adopted(tmp_path, capsys):
    """A kill after the images were saved but during (or before) the record: no job runs twice."""
    path = write(tmp_path, "p.txt", "a\n--prompt b --batch_size 2\nc\n")
    out = tmp_path / "out"
    run(path, out, FakeSession())
    capsys.readouterr()
    manifest = bm.manifest_path(out, 0)
    lines = manifest.read_bytes().splitlines(keepends=True)
    manifest.write_bytes(lines[0] + lines[1][:40])  # b's record torn, c's never written
    files_before = result_files(out)
    again = FakeSession()
    assert run(path, out, again, as_json=True) == 0
    summary = json.loads(capsys.readouterr().out)
    assert again.calls == [] and summary["recovered"] == 2 and summary["already_done"] == 3
    recs = records(out)
    assert sorted(r["line"] for r in recs) == [1, 2, 3] and sum(bool(r.get("adopted")) for r in recs) == 2
    assert {o for r in recs for o in r["outputs"]} == files_before == result_files(out)
    assert manifest.read_bytes().endswith(b"\n")


def test_sweep_removes_stale_temp_files_and_moves_partial_jobs_but_leaves_other_files(tmp_path):
    path = write(tmp_path, "p.txt", "--prompt pair --batch_size 2 --seed 1\n")
    out = tmp_path / "out"
    out.mkdir()
    (job,) = jobs_of(path).jobs
    meta = {"request": {"extra": {"batch_job": job.key}}, "seed": 1}
    save_png(Image.new("RGB", (8, 8)), out / "00000-1-pair.png", "p", meta)  # 1 of 2 images: partial
    save_png(Image.new("RGB", (8, 8)), out / "00001-5-mine.png", "p", {"seed": 5})  # the user's own
    (out / ".00002-1-pair.png.0123456789ab.tmp").write_bytes(b"\x89PNG half")
    session = FakeSession()
    assert run(path, out, session, as_json=False) == 0
    assert len(session.calls) == 1
    assert (out / ".incomplete" / "00000-1-pair.png").is_file() and (out / "00001-5-mine.png").is_file()
    assert not list(out.glob("*.tmp"))


@pytest.mark.slow
def test_sigkill_part_way_then_resume_each_job_exactly_once(tmp_path, tiny_path):
    """docs/FAULTS.md 27 with a real process, the tiny model and SIGKILL."""
    n = 30
    path = write(tmp_path, "p.txt", "".join(f"prompt number {i}\n" for i in range(n)))
    out = tmp_path / "out"
    cmd = [sys.executable, "-m", "lowvram_gen", "batch", str(path), *SMALL, "--seed-start", "100",
           "--outdir", str(out), "--json"]
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    manifest = bm.manifest_path(out, 0)
    with open(tmp_path / "first.err", "wb") as err:
        proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=err, cwd=tmp_path)
        try:
            deadline = time.monotonic() + 120
            while time.monotonic() < deadline and proc.poll() is None:
                if manifest.is_file() and manifest.read_bytes().count(b"\n") >= 2:
                    break
                time.sleep(0.01)
            proc.send_signal(signal.SIGKILL)
        finally:
            proc.wait(timeout=30)
    killed_at = manifest.read_bytes().count(b"\n")
    assert proc.returncode == -signal.SIGKILL, (tmp_path / "first.err").read_text()[-2000:]
    assert 2 <= killed_at < n  # it really died part-way

    second = subprocess.run(cmd, env=env, capture_output=True, cwd=tmp_path, timeout=180)
    assert second.returncode == 0, second.stderr.decode()[-2000:]
    summary = json.loads(second.stdout)
    assert summary["already_done"] + summary["done"] == n and summary["failed"] == 0

    recs = records(out)
    assert sorted(r["job"] for r in recs) == sorted(j.key for j in jobs_of(path, seed_start=100).jobs)
    assert sorted(s for r in recs for s in r["seeds"]) == list(range(100, 100 + n))
    outputs = [o for r in recs for o in r["outputs"]]
    assert sorted(outputs) == sorted(result_files(out)) and len(set(outputs)) == n
    for rel in outputs:
        with Image.open(out / rel) as im:
            im.verify()  # a complete, valid PNG
        with Image.open(out / rel) as im:
            assert im.size == (64, 64)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
def test_two_processes_with_accelerate_launch_make_each_job_once(tmp_path, tiny_path, capsys):
    """docs/FAULTS.md 28: `accelerate launch` with two processes on the CPU (gloo)."""
    n = 7
    path = write(tmp_path, "p.txt", "".join(f"prompt {i}\n" for i in range(n)))
    out = tmp_path / "out"
    launcher = Path(sys.executable).with_name("accelerate")
    launch = [str(launcher)] if launcher.exists() else [sys.executable, "-m", "accelerate.commands.launch"]
    cmd = [*launch, "launch"] if launcher.exists() else launch
    cmd += ["--multi_gpu", "--num_processes", "2", "--num_machines", "1", "--mixed_precision", "no",
            "--dynamo_backend", "no", "--main_process_port", str(_free_port()),
            str(ROOT / "scripts" / "batch_prompts.py"), str(path), *SMALL, "--cpu", "--seed-start", "0",
            "--outdir", str(out), "--json"]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    done = subprocess.run(cmd, env=env, capture_output=True, cwd=tmp_path, timeout=240)
    assert done.returncode == 0, done.stderr.decode()[-3000:]
    summary = json.loads(done.stdout)
    assert (summary["processes"], summary["done"], summary["failed"]) == (2, n, 0)

    per_rank = {rank: bm.read_records([bm.manifest_path(out, rank)]) for rank in (0, 1)}
    assert per_rank[0] and per_rank[1]  # both processes worked
    keys = [r["job"] for recs in per_rank.values() for r in recs]
    assert sorted(keys) == sorted(j.key for j in jobs_of(path, seed_start=0).jobs)
    for rank, recs in per_rank.items():
        assert all(o.startswith(f"rank{rank}/") for r in recs for o in r["outputs"])
    assert sorted(o for recs in per_rank.values() for r in recs for o in r["outputs"]) == sorted(result_files(out))

    # resume across the set, here with one process: everything is already done
    resumed = FakeSession()
    assert run(path, out, resumed, seed_start=0) == 0
    assert resumed.calls == []


# ------------------------------------------------------------------------ with the tiny model


@pytest.fixture
def shared_session(monkeypatch, tiny_path):
    """One real Session for the tests below (the CLI makes one per run: that is one per process)."""
    from lowvram_gen import session as session_mod

    global _SESSION
    if _SESSION is None:
        _SESSION = session_mod.Session()
    monkeypatch.setattr(session_mod, "Session", lambda **kw: _SESSION)
    return _SESSION


_SESSION = None


def test_cli_batch_end_to_end_with_the_tiny_model(tmp_path, capsys, shared_session):
    path = write(tmp_path, "p.jsonl", '{"prompt": "a red fox", "seed": 3}\n'
                 '{"prompt": "a vqgan dream", "engine": "vqgan", "cutn": 0}\n'
                 '{"prompt": "two foxes", "batch_size": 2, "seed": 10, "sampler": "Euler a"}\n')
    out = tmp_path / "out"
    code = main(["batch", str(path), *SMALL, "--outdir", str(out), "--json"])
    captured = capsys.readouterr()
    summary = json.loads(captured.out)  # stdout is exactly one JSON object
    assert code == 1 and summary["invalid_lines"][0]["line"] == 2
    assert "invalid cutn: 0" in captured.err  # a bad VQGAN-CLIP line is reported and skipped like any other
    assert (summary["done"], summary["images"]) == (2, 3) and "job" in captured.err  # the progress bar
    recs = records(out)
    assert [r["seeds"] for r in recs] == [[3], [10, 11]] and recs[0]["preset"] == "cpu"
    assert recs[0]["attempts"][-1]["outcome"] == "ok"
    for r in recs:
        for rel, seed in zip(r["outputs"], r["seeds"]):
            _, meta = read_png_metadata(out / rel)
            assert meta["seed"] == seed and meta["request"]["extra"]["batch_job"] == r["job"]
            assert Image.open(out / rel).size == (64, 64)


def test_batch_lines_with_int8_weights_run_quantized_and_a_bad_quantize_is_refused(tmp_path, capsys, tiny_path):
    """A line's `quantize` reaches the weights: the UNet runs sdnq int8 and the PNG says `Quantize: int8`;
    the line after it, without the field, is not quantized; `int3` is an invalid line, named, skipped."""
    from lowvram_gen.outputs import parse_a1111_parameters

    path = write(tmp_path, "q.jsonl", '{"prompt": "a red fox", "seed": 3, "quantize": "int8"}\n'
                 '{"prompt": "a red fox", "seed": 3, "quantize": "int3"}\n'
                 '{"prompt": "a red fox", "seed": 3}\n')
    out = tmp_path / "out"
    code = main(["batch", str(path), *SMALL, "--outdir", str(out), "--json"])
    captured = capsys.readouterr()
    summary = json.loads(captured.out)
    assert code == 1 and [e["line"] for e in summary["invalid_lines"]] == [2]
    assert "'int3'" in captured.err and "int8" in captured.err
    recs = records(out)
    assert len(recs) == 2
    fields = []
    for r in recs:
        with Image.open(out / r["outputs"][0]) as im:
            fields.append(parse_a1111_parameters(im.text["parameters"]).get("Quantize"))
    assert fields == ["int8", None]
    quantized, plain = (np.asarray(Image.open(out / r["outputs"][0]), dtype=np.int16) for r in recs)
    assert not np.array_equal(quantized, plain)  # same seed, int8 weights: close, not the same pixels
    assert np.abs(quantized - plain).mean() < 40


def test_dry_run_reports_a_line_with_an_unknown_lora_as_invalid(tmp_path, capsys, monkeypatch):
    """Issue 18: `--dry-run` let a line naming a LoRA that is not there through; the run then failed it late."""
    monkeypatch.setenv("LOWVRAM_GEN_MODELS", str(tmp_path / "models"))
    (tmp_path / "models" / "Lora").mkdir(parents=True)
    (tmp_path / "models" / "Lora" / "film.safetensors").write_bytes(b"")
    path = write(tmp_path, "p.jsonl", '{"prompt": "a cat <lora:film:0.5>"}\n{"prompt": "a fox <lora:nosuch:1>"}\n'
                                      '{"prompt": "a dog", "loras": "gone:0.7"}\n{"prompt": "an owl embedding:noemb"}\n')
    code = main(["batch", str(path), "--outdir", str(tmp_path / "o"), "--dry-run", "--json"])
    out = json.loads(capsys.readouterr().out)
    assert code == 1
    assert [j["line"] for j in out["jobs"]] == [1]
    bad = {b["line"]: b["error"] for b in out["invalid_lines"]}
    assert sorted(bad) == [2, 3, 4]
    assert "invalid LoRA: 'nosuch'" in bad[2] and "there are: film" in bad[2]
    assert "invalid LoRA: 'gone'" in bad[3] and "invalid embedding: 'noemb'" in bad[4]
    code = main(["batch", str(path), "--outdir", str(tmp_path / "o"), "--dry-run"])  # the text report says so too
    assert code == 1 and f"{path}:2: skipped: invalid LoRA: 'nosuch'" in capsys.readouterr().err


def test_processes_that_disagree_on_a_line_all_leave_it_out(tmp_path, monkeypatch):
    """FAULTS 28 with item 1 of issue 18: a LoRA one machine's models folder lacks makes its line invalid there
    only; every process must still split the same list, or jobs would be lost or made twice."""
    from lowvram_gen.batch.command import agree_on_jobs

    monkeypatch.setenv("LOWVRAM_GEN_MODELS", str(tmp_path / "models"))
    path = write(tmp_path, "p.txt", "a\nb <lora:film:1>\nc\n")
    here = jobs_of(path)  # this machine has no film LoRA: line 2 is invalid here
    (tmp_path / "models" / "Lora").mkdir(parents=True)
    (tmp_path / "models" / "Lora" / "film.safetensors").write_bytes(b"")
    there = jobs_of(path)  # the other machine has it
    assert [j.line for j in here.jobs] == [1, 3] and [j.line for j in there.jobs] == [1, 2, 3]
    keys = [{j.key for j in here.jobs}, {j.key for j in there.jobs}]
    group = SimpleNamespace(world=2, gather=lambda obj: keys)
    agree_on_jobs(there, group)
    assert [j.key for j in there.jobs] == [j.key for j in here.jobs]
    assert [b.line for b in there.bad] == [2] and "another process" in there.bad[0].error
