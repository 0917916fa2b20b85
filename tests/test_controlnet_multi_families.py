"""Several ControlNet units on Qwen-Image: diffusers' QwenImageMultiControlNetModel runs the units' control images
through one (union) ControlNet, as InstantX's Qwen-Image-ControlNet-Union is run with a canny and a depth map. Our
units of one ControlNet (from the CLI, and from A1111's API body: alwayson_scripts' units) equal plain diffusers with
that wrapper; two different ControlNets, which it does not run, are refused in one sentence before loading; the plan
counts the one ControlNet once; a simulated out-of-memory steps down without reloading it.
"""

from __future__ import annotations

import base64
import json

import numpy as np
import pytest
import torch
from controlnet_files import random_image, steps_down_once
from PIL import Image
from tiny_controlnets import tiny_qwen_controlnet
from tiny_qwen import build_tiny_qwen_image
from tiny_transformers import cli, pixels

from lowvram_gen import GenerationRequest
from lowvram_gen.control.units import ControlNetUnit
from lowvram_gen.errors import InvalidRequest
from lowvram_gen.models import controlnet as models
from lowvram_gen.session import Session

MAX_DIFF = 2  # of 255: "equal to plain diffusers"
WEIGHTS = (0.8, 0.5)


@pytest.fixture(scope="module")
def made(tmp_path_factory):
    root = tmp_path_factory.mktemp("cn-multi-qwen")
    build_tiny_qwen_image().save_pretrained(root / "model", safe_serialization=True)
    tiny_qwen_controlnet().save_pretrained(root / "cn", safe_serialization=True)
    tiny_qwen_controlnet(seed=5).save_pretrained(root / "cn2", safe_serialization=True)
    return dict(model=str(root / "model"), cn=str(root / "cn"), cn2=str(root / "cn2"),
                images=(random_image(root / "a.png", 1), random_image(root / "b.png", 2)))


def units(made, cn2: bool = False) -> tuple:
    return (ControlNetUnit(made["cn"], made["images"][0], WEIGHTS[0]),
            ControlNetUnit(made["cn2"] if cn2 else made["cn"], made["images"][1], WEIGHTS[1]))


def request(made, tmp_path, **fields) -> GenerationRequest:
    base = dict(prompt="a castle", negative_prompt="fog", model=made["model"], width=64, height=64, steps=2, seed=7,
                cfg_scale=4.0, outdir=str(tmp_path), controlnets=units(made))
    return GenerationRequest(**{**base, **fields})


def plain(made) -> np.ndarray:
    """Plain diffusers: QwenImageControlNetPipeline with QwenImageMultiControlNetModel([the ControlNet]), a control
    image and a scale for each unit."""
    from diffusers import QwenImageControlNetModel, QwenImageControlNetPipeline, QwenImageMultiControlNetModel

    net = QwenImageMultiControlNetModel([QwenImageControlNetModel.from_pretrained(made["cn"])])
    pipe = QwenImageControlNetPipeline.from_pretrained(made["model"], controlnet=net)
    pipe.set_progress_bar_config(disable=True)
    out = pipe(prompt="a castle", negative_prompt="fog", width=64, height=64, num_inference_steps=2,
               true_cfg_scale=4.0, control_image=[Image.open(p).convert("RGB") for p in made["images"]],
               controlnet_conditioning_scale=list(WEIGHTS), generator=torch.Generator().manual_seed(7)).images[0]
    return np.asarray(out.convert("RGB"), dtype=int)


