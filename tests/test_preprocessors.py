"""ControlNet's model-based preprocessors (issue 20): controlnet_aux's detectors, found offline, loaded when asked.

The weight files are controlnet_aux's own networks with seeded random weights (tests/preprocessor_files.py), laid
out as A1111's extension downloads them (`extensions/sd-webui-controlnet/annotator/downloads/<module>/`) beside a
`models` folder ($LOWVRAM_GEN_MODELS), so the loaders read them as they read the real ones. OpenPose's networks
are near zero, so they find nobody in the test image and draw the empty (black) pose canvas: its pairing of
hundreds of random "joints" would take many seconds.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

pytest.importorskip("controlnet_aux")  # the `test` extra installs it; a bare checkout without it skips, saying so

from lowvram_gen import GenerationRequest  # noqa: E402
from lowvram_gen.cli.main import main  # noqa: E402
from lowvram_gen.control import detectors  # noqa: E402
from lowvram_gen.control.preprocess import control_map  # noqa: E402
from lowvram_gen.control.units import ControlNetUnit, unit_from_text  # noqa: E402
from lowvram_gen.errors import InvalidRequest, ModelLoadError  # noqa: E402
from lowvram_gen.outputs import parse_a1111_parameters, read_png_metadata  # noqa: E402

import controlnet_files  # noqa: E402  (tests/controlnet_files.py)
import preprocessor_files  # noqa: E402  (tests/preprocessor_files.py)
from ui_helpers import _fill_job, browser, needs_browser, page, server  # noqa: E402,F401  (the browser tests' fixtures)

W, H = 96, 64


@pytest.fixture(scope="module")
def webui(tmp_path_factory, tiny_path):
    """A webui folder with every module's weights in A1111's annotator downloads, a tiny ControlNet for the tiny
    model and a control image (a bright figure on a gradient)."""
    from diffusers import UNet2DConditionModel

    root = tmp_path_factory.mktemp("webui")
    models = preprocessor_files.write(root)
    net = controlnet_files.build(UNet2DConditionModel.from_pretrained(tiny_path, subfolder="unet"), seed=1)
    y, x = np.mgrid[0:H, 0:W]
    image = np.stack([x * 2, y * 3, (x + y)], axis=2).astype(np.uint8)
    image[16:56, 40:56] = 250
    Image.fromarray(image).save(root / "control.png")
    return {"root": root, "models": models, "cn": controlnet_files.save_folder(net, models / "ControlNet" / "tiny-cn"),
            "image": root / "control.png"}


@pytest.fixture()
def here(webui, monkeypatch, tmp_path):
    """The webui's models folder as $LOWVRAM_GEN_MODELS, and an empty Hugging Face cache."""
    import huggingface_hub.constants as hf_constants

    monkeypatch.setenv("LOWVRAM_GEN_MODELS", str(webui["models"]))
    monkeypatch.setattr(hf_constants, "HF_HUB_CACHE", str(tmp_path / "empty-hub"))
    return webui


def one_line_error(capsys) -> str:
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and len(err.splitlines()) == 1, err
    return err


