"""A1111's REST API with ControlNet units (issue 20): `alwayson_scripts: {"controlnet": {"args": [unit, ...]}}` in
txt2img and img2img bodies, as sd-webui-controlnet's API takes them (base64 images, its field names), and the
extension's own routes its clients call (/controlnet/model_list, module_list, version, detect). Driven by the real
`webuiapi` client (its ControlNetUnit) and by plain HTTP where it has no call.

The ControlNets are tiny ones made from the tiny model's UNet (tests/controlnet_files.py), kept in a
models/ControlNet folder as a user keeps them (a diffusers folder and a single .safetensors); the server runs in
this process (tests/api_helpers.py's), so $LOWVRAM_GEN_MODELS set here is the one it scans.
"""

from __future__ import annotations

import base64
import io
import json

import numpy as np
import pytest
import requests
from PIL import Image

import controlnet_files as files  # tests/controlnet_files.py
from lowvram_gen.control.units import ControlNetUnit
from lowvram_gen.outputs import read_png_metadata
from lowvram_gen.request import GenerationRequest
from api_helpers import _post, api, server  # noqa: F401 (fixtures)

webuiapi = pytest.importorskip("webuiapi", reason="the test extra's webuiapi is not installed: pip install -e .[test]")

SIDE, STEPS = 64, 2


@pytest.fixture(scope="module")
def models(tmp_path_factory, tiny_path):
    """models/ControlNet with tiny-cn (a diffusers folder) and tiny_cn_file.safetensors (another one), and a control
    image (a noisy white square: canny finds its border)."""
    from diffusers import UNet2DConditionModel

    root = tmp_path_factory.mktemp("models")
    (root / "ControlNet").mkdir()
    unet = UNet2DConditionModel.from_pretrained(tiny_path, subfolder="unet")
    files.save_folder(files.build(unet, seed=1), root / "ControlNet" / "tiny-cn")
    files.save_safetensors(files.build(unet, seed=2), root / "ControlNet" / "tiny_cn_file.safetensors")
    rng = np.random.RandomState(0)
    image = np.zeros((SIDE, SIDE, 3), dtype=np.uint8)
    image[16:48, 16:48] = 255
    image = np.clip(image.astype(int) + rng.randint(-20, 20, image.shape), 0, 255).astype(np.uint8)
    Image.fromarray(image).save(root / "control.png")
    return root


@pytest.fixture(autouse=True)
def models_folder(models, monkeypatch):
    monkeypatch.setenv("LOWVRAM_GEN_MODELS", str(models))


def _b64(path) -> str:
    return base64.b64encode(path.read_bytes()).decode()


def _pixels(image) -> np.ndarray:
    return np.asarray(image.convert("RGB")).astype(int)


def _job(**more) -> dict:
    # alwayson_scripts given fresh each call: webuiapi's txt2img/img2img default it to one shared {} that its
    # controlnet_units are written into, so a later call without units would send the previous call's
    return dict(prompt="edges steer", seed=31, steps=STEPS, width=SIDE, height=SIDE, cfg_scale=7, alwayson_scripts={},
                **more)


def test_webuiapi_txt2img_with_a_canny_unit_is_the_sessions_controlnet_job_and_writes_its_infotext(server, api,
                                                                                                  models, tmp_path):
    control = Image.open(models / "control.png")
    # webuiapi's own unit defaults: Resize and Fill (written as such; the same map as Just Resize for a square image on
    # a square job), processor_res 512, pixel_perfect false (not used: the map is made at the job's size)
    unit = webuiapi.ControlNetUnit(image=control, module="canny", model="tiny-cn", threshold_a=50, threshold_b=150)
    result = api.txt2img(**_job(), controlnet_units=[unit])
    text = result.info["infotexts"][0]
    assert 'ControlNet 0: "Module: canny, Model: tiny-cn, Weight: 1, Resize Mode: Resize and Fill, Low Vram: False, ' \
           'Processor Res: 64, Threshold A: 50, Threshold B: 150, Guidance Start: 0, Guidance End: 1, ' \
           'Pixel Perfect: True, Control Mode: Balanced' in text
    assert result.info["extra_generation_params"]["ControlNet 0"].startswith("Module: canny, Model: tiny-cn")
    # the same job through the Session, with the image as a file: the same pixels
    fields = {k: v for k, v in _job().items() if k != "alwayson_scripts"}
    alone = server.session.generate(GenerationRequest(
        **fields, outdir=str(tmp_path), sampler="Euler a", controlnets=(ControlNetUnit(  # webuiapi's sampler
            "tiny-cn", str(models / "control.png"), preprocessor="canny", canny_low=50, canny_high=150,
            resize_mode="fill"),)))
    assert np.array_equal(_pixels(result.image), _pixels(Image.open(alone.images[0])))

    # weight 0 is no ControlNet (same seed); a unit at weight 1 changed the image
    plain = api.txt2img(**_job()).image
    zero = api.txt2img(**_job(), controlnet_units=[webuiapi.ControlNetUnit(image=control, model="tiny-cn",
                                                                           weight=0)]).image
    assert np.array_equal(_pixels(plain), _pixels(zero))
    assert not np.array_equal(_pixels(plain), _pixels(result.image))


