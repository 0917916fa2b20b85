"""Issue 32 item 6, A1111's Tiling (seamless textures: engines/sd/tiling.py) on the tiny SD 1.x and SDXL models: the
image equals plain diffusers with every Conv2d set circular by the test, the convolutions are back to zeros after the
job (an out-of-memory retry included), offloaded presets tile too, the VAE is never decoded tiled; and the fronts:
`--tiling`, the API's `tiling`, batch lines, `Tiling: True` in the PNG read back, the UI's checkbox; a transformer
family refused in one sentence."""

from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pytest
import torch
from PIL import Image

from a1111_png import rerun_with_no_unused_note  # tests/a1111_png.py
from family_folders import family_folders  # tests/family_folders.py
from folder_sampler import own_sampler  # tests/folder_sampler.py
from lowvram_gen import GenerationRequest
from lowvram_gen.a1111.api_body import map_body
from lowvram_gen.a1111.infotext import a1111_fields, request_fields
from lowvram_gen.batch.files import expand, read_entries, request_hash
from lowvram_gen.cli.main import main
from lowvram_gen.engines.sd import tiling
from lowvram_gen.engines.sd.stepdown import Runner
from lowvram_gen.errors import InvalidRequest
from lowvram_gen.hardware.device import probe
from lowvram_gen.models.loading import load
from lowvram_gen.models.resolve import resolve
from lowvram_gen.outputs import parse_a1111_parameters, read_png_metadata
from lowvram_gen.presets import gpu_ladder, load_presets
from lowvram_gen.session import Session

PROMPT, SEED, STEPS, CFG = "a brick wall", 7, 2, 6.0
folders = family_folders("tiling-models", keys=("z-image",))
_PLAIN: dict = {}


def pixels(path_or_image) -> np.ndarray:
    image = path_or_image if isinstance(path_or_image, Image.Image) else Image.open(path_or_image)
    return np.asarray(image.convert("RGB")).astype(int)


def plain(folder, circular: bool) -> np.ndarray:
    """Plain diffusers from the folder, every Conv2d of the pipeline set circular here (not by the app) when asked."""
    from diffusers import AutoPipelineForText2Image

    key = (str(folder), circular)
    if key not in _PLAIN:
        pipe = AutoPipelineForText2Image.from_pretrained(str(folder))
        convs = [m for c in pipe.components.values() if isinstance(c, torch.nn.Module) for m in c.modules()
                 if isinstance(m, torch.nn.Conv2d)]
        for conv in convs:
            conv.padding_mode = "circular" if circular else "zeros"
        image = pipe(PROMPT, width=64, height=64, num_inference_steps=STEPS, guidance_scale=CFG,
                     generator=torch.Generator().manual_seed(SEED)).images[0]
        _PLAIN[key] = pixels(image)
    return _PLAIN[key]


def convs_of(pipe) -> set[str]:
    return {conv.padding_mode for conv in tiling.convolutions(pipe)}


def made(session, tmp_path, model, **fields) -> np.ndarray:
    result = session.generate(GenerationRequest(prompt=PROMPT, width=64, height=64, steps=STEPS, cfg_scale=CFG,
                                                seed=SEED, model=model, sampler=own_sampler(model),
                                                outdir=str(tmp_path), **fields))
    return pixels(result.images[0])


@pytest.mark.parametrize("model,fixture", [("tiny", "tiny_path"), ("tiny-sdxl", "tiny_sdxl_path")])
def test_tiling_equals_plain_diffusers_with_circular_convs_and_a_later_plain_job_is_fresh(model, fixture, tmp_path,
                                                                                         request):
    folder = request.getfixturevalue(fixture)
    session = Session()
    tiled = made(session, tmp_path, model, tiling=True)
    pipe = session.model.pipe
    assert len(tiling.convolutions(pipe)) > 10 and convs_of(pipe) == {"zeros"}  # back after the job
    assert np.abs(tiled - plain(folder, True)).max() <= 2
    assert np.abs(tiled - plain(folder, False)).max() > 10  # tiling changes the image
    after = made(session, tmp_path, model)  # the same session: nothing of the tiling job is left
    assert np.array_equal(after, made(Session(), tmp_path, model))
    assert np.abs(after - plain(folder, False)).max() <= 2


