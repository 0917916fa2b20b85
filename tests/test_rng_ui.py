"""Issue 31 item 5 in the web UI: the page's "Random number generator source" setting (ui/rng_setting.py) reaches
every SD tab's job, and a PNG sent to a tab sets it (RNG: NV to NV; none, as A1111 reads none, to GPU). No browser:
the radio's handler, the job's request and the send's values are checked in process."""

from __future__ import annotations

from pathlib import Path

import gradio as gr
import pytest
from PIL import Image
from PIL.PngImagePlugin import PngInfo

from lowvram_gen.errors import InvalidRequest
from lowvram_gen.ui import rng_setting, sendto
from lowvram_gen.ui.context import TabContext, UiOptions


def _png_with(path: Path, parameters: str) -> str:
    info = PngInfo()
    info.add_text("parameters", parameters)
    Image.new("RGB", (64, 64)).save(path, pnginfo=info)
    return str(path)


def test_a_send_sets_the_rng_source_from_the_png_and_gpu_without_it(tmp_path):
    text = "a fox\nSteps: 2, Sampler: Euler a, CFG scale: 7, Seed: 5, Size: 64x64, Model: tiny"
    nv = _png_with(tmp_path / "nv.png", text + ", RNG: NV")
    plain = _png_with(tmp_path / "plain.png", text)
    for keys in (sendto.TXT2IMG, sendto.IMG2IMG, sendto.INPAINT):
        at = keys.index("rng")
        values, said = sendto.values_for(keys, nv)
        assert values[at] == "nv" and not any("RNG" in line for line in said)
        assert sendto.values_for(keys, plain)[0][at] == "gpu"


class _Recording:
    """A session that records the request of each job and makes no image."""

    def __init__(self):
        self.requests = []

    def generate(self, request, **_):
        self.requests.append(request)
        raise InvalidRequest("job", "recorded", "the test stops here")


def _run(ctx, fields):
    """One txt2img job through the tab context, to the session (which stops it: the UI says so, as an API call)."""
    with pytest.raises(gr.Error, match="the test stops here"):
        for _ in ctx.run_job("txt2img", dict(prompt="a fox", width=64, height=64, steps=1, **fields), None,
                             lambda *_, **__: None):
            pass


def test_the_radio_sets_the_page_setting_every_sd_tabs_job_takes(tmp_path):
    session = _Recording()
    with gr.Blocks() as app:
        ctx = TabContext(session=session, options=UiOptions(outdir=str(tmp_path)), app=app)
        box = rng_setting.row(ctx)
    assert ctx.page_controls["rng"] is box and box.value == "gpu"
    assert [value for _, value in box.choices] == ["gpu", "cpu", "nv"]
    handler = next(f for f in app.fns.values() if box in f.inputs).fn
    handler("nv")
    assert ctx.rng == "nv"
    _run(ctx, {})
    assert [r.rng for r in session.requests] == ["nv"]
    _run(ctx, {"rng": "cpu"})  # a field the job itself gives wins over the page's
    assert session.requests[-1].rng == "cpu"
