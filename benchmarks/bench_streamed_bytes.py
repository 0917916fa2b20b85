#!/usr/bin/env python
"""Bytes the offload hooks move host-to-device per denoising step: budget offload against the rest.

    python benchmarks/bench_streamed_bytes.py             # measure -> docs/bench/streamed_bytes.json
    python benchmarks/bench_streamed_bytes.py --markdown  # print the table of docs/benchmarks.md
    python benchmarks/bench_streamed_bytes.py --plans     # the planner's own picks, measured -> plan_streamed.json

What is measured. For SD 1.5, SDXL and FLUX.1-dev, the denoiser is built from the configs shipped in
lowvram_gen/configs/ with random bfloat16 weights (2 bytes a weight, as float16 on a GPU) and put into
a real diffusers pipeline with small text encoders and a small VAE of the widths it expects (they are
not measured). Each offload mode is applied with `engines/sd/apply.apply_settings` (model offload is
diffusers' own `enable_model_cpu_offload`) and a job of `--steps` steps runs at 64x64 px while
`engines/sd/traffic.count_onloads` counts the bytes the hooks onload during each denoiser forward
(CFG is batched: one forward per step). On this CPU onload and offload device are both "cpu", so
nothing is copied, but the hooks run and decide what to onload exactly as on a GPU; the meter counts
the tensors they onload that a hook had offloaded, which on a GPU is the host-to-device copy traffic.
The bytes do not depend on the resolution (every streamed weight moves once per forward whatever
the activations), hence 64 px.

Flux. Its 11.9 B-parameter transformer is 22 GiB in bfloat16, too much for this machine's RAM, so it
is built at full depth (19 + 38 blocks, every module and hook as in the real model) with each block
type's weights stored once: every double-stream block shares the storage of the first (likewise the
single-stream blocks), through its own Parameter objects. The hooks and the meter see 57 blocks of
the real sizes; RAM holds about 1 GiB. Its text is 16 T5 tokens instead of 512 (the bytes moved do not
depend on it; the compute on this CPU does).

Budgets. For a card budget B (2, 4, 6, 8, 12 GiB), the room for weights during the denoise is
B - activations - overhead, both from `planning/estimate.py`'s estimate of the job at its native size
(SD 1.5 512 px, SDXL and Flux 1024 px, one image, CFG where the model uses it). The budget rows apply
`offload = "budget"` with `resident_bytes` = `residency.fit(blocks, room - fixed part)`: what a plan
would set (the largest blocks resident, room left for the fixed part and the two streamed blocks in
flight). Compared with: (a) the lower bound max(0, weights - room): what must cross the bus each step
if nothing but weights took room; (b) model offload (the whole denoiser once per job, then nothing per
step, if it fits in B at all), block-level group offload and sequential (leaf-level group) offload,
measured the same way; (c) `residency.split`'s prediction for the same `resident_bytes`.
"""

from __future__ import annotations

import argparse
import gc
import json
import platform
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # this checkout's lowvram_gen, not whichever one the venv installed
sys.path.insert(1, str(ROOT / "tests"))  # tiny_transformers: the offline T5 tokenizer and 16-channel VAE
sys.path.insert(2, str(Path(__file__).resolve().parent))  # streamed_families: the issue-30 families' harness

OUT = ROOT / "docs" / "bench" / "streamed_bytes.json"
CONFIGS = ROOT / "lowvram_gen" / "configs"
BUDGETS_GIB = (2, 4, 6, 8, 12)
GiB = 1024**3
ARCHS = {"sd15": ("unet", "UNet2DConditionModel", 512), "sdxl": ("unet", "UNet2DConditionModel", 1024),
         "flux": ("transformer", "FluxTransformer2DModel", 1024)}
SHARED_BLOCK_LISTS = {"flux": ("transformer_blocks", "single_transformer_blocks")}


def build_denoiser(arch: str):
    """The real architecture from its shipped config, random bfloat16 weights (see the module doc for Flux)."""
    import diffusers
    import torch
    from accelerate import init_empty_weights

    folder, class_name, _ = ARCHS[arch]
    cfg = json.loads((CONFIGS / arch / folder / "config.json").read_text())
    with init_empty_weights(include_buffers=False):
        model = getattr(diffusers, class_name).from_config(cfg)
    gen = torch.Generator().manual_seed(0)
    shared = {}  # (list name, parameter path inside a block) -> tensor, for the lists stored once
    lists = SHARED_BLOCK_LISTS.get(arch, ())
    for full_name, module in model.named_modules():
        for name, param in list(module._parameters.items()):
            if param is None or param.device.type != "meta":
                continue
            path = f"{full_name}.{name}" if full_name else name
            parts = path.split(".")
            key = (parts[0], ".".join(parts[2:])) if parts[0] in lists else None
            if key in shared:
                data = shared[key]
            else:
                data = torch.empty(param.shape, dtype=torch.bfloat16).normal_(0, 0.02, generator=gen)
                if key is not None:
                    shared[key] = data
            module._parameters[name] = torch.nn.Parameter(data, requires_grad=False)
    return model.to(dtype=torch.bfloat16).eval()


