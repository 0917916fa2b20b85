"""The Gradio app: one Blocks, one TabContext, and each tab's `build(ctx)` (ui/tabs/, one module a tab).

Every GPU action (generate, upscale, free VRAM) is in the concurrency group "gpu" with a limit of 1, and
the queue has a maximum size (Gradio answers "queue is full" past it). Errors from the Python API reach
the user with CLI flags named as the UI's controls (ui/messages.py): a failed job's in its "What ran" box (and a
toast), other errors as a `gr.Error`, HTML-escaped for the browser only; an API client gets a gr.Error either way.
Only handlers that raise nothing for the user run unqueued: gradio shows no error of an unqueued event.

Tabs have ids (txt2img, img2img, inpaint, video, upscale, pnginfo, browser, ...) so a "Send to" button can select one;
Ctrl+Enter (Cmd+Enter on a Mac) in a prompt box clicks its tab's Generate, as in A1111.
"""

import json

import gradio as gr

from lowvram_gen.session import Session
from lowvram_gen.ui import remembered, rng_setting, vae_picker
from lowvram_gen.ui.context import TabContext, UiOptions
from lowvram_gen.jobs.registry import Registry
from lowvram_gen.ui.tabs import browser, img2img, inpaint, pnginfo, settings, system, txt2img, upscale, video, vqgan

# in this order: System plans txt2img's inputs, Settings sets the SD tabs' controls
TABS = (txt2img, img2img, inpaint, video, upscale, pnginfo, browser, vqgan, system, settings)
# prompt box elem_id -> the Generate button Ctrl+Enter clicks
GENERATE_KEYS = {"prompt": "generate", "negative": "generate", "i2i-prompt": "i2i-generate",
                 "i2i-negative": "i2i-generate", "inp-prompt": "inp-generate", "inp-negative": "inp-generate",
                 "vid-prompt": "vid-generate", "vid-negative": "vid-generate"}
CTRL_ENTER = """() => {
  if (window.lowvramCtrlEnter) return;
  window.lowvramCtrlEnter = true;
  const buttons = %s;
  document.addEventListener("keydown", (e) => {
    if (e.key !== "Enter" || !(e.ctrlKey || e.metaKey) || !e.target.closest) return;
    const box = e.target.closest(Object.keys(buttons).map((id) => "#" + id).join(","));
    const button = box && document.getElementById(buttons[box.id]);
    if (!button) return;
    e.preventDefault();
    button.click();
  }, true);
}"""


def build_app(session: Session, options: UiOptions, jobs: Registry | None = None) -> gr.Blocks:
    """The app; `jobs`: the registry of running jobs, shared with the A1111 API when it is on (a new one without)."""
    with gr.Blocks(title="lowvram-gen") as app:
        gr.Markdown("# lowvram-gen\nStable Diffusion on small GPUs: a preset per job, and out-of-memory "
                    "recovery that finishes the job. The embedded `tiny` model has random weights and makes "
                    "abstract noise: pick a real model for real images.")
        ctx = TabContext(session=session, options=options, app=app, jobs=jobs if jobs is not None else Registry())
        with gr.Row():  # A1111's quicksettings row: above the tabs, for every SD tab
            ctx.page_controls["vae"] = vae_picker.row(ctx)  # SD VAE
            rng_setting.row(ctx)  # Random number generator source
            gr.Column(scale=1, min_width=0)
        with gr.Tabs() as ctx.tabs:
            for tab in TABS:
                tab.build(ctx)
        for wire in ctx.wiring:
            wire()
        remembered.wire(app, ctx.controls, ctx.generate_events, after=ctx.settings_loaded)
        app.load(None, None, None, js=CTRL_ENTER % json.dumps(GENERATE_KEYS))
        app.unload(ctx.disconnected)
    app.queue(max_size=options.queue_size, default_concurrency_limit=1)
    return app


def allowed_paths(outdir: str) -> list[str]:
    """The one folder the UI serves files from: the output folder, or `outputs/` for a date folder of A1111's
    layout (the Image Browser shows the other days' folders: output_browser.browse_root)."""
    from lowvram_gen.output_browser import browse_root

    return [str(browse_root(outdir))]


__all__ = ["UiOptions", "allowed_paths", "build_app"]
