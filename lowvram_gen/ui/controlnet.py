"""The ControlNet accordion of txt2img and img2img: units as A1111's sd-webui-controlnet shows them.

Each unit: Enable (ticked when a control image is uploaded, as the extension does), the control image, the
preprocessor (none, canny with its two thresholds, shown for canny only, and
the model-based ones of control/detectors.py: depth_midas, openpose..., lineart..., listed whether or not
controlnet_aux and their weights are here: Preview and Generate say in one sentence what is missing),
Preview (the preprocessed map at the tab's width x height, as the job computes it: control/preprocess.py), the
model (the embedded `tiny-controlnet`, for the `tiny` model, and the names in models/ControlNet, as the CLI finds
them: models/controlnet.py `available()`, with Refresh; a
folder, file or hub id can be typed), the weight, the guidance start/end and the resize mode (Just Resize, Crop and
Resize, Resize and Fill: control/resize.py); then one control mode for all units
(diffusers has one per call). An enabled unit becomes one of the request's `controlnets` (its fields as a mapping,
checked by the request as the CLI's are); the uploaded image is gradio's temp file, which the request checks as it
checks --control-image. A unit with an image but Enable off is left out, and the job's "What ran" says so
(`ignored`): unticking Enable is how a unit is switched off, but an image left in one is not silently dropped.

The unit's inputs go LAST in the Generate event's inputs (the API's positional order of the older ones stays):
`appended(handler)` gives gradio a function with the handler's inputs, then these, then gr.Request and gr.Progress,
and calls the handler with the unit values as extra positional arguments (`*controlnet`); it adds the `ignored`
note to the summary ("What ran") the handler yields, the third of its outputs (ui/form.py `generate`).

Remembered per browser (ui/remembered.py): the model, preprocessor, thresholds, weight, start/end, resize and control
mode; not Enable and not the image (a restored unit without its image would be refused by the first Generate). A PNG's
units fill these fields through Send to (ui/sendto.py `unit_values`), the image excepted: a PNG does not hold it.

(No `from __future__ import annotations`: gradio finds `gr.Request` through real annotations.)
"""

import contextlib
import inspect

import gradio as gr

from lowvram_gen.control.detectors import NAMES
from lowvram_gen.control.resize import CONTROL_RESIZE
from lowvram_gen.control.units import CANNY_DEFAULTS, CONTROL_MODES, MAX_WEIGHT, PREPROCESSORS, check_control_mode
from lowvram_gen.errors import LowVramError
from lowvram_gen.ui import messages
from lowvram_gen.ui.widgets import ImagePath, Slider, _as_sent

UNITS = 2  # units shown (A1111's default is 3; the request takes up to MAX_UNITS)
# one unit's controls, in the order of the event's inputs
FIELDS = ("enabled", "image", "preprocessor", "canny_low", "canny_high", "model", "weight", "guidance_start",
          "guidance_end")
LATER = ("resize_mode",)  # unit controls added later: their inputs come after control_mode (older API calls' order)
UNIT_FIELDS = FIELDS + LATER
NOT_REMEMBERED = ("enabled", "image")
SUMMARY = 2  # the place of "What ran" in a Generate event's outputs (gallery, info, summary, last seed: ui/form.py)
MODE_CHOICES = [(CONTROL_MODES[key], key) for key in ("balanced", "prompt", "controlnet")]
RESIZE_CHOICES = [(label, key) for key, label in CONTROL_RESIZE.items()]


def key(index: int, name: str) -> str:
    """The control's name in a tab's `ctx.controls` (and in the remembered values): `cn0_model`..."""
    return f"cn{index}_{name}"


KEYS = tuple(key(i, name) for i in range(UNITS) for name in FIELDS) + ("control_mode",) + \
    tuple(key(i, name) for i in range(UNITS) for name in LATER)
SENT_KEYS = tuple(k for k in KEYS if not k.endswith("_image"))  # what a PNG's text fills


def model_choices() -> list[str]:
    from lowvram_gen.models.controlnet import available

    return sorted(available(), key=str.lower)


def preview(image, preprocessor, low, high, width, height, resize="resize", request: gr.Request = None):
    """The unit's control map as the job makes it (brought to width x height by its resize mode, its preprocessor)."""
    from lowvram_gen.control.preprocess import control_map
    from lowvram_gen.control.units import check_unit
    from lowvram_gen.request import as_int, check_image_path

    if not image:
        raise messages.error("upload a control image first: Preview shows the map made from it", request)
    try:
        unit = check_unit(0, {"model": "preview", "image": image, "preprocessor": preprocessor or "none",
                              "canny_low": low, "canny_high": high, "resize_mode": resize}, check_image_path)
        w, h = as_int("width", width, 8, 8192), as_int("height", height, 8, 8192)
        return control_map(unit.image, w, h, unit.preprocessor, unit.canny_low, unit.canny_high,
                           resize=unit.resize_mode)
    except LowVramError as exc:
        raise messages.error(exc, request) from None


