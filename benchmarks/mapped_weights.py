"""Do memory-mapped 16-bit weights survive a memory limit below their size? (issue 17, "offload to disk")

The cpu+half candidate keeps a half-precision checkpoint's weights as the safetensors files map them and
upcasts each layer as it runs. Those weights are clean file pages: under a cgroup limit the kernel can drop
them and read them again from disk, so the process should slow down rather than be killed, which is what
an "offload to disk" rung on a CPU would rely on. The planner does not count on it yet (it counts mapped
weights as must-fit). This runs the real-size SDXL folder (benchmarks/realsize.py, 6.9 GB of fp16
safetensors) that way, one 512 px step, in a cgroup v1 memory cgroup of `--limit` GiB (root only), and
records how it ended, the wall time, the cgroup's peak and the child's peak anonymous memory.

    sudo python benchmarks/mapped_weights.py --limit 6      # results in docs/bench/mapped_weights.json
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path[:0] = [str(HERE), str(ROOT)]
OUT = ROOT / "docs" / "bench" / "mapped_weights.json"
CGROUP = Path("/sys/fs/cgroup/memory")


def worker(folder: str) -> None:
    """Load at float16 (mapped), upcast per layer (the cpu+half preset's own call), one 512 px step."""
    from types import SimpleNamespace

    import torch
    from diffusers import AutoPipelineForText2Image

    from lowvram_gen.engines.sd.apply import PipelineOps
    from peak_rss import status

    pipe = AutoPipelineForText2Image.from_pretrained(folder, dtype=torch.float16)
    PipelineOps(SimpleNamespace(components=pipe.components)).half_storage("float32")
    start = time.perf_counter()
    pipe("a red fox", num_inference_steps=1, width=512, height=512, output_type="np",
         generator=torch.Generator().manual_seed(0))
    peak = status(("VmHWM", "RssAnon", "RssFile"))
    print(json.dumps({"step_and_decode_s": round(time.perf_counter() - start, 1),
                      **{k: round(v / 2**30, 2) for k, v in peak.items()}}))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--limit", type=float, default=6.0, help="the cgroup's memory limit in GiB")
    ap.add_argument("--timeout", type=int, default=1500)
    ap.add_argument("--worker")
    args = ap.parse_args()
    if args.worker:
        worker(args.worker)
        return 0
    from realsize import build

    folder = build("sdxl")
    group = CGROUP / f"lowvram-mapped-{os.getpid()}"
    group.mkdir()
    try:
        (group / "memory.limit_in_bytes").write_text(str(int(args.limit * 2**30)))
        subprocess.run(["sync"], check=False)
        Path("/proc/sys/vm/drop_caches").write_text("3")  # cold: the weights come from disk
        start = time.perf_counter()
        child = subprocess.Popen([sys.executable, __file__, "--worker", str(folder)], stdout=subprocess.PIPE,
                                 stderr=subprocess.PIPE, text=True,
                                 preexec_fn=lambda: (group / "cgroup.procs").write_text(str(os.getpid())),
                                 env=dict(os.environ, MALLOC_MMAP_THRESHOLD_="65536", OMP_NUM_THREADS="2"))
        try:
            out, err = child.communicate(timeout=args.timeout)
            outcome = "ok" if child.returncode == 0 else ("killed" if child.returncode == -9 else "error")
        except subprocess.TimeoutExpired:
            child.kill()
            out, err = child.communicate()
            outcome = "timeout"
        record = {"model": "sdxl real size, random fp16 weights (6.9 GB)", "preset": "cpu+half (mapped, upcast per layer)",
                  "limit_gib": args.limit, "outcome": outcome, "wall_s": round(time.perf_counter() - start, 1),
                  "cgroup_peak_gib": round(int((group / "memory.max_usage_in_bytes").read_text()) / 2**30, 2)}
        if outcome == "ok":
            record.update(json.loads(out.strip().splitlines()[-1]))
        else:
            record["stderr_tail"] = err[-500:]
    finally:
        try:
            group.rmdir()
        except OSError:
            pass
    print(json.dumps(record, indent=1))
    results = json.loads(OUT.read_text()) if OUT.is_file() else []
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps([r for r in results if r.get("limit_gib") != args.limit] + [record], indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
