"""Issue 32 item 5, A1111's refiner (engines/sd/refiner.py) on tiny-sdxl and a tiny SDXL refiner (tests/tiny_refiner.py):
the image equals a hand-rolled reference made of plain diffusers (the base pipeline's own loop, its UNet and the
conditioning swapped by the test at the step where A1111's completed ratio reaches the switch, the refiner's
conditioning made by diffusers' own refiner pipeline), for a one-step and a multistep sampler; it differs from no
refiner; a switch at 1 is no refiner; the UNets are never on the device together; a simulated out-of-memory in the
refiner's half recovers without reloading the base; and the fronts (CLI, API body, PNG written and read back, batch)."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from PIL import Image

from folder_sampler import own_sampler  # tests/folder_sampler.py
from tiny_refiner import save_tiny_refiner  # tests/tiny_refiner.py
from lowvram_gen import GenerationRequest
from lowvram_gen.a1111.api_body import map_body
from lowvram_gen.a1111.infotext import a1111_fields, request_fields
from lowvram_gen.engines.sd import refiner as refiner_mod
from lowvram_gen.engines.sd.pipeline import set_sampler
from lowvram_gen.errors import InvalidRequest
from lowvram_gen.outputs import parse_a1111_parameters, read_png_metadata
from lowvram_gen.session import Session

PROMPT, NEGATIVE, SEED, STEPS, CFG, SIZE = "a lighthouse at dusk", "blurry", 3, 6, 6.0, 64


@pytest.fixture(scope="module")
def refiner_path(tmp_path_factory):
    return save_tiny_refiner(tmp_path_factory.mktemp("tiny-refiner"))


def pixels(path_or_image) -> np.ndarray:
    image = path_or_image if isinstance(path_or_image, Image.Image) else Image.open(path_or_image)
    return np.asarray(image.convert("RGB")).astype(int)


def a1111_ratio(scheduler, i: int) -> float:
    """A1111's completed ratio before model call i (written here from its rule, not imported): the training level
    nearest to the call's sigma, (999 - index) / 1000."""
    levels = ((1 - scheduler.alphas_cumprod) / scheduler.alphas_cumprod) ** 0.5
    return (999 - int(torch.argmin((levels - scheduler.sigmas[i]).abs()))) / 1000


_MADE: dict = {}


def reference(base_folder, refiner_folder, sampler: str, switch: float | None, lora=None,
              on_refiner: bool = True) -> tuple[np.ndarray, int | None]:
    """`_reference`, made once per sampler, switch and LoRA."""
    key = (str(base_folder), str(refiner_folder), sampler, switch, str(lora), on_refiner)
    if key not in _MADE:
        _MADE[key] = _reference(base_folder, refiner_folder, sampler, switch, lora, on_refiner)
    return _MADE[key]


