"""The controls txt2img, img2img and Inpaint share, built by one builder so the three tabs cannot drift apart:
the top row (prompt and negative prompt on the left, each with A1111's token counter under it
(ui/token_counter.py); Generate, big, with Interrupt and Skip and the Generate forever box (ui/forever.py) under it on
the right,
as A1111 and Forge have them: on screen without scrolling at 1366x768, and the live preview stays in view while a job
runs), Width/Height with ⇅ (swap them), Batch count and Batch size, Steps/CFG scale/Clip skip, the seed row (Seed,
♻ last seed, 🎲 random, Extra, Sampler, Schedule type) with the Extra seed options, the Model box with Refresh and
Quantize, the LoRA/embedding pickers, the extra-network cards under the prompts (ui/cards.py), hires fix (txt2img), the ControlNet accordion, the live preview's settings,
and the results column (ui/results.py). The job's progress is drawn once, under Interrupt and Skip: one line with
the step, `batch i/n` and the ETA, or how many jobs it waits behind (jobs/progress.py).

Every control starts at `GenerationRequest()`'s value of its field (the documented defaults, the CLI's and the
API's), and a Generate handler turns an API client's left-out value (None) back into that default (`job_fields`);
Steps and CFG scale start at the UI model's family's defaults and follow the Model box (ui/family_defaults.py), and
an API client's left-out steps or CFG stay None: the model family's, as the CLI's.
Each control is registered under its request field in `SdForm.controls`, which becomes the tab's
`ctx.controls[tab]`: what a Send to fills (ui/sendto.py) and what each browser gets back (ui/remembered.py).

A tab builds its page by calling the form's parts in the page's order (`note`, `top`, then in the left column its
own controls (img2img's init image, Inpaint's editor and mask options) and `settings`, in the right one `results`),
then `generate` wires its Generate button to the tab's handler, with the handler's inputs in the API's positional
order (the ControlNet units last: ui/controlnet.py), and ♻, 🎲 and ⇅.
The elem_ids are `{prefix}name` (txt2img's prefix is "", img2img's "i2i-", Inpaint's "inp-").
"""

from __future__ import annotations

from typing import Any

import gradio as gr

from lowvram_gen.control.resize import INIT_RESIZE
from lowvram_gen.request import (MAX_BATCH, MAX_BATCH_COUNT, MAX_CFG, MAX_CLIP_SKIP, MAX_HIRES_SCALE, MAX_STEPS,
                                 SAME_SAMPLER, SAME_SCHEDULER, GenerationRequest)
from lowvram_gen.samplers import DEFAULT, NOT_A1111, SAMPLERS
from lowvram_gen.schedules import SCHEDULE_TYPES
from lowvram_gen.ui import (cards, controlnet, family_defaults, forever, live, pickers, results, sendto, styles,
                            token_counter)
from lowvram_gen.ui.context import GPU, TabContext
from lowvram_gen.ui.widgets import (Number, ScheduleType, Slider, quantize_field, seed_buttons, seed_extras,
                                   swap_button, upscaler_choices)

DEFAULTS = GenerationRequest()