def build_pipeline(arch: str, denoiser):
    """A diffusers pipeline around the denoiser: small text encoders and VAE of the widths it expects."""
    import torch
    from diffusers import (EulerDiscreteScheduler, FlowMatchEulerDiscreteScheduler, FluxPipeline,
                           StableDiffusionPipeline, StableDiffusionXLPipeline)

    from lowvram_gen.models.tiny import _text_encoder, _tokenizer, _vae

    torch.manual_seed(0)
    if arch == "sd15":
        return StableDiffusionPipeline(unet=denoiser, vae=_vae(), text_encoder=_text_encoder(False, hidden=768),
                                       tokenizer=_tokenizer(), scheduler=EulerDiscreteScheduler(steps_offset=1), safety_checker=None,
                                       feature_extractor=None, requires_safety_checker=False)
    if arch == "sdxl":
        return StableDiffusionXLPipeline(unet=denoiser, vae=_vae(), text_encoder=_text_encoder(False, hidden=768),
                                         text_encoder_2=_text_encoder(True, hidden=1280, seed=1),
                                         tokenizer=_tokenizer(), tokenizer_2=_tokenizer(),
                                         scheduler=EulerDiscreteScheduler(steps_offset=1))
    from tiny_transformers import t5_tokenizer, vae_16_channels
    from transformers import T5Config, T5EncoderModel

    tokenizer_2 = t5_tokenizer()
    t5 = T5EncoderModel(T5Config(vocab_size=len(tokenizer_2), d_model=4096, d_kv=16, d_ff=64, num_layers=1,
                                 num_heads=2, relative_attention_num_buckets=8, feed_forward_proj="gated-gelu",
                                 pad_token_id=0, eos_token_id=1, decoder_start_token_id=0))
    return FluxPipeline(transformer=denoiser, vae=vae_16_channels(0.3611, 0.1159),
                        scheduler=FlowMatchEulerDiscreteScheduler(use_dynamic_shifting=True),
                        text_encoder=_text_encoder(False, hidden=768), tokenizer=_tokenizer(),
                        text_encoder_2=t5, tokenizer_2=tokenizer_2)


def run_job(pipe, arch: str, steps: int) -> None:
    import torch

    kwargs = dict(num_inference_steps=steps, width=64, height=64, generator=torch.Generator().manual_seed(1),
                  output_type="latent")
    if arch == "flux":
        kwargs["max_sequence_length"] = 16
    with torch.inference_mode():
        pipe("a lighthouse at dusk", **kwargs)


def measure(pipe, arch: str, steps: int, settings=None, run=None) -> tuple[list[int], object]:
    """Bytes onloaded into the denoiser during each of its forwards, with `settings` applied (None:
    diffusers' enable_model_cpu_offload); `run(pipe)` runs the job (default: run_job's for `arch`)."""
    from lowvram_gen.hardware.device import probe
    from lowvram_gen.engines.sd.apply import apply_settings, denoiser_name
    from lowvram_gen.engines.sd.traffic import count_onloads
    from lowvram_gen.settings import MemorySettings

    with count_onloads() as meter:
        meter.watch(getattr(pipe, denoiser_name(pipe)))
        if settings is None:
            apply_settings(pipe, MemorySettings(dtype="bfloat16"), probe("cpu"))  # hooks off, bf16
            pipe.enable_model_cpu_offload(device="cpu")
            applied = None
        else:
            applied = apply_settings(pipe, settings, probe("cpu"))
        (run or (lambda p: run_job(p, arch, steps)))(pipe)
    if settings is None:
        pipe.remove_all_hooks()
    return meter.forwards, applied


