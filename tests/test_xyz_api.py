"""Issue 32 item 3 through A1111's REST API: `script_name: "x/y/z plot"` (any case) with A1111's `script_args` order
on txt2img and img2img, through webuiapi; `GET /sdapi/v1/scripts` and `/script-info`; any other script refused in one
sentence; a bad axis named with the script_args field."""

from __future__ import annotations

import pytest
import requests
from PIL import Image

from api_helpers import _post, api, server  # noqa: F401 (api, server: fixtures)
from lowvram_gen.outputs import parse_a1111_parameters

webuiapi = pytest.importorskip("webuiapi", reason="the test extra's webuiapi is not installed: pip install -e .[test]")

SEED, CFG, STEPS = 1, 6, 4  # A1111's txt2img list: 1 Seed, 6 CFG Scale, 4 Steps


def xyz_args(x_type=SEED, x_values="1, 2", y_type=CFG, y_values="5, 7", lone=False, sub=False):
    return [x_type, x_values, [], y_type, y_values, [], 0, "", [], True, lone, sub, False, 0, False, False]


def test_webuiapi_txt2img_xyz_answers_the_grid_first_then_the_cells(server, api):
    result = api.txt2img(prompt="a lighthouse", seed=3, steps=2, width=64, height=64, script_name="X/Y/Z plot",
                         script_args=xyz_args(lone=True))
    assert len(result.images) == 5
    grid, cells = result.images[0], result.images[1:]
    assert grid.size[0] > 2 * 64 and grid.size[1] > 2 * 64 and {c.size for c in cells} == {(64, 64)}
    info = result.info
    fields = parse_a1111_parameters(info["infotexts"][0])
    assert fields["Script"] == "X/Y/Z plot" and fields["X Type"] == "Seed" and fields["Y Values"] == "5, 7"
    assert [parse_a1111_parameters(t)["Seed"] for t in info["infotexts"][1:]] == ["1", "2", "1", "2"]
    assert [parse_a1111_parameters(t)["CFG scale"] for t in info["infotexts"][1:]] == ["5", "5", "7", "7"]
    only = api.txt2img(prompt="a lighthouse", seed=3, steps=2, width=64, height=64, script_name="x/y/z plot",
                       script_args=xyz_args())
    assert len(only.images) == 1  # without include lone images: the grid alone, as A1111


def test_webuiapi_img2img_xyz_by_axis_name_and_index(server, api):
    init = Image.new("RGB", (64, 64), "gray")
    # img2img's list: 22 is Denoising (txt2img's 23), 4 Steps
    result = api.img2img(images=[init], prompt="a harbour", seed=6, steps=2, width=64, height=64,
                         script_name="x/y/z plot", script_args=xyz_args(22, "0.3, 0.6", "Steps", "1, 2", lone=True))
    assert len(result.images) == 5
    assert [parse_a1111_parameters(t)["Denoising strength"] for t in result.info["infotexts"][1:]] == [
        "0.3", "0.6", "0.3", "0.6"]


def test_scripts_and_script_info_list_the_xyz_plot(server, api):
    assert api.get_scripts()["txt2img"] == ["x/y/z plot"] and api.get_scripts()["img2img"][0] == "x/y/z plot"
    info = requests.get(f"{server.api_url}/script-info", timeout=60).json()
    assert [(s["name"], s["is_img2img"]) for s in info][:2] == [("x/y/z plot", False), ("x/y/z plot", True)]
    args = info[0]["args"]
    assert [a["label"] for a in args[:3]] == ["X type", "X values", "X values"] and len(args) == 16
    assert args[0]["choices"][:2] == ["Nothing", "Seed"] and args[0]["choices"][-3:] == ["Preset", "VRAM budget",
                                                                                          "Quantize"]
    assert info[1]["args"][0]["choices"][6] == "Image CFG Scale"


def test_another_script_and_a_bad_axis_are_refused_in_one_sentence(server):
    other = _post(server, "txt2img", {"prompt": "x", "script_name": "Prompt matrix"})
    detail = other.json()["detail"][0]
    assert other.status_code == 422 and detail["loc"] == ["body", "script_name"]
    assert 'runs A1111\'s "x/y/z plot" and img2img\'s' in detail["msg"] and "\n" not in detail["msg"]
    bad = _post(server, "txt2img", {"prompt": "x", "steps": 1, "width": 64, "height": 64,
                                    "script_name": "x/y/z plot", "script_args": xyz_args(12, "1, 2")})
    assert bad.status_code == 422 and "'Negative Guidance minimum sigma'; that A1111 axis is not built" in bad.text
    big = _post(server, "txt2img", {"prompt": "x", "script_name": "x/y/z plot",
                                    "script_args": xyz_args(SEED, "1-9", STEPS, "1-8")})
    assert big.status_code == 422 and "72 cells and a grid may have at most 64" in big.text


def test_axis_values_name_models_and_vaes_as_a_body_does_never_a_server_path(server, tmp_path):
    secret = tmp_path / "elsewhere" / "model.safetensors"
    for axis, value in ((11, str(secret)), (27, str(tmp_path / "vae.safetensors"))):  # Checkpoint name, VAE
        bad = _post(server, "txt2img", {"prompt": "x", "steps": 1, "width": 64, "height": 64,
                                        "script_name": "x/y/z plot", "script_args": xyz_args(axis, f"tiny, {value}"
                                                                                             if axis == 11 else value)})
        assert bad.status_code == 422 and ("sd-models" in bad.text or "sd-vae" in bad.text), bad.text
