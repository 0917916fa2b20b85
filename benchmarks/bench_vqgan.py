#!/usr/bin/env python
"""VQGAN-CLIP: peak memory and iterations per second against the cutout chunk size.

    .venv/bin/python benchmarks/bench_vqgan.py                     # real architectures, random weights
    .venv/bin/python benchmarks/bench_vqgan.py --arch tiny          # the embedded tiny models (seconds)
    .venv/bin/python benchmarks/bench_vqgan.py --markdown           # print the table of docs/benchmarks.md

`real` is vqgan_imagenet_f16_16384's architecture (from its taming config, through our converter's
config mapping) and CLIP ViT-B/32's, with seeded random weights: activation memory and speed depend
on shapes, not on weight values, and nothing is downloaded. Each point runs in a fresh subprocess
(like benchmarks/calibrate_memory.py): it builds the models, runs one warm-up iteration, resets the
kernel's peak-RSS counter (VmHWM, via /proc/self/clear_refs), reads VmRSS, runs N iterations of the
real loop (`VqganLoop.gradient` + the optimiser step) and reads VmHWM. activation = VmHWM - VmRSS:
what an iteration needs on top of the weights, i.e. what max_memory_allocated minus the weights
would show on a GPU. glibc is told to hand freed memory back at once (MALLOC_MMAP_THRESHOLD_,
MALLOC_TRIM_THRESHOLD_) so RSS follows live tensors. Each point also records what
lowvram_gen/planning/vqgan.py estimates for it. Results: docs/bench/vqgan.json.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

from peak_rss import reset_peak, run_worker, status, worker_env  # benchmarks/peak_rss.py

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "docs" / "bench" / "vqgan.json"
F16 = {"embed_dim": 256, "n_embed": 16384, "ch": 128, "ch_mult": [1, 1, 2, 2, 4], "num_res_blocks": 2,
       "attn_resolutions": [16], "resolution": 256, "z_channels": 256, "in_channels": 3, "out_ch": 3}
VIT_B32 = dict(text=dict(hidden_size=512, intermediate_size=2048, num_hidden_layers=12, num_attention_heads=8,
                         max_position_embeddings=77, vocab_size=49408, bos_token_id=512, eos_token_id=513,
                         pad_token_id=513),
               vision=dict(hidden_size=768, intermediate_size=3072, num_hidden_layers=12, num_attention_heads=12,
                           image_size=224, patch_size=32),
               projection_dim=512)
# (chunk, gradient checkpointing, autocast): 64 cutouts in chunks of 64/32/16/8, then the other knobs.
POINTS = [(64, False, False), (32, False, False), (16, False, False), (8, False, False), (8, True, False),
          (8, True, True)]


def _models(arch: str):
    import torch

    from lowvram_gen.models import vqgan_models as vm

    if arch == "tiny":
        path = vm.ensure_tiny_vqgan_clip()
        return vm.load_vqgan(vm.resolve_vqgan("tiny")), vm.load_clip(vm.resolve_clip("tiny")), path
    from diffusers import VQModel
    from transformers import CLIPConfig, CLIPModel

    from lowvram_gen.models.tiny import _tokenizer

    torch.manual_seed(0)
    vq = VQModel(**vm.diffusers_config(F16)).eval().requires_grad_(False)
    clip = CLIPModel(CLIPConfig(text_config=VIT_B32["text"], vision_config=VIT_B32["vision"],
                                projection_dim=VIT_B32["projection_dim"])).eval().requires_grad_(False)
    loaded = vm.LoadedClip(vm.ClipSource("ViT-B/32 (random weights)", "folder", Path(".")), clip, _tokenizer(),
                           vm.OPENAI_MEAN, vm.OPENAI_STD)
    return vq, loaded, None


def worker(job: dict) -> dict:
    import torch

    from lowvram_gen.planning import vqgan as memory_vqgan
    from lowvram_gen.hardware.device import probe
    from lowvram_gen.engines.vqgan.loop import Knobs, VqganLoop
    from lowvram_gen.engines.vqgan.request import VqganRequest
    from lowvram_gen.ladder import Ladder
    from lowvram_gen.presets import load_presets

    torch.set_num_threads(int(os.environ.get("BENCH_THREADS", "2")))
    vq, clip, _ = _models(job["arch"])
    size, cutn = job["size"], job["cutn"]
    request = VqganRequest(prompt="a lighthouse at dusk|oil painting:0.5", width=size, height=size,
                           iterations=job["iterations"] + 1, cutn=cutn, seed=0).validated()
    loop = VqganLoop(vq, clip, request, 0, (size, size), Ladder([load_presets()["cpu"]]), probe("cpu"))
    loop.knobs = Knobs(job["chunk"], job["autocast"], job["checkpointing"], False)
    loop.setup()

    def iteration():
        loop.gradient()
        loop.state.opt.step()

    iteration()  # warm-up: oneDNN primitives, the thread pool, the optimiser's state
    import gc

    gc.collect()
    reset_peak()
    before = status()["VmRSS"]
    t = time.perf_counter()
    for _ in range(job["iterations"]):
        iteration()
    seconds = time.perf_counter() - t
    peak = status()["VmHWM"]
    profile = memory_vqgan.profile_from_models(vq, clip.model, job["arch"])
    est = memory_vqgan.estimate_vqgan(profile, size, size, cutn, loop.knobs, len(request.augments), device_kind="cpu")
    estimated = est.total_bytes - est.weights_bytes - est.overhead_bytes
    return {**job, "activation_bytes": peak - before, "estimated_activation_bytes": estimated,
            "estimate": est.as_dict(), "profile": profile.as_dict(), "augments": len(request.augments),
            "seconds_per_iteration": seconds / job["iterations"],
            "iterations_per_second": job["iterations"] / seconds, "torch": torch.__version__}


def run(arch: str, size: int, cutn: int, iterations: int, timeout: int) -> list[dict]:
    env = worker_env(PYTHONPATH=str(ROOT))
    rows = []
    for chunk, ckpt, autocast in POINTS:
        job = {"arch": arch, "size": size, "cutn": cutn, "chunk": chunk, "checkpointing": ckpt, "autocast": autocast,
               "iterations": iterations}
        label = f"chunk {chunk}{', checkpointing' if ckpt else ''}{', bf16 autocast' if autocast else ''}"
        print(f"[bench_vqgan] {arch} {size}px, {cutn} cutouts, {label} ...", flush=True)
        row = run_worker(__file__, "--worker", job, timeout, env)
        if "error" in row:
            raise SystemExit(f"worker failed:\n{row['error']}")
        rows.append(row)
        print(f"    activation {row['activation_bytes'] / 2**20:7.0f} MiB (estimated "
              f"{row['estimated_activation_bytes'] / 2**20:.0f}), {row['seconds_per_iteration']:.2f} s/iteration",
              flush=True)
    return rows


def estimated(row: dict) -> int:
    """What the estimator in lowvram_gen/planning/vqgan.py says now for a stored point (CPU, float32/bf16)."""
    from lowvram_gen.planning import vqgan as memory_vqgan
    from lowvram_gen.engines.vqgan.loop import Knobs

    if "profile" in row:
        prof = {k: tuple(v) if isinstance(v, list) else v for k, v in row["profile"].items()}
        profile = memory_vqgan.VqganProfile(**prof)
    else:
        profile = memory_vqgan.profile_builtin()
    knobs = Knobs(row["chunk"], row["autocast"], row["checkpointing"], False)
    est = memory_vqgan.estimate_vqgan(profile, row["size"], row["size"], row["cutn"], knobs, row.get("augments", 4),
                                      device_kind="cpu")
    return est.total_bytes - est.weights_bytes - est.overhead_bytes  # the activations of an iteration


def markdown(data: dict) -> None:
    sys.path.insert(0, str(ROOT))
    for key, result in data.items():
        rows = result["points"]
        for r in rows:
            r["estimated_activation_bytes"] = estimated(r)
        base = rows[0]
        print(f"{result['title']}\n")
        print("| cutouts per CLIP pass | checkpointing | CLIP autocast | peak activations (MiB) | vs all at once "
              "| estimated (MiB) | error | s/iteration | iterations/s |")
        print("|---|---|---|---|---|---|---|---|---|")
        for r in rows:
            err = 100 * (r["estimated_activation_bytes"] - r["activation_bytes"]) / r["activation_bytes"]
            print(f"| {r['chunk']} of {r['cutn']} | {'yes' if r['checkpointing'] else 'no'} "
                  f"| {'bf16' if r['autocast'] else 'no'} | {r['activation_bytes'] / 2**20:.0f} "
                  f"| {r['activation_bytes'] / base['activation_bytes']:.2f} "
                  f"| {r['estimated_activation_bytes'] / 2**20:.0f} "
                  f"| {err:+.0f} % | {r['seconds_per_iteration']:.2f} | {r['iterations_per_second']:.3f} |")
        print()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    ap.add_argument("--arch", choices=("real", "tiny"), default="real")
    ap.add_argument("--size", type=int, default=256, help="image side (default 256: the cpu preset's cap)")
    ap.add_argument("--cutn", type=int, default=64)
    ap.add_argument("--iterations", type=int, default=2, help="timed iterations per point (default 2)")
    ap.add_argument("--timeout", type=int, default=1800)
    ap.add_argument("--markdown", action="store_true", help="print the tables from docs/bench/vqgan.json")
    args = ap.parse_args(argv)
    if args.worker:
        print(json.dumps(worker(json.loads(args.worker))), flush=True)
        return 0
    data = json.loads(OUT.read_text()) if OUT.exists() else {}
    if args.markdown:
        markdown(data)
        return 0
    rows = run(args.arch, args.size, args.cutn, args.iterations, args.timeout)
    side = f"{args.size}x{args.size}"
    title = {"real": f"vqgan_imagenet_f16_16384 + CLIP ViT-B/32 architectures (random weights), {side}",
             "tiny": f"tiny-vqgan-clip, {args.size}x{args.size}"}[args.arch]
    import platform

    import torch

    data[f"{args.arch}-{args.size}-{args.cutn}"] = {
        "title": title + f", {args.cutn} cutouts, float32 unless noted; CPU ({platform.processor() or 'x86_64'}, "
                         f"torch threads: {os.environ.get('BENCH_THREADS', '2')}), torch {torch.__version__}",
        "command": "python benchmarks/bench_vqgan.py " + " ".join(a for a in (argv or sys.argv[1:])),
        "date": time.strftime("%Y-%m-%d"), "points": rows}
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps(data, indent=1) + "\n")
    markdown({k: v for k, v in data.items() if k.startswith(args.arch)})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
