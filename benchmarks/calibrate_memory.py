#!/usr/bin/env python
"""Measure activation peaks of the real SD architectures on this CPU and fit the memory estimator.

    python benchmarks/calibrate_memory.py              # measure what is missing, then fit
    python benchmarks/calibrate_memory.py --fit-only   # refit from the stored measurements
    python benchmarks/calibrate_memory.py --only sd15  # measure only jobs whose id contains "sd15"
    python benchmarks/calibrate_memory.py --redo       # measure again even where a result is stored
    python benchmarks/calibrate_memory.py --live-check # cross-check RSS against live tensor bytes (transformers)

What is measured. Each job builds one real component (SD 1.5 / 2.1 / SDXL UNet, the SD VAE, or the
SD3-medium / FLUX.1-dev transformer) from the configs shipped in lowvram_gen/configs, with random
bfloat16 weights (no download), in a fresh subprocess. It runs one small warm-up pass (so oneDNN and
the thread pool have set themselves up), resets the kernel's peak-RSS counter (`echo 5 >
/proc/self/clear_refs`, which resets VmHWM), reads VmRSS, runs one forward pass under
torch.inference_mode(), and reads VmHWM. activation_bytes = VmHWM - VmRSS(before): the memory the forward pass needed on top of resident weights and inputs,
i.e. what torch.cuda.max_memory_allocated() minus memory_allocated() before the step reports on a GPU.

Why RSS and not torch.profiler: profile_memory records every allocation, but getting a peak from it
means replaying the event list, it slows the 2-core run down several-fold, and it misses memory that
is not a torch tensor (oneDNN scratch pads). VmHWM sees everything the process touched. To make RSS
follow live tensors instead of glibc's free lists, every worker runs with MALLOC_MMAP_THRESHOLD_=65536
(allocations above 64 KiB are mmap'ed and go back to the kernel when freed) and MALLOC_TRIM_THRESHOLD_=0,
so a freed activation leaves RSS at once, as it leaves max_memory_allocated on CUDA.

Transformers are built with fewer blocks than the real model (options "layers": SD3 2 of 24 joint
blocks; Flux 1 of 19 double-stream and 1 of 38 single-stream blocks). In an inference forward each
block's activations are freed before the next block runs, so the peak is that of the largest block
plus what lives across blocks (the image and text token streams, the timestep embedding) and does
not depend on the depth; the "check": "depth" points measure 4 blocks (2 + 2 for Flux) against that.
Their text sequence is what the pipelines feed by default: SD3 77 CLIP tokens + the T5
max_sequence_length default of StableDiffusion3Pipeline (256); Flux that of FluxPipeline (512); read
from the installed diffusers' pipeline signatures and stored with each point ("text_tokens").

Why bfloat16: the same 2 bytes per element as float16 on a GPU, so activation bytes are comparable
one for one; this CPU has AVX512-BF16 and runs bf16 ~2.7x faster than fp32. SDPA on CPU dispatches
to the flash-attention CPU kernel (no full score matrix), as SDPA does on CUDA.

The issue-30 families (FAMILY_LAYERS) are measured through one step of their own pipeline instead
(benchmarks/streamed_families.py: the tiny test pipeline around the real-width transformer at reduced depth,
prompt embeddings of the real width and length): their forwards take the pipeline's packing, rotary ids and
masks. The tiny pipeline is asked for the size whose latent is the real model's at the job's size (its VAE
downsamples less). A masked SDPA call would run the math kernel on this CPU (a score matrix CUDA's memory-efficient
kernel does not hold), so these steps run under benchmarks/gpu_attention.py (docs/benchmarks.md).

The results go to lowvram_gen/configs/calibration.json ("measurements"), written after every job,
next to published GPU figures ("published"); then the fitted coefficients ("fit") that
lowvram_gen/memory.py reads.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import json
import os
import sys
import tempfile
import time
from pathlib import Path

from peak_rss import reset_peak, run_worker, status, worker_env  # benchmarks/peak_rss.py

sys.path.insert(0, str(Path(__file__).resolve().parent))  # streamed_families, when run from elsewhere

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = ROOT / "lowvram_gen" / "configs"
CALIBRATION = CONFIGS / "calibration.json"

# Reduced depth of the measured transformers (config overrides), and SD3.5-medium's transformer against
# SD3-medium's (stabilityai/stable-diffusion-3.5-medium transformer/config.json; two blocks, the first
# one with the dual attention).
SD3_LAYERS = {"num_layers": 2}
FLUX_LAYERS = {"num_layers": 1, "num_single_layers": 1}
SD35_MEDIUM = {"qk_norm": "rms_norm", "dual_attention_layers": [0], "pos_embed_max_size": 384}

# (id, component, arch, width, height, batch, options). batch = the batch the model sees (CFG: 2 per image).
JOBS: list[tuple[str, str, str, int, int, int, dict]] = [
    ("vae-sd15-512", "vae", "sd15", 512, 512, 1, {}),
    ("unet-sd15-512-b2", "unet", "sd15", 512, 512, 2, {}),
    ("unet-sd21-768-b2", "unet", "sd21", 768, 768, 2, {}),
    ("unet-sdxl-1024-b2", "unet", "sdxl", 1024, 1024, 2, {}),
    ("unet-sd15-768-b2", "unet", "sd15", 768, 768, 2, {}),
    ("vae-sd15-768", "vae", "sd15", 768, 768, 1, {}),
    ("unet-sd21-512-b2", "unet", "sd21", 512, 512, 2, {}),
    ("unet-sdxl-768-b2", "unet", "sdxl", 768, 768, 2, {}),
    ("vae-sd15-1024", "vae", "sd15", 1024, 1024, 1, {}),
    ("unet-sd15-512-b4", "unet", "sd15", 512, 512, 4, {}),
    ("unet-sd15-512-b2-slicing", "unet", "sd15", 512, 512, 2, {"attention": "slicing"}),
    ("vae-sd15-1024-tiled", "vae", "sd15", 1024, 1024, 1, {"tiling": True}),
    ("vae-sd15-512-b2", "vae", "sd15", 512, 512, 2, {}),
    ("unet-sd15-512-b2-fp32", "unet", "sd15", 512, 512, 2, {"dtype": "float32"}),
    # Transformer denoisers at reduced depth (see the module docstring). SD3: a CFG batch of 2 per image;
    # Flux (guidance-distilled: the guidance scale is an input, no CFG batch): batch 1.
    ("transformer-sd3-512-b2", "transformer", "sd3", 512, 512, 2, {"layers": SD3_LAYERS}),
    ("transformer-sd3-768-b2", "transformer", "sd3", 768, 768, 2, {"layers": SD3_LAYERS}),
    ("transformer-sd3-1024-b2", "transformer", "sd3", 1024, 1024, 2, {"layers": SD3_LAYERS}),
    ("transformer-sd3-512-b4", "transformer", "sd3", 512, 512, 4, {"layers": SD3_LAYERS}),
    ("transformer-flux-512-b1", "transformer", "flux", 512, 512, 1, {"layers": FLUX_LAYERS}),
    ("transformer-flux-768-b1", "transformer", "flux", 768, 768, 1, {"layers": FLUX_LAYERS}),
    ("transformer-flux-1024-b1", "transformer", "flux", 1024, 1024, 1, {"layers": FLUX_LAYERS}),
    ("transformer-flux-512-b2", "transformer", "flux", 512, 512, 2, {"layers": FLUX_LAYERS}),
    # checks, not fitted: depth (4 blocks against 2), and SD3.5-medium's block (RMS qk-norm, a second
    # image-only attention in the first 13 blocks) estimated as a folder of it would be: SD3-medium's
    # shape (same hidden width, patches and text tokens), but not a built-in, so the global coefficient
    ("transformer-sd3-1024-b2-4layers", "transformer", "sd3", 1024, 1024, 2,
     {"layers": {"num_layers": 4}, "check": "depth"}),
    ("transformer-flux-768-b1-4layers", "transformer", "flux", 768, 768, 1,
     {"layers": {"num_layers": 2, "num_single_layers": 2}, "check": "depth"}),
    ("transformer-sd35m-1024-b2", "transformer", "sd3", 1024, 1024, 2,
     {"layers": {**SD3_LAYERS, **SD35_MEDIUM}, "check": "sd3.5-medium", "estimate_as": "custom"}),
]
# The issue-30 families: the real-width transformer at reduced depth run inside the family's tiny pipeline with
# prompt embeddings of its real width and length (benchmarks/streamed_families.py), one 512 px step, CFG off
# ("pipeline": the forward is the pipeline's own, with its packing, rotary ids and masks)
FAMILY_LAYERS = {
    "qwen-image": {"num_layers": 1},
    "z-image": {"n_layers": 1, "n_refiner_layers": 1},
    "flux2-klein": {"num_layers": 1, "num_single_layers": 1},
    "sana": {"num_layers": 1},
    "chroma": {"num_layers": 1, "num_single_layers": 1},
    "lumina2": {"num_layers": 1, "num_refiner_layers": 1},
    "flux2-dev": {"num_layers": 1, "num_single_layers": 1},
    "cogview4": {"num_layers": 1},
    # one double-stream and one single-stream block, each with its mixture-of-experts feed-forward; the forward
    # projects one Llama layer per block (llama_layers: one index a block), the last (31) carried from the start
    "hidream": {"num_layers": 1, "num_single_layers": 1, "llama_layers": [0, 31]},
}
# Families streamed_families.py has no row for, run the same way (its FAMILIES table: tests module, tiny builder,
# config key of the text width, mask argument, call extras); HiDream has its row there
EXTRA_FAMILIES = {
    "flux2-dev": ("tiny_flux2_dev", "build_tiny_flux2_dev", "joint_attention_dim", "", {"guidance_scale": 4.0}),
    "cogview4": ("tiny_cogview4", "build_tiny_cogview4", "text_embed_dim", "", {"guidance_scale": 1.0}),
}
# Three sizes each; masked SDPA runs as a GPU kernel would hold it (benchmarks/gpu_attention.py, "gpu_attention")
# SANA's pipeline snaps every job to the aspect-ratio bin nearest it (use_resolution_binning, on by default: 1024 x
# 1024 for any square job of the 1024 px model) and resizes the image after: its points run at the size asked with
# binning off ("call"), and the "-binned" checks as the app calls it, estimated at the bin (profile.resolution_bins)
FAMILY_CALL = {"sana": {"use_resolution_binning": False}}
# HiDream's pipeline renders every size at its native area (1024 x 1024 at real size, keeping the aspect; the planner
# plans it so: planning/estimate.rendered_size), so its points are sizes it renders as asked, three aspects of that area
FAMILY_SIZES = {"hidream": ((1024, 1024), (1248, 832), (1344, 768))}


def _family_jobs(key: str, layers: dict) -> list[tuple]:
    """A family's three sizes (SANA's with binning off), then SANA's binned checks."""
    base = {"layers": layers, "pipeline": True, "gpu_attention": True}
    call = {"call": FAMILY_CALL[key]} if key in FAMILY_CALL else {}
    jobs = [(f"transformer-{key}-{w if w == h else f'{w}x{h}'}-b1", "transformer", key, w, h, 1, {**base, **call})
            for w, h in FAMILY_SIZES.get(key, ((512, 512), (768, 768), (1024, 1024)))]
    return jobs + [(f"transformer-{key}-{side}-b1-binned", "transformer", key, side, side, 1,
                    {**base, "check": "binning"}) for side in ((512, 768) if call else ())]