def show_thresholds(name) -> gr.Row:
    """Canny's thresholds are shown for canny only (unqueued: it sets a row's visibility, nothing to raise)."""
    return gr.Row(visible=str(name).lower() == "canny")


def build(prefix: str, width, height) -> dict:
    """The accordion (call inside the tab's layout); returns {KEYS name: component}, in KEYS order."""
    controls: dict = {}
    later: dict = {}
    with gr.Accordion("ControlNet", open=False, elem_id=f"{prefix}controlnet"):
        for i in range(UNITS):  # accordions, not tabs: the app's tabs (ui/layout.py tabs()) are its pages
            with gr.Accordion(f"ControlNet Unit {i}", open=i == 0, elem_id=f"{prefix}cn{i}"):
                made = _unit(f"{prefix}cn{i}-", i, width, height)
                controls.update({k: c for k, c in made.items() if not k.endswith(LATER)})
                later.update({k: c for k, c in made.items() if k.endswith(LATER)})
        mode = gr.Radio(MODE_CHOICES, value="balanced", label="Control Mode (all units)",
                        elem_id=f"{prefix}control-mode")
        mode.preprocess = _as_sent  # an API client's value ("prompt", a label) reaches the request's check
        controls["control_mode"] = mode
    return {**controls, **later}


def _unit(ids: str, i: int, width, height) -> dict:
    enabled = gr.Checkbox(False, label="Enable", elem_id=f"{ids}enabled")
    with gr.Row():
        image = ImagePath("Control image", elem_id=f"{ids}image")
        shown = gr.Image(label="Preprocessor preview", interactive=False, format="png", elem_id=f"{ids}preview")
    with gr.Row():
        preprocessor = gr.Dropdown(list(PREPROCESSORS + NAMES), value="none", label="Preprocessor",
                                   elem_id=f"{ids}preprocessor")
        preprocessor.preprocess = _as_sent
        go = gr.Button("Preview", size="sm", scale=0, min_width=80, elem_id=f"{ids}preview-button")
    with gr.Row(visible=False) as thresholds:
        low = Slider(1, 255, value=CANNY_DEFAULTS[0], step=1, label="Canny Low Threshold", elem_id=f"{ids}canny-low")
        high = Slider(1, 255, value=CANNY_DEFAULTS[1], step=1, label="Canny High Threshold",
                      elem_id=f"{ids}canny-high")
    with gr.Row():
        model = gr.Dropdown(model_choices(), value=None, allow_custom_value=True,
                            label="Model (models/ControlNet, or type a folder, file or hub id)", elem_id=f"{ids}model")
        refresh = gr.Button("Refresh", size="sm", scale=0, min_width=80, elem_id=f"{ids}model-refresh")
    with gr.Row():
        weight = Slider(0, MAX_WEIGHT, value=1, step=0.05, label="Control Weight", elem_id=f"{ids}weight")
        start = Slider(0, 1, value=0, step=0.01, label="Starting Control Step", elem_id=f"{ids}start")
        end = Slider(0, 1, value=1, step=0.01, label="Ending Control Step", elem_id=f"{ids}end")
    resize = gr.Radio(RESIZE_CHOICES, value="resize", label="Resize Mode", elem_id=f"{ids}resize-mode")
    resize.preprocess = _as_sent  # an API client's value (a label, 0-2) reaches the request's check
    preprocessor.change(show_thresholds, [preprocessor], [thresholds], queue=False, api_visibility="private")
    # an upload ticks Enable, as the extension's does (clearing the image leaves it: unticking is the user's)
    image.upload(lambda: True, None, [enabled], queue=False, api_visibility="private", show_progress="hidden")
    # queued: a preview's error (no image, an unreadable one) reaches the browser
    go.click(preview, [image, preprocessor, low, high, width, height, resize], [shown], api_visibility="private")
    refresh.click(lambda: gr.Dropdown(choices=model_choices()), None, [model], api_visibility="private",
                  show_progress="hidden")
    values = (enabled, image, preprocessor, low, high, model, weight, start, end, resize)
    return {key(i, name): c for name, c in zip(UNIT_FIELDS, values)}