def test_an_out_of_memory_retry_still_tiles_on_an_offloaded_preset_and_the_convs_come_back(tiny_path):
    """Simulated out-of-memory: the UNet's first call raises torch.OutOfMemoryError once; the ladder retries on the
    next preset (medvram: accelerate's model offload hooks, applied on the CPU), which must still tile."""
    model = load(resolve("tiny"), "float32")
    runner, seen, raised = Runner(model, probe("cpu")), [], []

    def hook(module, args):
        seen.append(module.conv_in.padding_mode)
        if not raised:
            raised.append(True)
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB (simulated)")

    handle = model.pipe.unet.register_forward_pre_hook(hook)
    done = []
    request = GenerationRequest(prompt=PROMPT, width=64, height=64, steps=STEPS, cfg_scale=CFG, tiling=True)
    try:
        report = runner.run(request, [SEED], gpu_ladder(load_presets()), done.append)
    finally:
        handle.remove()
    assert [a.outcome for a in report.attempts][:2] == ["oom", "ok"] and report.preset_name == "medvram"
    assert raised and set(seen) == {"circular"} and convs_of(model.pipe) == {"zeros"}
    assert np.abs(pixels(done[0].images[0]) - plain(tiny_path, True)).max() <= 2


def test_sequential_offload_tiles_and_the_vae_is_never_decoded_tiled(tiny_path):
    """novram: accelerate's sequential offload (weights moved per layer, the modules' attributes kept) with VAE tiling
    in its settings; a tiling job decodes untiled (diffusers' tiles would each wrap on themselves)."""
    model = load(resolve("tiny"), "float32")
    runner, tiled_decodes = Runner(model, probe("cpu")), []
    handle = model.pipe.vae.decoder.register_forward_pre_hook(lambda m, a: tiled_decodes.append(model.pipe.vae.use_tiling))
    novram = gpu_ladder(load_presets())[-1]
    assert novram.memory.offload == "sequential" and novram.memory.vae_tiling
    novram = replace(novram, memory=replace(novram.memory, fp8_storage=False))  # fp8 weights: 16/255 off untiled too
    done = []
    try:
        runner.run(GenerationRequest(prompt=PROMPT, width=64, height=64, steps=STEPS, cfg_scale=CFG, tiling=True),
                   [SEED], [novram], done.append)
    finally:
        handle.remove()
    assert tiled_decodes and not any(tiled_decodes) and convs_of(model.pipe) == {"zeros"}
    assert np.abs(pixels(done[0].images[0]) - plain(tiny_path, True)).max() <= 2
    assert tiling.untiled(novram.memory, False).vae_tiling  # a job without tiling keeps the preset's


def test_a_transformer_family_is_refused_in_one_sentence(folders, tmp_path):
    with pytest.raises(InvalidRequest) as refused:
        Session().generate(GenerationRequest(prompt="x", model=folders["z-image"], width=64, height=64,
                                             steps=1, tiling=True, outdir=str(tmp_path)))
    text = str(refused.value)
    assert "seamless tiling is not built for Z-Image" in text and "transformer" in text and "\n" not in text


def test_the_request_the_png_and_the_api_take_it(tmp_path):
    init = tmp_path / "in.png"
    Image.new("RGB", (64, 64)).save(init)
    assert GenerationRequest().validated().tiling is False
    assert GenerationRequest(tiling="true").validated().tiling is True
    with pytest.raises(InvalidRequest) as bad:
        GenerationRequest(tiling="sometimes").validated()
    assert "tiling" in str(bad.value) and "sometimes" in str(bad.value)
    assert "Tiling" not in a1111_fields(GenerationRequest(prompt="a").validated(), "Euler a", 5, "p", (64, 64))
    fields = a1111_fields(GenerationRequest(prompt="a", tiling=True, rng="nv").validated(), "Euler a", 5, "p", (64, 64))
    keys = list(fields)
    assert fields["Tiling"] is True and keys.index("RNG") < keys.index("Tiling")
    read = request_fields({"Steps": "20", "Tiling": "True"})
    assert read.fields["tiling"] is True and "Tiling" not in read.ignored
    for route in ("txt2img", "img2img"):
        body = {"prompt": "x", "tiling": True, **({"init_images": ["x.png"]} if route == "img2img" else {})}
        mapped = map_body(body, route, "tiny", 1, "out", lambda name: name, init_image=lambda image: str(init))
        assert mapped.request.tiling is True and not mapped.warnings
    assert map_body({"prompt": "x"}, "txt2img", "tiny", 1, "out", lambda name: name).request.tiling is False


def test_batch_lines_take_it_and_a_job_without_it_keeps_its_hash(tmp_path):
    path = tmp_path / "p.txt"
    path.write_text("--prompt a --tiling true\n--prompt b\n")
    jobs = expand(read_entries(path), {"width": "64", "height": "64", "steps": "1", "model": "tiny"})
    assert [j.request.tiling for j in jobs.jobs] == [True, False]
    assert request_hash("sd", GenerationRequest(prompt="a", seed=5, tiling=True).validated()) != \
        request_hash("sd", GenerationRequest(prompt="a", seed=5).validated())  # tests/test_batch.py: the old hash