def test_two_units_of_one_controlnet_from_the_cli_equal_diffusers_multi_controlnet(made, tmp_path, capsys):
    code, out, err = cli(capsys, "generate", "a castle", "--negative", "fog", "--model", made["model"], "--width",
                         "64", "--height", "64", "--steps", "2", "--seed", "7", "--cfg", "4", "--preset", "cpu",
                         "--outdir", str(tmp_path), "--json",
                         "--controlnet", f"{made['cn']}:{WEIGHTS[0]}", "--control-image", made["images"][0],
                         "--controlnet", f"{made['cn']}:{WEIGHTS[1]}", "--control-image", made["images"][1])
    assert code == 0, err
    ours = pixels(json.loads(out)["images"][0])
    assert np.abs(ours - plain(made)).max() <= MAX_DIFF
    one = Session(preset="cpu").generate(request(made, tmp_path / "one", controlnets=units(made)[:1]))
    assert np.abs(ours - pixels(one.images[0])).max() > 10  # the second unit acts


def test_an_api_body_with_two_units_is_the_same_job(made, tmp_path):
    """A1111's txt2img body with alwayson_scripts' two ControlNet units (base64 images) maps onto the same two units
    (a1111/api_body.map_body, as the REST API's txt2img route runs it)."""
    from lowvram_gen.a1111.api_body import map_body

    def stored(value, field=None):
        path = tmp_path / f"in-{len(list(tmp_path.glob('in-*')))}.png"
        path.write_bytes(base64.b64decode(value))
        return str(path)

    args = [{"image": base64.b64encode(open(p, "rb").read()).decode(), "module": "none", "model": made["cn"],
             "weight": w} for p, w in zip(made["images"], WEIGHTS)]
    body = dict(prompt="a castle", negative_prompt="fog", seed=7, steps=2, width=64, height=64, cfg_scale=4,
                alwayson_scripts={"controlnet": {"args": args}})
    mapped = map_body(body, "txt2img", made["model"], 1, str(tmp_path), lambda title: None, init_image=stored)
    assert [(u.model, u.weight) for u in mapped.request.controlnets] == [(made["cn"], w) for w in WEIGHTS]
    result = Session(preset="cpu").generate(mapped.request)
    assert np.abs(pixels(result.images[0]) - plain(made)).max() <= MAX_DIFF


def test_two_different_controlnets_are_refused_in_one_sentence(made, tmp_path, monkeypatch):
    """Refused before any weight loads (QwenImageMultiControlNetModel runs one ControlNet's several images)."""
    loads = []
    monkeypatch.setattr(models, "load_controlnet", lambda *a, **k: loads.append(1))
    with pytest.raises(InvalidRequest, match="runs several units of one ControlNet .* not 2 different ControlNets") \
            as caught:
        Session(preset="cpu").generate(request(made, tmp_path, controlnets=units(made, cn2=True)))
    assert len(str(caught.value).splitlines()) == 1 and loads == []


def test_the_plan_counts_the_one_controlnet_once(made, capsys):
    args = ["plan", "--json", "--vram", "4GiB", "--model", made["model"], "--width", "512", "--height", "512"]
    code, out, err = cli(capsys, *args, "--controlnet", made["cn"])
    assert code == 0, err
    one = {r["name"]: r["breakdown"] for r in json.loads(out)["presets"]}
    code, out, err = cli(capsys, *args, "--controlnet", made["cn"], "--controlnet", made["cn"])
    assert code == 0, err
    params = sum(p.numel() for p in tiny_qwen_controlnet().parameters())
    for row in json.loads(out)["presets"]:
        assert row["breakdown"]["controlnet_bytes"] in (2 * params, 4 * params), row["name"]
        assert row["breakdown"]["controlnet_bytes"] == one[row["name"]]["controlnet_bytes"]


def test_out_of_memory_with_two_units_steps_down_without_reloading(made, tmp_path, monkeypatch):
    """Simulated: the ControlNet's forward raises torch.OutOfMemoryError once at highvram; the job finishes one rung
    down with the same ControlNet object, not loaded again (one slot for both units), equal to diffusers."""
    session, result = steps_down_once(monkeypatch, request(made, tmp_path, steps=1), request(made, tmp_path))
    assert not hasattr(session.model.pipe, "controlnet1")
    assert np.abs(pixels(result.images[0]) - plain(made)).max() <= MAX_DIFF
