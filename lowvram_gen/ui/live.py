"""The live preview of txt2img and img2img (A1111's "Live previews"), and the job's Interrupt and Skip buttons.

Settings, in each tab under its other settings: "Live preview every N steps" (0: off; A1111's default display period is
10) and the method (lowvram_gen/preview.py: auto, approx, taesd, off), remembered per browser like the other
controls (ui/remembered.py checks them with `SETTINGS`).

While this browser's job runs, an image above the gallery shows the job's latest preview (jobs/registry.py
Job.preview), and the line under Interrupt and Skip its progress (Job.line: the jobs ahead of it, or step, batch i/n
and ETA): Generate shows the preview and starts a timer that ticks every REFRESH_S, each tick sends the progress line
and the newest preview (nothing when there is none newer), and the end of the job hides the preview, empties the
line and stops the timer. The Generate event's
outputs stay as they were (gallery, parameters, what ran, seed), so an API client's results keep their places;
an API call that passes no interval makes no previews (nobody would see them).

(No `from __future__ import annotations`: gradio finds `gr.Request` through real annotations.)
"""

import html

import gradio as gr

from lowvram_gen.jobs.progress import waiting
from lowvram_gen.preview import METHODS, check_method
from lowvram_gen.request import MAX_STEPS
from lowvram_gen.ui.context import TabContext, check_preview_every, client_key
from lowvram_gen.ui.widgets import Slider

REFRESH_S = 0.5  # how often a running job's browser asks for a newer preview
DEFAULT_EVERY = 10  # A1111's live preview display period
# the UI-only settings ui/remembered.py keeps with the request's fields, and how each is checked
SETTINGS = {"preview_every": check_preview_every, "preview_method": check_method}


def settings(prefix: str) -> tuple:
    """The tab's live preview settings: (every N steps, method)."""
    with gr.Row():
        every = Slider(0, MAX_STEPS, value=DEFAULT_EVERY, step=1, label="Live preview every N steps (0: off)",
                       elem_id=f"{prefix}preview-every")
        method = gr.Dropdown(list(METHODS), value="auto", label="Live preview method",
                             info="auto: TAESD when its weights are in models/VAE-approx or the HF cache, "
                                  "else the approximation", elem_id=f"{prefix}preview-method")
    method.preprocess = lambda payload: payload  # an API client's other value reaches check_method, which names it
    return every, method


def buttons(prefix: str, generate_id: str) -> tuple:
    """Generate (big), and under it Interrupt (stops the job at the next step and keeps that image; its elem_id
    stays `cancel`) and Skip (stops the running batch, keeps it, goes on with the next): the top row's right
    column (ui/form.py)."""
    go = gr.Button("Generate", variant="primary", size="lg", elem_id=generate_id, elem_classes=["lowvram-generate"])
    with gr.Row():
        stop = gr.Button("Interrupt", variant="stop", size="sm", elem_id=f"{prefix}cancel", min_width=70)
        skip = gr.Button("Skip", size="sm", elem_id=f"{prefix}skip", min_width=50)
    return go, stop, skip


def progress_line(prefix: str) -> gr.HTML:
    """Where a running job's progress is drawn, under Interrupt and Skip (the Generate event shows its progress
    here only: ui/form.py): one line, step, `batch i/n` and ETA, or the jobs it waits behind (jobs/progress.py)."""
    return gr.HTML("", min_height=60, padding=False, elem_id=f"{prefix}progress", elem_classes=["lowvram-progress"])


def image(prefix: str) -> tuple:
    """The preview above the gallery, hidden until a job runs with previews, with the timer that refreshes it and
    how many previews of the job this browser has shown (made in the tab's layout, where the page mounts them)."""
    shown_image = gr.Image(label="Live preview", type="pil", format="jpeg", interactive=False, visible=False,
                           elem_id=f"{prefix}live-preview")
    return shown_image, gr.Timer(REFRESH_S, active=False), gr.State(0)


def line_html(line: str) -> str:
    """The progress line as the page's HTML element shows it (escaped: it may name a prompt's LoRA one day)."""
    return f'<div class="lowvram-progress-line">{html.escape(line)}</div>' if line else ""


def progress_text(ctx: TabContext, key: str) -> str:
    """This browser's job's progress line; before its job is registered (it waits in gradio's queue behind
    another browser's job), how many jobs are ahead of it: every job not done, of the web UI's and the API's."""
    job = ctx.jobs.get(key)
    if job is not None:
        return job.line
    ahead = ctx.jobs.ahead(key)
    return waiting(ahead) if ahead else ""


def shown_while_running(ctx: TabContext, go: gr.Button, every, method, preview: tuple, line: gr.HTML) -> None:
    """Generate starts the timer that refreshes the progress `line` (ui/form.py) and shows the preview (`image()`'s)
    when previews are on. Wired BEFORE the Generate event: the page runs the listeners of one click in the order
    they were added, each after the one before has ended, so a listener added after Generate would only run once
    the job is over. (The line is the page's own, not gradio's progress: gradio drew it on every output (the gallery,
    the parameters, What ran), and only until the handler's next yield, which comes at every tick; the Generate event
    hides gradio's.)"""
    shown_image, timer, shown = preview

    def start(every_n, how):
        on = bool(every_n) and how != "off"
        return gr.Image(value=None, visible=on), gr.Timer(active=True), 0, ""

    def refresh(count, request: gr.Request):
        key = client_key(request)
        text = line_html(progress_text(ctx, key))
        job = ctx.jobs.get(key)
        if job is None or job.preview is None or job.previews == count:
            return gr.skip(), gr.skip(), text
        return job.preview, job.previews, text

    go.click(start, [every, method], [shown_image, timer, shown, line], queue=False, api_visibility="private",
             show_progress="hidden")
    timer.tick(refresh, [shown], [shown_image, shown, line], queue=False, api_visibility="private",
               show_progress="hidden")


def wire(ctx: TabContext, event, stop: gr.Button, skip: gr.Button, summary, preview: tuple, line: gr.HTML) -> None:
    """Interrupt, Skip, and the end of the live preview and the progress line of the job the Generate `event` runs:
    hidden and emptied, the timer stopped."""
    shown_image, timer, _ = preview

    def end():
        return gr.Image(visible=False), gr.Timer(active=False), ""

    event.then(end, None, [shown_image, timer, line], queue=False, api_visibility="private", show_progress="hidden")
    stop.click(ctx.cancel, None, [summary], queue=False, api_visibility="private")
    skip.click(ctx.skip, None, None, queue=False, api_visibility="private")