def test_cli_flag_reaches_the_png_and_an_a1111_png_reruns_with_it(tmp_path, capsys):
    args = ["generate", "a fox", "--width", "64", "--height", "64", "--steps", "1", "--seed", "5", "--sampler",
            "Euler a", "--outdir", str(tmp_path), "--json", "--cpu"]
    assert main([*args, "--tiling"]) == 0
    made_png = json.loads(capsys.readouterr().out)["images"][0]
    written, ours = read_png_metadata(made_png)
    assert parse_a1111_parameters(written)["Tiling"] == "True" and ours["request"]["tiling"] is True
    text = "a fox\nSteps: 1, Sampler: Euler a, CFG scale: 7, Seed: 5, Size: 64x64, Model: tiny, Tiling: True"
    out = rerun_with_no_unused_note(text, (64, 64), tmp_path, capsys)
    assert read_png_metadata(out["images"][0])[1]["request"]["tiling"] is True


def test_the_ui_has_a_tiling_checkbox_in_txt2img_and_img2img_that_reaches_the_request(tmp_path, monkeypatch):
    """Without a browser: the Tiling checkbox of each tab starts off, and its value is the request's `tiling`."""
    from lowvram_gen.ui.app import UiOptions, build_app
    from lowvram_gen.ui.context import TabContext

    asked = []
    monkeypatch.setattr(TabContext, "run_job", lambda self, tab, fields, *a, **k: iter([asked.append(fields)]))
    app = build_app(Session(outdir=str(tmp_path)), UiOptions(outdir=str(tmp_path), model="tiny"))
    boxes = {b.elem_id: b for b in app.blocks.values() if getattr(b, "elem_id", None) in ("tiling", "i2i-tiling")}
    assert set(boxes) == {"tiling", "i2i-tiling"} and all(b.value is False and b.label == "Tiling"
                                                             for b in boxes.values())
    for api_name, given in (("generate", {}), ("img2img", {"init_image": "init.png"})):
        event = next(d for d in app.fns.values() if d.api_name == api_name)
        assert any(b is boxes["tiling" if api_name == "generate" else "i2i-tiling"] for b in event.inputs)
        list(event.fn(prompt="x", tiling=True, **given))
    assert [f["tiling"] for f in asked] == [True, True]


def test_the_plan_of_a_tiling_job_counts_its_vae_decode_untiled():
    """At 1024x1024 on a 4 GiB card a tiled decode's activations are a tile's; the plan of a tiling job counts the
    whole decode it runs (no preset of its ladder tiles the VAE), so a preset that tiles is estimated higher."""
    from lowvram_gen.hardware.device import simulated

    session, device = Session(), simulated("4")
    request = GenerationRequest(prompt="x", model="tiny", width=1024, height=1024, steps=2)
    plain_plan, tiled_plan = session.plan(request, device), session.plan(replace(request, tiling=True), device)
    assert any(p.memory.vae_tiling for p in plain_plan.ladder)
    assert not any(p.memory.vae_tiling for p in tiled_plan.ladder)
    tiles = {p.name for p in session.presets().values() if p.memory.vae_tiling}
    plain_bytes = {e.name: e.estimate_bytes for e in plain_plan.estimates if e.name in tiles}
    tiled_bytes = {e.name: e.estimate_bytes for e in tiled_plan.estimates if e.name in plain_bytes}
    # (a preset whose peak is elsewhere, novram's streamed layers, may stay the same)
    assert all(tiled_bytes[n] >= plain_bytes[n] for n in tiled_bytes), (plain_bytes, tiled_bytes)
    assert any(tiled_bytes[n] > plain_bytes[n] for n in tiled_bytes), (plain_bytes, tiled_bytes)


def test_png_info_sends_tiling_to_the_txt2img_and_img2img_checkbox(tmp_path):
    from PIL.PngImagePlugin import PngInfo

    from lowvram_gen.ui import sendto

    for text, want in (("Tiling: True, ", True), ("", False)):
        info = PngInfo()
        info.add_text("parameters", f"a fox\nSteps: 1, Sampler: Euler a, CFG scale: 7, Seed: 5, Size: 64x64, {text}"
                                    "Model: tiny")
        png = tmp_path / f"made-{want}.png"
        Image.new("RGB", (64, 64)).save(png, pnginfo=info)
        for keys in (sendto.TXT2IMG, sendto.IMG2IMG):
            values, said = sendto.values_for(keys, str(png))
            assert dict(zip(keys, values))["tiling"] is want and not any("Tiling" in s for s in said)