def _reference(base_folder, refiner_folder, sampler: str, switch: float | None, lora=None,
               on_refiner: bool = True) -> tuple[np.ndarray, int | None]:
    """Plain diffusers: the base SDXL pipeline's one call, whose step-end callback puts the refiner's UNet in the
    pipeline and hands it the refiner's conditioning (diffusers' StableDiffusionXLImg2ImgPipeline.encode_prompt and
    _get_add_time_ids: OpenCLIP-G alone, aesthetic scores 6 and 2.5) from the first call at or past the switch.
    `lora`: a LoRA file diffusers' `load_lora_weights` puts on the base (and, `on_refiner`, on the refiner: its UNet
    and its second text encoder). Returns the image and the call the refiner took over at."""
    from diffusers import StableDiffusionXLImg2ImgPipeline, StableDiffusionXLPipeline

    base = StableDiffusionXLPipeline.from_pretrained(str(base_folder))
    set_sampler(base, sampler)
    ref = StableDiffusionXLImg2ImgPipeline.from_pretrained(str(refiner_folder))
    if lora is not None:
        base.load_lora_weights(str(lora))
        if on_refiner:  # without the first encoder's layers, which the refiner lacks (A1111 skips them)
            from safetensors.torch import load_file

            ref.load_lora_weights({k: v for k, v in load_file(str(lora)).items() if not k.startswith("lora_te1_")})
    embeds, negative, pooled, negative_pooled = ref.encode_prompt(PROMPT, device="cpu", negative_prompt=NEGATIVE)
    ids, negative_ids = ref._get_add_time_ids((SIZE, SIZE), (0, 0), (SIZE, SIZE), 6.0, 2.5, (SIZE, SIZE), (0, 0),
                                              (SIZE, SIZE), dtype=embeds.dtype,
                                              text_encoder_projection_dim=ref.text_encoder_2.config.projection_dim)
    took = []

    def step_end(pipe, i, t, kwargs):
        if switch is not None and not took and i + 1 < len(pipe.scheduler.timesteps) \
                and a1111_ratio(pipe.scheduler, i + 1) >= switch:
            took.append(i + 1)
            pipe.unet = ref.unet
            return dict(kwargs, prompt_embeds=torch.cat([negative, embeds]),
                        add_text_embeds=torch.cat([negative_pooled, pooled]),
                        add_time_ids=torch.cat([negative_ids, ids]))
        return kwargs

    image = base(PROMPT, negative_prompt=NEGATIVE, width=SIZE, height=SIZE, num_inference_steps=STEPS,
                 guidance_scale=CFG, generator=torch.Generator().manual_seed(SEED), callback_on_step_end=step_end,
                 callback_on_step_end_tensor_inputs=["latents", "prompt_embeds", "add_text_embeds",
                                                     "add_time_ids"]).images[0]
    return pixels(image), took[0] if took else None


def job(session, tmp_path, sampler, **fields):
    return session.generate(GenerationRequest(prompt=PROMPT, negative_prompt=NEGATIVE, width=SIZE, height=SIZE,
                                              steps=STEPS, cfg_scale=CFG, seed=SEED, model="tiny-sdxl",
                                              sampler=sampler, outdir=str(tmp_path), **fields))


@pytest.mark.parametrize("sampler", ["own", "DPM++ 2M"])
def test_the_image_equals_the_hand_rolled_reference_and_differs_from_no_refiner(sampler, tiny_sdxl_path,
                                                                                 refiner_path, tmp_path):
    sampler = own_sampler("tiny-sdxl") if sampler == "own" else sampler
    expected, took = reference(tiny_sdxl_path, refiner_path, sampler, 0.6)
    assert took is not None and 0 < took < STEPS  # the switch falls inside the run
    session = Session(device="cpu")
    result = job(session, tmp_path, sampler, refiner=refiner_path, refiner_switch_at=0.6)
    made = pixels(result.images[0])
    assert np.abs(made - expected).max() <= 2
    plain, _ = reference(tiny_sdxl_path, refiner_path, sampler, None)
    assert np.abs(made - plain).max() > 10  # the refiner changed the image
    params = parse_a1111_parameters(read_png_metadata(result.images[0])[0])
    assert params["Refiner"] == refiner_path.rsplit("/", 1)[-1] and params["Refiner switch at"] == "0.6"
    assert request_fields(params).fields["refiner_switch_at"] == 0.6
    held = session.refiner  # kept in RAM for the next job that names it
    assert refiner_mod.load(refiner_path, "float32", held) is held


def test_a_switch_at_one_is_no_refiner(tiny_sdxl_path, refiner_path, tmp_path):
    sampler = own_sampler("tiny-sdxl")
    plain, _ = reference(tiny_sdxl_path, refiner_path, sampler, None)
    result = job(Session(device="cpu"), tmp_path, sampler, refiner=refiner_path, refiner_switch_at=1)
    assert np.abs(pixels(result.images[0]) - plain).max() <= 2
    assert "Refiner" not in parse_a1111_parameters(read_png_metadata(result.images[0])[0])


def watch_switches(monkeypatch) -> list:
    """Each pass's Switch record (None: a pass the refiner does not run in), as the passes end."""
    import contextlib

    seen = []
    switching = refiner_mod.switching

    def watched(*args, **kwargs):
        with switching(*args, **kwargs) as record:
            yield record
            seen.append(record)

    monkeypatch.setattr(refiner_mod, "switching", contextlib.contextmanager(watched))
    return seen


