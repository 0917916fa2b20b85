"""How long `lowvram-gen plan` takes, and proof that making it faster changed no plan.

    python benchmarks/plan_speed.py                      # every request; writes benchmarks/results/plan_speed.json
    python benchmarks/plan_speed.py --compare OLD.json   # the same, then exits 1 if any plan differs from OLD's
    python benchmarks/plan_speed.py --only qwen          # the requests whose arguments contain "qwen"

Plans a fixed set of requests (SD 1.5, SDXL, SD3, FLUX.1, Qwen-Image, HiDream, Z-Image, Flux.2 klein at 2 to 12 GiB,
with and without a ControlNet, a capped size, ones that search the nearest card or RAM) through the CLI's own
`plan --json`, the RAM always given (the real machine's free RAM would change the plans), in a fresh
LOWVRAM_GEN_HOME (no remembered failures or measured step times), one process for all (as a UI plans job after job:
the caches the first plans fill serve the later ones; a CLI `plan` is a fresh process). Each plan is stored with the
seconds it took (CPU and wall) and the SHA-256 of its whole JSON: `--compare` checks that a faster planner makes every
number, name and sentence of the old one. benchmarks/results/plan_speed_before.json: the planner before its caches.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import io
import json
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
RESULTS = ROOT / "benchmarks" / "results" / "plan_speed.json"

REQUESTS = (
    ("sd15", "4", "16", ()), ("sd15", "2", "8", ()), ("sd15", "4", "16", ("--controlnet", "sd15")),
    ("sdxl", "4", "16", ()), ("sdxl", "6", "16", ()), ("sdxl", "8", "32", ()),
    ("sdxl", "6", "16", ("--controlnet", "sdxl")),
    ("sdxl", "6", "16", ("--controlnet", "sdxl", "--width", "512", "--height", "512")),
    ("sd3", "8", "32", ()), ("flux", "8", "32", ()), ("flux", "12", "32", ()),
    ("qwen-image", "8", "32", ()),  # the target
    ("qwen-image", "8", "16", ()), ("qwen-image", "2", "64", ()),  # the nearest RAM, the nearest card
    ("qwen-image", "6", "32", ("--width", "1328", "--height", "1328")),  # capped: the largest size that fits
    ("hidream", "12", "32", ()), ("hidream", "12", "32", ("--width", "512", "--height", "512")),
    ("z-image", "6", "16", ()), ("flux2-klein", "4", "12", ()),
)


def args_of(model: str, vram: str, ram: str, extra: tuple[str, ...]) -> list[str]:
    return ["plan", "--model", model, "--vram", f"{vram}GiB", "--ram", f"{ram}GiB", *extra, "--json"]


def plan_once(args: list[str]) -> tuple[dict, float, float]:
    """(the plan's JSON, wall seconds, CPU seconds of this process) of one `lowvram-gen plan` in this process. The
    CPU seconds are the number to compare on a shared machine: the wall clock counts the other programs' turns."""
    from lowvram_gen.cli.main import main

    out = io.StringIO()
    start, cpu = time.perf_counter(), time.process_time()
    with contextlib.redirect_stdout(out):
        code = main(args)
    seconds, cpu = time.perf_counter() - start, time.process_time() - cpu
    if code != 0:
        raise SystemExit(f"plan {' '.join(args)} exited {code}")
    return json.loads(out.getvalue()), seconds, cpu


def summary(result: dict) -> dict:
    """What the results file keeps of a plan: the pick, its ladder and numbers, the sentence on what would fit, and
    the SHA-256 of the whole JSON (sorted keys), which `--compare` compares: any number, name or sentence that
    changes changes it (the whole JSON of 19 plans is most of a megabyte)."""
    rows = result["presets"]
    chosen = next((r for r in rows if r["name"] == result["preset"]), {})
    return {"preset": result["preset"], "ladder": result["ladder"], "estimate_bytes": chosen.get("estimate_bytes"),
            "streamed_bytes_per_step": chosen.get("streamed_bytes_per_step"),
            "host_peak_bytes": chosen.get("host_peak_bytes"), "candidates": len(rows), "nearest": result["nearest"],
            "refusal": result["refusal"],
            "plan_sha256": hashlib.sha256(json.dumps(result, sort_keys=True).encode()).hexdigest()}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--compare", type=Path, help="an earlier results file: exit 1 if any plan differs from it")
    ap.add_argument("--only", default="", help="plan only the requests whose arguments contain this text")
    ap.add_argument("--out", type=Path, default=RESULTS)
    opts = ap.parse_args(argv)
    os.environ["LOWVRAM_GEN_HOME"] = tempfile.mkdtemp(prefix="plan_speed_")
    rows = []
    for model, vram, ram, extra in REQUESTS:
        args = args_of(model, vram, ram, extra)
        if opts.only not in " ".join(args):
            continue
        result, seconds, cpu = plan_once(args)
        rows.append({"args": args, "seconds": round(seconds, 3), "cpu_seconds": round(cpu, 3), **summary(result)})
        print(f"{cpu:8.2f} s CPU {seconds:8.2f} s wall  {' '.join(args[1:-1])}  -> {result['preset']}", flush=True)
    total, cpu = sum(r["seconds"] for r in rows), sum(r["cpu_seconds"] for r in rows)
    print(f"{cpu:8.2f} s CPU {total:8.2f} s wall  in all")
    opts.out.parent.mkdir(parents=True, exist_ok=True)
    opts.out.write_text(json.dumps({"total_seconds": round(total, 3), "cpu_seconds": round(cpu, 3), "requests": rows},
                                   indent=1) + "\n")
    if opts.compare:
        old = {" ".join(r["args"]): r for r in json.loads(opts.compare.read_text())["requests"]}
        differ = [" ".join(r["args"]) for r in rows
                  if old.get(" ".join(r["args"]), {}).get("plan_sha256") != r["plan_sha256"]]
        for r in rows:
            key = " ".join(r["args"])
            if key in old:
                print(f"{old[key]['cpu_seconds']:8.2f} s -> {r['cpu_seconds']:8.2f} s CPU  {key}")
        print("plans differ: " + "; ".join(differ) if differ else f"all {len(rows)} plans identical")
        return 1 if differ else 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