JOBS += [job for key, layers in FAMILY_LAYERS.items() for job in _family_jobs(key, layers)]
# Qwen-Image's VAE (a causal video VAE decoding one frame): its decode held 2.6x what the SD VAE's feature and
# coefficient say (host_peaks.py's Qwen-Image cell erred -23 % for it), so it has its own points and coefficient
JOBS += [(f"vae-qwen-image-{side}", "vae", "qwen-image", side, side, 1, {"own_coefficient": True})
         for side in (512, 768)]
# SANA's DC-AE (AutoencoderDC, 32x, EfficientViT stages): host_peaks.py's SANA cell erred -26 % at its decode
JOBS += [(f"vae-sana-{side}", "vae", "sana", side, side, 1, {"own_coefficient": True}) for side in (512, 768, 1024)]
# The same decodes in float32 (what a CPU computes an int8/int4 or --no-half job in): a VAE that upcasts parts of its
# decode to float32 whatever its dtype (DC-AE's linear attention and RMSNorm; the SD VAE's GroupNorm on this CPU)
# holds less than twice its bf16 peak in float32, which the per-dtype part of the fit counts (planning/fit.py)
JOBS += [(f"vae-{arch}-{side}-fp32", "vae", arch, side, side, 1, {"dtype": "float32", **own})
         for arch, side, own in (("sd15", 512, {}), ("sd15", 1024, {}), ("sana", 512, {"own_coefficient": True}),
                                 ("sana", 1024, {"own_coefficient": True}))]


