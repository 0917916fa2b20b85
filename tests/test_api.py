"""A1111's REST API (`lowvram-gen ui --api`) driven by a real A1111 client, the `webuiapi` package, and by plain
HTTP where webuiapi has no call (the error bodies, unknown fields).

The server runs in-process on a free port with the embedded tiny model, as the web UI tests' does (tests/servers.py;
the fixtures are tests/api_helpers.py's). A job made slow waits in its step hook on the job's own cancel event
(bounded), so an interrupt arrives while it runs: no sleep decides an outcome.
"""

from __future__ import annotations

import base64
import io
import json
import threading

import pytest
import requests

from lowvram_gen.outputs import read_png_metadata
from lowvram_gen.session import Session
from api_helpers import _post, api, server  # noqa: F401 (api, server: fixtures)
from servers import Server, _free_port

webuiapi = pytest.importorskip("webuiapi", reason="the test extra's webuiapi is not installed: pip install -e .[test]")


class Slow:
    """What the `slow_jobs` fixture saw: `blocked` is set each time a "slow" job waits at a step (its second: the
    first step's live preview is made by then), `waits` counts those waits, `seen` lists every step."""

    def __init__(self):
        self.blocked, self.seen, self.waits = threading.Event(), [], 0


@pytest.fixture()
def slow_jobs(server):
    """Jobs whose prompt is "slow" wait at each step from the second on until they are interrupted or skipped (90 s
    at most each), so a call to /interrupt or /skip arrives while they run."""
    real = server.session.generate
    slow = Slow()

    def watched(request, on_step=None, cancel=None, **kw):
        skip = kw.get("skip")

        def step(i, total):
            slow.seen.append(i)
            on_step(i, total)
            if request.prompt == "slow" and i >= 2:
                slow.waits += 1
                slow.blocked.set()
                for _ in range(900):  # bounded: a test that never stops the job still ends
                    if cancel.is_set() or (skip is not None and skip.is_set()):
                        break
                    cancel.wait(0.1)
        return real(request, on_step=step, cancel=cancel, **kw)

    server.session.generate = watched
    yield slow
    server.session.generate = real


def _in_thread(call):
    """Run `call` in a thread; (thread, box): box["result"] or box["error"] once it ends."""
    box = {}

    def run():
        try:
            box["result"] = call()
        except Exception as exc:  # noqa: BLE001 - the test reads it
            box["error"] = exc
    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, box


# -- the done-when ------------------------------------------------------------------------------------


def test_webuiapi_txt2img_returns_the_saved_image_and_info_with_the_seed(server, api):
    result = api.txt2img(prompt="a lighthouse", seed=1234, steps=2, width=64, height=72)
    assert len(result.images) == 1 and result.image.size == (64, 72)
    info = result.info  # webuiapi parses A1111's info string
    assert info["seed"] == 1234 and info["all_seeds"] == [1234]
    assert info["prompt"] == "a lighthouse" and info["steps"] == 2 and info["sd_model_name"] == "tiny"
    saved = sorted(server.outdir.rglob("*-1234-a-lighthouse.png"))
    assert len(saved) == 1  # saved in the output folder, as the UI saves
    text, ours = read_png_metadata(saved[0])
    assert info["infotexts"] == [text] and "Seed: 1234" in text
    assert result.image.info["parameters"] == text  # the answer's PNG carries its parameters, as A1111's
    assert result.parameters["prompt"] == "a lighthouse" and result.parameters["steps"] == 2
    assert result.parameters["cfg_scale"] == 7.0  # A1111's defaults filled in, as it echoes them
    assert ours["request"]["extra"] == {"api": "txt2img"}