def test_the_two_unets_are_never_on_the_device_together(tiny_sdxl_path, refiner_path, tmp_path, monkeypatch):
    """The moves the switch makes, in order (on this CPU machine they are recorded; the device is the CPU): the base
    off before the refiner on, the refiner off after the pass; the refiner's UNet is on the host between jobs."""
    seen = watch_switches(monkeypatch)
    session = Session(device="cpu")
    job(session, tmp_path, own_sampler("tiny-sdxl"), refiner=refiner_path, refiner_switch_at=0.6)
    (record,) = seen
    assert record.moves[:2] == [("base", "off"), ("refiner", "on")] and record.moves[2] == ("refiner", "off")
    assert record.at_call is not None and record.calls == STEPS
    on = False
    for who, where in record.moves:  # never both: the refiner comes on only after the base went off
        assert not (who == "refiner" and where == "on" and on)
        on = who == "base" and where == "on" or (on and who != "base")
    assert str(next(session.refiner.pipe.unet.parameters()).device) == "cpu"


def test_with_hires_fix_the_refiner_refines_the_second_pass(refiner_path, tmp_path, monkeypatch):
    """A1111's default "Hires fix: which pass to enable refiner for": the second pass; the first runs the base alone."""
    seen = watch_switches(monkeypatch)
    result = job(Session(device="cpu"), tmp_path, own_sampler("tiny-sdxl"), refiner=refiner_path,
                 refiner_switch_at=0.5, hires_scale=1.5, hires_denoise=0.6)
    first, second = seen
    assert first is None and second is not None and second.at_call is not None and 0 < second.at_call < second.calls
    params = parse_a1111_parameters(read_png_metadata(result.images[0])[0])
    assert params["Refiner switch at"] == "0.5" and params["Size"] == "64x64"


def test_a_simulated_out_of_memory_in_the_refiners_half_recovers_without_reloading_the_base(
        tiny_sdxl_path, refiner_path, tmp_path, monkeypatch):
    """Simulated out-of-memory: the refiner UNet's first call raises torch.OutOfMemoryError once; the ladder retries
    the pass on the next preset with the same loaded base (no second load) and the image is the reference's."""
    from lowvram_gen import session as session_mod

    sampler = own_sampler("tiny-sdxl")
    expected, _ = reference(tiny_sdxl_path, refiner_path, sampler, 0.6)
    session = Session(device="cpu")
    held = refiner_mod.load(refiner_path, "float32")
    session.refiner = held
    raised, loads = [], []

    def hook(module, args):
        if not raised:
            raised.append(True)
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB (simulated)")

    handle = held.pipe.unet.register_forward_pre_hook(hook)
    load = session_mod.load
    monkeypatch.setattr(session_mod, "load", lambda *a, **k: loads.append(a) or load(*a, **k))
    try:
        result = job(session, tmp_path, sampler, refiner=refiner_path, refiner_switch_at=0.6, preset="lowvram")
    finally:
        handle.remove()
    assert raised and len(loads) == 1
    assert [a["outcome"] for a in result.attempts if a["stage"] == "denoise"][:2] == ["oom", "ok"]
    assert np.abs(pixels(result.images[0]) - expected).max() <= 2


