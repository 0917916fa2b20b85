"""`lowvram-gen upscale` and the web UI's Upscale tab: one image, upscaled and saved.

The saved PNG keeps the source's A1111 `parameters` (so PNG Info still shows how it was made) and
appends A1111's extras fields; its name is the folder's next counter and the source's name without its
own counter (`00009-7-a-fox.png` -> `00010-7-a-fox-upscaled.png`: no new seed, since nothing was seeded),
and the metadata names the source by file name only (an upload's temporary folder means nothing later).
"""

from __future__ import annotations

import time
from pathlib import Path

from lowvram_gen import outputs
from lowvram_gen.a1111.upscaler_names import check_upscaler, model_path
from lowvram_gen.hardware.device import probe
from lowvram_gen.errors import InvalidRequest
from lowvram_gen.paths import writable_folder
from lowvram_gen.request import MAX_SIDE, as_float, check_image_path
from lowvram_gen.upscale.upscalers import UpscaleReport, upscale_images

MAX_SCALE = 8.0


def run_upscale(image_path: str, scale, upscaler: str = "lanczos", outdir: str | None = None,
                device: str | None = None) -> dict:
    """Upscale one image by `scale` with `upscaler`; the result in `generate --json`'s shape."""
    from PIL import Image

    started = time.perf_counter()
    path = check_image_path("image", image_path)
    factor = as_float("scale", scale, 1.0, MAX_SCALE)
    name = check_upscaler(upscaler)
    writable_folder(outdir or outputs.default_outdir(), "the output folder")
    with Image.open(path) as im:
        source = im.convert("RGB")
    params_in = outputs.read_png_metadata(path)[0] if path.lower().endswith(".png") else None
    size = (round(source.width * factor), round(source.height * factor))
    if max(size) > MAX_SIDE * 2:
        raise InvalidRequest("scale", scale, f"{source.width}x{source.height} x{factor:g} is {size[0]}x{size[1]}; "
                                             f"at most {MAX_SIDE * 2} px a side")
    if device is None:
        device = probe().torch_device
    report = UpscaleReport(name)
    image = upscale_images([source], size, name, device, report=report)[0]
    # A1111's extras fields; the source's own `Size:` stays the one size in the text (the PNG has its own)
    extras = f"Postprocess upscale by: {factor:g}, Postprocess upscaler: {name}"
    parameters = f"{params_in}\n{extras}" if params_in else f"{extras}, Size: {size[0]}x{size[1]}"
    source_name = Path(path).name
    meta = {"source": source_name, "scale": factor, "upscaler": name, "tiles": report.tiles,
            "attempts": report.attempts, "model_passes": report.passes, "size": list(size), "version": 1}
    target = Path(outdir) if outdir else outputs.default_outdir()
    saved = outputs.save_png(image, outputs.next_image_path(target, None, outputs.derived_name(path, "upscaled")),
                             parameters, meta)
    seconds = round(time.perf_counter() - started, 3)
    passes = f" ({report.passes} model passes)" if report.passes > 1 else ""
    return {"images": [str(saved)], "seeds": [], "width": size[0], "height": size[1], "steps": 0, "sampler": None,
            "model": name, "model_path": str(model_path(name) or name), "seconds": seconds, "preset": None,
            "attempts": report.attempts, "model_passes": report.passes,
            "summary": f"upscaled x{factor:g} with {name}{passes} in {seconds:.1f} s",
            "generated_width": source.width, "generated_height": source.height, "upscaled": True,
            "device": device, "warnings": [], "source": source_name}
