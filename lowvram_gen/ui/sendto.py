"""Send an image (and what its PNG says) to another tab: PNG Info's and the galleries' "Send to" buttons.

A tab registers its controls in `ctx.controls[tab id]` under the `GenerationRequest` field each one sets;
a send fills them from `infotext.from_png` (the mapping `generate --from-png` uses too) and selects the
tab. What the PNG does not say stays as it is, except hires fix, which is switched off for an image made
without it (or the same seed would not give the same image), and whose own settings (resize, sampler, schedule type,
CFG scale, prompts, steps) go back to "the first pass's" where the PNG has none, the Schedule type, Automatic for a PNG whose
sampler has none, Clip skip, which goes back to 1 for an image without `Clip skip:` (A1111 writes it only
above 1), the page's RNG source, GPU for an image without `RNG:` (A1111 writes it only when not GPU), the Extra seed options, off (and hidden) for an image without `Variation seed strength:` / `Seed resize
from:` and shown with its values for one with them, and Quantize, which goes back to "as the
preset says" for an image whose weights were not int8/int4 (our PNGs write `Quantize:` only when they
were). A model the PNG names that is not here leaves the Model box as it is.

A PNG's ControlNet units (`ControlNet 0: ...`) fill the ControlNet accordion's units, switched on, with their model,
weight, start/end, preprocessor and thresholds (units beyond the PNG's are switched off); their control images are
not in a PNG, so the note says to upload each.

A send fills what it can (`from_png(lenient=True)`): a value this tab cannot use (VQGAN-CLIP's `Sampler: Adam`)
is left out. What was not used, and why, stays on the filled tab in its "sent" note (`NOTE_IDS`), not in a toast
that fades (the CLI says the same on stderr). A PNG that cannot be read at all is a gr.Error: the sends run in
the queue, since gradio shows nothing of an unqueued event's error (or warning).
"""

from __future__ import annotations

import html
from pathlib import Path

import gradio as gr

from lowvram_gen.control.units import check_preprocessor
from lowvram_gen.errors import LowVramError
from lowvram_gen.a1111.infotext import NoParameters, from_png, local_model
from lowvram_gen.request import SAME_SAMPLER, SAME_SCHEDULER
from lowvram_gen.schedules import AUTOMATIC
from lowvram_gen.ui import controlnet, messages
from lowvram_gen.ui.widgets import AS_PRESET

# A1111's Extra seed options: the checkbox that shows them, then the request's fields
EXTRA_SEED = ("seed_extra", "subseed", "subseed_strength", "seed_resize_from_w", "seed_resize_from_h")
# the controls a send fills, per tab id (their order is the order of the event's outputs): the ones every SD tab has
# (ui/form.py builds them), then each tab's own
SD_FORM = ("prompt", "negative_prompt", "width", "height", "steps", "cfg_scale", "seed", "batch_size", "sampler",
           "model", "quantize", "schedule_type", "clip_skip", *EXTRA_SEED, "rng", "styles")
HIRES = ("hires_scale", "hires_upscaler", "hires_steps", "hires_denoise", "hires_resize_w", "hires_resize_h",
         "hires_sampler", "hires_schedule_type", "hires_cfg", "hires_prompt", "hires_negative")
INPAINT_SETTINGS = ("mask_blur", "invert_mask", "masked_content", "inpaint_area", "mask_padding")
REFINER = ("refiner", "refiner_switch_at")  # the Refiner accordion of txt2img and img2img
TXT2IMG = (*SD_FORM, *HIRES, "tiling", *REFINER, *controlnet.SENT_KEYS)  # Tiling: the checkbox of txt2img and img2img
IMG2IMG = ("init_image", "strength", *SD_FORM, "tiling", *REFINER, *controlnet.SENT_KEYS)
INPAINT = ("init_image", "strength", *SD_FORM, *INPAINT_SETTINGS, *controlnet.SENT_KEYS)
UPSCALE = ("image",)
KEYS = {"txt2img": TXT2IMG, "img2img": IMG2IMG, "inpaint": INPAINT, "upscale": UPSCALE}
LABELS = {"txt2img": "txt2img", "img2img": "img2img", "inpaint": "Inpaint", "upscale": "Upscale"}
# the tabs whose controls a PNG fills
NOTE_IDS = {"txt2img": "txt2img-sent", "img2img": "img2img-sent", "inpaint": "inpaint-sent"}
# A1111's inpaint settings where its PNG does not write them (Mask blur only above 0, and so on)
INPAINT_OFF = (("mask_blur", 0), ("invert_mask", False), ("masked_content", "original"), ("inpaint_area", "whole"),
               ("mask_padding", 32))