def test_the_fronts_take_it(tmp_path, refiner_path):
    request = GenerationRequest(prompt="x", refiner=" None ", refiner_switch_at="0.7").validated()
    assert request.refiner is None and request.refiner_switch_at == 0.7
    for bad in (0, -0.1, 1.5, "soon", True):
        with pytest.raises(InvalidRequest) as refused:
            GenerationRequest(prompt="x", refiner="m", refiner_switch_at=bad).validated()
        assert "refiner switch at" in str(refused.value) and "\n" not in str(refused.value)
    body = {"prompt": "x", "refiner_checkpoint": "sd_xl_refiner_1.0 [7440042bbd]", "refiner_switch_at": 0.75}
    listed = {"sd_xl_refiner_1.0": refiner_path}  # an A1111 title `name [hash]` is found by its name
    mapped = map_body(body, "txt2img", "tiny", 1, "out", listed.get)
    assert mapped.request.refiner == refiner_path and mapped.request.refiner_switch_at == 0.75
    assert not mapped.warnings
    with pytest.raises(InvalidRequest) as refused:  # never a path of the server's, as sd_model_checkpoint
        map_body(dict(body, refiner_checkpoint="/etc/models/x"), "txt2img", "tiny", 1, "out", listed.get)
    assert "refiner_checkpoint" in str(refused.value) and "\n" not in str(refused.value)
    assert map_body({"prompt": "x", "refiner_checkpoint": "None"}, "txt2img", "tiny", 1, "out",
                    lambda name: None).request.refiner is None
    written = a1111_fields(GenerationRequest(prompt="x", refiner="r", refiner_switch_at=0.8), "Euler", 1, "gpu",
                           (512, 512), refiner="sd_xl_refiner_1.0 [7440042bbd]")
    assert written["Refiner"] == "sd_xl_refiner_1.0 [7440042bbd]" and written["Refiner switch at"] == 0.8
    read = request_fields({"Refiner": "sd_xl_refiner_1.0 [7440042bbd]", "Refiner switch at": "0.8"}).fields
    assert read["refiner"] == "sd_xl_refiner_1.0" and read["refiner_switch_at"] == 0.8


def test_what_cannot_refine_is_refused_in_one_sentence(tmp_path, refiner_path):
    """A refiner whose VAE scales its latents otherwise (an SD 1.5 model's 0.18215 against SDXL's 0.13025)."""
    import shutil

    other = tmp_path / "other-latents"
    shutil.copytree(refiner_path, other)
    config = json.loads((other / "vae" / "config.json").read_text())
    (other / "vae" / "config.json").write_text(json.dumps(dict(config, scaling_factor=0.13025)))
    with pytest.raises(InvalidRequest) as refused:
        Session(device="cpu").generate(GenerationRequest(prompt="x", model="tiny-sdxl", width=64, height=64, steps=2,
                                                         refiner=str(other), outdir=str(tmp_path)))
    assert "another latent space" in str(refused.value) and "\n" not in str(refused.value)


def test_the_ui_has_a_refiner_accordion_in_txt2img_and_img2img_that_reaches_the_request(tmp_path, monkeypatch):
    """Without a browser: each tab's Refiner checkpoint starts empty (no refiner) and Switch at at 0.8; their values
    are the request's `refiner` and `refiner_switch_at`, the last of the tab's own Generate inputs before the Script
    controls (ui/xyz.inputs(tab), merged after them)."""
    from lowvram_gen.ui import controlnet, xyz
    from lowvram_gen.ui.app import UiOptions, build_app
    from lowvram_gen.ui.context import TabContext

    asked = []
    monkeypatch.setattr(TabContext, "run_job", lambda self, tab, fields, *a, **k: iter([asked.append(fields)]))
    app = build_app(Session(outdir=str(tmp_path)), UiOptions(outdir=str(tmp_path), model="tiny"))
    for api_name, tab, prefix, given in (("generate", "txt2img", "", {}),
                                         ("img2img", "img2img", "i2i-", {"init_image": "init.png"})):
        event = next(d for d in app.fns.values() if d.api_name == api_name)
        own = event.inputs[:len(event.inputs) - len(controlnet.KEYS) - len(xyz.inputs(tab))]
        assert [(b.elem_id, b.value) for b in own[-2:]] == [(f"{prefix}refiner", ""),
                                                            (f"{prefix}refiner-switch-at", 0.8)]
        list(event.fn(prompt="x", refiner="sd_xl_refiner_1.0", refiner_switch_at=0.7, **given))
        list(event.fn(prompt="x", refiner="", **given))
    assert [(f["refiner"], f["refiner_switch_at"]) for f in asked] == [("sd_xl_refiner_1.0", 0.7), (None, 0.8)] * 2


