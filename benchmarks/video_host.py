#!/usr/bin/env python
"""Host RAM of a whole video job against the plan's host estimate (issue 33), on width-scaled real folders.

For each point a folder is built once with benchmarks/realsize_video.py (the shipped config with fewer heads: the
depth, head width, FFN ratio and the real VAE kept; the text encoder one layer at full width), then:
- `lowvram-gen plan ... --cpu --json` gives the host estimate of the preset it picks (`host_peak_bytes`: the process's
  peak RSS, baseline included);
- `lowvram-gen video ... --cpu --json` runs the same job in a child process, and the child's peak RSS
  (getrusage(RUSAGE_CHILDREN).ru_maxrss) is the measurement.
Both run the same folder, frames, size and steps on this CPU, so the estimate is the planner's own and the error is
what it would be on any machine for the same job.

    python benchmarks/video_host.py [--only wan21] [--steps 2]    # -> benchmarks/results/video_host.json
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import realsize_video  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "benchmarks" / "results" / "video_host.json"
# name: (shipped config, transformer overrides (fewer heads), frames, width, height)
POINTS = {
    "wan21": ("wan21-t2v-1.3b", {"num_attention_heads": 4}, 17, 256, 256),
    "wan22": ("wan22-ti2v-5b", {"num_attention_heads": 4}, 9, 320, 192),
    "a14b": ("wan22-t2v-a14b", {"num_attention_heads": 4}, 9, 256, 256),  # both experts in RAM, one running
    # LTX attends across at its own width: the cross-attention width is cut with the heads
    "ltx": ("ltx-video", {"num_attention_heads": 4, "cross_attention_dim": 256}, 25, 256, 256),
}


def run(point: str, steps: int, root: Path) -> dict:
    name, cut, frames, width, height = POINTS[point]
    folder = realsize_video.build(name, root / f"{name}-scaled", overrides={"transformer": cut, "transformer_2": cut})
    job = ["--model", str(folder), "--frames", str(frames), "--width", str(width), "--height", str(height), "--cpu"]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    plan = json.loads(subprocess.run([sys.executable, "-m", "lowvram_gen", "plan", *job, "--steps", str(steps),
                                      "--json"], capture_output=True, text=True, check=True, env=env).stdout)
    chosen = next(p for p in plan["presets"] if p["name"] == plan["preset"])
    before = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    started = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "lowvram_gen", "video", "a red fox in snow", *job, "--steps",
                           str(steps), "--seed", "1", "--json", "--outdir", str(root / "out")],
                          capture_output=True, text=True, env=env)
    seconds = time.perf_counter() - started
    peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024  # KiB on Linux
    if peak <= before * 1024:
        raise SystemExit("the child's peak is not above an earlier child's: run each point in its own process")
    if done.returncode:
        raise SystemExit(f"{point}: the job failed, nothing measured:\n{done.stderr[-2000:]}")
    result = json.loads(done.stdout)
    estimate = chosen["host_peak_bytes"]
    return {"point": point, "config": name, "transformer_overrides": cut, "frames": frames, "width": width,
            "height": height, "steps": steps, "preset": plan["preset"], "ran": result.get("preset"),
            "estimate_bytes": estimate, "measured_peak_rss_bytes": peak,
            "error_percent": round(100 * (estimate - peak) / peak, 1), "seconds": round(seconds, 1),
            "host_breakdown": chosen.get("host")}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--only", default=",".join(POINTS))
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--root", default=os.environ.get("LOWVRAM_GEN_BENCH") or "/tmp/video-host")
    parser.add_argument("--_point", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args._point:  # one point in this process: its children's peak is the job's alone
        print(json.dumps(run(args._point, args.steps, Path(args.root))))
        return
    rows = []
    for point in args.only.split(","):
        out = subprocess.run([sys.executable, __file__, "--_point", point, "--steps", str(args.steps), "--root",
                              args.root], capture_output=True, text=True)
        if out.returncode:
            print(out.stderr[-2000:], file=sys.stderr)
            continue
        row = json.loads(out.stdout.strip().splitlines()[-1])
        rows.append(row)
        print(f"{row['point']}: {row['preset']} estimate {row['estimate_bytes'] / 2**30:.2f} GiB, measured "
              f"{row['measured_peak_rss_bytes'] / 2**30:.2f} GiB ({row['error_percent']:+.1f} %), {row['seconds']} s",
              flush=True)
    if OUT.exists():  # the points not measured this time keep their stored rows
        done = {r["point"] for r in rows}
        rows = [r for r in json.loads(OUT.read_text())["rows"] if r["point"] not in done] + rows
    data = {"date": time.strftime("%Y-%m-%d"), "command": " ".join(sys.argv), "rows": rows}
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps(data, indent=1))
    print(f"-> {OUT}")


if __name__ == "__main__":
    main()
