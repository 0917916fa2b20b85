"""The Settings tab (A1111's, for the defaults users change once): Sampler, Schedule type, Steps, the live preview
interval, the RNG source, the SD VAE and the images' file name pattern (filename_pattern.py), with Apply and "Reset
to the documented defaults".

Saved per browser and login as the remembered values are (ui/remembered.py: gradio's BrowserState in the browser's
localStorage, encrypted with the server's key, under the `--gradio-auth` login): no other browser, login or API
client sees them. Apply checks every value as the request does (one refused value changes nothing and says why),
keeps them in this browser and puts them in txt2img's, img2img's and Inpaint's controls (Sampler, Schedule type,
Steps, the live preview interval) and the page's RNG source and SD VAE boxes; a page load does the same, before
the remembered last values of txt2img and img2img come back over them (ui/remembered.py), so the last values a
browser used win over its defaults. Steps 0 leaves Steps to the model family's defaults (ui/family_defaults.py).

The file name pattern is not a control of the tabs: this browser's page (its gradio session) keeps it in
`ctx.filename_patterns`, which its jobs take (TabContext.run_job), so the tabs' API signatures stay as they were. The
styles file is the server's (`--styles-file`), not set here.

(No `from __future__ import annotations`: gradio finds `gr.Request` through real annotations.)
"""

import logging

import gradio as gr

from lowvram_gen.errors import LowVramError
from lowvram_gen.filename_pattern import TAGS, check_pattern
from lowvram_gen.models import vae
from lowvram_gen.request import MAX_STEPS, GenerationRequest
from lowvram_gen.rng import DEFAULT as DEFAULT_RNG, SOURCES, WORDS, check_rng
from lowvram_gen.samplers import DEFAULT as DEFAULT_SAMPLER, SAMPLERS
from lowvram_gen.schedules import AUTOMATIC
from lowvram_gen.ui import family_defaults, live, remembered, vae_picker
from lowvram_gen.ui.context import TabContext, check_preview_every, client_key
from lowvram_gen.ui.widgets import ScheduleType, Slider

log = logging.getLogger(__name__)
STORAGE_KEY = "lowvram-gen-settings"  # the browser's localStorage key
SD_TABS = ("txt2img", "img2img", "inpaint")
# the documented defaults (GenerationRequest's, the live preview's, the page's): what Reset puts back
DEFAULTS = {"sampler": DEFAULT_SAMPLER, "schedule_type": AUTOMATIC, "steps": 0, "preview_every": live.DEFAULT_EVERY,
            "rng": DEFAULT_RNG, "vae": vae.AUTOMATIC, "filename_pattern": ""}
NAMES = tuple(DEFAULTS)
PER_TAB = ("sampler", "schedule_type", "steps", "preview_every")  # set in each SD tab's controls


def check(values: dict) -> dict:
    """The settings as the request takes them; LowVramError naming the first value it refuses."""
    request = GenerationRequest(sampler=values["sampler"] or DEFAULT_SAMPLER,
                                schedule_type=values["schedule_type"] or AUTOMATIC).validated()
    steps = int(values["steps"] or 0)
    if steps:
        GenerationRequest(steps=steps).validated()
    return {"sampler": values["sampler"] or DEFAULT_SAMPLER, "schedule_type": request.schedule_type, "steps": steps,
            "preview_every": check_preview_every(values["preview_every"]),
            "rng": check_rng(values["rng"] or DEFAULT_RNG),
            "vae": values["vae"] if values["vae"] in vae_picker.choices() else _refuse_vae(values["vae"]),
            "filename_pattern": check_pattern(values["filename_pattern"] or "")}


def _refuse_vae(value):
    from lowvram_gen.errors import InvalidRequest

    raise InvalidRequest("SD VAE", value, "one of " + ", ".join(vae_picker.choices()))