# Published GPU peaks (torch.cuda.max_memory_allocated of a whole pipeline call) to check totals against.
DIFFUSION_FAST = ("https://huggingface.co/datasets/sayakpaul/sample-datasets/blob/"
                  "8285f7668326f13af8d213cd8087218cd7f97483/collated_results_sdxl.csv")
PUBLISHED = [
    {
        "id": "sdxl-1024-half-sdpa-h100",
        "arch": "sdxl", "width": 1024, "height": 1024, "batch": 1, "cfg": True,
        "settings": {"dtype": "float16", "attention": "sdpa"},
        # the run swaps in madebyollin/sdxl-vae-fp16-fix (same architecture, force_upcast false)
        "profile_overrides": {"vae_force_upcast": False},
        "max_memory_allocated_bytes": int(8.958 * 1024**3),
        "source": DIFFUSION_FAST,
        "notes": "huggingface/diffusion-fast run_benchmark.py: SDXL base 1.0, 30 steps, batch 1, half precision, "
                 "SDPA, no compile, H100 80GB; memory = torch.cuda.max_memory_allocated() / 1024**3. "
                 "The same run without SDPA gave 8.961 GiB.",
    },
    {
        "id": "sdxl-1024-fp32-h100",
        "arch": "sdxl", "width": 1024, "height": 1024, "batch": 1, "cfg": True,
        "settings": {"dtype": "float32", "attention": "sdpa"},
        "profile_overrides": {"vae_force_upcast": False},
        "max_memory_allocated_bytes": int(16.827 * 1024**3),
        "source": DIFFUSION_FAST,
        "notes": "same benchmark, float32 weights, default (non-SDPA) attention processor; the fp16 rows show "
                 "the attention processor does not move the peak (it is the VAE decode).",
    },
]


