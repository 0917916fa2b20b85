"""Probe the device: what accelerator there is, how much memory it has, and the user's budget.

Nothing here touches CUDA at import time. `probe()` is the first thing a job calls; it sets
`PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True` before CUDA initialises (unless the user set
it): expandable segments cut fragmentation, which is what turns "4 GB free" into an OOM.
"""

from __future__ import annotations

import logging
import os
from dataclasses import asdict, dataclass

from lowvram_gen.hardware.hostmem import HostMemory, probe_host
from lowvram_gen.hardware.bytesize import GiB, MiB, format_size, parse_size  # noqa: F401  (callers import them from here)

log = logging.getLogger(__name__)

# ComfyUI leaves 0.4-0.6 GB for the OS and other programs; we default to the middle of that.
DEFAULT_RESERVE = 512 * MiB


@dataclass(frozen=True)
class DeviceInfo:
    kind: str  # 'cuda' | 'mps' | 'cpu'
    name: str
    index: int = 0
    total_bytes: int = 0  # device memory; 0 where unknown (a CPU's RAM is `host`)
    free_bytes: int = 0
    capability: tuple[int, int] | None = None
    bf16: bool = False
    reserve_bytes: int = DEFAULT_RESERVE
    budget_bytes: int | None = None  # user cap (--vram-budget); None: no cap beyond free memory
    host: HostMemory | None = None  # system RAM (hostmem.py); None: not probed (plan --vram without --ram)

    @property
    def torch_device(self) -> str:
        return f"cuda:{self.index}" if self.kind == "cuda" else self.kind

    @property
    def is_accelerator(self) -> bool:
        return self.kind in ("cuda", "mps")

    @property
    def usable_bytes(self) -> int:
        """What a job may plan to use: free memory minus the reserve, capped by the budget."""
        usable = max(0, self.free_bytes - self.reserve_bytes)
        if self.budget_bytes is not None:
            usable = min(usable, self.budget_bytes)
        return usable

    def as_dict(self) -> dict:
        data = asdict(self)
        data["usable_bytes"] = self.usable_bytes
        data["host"] = self.host.as_dict() if self.host is not None else None
        return data


def set_alloc_conf() -> None:
    """Expandable segments before CUDA starts, unless the user chose their own allocator config."""
    if "PYTORCH_CUDA_ALLOC_CONF" not in os.environ and "PYTORCH_ALLOC_CONF" not in os.environ:
        os.environ["PYTORCH_CUDA_ALLOC_CONF"] = "expandable_segments:True"


def probe(
    prefer: str | None = None,
    index: int | None = None,
    reserve_bytes: int = DEFAULT_RESERVE,
    budget_bytes: int | None = None,
    ram_budget_bytes: int | None = None,
) -> DeviceInfo:
    """Detect the device. `prefer='cpu'` forces the CPU (--cpu); otherwise CUDA, then MPS, then CPU.

    With a budget on CUDA, `torch.cuda.set_per_process_memory_fraction` enforces it, so the app
    really stays under it (an allocation past it raises OOM, which the retry ladder handles).
    System RAM is probed too (hostmem.py), capped by `ram_budget_bytes` (--ram-budget).
    """
    set_alloc_conf()
    host = probe_host(ram_budget_bytes)
    import torch

    if prefer != "cpu" and torch.cuda.is_available():
        if index is None:
            index = int(os.environ.get("LOCAL_RANK", torch.cuda.current_device()))
        free, total = torch.cuda.mem_get_info(index)
        props = torch.cuda.get_device_properties(index)
        if budget_bytes is not None:
            torch.cuda.set_per_process_memory_fraction(min(1.0, budget_bytes / total), index)
        return DeviceInfo(
            kind="cuda", name=props.name, index=index, total_bytes=total, free_bytes=free,
            capability=(props.major, props.minor), bf16=torch.cuda.is_bf16_supported(),
            reserve_bytes=reserve_bytes, budget_bytes=budget_bytes, host=host,
        )
    if prefer != "cpu" and getattr(torch.backends, "mps", None) and torch.backends.mps.is_available():
        total = int(torch.mps.recommended_max_memory())
        free = max(0, total - int(torch.mps.driver_allocated_memory()))
        return DeviceInfo(kind="mps", name="Apple MPS", total_bytes=total, free_bytes=free, bf16=True,
                          reserve_bytes=reserve_bytes, budget_bytes=budget_bytes, host=host)
    return DeviceInfo(kind="cpu", name=_cpu_name(), bf16=cpu_native_bf16(), reserve_bytes=reserve_bytes,
                      budget_bytes=budget_bytes, host=host)


# CPU flags (Linux /proc/cpuinfo) of bfloat16 arithmetic in hardware: AVX512-BF16 (Cooper Lake, Zen 4 and
# later) and AMX (Sapphire Rapids and later). Without them torch emulates bfloat16 on the CPU: one 512 px
# step of SD 1.5 took over 8 minutes here (AVX2), against seconds in float32 (docs/benchmarks.md).
NATIVE_BF16_FLAGS = ("avx512_bf16", "amx_bf16")


def cpu_native_bf16(cpuinfo: str = "/proc/cpuinfo") -> bool:
    """Whether this CPU computes bfloat16 natively (torch.backends.cpu.get_cpu_capability() names the vector
    width only, "AVX512" with or without BF16, so the flags are read). LOWVRAM_GEN_CPU_BF16=0 or 1 overrides
    the flags: 0 keeps the cpu preset in float32 (bfloat16 rounds each activation to 8 bits of mantissa), 1
    offers bfloat16 where the flags are missing (a virtual machine that hides them)."""
    override = os.environ.get("LOWVRAM_GEN_CPU_BF16", "").strip()
    if override in ("0", "1"):
        return override == "1"
    if override:
        log.warning("LOWVRAM_GEN_CPU_BF16=%r is neither 0 nor 1; reading the CPU's flags instead", override)
    try:
        with open(cpuinfo, encoding="utf-8") as fh:
            for line in fh:
                if line.startswith("flags"):
                    return any(flag in line.split() for flag in NATIVE_BF16_FLAGS)
    except OSError:
        pass
    return False


def fake(total_gib: float, kind: str = "cuda", name: str | None = None, **kw) -> DeviceInfo:
    """A device that is not there: for `plan --vram`, the planner's tests and dry runs."""
    total = int(total_gib * GiB)
    return DeviceInfo(kind=kind, name=name or f"{total_gib:g} GiB {kind} (simulated)", total_bytes=total,
                      free_bytes=kw.pop("free_bytes", total), capability=(8, 6) if kind == "cuda" else None,
                      bf16=kw.pop("bf16", kind != "cpu"), **kw)


def simulated(size: str, **kw) -> DeviceInfo:
    """`plan --vram SIZE`: a card of exactly that many bytes, named as the user typed the size."""
    from dataclasses import replace

    total = parse_size(size, "--vram")
    shown = str(size).strip() + (" GiB" if str(size).strip()[-1:].isdigit() else "")
    return replace(fake(total / GiB, name=f"simulated {shown} card", **kw), total_bytes=total, free_bytes=total)


def _cpu_name() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as fh:
            for line in fh:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    import platform

    return platform.processor() or "CPU"
