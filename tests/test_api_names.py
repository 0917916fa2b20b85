"""A1111's REST API takes names, not server paths (issue 29 item 2, FAULTS 34): the hires upscaler, a ControlNet
unit's model, the checkpoint of override_settings and a prompt's <lora:...> are the names the listing routes give,
from the model folders. A path (an existing file outside the folders, a missing one, a PNG, a `../` trick) gets one
422, the same for each: it names the field and the listing route, and never says whether or what the file is. With
`--api-allow-paths DIR` a path inside DIR works and one outside it is still refused.

Through real HTTP against the server of tests/servers.py (the API alone, in this process), so $LOWVRAM_GEN_MODELS
set here is the folder it scans.
"""

from __future__ import annotations

import base64
import io
import os
import shutil

import pytest
import requests
from PIL import Image

import controlnet_files as cn_files  # tests/controlnet_files.py
from servers import Server

SIDE = 64


@pytest.fixture(scope="module")
def disk(tmp_path_factory, tiny_path):
    """models/ (ESRGAN/tiny-x2.pth, ControlNet/tiny-cn, Lora/ empty), `outside/` (a file that is no model, a PNG, a
    symlink target) and `allowed/` (a ControlNet file and an ESRGAN file for --api-allow-paths, and a symlink out)."""
    import torch
    from diffusers import UNet2DConditionModel
    from spandrel.architectures.ESRGAN import ESRGAN

    root = tmp_path_factory.mktemp("names")
    models, outside, allowed = root / "models", root / "outside", root / "allowed"
    for folder in (models / "ESRGAN", models / "ControlNet", models / "Lora", outside, allowed):
        folder.mkdir(parents=True)
    torch.manual_seed(0)
    torch.save(ESRGAN(num_filters=8, num_blocks=1, scale=2).state_dict(), models / "ESRGAN" / "tiny-x2.pth")
    shutil.copy(models / "ESRGAN" / "tiny-x2.pth", allowed / "allowed-x2.pth")
    unet = UNet2DConditionModel.from_pretrained(tiny_path, subfolder="unet")
    cn_files.save_folder(cn_files.build(unet, seed=1), models / "ControlNet" / "tiny-cn")
    cn_files.save_safetensors(cn_files.build(unet, seed=2), allowed / "allowed_cn.safetensors")
    (outside / "secret.pth").write_bytes(b"not a checkpoint, a secret")
    (outside / "secret.safetensors").write_bytes(b"not a checkpoint, a secret")
    Image.new("RGB", (8, 8)).save(outside / "image.png")
    os.symlink(outside / "secret.pth", allowed / "link.pth")
    return root


@pytest.fixture(autouse=True)
def models_folder(disk, monkeypatch):
    monkeypatch.setenv("LOWVRAM_GEN_MODELS", str(disk / "models"))


@pytest.fixture(scope="module")
def server(disk, tmp_path_factory):
    srv = Server(tmp_path_factory.mktemp("names-api"), api=True, webui=False)
    yield srv
    srv.close()


@pytest.fixture(scope="module")
def allowing(disk, tmp_path_factory):
    srv = Server(tmp_path_factory.mktemp("names-allow"), api=True, webui=False, api_allow_paths=str(disk / "allowed"))
    yield srv
    srv.close()


def _bad_paths(disk, suffix: str = ".pth") -> list[str]:
    """An existing file outside the folders, one that does not exist, a PNG, /etc/passwd and `..` tricks."""
    out = disk / "outside"
    return [str(out / f"secret{suffix}"), str(out / f"missing{suffix}"), str(out / "image.png"), "/etc/passwd",
            "../../../../../../etc/passwd", f"{disk}/models/ESRGAN/../../outside/secret{suffix}",
            f"ESRGAN/../../outside/secret{suffix}"]


def _png() -> str:
    data = io.BytesIO()
    Image.new("RGB", (SIDE, SIDE), "white").save(data, format="PNG")
    return base64.b64encode(data.getvalue()).decode()


def _job(**more) -> dict:
    return {"prompt": "a lighthouse", "seed": 3, "steps": 1, "width": SIDE, "height": SIDE, **more}


def _hires(upscaler: str) -> dict:
    return _job(enable_hr=True, hr_scale=2, hr_second_pass_steps=1, hr_upscaler=upscaler)


def _unit(model: str) -> dict:
    return _job(alwayson_scripts={"controlnet": {"args": [{"image": _png(), "module": "none", "model": model}]}})


def _checkpoint(model: str) -> dict:
    return _job(override_settings={"sd_model_checkpoint": model})


def _post(srv: Server, body: dict) -> requests.Response:
    return requests.post(f"{srv.api_url}/txt2img", json=body, timeout=300)