def build(ctx: TabContext) -> None:
    with gr.Tab("Settings", id="settings"):
        gr.Markdown("Defaults you change once, kept in this browser (and login) only. **Apply** puts them in "
                    "txt2img, img2img and Inpaint now and on every visit; the last values a tab used come back over "
                    "them.")
        with gr.Row():
            sampler = gr.Dropdown([DEFAULT_SAMPLER, *SAMPLERS], value=DEFAULTS["sampler"], label="Sampler",
                                  elem_id="settings-sampler")
            schedule = ScheduleType("settings-schedule-type", DEFAULTS["schedule_type"])
            steps = Slider(0, MAX_STEPS, value=DEFAULTS["steps"], step=1, label="Steps (0: the model family's)",
                           elem_id="settings-steps")
            every = Slider(0, MAX_STEPS, value=DEFAULTS["preview_every"], step=1,
                           label="Live preview every N steps (0: off)", elem_id="settings-preview-every")
        with gr.Row():
            rng = gr.Radio([(WORDS[s], s) for s in SOURCES], value=DEFAULTS["rng"],
                           label="Random number generator source", elem_id="settings-rng")
            sd_vae = gr.Dropdown(vae_picker.choices(), value=DEFAULTS["vae"], label="SD VAE",
                                 allow_custom_value=True, elem_id="settings-vae")
        pattern = gr.Textbox(DEFAULTS["filename_pattern"], label="Images filename pattern (empty: counter-seed-prompt)",
                             info="after the counter; tags: " + ", ".join(f"[{t}]" for t in TAGS),
                             elem_id="settings-filename-pattern")
        with gr.Row():
            apply = gr.Button("Apply", variant="primary", elem_id="settings-apply")
            reset = gr.Button("Reset to the documented defaults", elem_id="settings-reset")
        said = gr.Markdown("", elem_id="settings-said")
    ctx.controls["settings"] = dict(zip(NAMES, (sampler, schedule, steps, every, rng, sd_vae, pattern)))
    ctx.later(lambda: _wire(ctx, apply, reset, said))


def _targets(ctx: TabContext) -> list:
    """The components a setting goes to: each SD tab's Sampler, Schedule type, Steps, live preview interval, then
    the page's RNG source and SD VAE."""
    out = [ctx.controls[tab][name] for tab in SD_TABS if tab in ctx.controls for name in PER_TAB]
    return out + [ctx.page_controls[name] for name in ("rng", "vae") if name in ctx.page_controls]


def _to_targets(ctx: TabContext, values: dict) -> list:
    steps = values["steps"] or None  # 0: each tab's slider stays as its Model box set it
    per_tab = [values["sampler"], values["schedule_type"], gr.update() if steps is None else steps,
               values["preview_every"]]
    tabs = [v for tab in SD_TABS if tab in ctx.controls for v in per_tab]
    return tabs + [values[name] for name in ("rng", "vae") if name in ctx.page_controls]


def _user(request) -> str:
    return getattr(request, "username", None) or ""


def _wire(ctx: TabContext, apply, reset, said) -> gr.State:
    store = remembered.browser_state(STORAGE_KEY)
    mine = ctx.controls["settings"]
    boxes = [mine[n] for n in NAMES]
    targets = _targets(ctx)

    def applied(stored, request: gr.Request, *values):
        try:
            checked = check(dict(zip(NAMES, values)))
        except (LowVramError, TypeError, ValueError) as exc:  # unqueued: said in the tab, never raised
            return [gr.skip(), f"Not applied: {exc}", *(gr.skip() for _ in targets)]
        stored = dict(stored) if isinstance(stored, dict) else {}
        stored[_user(request)] = checked
        ctx.filename_patterns[client_key(request)] = checked["filename_pattern"]
        return [stored, "Applied, and kept in this browser.", *_to_targets(ctx, checked)]

    def reset_all(stored, request: gr.Request):
        stored = dict(stored) if isinstance(stored, dict) else {}
        stored.pop(_user(request), None)
        ctx.filename_patterns.pop(client_key(request), None)
        values = dict(DEFAULTS)
        first = family_defaults.start(ctx.options.model)
        tabs = _to_targets(ctx, {**values, "steps": first.steps})
        return [stored, "Reset to the documented defaults.", *(values[n] for n in NAMES), *tabs]

    def restore(stored, request: gr.Request):
        saved = stored.get(_user(request)) if isinstance(stored, dict) else None
        if not isinstance(saved, dict):
            return [gr.skip() for _ in boxes + targets]
        try:
            checked = check({**DEFAULTS, **{k: v for k, v in saved.items() if k in DEFAULTS}})
        except (LowVramError, TypeError, ValueError) as exc:  # stored by an older version, or edited in the browser: not used
            log.warning("not restoring this browser's settings the request would refuse: %s", exc)
            return [gr.skip() for _ in boxes + targets]
        ctx.filename_patterns[client_key(request)] = checked["filename_pattern"]
        return [*(checked[n] for n in NAMES), *_to_targets(ctx, checked)]

    apply.click(_applied_entry(applied), [store, *boxes], [store, said, *targets], queue=False,
                api_visibility="private", show_progress="hidden")
    reset.click(reset_all, [store], [store, said, *boxes, *targets], queue=False, api_visibility="private",
                show_progress="hidden")
    ctx.settings_loaded = ctx.app.load(restore, [store], [*boxes, *targets], queue=False, api_visibility="private")
    return store


def _applied_entry(applied):
    """`applied(stored, request, *values)` as gradio calls it: the request by its annotation, after the values."""
    def entry(stored, *values, request: gr.Request = None):
        return applied(stored, request, *values)

    return entry
