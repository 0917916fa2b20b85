#!/usr/bin/env python
"""Measured host-memory peaks of the video models' components on width-scaled folders (issue 33).

    python benchmarks/video_memory.py                 # measure every point not stored yet
    python benchmarks/video_memory.py --only wan21    # only points whose id contains "wan21"
    python benchmarks/video_memory.py --redo          # measure again even where a result is stored
    python benchmarks/video_memory.py --list          # the points and their inputs, nothing run
    python benchmarks/video_memory.py --table         # the stored results as docs/benchmarks.md's table
    python benchmarks/video_memory.py --write-scaled wan21-14b DEST   # the measured width-scaled folder, configs only

What is measured, for the planner's video estimate to be checked against (benchmarks/results/video_memory.json):
- one transformer forward (WanTransformer3DModel, LTXVideoTransformer3DModel) at F frames x H x W with the text
  sequence the pipeline feeds (WanPipeline: 512 umT5 tokens, its prompt embeddings padded to max_sequence_length;
  LTXPipeline: 128 T5 tokens), batch 1 and 2 (CFG's two halves in one batch): activation_bytes = VmHWM - VmRSS
  just before the call, and weights_rss_bytes, the RSS the built component added;
- the VAE decode (AutoencoderKLWan 2.1 and 2.2, AutoencoderKLLTXVideo) of the latents of F frames at H x W,
  untiled and after `vae.enable_tiling()` (diffusers' default tiles): the peak above the weights and latents;
- the text encoder's forward (umT5-XXL on Wan's 512 tokens, T5-v1.1-XXL on LTX's 128).

Width-scaled: the transformers and text encoders are built from the shipped configs (lowvram_gen/configs/<folder>)
with fewer attention heads and everything that is a multiple of the heads scaled with them (hidden width, FFN
width, Wan's image key/value width; umT5's d_model and d_ff), the head width (128 / 64 / d_kv 64) and the depth
kept; `scaled_config` writes the exact config of a point, and each point stores its overrides ("config"), so the
planner can profile the same folder. The VAEs run at full width (127 M to 705 M parameters fit this machine).
Inputs that come from outside the scaled model keep their real width: the umT5/T5 embeddings (4096), the latents.

How (as benchmarks/calibrate_memory.py): every point in a fresh worker process (this script with --worker) with
MALLOC_MMAP_THRESHOLD_=65536 and MALLOC_TRIM_THRESHOLD_=0 (a freed tensor leaves RSS at once), random bfloat16
weights filled on the CPU by benchmarks/realsize.py's `_component` (built on the meta device, never an fp32 copy),
a warm-up call at a small size through the same code paths, then VmHWM reset (/proc/self/clear_refs) and one call
under torch.inference_mode(). SDPA on this CPU runs the flash-attention kernel (no score matrix), as on CUDA.

--cgroup BYTES runs the chosen points inside a cgroup-v1 memory limit (root only: /sys/fs/cgroup/memory/NAME,
memory.limit_in_bytes, the worker's PID into cgroup.procs before it builds anything) and stores the limit and the
cgroup's own memory.max_usage_in_bytes with the point.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from peak_rss import reset_peak, status, worker_env  # noqa: E402  (benchmarks/peak_rss.py)

ROOT = HERE.parent
CONFIGS = ROOT / "lowvram_gen" / "configs"
RESULTS = HERE / "results" / "video_memory.json"

# arch -> its config folder, and the heads its transformer and its text encoder are scaled to
ARCHS = {
    "wan21-1.3b": {"folder": "wan21-t2v-1.3b", "heads": 4, "text_heads": 8},
    "wan21-14b": {"folder": "wan21-t2v-14b", "heads": 4, "text_heads": 8},  # = each Wan 2.2 A14B expert
    "wan22-5b": {"folder": "wan22-ti2v-5b", "heads": 4, "text_heads": 8},
    "ltx": {"folder": "ltx-video", "heads": 4, "text_heads": 8},
}
TEXT_TOKENS = {"wan": 512, "ltx": 128}  # WanPipeline / LTXPipeline max_sequence_length defaults (read in the worker)
LTX_FPS = 25


def family(arch: str) -> str:
    return "ltx" if arch.startswith("ltx") else "wan"


def _point(kind: str, arch: str, frames: int, width: int, height: int, batch: int = 1, **options) -> dict:
    tiled = "-tiled" if options.get("tiling") else ""
    size = "" if kind == "text_encoder" else f"-{frames}f-{width}x{height}"
    pid = f"{kind}-{arch}{size}-b{batch}{tiled}"
    return {"id": pid, "kind": kind, "arch": arch, "frames": frames, "width": width, "height": height,
            "batch": batch, "options": options}


# Sizes small enough for 2 shared CPU cores; the transformer points at two
# token counts each, batch 1 and 2. The VAEs decode one latent frame at a time with a causal cache (Wan) or the whole
# clip at once (LTX): two frame counts at one size show which, and the larger size untiled and tiled.
POINTS: list[dict] = []
for _arch, _sizes in (
    ("wan21-1.3b", ((17, 256, 256), (33, 320, 192))),
    ("wan21-14b", ((17, 256, 256), (33, 480, 272))),
    ("wan22-5b", ((17, 320, 192), (33, 640, 352))),
    ("ltx", ((49, 512, 288), (97, 768, 512))),  # 32x and 8x in time: few tokens, so LTX's own sizes
):
    for _f, _w, _h in _sizes:
        for _b in (1, 2):
            POINTS.append(_point("transformer", _arch, _f, _w, _h, _b))
# the Wan 2.1 VAE (Wan 2.1 and the Wan 2.2 A14B folders), Wan 2.2's (z 48, 16x), LTX's. Wan's decode runs one latent
# frame at a time with a causal cache, so two frame counts at one size show its peak does not grow with frames; LTX
# decodes the clip at once. Tiled where diffusers' default tiles engage (Wan: a side over 256 px; LTX: over 512 px).
# These decodes are slow on 2 cores (Wan 2.1 9 frames at 480x272: 87 s untiled, 390 s tiled; Wan 2.2 9 frames at
# 320x192: 153 s), so Wan 2.2's VAE has no larger or tiled point: its tiles are the same 256 px as Wan 2.1's.
POINTS += [_point("vae", "wan21-1.3b", f, w, h) for f, w, h in ((9, 256, 256), (17, 256, 256), (9, 480, 272))]
POINTS += [_point("vae", "wan21-1.3b", 9, 480, 272, tiling=True)]
POINTS += [_point("vae", "wan22-5b", f, 320, 192) for f in (5, 9)]
POINTS += [_point("vae", "ltx", f, w, h) for f, w, h in ((25, 256, 256), (49, 256, 256), (25, 640, 352))]
POINTS += [_point("vae", "ltx", 25, 640, 352, tiling=True)]
POINTS += [_point("text_encoder", "wan21-14b", 0, 0, 0), _point("text_encoder", "ltx", 0, 0, 0)]


# ------------------------------------------------------------------------------------------------ shapes
def latent_shape(arch: str, frames: int, width: int, height: int) -> tuple[int, int, int]:
    """(latent frames, latent height, latent width): Wan (F-1)/4+1 at 8x (2.2 TI2V: 16x); LTX (F-1)/8+1 at 32x."""
    if family(arch) == "ltx":
        return (frames - 1) // 8 + 1, height // 32, width // 32
    spatial = 16 if arch == "wan22-5b" else 8
    return (frames - 1) // 4 + 1, height // spatial, width // spatial


def video_tokens(arch: str, frames: int, width: int, height: int) -> int:
    """Image tokens the transformer attends over: Wan patches (1, 2, 2) of the latent; LTX (1, 1, 1)."""
    f, h, w = latent_shape(arch, frames, width, height)
    return f * h * w if family(arch) == "ltx" else f * (h // 2) * (w // 2)


# ------------------------------------------------------------------------------------------------ configs
def _index(arch: str) -> dict:
    return json.loads((CONFIGS / ARCHS[arch]["folder"] / "model_index.json").read_text())


def real_config(arch: str, part: str) -> dict:
    return json.loads((CONFIGS / ARCHS[arch]["folder"] / part / "config.json").read_text())


def scale_overrides(arch: str, part: str) -> dict:
    """The config entries a width-scaled point changes: heads, and every width that is a multiple of them."""
    cfg = real_config(arch, part)
    if part == "transformer":
        heads = ARCHS[arch]["heads"]
        ratio = heads / cfg["num_attention_heads"]
        if cfg["_class_name"] == "WanTransformer3DModel":
            out = {"num_attention_heads": heads, "ffn_dim": round(cfg["ffn_dim"] * ratio)}
            if cfg.get("added_kv_proj_dim"):
                out["added_kv_proj_dim"] = heads * cfg["attention_head_dim"]
            return out
        # LTX: its cross-attention width is the inner width; the FFN is 4x the inner width by construction
        return {"num_attention_heads": heads, "cross_attention_dim": heads * cfg["attention_head_dim"]}
    if part == "text_encoder":
        heads = ARCHS[arch]["text_heads"]
        ratio = heads / cfg["num_heads"]
        return {"num_heads": heads, "d_model": heads * cfg["d_kv"], "d_ff": round(cfg["d_ff"] * ratio)}
    return {}  # the VAEs: full width


def scaled_config(arch: str, part: str) -> dict:
    return {**real_config(arch, part), **scale_overrides(arch, part)}


def width_scale(arch: str, part: str) -> float:
    cfg = real_config(arch, part)
    over = scale_overrides(arch, part)
    if part == "transformer":
        return over["num_attention_heads"] / cfg["num_attention_heads"]
    if part == "text_encoder":
        return over["num_heads"] / cfg["num_heads"]
    return 1.0


def describe(point: dict) -> dict:
    """The point's inputs as stored with its result."""
    arch, kind = point["arch"], point["kind"]
    out = {"folder": ARCHS[arch]["folder"], "component": kind, "width_scale": width_scale(arch, kind),
           "config": scale_overrides(arch, kind)}
    if kind in ("transformer", "vae"):
        out["latent_frames"], out["latent_height"], out["latent_width"] = latent_shape(
            arch, point["frames"], point["width"], point["height"])
    if kind == "transformer":
        out["video_tokens"] = video_tokens(arch, point["frames"], point["width"], point["height"])
        cfg = scaled_config(arch, kind)
        out["hidden"] = cfg["num_attention_heads"] * cfg["attention_head_dim"]
    if kind == "text_encoder":
        out["hidden"] = scaled_config(arch, kind)["d_model"]
    if kind in ("transformer", "text_encoder"):
        out["text_tokens"] = TEXT_TOKENS[family(arch)]
    return out