def bench_arch(arch: str, steps: int) -> dict:
    import torch

    from lowvram_gen.models.profile import profile_builtin
    from lowvram_gen.planning.estimate import estimate
    from lowvram_gen.models.blocks import blocks_of, fixed_bytes, module_bytes
    from lowvram_gen.planning.residency import fit, split
    from lowvram_gen.settings import MemorySettings

    started = time.perf_counter()
    denoiser = build_denoiser(arch)
    pipe = build_pipeline(arch, denoiser)
    pipe.set_progress_bar_config(disable=True)
    blocks = blocks_of(denoiser)
    weights, fixed = module_bytes(denoiser), fixed_bytes(denoiser)
    side = ARCHS[arch][2]
    est = estimate(profile_builtin(arch), side, side, 1, MemorySettings(dtype="float16", offload="budget"))
    act, overhead = est.unet_bytes, est.overhead_bytes
    out = {"arch": arch, "native_side": side, "weights_bytes": weights, "fixed_bytes": fixed, "blocks": len(blocks),
           "largest_block_bytes": max(b for _, b in blocks), "activation_bytes": act, "overhead_bytes": overhead,
           "modes": {}, "budgets": []}
    for mode in ("none", "model", "group", "sequential"):
        fits = {str(b): (weights if mode in ("none", "model") else 0) + act + overhead <= b * GiB for b in BUDGETS_GIB}
        if mode == "model" and arch in SHARED_BLOCK_LISTS:
            # diffusers hooks the model for device "cpu:0", which accelerate's hook does not take for "cpu":
            # it calls .to("cpu:0") every forward, which copies every shared block: 22 GiB. Model offload
            # needs the whole transformer on the card, above every budget here (fits is all false).
            out["modes"][mode] = {"per_forward_bytes": [], "fits_gib": fits, "skipped": "needs 23 GiB; not run"}
            continue
        settings = None if mode == "model" else MemorySettings(dtype="bfloat16", offload=mode)
        forwards, _ = measure(pipe, arch, steps, settings)
        out["modes"][mode] = {"per_forward_bytes": forwards, "fits_gib": fits}
        print(f"{arch} {mode}: {[round(f / GiB, 3) for f in forwards]} GiB per forward", flush=True)
    for b in BUDGETS_GIB:
        room = b * GiB - act - overhead
        lower = max(0, weights - room)
        planned = fit(blocks, room - fixed)
        resident = planned.resident_bytes or 1  # resident_bytes 0 would mean "decide from the device"
        predicted = split(blocks, resident)
        forwards, applied = measure(pipe, arch, steps, MemorySettings(dtype="bfloat16", offload="budget",
                                                                      resident_bytes=resident))
        assert applied.residency == predicted
        row = {"budget_gib": b, "room_bytes": room, "lower_bound_bytes": lower, "resident_bytes": predicted.resident_bytes,
               "resident_blocks": len(predicted.resident), "streamed_blocks": len(predicted.streamed),
               "in_flight_bytes": predicted.in_flight_bytes, "predicted_bytes": predicted.streamed_bytes_per_step,
               "per_forward_bytes": forwards, "measured_equals_predicted": set(forwards) == {predicted.streamed_bytes_per_step}}
        out["budgets"].append(row)
        print(f"{arch} budget {b} GiB: resident {predicted.resident_bytes / GiB:.2f} GiB, measured "
              f"{[round(f / GiB, 3) for f in forwards]}, predicted {predicted.streamed_bytes_per_step / GiB:.3f}, "
              f"lower bound {lower / GiB:.3f} GiB", flush=True)
    out["seconds"] = round(time.perf_counter() - started, 1)
    del pipe, denoiser
    gc.collect()
    return out


PLAN_CARDS = {"sdxl": ((3, 512), (4, 512), (4, 0), (6, 512)), "flux": ((6, 512), (8, 512), (12, 512))}
FAMILY_CARDS = ((6, 512), (8, 512), (12, 512))  # issue 30: every family with shipped configs, at 1024x1024
PLAN_OUT = ROOT / "docs" / "bench" / "plan_streamed.json"