def note(tab: str) -> gr.Markdown:
    """The filled tab's note of what its last send did not use (empty until a send has something to say)."""
    return gr.Markdown(elem_id=NOTE_IDS[tab])


def values_for(keys: tuple[str, ...], path: str, models_folder=None, need_parameters: bool = True,
               request=None, session=None) -> tuple[list, list[str]]:
    """One value (or gr.update() for "leave it") per control in `keys`, from the image at `path`, and what of
    the PNG was not used (one line each, plain text).

    The image itself goes to an `init_image`/`image` control. Without parameters in the PNG this is a
    gr.Error when `need_parameters` (PNG Info), else only the image is sent (a gallery's send). With `session`, the
    styles of its styles file are taken out of the prompts and selected (A1111's paste: prompting/styles.py)."""
    fields: dict = {}
    said: list[str] = []
    book = None
    if session is not None and "styles" in keys:
        try:
            book = session.style_book()
        except LowVramError as exc:  # the prompts are sent whole
            said.append(f"styles not taken out of the prompts: {exc}")
    if set(keys) - {"init_image", "image"}:
        try:
            read = from_png(path, lenient=True, styles=book)
        except NoParameters as exc:
            if need_parameters:
                raise messages.error(exc, request) from None
            read = None
        except LowVramError as exc:
            raise messages.error(exc, request) from None
        if read is not None:
            fields = dict(read.fields)
            fields.setdefault("batch_size", 1)  # one PNG is one image: its own seed, batch 1
            fields.setdefault("hires_scale", 1.0)
            # hires fix's own settings A1111 writes only when they differ from the first pass's: back to "same"
            for name, same in (("hires_resize_w", 0), ("hires_resize_h", 0), ("hires_cfg", 0), ("hires_prompt", ""),
                               ("hires_negative", ""), ("hires_steps", 0)):
                fields.setdefault(name, same)
            fields["hires_sampler"] = fields.get("hires_sampler") or SAME_SAMPLER
            fields["hires_schedule_type"] = fields.get("hires_schedule_type") or SAME_SCHEDULER
            fields.setdefault("clip_skip", 1)  # A1111 writes Clip skip only when it is above 1
            fields.setdefault("rng", "gpu")  # and RNG only when not GPU (its parser reads none as GPU)
            fields.setdefault("tiling", False)  # and Tiling only when on
            fields["styles"] = list(fields.get("styles") or ())  # the styles found in its prompts; else none
            fields.setdefault("refiner", "")  # and the refiner only where one ran
            fields.setdefault("refiner_switch_at", 0.8)
            if fields["refiner"]:  # `Refiner: name`: a checkpoint of the models folder by name, else as written
                fields["refiner"] = local_model(fields["refiner"], models_folder) or fields["refiner"]
            for name, off in (("subseed_strength", 0), ("seed_resize_from_w", 0), ("seed_resize_from_h", 0)):
                fields.setdefault(name, off)  # written only when used: a PNG without them had them off
            fields["seed_extra"] = bool(fields["subseed_strength"] or fields["seed_resize_from_w"])
            fields["quantize"] = fields.get("quantize") or AS_PRESET  # the Quantize box's choice
            if "sampler" in fields:  # a PNG's sampler without a schedule type ran its Automatic one
                fields.setdefault("schedule_type", AUTOMATIC)
            said += [f"not used: {what}" for what in read.unusable]
            if "model" in fields:
                found = local_model(fields["model"], models_folder)
                if found is None:
                    said.append(messages.for_ui(f"not used: Model {fields.pop('model')!r} (not here: pick one in "
                                                "the Model box)"))
                else:
                    fields["model"] = found
            if read.ignored:
                said.append("not used (no such setting here): " + ", ".join(read.ignored))
            if read.inpainted and "mask_blur" in keys:  # an inpainted image's settings, those it left out too
                for name, off in INPAINT_OFF:
                    fields.setdefault(name, off)
                said.append("the mask is not in a PNG: draw it again on the image, or upload it")
            elif read.inpainted:
                said.append("not used: its inpaint settings (send it to Inpaint for them; the mask is not in a PNG)")
            if controlnet.key(0, "enabled") in keys:
                said += unit_fields(fields)
            said += read.notes
    fields["init_image"] = fields["image"] = path
    return [fields.get(key, gr.update()) for key in keys], said


