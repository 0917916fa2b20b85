"""What the web UI remembers: each browser's own last txt2img and img2img values (the live preview's settings
included), kept in that browser.

The values live in the browser's localStorage (gradio's BrowserState), under the login that made them
(`--gradio-auth` users sharing one browser keep theirs apart); a reload (F5) or a restarted server puts them
back in that browser's controls, and no other browser, login or API client ever sees them. The controls
themselves start at the documented defaults, so the API's defaults (an omitted seed is -1: random) and the page
every client loads carry nobody's last prompt.

Saved after a job passes validation (a chained `.success` of its Generate, which only a browser runs: an API
call remembers nothing). A refused job ends without a gradio error in the browser (it says why in its summary,
ui/messages.py), so `.success` runs for it too: values the request refuses are not saved. Restored values are checked again, one by one, as the request checks them (a value
stored by an older version, or edited in the browser's storage, that the request would refuse is dropped
with one warning), so the UI never opens with a value its first Generate refuses.

The ControlNet units' model, preprocessor, thresholds, weight, start/end and control mode are remembered (not their
Enable and image: ui/controlnet.py).

The Model box, the init image, the Styles selection and the Extra seed options are not remembered: the model starts at
`lowvram-gen ui --model`.

(No `from __future__ import annotations`: gradio finds `gr.Request` through real annotations.)
"""

import logging
import secrets

import gradio as gr

from lowvram_gen import paths
from lowvram_gen.errors import LowVramError
from lowvram_gen.request import GenerationRequest
from lowvram_gen.ui import controlnet, live, xyz
from lowvram_gen.ui.widgets import quantize_field

log = logging.getLogger(__name__)
STORAGE_KEY = "lowvram-gen-values"  # the browser's localStorage key
SECRET_FILE = "ui-secret"  # in $LOWVRAM_GEN_HOME: the key gradio encrypts the stored values with
TABS = ("txt2img", "img2img")
# the Extra seed options are not kept either (A1111 does not keep them): a remembered strength would vary the seed
# from a row that opens hidden
NOT_REMEMBERED = ("model", "init_image", "seed_extra", "subseed", "subseed_strength", "seed_resize_from_w",
                  "seed_resize_from_h",
                  "styles",  # A1111 keeps no selection either: a style left selected would apply to every next job
                  # a ControlNet unit's Enable and image: a unit restored on without its image would be refused
                  *(controlnet.key(i, name) for i in range(controlnet.UNITS) for name in controlnet.NOT_REMEMBERED),
                  # the Script (X/Y/Z plot, Loopback, SD upscale) and its controls: a page that loads runs a plain job until a grid is chosen
                  *xyz.inputs("img2img"))


def _secret() -> str:
    """The same key on every start, so a restarted server can read what the browsers stored; a home that cannot
    be written gives a new key each start (the values are then forgotten on restart, said once)."""
    file = paths.home() / SECRET_FILE
    try:
        text = file.read_text(encoding="ascii").strip()
        if len(text) >= 16:
            return text
    except (OSError, ValueError):
        pass
    text = secrets.token_urlsafe(24)
    try:
        paths.write_atomically(file, text)
    except OSError as exc:
        log.warning("could not keep the UI's storage key in %s (%s): browsers forget their values when the "
                    "server restarts", file, exc)
    return text


def browser_state(storage_key: str = STORAGE_KEY) -> gr.BrowserState:
    """A value kept in the browser's localStorage under `storage_key`, encrypted with the server's key (the Settings
    tab keeps its own: ui/tabs/settings.py)."""
    return gr.BrowserState({}, storage_key=storage_key, secret=_secret())


def _user(request) -> str:
    return getattr(request, "username", None) or ""


def valid(name: str, value, component) -> bool:
    """Whether `value` may go back into the control `name`: one of a fixed dropdown's choices, and a value the
    request accepts for that field."""
    choices = getattr(component, "choices", None)
    if choices and not getattr(component, "allow_custom_value", True) and value not in [c[1] for c in choices]:
        return False
    if name in controlnet.KEYS:  # a ControlNet unit's field: checked as the request checks a unit's
        return controlnet.check(name, value)
    if name in live.SETTINGS:  # the live preview's settings: the UI's own, not the request's
        try:
            live.SETTINGS[name](value)
        except LowVramError:
            return False
        return True
    converted = {"quantize": quantize_field(value) if isinstance(value, str) or value is None else value,
                 "negative_prompt": value or ""}.get(name, value)
    try:
        GenerationRequest(**{name: converted}).validated()
    except (LowVramError, TypeError, ValueError):
        return False
    return True


def wire(app: gr.Blocks, controls: dict, jobs: dict, after=None) -> None:
    """Remember each tab's values after its job passes validation, and restore them when a page loads (after the
    page-load event `after` where given: the Settings tab's defaults, which the last values come back over).
    `controls`: tab -> {request field: component}; `jobs`: tab -> the Generate event."""
    store = browser_state()
    restored = []  # (tab, name, component) in the order app.load fills them
    for tab in TABS:
        names = [n for n in controls[tab] if n not in NOT_REMEMBERED]
        components = [controls[tab][n] for n in names]
        restored += [(tab, n, c) for n, c in zip(names, components)]

        def remember(request: gr.Request, stored, *values, tab=tab, names=names, components=components):
            if not all(valid(n, v, c) for n, v, c in zip(names, values, components)):
                return gr.skip()  # the job was refused: keep what this browser remembered
            stored = dict(stored) if isinstance(stored, dict) else {}
            mine = dict(stored.get(_user(request)) or {})
            mine[tab] = dict(zip(names, values))
            stored[_user(request)] = mine
            return stored

        jobs[tab].success(remember, [store, *components], [store], queue=False, api_visibility="private")

    def restore(stored, request: gr.Request):
        mine = stored.get(_user(request)) if isinstance(stored, dict) else None
        mine = mine if isinstance(mine, dict) else {}
        out, dropped = [], []
        for tab, name, component in restored:
            values = mine.get(tab) if isinstance(mine.get(tab), dict) else {}
            if name not in values:
                out.append(gr.update())
            elif valid(name, values[name], component):
                out.append(values[name])
            else:
                out.append(gr.update())
                dropped.append(f"{tab} {name}={values[name]!r}")
        if dropped:
            log.warning("not restoring remembered values the request would refuse: %s", ", ".join(dropped))
        return out

    (after.then if after is not None else app.load)(restore, [store], [c for _, _, c in restored], queue=False,
                                                    api_visibility="private")
