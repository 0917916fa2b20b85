"""Issue 32 item 1 in a browser (Debian's Chromium through Playwright, ui_helpers.py): a prompt-edit job typed in
txt2img. `[cat:dog:0.5]` runs with no "not supported" warning, its image differs from both "cat" and "dog" at the
same seed (the embeddings switch half way), the PNG's prompt is the text as typed, and the token counter counts the
longest variant of the schedule (the longer of "cat" and "dog", not the bracketed text)."""

from __future__ import annotations

import numpy as np
from PIL import Image

from lowvram_gen.outputs import read_png_metadata
from lowvram_gen.ui import token_counter
from ui_helpers import _fill_job, _fill_number, _gallery_image, browser, needs_browser, page, server  # noqa: F401

pytestmark = needs_browser
EDIT = "[cat:dog:0.5]"


def _run(page, server, prompt: str) -> np.ndarray:
    """Generate `prompt` (seed 11, 64 px, 4 steps) and return the newest PNG's pixels (checked to be this prompt's)."""
    before = set(server.outdir.rglob("*.png"))
    _fill_job(page, prompt, 64, 64, 4)
    _fill_number(page, "seed", 11)
    page.click("#generate")
    _gallery_image(page)
    page.wait_for_function("(p) => document.querySelector('#info textarea').value.startsWith(p + '\\n')",
                           arg=prompt, timeout=120_000)
    new = sorted(set(server.outdir.rglob("*.png")) - before)
    assert len(new) == 1
    parameters, _ = read_png_metadata(new[0])
    assert parameters.splitlines()[0] == prompt  # the PNG keeps the prompt as typed
    return np.asarray(Image.open(new[0]).convert("RGB"), dtype=np.int16)


def test_a_prompt_edit_job_switches_the_prompt_and_keeps_its_text(page, server):
    edited = _run(page, server, EDIT)
    summary = page.locator("#summary").inner_text() if page.locator("#summary").count() else ""
    assert "not supported" not in summary and "not supported" not in page.locator("#info textarea").input_value()
    tok = token_counter.tokenizer_for("tiny")
    longest = max(token_counter.count(word, tok)[0] for word in ("cat", "dog"))
    page.wait_for_function("(n) => document.querySelector('#prompt-tokens').textContent.trim() === n + '/75'",
                           arg=longest, timeout=30_000)
    cat, dog = _run(page, server, "cat"), _run(page, server, "dog")
    assert np.abs(edited - cat).max() > 0 and np.abs(edited - dog).max() > 0
    assert np.abs(cat - dog).max() > 0  # the two words do give two images on the tiny model