def test_webuiapi_img2img_from_a_data_url_and_from_raw_base64(server, api):
    init = api.txt2img(prompt="init", seed=5, steps=2, width=64, height=64).image
    result = api.img2img(images=[init], prompt="a harbour", seed=6, steps=2, width=64, height=64,
                         denoising_strength=0.6)  # webuiapi sends a data: URL
    assert result.image.size == (64, 64) and result.info["seed"] == 6
    assert result.info["denoising_strength"] == 0.6 and "Denoising strength: 0.6" in result.info["infotexts"][0]
    assert result.parameters["init_images"] is None  # include_init_images false, as A1111 echoes it
    buffer = io.BytesIO()
    init.save(buffer, format="JPEG")
    raw = _post(server, "img2img", {"init_images": [base64.b64encode(buffer.getvalue()).decode()], "prompt": "b",
                                    "seed": 7, "steps": 2, "width": 64, "height": 64})
    assert raw.status_code == 200 and json.loads(raw.json()["info"])["seed"] == 7


def test_webuiapi_inpaints_with_a_mask_and_a1111s_inpaint_fields(server, api):
    """img2img with a mask (issue 20): A1111's mask, mask_blur, inpainting_fill, inpaint_full_res and its padding,
    inpainting_mask_invert become the request's inpaint fields; outside the mask the init image stays."""
    import numpy as np
    from PIL import Image

    init = api.txt2img(prompt="init", seed=5, steps=2, width=64, height=64).image
    mask = Image.new("L", (64, 64))
    mask.paste(255, (16, 16, 48, 40))
    result = api.img2img(images=[init], mask_image=mask, prompt="a boat", seed=6, steps=2, width=64, height=64,
                         denoising_strength=1.0, mask_blur=0, inpainting_fill=1, inpaint_full_res=False)
    out, before = np.asarray(result.image.convert("RGB")).astype(int), np.asarray(init.convert("RGB")).astype(int)
    inside = np.asarray(mask) > 0
    assert np.array_equal(out[~inside], before[~inside]) and np.abs(out[inside] - before[inside]).mean() > 10
    text = result.info["infotexts"][0]
    assert "Denoising strength: 1" in text and "Inpaint area" not in text and "Masked content" not in text
    masked = api.img2img(images=[init], mask_image=mask, prompt="a boat", seed=6, steps=2, width=64, height=64,
                         mask_blur=2, inpainting_fill=2, inpaint_full_res=True, inpaint_full_res_padding=8,
                         inpainting_mask_invert=1)
    for field in ("Mask blur: 2", "Mask mode: Inpaint not masked", "Inpaint area: Only masked",
                  "Masked area padding: 8", "Masked content: latent noise"):
        assert field in masked.info["infotexts"][0]
    black = Image.new("L", (64, 64))
    refused = _post(server, "img2img", {"init_images": [_b64(init)], "mask": _b64(black), "prompt": "x"})
    assert refused.status_code == 422 and refused.json()["detail"][0]["loc"] == ["body", "mask"]
    assert "nothing to repaint" in refused.json()["detail"][0]["msg"]


def _b64(image) -> str:
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    return base64.b64encode(buffer.getvalue()).decode()


def test_interrupt_stops_the_running_api_job_and_progress_follows_it(server, api, slow_jobs):
    thread, box = _in_thread(lambda: api.txt2img(prompt="slow", seed=3, steps=20, width=64, height=64, n_iter=2))
    assert slow_jobs.blocked.wait(120)
    progress = api.get_progress()
    assert progress["state"]["job_count"] == 1 and progress["state"]["sampling_step"] == 2
    assert progress["textinfo"].startswith("Step 2/20 · batch 1/2")  # the web UI's one progress line
    assert progress["state"]["sampling_steps"] == 20 and progress["progress"] == pytest.approx(0.1)
    assert progress["state"]["interrupted"] is False and progress["eta_relative"] > 0
    assert api.interrupt() == {}
    thread.join(120)
    result = box["result"]
    assert max(slow_jobs.seen) < 20  # stopped where the interrupt arrived
    assert len(result.images) == 1 and result.info["all_seeds"] == [3]  # the interrupted image, kept as A1111's
    assert any(w.startswith("interrupted") for w in result.info["warnings"])
    idle = api.get_progress()
    assert idle["progress"] == 0 and idle["state"]["job_count"] == 0  # what webuiapi's util_wait_for_ready reads
    again = api.txt2img(prompt="the next one", seed=4, steps=2, width=64, height=64)
    assert again.info["seed"] == 4