def write_scaled_folder(arch: str, dest: Path) -> Path:
    """The width-scaled folder of `arch` as configs only (model_index.json, every component's config with the
    points' overrides), for `plan` and the estimate to profile what was measured. No weights."""
    import shutil

    src = CONFIGS / ARCHS[arch]["folder"]
    dest = Path(dest)
    shutil.copytree(src, dest, dirs_exist_ok=True)
    for part in ("transformer", "text_encoder"):
        (dest / part / "config.json").write_text(json.dumps(scaled_config(arch, part), indent=2) + "\n")
    return dest


# ------------------------------------------------------------------------------------------------ worker
def _build(arch: str, part: str):
    import torch

    from realsize import _component  # benchmarks/realsize.py: meta device, filled in bfloat16

    spec = _index(arch)[part]
    cfg = scaled_config(arch, part)
    model = _component(spec[0], spec[1], cfg, seed=0, dtype="bfloat16")
    if spec[0] == "transformers":
        # to_empty gave (u)mT5's encoder.embed_tokens its own copy of `shared` (the vocabulary x d_model table):
        # share it again, as the loaded model does (counted twice, umT5-XXL's would be 2 GiB too many)
        model.tie_weights()
    rope = getattr(model, "rope", None)
    if rope is not None and spec[1] == "WanTransformer3DModel":
        # its rotary tables are non-persistent buffers made at init: to_empty left them unset, so make them again
        model.rope = type(rope)(cfg["attention_head_dim"], tuple(cfg["patch_size"]), cfg["rope_max_seq_len"])
    del torch
    return model, cfg


