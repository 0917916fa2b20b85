"""Does lowvram-gen add time to a generation? Same tiny 512x512 job through us and plain diffusers.

    .venv/bin/python benchmarks/bench_overhead.py [--runs 7] [--steps 4]

Both sides load the model once, then alternate runs (so drift hits both alike); each run makes and
saves one PNG. Prints and writes docs/bench/overhead.json with the medians and their ratio.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--size", type=int, default=512)
    parser.add_argument("--out", default=str(Path(__file__).resolve().parent.parent / "docs/bench/overhead.json"))
    args = parser.parse_args()

    import torch
    from diffusers import AutoPipelineForText2Image

    from lowvram_gen import GenerationRequest
    from lowvram_gen.models.tiny import ensure_tiny
    from lowvram_gen.session import Session

    folder = ensure_tiny("tiny")
    plain = AutoPipelineForText2Image.from_pretrained(str(folder))
    plain.set_progress_bar_config(disable=True)
    session = Session()
    outdir = Path(tempfile.mkdtemp(prefix="bench-overhead-"))
    request = GenerationRequest(prompt="a lighthouse at dusk", width=args.size, height=args.size, steps=args.steps,
                                seed=1, outdir=str(outdir))

    def ours() -> float:
        t = time.perf_counter()
        session.generate(request)
        return time.perf_counter() - t

    def theirs() -> float:
        t = time.perf_counter()
        image = plain("a lighthouse at dusk", width=args.size, height=args.size, num_inference_steps=args.steps,
                      generator=torch.Generator().manual_seed(1)).images[0]
        image.save(outdir / f"plain-{time.monotonic_ns()}.png")
        return time.perf_counter() - t

    ours(), theirs()  # warm-up: model load, first-call kernel selection
    a, b = [], []
    for _ in range(args.runs):
        a.append(ours())
        b.append(theirs())
    result = {
        "job": f"tiny {args.size}x{args.size}, {args.steps} steps, 1 image, PNG saved",
        "runs": args.runs, "lowvram_gen_s": a, "diffusers_s": b,
        "median_lowvram_gen_s": statistics.median(a), "median_diffusers_s": statistics.median(b),
        "ratio": statistics.median(a) / statistics.median(b),
        "torch": torch.__version__, "threads": torch.get_num_threads(),
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=1))
    print(f"median lowvram-gen {result['median_lowvram_gen_s']:.3f} s, diffusers {result['median_diffusers_s']:.3f} s, "
          f"ratio {result['ratio']:.3f}  -> {args.out}")


if __name__ == "__main__":
    main()
