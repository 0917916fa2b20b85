"""A1111's job control in the engine: Batch count, Skip, Interrupt that keeps the running image, live previews.

Real jobs on the embedded tiny model (CPU); Skip and Interrupt are set from the progress callback at a chosen step,
so each test knows exactly where the pass stopped. Out-of-memory is simulated, as in tests/test_ladder.py: a forward
pre-hook on the UNet raises torch.OutOfMemoryError.
"""

from __future__ import annotations

import threading

import numpy as np
import pytest
import torch
from PIL import Image

from lowvram_gen import presets as presets_mod
from lowvram_gen.engines.sd import pipeline as sd
from lowvram_gen.errors import Cancelled, InvalidRequest
from lowvram_gen.outputs import parse_a1111_parameters, read_png_metadata
from lowvram_gen.request import MAX_BATCH_COUNT, GenerationRequest
from lowvram_gen.session import Session


def job(tmp_path, **kw) -> GenerationRequest:
    return GenerationRequest(**{**dict(prompt="a boat", width=64, height=64, steps=4, seed=7,
                                       outdir=str(tmp_path)), **kw})


def fields(path) -> dict:
    return parse_a1111_parameters(read_png_metadata(path)[0])


def pixels(path) -> np.ndarray:
    return np.asarray(Image.open(path))


def stop_at(event: threading.Event, when):
    """An on_step that sets `event` at the step `when(count, step, total)` picks; returns it and what it saw."""
    seen = []

    def on_step(step, total):
        seen.append((step, total))
        if when(len(seen), step, total):
            event.set()

    return on_step, seen


@pytest.fixture()
def denoised(monkeypatch):
    """The seeds of every pass the runner denoises, in order."""
    passes = []
    real = sd.denoise

    def watched(pipe, step, *args, **kwargs):
        passes.append(list(step.seeds))
        return real(pipe, step, *args, **kwargs)

    monkeypatch.setattr(sd, "denoise", watched)
    return passes


# -------------------------------------------------------------------------------------------- batch count


def test_batch_count_is_validated_like_every_field():
    assert GenerationRequest(batch_count="3").validated().batch_count == 3
    for bad in (0, MAX_BATCH_COUNT + 1, 1.5, "two", True):
        with pytest.raises(InvalidRequest, match="invalid batch count"):
            GenerationRequest(batch_count=bad).validated()


def test_batch_count_seeds_advance_over_every_batch_as_a1111s(tmp_path, denoised):
    """A1111's all_seeds: image i of the whole job (batch count x batch size) gets seed+i; each batch is its own
    pass (never merged with the next one's images, though the cpu preset's max_batch of 4 would hold them), and an
    image depends on its seed alone: batch count 3 x size 2 gives the pixels batch size 6 gives."""
    result = Session().generate(job(tmp_path, batch_size=2, batch_count=3, seed=4294967294))
    assert result.seeds == [4294967294, 4294967295, 0, 1, 2, 3]  # wrapping at 2^32, as batch size does
    assert denoised == [[4294967294, 4294967295], [0, 1], [2, 3]]
    assert [fields(p)["Seed"] for p in result.images] == [str(s) for s in result.seeds]
    assert "Batch count" not in read_png_metadata(result.images[0])[0]  # A1111 does not write it either
    one_batch = Session().generate(job(tmp_path / "one", batch_size=6, seed=4294967294, outdir=str(tmp_path / "one")))
    # within one 8-bit level: torch's CPU kernels may sum a batch of 2 and one of 6 in another order (seen on a Xeon
    # with torch 2.14.1: one value in 12,288 one level off); another seed's image differs everywhere
    for a, b in zip(result.images, one_batch.images):
        assert np.abs(pixels(a).astype(int) - pixels(b).astype(int)).max() <= 1


def test_batch_count_with_a_variation_seed_keeps_the_seed_and_counts_the_subseed_up(tmp_path):
    """A1111: with a variation strength every image keeps the seed, and image i of the job gets subseed+i."""
    result = Session().generate(job(tmp_path, batch_size=2, batch_count=2, seed=11, subseed=500,
                                    subseed_strength=0.5))
    assert [fields(p)["Seed"] for p in result.images] == ["11"] * 4
    assert [fields(p)["Variation seed"] for p in result.images] == ["500", "501", "502", "503"]
    assert len({pixels(p).tobytes() for p in result.images}) == 4  # each its own subseed's noise


