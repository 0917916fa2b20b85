"""What the UI shows of messages written for the CLI: flags become the UI's controls, and HTML is escaped
for the browser only.

Errors, warnings and summaries come from the Python API, which speaks of CLI flags ("pass --model",
"run with --cpu"). In the web UI they name the control that does the same; where the UI has none
(the device, the starting preset, configs), they say how to start the UI or use the CLI.

gr.Error's message is HTML in the browser's toast, and plain text to an API client (gradio_client):
`error()` escapes it only when the request comes from the browser app (Gradio's JS app sends
`x-gradio-user: app`; gradio_client sends `api`).

A user error is said on the server's console in one line (jobs/console.py), never as a traceback: gradio prints
one for a gr.Error unless it is raised with `print_exception=False`. A failed job tells the browser in its
output panel (`failure()`): a gr.Error would put "Error" badges over the gallery and the parameters.
"""

from __future__ import annotations

import html
import re

import gradio as gr

from lowvram_gen.jobs import console

RESTART = "restart the web UI with `lowvram-gen ui {flag}`"
CLI_ONLY = "the CLI's {flag} (the web UI has {what})"

# Whole phrases first, where a flag-for-control swap would read badly.
PHRASES: dict[str, str] = {
    "pass --model for real images": "pick a real model in the Model box for real images",
    "or leave it out: the preset decides": "or 'as the preset says': the preset decides",  # quantize's
    "give --control-image IMAGE (one per --controlnet, in order; ": "upload its Control image in its ControlNet unit "
                                                                    "(",
}
# flag -> what the web UI calls it. "pass FLAG" becomes "fill in CONTROL" for the UI's own boxes (BOXES).
FLAGS: dict[str, str] = {
    "--vram-budget/--reserve-vram": "the VRAM budget and reserve sliders (System tab)",
    "--vram-budget": "the VRAM budget slider (System tab)",
    "--reserve-vram": "the reserve slider (System tab)",
    "--model": "the Model box",
    "--cpu": "the CPU (" + RESTART.format(flag="--cpu") + ")",
    "--medvram": "the medvram preset (" + RESTART.format(flag="--medvram") + ")",
    "--lowvram": "the lowvram preset (" + RESTART.format(flag="--lowvram") + ")",
    "--novram": "the novram preset (" + RESTART.format(flag="--novram") + ")",
    "--preset": "a starting preset (" + RESTART.format(flag="--preset NAME") + ")",
    "--xformers": "xformers attention (" + RESTART.format(flag="--xformers") + ")",
    "--vqgan-config": CLI_ONLY.format(flag="--vqgan-config", what="no box for it: put the .yaml beside the .ckpt"),
    "--vqgan": "the VQGAN box",
    "--clip": "the CLIP box",
    "--cutn": "the Cutouts slider",
    "--config": CLI_ONLY.format(flag="--config", what="no config box"),
    "--width": "the Width box",
    "--height": "the Height box",
    "--steps": "the Steps slider",
    "--seed": "the Seed box",
    "--sampler": "the Sampler box",
    "--schedule-type": "the Schedule type box",
    "--batch-size": "the Batch size slider",
    "--cfg-scale": "the CFG scale slider",
    "--iterations": "the Iterations slider",
    "--control-image": "a ControlNet unit's Control image",
    "--controlnet": "a ControlNet unit's Model box",
    "--preprocessor": "a ControlNet unit's Preprocessor box",
    "--control-mode": "the ControlNet Control Mode",
}
BOXES = {"--model", "--vqgan", "--clip", "--width", "--height", "--seed", "--sampler", "--schedule-type"}
# a flag as a whole word (not part of a longer one), with a "pass " before it; one pass over the text, so
# a replacement (which may name a CLI flag itself) is never replaced again
_FLAG = re.compile(r"(\bpass )?(?<![\w-])(" + "|".join(re.escape(f) for f in sorted(FLAGS, key=len, reverse=True))
                   + r")(?![\w-])")


def _control(match: re.Match) -> str:
    verb, flag = match.group(1), match.group(2)
    if verb and flag in BOXES:
        return "fill in " + FLAGS[flag]
    return (verb or "") + FLAGS[flag]


def for_ui(text: str) -> str:
    """`text` with each CLI flag replaced by the web UI's control for it."""
    for phrase, said in PHRASES.items():
        text = text.replace(phrase, said)
    return _FLAG.sub(_control, text)


def from_browser(request) -> bool:
    """Whether the request is the browser app's (which renders a gr.Error's message as HTML)."""
    headers = getattr(request, "headers", None)
    return headers is not None and headers.get("x-gradio-user") == "app"


def error(exc: BaseException | str, request=None) -> gr.Error:
    """A gr.Error for a LowVramError (or a message): flags as controls; HTML-escaped for the browser only.
    The console gets one line, not gradio's traceback."""
    text = for_ui(str(exc))
    console.user_error(text)
    return gr.Error(html.escape(text) if from_browser(request) else text, print_exception=False)


def failure(exc: BaseException | str, request=None) -> str:
    """What a job's "What ran" box says when the job failed with a user error (for the browser, which also gets
    it as a toast); an API client gets the gr.Error it always got (raised here).

    The other outputs are left as they were (gr.skip()): raising would mark them all "Error" and hide the
    previous images, and the toast alone fades (A1111 keeps the error in the output panel)."""
    if not from_browser(request):
        raise error(exc, request)
    text = for_ui(str(exc))
    console.user_error(text)
    gr.Warning(html.escape(text), title="Error")
    return text