def bench_plans(arch: str, steps: int) -> list[dict]:
    """The planner's own pick for the native-size job on each card of PLAN_CARDS[arch] (GiB, reserve
    MiB), applied and measured: the plan's streamed bytes a step against what the hooks move."""
    from dataclasses import replace

    from lowvram_gen.hardware.device import simulated
    from lowvram_gen.models.profile import profile_builtin
    from lowvram_gen.planning.planner import plan
    from lowvram_gen.presets import load_presets

    denoiser = build_denoiser(arch)
    pipe = build_pipeline(arch, denoiser)
    pipe.set_progress_bar_config(disable=True)
    side = ARCHS[arch][2]
    rows = []
    for gib, reserve_mib in PLAN_CARDS[arch]:
        card = simulated(f"{gib}GiB", reserve_bytes=reserve_mib * 2**20)
        result = plan(card, profile_builtin(arch), side, side, 1, load_presets())
        chosen = next(e for e in result.estimates if e.name == result.preset.name)
        row = {"arch": arch, "card_gib": gib, "reserve_mib": reserve_mib, "usable_bytes": card.usable_bytes,
               "preset": result.preset.name, "planned_bytes": chosen.streamed_bytes_per_step,
               "lower_bound_bytes": chosen.lower_bound_bytes_per_step, "per_forward_bytes": []}
        memory = result.preset.memory
        if memory.offload == "budget" and memory.quantize == "none":  # int8/int4 of a full model: not on this CPU
            forwards, applied = measure(pipe, arch, steps, replace(memory, dtype="bfloat16"))
            row["per_forward_bytes"] = forwards
        rows.append(row)
        print(f"{arch} on {gib} GiB (reserve {reserve_mib} MiB): {result.preset.name}, plan "
              f"{row['planned_bytes'] / GiB:.3f} GiB a step, measured {[round(f / GiB, 3) for f in row['per_forward_bytes']]}, "
              f"lower bound {row['lower_bound_bytes'] / GiB:.3f}", flush=True)
    del pipe, denoiser
    gc.collect()
    return rows


def bench_family_plans(key: str, steps: int) -> list[dict]:
    """bench_plans for a family of benchmarks/streamed_families.py: the planner's pick for its 1024x1024 job on each
    card of FAMILY_CARDS, applied to its real-size transformer and measured where it streams."""
    from dataclasses import replace

    import streamed_families as fam

    from lowvram_gen.hardware.device import simulated
    from lowvram_gen.models.profile import profile_builtin
    from lowvram_gen.planning.planner import plan
    from lowvram_gen.presets import load_presets

    pipe = cfg = None
    rows = []
    for gib, reserve_mib in FAMILY_CARDS:
        card = simulated(f"{gib}GiB", reserve_bytes=reserve_mib * 2**20)
        result = plan(card, profile_builtin(key), 1024, 1024, 1, load_presets())
        chosen = next(e for e in result.estimates if e.name == result.preset.name)
        row = {"arch": key, "card_gib": gib, "reserve_mib": reserve_mib, "usable_bytes": card.usable_bytes,
               "preset": result.preset.name, "planned_bytes": chosen.streamed_bytes_per_step,
               "lower_bound_bytes": chosen.lower_bound_bytes_per_step, "per_forward_bytes": [],
               "peak_phase": chosen.breakdown.get("peak_phase", "")}
        memory = result.preset.memory
        if memory.offload == "budget" and memory.quantize == "none" and key in fam.FAMILIES:
            if pipe is None:
                transformer, cfg = fam.build_transformer(key)
                pipe = fam.build_pipeline(key, transformer)
            forwards, _ = measure(pipe, key, steps, replace(memory, dtype="bfloat16"),
                                  run=lambda p: fam.run_job(p, key, cfg, steps))
            row["per_forward_bytes"] = forwards
        rows.append(row)
        print(f"{key} on {gib} GiB: {result.preset.name}, plan {row['planned_bytes'] / GiB:.3f} GiB a step, measured "
              f"{[round(f / GiB, 3) for f in row['per_forward_bytes']]}, lower bound "
              f"{row['lower_bound_bytes'] / GiB:.3f}", flush=True)
    del pipe
    gc.collect()
    return rows


def plans_markdown(data: dict) -> str:
    g = lambda n: f"{n / GiB:.2f}"  # noqa: E731
    lines = ["| model | card (reserve) | usable | plan picks | plan: streamed/step | measured | measured / plan "
             "| lower bound | plan / lower bound |", "|---|---|---|---|---|---|---|---|---|"]
    for r in data["rows"]:
        measured = max(r["per_forward_bytes"], default=None)
        ratio = lambda a, b: f"{a / b:.3f}" if b else "-"  # noqa: E731
        lines.append(f"| {r['arch']} | {r['card_gib']} GiB ({r['reserve_mib']} MiB) | {g(r['usable_bytes'])} "
                     f"| {r['preset']} | {g(r['planned_bytes'])} | {g(measured) if measured is not None else 'not run'} "
                     f"| {ratio(measured, r['planned_bytes']) if measured is not None else '-'} "
                     f"| {g(r['lower_bound_bytes'])} | {ratio(r['planned_bytes'], r['lower_bound_bytes'])} |")
    return "\n".join(lines)