def test_an_out_of_memory_in_a_batch_still_steps_down_and_the_seeds_stay(tmp_path, denoised, monkeypatch):
    """The ladder is planned per pass of batch_size. Simulated OOM: the UNet raises torch.OutOfMemoryError on any
    batch of two (CFG doubles it: more than 2 rows); the pass is split, and every later batch runs split too."""
    session = Session(preset="cpu")
    session.load_model("tiny", None, "float32")

    def oom(_module, args, kwargs):
        sample = args[0] if args else next(iter(kwargs.values()))
        if sample.shape[0] > 2:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB (simulated)")

    handle = session.model.pipe.unet.register_forward_pre_hook(oom, with_kwargs=True)
    try:
        result = session.generate(job(tmp_path, batch_size=2, batch_count=2, seed=20))
    finally:
        handle.remove()
    assert denoised == [[20, 21], [20], [21], [22], [23]]
    assert result.seeds == [20, 21, 22, 23] and [fields(p)["Seed"] for p in result.images] == ["20", "21", "22", "23"]
    assert [(a["stage"], a["outcome"]) for a in result.attempts if a["stage"] == "denoise"][:2] == [
        ("denoise", "oom"), ("denoise", "ok")]


@pytest.mark.parametrize("sampler", ["Euler a", "DPM++ SDE", "default"])
def test_watching_a_job_changes_none_of_its_pixels(tmp_path, sampler):
    """Cancel and Skip events that are never set, and previews, leave the image as it is: the sampler's step is
    watched for its estimate with its own signature (the pipelines pass an ancestral sampler its seeded generator
    only when its step's signature takes one)."""
    session = Session()
    plain = session.generate(job(tmp_path, sampler=sampler, steps=3))
    watched = session.generate(job(tmp_path, sampler=sampler, steps=3), cancel=threading.Event(),
                               skip=threading.Event(), on_preview=lambda *a: None, preview_every=1)
    assert np.array_equal(pixels(plain.images[0]), pixels(watched.images[0]))


# -------------------------------------------------------------------------------------------- skip


def test_skip_keeps_the_skipped_pass_and_goes_on_with_the_next_batch(tmp_path):
    skip = threading.Event()
    on_step, seen = stop_at(skip, lambda n, step, total: n == 6)  # step 2 of the second batch
    result = Session().generate(job(tmp_path, batch_count=3, seed=30), on_step=on_step, skip=skip)
    assert seen == [(1, 4), (2, 4), (3, 4), (4, 4), (1, 4), (2, 4), (1, 4), (2, 4), (3, 4), (4, 4)]
    assert not skip.is_set()  # cleared: the third batch ran to its end
    assert [fields(p)["Seed"] for p in result.images] == ["30", "31", "32"]
    assert fields(result.images[1])["Steps"] == "4"  # its normal infotext
    assert any("1 image(s) skipped before their last step" in w for w in result.warnings)
    full = Session().generate(job(tmp_path / "full", seed=31, outdir=str(tmp_path / "full")))
    assert not np.array_equal(pixels(result.images[1]), pixels(full.images[0]))  # stopped at step 2, not finished


def test_skip_ends_the_rest_of_its_batch_and_a_skip_from_before_a_batch_is_forgotten(tmp_path, denoised):
    """A batch split into passes (max_batch 1) is skipped whole: its later pass is not made. A skip set before the
    job (or between batches) is cleared when the next batch begins, as A1111 clears its flag."""
    one = presets_mod.find_preset("cpu")
    session = Session()
    session.forced_preset = lambda spec=None, quantize=None: presets_mod.Preset(**{**one.__dict__, "max_batch": 1})
    skip = threading.Event()
    on_step, _ = stop_at(skip, lambda n, step, total: n == 2)  # step 2 of image 0, the first pass of batch 1
    result = session.generate(job(tmp_path, batch_size=2, batch_count=2, seed=40), on_step=on_step, skip=skip)
    assert denoised == [[40], [42], [43]]  # 41, the rest of the skipped batch, was never made
    assert [fields(p)["Seed"] for p in result.images] == ["40", "42", "43"]
    early = threading.Event()
    early.set()
    again = session.generate(job(tmp_path, batch_count=2, seed=50), skip=early)
    assert len(again.images) == 2 and not any("skipped" in w for w in again.warnings)


# -------------------------------------------------------------------------------------------- interrupt