# --------------------------------------------------------------------------------------------- worker


def _build(component: str, arch: str, dtype, overrides: dict | None = None):
    """The component from its shipped config (with `overrides`, e.g. fewer blocks), random weights of
    `dtype`, built without an fp32 copy."""
    import diffusers
    import torch
    from accelerate import init_empty_weights

    cfg = json.loads((CONFIGS / arch / component / "config.json").read_text())
    cfg.update(overrides or {})
    if component == "unet":
        from diffusers import UNet2DConditionModel as cls
    elif component == "transformer":
        cls = getattr(diffusers, cfg["_class_name"])
    else:  # the SD VAE, or a family's own (Qwen-Image's AutoencoderKLQwenImage)
        cls = getattr(diffusers, cfg.get("_class_name", "AutoencoderKL"))
    with init_empty_weights():
        model = cls.from_config(cfg)
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for mod_name, module in model.named_modules():
            for name, p in list(module._parameters.items()):
                if p is None:
                    continue
                t = torch.empty(p.shape, dtype=dtype)
                if p.ndim >= 2:
                    fan_in = p[0].numel()
                    t.normal_(0.0, fan_in**-0.5, generator=gen)
                elif name == "weight":
                    t.fill_(1.0)
                else:
                    t.zero_()
                module._parameters[name] = torch.nn.Parameter(t, requires_grad=False)
            for name, b in list(module._buffers.items()):
                if b is not None and b.is_floating_point():
                    module._buffers[name] = b.to(dtype)
    model.eval()
    return model, cfg


def text_tokens(arch: str) -> int:
    """Text tokens the transformer attends to with the image tokens, as the pipelines feed them by default:
    SD3 77 CLIP tokens (CLIP-L and CLIP-G side by side) + T5 max_sequence_length; Flux T5 only."""
    import inspect

    import diffusers

    pipe = {"sd3": "StableDiffusion3Pipeline", "flux": "FluxPipeline"}[arch]
    t5 = inspect.signature(getattr(diffusers, pipe).__call__).parameters["max_sequence_length"].default
    return (77 if arch == "sd3" else 0) + int(t5)


def _transformer_inputs(cfg: dict, arch: str, h: int, w: int, batch: int, dtype, g):
    import torch

    n_text = text_tokens(arch)
    text = torch.randn(batch, n_text, cfg["joint_attention_dim"], generator=g).to(dtype)
    pooled = torch.randn(batch, cfg["pooled_projection_dim"], generator=g).to(dtype)
    if cfg["_class_name"] == "FluxTransformer2DModel":
        # FluxPipeline packs 2x2 patches of the 16-channel latent into 64-channel tokens
        ph, pw = h // 2, w // 2
        ids = torch.zeros(ph, pw, 3)
        ids[..., 1] += torch.arange(ph)[:, None]
        ids[..., 2] += torch.arange(pw)[None, :]
        kw = {
            "hidden_states": torch.randn(batch, ph * pw, cfg["in_channels"], generator=g).to(dtype),
            "encoder_hidden_states": text, "pooled_projections": pooled,
            "timestep": torch.full((batch,), 0.5, dtype=dtype),
            "img_ids": ids.reshape(ph * pw, 3).to(dtype), "txt_ids": torch.zeros(n_text, 3, dtype=dtype),
        }
        if cfg.get("guidance_embeds"):
            kw["guidance"] = torch.full((batch,), 3.5, dtype=torch.float32)
        return kw
    return {
        "hidden_states": torch.randn(batch, cfg["in_channels"], h, w, generator=g).to(dtype),
        "encoder_hidden_states": text, "pooled_projections": pooled,
        "timestep": torch.full((batch,), 500.0, dtype=dtype),
    }


