"""Anonymous vs file-backed memory of a real-size GGUF UNet, loaded our way and diffusers' way (issue 17).

diffusers' GGUF reader copies every tensor out of the file's memory map; lowvram-gen maps the blocks
(models/gguf_file.mapped_checkpoint), so they stay file pages the kernel can drop instead of anonymous
memory only the OOM killer can take back. This builds the real SD 1.5 UNet (lowvram_gen/configs/sd15,
seeded random fp16 weights as benchmarks/realsize.py makes them), writes it as a Q8_0 GGUF the way
ComfyUI-GGUF does (tests/gguf_files.py), once, under $LOWVRAM_GEN_BENCH, then in a fresh process per way
loads the UNet through the project's loader and reads /proc/self/status: RssAnon and RssFile after the
load, and after one 256 px UNet forward (which reads every block).

    python benchmarks/gguf_rss.py            # results in docs/bench/gguf_rss.json
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path[:0] = [str(HERE), str(ROOT), str(ROOT / "tests")]
OUT = ROOT / "docs" / "bench" / "gguf_rss.json"
CONFIGS = ROOT / "lowvram_gen" / "configs" / "sd15"


def gguf_path() -> Path:
    root = Path(os.environ.get("LOWVRAM_GEN_BENCH") or Path.home() / ".cache" / "lowvram-gen" / "bench")
    return root / "sd15-unet-Q8_0.gguf"


def build(path: Path) -> Path:
    if path.is_file():
        return path
    import gguf
    import gguf_files
    from realsize import _component

    config = json.loads((CONFIGS / "unet" / "config.json").read_text())
    unet = _component("diffusers", "UNet2DConditionModel", config, seed=0)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    gguf_files.write_gguf(tmp, gguf_files.unet_state(unet), gguf.GGMLQuantizationType.Q8_0)
    tmp.rename(path)
    return path


def worker(way: str, path: str) -> dict:
    import torch

    from lowvram_gen import families
    from lowvram_gen.models import gguf_file
    from peak_rss import status

    if way == "copied":  # diffusers' own reader, as before
        from diffusers.models.model_loading_utils import load_gguf_checkpoint

        gguf_file.mapped_checkpoint = lambda p: load_gguf_checkpoint(str(p))
    keys = ("VmRSS", "RssAnon", "RssFile")
    before = status(keys)
    header = gguf_file.read_header(path)
    _, unet = gguf_file.load_denoiser(path, header, families.SD15, CONFIGS, torch.float32)
    loaded = status(keys)
    with torch.inference_mode():
        g = torch.Generator().manual_seed(0)
        unet(torch.randn(1, 4, 32, 32, generator=g), 500, torch.randn(1, 77, 768, generator=g))
    ran = status(keys)
    gib = 1024**3
    return {"file_gib": round(Path(path).stat().st_size / gib, 3),
            **{f"{phase}_{k}_gib": round((v - before.get(k, 0)) / gib, 3)
               for phase, s in (("load", loaded), ("forward", ran)) for k, v in s.items()}}


def main() -> int:
    if len(sys.argv) == 3 and sys.argv[1] in ("mapped", "copied"):
        print(json.dumps(worker(sys.argv[1], sys.argv[2])))
        return 0
    path = build(gguf_path())
    results = {}
    for way in ("copied", "mapped"):
        run = subprocess.run([sys.executable, __file__, way, str(path)], capture_output=True, text=True,
                             env=dict(os.environ, MALLOC_MMAP_THRESHOLD_="65536", OMP_NUM_THREADS="2"))
        if run.returncode != 0:
            print(run.stderr[-3000:], file=sys.stderr)
            return 1
        results[way] = json.loads(run.stdout.strip().splitlines()[-1])
        print(way, results[way], file=sys.stderr)
    report = {"model": "sd15 unet, real architecture, random weights, Q8_0 (ComfyUI-GGUF layout)",
              "measure": "growth of /proc/self/status fields over the process before the load", "results": results}
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps(report, indent=1) + "\n")
    print(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