def _inputs(arch: str, part: str, cfg: dict, frames: int, width: int, height: int, batch: int):
    import torch

    g = torch.Generator().manual_seed(1)
    bf16 = torch.bfloat16
    if part == "text_encoder":
        n = TEXT_TOKENS[family(arch)]
        return {"input_ids": torch.randint(1, cfg["vocab_size"], (batch, n), generator=g),
                "attention_mask": torch.ones(batch, n, dtype=torch.long)}
    f, h, w = latent_shape(arch, frames, width, height)
    if part == "vae":
        channels = cfg.get("z_dim") or cfg["latent_channels"]
        return {"z": torch.randn(batch, channels, f, h, w, generator=g).to(bf16)}
    text = torch.randn(batch, TEXT_TOKENS[family(arch)], cfg["caption_channels" if family(arch) == "ltx" else
                                                              "text_dim"], generator=g).to(bf16)
    if family(arch) == "ltx":
        return {"hidden_states": torch.randn(batch, f * h * w, cfg["in_channels"], generator=g).to(bf16),
                "encoder_hidden_states": text, "timestep": torch.full((batch,), 500.0),
                "encoder_attention_mask": torch.ones(batch, text.shape[1], dtype=bf16),
                "num_frames": f, "height": h, "width": w,
                "rope_interpolation_scale": (8 / LTX_FPS, 32, 32)}
    latents = torch.randn(batch, cfg["in_channels"], f, h, w, generator=g).to(bf16)
    if _index(arch).get("expand_timesteps"):  # Wan 2.2 TI2V: one timestep per video token, as WanPipeline feeds it
        timestep = torch.full((batch, video_tokens(arch, frames, width, height)), 500.0)
    else:
        timestep = torch.full((batch,), 500.0)
    return {"hidden_states": latents, "timestep": timestep, "encoder_hidden_states": text}