def _inputs(component: str, cfg: dict, width: int, height: int, batch: int, dtype, arch: str = ""):
    import torch

    g = torch.Generator().manual_seed(1)
    h, w = height // 8, width // 8
    if cfg.get("decoder_block_out_channels"):  # a DC-AE (SANA's): each of its stages halves the side (32x)
        f = 2 ** (len(cfg["decoder_block_out_channels"]) - 1)
        h, w = height // f, width // f
    if component == "vae":
        if cfg.get("z_dim"):  # Qwen-Image's video-style VAE: (batch, channels, frames, h, w), one frame
            return {"z": torch.randn(batch, cfg["z_dim"], 1, h, w, generator=g).to(dtype)}
        return {"z": torch.randn(batch, cfg.get("latent_channels", 4), h, w, generator=g).to(dtype)}
    if component == "transformer":
        return _transformer_inputs(cfg, arch, h, w, batch, dtype, g)
    kw = {
        "sample": torch.randn(batch, cfg.get("in_channels", 4), h, w, generator=g).to(dtype),
        "timestep": torch.tensor(500),
        "encoder_hidden_states": torch.randn(batch, 77, cfg["cross_attention_dim"], generator=g).to(dtype),
    }
    if cfg.get("addition_embed_type") == "text_time":
        n_time = (cfg["projection_class_embeddings_input_dim"] - 1280) // cfg["addition_time_embed_dim"]
        kw["added_cond_kwargs"] = {
            "text_embeds": torch.randn(batch, 1280, generator=g).to(dtype),
            "time_ids": torch.tensor([[height, width, 0, 0, height, width][:n_time]] * batch, dtype=dtype),
        }
    return kw


def _run(model, component: str, kw: dict):
    if component == "vae":
        return model.decode(kw["z"]).sample
    return model(**kw).sample


def worker(job: dict) -> dict:
    import gc

    import diffusers
    import torch

    torch.set_num_threads(int(os.environ.get("CALIB_THREADS", "2")))
    dtype = getattr(torch, job["options"].get("dtype", "bfloat16"))
    component = job["component"]
    arch = job["arch"]
    if job["options"].get("pipeline"):
        return family_worker(job)
    rss0 = status()["VmRSS"]
    t0 = time.perf_counter()
    model, cfg = _build(component, arch, dtype, job["options"].get("layers"))
    gc.collect()
    rss_weights = status()["VmRSS"] - rss0
    n_params = sum(p.numel() for p in model.parameters())
    build_s = time.perf_counter() - t0
    if job["options"].get("attention") == "slicing":
        model.set_attention_slice("auto")  # what pipe.enable_attention_slicing("auto") does to the UNet
    if job["options"].get("tiling"):
        model.enable_tiling()
    # Warm-up: small size, same code paths (tiling needs a latent above the tile size to engage).
    wsize = 256 if not job["options"].get("tiling") else job["width"]
    with torch.inference_mode():
        _run(model, component, _inputs(component, cfg, wsize, wsize, 1, dtype, arch))
    kw = _inputs(component, cfg, job["width"], job["height"], job["batch"], dtype, arch)
    gc.collect()
    reset_peak()
    before = status()["VmRSS"]
    t1 = time.perf_counter()
    with torch.inference_mode():
        out = _run(model, component, kw)
    run_s = time.perf_counter() - t1
    peak = status()["VmHWM"]
    return {
        **job,
        "params": n_params,
        "weights_rss_bytes": rss_weights,
        "rss_before_bytes": before,
        "peak_rss_bytes": peak,
        "activation_bytes": peak - before,
        "output_shape": list(out.shape),
        "build_s": round(build_s, 1),
        "run_s": round(run_s, 1),
        "torch": torch.__version__,
        **({"diffusers": diffusers.__version__, "text_tokens": text_tokens(arch),
            "attention": type(model.attn_processors[next(iter(model.attn_processors))]).__name__,
            "command": f"python benchmarks/calibrate_memory.py --only {job['id']} --redo"}
           if component == "transformer" else {}),
    }