def test_a_client_that_hangs_up_stops_its_job_at_the_next_step_and_what_it_made_is_kept(server, api, slow_jobs):
    """FAULTS 21, issue 29 item 3: a client that closes its connection while its job runs stops the job at the next
    step, as /interrupt does (before, a 150-step job ran on for minutes and the jobs behind it waited). Its image so
    far is saved, and the next job runs."""
    import socket
    import time

    body = json.dumps({"prompt": "slow", "seed": 77, "steps": 20, "width": 64, "height": 64}).encode()
    client = socket.create_connection(("127.0.0.1", server.port), timeout=30)
    client.sendall(b"POST /sdapi/v1/txt2img HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                   b"Content-Length: %d\r\n\r\n" % len(body) + body)
    assert slow_jobs.blocked.wait(120)
    client.close()  # the client hangs up while its job waits at step 2
    for _ in range(600):  # bounded: the fixture's step waits 90 s before it goes on by itself
        if api.get_progress()["state"]["job_count"] == 0:
            break
        time.sleep(0.1)
    assert api.get_progress()["state"]["job_count"] == 0
    assert slow_jobs.waits == 1 and max(slow_jobs.seen) < 20  # stopped where the hang-up arrived
    assert sorted(server.outdir.rglob("*-77-slow.png"))  # the interrupted image is saved, as an interrupt keeps it
    again = api.txt2img(prompt="the next one", seed=78, steps=2, width=64, height=64)
    assert again.info["seed"] == 78


def test_interrupt_and_progress_reach_a_job_of_the_web_ui(server, api, slow_jobs):
    """The UI and the API register their jobs in one registry: A1111's global /interrupt stops a UI job."""
    from gradio_client import Client

    job = Client(server.url, verbose=False).submit(prompt="slow", width=64, height=64, steps=20, api_name="/generate")
    assert slow_jobs.blocked.wait(120)
    assert api.get_progress()["state"]["sampling_step"] == 2
    api.interrupt()
    images, info, summary, seed = job.result(timeout=120)
    assert summary.startswith("cancelled at step 2 of 20")


def test_skip_ends_the_running_batch_and_the_job_goes_on_with_the_next(server, api, slow_jobs):
    thread, box = _in_thread(lambda: api.txt2img(prompt="slow", seed=30, steps=20, width=64, height=64, n_iter=2))
    assert slow_jobs.blocked.wait(120)
    slow_jobs.blocked.clear()
    assert api.session.post(f"{server.api_url}/skip").status_code == 200
    assert slow_jobs.blocked.wait(120) and slow_jobs.waits >= 2  # the second batch runs: skip did not end the job
    api.interrupt()
    thread.join(120)
    result = box["result"]
    assert result.info["all_seeds"] == [30, 31] and len(result.images) == 2  # the skipped batch and the interrupted
    assert any(w.startswith("interrupted") for w in result.info["warnings"])


def test_progress_shows_the_live_preview_every_n_steps(server, api, slow_jobs):
    api.set_options({"show_progress_every_n_steps": 1})
    try:
        assert api.get_options()["show_progress_every_n_steps"] == 1
        thread, box = _in_thread(lambda: api.txt2img(prompt="slow", seed=5, steps=20, width=64, height=64))
        assert slow_jobs.blocked.wait(120)
        shown = api.get_progress()["current_image"]
        from PIL import Image

        assert Image.open(io.BytesIO(base64.b64decode(shown))).size == (64, 64)
        skipped = requests.get(f"{server.api_url}/progress", params={"skip_current_image": "true"}, timeout=30)
        assert skipped.json()["current_image"] is None and skipped.json()["state"]["sampling_step"] == 2
        api.interrupt()
        thread.join(120)
        assert "result" in box
    finally:
        api.set_options({"show_progress_every_n_steps": 10})


def test_n_iter_is_the_batch_count(server, api):
    result = api.txt2img(prompt="two batches", seed=20, steps=1, width=64, height=64, n_iter=2)
    assert len(result.images) == 2 and result.info["all_seeds"] == [20, 21]
    too_many = _post(server, "txt2img", {"prompt": "x", "n_iter": 101}).json()["detail"][0]
    assert too_many["loc"] == ["body", "n_iter"] and "invalid n_iter: 101" in too_many["msg"]


def test_get_sd_models_and_util_set_model_pick_the_model_of_later_jobs(server, api, tmp_path, monkeypatch):
    monkeypatch.setenv("LOWVRAM_GEN_MODELS", str(tmp_path))
    assert "tiny" in api.util_get_model_names() and "tiny-sdxl" in api.util_get_model_names()
    assert api.get_options()["sd_model_checkpoint"] == "tiny"
    (tmp_path / "dreamshaper_8.safetensors").write_bytes(b"not loaded by a listing")
    api.refresh_checkpoints()
    entry = next(m for m in api.get_sd_models() if m["title"] == "dreamshaper_8.safetensors")
    assert entry["model_name"] == "dreamshaper_8" and entry["filename"] == str(tmp_path / "dreamshaper_8.safetensors")
    api.util_set_model("dreamshaper")  # webuiapi picks the closest title and posts it to /options
    assert api.util_get_current_model() == "dreamshaper_8.safetensors"
    api.util_set_model("tiny-sdxl")
    assert api.get_options()["sd_model_checkpoint"] == "tiny-sdxl"
    try:
        result = api.txt2img(prompt="on sdxl", seed=8, steps=1, width=64, height=64)
        assert result.info["sd_model_name"] == "tiny-sdxl" and "Model: tiny-sdxl" in result.info["infotexts"][0]
    finally:
        api.util_set_model("tiny")
    assert api.get_options()["sd_model_checkpoint"] == "tiny"


def test_an_unknown_model_is_refused_with_a1111s_error_body_and_changes_nothing(server, api):
    answer = _post(server, "options", {"sd_model_checkpoint": "no-such-model.safetensors"})
    assert answer.status_code == 422
    body = answer.json()
    assert set(body) == {"error", "detail", "body", "errors"} and "no-such-model.safetensors" in body["detail"]
    assert api.get_options()["sd_model_checkpoint"] == "tiny"


def test_override_settings_set_model_and_clip_skip_for_one_job_or_keep_them(server, api):
    result = api.txt2img(prompt="skip", seed=9, steps=1, width=64, height=64,
                         override_settings={"CLIP_stop_at_last_layers": 2, "sd_model_checkpoint": "tiny",
                                            "sd_vae": "Automatic"})
    assert "Clip skip: 2" in result.info["infotexts"][0] and result.info["clip_skip"] == 2
    assert not any("sd_vae" in w for w in result.info["warnings"]) and result.info["sd_vae_name"] is None  # its own
    assert api.get_options()["CLIP_stop_at_last_layers"] == 1  # restored afterwards, as A1111's default
    try:
        api.txt2img(prompt="keep", seed=9, steps=1, width=64, height=64,
                    override_settings={"CLIP_stop_at_last_layers": 2}, override_settings_restore_afterwards=False)
        assert api.get_options()["CLIP_stop_at_last_layers"] == 2
        assert "Clip skip: 2" in api.txt2img(prompt="later", seed=9, steps=1, width=64, height=64).info["infotexts"][0]
    finally:
        api.set_options({"CLIP_stop_at_last_layers": 1})


def test_sampler_scheduler_and_hires_fix_map_to_the_request(server, api):
    result = api.txt2img(prompt="hires", seed=10, steps=2, width=64, height=64, sampler_name="DPM++ 2M",
                         scheduler="karras", enable_hr=True, hr_scale=2, hr_upscaler="Latent", hr_second_pass_steps=1,
                         denoising_strength=0.5)
    text = result.info["infotexts"][0]
    assert result.image.size == (128, 128)
    assert "Sampler: DPM++ 2M, Schedule type: Karras" in text
    assert "Denoising strength: 0.5" in text and "Hires upscale: 2" in text and "Hires steps: 1" in text
    combined = api.txt2img(prompt="old name", seed=10, steps=2, width=64, height=64, sampler_name="DPM++ 2M Karras")
    assert "Sampler: DPM++ 2M, Schedule type: Karras" in combined.info["infotexts"][0]


def test_hires_fix_takes_a1111s_resize_second_pass_sampler_cfg_and_prompt(server, api):
    result = api.txt2img(prompt="a castle", seed=15, steps=2, width=64, height=64, enable_hr=True,
                         hr_resize_x=96, hr_resize_y=0, hr_upscaler="Latent (bicubic)", hr_second_pass_steps=1,
                         hr_sampler_name="Euler", hr_scheduler="Use same scheduler", hr_prompt="a castle, detailed",
                         hr_negative_prompt="", denoising_strength=0.4)
    result_cfg = _post(server, "txt2img", {"prompt": "a castle", "seed": 15, "steps": 2, "width": 64, "height": 64,
                                           "enable_hr": True, "hr_scale": 2, "hr_cfg": 5})
    text = result.info["infotexts"][0]
    assert result.image.size == (96, 96) and "Hires resize: 96x0" in text
    assert "Hires upscaler: Latent (bicubic)" in text and "Hires sampler: Euler" in text
    assert 'Hires prompt: "a castle, detailed"' in text
    assert all("hr_" not in w for w in result.info["warnings"])
    assert "Hires CFG Scale: 5" in json.loads(result_cfg.json()["info"])["infotexts"][0]
    same_size = api.txt2img(prompt="x1", seed=15, steps=1, width=64, height=64, enable_hr=True, hr_scale=1)
    assert same_size.image.size == (64, 64) and "Hires" not in same_size.info["infotexts"][0]
    assert any(w.startswith("enable_hr with hr_scale 1") for w in same_size.info["warnings"])
    bad = _post(server, "txt2img", {"prompt": "x", "enable_hr": True, "hr_resize_x": 100}).json()["detail"][0]
    assert bad["loc"] == ["body", "hr_resize_x"] and "try 96 or 104" in bad["msg"]
    sampler = _post(server, "txt2img", {"prompt": "x", "enable_hr": True, "hr_sampler_name": "Nope"}).json()
    assert sampler["detail"][0]["loc"] == ["body", "hr_sampler_name"]


def test_a_bad_value_is_422_in_fastapis_validation_shape_with_our_message(server):
    answer = _post(server, "txt2img", {"prompt": "x", "cfg_scale": 31})
    assert answer.status_code == 422
    (detail,) = answer.json()["detail"]
    assert detail["loc"] == ["body", "cfg_scale"] and detail["input"] == 31
    assert detail["msg"] == "invalid cfg_scale: 31; a number from 0 to 30"
    width = _post(server, "txt2img", {"prompt": "x", "width": 60}).json()["detail"][0]  # below 64 once rounded
    assert width["loc"] == ["body", "width"] and "from 64 to 4096" in width["msg"]
    scheduler = _post(server, "txt2img", {"prompt": "x", "scheduler": "wobbly"}).json()["detail"][0]
    assert scheduler["loc"] == ["body", "scheduler"] and "karras" in scheduler["msg"]
    clip = _post(server, "txt2img", {"prompt": "x", "override_settings": {"CLIP_stop_at_last_layers": 40}})
    assert clip.json()["detail"][0]["loc"] == ["body", "override_settings", "CLIP_stop_at_last_layers"]
    lora = _post(server, "txt2img", {"prompt": "x <lora:a:1.2.3>", "steps": 1})  # a malformed tag: still refused
    assert lora.status_code == 422 and "invalid LoRA weight: '1.2.3'" in lora.json()["detail"][0]["msg"]
    with pytest.raises(RuntimeError) as refused:  # what a webuiapi user sees
        webuiapi.WebUIApi(port=server.port).txt2img(prompt="x", steps=0)
    assert refused.value.args[0] == 422 and "invalid steps: 0" in refused.value.args[1]


def test_what_would_change_the_image_is_refused_by_name(server):
    mask = _post(server, "img2img", {"init_images": ["AAAA"], "latent_mask": "AAAA", "prompt": "x"})
    assert mask.status_code == 422 and "latent mask apart from the mask" in mask.json()["detail"][0]["msg"]
    script = _post(server, "txt2img", {"prompt": "x", "script_name": "prompt matrix"}).json()["detail"][0]
    assert script["loc"] == ["body", "script_name"]  # x/y/z plot runs (tests/test_xyz_api.py); no other script
    other = _post(server, "txt2img", {"prompt": "x", "alwayson_scripts": {"ADetailer": {"args": []}}})
    assert other.status_code == 422 and "'ADetailer'" in other.json()["detail"][0]["msg"]  # ControlNet's: its test
    bad = _post(server, "img2img", {"init_images": ["not base64!"], "prompt": "x"}).json()["detail"][0]
    assert bad["loc"] == ["body", "init_images"] and "not base64" in bad["msg"]


def test_unknown_and_unused_fields_are_named_in_infos_warnings(server):
    answer = _post(server, "txt2img", {"prompt": "x", "seed": 11, "steps": 1, "width": 64, "height": 64,
                                       "frobnicate": 1, "restore_faces": True,
                                       "eta": 1.0, "s_noise": 1, "send_images": False})
    assert answer.status_code == 200 and answer.json()["images"] == []  # send_images false, as A1111
    info = json.loads(answer.json()["info"])
    assert info["seed"] == 11
    warned = " | ".join(info["warnings"])
    assert "unknown field 'frobnicate' ignored" in warned
    assert "restore_faces True is not used" in warned  # styles are used now: tests/test_styles.py
    assert "eta" not in warned and "s_noise" not in warned  # their neutral values, as webuiapi sends them


def test_a_side_that_is_no_multiple_of_8_runs_at_a1111s_latent_size_and_info_says_so(server, api):
    # A1111 makes the latent width // 8 x height // 8: a 100x70 body makes a 96x64 image there, and here
    result = api.txt2img(prompt="a dune", seed=3, steps=1, width=100, height=70)
    assert result.image.size == (96, 64)
    assert result.info["width"] == 96 and result.info["height"] == 64 and "Size: 96x64" in result.info["infotexts"][0]
    warned = " | ".join(result.info["warnings"])
    assert "width 100 is not a multiple of 8: ran at 96, as A1111's latent does" in warned
    assert "height 70 is not a multiple of 8: ran at 64" in warned
    assert result.parameters["width"] == 100  # the body echoed as it came, as A1111 echoes it
    init = api.txt2img(prompt="init", seed=5, steps=1, width=64, height=64).image
    again = api.img2img(images=[init], prompt="x", seed=6, steps=1, width=73, height=64, denoising_strength=0.5)
    assert again.image.size == (72, 64) and "width 73 is not a multiple of 8: ran at 72" in again.info["warnings"][0]


def test_an_unknown_lora_tag_is_left_out_with_a_warning_and_the_job_runs(server, api):
    # A1111 runs a prompt whose <lora:NAME> it cannot find ("Networks not found"): scripts written for it count on it
    result = api.txt2img(prompt="a cat <lora:nosuch:0.8>, sky", seed=9, steps=1, width=64, height=64)
    assert len(result.images) == 1
    assert result.info["prompt"] == "a cat, sky" and "nosuch" not in result.info["infotexts"][0]
    warned = " | ".join(result.info["warnings"])
    assert "LoRA 'nosuch' of the prompt not found: its tag was left out and the job ran without it" in warned
    hires = api.txt2img(prompt="a cat <lora:nosuch>", seed=9, steps=1, width=64, height=64, enable_hr=True,
                        hr_scale=1.5, hr_prompt="a dog <lora:nosuch>", hr_second_pass_steps=1)
    assert len(hires.images) == 1 and "LoRA 'nosuch' of the hr_prompt not found" in " | ".join(hires.info["warnings"])
    path = _post(server, "txt2img", {"prompt": "x <lora:../nosuch.safetensors:1>", "steps": 1})  # names, not paths
    assert path.status_code == 422 and "GET /sdapi/v1/loras" in path.json()["detail"][0]["msg"]


def test_listings_in_a1111s_shapes(server, api, tmp_path, monkeypatch):
    import torch
    from safetensors.torch import save_file

    (tmp_path / "Lora").mkdir()
    save_file({"w": torch.zeros(1)}, str(tmp_path / "Lora" / "add_detail.safetensors"),
              metadata={"ss_output_name": "add_detail"})
    (tmp_path / "embeddings").mkdir()
    save_file({"emb_params": torch.zeros(3, 32)}, str(tmp_path / "embeddings" / "easyneg.safetensors"))
    (tmp_path / "embeddings" / "broken.pt").write_bytes(b"not a pickle")
    monkeypatch.setenv("LOWVRAM_GEN_MODELS", str(tmp_path))
    samplers = {s["name"]: s for s in api.get_samplers()}
    assert {"Euler a", "Euler", "DPM++ 2M", "default"} <= set(samplers) and samplers["Euler"]["aliases"] == []
    schedulers = {s["name"]: s for s in api.get_schedulers()}
    assert schedulers["karras"]["label"] == "Karras" and schedulers["sgm_uniform"]["label"] == "SGM Uniform"
    assert set(schedulers["automatic"]) == {"name", "label", "aliases", "default_rho", "need_inner_model"}
    assert api.get_loras() == [{"name": "add_detail", "alias": "add_detail",
                                "path": str(tmp_path / "Lora" / "add_detail.safetensors"),
                                "metadata": {"ss_output_name": "add_detail"}}]
    embeddings = api.get_embeddings()
    assert embeddings["loaded"]["easyneg"]["shape"] == 32 and embeddings["loaded"]["easyneg"]["vectors"] == 3
    assert list(embeddings["skipped"]) == ["broken"]
    upscalers = [u["name"] for u in api.get_upscalers()]
    assert upscalers[:2] == ["Lanczos", "Nearest"] and "Latent" not in upscalers
    assert set(api.get_upscalers()[0]) == {"name", "model_name", "model_path", "model_url", "scale"}
    modes = [m["name"] for m in api.get_latent_upscale_modes()]
    assert modes[0] == "Latent" and "Latent (bicubic)" in modes
    assert api.get_scripts() == {"txt2img": ["x/y/z plot"], "img2img": ["x/y/z plot", "loopback", "sd upscale"]}
    options = api.get_options()
    assert options["outdir_samples"] == str(server.outdir) and options["samples_save"] is True


def test_png_info_reads_our_parameters_in_a1111s_shape(server, api):
    image = api.txt2img(prompt="a (red:1.2) fox", negative_prompt="blur", seed=12, steps=1, width=64,
                        height=64).image
    result = api.png_info(image)
    assert result.info.startswith("a (red:1.2) fox\nNegative prompt: blur\nSteps: 1")
    answer = result.json
    assert answer["parameters"]["Prompt"] == "a (red:1.2) fox" and answer["parameters"]["Seed"] == "12"
    assert answer["parameters"]["Size-1"] == "64" and answer["parameters"]["Negative prompt"] == "blur"
    assert json.loads(answer["items"]["lowvram_gen"])["seed"] == 12
    plain = io.BytesIO()
    image.convert("RGB").save(plain, format="PNG")  # no text chunks
    empty = _post(server, "png-info", {"image": base64.b64encode(plain.getvalue()).decode()}).json()
    assert empty == {"info": "", "items": {}, "parameters": {}}
    not_an_image = _post(server, "png-info", {"image": base64.b64encode(b"hello").decode()})
    assert not_an_image.status_code == 422 and not_an_image.json()["detail"][0]["loc"] == ["body", "image"]


# -- auth and serving -----------------------------------------------------------------------------------------


def test_api_auth_refuses_anonymous_calls_and_accepts_its_users(tmp_path):
    srv = Server(tmp_path, api=True, api_auth="alice:wonderland,bob:builder")
    try:
        anonymous = requests.get(f"{srv.api_url}/sd-models", timeout=30)
        assert anonymous.status_code == 401 and anonymous.headers["www-authenticate"] == "Basic"
        assert anonymous.json() == {"error": "HTTPException", "detail": "Incorrect username or password", "body": "",
                                    "errors": "401: Incorrect username or password"}
        assert requests.post(f"{srv.api_url}/txt2img", json={"prompt": "x"}, auth=("alice", "wrong"),
                             timeout=30).status_code == 401
        api = srv.client()
        api.set_auth("bob", "builder")  # webuiapi's HTTP Basic auth
        assert api.txt2img(prompt="with a password", seed=13, steps=1, width=64, height=64).info["seed"] == 13
        assert requests.get(srv.url, timeout=30).status_code == 200  # the UI has no --gradio-auth here
    finally:
        srv.close()


def test_gradio_auth_alone_closes_the_api_too(tmp_path):
    srv = Server(tmp_path, api=True, auth="carol:secret")
    try:
        assert requests.get(f"{srv.api_url}/options", timeout=30).status_code == 401
        assert requests.post(f"{srv.api_url}/interrupt", timeout=30).status_code == 401
        assert srv.client("carol", "secret").get_options()["sd_model_checkpoint"] == "tiny"
    finally:
        srv.close()


def test_listen_without_auth_warns_about_the_api_too():
    from lowvram_gen.server import exposure_warning

    both = exposure_warning(True, False, None, api=True)
    assert "the web UI and the A1111 API (/sdapi/v1) of lowvram-gen are reachable" in both and "--api-auth" in both
    api_open = exposure_warning(True, False, None, api=True, webui=False)
    assert "the A1111 API" in api_open and "--gradio-auth" not in api_open
    assert exposure_warning(True, False, [("a", "b")], api=True, api_auth=[("a", "b")]) is None
    assert exposure_warning(True, False, None, api=True, api_auth=[("a", "b")], webui=False) is None
    assert exposure_warning(False, False, None, api=True) is None


def test_share_needs_the_web_ui(tmp_path):
    from lowvram_gen.errors import InvalidRequest
    from lowvram_gen.server import launch

    with pytest.raises(InvalidRequest, match="a gradio.live link needs the web UI"):
        launch(Session(outdir=str(tmp_path)), str(tmp_path), "tiny", share=True, webui=False, block=False)


def test_nowebui_serves_the_api_alone_with_a_queue_limit_and_a_request_log(tmp_path, capsys):
    srv = Server(tmp_path, api=True, webui=False, queue_size=1, api_log=True)
    held, release = threading.Event(), threading.Event()
    real = srv.session.generate

    def holding(request, **kw):
        held.set()
        release.wait(90)
        return real(request, **kw)

    srv.session.generate = holding
    try:
        assert requests.get(srv.url, timeout=30).status_code == 404  # no web UI
        thread, box = _in_thread(lambda: srv.client().txt2img(prompt="first", seed=14, steps=1, width=64, height=64))
        assert held.wait(60)
        full = _post(srv, "txt2img", {"prompt": "second", "steps": 1, "width": 64, "height": 64})
        assert full.status_code == 503 and "queue is full" in full.json()["detail"]
        release.set()
        thread.join(120)
        assert box["result"].info["seed"] == 14
        assert "API POST /sdapi/v1/txt2img 503 127.0.0.1" in capsys.readouterr().err
    finally:
        release.set()
        srv.session.generate = real
        srv.close()


def test_a_bad_api_auth_is_a_clear_error_before_the_server_starts(capsys, tmp_path):
    from lowvram_gen.cli.main import main

    assert main(["ui", "--api", "--api-auth", "nocolon", "--port", str(_free_port()), "--outdir", str(tmp_path)]) == 2
    assert "invalid --api-auth: '<hidden>'; use user:password" in capsys.readouterr().err


def test_the_ui_command_passes_the_api_flags_and_nowebui_takes_a1111s_port(monkeypatch, tmp_path):
    from lowvram_gen.cli.main import main
    from lowvram_gen import server as launch_module

    launched = []
    monkeypatch.setattr(launch_module, "check_port", lambda port, host: int(port))
    monkeypatch.setattr(launch_module, "launch", lambda session, outdir, model, **kw: launched.append(kw))
    assert main(["ui", "--nowebui", "--api-auth", "a:b", "--api-log", "--outdir", str(tmp_path)]) == 0
    assert main(["ui", "--api", "--outdir", str(tmp_path)]) == 0
    nowebui, api = launched
    assert nowebui["port"] == 7861 and nowebui["webui"] is False and nowebui["api_auth"] == "a:b"
    assert nowebui["api_log"] is True
    assert api["port"] == 7860 and api["webui"] is True and api["api"] is True