def _call(model, part: str, kw: dict):
    if part == "vae":
        return model.decode(kw["z"]).sample
    if part == "text_encoder":
        return model(**kw).last_hidden_state
    return model(**kw, return_dict=False)[0]


def _pipeline_tokens(arch: str) -> int:
    """max_sequence_length's default in the installed pipeline's __call__ (what it pads the prompt to)."""
    import inspect

    import diffusers

    pipe = getattr(diffusers, _index(arch)["_class_name"])
    return int(inspect.signature(pipe.__call__).parameters["max_sequence_length"].default)


def worker(point: dict) -> dict:
    import gc

    import diffusers
    import torch
    import transformers

    torch.set_num_threads(int(os.environ.get("CALIB_THREADS", "2")))
    arch, part = point["arch"], point["kind"]
    if part != "vae":
        assert _pipeline_tokens(arch) == TEXT_TOKENS[family(arch)], "the pipeline's max_sequence_length moved"
    # the component's class first: diffusers imports a model's module on first use (134 MiB of RSS for
    # AutoencoderKLWan's), which is not its weights
    import importlib

    spec = _index(arch)[part]
    rss_import = status()["VmRSS"]
    getattr(importlib.import_module(spec[0]), spec[1])
    rss0 = status()["VmRSS"]
    t0 = time.perf_counter()
    model, cfg = _build(arch, part)
    print("stage: built", file=sys.stderr, flush=True)  # the stages, for a worker killed on the way (--cgroup)
    gc.collect()
    weights = status()["VmRSS"] - rss0
    n_params = sum(p.numel() for p in model.parameters())
    build_s = time.perf_counter() - t0
    if point["options"].get("tiling"):
        model.enable_tiling()
    # warm-up: the same code paths at a small size (a tiled decode at the smallest size its tiles engage)
    wf = 9 if family(arch) == "ltx" else 5
    ww = (576 if family(arch) == "ltx" else 320) if point["options"].get("tiling") else 64
    wh = 64
    with torch.inference_mode():
        _call(model, part, _inputs(arch, part, cfg, wf, ww, wh, 1))
    print("stage: warmed up", file=sys.stderr, flush=True)
    kw = _inputs(arch, part, cfg, point["frames"], point["width"], point["height"], point["batch"])
    gc.collect()
    reset_peak()
    before = status()["VmRSS"]
    t1 = time.perf_counter()
    print("stage: measured call", file=sys.stderr, flush=True)
    with torch.inference_mode():
        out = _call(model, part, kw)
    run_s = time.perf_counter() - t1
    peak = status()["VmHWM"]
    attention = ""
    if part == "transformer":
        attention = type(next(iter(model.attn_processors.values()))).__name__
    return {
        **point, **describe(point),
        "params": n_params,
        "param_bytes": sum(t.numel() * t.element_size() for t in (*model.parameters(), *model.buffers())),
        "weights_rss_bytes": weights,
        "class_import_rss_bytes": rss0 - rss_import,
        "rss_before_bytes": before,
        "peak_rss_bytes": peak,
        "activation_bytes": peak - before,
        "output_shape": list(out.shape),
        "build_s": round(build_s, 1),
        "run_s": round(run_s, 1),
        "dtype": "bfloat16",
        "attention": attention,
        "torch": torch.__version__, "diffusers": diffusers.__version__, "transformers": transformers.__version__,
        "command": f"python benchmarks/video_memory.py --only {point['id']} --redo",
    }


