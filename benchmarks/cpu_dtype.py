"""The cpu preset's compute dtypes on the real SD 1.5 UNet: seconds per step and what each loses.

Issue 17 asks for float32 and bfloat16 measured on the real UNet where the CPU computes bfloat16 in
hardware (AVX512-BF16, AMX), since the planner offers `cpu+bf16` there and assumes it runs
`planning/timing.CPU_BF16_SPEEDUP` times faster than float32. This script builds the real SD 1.5 UNet
(lowvram_gen/configs/sd15, seeded random fp16 weights as benchmarks/realsize.py makes them) and times one
CFG step (batch 2) at the given size for each of the cpu preset's variants:

- float32: `cpu`, the weights converted to float32;
- bfloat16: `cpu+bf16`, weights and activations in bfloat16;
- half: `cpu+half`, the fp16 weights as stored, upcast per layer to float32 (diffusers' layerwise casting).

It reports the median of `--repeats` timed steps after one warm-up, the speed-up over float32, and the
difference of each output from float32's (max and mean absolute, relative to float32's output std).
Results go to docs/bench/cpu_dtype.json (the CPU's flags and torch's thread count with them).

    python benchmarks/cpu_dtype.py --size 512 --repeats 3
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "docs" / "bench" / "cpu_dtype.json"


def _unet():
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from realsize import CONFIGS, _component

    config = json.loads((CONFIGS / "sd15" / "unet" / "config.json").read_text())
    return _component("diffusers", "UNet2DConditionModel", config, seed=0)


def _variant(base, mode: str):
    """The UNet as the cpu preset's variant `mode` holds it, and the dtype its inputs take."""
    import copy

    import torch

    if mode == "float32":
        return copy.deepcopy(base).to(torch.float32), torch.float32
    if mode == "bfloat16":
        return copy.deepcopy(base).to(torch.bfloat16), torch.bfloat16
    from types import SimpleNamespace

    from lowvram_gen.engines.sd.apply import PipelineOps

    unet = copy.deepcopy(base)  # fp16 as stored, upcast per layer exactly as the cpu+half preset does it
    PipelineOps(SimpleNamespace(components={"unet": unet})).half_storage("float32")
    return unet, torch.float32


def measure(size: int, repeats: int, modes: tuple[str, ...]) -> dict:
    import torch

    from lowvram_gen.hardware.device import NATIVE_BF16_FLAGS

    base = _unet()
    g = torch.Generator().manual_seed(0)
    latents = torch.randn(2, 4, size // 8, size // 8, generator=g)
    context = torch.randn(2, 77, 768, generator=g)
    t = torch.tensor([500])
    results, reference = {}, None
    for mode in modes:
        unet, dtype = _variant(base, mode)
        times = []
        with torch.inference_mode():
            for i in range(repeats + 1):
                start = time.perf_counter()
                out = unet(latents.to(dtype), t, encoder_hidden_states=context.to(dtype)).sample.float()
                if i:  # the first is a warm-up (one-off allocations, oneDNN's kernel choice)
                    times.append(time.perf_counter() - start)
        row = {"median_s": round(statistics.median(times), 3), "times_s": [round(x, 3) for x in times]}
        if reference is None and mode == "float32":
            reference = out
        elif reference is not None:
            diff = (out - reference).abs()
            row["max_abs_diff_rel"] = round(float(diff.max() / reference.std()), 5)
            row["mean_abs_diff_rel"] = round(float(diff.mean() / reference.std()), 5)
        results[mode] = row
        del unet
        print(f"{mode}: {row}", file=sys.stderr)
    if "float32" in results:
        for mode, row in results.items():
            row["speedup_vs_float32"] = round(results["float32"]["median_s"] / row["median_s"], 2)
    flags = next((line.split() for line in open("/proc/cpuinfo") if line.startswith("flags")), [])
    return {"model": "sd15 unet (real architecture, random fp16 weights)", "size": size, "cfg_batch": 2,
            "repeats": repeats, "torch": torch.__version__, "threads": torch.get_num_threads(),
            "cpu": platform.processor() or platform.machine(),
            "native_bf16_flags": [f for f in NATIVE_BF16_FLAGS if f in flags],
            "capability": torch.backends.cpu.get_cpu_capability(), "results": results}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", type=int, default=512, help="image side in pixels (latent = size / 8)")
    parser.add_argument("--repeats", type=int, default=3, help="timed steps per variant, after one warm-up")
    parser.add_argument("--modes", default="float32,bfloat16,half")
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args()
    report = measure(args.size, args.repeats, tuple(args.modes.split(",")))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=1) + "\n")
    print(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