def test_png_info_sends_the_refiner_to_the_txt2img_and_img2img_accordion(tmp_path):
    from PIL.PngImagePlugin import PngInfo

    from lowvram_gen.ui import sendto

    for text, want in (("Refiner: sd_xl_refiner_1.0 [7440042bbd], Refiner switch at: 0.7, ", ("sd_xl_refiner_1.0", 0.7)),
                       ("", ("", 0.8))):
        info = PngInfo()
        info.add_text("parameters", f"a fox\nSteps: 1, Sampler: Euler a, CFG scale: 7, Seed: 5, Size: 64x64, {text}"
                                    "Model: tiny")
        png = tmp_path / f"made-{bool(text)}.png"
        Image.new("RGB", (64, 64)).save(png, pnginfo=info)
        for keys in (sendto.TXT2IMG, sendto.IMG2IMG):
            values, said = sendto.values_for(keys, str(png))
            sent = dict(zip(keys, values))
            assert (sent["refiner"], sent["refiner_switch_at"]) == want and not any("Refiner" in s for s in said)


def test_the_plan_counts_the_swap_its_ram_and_bus_time_and_plan_shows_it(refiner_path, capsys):
    from lowvram_gen.cli.main import main
    from lowvram_gen.hardware.device import simulated

    session = Session()
    request = GenerationRequest(prompt="x", model="tiny-sdxl", width=64, height=64, steps=4, batch_count=2,
                                refiner=refiner_path, refiner_switch_at=0.7)
    planned = session.plan(request, simulated("4"))
    part = planned.refiner
    assert part is not None and part.passes == 2 and part.refiner_unet_bytes > 0 and part.ram_bytes > 0
    resident = planned.preset.device == "gpu" and planned.preset.memory.offload == "none"
    per_pass = 2 * part.refiner_unet_bytes + (2 * part.base_unet_bytes if resident else 0)
    assert part.swap_bytes == 2 * per_pass and part.swap_seconds == pytest.approx(part.swap_bytes / planned.bus.bytes_per_s)
    assert any("swapped at the switch" in w for w in planned.warnings)
    assert session.plan(GenerationRequest(prompt="x", model="tiny-sdxl", width=64, height=64, refiner=refiner_path,
                                          refiner_switch_at=1), simulated("4")).refiner is None
    assert main(["plan", "--model", "tiny-sdxl", "--width", "64", "--height", "64", "--vram", "4GB", "--refiner",
                 refiner_path, "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)["refiner"]
    assert shown["name"] == refiner_path and shown["swap_bytes"] > 0


def test_the_cli_flags_reach_the_png(refiner_path, tmp_path, capsys):
    from lowvram_gen.cli.main import main

    args = ["generate", PROMPT, "--model", "tiny-sdxl", "--width", "64", "--height", "64", "--steps", "3", "--seed",
            "5", "--outdir", str(tmp_path), "--json", "--cpu", "--refiner", refiner_path, "--refiner-switch-at", "0.5"]
    assert main(args) == 0
    written, ours = read_png_metadata(json.loads(capsys.readouterr().out)["images"][0])
    assert parse_a1111_parameters(written)["Refiner switch at"] == "0.5"
    assert ours["request"]["refiner"] == refiner_path and ours["request"]["refiner_switch_at"] == 0.5
    assert main([*args[:-1], "1.5"]) == 2 and "refiner switch at" in capsys.readouterr().err


def test_under_a_streaming_preset_the_refiners_unet_streams_too(refiner_path, tmp_path, monkeypatch):
    """novram (one layer at a time) on a card too small for either UNet whole: the refiner's UNet is streamed block by
    block (diffusers' group offloading), never moved whole; the image is the reference's as on any preset."""
    seen = watch_switches(monkeypatch)
    sampler = own_sampler("tiny-sdxl")
    result = job(Session(device="cpu"), tmp_path, sampler, refiner=refiner_path, refiner_switch_at=0.6,
                 preset="novram")
    (record,) = seen
    assert ("refiner", "streamed") in record.moves and ("refiner", "on") not in record.moves
    assert record.moves.index(("base", "off")) < record.moves.index(("refiner", "streamed"))
    assert result.preset.startswith("novram")
