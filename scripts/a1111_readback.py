"""Read our PNGs back with A1111's own infotext parser and say whether every field survives.

    python scripts/a1111_readback.py --webui ~/stable-diffusion-webui outputs/2026-11-24/*.png \
        [--json docs/bench/a1111_readback.json]

`--webui` is a checkout of AUTOMATIC1111/stable-diffusion-webui: its `modules/infotext_utils.py` is loaded
from there as it is (nothing of it is copied into this repository: A1111 is AGPL, this project MIT). Only the
web UI around it is stood in for: `modules.shared.opts` with A1111's defaults for the options the parser reads
(styles ignored, no old hires-fix sizes, nothing skipped), and empty modules for the imports the parser does
not call on these texts (gradio's `update`, paths, ui_tempdir, script_callbacks, processing).

For each PNG it compares A1111's `parse_generation_parameters` with what we wrote: the prompt, the negative
prompt and every field of the last line (`Size: WxH` as A1111's `Size-1`/`Size-2`). It prints one line per
image and every difference, writes them as JSON with --json, and exits 1 if any field differs.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import re
import sys
import types
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from lowvram_gen.outputs import parse_a1111_parameters, read_png_metadata  # noqa: E402

_SIZE = re.compile(r"^(\d+)x(\d+)$")  # what A1111's parser splits into KEY-1 / KEY-2


def a1111_parser(webui: Path):
    """A1111's parse_generation_parameters, loaded from the checkout with stand-ins for the web UI."""
    source = webui / "modules" / "infotext_utils.py"
    if not source.is_file():
        raise SystemExit(f"--webui {webui}: no modules/infotext_utils.py there (a stable-diffusion-webui checkout?)")
    opts = types.SimpleNamespace(infotext_styles="Ignore", use_old_hires_fix_width_height=False,
                                 infotext_skip_pasting=[], auto_backcompat=True)
    stand_ins = {
        "gradio": dict(update=lambda **kw: dict(kw)),
        "modules": dict(__path__=[]),
        "modules.paths": dict(data_path=str(webui)),
        "modules.shared": dict(opts=opts),
        "modules.ui_tempdir": {}, "modules.script_callbacks": {}, "modules.processing": {},
    }
    for name, attrs in stand_ins.items():
        module = types.ModuleType(name)
        module.__dict__.update(attrs)
        sys.modules[name] = module
    versions = webui / "modules" / "infotext_versions.py"
    sys.modules["modules.infotext_versions"] = _load("modules.infotext_versions", versions) if versions.is_file() \
        else types.SimpleNamespace(backcompat=lambda res: None)
    for name in ("shared", "ui_tempdir", "script_callbacks", "processing", "infotext_versions", "paths"):
        setattr(sys.modules["modules"], name, sys.modules[f"modules.{name}"])
    return _load("modules.infotext_utils", source).parse_generation_parameters


def _load(name: str, path: Path):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def differences(text: str, parse) -> tuple[dict, list[str]]:
    """What we wrote (our own reading of the text) against A1111's reading: the list of fields that differ."""
    ours = parse_a1111_parameters(text)
    theirs = parse(text)
    diffs = []
    for key, value in ours.items():
        name = {"prompt": "Prompt", "negative_prompt": "Negative prompt"}.get(key, key)
        size = _SIZE.match(str(value)) if name not in ("Prompt", "Negative prompt") else None
        if size:
            got = (str(theirs.get(f"{name}-1")), str(theirs.get(f"{name}-2")))
            if got != size.groups():
                diffs.append(f"{name}: wrote {value!r}, A1111 read {got[0]}x{got[1]}")
        elif str(theirs.get(name)) != str(value):
            diffs.append(f"{name}: wrote {value!r}, A1111 read {theirs.get(name)!r}")
    return ours, diffs


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--webui", required=True, type=Path, help="a stable-diffusion-webui checkout")
    ap.add_argument("--json", type=Path, help="write the results here")
    ap.add_argument("pngs", nargs="+", type=Path)
    args = ap.parse_args(argv)
    parse = a1111_parser(args.webui.expanduser())
    results, failed = [], False
    for png in args.pngs:
        text, _ = read_png_metadata(str(png))
        if not text:
            print(f"{png}: no parameters text")
            failed = True
            continue
        ours, diffs = differences(text, parse)
        failed = failed or bool(diffs)
        fields = sorted(k for k in ours if k not in ("prompt", "negative_prompt"))
        print(f"{png.name}: {len(fields)} fields + prompts, {'all read back the same' if not diffs else 'DIFFERENT'}")
        for d in diffs:
            print(f"  {d}")
        results.append({"png": png.name, "parameters": text, "fields": fields, "differences": diffs})
    if args.json:
        args.json.write_text(json.dumps(results, indent=1, ensure_ascii=False) + "\n")
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
