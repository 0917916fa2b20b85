"""A1111's "Generate forever" (its Generate button's right-click menu): here a checkbox under Interrupt and Skip. While it
is ticked, each job that ends with images starts the next one, as a click of Generate does: through the same queue
(the "gpu" group, one job at a time), never more than one of this browser's jobs waiting or running, each with a
new random seed when the Seed box says -1 (each job draws its own). Interrupt unticks it (the running job stops as
always); a job that ends without images (refused, failed, or interrupted before its first image) unticks it too,
so a refused request never loops.

How: the Generate handler is wrapped (`watched`) to note, per browser (its gradio session, ui/context.client_key),
whether the job ended with images; once the Generate event is over, `again` reads that note and, when the box is
still ticked, the page clicks Generate again.

(No `from __future__ import annotations`: gradio finds `gr.Request` through real annotations.)
"""

import inspect
import threading

import gradio as gr

from lowvram_gen.ui.context import client_key

LABEL = "Generate forever"
_ENDED: dict[str, bool] = {}  # client key -> whether its last job ended with images (read once by `again`)
_LOCK = threading.Lock()
CLICK_JS = """(on) => { if (on) setTimeout(() => { const b = document.getElementById("%s"); if (b) b.click(); }, 0);
  return on; }"""


def checkbox(prefix: str) -> gr.Checkbox:
    return gr.Checkbox(False, label=LABEL, info="starts the next job when one ends, until unticked or Interrupt",
                       elem_id=f"{prefix}generate-forever")


def watched(handler):
    """`handler` (a Generate event's generator, gradio's signature kept) noting whether its job ended with images."""
    signature = inspect.signature(handler)
    names = list(signature.parameters)

    def event(*args, **kwargs):
        request = kwargs.get("request")
        if request is None and "request" in names and names.index("request") < len(args):
            request = args[names.index("request")]
        images = False
        for outputs in handler(*args, **kwargs):
            first = outputs[0] if isinstance(outputs, tuple) and outputs else None
            if isinstance(first, list):  # the gallery's images (every other yield leaves it as it is)
                images = bool(first)
            yield outputs
        with _LOCK:
            _ENDED[client_key(request)] = images

    event.__signature__ = signature  # gradio reads the inputs from it and finds gr.Request by the annotations
    event.__annotations__ = dict(getattr(handler, "__annotations__", {}))
    event.__name__ = getattr(handler, "__name__", "generate")
    return event


def again(on, request: gr.Request):
    """Unticks the box when this browser's job ended without images; else leaves it as it is now (never ticks it: an
    Interrupt clicked while this ran has unticked it). The page then clicks Generate if the box is still ticked."""
    with _LOCK:
        images = _ENDED.pop(client_key(request), False)
    return gr.update() if on and images else False


def wire(event, box: gr.Checkbox, stop: gr.Button, generate_id: str) -> None:
    """After the Generate `event`, tick off or click Generate again; Interrupt unticks the box."""
    event.then(again, [box], [box], queue=False, api_visibility="private", show_progress="hidden") \
        .then(None, [box], None, js=CLICK_JS % generate_id, queue=False, api_visibility="private")
    stop.click(lambda: False, None, [box], queue=False, api_visibility="private", show_progress="hidden")