def family_worker(job: dict) -> dict:
    """A FAMILY_LAYERS point: one step of the family's pipeline around its reduced-depth transformer; the activation
    is the peak over that step above the RSS before it (the prompt embeddings and latents are a few MiB)."""
    import gc

    import diffusers
    import torch

    import gpu_attention
    import streamed_families as fam

    sys.path.insert(0, str(ROOT))
    from lowvram_gen import families

    torch.set_num_threads(int(os.environ.get("CALIB_THREADS", "2")))
    key = job["arch"]
    fam.FAMILIES.update({k: v for k, v in EXTRA_FAMILIES.items() if k not in fam.FAMILIES})
    t0 = time.perf_counter()
    model, cfg = fam.build_transformer(key, job["options"]["layers"])
    pipe = fam.build_pipeline(key, model)
    n_params = sum(p.numel() for p in model.parameters())
    build_s = time.perf_counter() - t0
    tokens = families.by_key(key).t5_prompt_tokens()  # the pipeline's max_sequence_length: what it feeds at most
    # The tiny pipeline's VAE downsamples less than the real one (Qwen-Image's 4x, Z-Image's 2x, Klein's 1x against
    # 8x): ask it for the side that gives the real model's latent, hence its image tokens, at the job's size.
    # (Before, the 512 px points ran 4x, 16x and 64x the real image tokens.)
    from lowvram_gen.models.profile import profile_builtin

    scale = pipe.vae_scale_factor / profile_builtin(key).vae_scale_factor
    side, warm = int(job["width"] * scale), max(int(128 * scale), 16 * int(pipe.vae_scale_factor))
    height = int(job["height"] * scale)
    # masked attention in query chunks (what CUDA's memory-efficient kernel holds), not the CPU's math kernel
    attention = gpu_attention.installed() if job["options"].get("gpu_attention") else contextlib.nullcontext({})
    with attention as calls:
        call = job["options"].get("call")
        fam.run_job(pipe, key, cfg, 1, side=warm, tokens=8, call=call)  # warm-up: the same code paths, small
        # the prompt embeddings made before the window: inputs, as the latents are (HiDream's hold every Llama
        # layer's hidden states, 32 MiB at 128 tokens; the other families' points, measured before this, had their
        # few MiB of embeddings inside the window)
        kwargs = fam.job_kwargs(key, cfg, 1, side=side, tokens=tokens, height=height, call=call)
        gc.collect()
        # the latents the transformer is given (SANA's self-attention is linear, not SDPA: the calls above see only its
        # cross-attention's text keys, so its image tokens are checked on its input)
        seen: dict = {}

        def record_input(_module, args, kwargs) -> None:
            seen.setdefault("shape", list((args or (kwargs["hidden_states"],))[0].shape))

        hook = model.register_forward_pre_hook(record_input, with_kwargs=True)
        reset_peak()
        before = status()["VmRSS"]
        t1 = time.perf_counter()
        fam.run_job(pipe, key, cfg, 1, kwargs=kwargs)
        run_s = time.perf_counter() - t1
        peak = status()["VmHWM"]
        hook.remove()
    return {**job, "params": n_params, "rss_before_bytes": before, "peak_rss_bytes": peak,
            "activation_bytes": peak - before, "build_s": round(build_s, 1), "run_s": round(run_s, 1),
            "torch": torch.__version__, "diffusers": diffusers.__version__, "text_tokens": tokens,
            "sdpa_calls": dict(calls), "pipeline_side": side, "pipeline_height": height,
            "transformer_input_shape": seen.get("shape"),
            "command": f"python benchmarks/calibrate_memory.py --only {job['id']} --redo"}


def live_worker(job: dict) -> dict:
    """The same forward as worker(), but counting bytes of live tensor storages instead of RSS: every op's
    output storage is added when it appears and taken off when it is freed (a TorchDispatchMode and a
    weakref finalizer per storage). Storages that exist before the forward (weights, buffers, inputs)
    are not counted, nor are views of them. This is what a caching allocator must hold (less its
    rounding), and it sees no oneDNN or attention-kernel scratch; RSS sees both."""
    import weakref

    import torch
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_flatten

    class Live(TorchDispatchMode):
        def __init__(self, existing):
            super().__init__()
            self.sizes = {ptr: 0 for ptr in existing}
            self.now = self.peak = 0

        def _free(self, ptr, n):
            self.sizes.pop(ptr, None)
            self.now -= n

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            for t in tree_flatten(out)[0]:
                if isinstance(t, torch.Tensor):
                    st = t.untyped_storage()
                    ptr = st.data_ptr()
                    if ptr and ptr not in self.sizes:
                        self.sizes[ptr] = st.nbytes()
                        self.now += st.nbytes()
                        self.peak = max(self.peak, self.now)
                        weakref.finalize(st, self._free, ptr, st.nbytes())
            return out

    torch.set_num_threads(int(os.environ.get("CALIB_THREADS", "2")))
    dtype = getattr(torch, job["options"].get("dtype", "bfloat16"))
    component, arch = job["component"], job["arch"]
    model, cfg = _build(component, arch, dtype, job["options"].get("layers"))
    kw = _inputs(component, cfg, job["width"], job["height"], job["batch"], dtype, arch)
    tensors = [*model.parameters(), *model.buffers(), *[t for t in tree_flatten(kw)[0] if isinstance(t, torch.Tensor)]]
    mode = Live(t.untyped_storage().data_ptr() for t in tensors)
    with torch.inference_mode(), mode:
        _run(model, component, kw)
    return {"id": job["id"], "live_tensor_peak_bytes": mode.peak, "torch": torch.__version__}


LIVE_CHECK = ("transformer-sd3-512-b2", "transformer-sd3-1024-b2", "transformer-flux-512-b1", "transformer-flux-1024-b1")
LIVE_FILE = ROOT / "docs" / "bench" / "transformer_live_tensors.json"


