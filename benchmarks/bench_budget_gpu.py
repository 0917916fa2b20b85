#!/usr/bin/env python
"""On a CUDA GPU: seconds per step, peak memory and host-to-device bytes of budget offload at a few
resident sizes, against no offload, model offload and block-level group offload. Not run yet: it was
written in a session without a GPU.

    python benchmarks/bench_budget_gpu.py [--only sd15,sdxl] [--steps 5]   # -> docs/bench/budget_gpu.json

Same denoisers and pipelines as bench_streamed_bytes.py (the real architectures from the shipped
configs, random bfloat16 weights; small text encoders and VAE), at the native size (SD 1.5 512 px,
SDXL 1024 px), one image with CFG. Each mode is applied to the loaded pipeline with
`apply_settings` (model offload: diffusers' `enable_model_cpu_offload`), then one job runs; a step is
timed from one `callback_on_step_end` to the next after `torch.cuda.synchronize()`, and the first step
(which traces the prefetch order and moves the model of model offload) is left out of the median.
Peak is `torch.cuda.max_memory_allocated()` over the job; bytes are counted by
`engines/sd/traffic.count_onloads`. The latents are compared with those of the no-offload run: the
copies are exact, so any difference is kernel noise.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_streamed_bytes import ARCHS, GiB, build_denoiser, build_pipeline  # noqa: E402

OUT = Path(__file__).resolve().parents[1] / "docs" / "bench" / "budget_gpu.json"


def job(pipe, arch, steps):
    import torch

    marks = []

    def on_step(_pipe, _i, _t, kwargs):
        torch.cuda.synchronize()
        marks.append(time.perf_counter())
        return kwargs

    side = ARCHS[arch][2]
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    marks.append(time.perf_counter())
    out = pipe("a lighthouse at dusk", num_inference_steps=steps, width=side, height=side, output_type="latent",
               generator=torch.Generator().manual_seed(1), callback_on_step_end=on_step)
    times = [b - a for a, b in zip(marks, marks[1:])]
    return out.images.float().cpu(), times, torch.cuda.max_memory_allocated(), base


def bench(arch, steps):
    import torch

    from lowvram_gen.hardware.device import probe
    from lowvram_gen.engines.sd.apply import apply_settings
    from lowvram_gen.engines.sd.traffic import count_onloads
    from lowvram_gen.models.blocks import blocks_of
    from lowvram_gen.settings import MemorySettings

    pipe = build_pipeline(arch, build_denoiser(arch))
    pipe.set_progress_bar_config(disable=True)
    den = getattr(pipe, ARCHS[arch][0])
    total = sum(b for _, b in blocks_of(den))
    gpu = probe()
    modes = [("none", MemorySettings(dtype="bfloat16")), ("model", None),
             ("group", MemorySettings(dtype="bfloat16", offload="group"))]
    modes += [(f"budget {f:.0%}", MemorySettings(dtype="bfloat16", offload="budget", resident_bytes=max(1, int(total * f))))
              for f in (0.0, 0.5, 0.75, 0.9)]
    rows, reference = [], None
    for name, settings in modes:
        with count_onloads() as meter:
            meter.watch(den)
            if settings is None:
                apply_settings(pipe, MemorySettings(dtype="bfloat16"), probe("cpu"))  # off the GPU, no hooks
                pipe.enable_model_cpu_offload(device=gpu.torch_device)
                residency = None
            else:
                residency = apply_settings(pipe, settings, gpu).residency
            latents, times, peak, base = job(pipe, arch, steps)
        if settings is None:
            pipe.remove_all_hooks()
        reference = latents if reference is None else reference
        row = {"mode": name, "resident_bytes": residency.resident_bytes if residency else None,
               "predicted_bytes_per_step": residency.streamed_bytes_per_step if residency else None,
               "bytes_per_forward": meter.forwards, "step_s": times, "median_step_s": statistics.median(times[1:]),
               "peak_allocated_bytes": peak, "allocated_before_bytes": base,
               "max_abs_diff_vs_none": float((latents - reference).abs().max())}
        rows.append(row)
        print(f"{arch} {name:12s} step {row['median_step_s'] * 1000:7.1f} ms  peak {peak / GiB:6.2f} GiB  "
              f"moved/step {meter.forwards[-1] / GiB:6.2f} GiB (pred {row['predicted_bytes_per_step']})  "
              f"diff {row['max_abs_diff_vs_none']:.2e}", flush=True)
    return {"arch": arch, "weights_bytes": sum(p.numel() * p.element_size() for p in den.parameters()), "rows": rows}


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--only", default="sd15,sdxl")
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--out", default=str(OUT))
    args = parser.parse_args()
    import diffusers
    import torch

    if not torch.cuda.is_available():
        raise SystemExit("needs a CUDA GPU")
    data = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "diffusers": diffusers.__version__,
            "date": time.strftime("%Y-%m-%d"), "steps": args.steps,
            "archs": [bench(a, args.steps) for a in args.only.split(",")]}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(data, indent=1))
    print(f"-> {args.out}")


if __name__ == "__main__":
    main()