class SdForm:
    """One tab's shared controls, by request field (`controls`), and the parts of its page that are not controls
    (the sent note, the buttons, the results column). `unnamed`: names of controls built without an elem_id
    (img2img and Inpaint never gave Batch size and CFG scale one; kept so their layout, which
    docs/screenshot.png's signature and the browser tests read, stays as it was)."""

    def __init__(self, ctx: TabContext, tab: str, prefix: str, unnamed: tuple[str, ...] = ()):
        self.ctx, self.tab, self.prefix, self.unnamed = ctx, tab, prefix, unnamed
        self.controls: dict[str, Any] = {}
        self.units: dict[str, Any] = {}  # the ControlNet units' controls (also in `controls`)
        # set by the parts as they are built: the sent note, ♻ last seed, 🎲, ⇅, 📐, the buttons and the progress
        # line, the results column
        self.sent = self.reuse = self.random = self.swap = self.size_button = None
        self.go = self.stop = self.skip = self.progress = self.out = None
        self.cards = None  # the extra-network cards under the prompts (ui/cards.py), built by `top`
        self.forever = None  # the Generate forever checkbox (ui/forever.py)
        self.counters: dict[str, tuple] = {}  # prompt field -> its token counter (ui/token_counter.py)

    def _id(self, name: str) -> str | None:
        return None if name in self.unnamed else f"{self.prefix}{name}"

    def note(self) -> None:
        """The note of what the tab's last Send to did not use (at the top of the tab)."""
        self.sent = sendto.note(self.tab)

    def top(self, lines: int, negative_lines: int) -> None:
        """The top row: the prompts, and Generate with Interrupt and Skip beside them."""
        with gr.Row(equal_height=False):
            with gr.Column(scale=5):
                self.prompts(lines, negative_lines)
            with gr.Column(scale=1, min_width=160):
                self.go, self.stop, self.skip = live.buttons(self.prefix, f"{self.prefix}generate")
                self.forever = forever.checkbox(self.prefix)
                self.progress = live.progress_line(self.prefix)
        self.cards = cards.Cards(self.prefix, self.ctx.options.models_folder)  # under the prompts, as in A1111
        self.cards.build()

    def prompts(self, lines: int, negative_lines: int) -> None:
        self.controls["prompt"] = gr.Textbox(value=DEFAULTS.prompt, label="Prompt", lines=lines,
                                             elem_id=self._id("prompt"))
        self.counters["prompt"] = token_counter.box(f"{self.prefix}prompt-tokens")
        self.controls["negative_prompt"] = gr.Textbox(value=DEFAULTS.negative_prompt, label="Negative prompt",
                                                      lines=negative_lines, elem_id=self._id("negative"))
        self.counters["negative_prompt"] = token_counter.box(f"{self.prefix}negative-tokens")
        self.controls["styles"] = styles.row(self.ctx, self.prefix, self.controls["prompt"],
                                             self.controls["negative_prompt"])

    def strength(self, label: str) -> None:
        """img2img's and Inpaint's Denoising strength, and A1111's img2img_fix_steps setting under it."""
        self.controls["strength"] = Slider(0, 1, value=DEFAULTS.strength, step=0.01, label=label,
                                           elem_id=self._id("strength"))
        self.controls["img2img_fix_steps"] = gr.Checkbox(
            DEFAULTS.img2img_fix_steps, label="Do exactly the amount of steps the slider specifies",
            info="A1111's setting: off runs int(Steps x strength) + 1 (10 at 0.5: 6), as A1111 does by default",
            elem_id=self._id("fix-steps"))

    def resize_mode(self, latent: bool = True) -> None:
        """A1111's img2img "Resize mode" radio, above the size: how an init image of another aspect meets Width x
        Height (control/resize.py). `latent`: offer "Just resize (latent upscale)" (Inpaint does not: refused with
        a mask)."""
        choices = [(label, key) for key, label in INIT_RESIZE.items() if latent or key != "latent"]
        self.controls["resize_mode"] = gr.Radio(choices, value=DEFAULTS.resize_mode, label="Resize mode",
                                                elem_id=self._id("resize-mode"))

    def settings(self, *, size_from_image: bool = False, model_label: str = "Model", hires: bool = False,
                 tiling: bool = False, refiner: bool = False) -> None:
        """Everything from the size row to the live preview's settings. `size_from_image`: A1111's 📐 beside
        Width/Height (`size_button`, the tab wires it). `tiling`: A1111's Tiling checkbox beside Extra. `refiner`:
        A1111's Refiner accordion (engines/sd/refiner.py), after Hires fix. ♻ last seed,
        🎲 and ⇅ are wired by `generate` (♻ needs the results column)."""
        c, prefix = self.controls, self.prefix
        with gr.Row():
            c["width"] = Number("Width", DEFAULTS.width, elem_id=self._id("width"))
            c["height"] = Number("Height", DEFAULTS.height, elem_id=self._id("height"))
            self.swap = gr.Button("⇅", elem_id=f"{prefix}swap-size", scale=0, min_width=40)
            if size_from_image:  # the size of the image being edited again, after Width/Height were changed
                self.size_button = gr.Button("\U0001F4D0", elem_id=self._id("size-from-image"), scale=0,
                                             min_width=40)
            c["batch_count"] = Slider(1, MAX_BATCH_COUNT, value=DEFAULTS.batch_count, step=1, label="Batch count",
                                      elem_id=self._id("batch-count"))
            c["batch_size"] = Slider(1, MAX_BATCH, value=DEFAULTS.batch_size, step=1, label="Batch size",
                                     elem_id=self._id("batch"))
        first = family_defaults.start(self.ctx.options.model)  # the UI model's family's steps and CFG scale
        with gr.Row():
            c["steps"] = Slider(1, MAX_STEPS, value=first.steps, step=1, label="Steps", elem_id=self._id("steps"))
            c["cfg_scale"] = Slider(0, MAX_CFG, value=first.cfg, step=0.5, label="CFG scale",
                                    elem_id=self._id("cfg"))
            # A1111 ignores clip skip on SDXL; we act on it as Forge does (README): said where it is set
            c["clip_skip"] = Slider(1, MAX_CLIP_SKIP, value=DEFAULTS.clip_skip, step=1, label="Clip skip (1: off)",
                                    info="on SDXL as Forge's (3+ acts); A1111 ignores it on SDXL",
                                    elem_id=self._id("clip-skip"))
        with gr.Row():
            c["seed"] = Number("Seed (-1: random)", DEFAULTS.seed, elem_id=self._id("seed"))
            with gr.Column(scale=0, min_width=110):  # words beside the emoji: a machine without an emoji font
                self.reuse = gr.Button("♻ last seed", size="sm", elem_id=f"{prefix}reuse-seed")
                self.random = gr.Button("🎲 random", size="sm", elem_id=f"{prefix}random-seed")
            c["seed_extra"] = gr.Checkbox(False, label="Extra", elem_id=self._id("seed-extra"))
            if tiling:  # engines/sd/tiling.py
                c["tiling"] = gr.Checkbox(DEFAULTS.tiling, label="Tiling", info="seamless texture (SD, SDXL)",
                                          elem_id=self._id("tiling"))
            c["sampler"] = gr.Dropdown([DEFAULT, *SAMPLERS], value=DEFAULTS.sampler, label="Sampler",
                                       info="default: DPM++ 2M for SD/SDXL (A1111's); the model's own for SD3, Flux; "
                                            + ", ".join(sorted(NOT_A1111)) + ": diffusers' own, not A1111's",
                                       elem_id=self._id("sampler"))
            c["schedule_type"] = ScheduleType(self._id("schedule-type"), DEFAULTS.schedule_type)
        c.update(zip(sendto.EXTRA_SEED[1:], seed_extras(c["seed_extra"], prefix, DEFAULTS)))
        c["model"], c["quantize"] = pickers.model_row(self.ctx.options, prefix, model_label)
        family_defaults.wire(c["model"], c["steps"], c["cfg_scale"], first)
        pickers.build(c["prompt"], prefix=prefix)
        if self.cards is not None:
            self.cards.wire(c["prompt"], c["model"])
        if hires:
            self._hires()
        if refiner:
            self._refiner()
        self.units = controlnet.build(prefix, c["width"], c["height"])
        c.update(self.units)
        c["preview_every"], c["preview_method"] = live.settings(prefix)

    def _refiner(self) -> None:
        """A1111 1.6's Refiner accordion: the checkpoint (the models list, or a typed hub id / path; empty: none) and
        Switch at (the fraction of the sampling before the refiner takes over; 1: none)."""
        c = self.controls
        with gr.Accordion("Refiner", open=False, elem_id=self._id("refiner-accordion")):
            with gr.Row():
                c["refiner"] = gr.Dropdown(["", *pickers.model_choices(self.ctx.options.models_folder)], value="",
                                           allow_custom_value=True, label="Checkpoint (empty: no refiner)",
                                           elem_id=self._id("refiner"))
                c["refiner_switch_at"] = Slider(0.01, 1, value=DEFAULTS.refiner_switch_at, step=0.01,
                                                label="Switch at", elem_id=self._id("refiner-switch-at"))

    def _hires(self) -> None:
        """Hires fix's accordion (A1111 1.10's controls): its own sampler, schedule type, CFG scale and prompts start
        at "the first pass's" (the request's "" and 0)."""
        c = self.controls
        with gr.Accordion("Hires fix (a second pass at a larger size)", open=False):
            with gr.Row():
                c["hires_scale"] = Slider(1, MAX_HIRES_SCALE, value=DEFAULTS.hires_scale, step=0.05,
                                          label="Upscale by (1: off)", elem_id=self._id("hires-scale"))
                c["hires_upscaler"] = gr.Dropdown(upscaler_choices(hires=True), value=DEFAULTS.hires_upscaler,
                                                  allow_custom_value=True, label="Upscaler",
                                                  elem_id=self._id("hires-upscaler"))
            with gr.Row():
                c["hires_steps"] = Slider(0, MAX_STEPS, value=DEFAULTS.hires_steps, step=1,
                                          label="Hires steps (0: same)")
                c["hires_denoise"] = Slider(0, 1, value=DEFAULTS.hires_denoise, step=0.01,
                                            label="Denoising strength")
            with gr.Row():  # A1111's "Resize width to" / "Resize height to": they win over Upscale by
                c["hires_resize_w"] = Slider(0, 2048, value=DEFAULTS.hires_resize_w, step=8,
                                             label="Resize width to (0: by the scale)",
                                             elem_id=self._id("hires-resize-w"))
                c["hires_resize_h"] = Slider(0, 2048, value=DEFAULTS.hires_resize_h, step=8,
                                             label="Resize height to (0: by the scale)",
                                             elem_id=self._id("hires-resize-h"))
            with gr.Row():  # the request's "" is A1111's "Use same ..." choice
                sampler = gr.Dropdown([SAME_SAMPLER, DEFAULT, *SAMPLERS], value=DEFAULTS.hires_sampler or SAME_SAMPLER,
                                      label="Hires sampler", elem_id=self._id("hires-sampler"))
                sampler.preprocess = lambda payload: payload  # an API client's value: our validation's
                schedule = gr.Dropdown(
                    [SAME_SCHEDULER, *((label, key) for key, (label, _) in SCHEDULE_TYPES.items())],
                    value=DEFAULTS.hires_schedule_type or SAME_SCHEDULER, label="Hires schedule type",
                    elem_id=self._id("hires-schedule-type"))
                schedule.preprocess = lambda payload: payload
                c["hires_sampler"], c["hires_schedule_type"] = sampler, schedule
                c["hires_cfg"] = Slider(0, MAX_CFG, value=DEFAULTS.hires_cfg, step=0.5,
                                        label="Hires CFG Scale (0: same)", elem_id=self._id("hires-cfg"))
            with gr.Row():
                c["hires_prompt"] = gr.Textbox(value=DEFAULTS.hires_prompt, label="Hires prompt (empty: the prompt)",
                                               lines=2, elem_id=self._id("hires-prompt"))
                c["hires_negative"] = gr.Textbox(value=DEFAULTS.hires_negative,
                                                 label="Hires negative prompt (empty: the negative prompt)", lines=2,
                                                 elem_id=self._id("hires-negative"))

    def results(self, send_to: tuple[str, ...]) -> results.Results:
        """The results column (call inside the tab's second column); `send_to`: its Send to buttons' tabs."""
        self.out = results.column(self.ctx, self.prefix, self.tab, send_to)
        return self.out

    def generate(self, handler, inputs: list, api_name: str):
        """Register the controls (ctx.controls, the sent note) and wire Generate (its progress: the line under
        Interrupt and Skip, ui/live.py, instead of gradio's on every output), Interrupt, Skip, the live preview,
        ♻ last seed, 🎲 and ⇅. `inputs`: the handler's inputs in its (the API's) positional order, each a request
        field of `controls` or a component of the tab's own; the ControlNet units follow them. Returns the Generate
        event."""
        ctx, c, out = self.ctx, self.controls, self.out
        ctx.sent_notes[self.tab] = self.sent
        ctx.controls[self.tab] = c
        live.shown_while_running(ctx, self.go, c["preview_every"], c["preview_method"], out.preview,
                                 self.progress)  # runs first
        event = self.go.click(
            forever.watched(controlnet.appended(handler)),
            [c[i] if isinstance(i, str) else i for i in inputs] + list(self.units.values()),
            [out.gallery, out.info, out.summary, out.last_seed], api_name=api_name, concurrency_id=GPU,
            concurrency_limit=1, show_progress="hidden")  # the tab's one progress line is ui/live.py's
        ctx.generate_events[self.tab] = event
        live.wire(ctx, event, self.stop, self.skip, out.summary, out.preview, self.progress)
        forever.wire(event, self.forever, self.stop, f"{self.prefix}generate")
        for name, counter in self.counters.items():
            token_counter.wire(ctx.app, c[name], counter, c["steps"], c["model"])
        seed_buttons(self.reuse, self.random, c["seed"], out.last_seed)
        swap_button(self.swap, c["width"], c["height"])
        return event


def job_fields(options, units, *, negative_prompt, sampler, model, quantize, schedule_type, clip_skip, batch_count,
               subseed, subseed_strength, seed_resize_from_w, seed_resize_from_h, **own) -> dict:
    """The request's fields from the shared controls' values (a value an API client left out, None, is the
    request's default; an empty Model box is the UI's model) and the tab's `own` fields as they are."""
    return dict(own, negative_prompt=negative_prompt or DEFAULTS.negative_prompt, sampler=sampler or DEFAULTS.sampler,
                model=model or options.model, quantize=quantize_field(quantize),
                schedule_type=schedule_type or DEFAULTS.schedule_type,
                clip_skip=DEFAULTS.clip_skip if clip_skip is None else clip_skip,
                batch_count=DEFAULTS.batch_count if batch_count is None else batch_count,
                subseed=DEFAULTS.subseed if subseed is None else subseed,
                subseed_strength=subseed_strength or DEFAULTS.subseed_strength,
                seed_resize_from_w=seed_resize_from_w or DEFAULTS.seed_resize_from_w,
                seed_resize_from_h=seed_resize_from_h or DEFAULTS.seed_resize_from_h,
                **controlnet.request_fields(units))
