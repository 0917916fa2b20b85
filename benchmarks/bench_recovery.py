"""The cost of recovering from out-of-memory: a tiny job with an OOM injected at the first preset,
against the same job started at the preset it lands on.

    .venv/bin/python benchmarks/bench_recovery.py [--runs 7]

The OOM is simulated (no GPU here): a forward pre-hook makes the UNet raise
torch.OutOfMemoryError whenever the first preset (no offload) is applied, as a too-small card
would on its first step. Writes docs/bench/recovery.json.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--size", type=int, default=512)
    parser.add_argument("--out", default=str(Path(__file__).resolve().parent.parent / "docs/bench/recovery.json"))
    args = parser.parse_args()

    import torch

    from lowvram_gen.hardware.device import probe
    from lowvram_gen.models.loading import load
    from lowvram_gen.models.resolve import resolve
    from lowvram_gen.presets import gpu_ladder, load_presets
    from lowvram_gen.engines.sd.stepdown import Runner
    from lowvram_gen.request import GenerationRequest

    ladder = gpu_ladder(load_presets())
    model = load(resolve("tiny"), "float32")
    runner = Runner(model, probe("cpu"))

    def hook(_module, _args):
        if runner.applied.offload == "none":
            raise torch.OutOfMemoryError("CUDA out of memory (simulated)")

    model.pipe.unet.register_forward_pre_hook(hook)

    def job(start: int) -> tuple[float, str]:
        runner.use(ladder[start].memory)  # where the previous job left it is not part of the timing
        t = time.perf_counter()
        request = GenerationRequest(prompt="a lighthouse", width=args.size, height=args.size, steps=args.steps)
        ladder_run = runner.run(request, [1], ladder[start:], lambda done: None)
        return time.perf_counter() - t, ladder_run.preset_name

    job(0), job(1)  # warm-up
    with_oom, direct = [], []
    for _ in range(args.runs):
        seconds, landed = job(0)
        assert landed == ladder[1].name
        with_oom.append(seconds)
        direct.append(job(1)[0])
    result = {
        "job": f"tiny {args.size}x{args.size}, {args.steps} steps; OOM injected at {ladder[0].name}, lands at {ladder[1].name}",
        "runs": args.runs, "with_oom_s": with_oom, "started_at_landing_preset_s": direct,
        "median_with_oom_s": statistics.median(with_oom), "median_direct_s": statistics.median(direct),
        "ratio": statistics.median(with_oom) / statistics.median(direct),
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=1))
    print(f"median with OOM {result['median_with_oom_s']:.3f} s, started at {ladder[1].name} "
          f"{result['median_direct_s']:.3f} s, ratio {result['ratio']:.3f} -> {args.out}")


if __name__ == "__main__":
    main()
