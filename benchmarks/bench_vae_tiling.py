#!/usr/bin/env python
"""Peak memory of a VAE decode, tiled vs untiled: the real SD 1.5 VAE, 1024-2048 px, several tile sizes.

    .venv/bin/python benchmarks/bench_vae_tiling.py                 # measure every point (~1 h on 2 cores)
    .venv/bin/python benchmarks/bench_vae_tiling.py --only 2048     # only points whose id contains "2048"
    .venv/bin/python benchmarks/bench_vae_tiling.py --markdown      # print the table of docs/benchmarks.md

Each point builds diffusers' AutoencoderKL from lowvram_gen/configs/sd15/vae/config.json with seeded
random bfloat16 weights (bf16 has the same 2 bytes per element as float16 on a GPU, so the bytes compare
one for one) and decodes one seeded random latent of side/8 x side/8, batch 1, in a fresh subprocess.
The measurement is the one of benchmarks/calibrate_memory.py, whose helpers it imports: after a small
warm-up decode, reset the kernel's peak-RSS counter (/proc/self/clear_refs), read VmRSS, run
`vae.decode(latents)` under torch.inference_mode(), read VmHWM; activation = VmHWM - VmRSS(before),
the CPU analogue of torch.cuda.max_memory_allocated() minus memory_allocated() before the call. Workers
run with MALLOC_MMAP_THRESHOLD_=65536 MALLOC_TRIM_THRESHOLD_=0 so that freed tensors leave RSS at once.

Tiled points do what lowvram-gen's tiling does: vae.enable_tiling(), then vae.tile_sample_min_size = T and
vae.tile_latent_min_size = T // 8 (diffusers' default T is the config's sample_size, 512 for SD 1.5).
Seconds per decode are recorded too; they are informational (one decode, shared 2-core machine).

Before each point the driver reads MemAvailable and skips the point (recording why) when the project's
estimator (lowvram_gen.planning.estimate) predicts an activation above --max-gib (default 16) or more than is free.
Results go to docs/bench/vae_tiling.json, written after every point.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import shlex
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "docs" / "bench" / "vae_tiling.json"
sys.path.insert(0, str(Path(__file__).resolve().parent))
from calibrate_memory import _build  # noqa: E402  (the same VAE the calibration measures)
from peak_rss import reset_peak, run_worker, status, worker_env  # noqa: E402

ARCH = "sd15"
GiB = 1024**3
MiB = 1024**2
OVERLAP = 0.25  # diffusers' AutoencoderKL.tile_overlap_factor

# (id, side px, tile px or None for untiled). Ordered cheap to expensive within each group.
JOBS: list[tuple[str, int, int | None]] = [
    ("untiled-1024", 1024, None),
    ("tiled512-1024", 1024, 512),
    ("untiled-1536", 1536, None),
    ("tiled512-1536", 1536, 512),
    ("tiled512-2048", 2048, 512),
    ("tiled256-2048", 2048, 256),
    ("tiled768-2048", 2048, 768),
    ("untiled-2048", 2048, None),
    # beyond the three asked-for tile sizes: the tile lowvram-gen uses with >= 12 GiB free
    ("tiled1024-2048", 2048, 1024),
]


def n_tiles(side: int, tile: int | None) -> int:
    """Tiles diffusers' tiled_decode decodes for a square latent (1 when the decode is not tiled)."""
    lat, t = side // 8, (tile or 0) // 8
    if tile is None or lat <= t:
        return 1
    return len(range(0, lat, int(t * (1 - OVERLAP)))) ** 2


def mem_available() -> int:
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    return 0


def estimated_bytes(side: int, tile: int | None) -> int | None:
    """lowvram_gen.planning.estimate's prediction for this point (bf16, batch 1), or None if it cannot be had."""
    try:
        sys.path.insert(0, str(ROOT))
        from lowvram_gen.planning import estimate as memory
        from lowvram_gen.models import profile as profiles

        profile = profiles.profile_builtin(ARCH)
        return int(memory.vae_activation_bytes(profile, side, side, 1, 2, tiling=tile is not None, tile_px=tile))
    except Exception:  # noqa: BLE001  (the estimate is a guard and a comparison, not the measurement)
        return None


# --------------------------------------------------------------------------------------------- worker


