"""Send an image (and what its PNG says) to another tab: PNG Info's and the galleries' "Send to" buttons.

A tab registers its controls in `ctx.controls[tab id]` under the `GenerationRequest` field each one sets;
a send fills them from `infotext.from_png` (the mapping `generate --from-png` uses too) and selects the
tab. What the PNG does not say stays as it is, except hires fix, which is switched off for an image made
without it (or the same seed would not give the same image), and Quantize, which goes back to "as the
preset says" for an image whose weights were not int8/int4 (our PNGs write `Quantize:` only when they
were). A model the PNG names that is not here leaves the Model box as it is, with a warning.
"""

from __future__ import annotations

import gradio as gr

from lowvram_gen.errors import LowVramError
from lowvram_gen.infotext import NoParameters, from_png, local_model
from lowvram_gen.ui import messages
from lowvram_gen.ui.widgets import AS_PRESET

# the controls a send fills, per tab id (their order is the order of the event's outputs)
TXT2IMG = ("prompt", "negative_prompt", "width", "height", "steps", "cfg_scale", "seed", "batch_size", "sampler",
           "model", "hires_scale", "hires_upscaler", "hires_steps", "hires_denoise", "quantize")
IMG2IMG = ("init_image", "prompt", "negative_prompt", "strength", "width", "height", "steps", "cfg_scale", "seed",
           "batch_size", "sampler", "model", "quantize")
UPSCALE = ("image",)
KEYS = {"txt2img": TXT2IMG, "img2img": IMG2IMG, "upscale": UPSCALE}
LABELS = {"txt2img": "txt2img", "img2img": "img2img", "upscale": "Upscale"}


def values_for(keys: tuple[str, ...], path: str, models_folder=None, need_parameters: bool = True,
               request=None) -> list:
    """One value (or gr.update() for "leave it") per control in `keys`, from the image at `path`.

    The image itself goes to an `init_image`/`image` control. Without parameters in the PNG this is a
    gr.Error when `need_parameters` (PNG Info), else only the image is sent (a gallery's send)."""
    fields: dict = {}
    if set(keys) - {"init_image", "image"}:
        try:
            read = from_png(path)
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
            fields["quantize"] = fields.get("quantize") or AS_PRESET  # the Quantize box's choice
            if "model" in fields:
                found = local_model(fields["model"], models_folder)
                if found is None:
                    gr.Warning(messages.for_ui(f"the image's model {fields.pop('model')!r} is not here: "
                                               "pick one in the Model box"))
                else:
                    fields["model"] = found
            for note in read.notes:
                gr.Warning(note)
    fields["init_image"] = fields["image"] = path
    return [fields.get(key, gr.update()) for key in keys]


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
        raise gr.Error("no image yet: generate one first")
    return path, False


def wire_send(ctx, button, tab: str, inputs: list, source) -> None:
    """`button` fills `tab`'s controls from the image `source(*inputs)` gives ((path, need_parameters)),
    and selects that tab."""
    keys = KEYS[tab]
    outputs = [ctx.controls[tab][key] for key in keys]

    def send(first, second=None, request: gr.Request = None):  # the inputs: one or two components
        path, need_parameters = source(first, second)
        values = values_for(keys, path, ctx.options.models_folder, need_parameters, request)
        return *values, gr.Tabs(selected=tab)

    button.click(send, inputs, [*outputs, ctx.tabs], queue=False, api_visibility="private")
