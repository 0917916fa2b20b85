"""The 2026 families through the batch script and the REST API (issue 30: "each family generates from the CLI, the UI,
the batch script and the REST API, equal to plain diffusers on its tiny folder").

Every family with a record and a tiny folder (tests/family_folders.py): a prompt file with a line per family run by
scripts/batch_prompts.py, and A1111's txt2img/img2img bodies posted to `lowvram-gen ui --api` with the family picked
by its folder's title (override_settings.sd_model_checkpoint, as A1111 clients pick a checkpoint). Each PNG equals
plain diffusers' pipeline (<= 2/255) at the same seed, steps and CFG, with the CFG as the family means it (Qwen-Image
and its edit models: `true_cfg_scale`, and the model card's blank negative prompt where none is given; Flux.2: no
negative prompt, a warning where one is given). The editing models edit: a batch line's reference images, the API's
img2img init image (Qwen-Image-Edit and Edit-Plus, which need one, refuse txt2img in one sentence). The API's `info`
says what ran. The CLI path is tests/test_family_*.py's. The editing pipelines' reference sizes are 64x64
(family_folders.small_references). Seeded random weights: the images are noise.
"""

from __future__ import annotations

import base64
import io
import json
from pathlib import Path

import numpy as np
import pytest
from api_helpers import _post, server  # noqa: F401 - the API server fixture
from family_folders import BUILDERS, EDIT_ONLY, READ_AS, family_folders, plain_image, record_of, small_references
from PIL import Image

from lowvram_gen import families
from lowvram_gen.batch import manifest as bm

folders = family_folders("fronts-models")

MAX_DIFF = 2  # of 255: "equal to plain diffusers"
CFG = 4.0
# the families diffusers has an img2img pipeline for (the others refuse img2img in one sentence)
IMG2IMG = ("qwen-image", "z-image", "chroma")
KEYS = list(BUILDERS)
TXT2IMG = [key for key in KEYS if key not in EDIT_ONLY]
EDITS = [key for key in KEYS if families.by_key(READ_AS.get(key, key)).edit is not None]  # reference images
# the families whose call does not use a negative prompt, and why (Flux.2's has none; Kontext's acts only with a
# true CFG, which is never turned on)
IGNORES_NEGATIVE = {"flux2-klein": "Flux.2 Klein has none", "flux2-klein-9b": "Flux.2 Klein has none",
                    "flux2-dev": "Flux.2 dev has none", "flux-kontext": "it runs without CFG"}


@pytest.fixture(autouse=True)
def _small_references(monkeypatch):
    small_references(monkeypatch)


@pytest.fixture(scope="module")
def plain_pipes():
    """Plain diffusers' pipelines, one per folder and task, loaded as a user would (from_pretrained / from_pipe)."""
    return {}


def plain(pipes, folder: str, seed: int, negative: str | None = None, task: str = "txt2img", **kw) -> np.ndarray:
    """Plain diffusers' image for our job (family_folders.plain_image) at 2 steps and CFG 4."""
    return plain_image(pipes, folder, seed, CFG, negative, task, num_inference_steps=2, **kw)


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> Path:
    """A seeded 64x64 picture: the init image of img2img and the reference image of an edit."""
    path = tmp_path_factory.mktemp("fronts-images") / "init.png"
    Image.fromarray(np.random.default_rng(0).integers(0, 255, (64, 64, 3), dtype=np.uint8)).save(path)
    return path


def as_pixels(image) -> np.ndarray:
    if isinstance(image, (str, Path)):
        image = Image.open(image)
    return np.asarray(image.convert("RGB"), dtype=int)


# ------------------------------------------------------------------------------------------------ the batch script