def test_img2img_takes_a_data_url_input_image_and_the_extensions_labels_and_skips_disabled_units(server, models):
    init = _b64(models / "control.png")
    off = {"enabled": False, "model": "not-there", "image": "not base64!"}  # skipped: nothing of it is read
    unit = {"input_image": "data:image/png;base64," + init, "module": "none", "model": "tiny-cn", "weight": 0.8,
            "guidance_start": 0.1, "guidance_end": 0.9, "control_mode": "ControlNet is more important",
            "resize_mode": 0, "pixel_perfect": True, "processor_res": -1, "threshold_a": -1, "threshold_b": -1,
            "low_vram": False}
    for mode in ("ControlNet is more important", 2):  # the label, and its integer form
        answer = _post(server, "img2img", {**_job(), "init_images": [init], "denoising_strength": 0.6,
                                           "alwayson_scripts": {"controlnet": {"args": [off, {**unit,
                                                                                         "control_mode": mode}]}}})
        assert answer.status_code == 200, answer.text[:600]
        text = json.loads(answer.json()["info"])["infotexts"][0]
        assert 'ControlNet 0: "Module: none, Model: tiny-cn, Weight: 0.8' in text and "ControlNet 1" not in text
        assert "Guidance Start: 0.1, Guidance End: 0.9" in text and "Control Mode: ControlNet is more important" in text
        assert "Denoising strength: 0.6" in text


def test_img2img_with_a_mask_and_a_unit_inpaints_with_controlnet(server, models, tmp_path):
    """A1111's inpaint body (mask, inpainting_fill, inpaint_full_res) with a ControlNet unit: the unit is in the
    infotext beside the inpaint fields, and the pixels outside the mask stay the init image's."""
    init = np.zeros((SIDE, SIDE, 3), dtype=np.uint8)
    init[:, :, 0] = np.linspace(0, 255, SIDE, dtype=np.uint8)
    Image.fromarray(init).save(tmp_path / "init.png")
    mask = np.zeros((SIDE, SIDE), dtype=np.uint8)
    mask[8:40, 8:40] = 255
    Image.fromarray(mask).save(tmp_path / "mask.png")
    unit = {"image": _b64(models / "control.png"), "module": "canny", "model": "tiny-cn", "weight": 0.9}
    answer = _post(server, "img2img", {**_job(), "init_images": [_b64(tmp_path / "init.png")],
                                       "mask": _b64(tmp_path / "mask.png"), "mask_blur": 0, "inpainting_fill": 1,
                                       "inpaint_full_res": False, "denoising_strength": 1.0,
                                       "alwayson_scripts": {"controlnet": {"args": [unit]}}})
    assert answer.status_code == 200, answer.text[:600]
    text = json.loads(answer.json()["info"])["infotexts"][0]
    assert 'ControlNet 0: "Module: canny, Model: tiny-cn, Weight: 0.9' in text and "Denoising strength: 1," in text
    out = _pixels(Image.open(io.BytesIO(base64.b64decode(answer.json()["images"][0]))))
    outside = mask == 0
    assert np.array_equal(out[outside], init.astype(int)[outside])
    assert np.abs(out[~outside] - init.astype(int)[~outside]).mean() > 5


def _refused(server, args, route="txt2img", **more) -> dict:
    body = {**_job(), **more, "alwayson_scripts": {"ControlNet": {"args": args}}}
    if route == "img2img":
        body["init_images"] = [body.get("init_images") or _b64_png()]
    answer = _post(server, route, body)
    assert answer.status_code == 422, answer.text[-600:]
    (detail,) = answer.json()["detail"]
    return detail


def _detect(server, body: dict) -> requests.Response:
    return requests.post(f"{server.url}controlnet/detect", json=body, timeout=60)


def _b64_png() -> str:
    out = io.BytesIO()
    Image.new("RGB", (SIDE, SIDE)).save(out, format="PNG")
    return base64.b64encode(out.getvalue()).decode()


