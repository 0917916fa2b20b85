"""Inputs that hand the user's value to our validation as it is, so the UI refuses what the CLI refuses,
with the CLI's message (`GenerationRequest.validated()`).

Gradio's own checks would get there first: a Slider refuses an API value outside its range with its own
message (and the browser clamps a typed one into the range), and a Number with `precision=0` rounds
512.5 to 512. So: Numbers without precision or bounds, and a Slider whose range is for dragging only.
"""

import gradio as gr

from lowvram_gen.samplers import timestep_only
from lowvram_gen.schedules import AUTOMATIC, SCHEDULE_TYPES
from lowvram_gen.settings import QUANTIZE
from lowvram_gen.a1111.upscaler_names import available

AS_PRESET = "as the preset says"  # the Quantize choice that leaves the weights' storage to the preset (quantize=None)
QUANTIZE_CHOICES = [AS_PRESET, *QUANTIZE]


def Slider(minimum: float, maximum: float, **kwargs) -> gr.Slider:
    """gr.Slider without Gradio's range check on input: a value from outside the range (an API client's)
    reaches our validation. (The browser clamps a value typed into its box into the range, as A1111's does.)

    (The check is switched off on the instance: a gr.Slider subclass would make Gradio write a .pyi stub
    beside this file on import.)"""
    slider = gr.Slider(minimum, maximum, **kwargs)
    slider.preprocess = _as_sent
    return slider


def _as_sent(payload):
    return payload


def Number(label: str, value, **kwargs) -> gr.Number:
    """gr.Number with no rounding and no bounds: 512.5 or -2 reach our validation as typed."""
    return gr.Number(label=label, value=value, precision=None, **kwargs)


def Quantize(value: str, elem_id: str) -> gr.Dropdown:
    """The "Quantize weights" box of txt2img and img2img (the CLI's --quantize). A value outside the choices
    (an API client's) reaches our validation, which names it and the allowed ones, instead of Gradio's check."""
    dropdown = gr.Dropdown(QUANTIZE_CHOICES, value=value, label="Quantize weights",
                           info="int8/int4 weights take less VRAM; int8 stays close to full precision, "
                                "int4 loses some detail", elem_id=elem_id)
    dropdown.preprocess = _as_sent
    return dropdown


def ScheduleType(elem_id: str, value: str = AUTOMATIC) -> gr.Dropdown:
    """The "Schedule type" box beside the Sampler (A1111 1.9+'s; the CLI's --schedule-type): A1111's names shown, the
    request's values sent (an API client's own value reaches our validation). Every type runs A1111's noise levels on
    the samplers that step through them; the few a sampler cannot take are refused in one sentence (samplers.py),
    never run as another schedule."""
    dropdown = gr.Dropdown([(label, key) for key, (label, _) in SCHEDULE_TYPES.items()], value=value,
                           label="Schedule type", elem_id=elem_id,
                           info="A1111's noise levels; " + ", ".join(timestep_only()) + " take Automatic only")
    dropdown.preprocess = _as_sent
    return dropdown


def ImagePath(label: str, **kwargs) -> gr.Image:
    """gr.Image giving the handler the uploaded file's path. A file Pillow refuses to open (a decompression
    bomb, not an image) reaches our validation too, which names it and says why, instead of gradio's
    preprocessing error, which an API client gets as "the upstream app has not enabled verbose error
    reporting"."""
    image = gr.Image(label=label, type="filepath", **kwargs)
    gradios = image.preprocess

    def preprocess(payload):
        try:
            return gradios(payload)
        except Exception:  # noqa: BLE001 - whatever Pillow raised, check_image_path says it in our words
            path = getattr(payload, "path", None)
            if path is None:
                raise
            return str(path)

    image.preprocess = preprocess
    return image


def quantize_field(choice: str | None) -> str | None:
    """The request's `quantize` for the Quantize box's choice: None (the preset decides) for AS_PRESET."""
    return None if choice in (None, AS_PRESET) else choice


def upscaler_choices(hires: bool = False) -> list[str]:
    """The upscalers offered, by A1111's names: for hires fix the latent ones and None too."""
    return available(hires=hires)


def seed_extras(extra: gr.Checkbox, prefix: str, defaults) -> tuple:
    """A1111's "Extra" seed options, in a row that the `extra` checkbox shows: Variation seed, Variation strength,
    Resize seed from width/height (0: off), starting at `defaults`' (a GenerationRequest's). Unticking it turns them
    off (strength and sizes back to the defaults, 0), so what is hidden never changes the image. Returns (subseed,
    subseed strength, resize-from width, resize-from height)."""
    off = (defaults.subseed_strength, defaults.seed_resize_from_w, defaults.seed_resize_from_h)
    with gr.Row(visible=False, elem_id=f"{prefix}seed-extras") as row:
        subseed = Number("Variation seed (-1: random)", defaults.subseed, elem_id=f"{prefix}subseed")
        strength = Slider(0, 1, value=off[0], step=0.01, label="Variation strength (0: off)",
                          elem_id=f"{prefix}subseed-strength")
        resize_w = Slider(0, 2048, value=off[1], step=8, label="Resize seed from width (0: off)",
                          elem_id=f"{prefix}seed-resize-w")
        resize_h = Slider(0, 2048, value=off[2], step=8, label="Resize seed from height (0: off)",
                          elem_id=f"{prefix}seed-resize-h")

    def toggle(on):
        if on:
            return gr.Row(visible=True), gr.update(), gr.update(), gr.update()
        return gr.Row(visible=False), *off

    extra.change(toggle, [extra], [row, strength, resize_w, resize_h], queue=False, api_visibility="private")
    return subseed, strength, resize_w, resize_h


def seed_buttons(reuse: gr.Button, random: gr.Button, seed, last_seed) -> None:
    """♻ puts the browser's last seed (`last_seed`, the results column's hidden Number) in the Seed box (-1 before
    any job); 🎲 puts -1 (random) there, as A1111's buttons do."""
    reuse.click(lambda s: -1 if s is None else s, [last_seed], [seed], queue=False,
                api_visibility="private")
    random.click(lambda: -1, None, [seed], queue=False, api_visibility="private")


def swap_button(swap: gr.Button, width, height) -> None:
    """⇅: Width and Height change places (A1111's)."""
    swap.click(lambda w, h: (h, w), [width, height], [width, height], queue=False, api_visibility="private")