def test_interrupt_keeps_the_running_pass_decoded_and_stops_the_batch_count(tmp_path, denoised):
    cancel = threading.Event()
    on_step, seen = stop_at(cancel, lambda n, step, total: n == 7)  # step 3 of the second batch
    with pytest.raises(Cancelled) as err:
        Session().generate(job(tmp_path, batch_count=4, seed=60), on_step=on_step, cancel=cancel)
    assert "cancelled at step 3 of 4; 2 image(s) kept, the interrupted pass's as it was" in str(err.value)
    assert denoised == [[60], [61]] and len(seen) == 7  # no third batch
    kept = err.value.images
    assert sorted(p.name for p in tmp_path.glob("*.png")) == sorted(p.split("/")[-1] for p in kept)
    assert fields(kept[1])["Seed"] == "61" and Image.open(kept[1]).size == (64, 64)


def test_an_interrupted_pass_keeps_the_samplers_estimate_of_the_final_image(tmp_path, monkeypatch):
    """As A1111 keeps its denoised prediction: with a sampler whose step estimates the final latents (Euler's
    pred_original_sample), the interrupted pass decodes that estimate from the step it stopped at."""
    import functools

    from diffusers import EulerDiscreteScheduler

    estimates, decoded = [], []
    real_step, real_decode = EulerDiscreteScheduler.step, sd.decode

    @functools.wraps(real_step)
    def step(self, *args, **kwargs):
        out = real_step(self, *args, **kwargs)
        estimates.append((out[1] if isinstance(out, tuple) else out.pred_original_sample).clone())
        return out

    def decode(pipe, latents, *args, **kwargs):
        decoded.append(latents.clone())
        return real_decode(pipe, latents, *args, **kwargs)

    monkeypatch.setattr(EulerDiscreteScheduler, "step", step)
    monkeypatch.setattr(sd, "decode", decode)
    cancel = threading.Event()
    on_step, _ = stop_at(cancel, lambda n, step, total: n == 2)
    with pytest.raises(Cancelled, match="cancelled at step 2 of 4"):
        Session().generate(job(tmp_path, sampler="Euler"), on_step=on_step, cancel=cancel)
    assert len(estimates) == 2 and len(decoded) == 1 and torch.equal(decoded[0], estimates[1])


def test_a_cancel_while_the_job_waits_or_loads_stops_it_before_any_step(tmp_path, denoised, monkeypatch):
    cancel = threading.Event()
    cancel.set()
    with pytest.raises(Cancelled, match="before the first step"):  # waited behind another job: never starts
        Session().generate(job(tmp_path), cancel=cancel)
    session = Session()
    real = Session.load_model
    loading = threading.Event()

    def load_model(self, *args, **kwargs):
        loading.set()
        cancel.set()  # Interrupt pressed while the model loads
        return real(self, *args, **kwargs)

    cancel.clear()
    monkeypatch.setattr(Session, "load_model", load_model)
    with pytest.raises(Cancelled, match="before the first step") as err:
        session.generate(job(tmp_path), cancel=cancel)
    assert loading.is_set() and err.value.images == [] and denoised == []
    assert not list(tmp_path.glob("*.png"))


def test_interrupt_in_a_hires_first_pass_keeps_the_first_pass_and_runs_no_hires_pass(tmp_path, denoised):
    cancel = threading.Event()
    on_step, _ = stop_at(cancel, lambda n, step, total: n == 2)
    with pytest.raises(Cancelled, match="cancelled at step 2 of 4") as err:
        Session().generate(job(tmp_path, hires_scale=2, hires_steps=3), on_step=on_step, cancel=cancel)
    assert len(denoised) == 1  # the first pass only
    kept = err.value.images[0]
    assert Image.open(kept).size == (64, 64)  # as A1111: the first pass's image, not upscaled
    info = fields(kept)
    assert info["Hires upscale"] == "2" and info["Generated size"] == "64x64"  # its normal infotext says what it is


def test_interrupt_in_the_hires_pass_keeps_the_hires_latents_decoded(tmp_path, denoised):
    cancel = threading.Event()
    on_step, seen = stop_at(cancel, lambda n, step, total: n == 6)  # 4 first-pass steps, then 2 of the hires pass
    with pytest.raises(Cancelled, match="cancelled at step 2 of") as err:
        Session().generate(job(tmp_path, hires_scale=2, hires_steps=4, hires_denoise=1.0), on_step=on_step,
                           cancel=cancel)
    assert len(denoised) == 2 and seen[4:] == [(1, 4), (2, 4)]
    kept = err.value.images[0]
    assert Image.open(kept).size == (128, 128) and "Generated size" not in fields(kept)