def live_check(timeout: int) -> None:
    """Run live_worker for LIVE_CHECK and store it next to the RSS measurement of the same point."""
    measured = {m["id"]: m for m in load().get("measurements", [])}
    rows = []
    for job_id, component, arch, width, height, batch, options in JOBS:
        if job_id not in LIVE_CHECK:
            continue
        job = {"id": job_id, "component": component, "arch": arch, "width": width, "height": height,
               "batch": batch, "options": options}
        row = run_worker(__file__, "--live-worker", job, timeout)
        rss = measured.get(job_id, {}).get("activation_bytes")
        if rss and "live_tensor_peak_bytes" in row:
            row["rss_activation_bytes"] = rss
            row["rss_minus_live_mib"] = round((rss - row["live_tensor_peak_bytes"]) / 2**20, 1)
        print(json.dumps(row), flush=True)
        rows.append(row)
    LIVE_FILE.write_text(json.dumps({"command": "python benchmarks/calibrate_memory.py --live-check",
                                     "rows": rows}, indent=1) + "\n")


# --------------------------------------------------------------------------------------------- driver


@contextlib.contextmanager
def locked():
    """One writer at a time: a fit run while measurements go on must not drop a result."""
    with open(Path(tempfile.gettempdir()) / "lowvram-gen-calibration.lock", "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def load() -> dict:
    if CALIBRATION.exists():
        return json.loads(CALIBRATION.read_text())
    return {}


def save(data: dict) -> None:
    tmp = CALIBRATION.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(data, indent=1) + "\n")
    tmp.replace(CALIBRATION)


def measure(only: str | None, redo: bool, timeout: int) -> None:
    env = worker_env()
    for job_id, component, arch, width, height, batch, options in JOBS:
        if only and only not in job_id:
            continue
        data = load()
        done = {m["id"] for m in data.get("measurements", []) if "activation_bytes" in m}
        if job_id in done and not redo:
            continue
        job = {"id": job_id, "component": component, "arch": arch, "width": width, "height": height,
               "batch": batch, "options": options}
        print(f"[calibrate] {job_id} ...", flush=True)
        t0 = time.time()
        result = run_worker(__file__, "--worker", job, timeout, env)
        print(f"[calibrate] {job_id}: {time.time() - t0:.0f} s "
              f"{'%.0f MiB' % (result['activation_bytes'] / 2**20) if 'activation_bytes' in result else result.get('error')}",
              flush=True)
        order = [j[0] for j in JOBS]
        with locked():
            data = load()
            rows = [m for m in data.get("measurements", []) if m["id"] != job_id] + [result]
            data["measurements"] = sorted(rows, key=lambda m: order.index(m["id"]) if m["id"] in order else len(order))
            save(data)


def fit() -> None:
    sys.path.insert(0, str(ROOT))
    from lowvram_gen import families
    from lowvram_gen.models import profile as profiles
    from lowvram_gen.planning import fit as memory_fit

    with locked():
        data = load()
        # Built-in profiles: counted once here on the meta device, so profile_builtin() needs no torch.
        data["profiles"] = {k: profiles._profile_for_dir(str(CONFIGS / k), arch=k).as_dict()
                            for k in families.builtin_names()}
        data["published"] = PUBLISHED
        order = [j[0] for j in JOBS]
        data["measurements"] = sorted(data.get("measurements", []),
                                      key=lambda m: order.index(m["id"]) if m["id"] in order else len(order))
        save(data)
        profiles.reload_calibration()
        data["fit"] = memory_fit.fit_coefficients(data.get("measurements", []))
        save(data)
        profiles.reload_calibration()
    for row in memory_fit.calibration_report():
        print(f"{row['id']:28s} measured {row['measured_mib']:8.0f} MiB  estimated {row['estimated_mib']:8.0f} MiB"
              f"  {row['error_pct']:+6.1f} %")
    for row in memory_fit.published_report():
        print(f"{row['id']:28s} published {row['published_gib']:6.2f} GiB  estimated {row['estimated_gib']:6.2f} GiB"
              f"  {row['error_pct']:+6.1f} %  (peak in {row['phase']})")