def test_the_batch_script_runs_a_line_per_family_each_equal_to_plain_diffusers(folders, plain_pipes, batch_script,
                                                                                reference, tmp_path, capsys):
    """One prompt file, a line per family (its folder as the line's model) and one with a negative prompt each, and
    an edit line (a reference image) per editing model: the model loads per line, each PNG equals diffusers' at the
    line's seed."""
    lines = []
    for i, key in enumerate(KEYS):
        for negative in ("", "fog") if key in TXT2IMG else ():
            lines.append({"prompt": f"a lighthouse {key}", "negative_prompt": negative, "model": folders[key],
                          "seed": 20 + i, "cfg_scale": CFG})
        if key in EDITS:
            lines.append({"prompt": f"make it blue {key}", "model": folders[key], "seed": 40 + i, "cfg_scale": CFG,
                          "reference_images": [str(reference)]})
    path = tmp_path / "families.jsonl"
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    out = tmp_path / "out"
    code = batch_script.run([str(path), "--width", "64", "--height", "64", "--steps", "2", "--outdir", str(out),
                             "--json"])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    summary = json.loads(captured.out)
    assert (summary["done"], summary["images"]) == (len(lines), len(lines))
    records = {r["line"]: r for r in bm.read_records(bm.current_manifests(out))}
    for number, line in enumerate(lines, start=1):
        folder = line["model"]
        ours = as_pixels(out / records[number]["outputs"][0])
        references = [Image.open(reference).convert("RGB")] if "reference_images" in line else None
        theirs = plain(plain_pipes, folder, line["seed"], line.get("negative_prompt"), prompt=line["prompt"],
                       width=64, height=64, references=references)
        assert np.abs(ours - theirs).max() <= MAX_DIFF, (number, folder)
        assert ours.std() > 1
    assert "Traceback" not in captured.err


# ------------------------------------------------------------------------------------------------ the REST API

@pytest.fixture()
def models_root(folders, monkeypatch) -> Path:
    """The folders' parent is the models folder: each is listed by its folder name, as A1111 lists checkpoints."""
    root = Path(next(iter(folders.values()))).parent
    monkeypatch.setenv("LOWVRAM_GEN_MODELS", str(root))
    return root


def _body(key: str, **kw) -> dict:
    return {"prompt": "a lighthouse", "seed": 9, "steps": 2, "width": 64, "height": 64, "cfg_scale": CFG,
            "sampler_name": "default", "override_settings": {"sd_model_checkpoint": key}, **kw}


def _answer(server, route: str, body: dict) -> tuple[np.ndarray, dict]:
    answer = _post(server, route, body)
    assert answer.status_code == 200, answer.text
    data = answer.json()
    image = Image.open(io.BytesIO(base64.b64decode(data["images"][0])))
    return as_pixels(image), json.loads(data["info"])


def _get(server, route: str):
    import requests

    return requests.get(f"{server.api_url}/{route}", timeout=60).json()


def test_the_api_lists_every_family_folder(server, models_root):
    titles = {m["title"] for m in _get(server, "sd-models")}
    assert set(KEYS) <= titles


@pytest.mark.parametrize("negative", ["", "fog"])
@pytest.mark.parametrize("key", TXT2IMG)
def test_api_txt2img_equals_plain_diffusers_and_info_says_what_ran(key, negative, server, models_root, folders,
                                                                  plain_pipes):
    record = record_of(folders[key])
    ours, info = _answer(server, "txt2img", _body(key, negative_prompt=negative))
    theirs = plain(plain_pipes, folders[key], 9, negative, prompt="a lighthouse", width=64, height=64)
    assert np.abs(ours - theirs).max() <= MAX_DIFF
    text = info["infotexts"][0]
    assert info["sd_model_name"] == key and f"Model: {folders[key]}," in text  # the folder picked
    assert info["cfg_scale"] == CFG and "CFG scale: 4," in text  # the call's CFG (true_cfg_scale for Qwen-Image)
    ignored = [w for w in info["warnings"] if "negative prompt" in w]
    if negative and key in IGNORES_NEGATIVE:  # said in one line
        assert ignored == [f"{record.pipeline_for('txt2img')} does not use a negative prompt "
                           f"({IGNORES_NEGATIVE[key]}): it is ignored"]
    else:
        assert not ignored
        assert ("Negative prompt: fog" in text) == bool(negative)