def test_importing_lowvram_gen_does_not_import_controlnet_aux():
    code = ("import sys, lowvram_gen, lowvram_gen.request, lowvram_gen.control.units, lowvram_gen.control.detectors, "
            "lowvram_gen.control.preprocess, lowvram_gen.cli.main; "
            "print([m for m in ('controlnet_aux', 'cv2', 'timm') if m in sys.modules])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


@pytest.mark.parametrize("name", ["depth_midas", "openpose", "lineart_realistic", "lineart_coarse",
                                  "lineart_anime", detectors.LINEART_STANDARD])
def test_each_preprocessor_makes_an_rgb_map_of_the_jobs_size(name, here):
    made = control_map(str(here["image"]), W, H, name)
    assert (made.size, made.mode) == ((W, H), "RGB")
    a = np.asarray(made).astype(int)
    if name.startswith("openpose"):
        assert a.max() == 0  # nobody found by the near-zero networks: the empty pose canvas, not the image
    else:
        source = np.asarray(control_map(str(here["image"]), W, H, "none")).astype(int)
        assert a.std() > 0 and not np.array_equal(a, source)  # the detector's map, not the image
    if name == "lineart_coarse":  # the other file's network: another map than lineart_realistic's
        assert not np.array_equal(a, np.asarray(control_map(str(here["image"]), W, H, "lineart_realistic")))


def test_a1111s_names_and_aliases_are_taken_and_written_as_a1111_writes_them(here):
    image = str(here["image"])
    for given, kept in [("depth", "depth_midas"), ("Lineart", "lineart_realistic"), ("openpose_full", "openpose_full"),
                        ("lineart_standard", detectors.LINEART_STANDARD),
                        (detectors.LINEART_STANDARD, detectors.LINEART_STANDARD)]:
        request = GenerationRequest(prompt="x", controlnets=(ControlNetUnit("m", image, preprocessor=given),))
        assert request.validated().controlnets[0].preprocessor == kept
    # read back from A1111's PNG text, and from a batch line in the extension's API shape
    unit, _ = unit_from_text("ControlNet 0", "Module: lineart_anime, Model: control_v11p_sd15s2_lineart_anime "
                             "[3825e83e], Weight: 1, Resize Mode: Just Resize, Processor Res: 512, Guidance Start: 0, "
                             "Guidance End: 1, Pixel Perfect: True, Control Mode: Balanced", [])
    assert unit.preprocessor == "lineart_anime"
    from lowvram_gen.batch.files import expand, read_entries

    line = {"prompt": "x", "alwayson_scripts": {"controlnet": {"args": [
        {"module": "openpose_hand", "model": "m", "input_image": image, "processor_res": 512}]}}}
    file = here["root"] / "units.jsonl"
    file.write_text(json.dumps(line) + "\n")
    jobs = expand(read_entries(file), {})
    assert not jobs.bad and jobs.jobs[0].request.controlnets[0].preprocessor == "openpose_hand"


def test_a_depth_job_runs_and_its_png_says_the_module_and_reads_back(here, tmp_path, capsys):
    args = ["--controlnet", str(here["cn"]), "--control-image", str(here["image"]), "--steps", "2", "--width", "64",
            "--height", "64", "--seed", "3", "--outdir", str(tmp_path), "--json"]
    assert main(["generate", "a boat", *args, "--preprocessor", "depth"]) == 0
    first = json.loads(capsys.readouterr().out)["images"][0]
    text = parse_a1111_parameters(read_png_metadata(first)[0])["ControlNet 0"]
    assert text.startswith("Module: depth_midas, Model: tiny-cn, Weight: 1, Resize Mode: Just Resize, Low Vram: "
                           "False, Processor Res: 64, Guidance Start: 0,"), text
    assert main(["generate", "--from-png", first, "--control-image", str(here["image"]), "--outdir",
                 str(tmp_path / "again"), "--json"]) == 0
    again = json.loads(capsys.readouterr().out)["images"][0]
    assert read_png_metadata(again)[1]["request"]["controlnets"][0]["preprocessor"] == "depth_midas"
    assert np.array_equal(np.asarray(Image.open(first)), np.asarray(Image.open(again)))
    # the map is the depth map: the same job with the image as its own map is another picture
    assert main(["generate", "a boat", *args, "--preprocessor", "none"]) == 0
    plain = json.loads(capsys.readouterr().out)["images"][0]
    assert not np.array_equal(np.asarray(Image.open(first)), np.asarray(Image.open(plain)))


def test_without_controlnet_aux_the_job_is_refused_saying_what_to_install(here, tmp_path, capsys, monkeypatch):
    import lowvram_gen.session as session_mod

    monkeypatch.setitem(sys.modules, "controlnet_aux", None)  # as if not installed: its import fails
    monkeypatch.setattr(session_mod, "load", lambda *a, **k: pytest.fail("nothing may load"))
    code = main(["generate", "a boat", "--controlnet", str(here["cn"]), "--control-image", str(here["image"]),
                 "--preprocessor", "openpose", "--outdir", str(tmp_path)])
    err = one_line_error(capsys)
    assert code == 2 and "the openpose preprocessor needs controlnet_aux, which is not installed" in err
    assert "pip install 'lowvram-gen[preprocessors]'" in err


@pytest.mark.parametrize("name,present,missing", [("openpose", (), "body_pose_model.pth"),
                                                  ("openpose_full", ("openpose",), "hand_pose_model.pth"),
                                                  ("depth", (), "dpt_hybrid-midas-501f0c75.pt")])
def test_missing_weights_are_refused_naming_the_file_and_the_folders(name, present, missing, here, tmp_path, capsys,
                                                                      monkeypatch):
    import lowvram_gen.session as session_mod

    webui = tmp_path / "webui"
    if present:  # body_pose_model.pth alone: openpose_full also needs the hand's and the face's
        folder = webui / preprocessor_files.A1111_DOWNLOADS / "openpose"
        folder.mkdir(parents=True)
        src = here["root"] / preprocessor_files.A1111_DOWNLOADS / "openpose" / "body_pose_model.pth"
        (folder / "body_pose_model.pth").write_bytes(src.read_bytes())
    (webui / "models").mkdir(parents=True)
    monkeypatch.setenv("LOWVRAM_GEN_MODELS", str(webui / "models"))
    monkeypatch.setattr(session_mod, "load", lambda *a, **k: pytest.fail("nothing may load"))
    code = main(["generate", "a boat", "--controlnet", str(here["cn"]), "--control-image", str(here["image"]),
                 "--preprocessor", name, "--outdir", str(tmp_path)])
    err = one_line_error(capsys)
    assert code == 2 and f"needs {missing}, found in none of" in err
    for folder in ("models/ControlNetPreprocessor", "extensions/sd-webui-controlnet/annotator/downloads/"):
        assert folder in err.replace("\\", "/")
    assert "nor the Hugging Face cache (lllyasviel/Annotators)" in err


def test_an_unknown_module_is_refused_listing_the_allowed_ones(here, capsys, tmp_path):
    for name, words in [("sobel", "use one of none, canny, depth_midas, openpose"),
                        ("depth_zoe", "not built here; use one of none, canny, depth_midas")]:
        with pytest.raises(InvalidRequest, match=words):
            GenerationRequest(prompt="x", controlnets=(ControlNetUnit("m", str(here["image"]), preprocessor=name),)
                              ).validated()
    code = main(["generate", "a boat", "--controlnet", str(here["cn"]), "--control-image", str(here["image"]),
                 "--preprocessor", "sobel", "--outdir", str(tmp_path)])
    assert code == 2 and "lineart_anime" in one_line_error(capsys)


def test_weights_are_found_in_our_folder_and_in_the_hugging_face_cache(here, tmp_path, monkeypatch):
    import huggingface_hub.constants as hf_constants

    downloads = here["root"] / preprocessor_files.A1111_DOWNLOADS
    models = tmp_path / "models"
    ours = models / "ControlNetPreprocessor" / "lineart"  # the module's sub-folder of ours (Forge's)
    ours.mkdir(parents=True)
    (ours / "sk_model.pth").write_bytes((downloads / "lineart" / "sk_model.pth").read_bytes())
    (models / "ControlNetPreprocessor" / "sk_model2.pth").write_bytes(  # or directly in it
        (downloads / "lineart" / "sk_model2.pth").read_bytes())
    cache = tmp_path / "hub"
    snapshot = cache / "models--lllyasviel--Annotators" / "snapshots" / ("a" * 40)
    snapshot.mkdir(parents=True)
    (snapshot / "netG.pth").write_bytes((downloads / "lineart_anime" / "netG.pth").read_bytes())
    (cache / "models--lllyasviel--Annotators" / "refs").mkdir()
    (cache / "models--lllyasviel--Annotators" / "refs" / "main").write_text("a" * 40)
    monkeypatch.setenv("LOWVRAM_GEN_MODELS", str(models))
    monkeypatch.setattr(hf_constants, "HF_HUB_CACHE", str(cache))
    assert detectors.find("lineart_realistic") == {"sk_model.pth": ours / "sk_model.pth"}
    assert detectors.find("lineart_coarse") == {"sk_model2.pth": models / "ControlNetPreprocessor" / "sk_model2.pth"}
    assert detectors.find("lineart_anime")["netG.pth"].resolve() == (snapshot / "netG.pth").resolve()
    made = detectors.run("lineart_anime", Image.open(here["image"]).convert("RGB"))
    assert made.size == (W, H) and np.asarray(made).std() > 0


def test_a_detector_loads_once_and_stays_loaded_for_the_next_job(here, monkeypatch):
    calls = []
    real = detectors.LOADERS["lineart"]
    monkeypatch.setattr(detectors, "_LOADED", {})
    monkeypatch.setitem(detectors.LOADERS, "lineart", lambda paths: calls.append(paths) or real(paths))
    image = Image.open(here["image"]).convert("RGB")
    first = detectors.run("lineart_realistic", image)
    again = detectors.run("lineart_realistic", image.resize((64, 64)))  # another job, another size: no reload
    assert len(calls) == 1 and first.size == (W, H) and again.size == (64, 64)
    detectors.run("lineart_coarse", image)  # the coarse file is another network
    detectors.run("depth_midas", image)
    detectors.run("lineart_realistic", image)  # two others since: it was dropped (the last two stay)
    assert len(calls) == 3


def test_a_file_of_another_network_is_refused_in_one_sentence(here, tmp_path, monkeypatch):
    models = tmp_path / "models"
    folder = models / "ControlNetPreprocessor" / "lineart"
    folder.mkdir(parents=True)
    downloads = here["root"] / preprocessor_files.A1111_DOWNLOADS
    (folder / "sk_model.pth").write_bytes((downloads / "openpose" / "facenet.pth").read_bytes())
    monkeypatch.setenv("LOWVRAM_GEN_MODELS", str(models))
    with pytest.raises(ModelLoadError, match=r"the lineart_realistic preprocessor could not load .*sk_model\.pth"):
        detectors.run("lineart_realistic", Image.open(here["image"]).convert("RGB"))


def test_the_ui_lists_the_modules_and_previews_their_map(here, tmp_path):
    from lowvram_gen.ui import controlnet as ui

    preview = ui.preview(str(here["image"]), "lineart_anime", 100, 200, W, H)
    assert preview.size == (W, H)
    assert np.array_equal(np.asarray(preview), np.asarray(control_map(str(here["image"]), W, H, "lineart_anime")))
    import gradio as gr

    with gr.Blocks():
        width, height = gr.Number(64), gr.Number(64)
        controls = ui.build("t-", width, height)
    choices = [c[1] if isinstance(c, tuple) else c for c in controls["cn0_preprocessor"].choices]
    assert choices == ["none", "canny", *detectors.NAMES]
    with pytest.MonkeyPatch.context() as mp:  # a module whose weights are missing: the sentence reaches the browser
        mp.setenv("LOWVRAM_GEN_MODELS", str(tmp_path / "models"))
        with pytest.raises(gr.Error, match="the openpose preprocessor needs body_pose_model.pth"):
            ui.preview(str(here["image"]), "openpose", 100, 200, W, H)


def test_png_info_keeps_a_module_that_runs_here(here, tmp_path):
    from PIL.PngImagePlugin import PngInfo

    from lowvram_gen.ui import sendto

    info = PngInfo()
    info.add_text("parameters", 'a boat\nSteps: 2, Sampler: Euler, CFG scale: 7, Seed: 1, Size: 64x64, ControlNet 0: '
                  '"Module: depth_midas, Model: tiny-cn, Weight: 1, Guidance Start: 0, Guidance End: 1", '
                  'ControlNet 1: "Module: depth_zoe, Model: tiny-cn, Weight: 1"')
    png = tmp_path / "made.png"
    Image.new("RGB", (8, 8)).save(png, pnginfo=info)
    values, said = sendto.values_for(sendto.IMG2IMG, str(png))
    got = dict(zip(sendto.IMG2IMG, values))
    assert got["cn0_preprocessor"] == "depth_midas" and got["cn1_preprocessor"] == "none"
    assert any(re.search(r"Unit 1 preprocessor 'depth_zoe'.*not built here", s) for s in said), said


def test_the_readme_lists_every_module():
    readme = (Path(__file__).parents[1] / "README.md").read_text()
    section = readme[readme.index("## ControlNet"):readme.index("## Memory: presets")]
    for name in detectors.NAMES:
        assert f"`{name}`" in section, name


@needs_browser
def test_in_the_browser_a_lineart_unit_previews_its_map(here, page):
    """The accordion's dropdown in a real headless Chromium (tests/ui_helpers.py's fixtures): lineart_realistic picked,
    Preview shows the job's map at the tab's size."""
    import urllib.request

    _fill_job(page, "lines steer", 64, 64, 2)
    page.locator("#controlnet").get_by_text("ControlNet", exact=True).first.click()  # open the accordion
    page.locator("#cn0-image input[type=file]").set_input_files(str(here["image"]))
    page.locator("#cn0-image img").first.wait_for(timeout=30_000)
    page.locator("#cn0-preprocessor input").first.click()
    page.get_by_role("option", name="lineart_realistic", exact=True).click()
    page.click("#cn0-preview-button")
    page.wait_for_function("() => { const img = document.querySelector('#cn0-preview img');"
                           " return img !== null && img.complete && img.naturalWidth > 0; }", timeout=60_000)
    src = page.locator("#cn0-preview img").first.get_attribute("src")
    with urllib.request.urlopen(src) as answer:
        shown = np.asarray(Image.open(answer).convert("RGB"))
    assert np.array_equal(shown, np.asarray(control_map(str(here["image"]), 64, 64, "lineart_realistic")))