def markdown(data: dict) -> str:
    g = lambda n: f"{n / GiB:.2f}"  # noqa: E731
    lines = ["| model | budget (GiB) | room for weights | lower bound | budget offload: measured | split() predicts "
             "| resident (blocks) | model offload: step 1 / step 2+ | group | sequential |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for a in data["archs"]:
        modes = a["modes"]
        model, group, seq = (modes[m]["per_forward_bytes"] for m in ("model", "group", "sequential"))
        for row in a["budgets"]:
            fits = modes["model"]["fits_gib"][str(row["budget_gib"])]
            measured = sorted(set(row["per_forward_bytes"]))
            lines.append(
                f"| {a['arch']} ({g(a['weights_bytes'])} GiB) | {row['budget_gib']} | {g(max(0, row['room_bytes']))} "
                f"| {g(row['lower_bound_bytes'])} | {' / '.join(g(m) for m in measured)} | {g(row['predicted_bytes'])} "
                f"| {g(row['resident_bytes'])} ({row['resident_blocks']}/{a['blocks']}) "
                f"| {(g(model[0]) + ' / ' + g(max(model[1:], default=0))) if fits else 'does not fit'} "
                f"| {g(group[-1])} | {g(seq[-1])} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--only", default="", help="comma-separated archs (sd15,sdxl,flux; with --plans also the "
                        "issue-30 family keys: qwen-image,z-image,flux2-klein,...)")
    parser.add_argument("--markdown", action="store_true", help="print the table from the stored results")
    parser.add_argument("--out", default=None, help=f"default {OUT.relative_to(ROOT)} ({PLAN_OUT.relative_to(ROOT)} "
                        "with --plans)")
    parser.add_argument("--plans", action="store_true",
                        help="measure the planner's own picks (budget offload) on the cards of PLAN_CARDS instead")
    args = parser.parse_args()
    args.out = args.out or str(PLAN_OUT if args.plans else OUT)
    if args.markdown:
        print((plans_markdown if args.plans else markdown)(json.loads(Path(args.out).read_text())))
        return

    import diffusers
    import torch

    torch.set_num_threads(max(1, torch.get_num_threads()))
    archs = [a for a in ARCHS if not args.only or a in args.only.split(",")]
    if args.plans:
        data = {"command": "python benchmarks/bench_streamed_bytes.py --plans", "torch": torch.__version__,
                "diffusers": diffusers.__version__, "date": time.strftime("%Y-%m-%d"), "steps": args.steps, "rows": []}
        if args.only and Path(args.out).is_file():  # keep the other architectures' stored rows
            data["rows"] = [r for r in json.loads(Path(args.out).read_text())["rows"] if r["arch"] not in archs]
        from lowvram_gen import families

        new = [f.key for f in families.builtin_families() if f.builtin and f.key not in ARCHS
               and f.denoiser == "transformer" and f.key != "sd3"]
        for arch in (a for a in archs if a in PLAN_CARDS):
            data["rows"].extend(bench_plans(arch, args.steps))
            Path(args.out).parent.mkdir(parents=True, exist_ok=True)
            Path(args.out).write_text(json.dumps(data, indent=1))
        for key in (k for k in new if not args.only or k in args.only.split(",")):
            data["rows"] = [r for r in data["rows"] if r["arch"] != key]
            data["rows"].extend(bench_family_plans(key, args.steps))
            Path(args.out).parent.mkdir(parents=True, exist_ok=True)
            Path(args.out).write_text(json.dumps(data, indent=1))
        print(plans_markdown(data))
        print(f"-> {args.out}")
        return
    data = {"command": "python benchmarks/bench_streamed_bytes.py",
            "torch": torch.__version__, "diffusers": diffusers.__version__, "machine": platform.processor() or platform.machine(),
            "date": time.strftime("%Y-%m-%d"), "steps": args.steps, "size": "64x64", "archs": []}
    if args.only and Path(args.out).is_file():  # keep the other architectures' stored results
        data["archs"] = [a for a in json.loads(Path(args.out).read_text())["archs"] if a["arch"] not in archs]
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    for arch in archs:  # written after each architecture: a later one that fails keeps the earlier ones
        data["archs"].append(bench_arch(arch, args.steps))
        data["archs"].sort(key=lambda a: list(ARCHS).index(a["arch"]))
        Path(args.out).write_text(json.dumps(data, indent=1))
    print(markdown(json.loads(Path(args.out).read_text())))
    print(f"-> {args.out}")


if __name__ == "__main__":
    main()