@pytest.mark.parametrize("key", EDIT_ONLY)
def test_api_txt2img_on_a_model_that_needs_a_reference_image_is_refused_naming_it(key, server, models_root, folders):
    answer = _post(server, "txt2img", _body(key))
    assert answer.status_code == 422 and "Traceback" not in answer.text
    message = answer.json()["detail"][0]["msg"]
    assert f"{record_of(folders[key]).name} edits images and needs a reference image" in message
    assert "\n" not in message


@pytest.mark.parametrize("key", TXT2IMG)
def test_api_without_a_sampler_runs_the_familys_own_scheduler(key, server, models_root, folders, plain_pipes):
    """A body that names no sampler runs A1111's API default, Euler: on a flow-matching family, the flow's Euler
    steps that the folder's own FlowMatchEulerDiscreteScheduler takes (Forge runs A1111's Euler so on Flux). It was
    refused: an A1111 client could not run these families without knowing to send 'default'."""
    body = _body(key)
    del body["sampler_name"]
    answer = _post(server, "txt2img", body)
    assert answer.status_code == 200, answer.text
    data = answer.json()
    ours = as_pixels(Image.open(io.BytesIO(base64.b64decode(data["images"][0]))))
    theirs = plain(plain_pipes, folders[key], 9, prompt="a lighthouse", width=64, height=64)
    assert np.abs(ours - theirs).max() <= MAX_DIFF


@pytest.fixture(scope="module")
def init_png(reference) -> str:
    return base64.b64encode(reference.read_bytes()).decode()


@pytest.mark.parametrize("key", KEYS)
def test_api_img2img_equals_the_familys_img2img_pipeline_or_is_refused_naming_it(key, server, models_root, folders,
                                                                                 plain_pipes, init_png, posterior_mode):
    record = record_of(folders[key])
    body = _body(key, init_images=[init_png], denoising_strength=0.5)
    init = Image.open(io.BytesIO(base64.b64decode(init_png))).convert("RGB")
    if key in EDITS and key not in IMG2IMG:  # an editing model: the init image is the reference image it edits
        ours, info = _answer(server, "img2img", body)
        theirs = plain(plain_pipes, folders[key], 9, prompt="a lighthouse", references=[init], width=64, height=64)
        assert np.abs(ours - theirs).max() <= MAX_DIFF
        assert "Reference images:" in info["infotexts"][0]
        return
    if key not in IMG2IMG:
        answer = _post(server, "img2img", body)
        assert answer.status_code == 422
        message = answer.json()["detail"][0]["msg"]
        assert f"{record.name} has no img2img pipeline in diffusers: use txt2img" in message
        assert "\n" not in message and "Traceback" not in answer.text
        return
    ours, info = _answer(server, "img2img", body)
    # denoising_strength 0.5 of 2 steps runs A1111's int(0.5 x 2) + 1 = 2 of 2 (lowvram_gen/img2img_steps.py):
    # diffusers' 1.0
    theirs = plain(plain_pipes, folders[key], 9, task="img2img", prompt="a lighthouse", image=init, strength=1.0,
                   width=64, height=64)
    assert np.abs(ours - theirs).max() <= MAX_DIFF
    assert info["denoising_strength"] == 0.5 and "Denoising strength: 0.5" in info["infotexts"][0]


def test_api_fields_that_do_not_apply_are_named_in_info_warnings_not_a_traceback(server, models_root, folders):
    """A1111's clip skip and variation seed on Qwen-Image: the job runs, each is one line of info's warnings (its
    tiling is refused: tests/test_tiling.py)."""
    body = _body("qwen-image", subseed=3, subseed_strength=0.5,
                 override_settings={"sd_model_checkpoint": "qwen-image", "CLIP_stop_at_last_layers": 2})
    _, info = _answer(server, "txt2img", body)
    warned = info["warnings"]
    assert all("\n" not in w for w in warned) and "Traceback" not in " ".join(warned)
    assert any("clip skip 2 is not used: QwenImagePipeline" in w for w in warned), warned
    assert any("variation seed and seed resize are not used: QwenImagePipeline" in w for w in warned), warned
