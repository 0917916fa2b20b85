"""Regenerate the README's picture of the web UI (docs/screenshot.png) from the running app.

    .venv/bin/python scripts/screenshot.py [--out docs/screenshot.png]

Starts the UI on the embedded tiny model in a temporary folder, generates one image in a headless Chromium
(Debian's `chromium`, driven by Playwright without a browser download), photographs every tab the app has
(txt2img after its generation, the System tab after an estimate), two a row, and writes the sheet with the
layout's signature (lowvram_gen/ui/layout.py) in a PNG text chunk. tests/test_ui_layout.py fails when the
app's layout no longer matches the picture: run this script then. It also writes the txt2img tab as a
1366x768 laptop screen shows it (docs/screenshots/txt2img-1366x768.png).
"""

from __future__ import annotations

import argparse
import math
import os
import shutil
import socket
import sys
import tempfile
from io import BytesIO
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
VIEW = (1400, 1000)  # the browser's viewport; each tab is shown at half this size
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]
PLANNED = "() => document.querySelector('#plan-table').innerText.includes('system RAM')"  # the cpu row is there


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def photograph_tabs(page, tab_names: list[str], target: Path, signature: str) -> None:
    """Each tab in `tab_names` (System after its estimate), two a row, into one PNG at `target` whose text
    chunk holds the layout's `signature`."""
    from PIL import Image
    from PIL.PngImagePlugin import PngInfo

    from lowvram_gen.ui.layout import SIGNATURE_KEY

    width, height = VIEW
    shots = []
    for name in tab_names:
        page.get_by_role("tab", name=name).click()
        page.wait_for_timeout(500)
        if name == "System":
            page.click("#estimate")
            page.wait_for_function(PLANNED, timeout=60_000)
        page.evaluate("window.scrollTo(0, 0)")
        shot = Image.open(BytesIO(page.screenshot(clip={"x": 0, "y": 0, "width": width, "height": height})))
        shots.append(shot.convert("RGB").resize((width // 2, height // 2), Image.LANCZOS))
    page.get_by_role("tab", name=tab_names[0]).click()
    sheet = Image.new("RGB", (width, height // 2 * math.ceil(len(shots) / 2)), "white")
    for i, shot in enumerate(shots):
        sheet.paste(shot, (width // 2 * (i % 2), height // 2 * (i // 2)))
    info = PngInfo()
    info.add_text(SIGNATURE_KEY, signature)
    info.add_text("tabs", ", ".join(tab_names))
    target.parent.mkdir(parents=True, exist_ok=True)
    sheet.quantize(colors=128, method=Image.Quantize.MEDIANCUT).save(target, optimize=True, pnginfo=info)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=str(ROOT / "docs" / "screenshot.png"))
    args = parser.parse_args()
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        print("screenshot: Debian's chromium is needed (apt-get install chromium)", file=sys.stderr)
        return 2
    sys.path.insert(0, str(ROOT))
    work = Path(tempfile.mkdtemp(prefix="lowvram-screenshot-"))
    os.environ["LOWVRAM_GEN_HOME"] = str(work / "home")  # the built-in defaults, nobody's remembered values
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from playwright.sync_api import sync_playwright

    from lowvram_gen.session import Session
    from lowvram_gen.server import launch
    from lowvram_gen.ui.layout import signature, tabs

    outdir = work / "outputs"
    outdir.mkdir(parents=True)
    port = free_port()
    app = launch(Session(outdir=str(outdir)), str(outdir), "tiny", port=port, block=False)
    try:
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=chromium, headless=True, args=CHROMIUM_ARGS)
            page = browser.new_context(viewport=dict(zip(("width", "height"), VIEW))).new_page()
            page.goto(f"http://127.0.0.1:{port}/")
            page.wait_for_selector("#prompt textarea", timeout=60_000)
            page.locator("#prompt textarea").fill("a lighthouse at dusk")
            page.click("#generate")
            page.wait_for_function("() => { const img = document.querySelector('#gallery img');"
                                   " return img !== null && img.complete && img.naturalWidth > 0; }", timeout=180_000)
            laptop = Path(args.out).parent / "screenshots" / "txt2img-1366x768.png"
            laptop.parent.mkdir(parents=True, exist_ok=True)
            page.set_viewport_size({"width": 1366, "height": 768})  # a laptop: Generate shows without scrolling
            page.evaluate("() => window.scrollTo(0, 0)")
            page.screenshot(path=str(laptop))
            page.set_viewport_size(dict(zip(("width", "height"), VIEW)))
            photograph_tabs(page, tabs(app), Path(args.out), signature(app))
            browser.close()
    finally:
        app.close()
    print(f"written {args.out} ({', '.join(tabs(app))})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