def test_a_pipeline_without_diffusers_interrupt_drops_a_stopped_pass(tmp_path, monkeypatch):
    """Where the pipeline has no `interrupt` to end its loop with, a stopped pass ends with no image: a skipped
    batch is left out (the job goes on), an interrupted job keeps what it finished."""
    monkeypatch.setattr(sd, "stops_early", lambda pipe: False)
    skip = threading.Event()
    on_step, _ = stop_at(skip, lambda n, step, total: n == 2)
    result = Session().generate(job(tmp_path, batch_count=2, seed=70), on_step=on_step, skip=skip)
    assert [fields(p)["Seed"] for p in result.images] == ["71"]
    cancel = threading.Event()
    on_step, _ = stop_at(cancel, lambda n, step, total: n == 6)
    with pytest.raises(Cancelled) as err:
        Session().generate(job(tmp_path, batch_count=2, seed=80), on_step=on_step, cancel=cancel)
    assert [fields(p)["Seed"] for p in err.value.images] == ["80"]


# -------------------------------------------------------------------------------------------- previews


def test_a_preview_every_n_steps_of_every_pass_made_on_the_cpu(tmp_path, monkeypatch):
    from lowvram_gen import preview

    rendered, shown = [], []
    real = preview.renderer

    def renderer(pipe, method="auto", models=None):
        render, how = real(pipe, method, models)

        def watched(latents, width, height):
            rendered.append((latents.device.type, latents.dtype, tuple(latents.shape)))
            return render(latents, width, height)

        return watched, how

    monkeypatch.setattr(preview, "renderer", renderer)
    result = Session().generate(job(tmp_path, width=96, height=64, steps=6, batch_size=2, batch_count=2),
                                on_preview=lambda image, step, total: shown.append((image.mode, image.size, step,
                                                                                    total)),
                                preview_every=2)
    assert shown == [("RGB", (96, 64), step, 6) for step in (2, 4, 6)] * 2  # two batches, the latents' size x8
    assert rendered == [("cpu", torch.float32, (1, 4, 8, 12))] * 6  # one image of the pass, on the CPU in float32
    assert len(result.images) == 4


def test_a_job_previews_with_taesd_off_its_steps_when_the_decoder_is_in_the_models_folder(tmp_path, monkeypatch):
    """auto takes TAESD from models/VAE-approx ($LOWVRAM_GEN_MODELS here), made on the preview worker thread."""
    from test_preview import as_a1111_file, tiny_taesd

    monkeypatch.setenv("LOWVRAM_GEN_MODELS", str(tmp_path / "models"))
    as_a1111_file(tiny_taesd(), tmp_path / "models" / "VAE-approx" / "taesd_decoder.pt")
    shown, last = [], threading.Event()

    def on_preview(image, step, total):
        shown.append((image.size, step, threading.current_thread().name))
        if step == 4:
            last.set()

    Session().generate(job(tmp_path), on_preview=on_preview, preview_every=2)
    assert last.wait(60)
    assert [s[:2] for s in shown] in ([((64, 64), 2), ((64, 64), 4)], [((64, 64), 4)])  # 2 may be replaced by 4
    assert {s[2] for s in shown} == {"lowvram-gen preview"}


@pytest.mark.parametrize("every, method", [(0, "auto"), (3, "off")])
def test_previews_off_cost_nothing(tmp_path, monkeypatch, every, method):
    from lowvram_gen import preview

    def refused(*args, **kwargs):
        raise AssertionError("no preview renderer is built when previews are off")

    monkeypatch.setattr(preview, "renderer", refused) if every == 0 else None
    shown = []
    Session().generate(job(tmp_path, steps=3), on_preview=lambda *a: shown.append(a), preview_every=every,
                       preview_method=method)
    assert shown == []


def test_preview_settings_are_checked_before_the_job(tmp_path):
    with pytest.raises(InvalidRequest, match="invalid live preview every"):
        Session().generate(job(tmp_path), preview_every=-1)
    with pytest.raises(InvalidRequest, match="invalid live preview method: 'full'"):
        Session().generate(job(tmp_path), preview_every=2, preview_method="full")


# -------------------------------------------------------------------------------------------- front ends


def test_cli_batch_count(tmp_path, capsys):
    import json

    from lowvram_gen.cli.main import main

    code = main(["generate", "a boat", "--width", "64", "--height", "64", "--steps", "2", "--seed", "7", "--batch", "2",
                 "--batch-count", "2", "--outdir", str(tmp_path), "--json"])
    result = json.loads(capsys.readouterr().out)
    assert code == 0 and result["seeds"] == [7, 8, 9, 10] and len(result["images"]) == 4
    assert main(["generate", "a boat", "--batch-count", "0", "--outdir", str(tmp_path)]) == 2
    assert "invalid batch count: 0; a whole number from 1 to 100" in capsys.readouterr().err