def worker(job: dict) -> dict:
    import gc

    import torch

    torch.set_num_threads(int(os.environ.get("CALIB_THREADS", "2")))
    dtype = torch.bfloat16
    side, tile = job["side"], job["tile"]
    rss0 = status()["VmRSS"]
    vae, cfg = _build("vae", ARCH, dtype)
    gc.collect()
    weights = status()["VmRSS"] - rss0
    default_tile = vae.tile_sample_min_size
    if tile is not None:
        vae.enable_tiling()
        vae.tile_sample_min_size = tile
        vae.tile_latent_min_size = tile // 8
    ch = cfg.get("latent_channels", 4)
    # Warm-up through the same code path: 256 px untiled; tiled, a side just above the tile so that
    # tiling engages and full-size tiles are decoded.
    wside = 256 if tile is None else tile + 64
    g = torch.Generator().manual_seed(1)
    with torch.inference_mode():
        vae.decode(torch.randn(1, ch, wside // 8, wside // 8, generator=g).to(dtype))
    latents = torch.randn(1, ch, side // 8, side // 8, generator=torch.Generator().manual_seed(0)).to(dtype)
    gc.collect()
    reset_peak()
    before = status()["VmRSS"]
    t0 = time.perf_counter()
    with torch.inference_mode():
        out = vae.decode(latents).sample
    decode_s = time.perf_counter() - t0
    peak = status()["VmHWM"]
    return {
        **job,
        "n_tiles": n_tiles(side, tile),
        "diffusers_default_tile_px": default_tile,
        "weights_rss_bytes": weights,
        "rss_before_bytes": before,
        "peak_rss_bytes": peak,
        "activation_bytes": peak - before,
        "decode_s": round(decode_s, 1),
        "output_shape": list(out.shape),
        "output_finite": bool(torch.isfinite(out).all()),
        "threads": torch.get_num_threads(),
    }


# --------------------------------------------------------------------------------------------- driver


def load() -> dict:
    return json.loads(OUT.read_text()) if OUT.exists() else {}


def save(data: dict) -> None:
    OUT.parent.mkdir(parents=True, exist_ok=True)
    tmp = OUT.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(data, indent=1) + "\n")
    tmp.replace(OUT)


def header(argv: list[str]) -> dict:
    import diffusers
    import torch

    return {
        "what": "peak RSS of one AutoencoderKL.decode (SD 1.5 VAE config, random seeded bf16 weights), batch 1, "
                "square, CPU; activation = VmHWM - VmRSS before the call (see benchmarks/calibrate_memory.py)",
        "command": " ".join([".venv/bin/python", "benchmarks/bench_vae_tiling.py", *map(shlex.quote, argv)]),
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "torch": torch.__version__,
        "diffusers": diffusers.__version__,
        "dtype": "bfloat16 (2 bytes/element, as float16 on a GPU)",
        "machine": f"{platform.machine()}, {os.cpu_count()} CPUs, "
                   f"{os.sysconf('SC_PAGE_SIZE') * os.sysconf('SC_PHYS_PAGES') / GiB:.0f} GiB RAM",
        "tile_overlap_factor": OVERLAP,
    }


def measure(argv: list[str], only: str | None, timeout: int, max_gib: float) -> None:
    env = worker_env()
    order = [j[0] for j in JOBS]
    for job_id, side, tile in JOBS:
        if only and only not in job_id:
            continue
        job = {"id": job_id, "side": side, "tile": tile}
        est = estimated_bytes(side, tile)
        if est is None:  # no estimator: scale the untiled 1024 px point (~2.05 GiB) with the area
            est = int(2.05 * GiB * (min(side, tile or side) / 1024) ** 2)
        free = mem_available()
        job["estimated_bytes"] = est
        job["mem_available_bytes"] = free
        need = est + 1 * GiB  # + weights, torch/diffusers import and the output
        if est > max_gib * GiB or need > free - 1 * GiB:
            result = {**job, "skipped": f"estimated activation {est / GiB:.1f} GiB (+1 GiB for weights and "
                                        f"imports) against a {max_gib:g} GiB cap and {free / GiB:.1f} GiB "
                                        f"MemAvailable (1 GiB kept free)"}
            print(f"[vae-tiling] {job_id}: skipped: {result['skipped']}", flush=True)
        else:
            print(f"[vae-tiling] {job_id} (estimated {est / MiB:.0f} MiB, {free / GiB:.1f} GiB free) ...", flush=True)
            t0 = time.time()
            result = run_worker(__file__, "--worker", job, timeout, env)
            result["wall_s"] = round(time.time() - t0, 1)
            print(f"[vae-tiling] {job_id}: {result['wall_s']:.0f} s, "
                  + (f"{result['activation_bytes'] / MiB:.0f} MiB, decode {result['decode_s']} s"
                     if "activation_bytes" in result else result.get("error", "")), flush=True)
        data = load()
        rows = [r for r in data.get("points", []) if r["id"] != job_id] + [result]
        rows.sort(key=lambda r: order.index(r["id"]) if r["id"] in order else len(order))
        save({**header(argv), "points": rows})


def markdown() -> None:
    data = load()
    print("| side (px) | decode | tiles | activation peak (MiB) | estimator (MiB) | decode (s) |")
    print("|---|---|---|---|---|---|")
    rows = sorted(data.get("points", []), key=lambda r: (r["tile"] is not None, r["side"], r["tile"] or 0))
    for r in rows:
        how = "untiled" if r["tile"] is None else f"tiled, {r['tile']} px tiles"
        est = f"{r['estimated_bytes'] / MiB:.0f}" if r.get("estimated_bytes") else "-"
        if "activation_bytes" in r:
            print(f"| {r['side']} | {how} | {r['n_tiles']} | {r['activation_bytes'] / MiB:.0f} | {est} "
                  f"| {r['decode_s']:.0f} |")
        else:
            print(f"| {r['side']} | {how} | - | not measured: {r.get('skipped') or r.get('error', '')[:80]} "
                  f"| {est} | - |")


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    ap.add_argument("--only", help="measure only points whose id contains this text")
    ap.add_argument("--timeout", type=int, default=1800, help="seconds per point (default 1800)")
    ap.add_argument("--max-gib", type=float, default=16.0,
                    help="skip a point whose estimated activation is above this (default 16)")
    ap.add_argument("--markdown", action="store_true", help="print the table of docs/benchmarks.md and exit")
    args = ap.parse_args(argv)
    if args.worker:
        print(json.dumps(worker(json.loads(args.worker))), flush=True)
        return 0
    if args.markdown:
        markdown()
        return 0
    measure(argv, args.only, args.timeout, args.max_gib)
    markdown()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