# ------------------------------------------------------------------------------------------------ cgroup
CGROUP_V1 = Path("/sys/fs/cgroup/memory")


def _cgroup_make(name: str, limit: int) -> Path:
    """A cgroup-v1 memory cgroup limited to `limit` bytes (swap included where the kernel accounts it)."""
    path = CGROUP_V1 / name
    path.mkdir(exist_ok=True)
    (path / "memory.limit_in_bytes").write_text(str(limit))
    swap = path / "memory.memsw.limit_in_bytes"
    if swap.exists():
        try:
            swap.write_text(str(limit))
        except OSError:
            pass
    return path


def run_point(point: dict, timeout: int, cgroup: int | None = None) -> dict:
    """The point in a fresh worker (in a limited cgroup when `cgroup`); its result, or the point with "error"."""
    env = worker_env(**({"VIDEO_MEMORY_WAIT_CGROUP": "1"} if cgroup else {}))
    cmd = [sys.executable, str(Path(__file__).resolve()), "--worker", json.dumps(point)]
    proc = subprocess.Popen(cmd, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    group = None
    if cgroup:
        group = _cgroup_make(f"lowvram-gen-video-{proc.pid}", cgroup)
        (group / "cgroup.procs").write_text(str(proc.pid))
    try:
        stdout, stderr = proc.communicate(input="go\n" if cgroup else None, timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        stdout, stderr = proc.communicate()
        result = {**point, "error": f"timed out after {timeout} s"}
    else:
        lines = [ln for ln in stdout.splitlines() if ln.startswith("{")]
        if proc.returncode == 0 and lines:
            result = json.loads(lines[-1])
        else:
            result = {**point, **describe(point), "error": f"rc {proc.returncode}: " + (stderr or stdout)[-1500:]}
    if group is not None:
        result["cgroup_v1"] = {
            "limit_in_bytes": cgroup,
            "max_usage_in_bytes": int((group / "memory.max_usage_in_bytes").read_text()),
            "failcnt": int((group / "memory.failcnt").read_text()),
            "oom_killed": proc.returncode in (-9, 137),
        }
        try:
            group.rmdir()
        except OSError:
            pass
    return result


# ------------------------------------------------------------------------------------------------ main
def _load() -> dict:
    if RESULTS.is_file():
        return json.loads(RESULTS.read_text())
    return {"points": []}


def _save(data: dict) -> None:
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    tmp = RESULTS.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(data, indent=1) + "\n")
    os.replace(tmp, RESULTS)


def per_unit(p: dict) -> str:
    """The peak per the unit it grows with: a transformer's per (batch x video token x hidden unit), a VAE's per
    pixel of one output frame, a text encoder's per (token x d_model)."""
    if p["kind"] == "transformer":
        return f"{p['activation_bytes'] / (p['batch'] * p['video_tokens'] * p['hidden']):.1f} B/(b.tok.hid)"
    if p["kind"] == "vae":
        return f"{p['activation_bytes'] / (p['batch'] * p['width'] * p['height']):.0f} B/px"
    return f"{p['activation_bytes'] / (p['batch'] * p['text_tokens'] * p['hidden']):.1f} B/(tok.hid)"


def table(points: list[dict]) -> str:
    """The markdown table docs/benchmarks.md shows."""
    mib = 1024 ** 2
    rows = ["| point | width scale | frames | size | latent (f x h x w) | tokens (video + text) | weights MiB | "
            "peak above before MiB | per unit | s |", "|---|---|---|---|---|---|---|---|---|---|"]
    for p in points:
        p = {**describe(p), **p}  # the inputs' fields a point stored before they were recorded
        if "error" in p:
            rows.append(f"| {p['id']} | | | | | | | error: {p['error'][:60]} | |")
            continue
        latent = (f"{p['latent_frames']} x {p['latent_height']} x {p['latent_width']}"
                  if "latent_frames" in p else "")
        tokens = " + ".join(str(p[k]) for k in ("video_tokens", "text_tokens") if k in p)
        size = f"{p['width']}x{p['height']}" if p["kind"] != "text_encoder" else ""
        frames = p["frames"] or ""
        rows.append(f"| {p['id']} | {p['width_scale']:.3g} | {frames} | {size} | {latent} | {tokens} | "
                    f"{p['weights_rss_bytes'] / mib:.0f}{'' if 'class_import_rss_bytes' in p else '*'} | "
                    f"{p['activation_bytes'] / mib:.0f} | {per_unit(p)} | "
                    f"{p['run_s']} |")
    if any("class_import_rss_bytes" not in p for p in points if "error" not in p):
        rows.append("\n\\* measured before the worker imported the component's class ahead of the weights window: "
                    "the figure includes that import (134 MiB for AutoencoderKLWan, none for the transformers)")
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--only", action="append", default=[], help="run points whose id contains this (repeatable)")
    ap.add_argument("--redo", action="store_true", help="measure again where a result is stored")
    ap.add_argument("--list", action="store_true", help="print the points and their inputs, run nothing")
    ap.add_argument("--table", action="store_true", help="print the stored results as a markdown table")
    ap.add_argument("--timeout", type=int, default=600, help="seconds per point")
    ap.add_argument("--cgroup", type=int, default=None, metavar="BYTES",
                    help="run the points inside a cgroup-v1 memory limit of BYTES (root); stored under 'cgroup_runs'")
    ap.add_argument("--write-scaled", nargs=2, metavar=("ARCH", "DEST"),
                    help=f"write ARCH's width-scaled folder (configs only) to DEST; ARCH one of {', '.join(ARCHS)}")
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker:
        if os.environ.get("VIDEO_MEMORY_WAIT_CGROUP"):  # the parent puts this PID into the cgroup, then says go:
            sys.stdin.readline()  # before torch is imported, so that everything the worker maps is charged to it
        print(json.dumps(worker(json.loads(args.worker))), flush=True)
        return 0
    if args.write_scaled:
        arch, dest = args.write_scaled
        if arch not in ARCHS:
            print(f"--write-scaled {arch!r}: use one of {', '.join(ARCHS)}", file=sys.stderr)
            return 2
        print(write_scaled_folder(arch, Path(dest)))
        return 0
    chosen = [p for p in POINTS if not args.only or any(o in p["id"] for o in args.only)]
    if args.list:
        for p in chosen:
            print(json.dumps({**p, **describe(p)}))
        return 0
    data = _load()
    if args.table:
        print(table(data["points"]))
        return 0
    if args.cgroup is not None and (os.geteuid() != 0 or not CGROUP_V1.is_dir()):
        print(f"--cgroup needs root and cgroup v1's memory controller at {CGROUP_V1}", file=sys.stderr)
        return 2
    done = {p["id"] for p in data["points"] if "error" not in p}
    command = "python benchmarks/video_memory.py " + " ".join(shlex.quote(a) for a in (argv or sys.argv[1:]))
    data.setdefault("commands", [])
    if command not in data["commands"]:
        data["commands"].append(command.strip())
    data["machine"] = {"cpu": platform.processor() or platform.machine(), "cores": os.cpu_count(),
                       "threads": int(os.environ.get("CALIB_THREADS", "2"))}
    for p in chosen:
        if args.cgroup is None and p["id"] in done and not args.redo:
            continue
        t0 = time.perf_counter()
        result = run_point(p, args.timeout, args.cgroup)
        result["wall_s"] = round(time.perf_counter() - t0, 1)
        key = "cgroup_runs" if args.cgroup is not None else "points"
        data.setdefault(key, [])
        # a point's result replaces its earlier one (under a cgroup: its earlier one under the same limit)
        data[key] = [q for q in data[key] if q["id"] != p["id"] or (
            args.cgroup is not None and q.get("cgroup_v1", {}).get("limit_in_bytes") != args.cgroup)] + [result]
        if key == "points":  # in POINTS' order; a point no longer in POINTS is dropped
            order = {q["id"]: i for i, q in enumerate(POINTS)}
            data["points"] = sorted((q for q in data["points"] if q["id"] in order), key=lambda q: order[q["id"]])
        _save(data)
        msg = result.get("error") or (f"activation {result['activation_bytes'] / 2**20:.0f} MiB, weights "
                                      f"{result['weights_rss_bytes'] / 2**20:.0f} MiB, {result['run_s']} s")
        print(f"{p['id']}: {msg}", file=sys.stderr, flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