def _assert_one_refusal(srv: Server, bodies: list[dict], loc: list, route: str) -> None:
    """Every body answered 422 at `loc`, with the same message after the value (nothing about the file) naming
    `route`."""
    reasons = set()
    for body in bodies:
        answer = _post(srv, body)
        assert answer.status_code == 422, answer.text
        (detail,) = answer.json()["detail"]
        assert detail["loc"] == loc, detail
        msg = detail["msg"]
        assert route in msg and "names, not server paths" in msg, msg
        for leak in ("truncated", "no such", "not a PyTorch", "Unsupported", "exist", "folder", "secret"):
            assert leak not in msg.split("; ", 1)[1], msg
        reasons.add(msg.split("; ", 1)[1])
    assert len(reasons) == 1, reasons


def test_a_path_as_hr_upscaler_is_one_422_naming_the_field_and_the_listing(server, disk):
    _assert_one_refusal(server, [_hires(p) for p in _bad_paths(disk)], ["body", "hr_upscaler"],
                        "GET /sdapi/v1/upscalers")


def test_a_path_as_a_controlnet_units_model_is_one_422_naming_the_unit_and_the_listing(server, disk):
    bad = _bad_paths(disk, ".safetensors") + ["ControlNet/../../outside/secret.safetensors"]
    _assert_one_refusal(server, [_unit(p) for p in bad], ["body", "alwayson_scripts", "controlnet", "args", 0, "model"],
                        "GET /controlnet/model_list")


def test_a_path_as_the_override_settings_checkpoint_is_one_422_naming_the_setting(server, disk):
    _assert_one_refusal(server, [_checkpoint(p) for p in _bad_paths(disk, ".safetensors")],
                        ["body", "override_settings", "sd_model_checkpoint"], "GET /sdapi/v1/sd-models")


def test_a_path_in_a_prompts_lora_tag_is_one_422_naming_the_prompt(server, disk):
    bad = _bad_paths(disk, ".safetensors")
    bodies = [_job(prompt=f"a cat <lora:{p}:0.5>") for p in bad if ":" not in p]
    _assert_one_refusal(server, bodies, ["body", "prompt"], "GET /sdapi/v1/loras")


def test_listed_names_still_work(server, disk):
    listed = requests.get(f"{server.api_url}/upscalers", timeout=60).json()
    assert "tiny-x2.pth" in [u["name"] for u in listed]
    answer = _post(server, _hires("tiny-x2.pth"))
    assert answer.status_code == 200, answer.text
    assert "Hires upscaler: tiny-x2.pth" in answer.json()["info"]
    models = requests.get(f"{server.url}controlnet/model_list", timeout=60).json()["model_list"]
    assert "tiny-cn" in models
    answer = _post(server, _unit("tiny-cn"))
    assert answer.status_code == 200, answer.text
    title = requests.get(f"{server.api_url}/sd-models", timeout=60).json()[0]["title"]
    assert _post(server, _checkpoint(title)).status_code == 200


def test_with_api_allow_paths_a_path_inside_the_folder_works_and_one_outside_is_refused(allowing, disk):
    inside = disk / "allowed"
    answer = _post(allowing, _hires(str(inside / "allowed-x2.pth")))
    assert answer.status_code == 200, answer.text
    answer = _post(allowing, _hires(f"{inside}/../allowed/allowed-x2.pth"))  # `..` that stays inside
    assert answer.status_code == 200, answer.text
    answer = _post(allowing, _unit(str(inside / "allowed_cn.safetensors")))
    assert answer.status_code == 200, answer.text
    outside = _bad_paths(disk) + [str(inside / "link.pth"), f"{inside}/../outside/secret.pth"]  # a symlink out, `..`
    _assert_one_refusal(allowing, [_hires(p) for p in outside], ["body", "hr_upscaler"], "GET /sdapi/v1/upscalers")
    _assert_one_refusal(allowing, [_unit(p) for p in outside],
                        ["body", "alwayson_scripts", "controlnet", "args", 0, "model"], "GET /controlnet/model_list")


def test_api_allow_paths_must_name_folders_and_the_ui_command_passes_it(tmp_path, monkeypatch):
    from lowvram_gen import server as launch_module
    from lowvram_gen.cli.main import main
    from lowvram_gen.errors import InvalidRequest

    with pytest.raises(InvalidRequest, match="--api-allow-paths"):
        Server(tmp_path, api=True, webui=False, api_allow_paths=str(tmp_path / "no-such-folder"))
    launched = []
    monkeypatch.setattr(launch_module, "check_port", lambda port, host: int(port))
    monkeypatch.setattr(launch_module, "launch", lambda session, outdir, model, **kw: launched.append(kw))
    assert main(["ui", "--nowebui", "--api-allow-paths", str(tmp_path), "--outdir", str(tmp_path)]) == 0
    assert launched[0]["api_allow_paths"] == str(tmp_path)
