"""The web UI's remembered values (ui/remembered.py): saved by a valid job, the next UI starts with them, and
a bad file is ignored with a warning."""

from __future__ import annotations

import json
import logging

import pytest

from lowvram_gen.ui import remembered


def _component(app, elem_id):
    return next(b for b in app.blocks.values() if getattr(b, "elem_id", None) == elem_id)


def _build(tmp_path):
    from lowvram_gen.session import Session
    from lowvram_gen.ui.app import UiOptions, build_app

    return build_app(Session(outdir=str(tmp_path)), UiOptions(outdir=str(tmp_path)))


def test_save_then_load_keeps_each_tab_and_writes_no_temporary_file(isolated_home):
    remembered.save("txt2img", {"prompt": "a fox", "width": 640, "cfg_scale": 5.5})
    remembered.save("img2img", {"strength": 0.3})
    remembered.save("txt2img", {"prompt": "a hare", "width": 768})
    assert remembered.load() == {"txt2img": {"prompt": "a hare", "width": 768}, "img2img": {"strength": 0.3}}
    assert remembered.path() == isolated_home / "ui-settings.json"
    assert [p.name for p in isolated_home.glob(".ui-settings.json*")] == []


@pytest.mark.parametrize("content", [b"{not json", b"[1, 2]", b'{"version": 99, "tabs": {}}', b'{"version": 1, "tabs": 3}',
                                     b"\xff\xfe not UTF-8"])
def test_a_corrupt_or_foreign_file_is_ignored_with_a_warning(isolated_home, caplog, content):
    remembered.path().write_bytes(content)
    with caplog.at_level(logging.WARNING, logger="lowvram_gen.ui.remembered"):
        assert remembered.load() == {}
    assert "ignoring the UI settings" in caplog.text
    remembered.save("txt2img", {"steps": 3})  # and the next job writes a good one over it
    assert remembered.load() == {"txt2img": {"steps": 3}}


def test_a_value_of_the_wrong_type_falls_back_to_the_default(caplog):
    saved = {"txt2img": {"width": "wide", "steps": 30, "prompt": 5, "seed": True}}
    with caplog.at_level(logging.WARNING, logger="lowvram_gen.ui.remembered"):
        assert remembered.initial(saved, "txt2img", "width", 512) == 512
        assert remembered.initial(saved, "txt2img", "prompt", "") == ""
        assert remembered.initial(saved, "txt2img", "seed", -1) == -1
    assert remembered.initial(saved, "txt2img", "steps", 20) == 30
    assert remembered.initial(saved, "img2img", "steps", 20) == 20
    assert "ignoring the remembered txt2img width" in caplog.text


def test_an_unwritable_home_costs_a_warning_not_the_job(isolated_home, monkeypatch, caplog):
    blocker = isolated_home / "a-file"
    blocker.write_text("x")
    monkeypatch.setenv("LOWVRAM_GEN_HOME", str(blocker))  # a file where the folder should be
    with caplog.at_level(logging.WARNING, logger="lowvram_gen.ui.remembered"):
        remembered.save("txt2img", {"steps": 3})
    assert "could not save the UI settings" in caplog.text


def test_a_job_remembers_its_values_and_the_next_ui_starts_with_them(tmp_path):
    from gradio_client import Client
    from gradio_client.exceptions import AppError

    from lowvram_gen.session import Session
    from lowvram_gen.ui.launch import launch
    from test_ui import _free_port

    port = _free_port()
    app = launch(Session(outdir=str(tmp_path)), str(tmp_path), "tiny", port=port, block=False)
    try:
        client = Client(f"http://127.0.0.1:{port}/", verbose=False)
        with pytest.raises(AppError):  # refused: not remembered
            client.predict(prompt="refused", width=500, api_name="/generate")
        assert remembered.load() == {}
        client.predict(prompt="a remembered fox", negative_prompt="fog", width=64, height=72, steps=2, cfg_scale=4.5,
                       sampler="Euler a", api_name="/generate")
    finally:
        app.close()
    saved = json.loads(remembered.path().read_text(encoding="utf-8"))["tabs"]["txt2img"]
    assert saved["prompt"] == "a remembered fox" and saved["width"] == 64 and "model" not in saved
    app = _build(tmp_path)
    assert _component(app, "prompt").value == "a remembered fox"
    assert _component(app, "negative").value == "fog"
    assert (_component(app, "width").value, _component(app, "height").value) == (64, 72)
    assert (_component(app, "steps").value, _component(app, "cfg").value) == (2, 4.5)
    assert _component(app, "sampler").value == "Euler a"
    assert _component(app, "i2i-steps").value == 20  # img2img ran no job: its own defaults


@pytest.mark.parametrize("saved, expected", [("int8", "int8"), (None, "as the preset says"),
                                             ("int3", "as the preset says")])
def test_the_quantize_box_starts_at_the_remembered_choice(tmp_path, saved, expected):
    """A job saves the request's quantize (None for "as the preset says"); a value that is no choice is not shown."""
    remembered.save("txt2img", {"quantize": saved})
    remembered.save("img2img", {"quantize": "int4"})
    app = _build(tmp_path)
    assert _component(app, "quantize").value == expected
    assert _component(app, "i2i-quantize").value == "int4"
