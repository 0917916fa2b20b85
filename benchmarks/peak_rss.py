"""Peak-RSS measurement shared by the benchmark scripts (calibrate_memory, bench_vae_tiling, bench_vqgan).

Each point runs in a fresh worker process (the script itself with a worker flag), so one point's
allocator state cannot leak into the next. Workers run with glibc told to hand freed memory back at
once (every allocation over 64 KiB is its own mapping), so RSS follows live tensors; the peak of one
call is VmHWM after resetting it (`reset_peak`) minus VmRSS before the call.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys


def worker_env(**extra: str) -> dict[str, str]:
    return dict(os.environ, MALLOC_MMAP_THRESHOLD_="65536", MALLOC_TRIM_THRESHOLD_="0", OMP_NUM_THREADS="2",
                **extra)


def status(keys: tuple[str, ...] = ("VmRSS", "VmHWM"), pid: int | str = "self") -> dict[str, int]:
    """Fields of /proc/PID/status in bytes: by default VmRSS and VmHWM (the peak since the last reset) of
    this process; RssAnon/RssFile split the resident set. {} when the process is gone."""
    out = {}
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key in keys:
                    out[key] = int(value.split()[0]) * 1024
    except OSError:
        pass
    return out


def reset_peak() -> None:
    """Reset VmHWM to the current RSS (Linux: writing 5 to clear_refs)."""
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")


def run_worker(script: str, flag: str, job: dict, timeout: int, env: dict | None = None) -> dict:
    """Run `script flag JSON` and return the last JSON line it printed, or the job with an "error"."""
    try:
        proc = subprocess.run([sys.executable, script, flag, json.dumps(job)], env=env, capture_output=True,
                              text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {**job, "error": f"timed out after {timeout} s"}
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    if proc.returncode == 0 and lines:
        return json.loads(lines[-1])
    return {**job, "error": f"rc {proc.returncode}: " + (proc.stderr or proc.stdout)[-2000:]}