def markdown() -> None:
    sys.path.insert(0, str(ROOT))
    from lowvram_gen.models import profile as profiles
    from lowvram_gen.planning import fit as memory_fit

    meas = {m["id"]: m for m in load().get("measurements", [])}
    rows = memory_fit.calibration_report()
    print("| measurement | batch | measured (MiB) | estimated (MiB) | error | CPU time (s) |")
    print("|---|---|---|---|---|---|")
    for row in rows:
        m = meas[row["id"]]
        if m["component"] != "transformer":
            print(f"| `{row['id']}` | {m['batch']} | {row['measured_mib']:.0f} | {row['estimated_mib']:.0f} "
                  f"| {row['error_pct']:+.1f} % | {m['run_s']:.0f} |")
    print()
    print("| measurement | blocks | batch | tokens per image (image + text) | measured (MiB) | estimated (MiB) "
          "| error | CPU time (s) |")
    print("|---|---|---|---|---|---|---|---|")
    for row in rows:
        m = meas[row["id"]]
        if m["component"] == "transformer" and not m["options"].get("pipeline"):
            prof = profiles.profile_builtin(m["arch"])
            image = (m["height"] // 8 // prof.transformer_patch) * (m["width"] // 8 // prof.transformer_patch)
            layers = m["options"]["layers"]
            blocks = " + ".join(str(layers[k]) for k in ("num_layers", "num_single_layers") if k in layers)
            note = f" ({m['options']['check']}, not fitted)" if m["options"].get("check") else ""
            print(f"| `{row['id']}`{note} | {blocks} | {m['batch']} | {image} + {m['text_tokens']} "
                  f"| {row['measured_mib']:.0f} | {row['estimated_mib']:.0f} | {row['error_pct']:+.1f} % "
                  f"| {m['run_s']:.0f} |")
    print()
    print(family_markdown(rows, meas))
    print()
    print("| published run | published max_memory_allocated (GiB) | estimated, no overhead (GiB) | error | peak phase |")
    print("|---|---|---|---|---|")
    for row in memory_fit.published_report():
        print(f"| [{row['id']}]({row['source']}) | {row['published_gib']:.2f} | {row['estimated_gib']:.2f} "
              f"| {row['error_pct']:+.1f} % | {row['phase']} |")
    print()
    print("fit:", json.dumps(load().get("fit")))


def family_markdown(rows: list[dict], meas: dict) -> str:
    """The table of the issue-30 families' pipeline points (docs/benchmarks.md)."""
    from lowvram_gen.planning import estimate
    from lowvram_gen.planning.fit import _point_profile

    fit = load().get("fit", {}).get("transformer", {})
    out = ["| family | px | tokens (image + text) | longest attention seen | blocks | measured (MiB) | estimated (MiB) "
           "| error | with the global coefficient | CPU time (s) |", "|---|---|---|---|---|---|---|---|---|---|"]
    for row in rows:
        m = meas[row["id"]]
        if not m["options"].get("pipeline"):
            continue
        prof = _point_profile(m)  # SANA's binned checks: the bin's tokens
        width, height = estimate.rendered_size(prof, m["width"], m["height"])
        hw = (height // prof.vae_scale_factor) * (width // prof.vae_scale_factor)
        image = int(hw / prof.transformer_patch**2)
        text = int(estimate.transformer_tokens(prof, hw)) - image
        blocks = " + ".join(f"{v} {k}" for k, v in m["options"]["layers"].items())
        at_global = row["estimated_mib"] * fit.get("global", 1) / fit.get(m["arch"], fit.get("global", 1))
        seen = m.get("sdpa_calls", {}).get("longest_sequence", "")
        out.append(f"| {m['arch']} | {m['width']} | {image} + {text} | {seen} "
                   f"| {blocks} | {row['measured_mib']:.0f} | {row['estimated_mib']:.0f} | {row['error_pct']:+.1f} % "
                   f"| {at_global:.0f} ({100 * (at_global - row['measured_mib']) / row['measured_mib']:+.0f} %) "
                   f"| {m['run_s']:.0f} |")
    coefs = ", ".join(f"{k} {v}" for k, v in sorted(fit.items()) if k not in ("global", "per_call"))
    return "\n".join(out) + f"\n\nfit.transformer: {coefs}; global {fit.get('global')}, per_call {fit.get('per_call')}"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    ap.add_argument("--live-worker", help=argparse.SUPPRESS)
    ap.add_argument("--live-check", action="store_true",
                    help=f"cross-check RSS against live tensor bytes on a few transformer points, to {LIVE_FILE.name}")
    ap.add_argument("--only", help="measure only jobs whose id contains this text")
    ap.add_argument("--redo", action="store_true", help="measure again even where a result is stored")
    ap.add_argument("--fit-only", action="store_true", help="do not measure; refit from stored measurements")
    ap.add_argument("--timeout", type=int, default=900, help="seconds per measurement (default 900)")
    ap.add_argument("--markdown", action="store_true", help="print the tables of docs/benchmarks.md and exit")
    args = ap.parse_args(argv)
    if args.worker:
        print(json.dumps(worker(json.loads(args.worker))), flush=True)
        return 0
    if args.live_worker:
        print(json.dumps(live_worker(json.loads(args.live_worker))), flush=True)
        return 0
    if args.live_check:
        live_check(args.timeout)
        return 0
    if args.markdown:
        markdown()
        return 0
    if not args.fit_only:
        measure(args.only, args.redo, args.timeout)
    fit()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
