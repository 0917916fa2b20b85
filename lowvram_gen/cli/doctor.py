"""`lowvram-gen doctor`: what a user pastes into a bug report."""

from __future__ import annotations

import platform

from lowvram_gen import failures
from lowvram_gen.hardware.device import DEFAULT_RESERVE, format_size, probe
from lowvram_gen.planning import bus
from lowvram_gen.models import profile as memory
from lowvram_gen.planning.planner import plan


def _version(module: str) -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(module)
    except PackageNotFoundError:
        return "not installed"


def _kernels(device) -> dict:
    import torch

    info = {"sdpa": hasattr(torch.nn.functional, "scaled_dot_product_attention")}
    if device.kind == "cuda":
        info["flash_sdp"] = torch.backends.cuda.flash_sdp_enabled()
        info["mem_efficient_sdp"] = torch.backends.cuda.mem_efficient_sdp_enabled()
        info["cudnn_sdp"] = torch.backends.cuda.cudnn_sdp_enabled()
    try:
        import xformers.ops  # noqa: F401

        info["xformers"] = device.kind == "cuda"
    except Exception as exc:  # ImportError or a torch mismatch
        info["xformers"] = f"unusable ({type(exc).__name__})"
    return info


def measure_bus(dev, measure: bool = True, timed_copy=None, timed_compute=None) -> dict:
    """The host-to-device bandwidth and the card's compute (half-precision matmul FLOP/s, the int8/int4
    slowdown): measured now on CUDA and stored for the planner (planning/bus.py), and the figures the planner
    uses for this device after that. `timed_copy`, `timed_compute`: see bandwidth.measure, throughput.measure."""
    from lowvram_gen.hardware import bandwidth, throughput

    out = {"measured": None, "stored_in": None, "note": "", "compute": None}
    nbytes = min(bandwidth.COPY_BYTES, dev.usable_bytes // 4)  # room for the copy beside whatever else runs
    if not measure:
        out["note"] = "not measured: --skip-bus"
    elif dev.kind != "cuda":
        out["note"] = "not measured: no CUDA device"
    elif nbytes < bandwidth.MIN_COPY_BYTES:
        out["note"] = (f"not measured: {format_size(dev.usable_bytes)} usable is too little for "
                       f"{format_size(4 * bandwidth.MIN_COPY_BYTES)} of copies")
    else:
        try:
            result = bandwidth.measure(dev.torch_device, nbytes, timed_copy=timed_copy)
            compute = _measure_compute(dev, throughput, timed_compute)
            out["stored_in"] = str(bus.store(dev.name, result.pinned_bytes_per_s, result.pageable_bytes_per_s,
                                             half_flops_per_s=compute.half_flops_per_s if compute else None,
                                             slowdown=compute.slowdown if compute else None))
            out["measured"] = result.as_dict()
            out["compute"] = compute.as_dict() if compute else None
        except (RuntimeError, ValueError) as exc:  # out of memory, a driver error, an implausible value
            out["note"] = f"not measured: {exc}"
    used = bus.for_device(dev.name)
    out["planner"] = {**used.as_dict(), "warning": used.warning}
    return out


def _measure_compute(dev, throughput, timed=None):
    """The card's compute figures, or None (said in the log) when they cannot be measured: sdnq missing, out
    of memory beside what runs."""
    from lowvram_gen.models.quantize import QuantizeUnavailable

    try:
        return throughput.measure(dev.torch_device, timed=timed)
    except (RuntimeError, ValueError, QuantizeUnavailable) as exc:
        import logging

        logging.getLogger(__name__).warning("compute not measured: %s", exc)
        return None


def report(device: str | None = None, preset: str | None = None, vram_budget: int | None = None,
           reserve_vram: int | None = None, xformers: bool = False, measure: bool = True,
           ram_budget: int | None = None, precision=None) -> dict:
    """`precision` (settings.Precision: --no-half ...) and the other flags give the planner's picks shown here, as the
    Session of `generate` with the same flags would plan them."""
    import torch

    from lowvram_gen.session import Session

    dev = probe(device, reserve_bytes=reserve_vram if reserve_vram is not None else DEFAULT_RESERVE, budget_bytes=vram_budget,
                ram_budget_bytes=ram_budget)
    bus_info = measure_bus(dev, measure)  # before the plans below, so they use the new measurement
    session = Session(device=device, preset=preset, xformers=xformers, precision=precision)
    presets, forced = session.presets(), session.forced_preset()
    picks = {}
    for name, w, h in (("sd15", 512, 512), ("sdxl", 1024, 1024)):
        p = plan(dev, memory.profile_builtin(name), w, h, 1, presets, forced, full_precision=session.precision.full)
        picks[f"{name} {w}x{h}"] = p.preset.name
    return {
        "device": dev.as_dict(),
        "driver": _nvidia_driver() if dev.kind == "cuda" else None,
        "cuda": torch.version.cuda,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "versions": {m: _version(m) for m in ("lowvram-gen", "torch", "diffusers", "transformers", "accelerate",
                                              "gradio", "xformers")},
        "kernels": _kernels(dev),
        "alloc_conf": __import__("os").environ.get("PYTORCH_CUDA_ALLOC_CONF"),
        "presets": list(presets),
        "planner_picks": picks,
        "bus": bus_info,
        "remembered_failures": failures.load(),
    }


def _nvidia_driver() -> str | None:
    try:
        import subprocess

        out = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=10)
        return out.stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        return None


