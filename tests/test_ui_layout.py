"""The README's picture of the web UI (docs/screenshot.png) shows the UI as it is: scripts/screenshot.py writes
the layout's signature into it, and this test compares it with the layout the app builds now."""

from __future__ import annotations

from pathlib import Path

from PIL import Image

from lowvram_gen.session import Session
from lowvram_gen.ui.app import build_app
from lowvram_gen.ui.context import UiOptions
from lowvram_gen.ui.layout import SIGNATURE_KEY, describe, signature, tabs

SCREENSHOT = Path(__file__).resolve().parents[1] / "docs" / "screenshot.png"


def _app(tmp_path, model="tiny"):
    return build_app(Session(outdir=str(tmp_path)), UiOptions(outdir=str(tmp_path), model=model, queue_size=4))


def test_the_readme_screenshot_shows_the_ui_as_it_is_now(tmp_path):
    app = _app(tmp_path)
    with Image.open(SCREENSHOT) as picture:
        pictured = picture.text.get(SIGNATURE_KEY)
        pictured_tabs = picture.text.get("tabs", "")
    assert pictured == signature(app), (
        f"docs/screenshot.png shows another layout (tabs {pictured_tabs!r}; now {', '.join(tabs(app))}): run "
        "`.venv/bin/python scripts/screenshot.py` and commit the new picture")


def test_the_signature_follows_the_layout_not_the_values(tmp_path):
    app = _app(tmp_path)
    assert "tabitem# txt2img" in describe(app) and tabs(app)[0] == "txt2img"
    assert signature(_app(tmp_path / "other", model="another-model")) == signature(app)  # values do not count
    import gradio as gr

    with app:
        gr.Button("one more button")
    assert signature(app) != signature(_app(tmp_path))