def unit_fields(fields: dict) -> list[str]:
    """Put the PNG's ControlNet units into `fields` as the accordion's controls (ui/controlnet.py KEYS): each unit
    enabled with its model, weight, start/end, preprocessor and thresholds, the others switched off (an image made
    without them). Returns what the note must say: each unit's control image is not in the PNG (upload it), and
    what does not fit the accordion."""
    units = tuple(fields.get("controlnets") or ())
    said = []
    for i in range(controlnet.UNITS):
        unit = units[i] if i < len(units) else None
        fields[controlnet.key(i, "enabled")] = unit is not None
        if unit is None:
            continue
        for name in controlnet.UNIT_FIELDS[2:]:
            fields[controlnet.key(i, name)] = getattr(unit, name)
        try:  # a model-based one needs controlnet_aux and its weights here
            fields[controlnet.key(i, "preprocessor")] = check_preprocessor("preprocessor", unit.preprocessor)
        except LowVramError as exc:
            said.append(f"not used: ControlNet Unit {i} preprocessor {unit.preprocessor!r} ({exc}): none instead")
            fields[controlnet.key(i, "preprocessor")] = "none"
        said.append(f"ControlNet Unit {i}: its control image is not in the PNG: upload one")
    if len(units) > controlnet.UNITS:
        said.append(f"not used: ControlNet unit(s) {controlnet.UNITS} to {len(units) - 1} (the web UI shows "
                    f"{controlnet.UNITS} units)")
    mode = fields.get("control_mode") or "balanced"
    if mode not in dict(controlnet.MODE_CHOICES).values():
        said.append(f"not used: ControlNet control mode {mode!r} (no diffusers equivalent: Balanced instead)")
        mode = "balanced"
    fields["control_mode"] = mode
    return said


def note_text(path: str, said: list[str]) -> str:
    """The "sent" note's Markdown: what was not used from the image, escaped (the PNG's text is anyone's)."""
    if not said:
        return ""
    lines = "\n".join(f"- {html.escape(line)}" for line in said)
    return f"**Filled from {html.escape(Path(path).name)}**; some of its parameters were not used:\n\n{lines}"


def chosen_image(gallery, index) -> str | None:
    """The path of the gallery's selected image, else of its first one; None for an empty gallery."""
    if not gallery:
        return None
    item = gallery[index if isinstance(index, int) and 0 <= index < len(gallery) else 0]
    return str(item[0] if isinstance(item, (tuple, list)) else item)


def gallery_buttons(ctx, gallery, targets: tuple[str, ...], prefix: str) -> None:
    """"Send to <tab>" buttons under a gallery: the selected image (or the first) with its parameters."""
    selected = gr.State(None)  # this browser's selected index; a new result resets it
    with gr.Row():
        buttons = {tab: gr.Button(f"Send to {LABELS[tab]}", size="sm", elem_id=f"{prefix}-to-{tab}")
                   for tab in targets}

    def remember(evt: gr.SelectData):
        return evt.index

    gallery.select(remember, None, [selected], queue=False, api_visibility="private")
    gallery.change(lambda: None, None, [selected], queue=False, api_visibility="private")
    for tab, button in buttons.items():
        ctx.later(lambda tab=tab, button=button: wire_send(ctx, button, tab, [gallery, selected], from_gallery))


def from_gallery(gallery, index) -> tuple[str, bool]:
    path = chosen_image(gallery, index)
    if path is None:
        raise messages.error("no image yet: generate one first")
    return path, False


def wire_send(ctx, button, tab: str, inputs: list, source) -> None:
    """`button` fills `tab`'s controls from the image `source(*inputs)` gives ((path, need_parameters)),
    and selects that tab."""
    keys = KEYS[tab]
    # the RNG source is a setting of the page (ui/rng_setting.py), not a tab's control
    outputs = [ctx.controls[tab][key] if key in ctx.controls[tab] else ctx.page_controls[key] for key in keys]
    notes = [ctx.sent_notes[tab]] if tab in ctx.sent_notes else []

    def send(first, second=None, request: gr.Request = None):  # the inputs: one or two components
        path, need_parameters = source(first, second)
        values, said = values_for(keys, path, ctx.options.models_folder, need_parameters, request, ctx.session)
        return *values, *([note_text(path, said)] if notes else []), gr.Tabs(selected=tab)

    # queued: gradio shows an unqueued event's errors nowhere
    button.click(send, inputs, [*outputs, *notes, ctx.tabs], api_visibility="private", show_progress="hidden")
