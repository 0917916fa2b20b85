"""Count the floating-point operations of one denoiser forward, for the planner's time estimate.

The planner (lowvram_gen/planning/timing.py) estimates a step's compute as

    flops = coefficient(arch) x denoiser parameters x latent pixels x images in the forward

and this script measures the coefficient: each built-in architecture's UNet or transformer is built
from its shipped config on the meta device (no memory, no weights), run once under
torch.utils.flop_counter.FlopCounterMode (which counts matmuls, convolutions and SDPA from shapes
alone), at its native size and one other size. The coefficient is a weight's uses per latent pixel: a
linear layer on a token stream is used once per token, a convolution once per pixel of its level, so
it differs by architecture (a UNet's deep levels see fewer pixels). The two sizes show how far from
linear it is (attention grows with tokens squared). Results go into lowvram_gen/configs/calibration.json
("flops") and docs/benchmarks.md.

    python benchmarks/count_flops.py          # about a minute on 2 cores
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

CASES = [("sd15", "unet", 512, 768), ("sd21", "unet", 768, 512), ("sdxl", "unet", 1024, 768),
         ("sd3", "transformer", 1024, 512), ("flux", "transformer", 1024, 512)]
CALIBRATION = ROOT / "lowvram_gen" / "configs" / "calibration.json"
RESULTS = ROOT / "docs" / "bench" / "flops.json"


def count(arch: str, component: str, side: int) -> dict:
    import torch
    from accelerate import init_empty_weights
    from torch.utils._pytree import tree_map
    from torch.utils.flop_counter import FlopCounterMode

    import diffusers
    from calibrate_memory import CONFIGS, _inputs

    cfg = json.loads((CONFIGS / arch / component / "config.json").read_text())
    cls = getattr(diffusers, cfg["_class_name"])
    with init_empty_weights(include_buffers=True):
        model = cls.from_config(cfg).to(torch.bfloat16)
    params = sum(p.numel() for p in model.parameters())
    images = 1 if arch == "flux" else 2  # CFG doubles the batch, except guidance-distilled Flux
    kw = _inputs(component, cfg, side, side, images, torch.bfloat16, arch)
    kw = tree_map(lambda t: t.to("meta") if isinstance(t, torch.Tensor) else t, kw)
    start = time.perf_counter()
    with torch.no_grad(), FlopCounterMode(display=False) as counter:
        model(**kw)
    latent_pixels = (side // 8) ** 2
    flops = counter.get_total_flops()
    return {"arch": arch, "side": side, "images": images, "params": params, "flops": flops,
            "coefficient": flops / (params * latent_pixels * images), "count_s": round(time.perf_counter() - start, 1)}


def main() -> int:
    rows = [count(arch, component, side) for arch, component, *sides in CASES for side in sides]
    for r in rows:
        print(f"{r['arch']:5} {r['side']:5} px  {r['flops'] / 1e12:8.2f} TFLOP/forward  coefficient {r['coefficient']:.4f}")
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps({"command": "python benchmarks/count_flops.py", "rows": rows}, indent=1) + "\n")
    data = json.loads(CALIBRATION.read_text())
    from lowvram_gen import families

    # the coefficient at the native size: what plans are made at; the other size shows the drift
    data["flops"] = {r["arch"]: round(r["coefficient"], 5) for r in rows if r["side"] == families.by_arch(r["arch"]).native_side}
    data["flops"]["custom"] = round(sum(data["flops"].values()) / len(data["flops"]), 5)
    CALIBRATION.write_text(json.dumps(data, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