def test_bad_units_are_422_naming_the_unit_and_its_field(server, api, models):
    good = {"image": _b64(models / "control.png"), "model": "tiny-cn"}
    bad = _refused(server, [good, {**good, "image": "not base64!"}])
    assert bad["loc"] == ["body", "alwayson_scripts", "controlnet", "args", 1, "image"]
    assert bad["msg"].startswith("invalid ControlNet unit 1 image: 'not base64!'; not base64")
    unreadable = _refused(server, [{**good, "image": base64.b64encode(b"hello").decode()}], route="img2img")
    assert unreadable["loc"][-1] == "image" and "ControlNet unit 0 image" in unreadable["msg"]
    missing = _refused(server, [{**good, "image": ""}])
    assert "ControlNet unit 0 image" in missing["msg"] and "send a base64 image" in missing["msg"]
    unknown = _refused(server, [good, {**good, "model": "control_v11p_sd15_openpose [cab727d4]"}])
    assert unknown["loc"][-2:] == [1, "model"] and unknown["input"] == "control_v11p_sd15_openpose"
    assert "invalid ControlNet unit 1 model" in unknown["msg"] and "GET /controlnet/model_list" in unknown["msg"]
    none = _refused(server, [{**good, "model": "None"}])  # the extension's "no model"
    assert none["loc"][-1] == "model" and "give a ControlNet model" in none["msg"]
    weight = _refused(server, [{**good, "weight": 3}])
    assert weight["loc"][-1] == "weight" and "ControlNet unit 0 weight: 3" in weight["msg"]
    field = _refused(server, [{**good, "ipadapter_input": None}])
    assert field["loc"][-1] == "ipadapter_input" and "ControlNet unit 0 field" in field["msg"]
    # the extension's three resize modes run (Crop and Resize, Resize and Fill: tests/test_controlnet_resize.py)
    resize = _refused(server, [{**good, "resize_mode": "Stretch"}], width=2 * SIDE)
    assert resize["loc"][-1] == "resize_mode" and "use resize, crop or fill" in resize["msg"]
    mixed = _refused(server, [{**good, "control_mode": 0}, {**good, "control_mode": 2}])  # one mode per job
    assert mixed["loc"] == ["body", "alwayson_scripts", "controlnet"] and "one control mode" in mixed["msg"]
    prompt = api.txt2img(**_job(), controlnet_units=[webuiapi.ControlNetUnit(image=Image.open(models / "control.png"),
                                                                             model="tiny-cn", control_mode=1)])
    assert "Control Mode: My prompt is more important" in prompt.info["infotexts"][0]  # the API's 1
    other = _post(server, "txt2img", {**_job(), "alwayson_scripts": {"controlnet": {"args": []}, "ADetailer": {}}})
    assert other.status_code == 422 and "'ADetailer'" in other.json()["detail"][0]["msg"]
    assert "'controlnet'" not in other.json()["detail"][0]["msg"]


def test_the_extensions_routes_list_the_models_and_modules_and_detect_makes_the_jobs_map(server, api, models):
    from lowvram_gen.control.preprocess import control_map
    from lowvram_gen.models.controlnet import short_hash

    label = f"tiny_cn_file [{short_hash(models / 'ControlNet' / 'tiny_cn_file.safetensors')}]"
    # and the embedded tiny-controlnet (issue 29), among the folder's by name
    assert api.controlnet_model_list() == ["None", "tiny-cn", "tiny-controlnet", label]
    assert api.controlnet_version() == 2
    from lowvram_gen.control.detectors import NAMES

    assert api.controlnet_module_list() == ["none", "canny", *NAMES]
    # a unit naming the file model as the list gives it runs it
    ran = api.txt2img(**_job(), controlnet_units=[webuiapi.ControlNetUnit(image=Image.open(models / "control.png"),
                                                                          model=label)])
    assert f"Model: {label}" in ran.info["infotexts"][0]

    detected = api.controlnet_detect([Image.open(models / "control.png")], module="canny", processor_res=SIDE,
                                     threshold_a=100, threshold_b=200)
    expected = np.asarray(control_map(str(models / "control.png"), SIDE, SIDE, "canny", 100, 200)).astype(int)
    (made,) = detected.images
    assert made.size == (SIDE, SIDE) and np.array_equal(_pixels(made), expected) and detected.info == "Success"
    image = _b64(models / "control.png")  # the extension's own key, controlnet_input_images
    bigger = _detect(server, {"controlnet_module": "none", "controlnet_processor_res": 128,
                              "controlnet_input_images": [image]})
    assert Image.open(io.BytesIO(base64.b64decode(bigger.json()["images"][0]))).size == (128, 128)
    depth = _detect(server, {"controlnet_module": "depth_midas", "controlnet_input_images": [image]})
    # its weights are nowhere here (tests/test_preprocessors.py makes some): A1111's error body names the file
    assert depth.status_code == 422 and "dpt_hybrid-midas-501f0c75.pt" in depth.json()["detail"], depth.text[:400]
    bad = _detect(server, {"controlnet_module": "canny", "controlnet_input_images": [image, "not base64!"]})
    assert bad.status_code == 422 and bad.json()["detail"][0]["loc"] == ["body", "controlnet_input_images", 1]