def format_report(info: dict) -> str:
    d = info["device"]
    vram = (f"total {format_size(d['total_bytes'])}, free {format_size(d['free_bytes'])}, "
            f"reserve {format_size(d['reserve_bytes'])}, budget {format_size(d['budget_bytes']) if d['budget_bytes'] else 'none'}, "
            f"usable {format_size(d['usable_bytes'])}") if d["kind"] != "cpu" else "- (no GPU: jobs run in system RAM)"
    lines = [
        f"device:      {d['name']} ({d['kind']})",
        f"vram:        {vram}",
        "ram:         " + _format_ram(d.get("host")),
        f"driver/cuda: {info['driver'] or '-'} / {info['cuda'] or '-'}",
        "versions:    " + ", ".join(f"{k} {v}" for k, v in info["versions"].items()),
        f"python:      {info['python']} on {info['platform']}",
        "kernels:     " + ", ".join(f"{k}={v}" for k, v in info["kernels"].items()),
        f"allocator:   PYTORCH_CUDA_ALLOC_CONF={info['alloc_conf']}",
        f"presets:     {', '.join(info['presets'])}",
        "bus:         " + _format_bus(info["bus"]),
        "planner:     " + "; ".join(f"{k} -> {v}" for k, v in info["planner_picks"].items()),
        f"failures:    {len(info['remembered_failures'])} remembered"
        + "".join(f"\n  {r['model']} {r['pixels']} px x{r['batch']} at {r['preset']} on {r['device']}"
                  for r in info["remembered_failures"]),
    ]
    return "\n".join(lines)


def _format_ram(h: dict | None) -> str:
    """System RAM as the planner sees it (hostmem.HostMemory.as_dict)."""
    if not h:
        return "not probed"
    text = (f"total {format_size(h['total_bytes'])}, available {format_size(h['available_bytes'])}, "
            f"this process {format_size(h['process_bytes'])}, usable {format_size(h['usable_bytes'])}")
    if h.get("limit_bytes"):
        text += f"; cgroup limit {format_size(h['limit_bytes'])} ({h['limit_source']})"
    if h.get("budget_bytes"):
        text += f"; --ram-budget {format_size(h['budget_bytes'])}"
    return text


def _gbs(bytes_per_s: float) -> str:
    return f"{bytes_per_s / 1e9:.1f} GB/s"


def _format_bus(b: dict) -> str:
    m = b["measured"]
    if m:
        pageable = f", {_gbs(m['pageable_bytes_per_s'])} pageable" if m["pageable_bytes_per_s"] else ""
        text = (f"{_gbs(m['pinned_bytes_per_s'])} pinned{pageable} host-to-device "
                f"({format_size(m['copy_bytes'])} copies, median of {m['repeats']}); stored in {b['stored_in']}")
    else:
        text = b["note"]
    if b.get("compute"):
        c = b["compute"]
        text += (f"\n  compute: {c['half_flops_per_s'] / 1e12:.1f} TFLOP/s {c['dtype']} matmul; weights dequantized "
                 "on the fly take " + ", ".join(f"{k} x{v:.2f}" for k, v in c["slowdown"].items())
                 + " the 16-bit time (the planner uses these)")
    planner = b["planner"]
    text += f"\n  the planner uses {_gbs(planner['bytes_per_s'])} ({planner['source']})"
    return text + (f"\n  warning: {planner['warning']}" if planner["warning"] else "")