def request_fields(values) -> dict:
    """The request's `controlnets` (the enabled units, as mappings) and `control_mode` from the unit controls'
    values in KEYS order (fewer from an older API client: the rest as unset)."""
    values = list(values) + [None] * (len(KEYS) - len(values))
    named = dict(zip(KEYS, values))
    units = []
    for i in range(UNITS):
        if not named[key(i, "enabled")]:
            continue
        unit = {name: named[key(i, name)] for name in UNIT_FIELDS[1:] if named[key(i, name)] is not None}
        unit["model"] = unit.get("model") or ""  # missing: the request says to pick one
        units.append(unit)
    return {"controlnets": tuple(units), "control_mode": named["control_mode"] or "balanced"}


def ignored(values) -> str | None:
    """The note "What ran" gets for the units with a control image but Enable off (`request_fields` leaves them out),
    naming them as the accordion does; None when there are none."""
    values = list(values) + [None] * (len(KEYS) - len(values))
    named = dict(zip(KEYS, values))
    units = [f"ControlNet Unit {i}" for i in range(UNITS)
             if not named[key(i, "enabled")] and named[key(i, "image")]]
    if not units:
        return None
    return (f"{' and '.join(units)} {'has' if len(units) == 1 else 'have'} a control image but Enable is off: not "
            "used (tick Enable to use it)")


def _noted(outputs, note: str | None):
    """A Generate event's outputs with `note` added to the summary (where the handler gave one)."""
    if note is None or not isinstance(outputs, tuple) or len(outputs) <= SUMMARY \
            or not isinstance(outputs[SUMMARY], str):
        return outputs
    summary = outputs[SUMMARY]
    return (*outputs[:SUMMARY], f"{summary}\n{note}" if summary else note, *outputs[SUMMARY + 1:])


def appended(handler):
    """`handler(*its inputs, *controlnet, request=, progress=)` as gradio calls a Generate event: the handler's own
    positional inputs, then one per KEYS, then gr.Request and gr.Progress. A handler that is not a generator (the
    System tab's Estimate) is called without `progress`."""
    params = [p for p in inspect.signature(handler).parameters.values()
              if p.kind is p.POSITIONAL_OR_KEYWORD]
    defaults = {"enabled": False, "preprocessor": "none", "canny_low": CANNY_DEFAULTS[0],
                "canny_high": CANNY_DEFAULTS[1], "weight": 1.0, "guidance_start": 0.0, "guidance_end": 1.0,
                "resize_mode": "resize"}
    ours = [inspect.Parameter(k, inspect.Parameter.POSITIONAL_OR_KEYWORD,
                              default=defaults.get(k.split("_", 1)[-1], "balanced" if k == "control_mode" else None))
            for k in KEYS]
    special = [inspect.Parameter("request", inspect.Parameter.POSITIONAL_OR_KEYWORD, default=None,
                                 annotation=gr.Request),
               inspect.Parameter("progress", inspect.Parameter.POSITIONAL_OR_KEYWORD, default=gr.Progress())]

    def split(args, kwargs):
        named = dict(zip([p.name for p in params] + list(KEYS) + ["request", "progress"], args), **kwargs)
        own = [named.get(p.name, p.default) for p in params]
        return [*own, *(named.get(k, o.default) for k, o in zip(KEYS, ours))], named

    if inspect.isgeneratorfunction(handler):
        def event(*args, **kwargs):
            values, named = split(args, kwargs)
            note = ignored(values[len(params):])
            outputs = handler(*values, request=named.get("request"), progress=named.get("progress"))
            with contextlib.closing(outputs):  # gradio closing this event closes the job's (it stops the job)
                for each in outputs:
                    yield _noted(each, note)
    else:
        special = special[:1]

        def event(*args, **kwargs):
            values, named = split(args, kwargs)
            return handler(*values, request=named.get("request"))

    event.__signature__ = inspect.Signature(params + ours + special)
    event.__annotations__ = {"request": gr.Request}
    event.__name__ = handler.__name__
    return event


def check(name: str, value) -> bool:
    """Whether a remembered unit value may go back into its control (ui/remembered.py)."""
    from lowvram_gen.control.units import check_unit

    field = name.split("_", 1)[1] if name != "control_mode" else name
    try:
        if field == "control_mode":
            return check_control_mode(value) in dict(MODE_CHOICES).values()
        if field == "model":
            return value is None or isinstance(value, str)
        # a threshold alone is checked against itself: the other one is another control, remembered on its own
        fields = {"canny_low": value, "canny_high": value} if field.startswith("canny_") else {field: value}
        check_unit(0, {"model": "m", **fields}, lambda _f, v: v, image_required=False)
    except (LowVramError, TypeError, ValueError):
        return False
    return True
