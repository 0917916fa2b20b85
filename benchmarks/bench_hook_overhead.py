#!/usr/bin/env python
"""What a budget-offload hook costs a step on this CPU: seconds per forward against the number of streamed units.

    python benchmarks/bench_hook_overhead.py             # -> docs/bench/hook_overhead.json
    python benchmarks/bench_hook_overhead.py --markdown  # the table of docs/benchmarks.md

Why. planning/residency.py cuts the blocks that stream into units of at most SHARE of the bytes that stream, so a
split moves little beyond what cannot stay; every streamed unit is one diffusers group hook (onload before its
forward, offload after). This measures what a hook costs where it can be measured without a GPU: a toy model of
LAYERS Linear layers of WIDTH x WIDTH (the same weights, the same parameters, one forward of one token, so the
arithmetic is negligible) streamed as N units of LAYERS / N layers each, hooked exactly as
engines/sd/apply.PipelineOps.budget_offload hooks streamed blocks (block-level group offloading of a container
holding them, no stream, onload and offload device "cpu"). On a CPU `.to("cpu")` copies nothing, so the time over
the unhooked forward is the hooks' own work (Python dispatch, the per-tensor moves' bookkeeping); the slope over N
is the cost of one more unit. A GPU adds the copy itself (bytes / bus speed, the same whatever N) and, per unit, a
stream synchronisation and the launch of its copies: what only a GPU run shows (benchmarks/bench_budget_gpu.py).
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
sys.path.insert(0, str(ROOT))
OUT = ROOT / "docs" / "bench" / "hook_overhead.json"
LAYERS, WIDTH = 512, 64
UNITS = (1, 8, 32, 64, 128, 256, 512)


def build(units: int):
    import torch

    torch.manual_seed(0)
    per = LAYERS // units
    model = torch.nn.Module()
    model.blocks = torch.nn.ModuleList(
        torch.nn.Sequential(*(torch.nn.Linear(WIDTH, WIDTH) for _ in range(per))) for _ in range(units))
    return model.eval()


def forward(model, x):
    for block in model.blocks:
        x = block(x)
    return x


def seconds(model, x, repeats: int) -> float:
    import torch

    with torch.inference_mode():
        forward(model, x)  # warm-up
        times = []
        for _ in range(repeats):
            start = time.process_time()  # CPU time: the 2-core machine is shared, wall time is not ours
            forward(model, x)
            times.append(time.process_time() - start)
    return statistics.median(times)


def hooked(model) -> None:
    """Group hooks on the model's blocks as budget_offload puts them on streamed units."""
    import torch
    from diffusers.hooks import apply_group_offloading

    holder = torch.nn.Module()
    holder.blocks = torch.nn.ModuleList(list(model.blocks))
    apply_group_offloading(holder, onload_device=torch.device("cpu"), offload_device=torch.device("cpu"),
                           offload_type="block_level", num_blocks_per_group=1, use_stream=False)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repeats", type=int, default=30)
    ap.add_argument("--markdown", action="store_true")
    args = ap.parse_args()
    if args.markdown:
        print(markdown(json.loads(OUT.read_text())))
        return
    import diffusers
    import torch

    torch.set_num_threads(1)
    x = torch.randn(1, WIDTH)
    rows = []
    for n in UNITS:
        model = build(n)
        plain = seconds(model, x, args.repeats)
        hooked(model)
        with_hooks = seconds(model, x, args.repeats)
        rows.append({"units": n, "plain_s": plain, "hooked_s": with_hooks, "hooks_s": with_hooks - plain})
        print(f"{n:4d} units: plain {plain * 1e3:.2f} ms, hooked {with_hooks * 1e3:.2f} ms, "
              f"hooks {(with_hooks - plain) * 1e3:.2f} ms a forward", flush=True)
    xs, ys = [r["units"] for r in rows], [r["hooks_s"] for r in rows]
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    slope = sum((a - mx) * (b - my) for a, b in zip(xs, ys)) / sum((a - mx) ** 2 for a in xs)
    data = {"command": "python benchmarks/bench_hook_overhead.py", "torch": torch.__version__,
            "diffusers": diffusers.__version__, "machine": platform.processor() or platform.machine(),
            "date": time.strftime("%Y-%m-%d"), "layers": LAYERS, "width": WIDTH, "threads": 1, "rows": rows,
            "seconds_per_unit": slope, "seconds_fixed": my - slope * mx}
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps(data, indent=1))
    print(markdown(data))
    print(f"-> {OUT}")


def markdown(data: dict) -> str:
    lines = ["| streamed units | forward, no hooks (ms) | forward, hooked (ms) | the hooks (ms) |", "|---|---|---|---|"]
    for r in data["rows"]:
        lines.append(f"| {r['units']} | {r['plain_s'] * 1e3:.2f} | {r['hooked_s'] * 1e3:.2f} | {r['hooks_s'] * 1e3:.2f} |")
    lines.append(f"\nA unit costs {data['seconds_per_unit'] * 1e6:.0f} µs a step on this CPU (least squares over the rows).")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
