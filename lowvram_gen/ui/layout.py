"""The web UI's layout in words: its tabs and the controls on each, without their values.

`scripts/screenshot.py` writes the signature of the layout it photographed into the README's picture
(docs/screenshot.png); a test compares it with the layout the app builds now, so a tab or a control added
without a new picture fails the suite instead of leaving the README showing an older UI.
"""

from __future__ import annotations

import hashlib

SIGNATURE_KEY = "lowvram-gen-ui"  # the PNG text chunk of docs/screenshot.png that holds the signature


def describe(app) -> list[str]:
    """One line a component, in the order they were built: type, elem_id, label (and a button's text)."""
    lines = []
    for component in app.config["components"]:
        props = component.get("props", {})
        text = props.get("value") if component["type"] == "button" else ""
        label = props.get("label") or ""
        lines.append(f"{component['type']}#{props.get('elem_id') or ''} {label} {text or ''}".rstrip())
    return lines


def tabs(app) -> list[str]:
    return [c["props"]["label"] for c in app.config["components"]
            if c["type"] == "tabitem" and c.get("props", {}).get("label")]


def signature(app) -> str:
    return hashlib.sha256("\n".join(describe(app)).encode()).hexdigest()[:16]
