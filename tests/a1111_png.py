"""An A1111-written PNG (its `parameters` text on a blank image) rerun with `generate --from-png`: the shared
step of the tests that check every field of such a PNG is used."""

from __future__ import annotations

import json

from PIL import Image
from PIL.PngImagePlugin import PngInfo

from lowvram_gen.cli.main import main


def rerun_with_no_unused_note(text: str, size: tuple[int, int], tmp_path, capsys) -> dict:
    """Save `text` as an A1111 PNG of `size`, rerun it with --from-png --json, check no field was noted "not used",
    and return the CLI's JSON answer."""
    info = PngInfo()
    info.add_text("parameters", text)
    png = tmp_path / "a1111.png"
    Image.new("RGB", size).save(png, pnginfo=info)
    assert main(["generate", "--from-png", str(png), "--outdir", str(tmp_path / "out"), "--json"]) == 0
    captured = capsys.readouterr()
    out = json.loads(captured.out)
    assert "not used" not in captured.err and not any("not used" in w for w in out["warnings"]), captured.err
    return out
