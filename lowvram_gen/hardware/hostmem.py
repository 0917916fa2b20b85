"""Probe system RAM, the second memory every low-VRAM job lives in: total, available, and the limit of
the cgroup the process runs in (containers, Colab, Docker, systemd slices), whichever is smallest.

When RAM runs out, Linux's OOM killer ends the process: no `except` runs and no ladder can step
down. So the planner must know before loading what RAM there is (planning/host.py estimates what a
job needs). Read from /proc and /sys only: no torch, nothing at import time.

- /proc/meminfo: MemTotal and MemAvailable (the kernel's own estimate of what can be had without
  swapping, page cache included).
- cgroup v2: the process's cgroup from /proc/self/cgroup ("0::/path"), then memory.max and
  memory.current, walking up to the root (a parent's limit binds too).
- cgroup v1: the "memory" line of /proc/self/cgroup, then memory.limit_in_bytes and
  memory.usage_in_bytes, likewise up to the root; "no limit" is a huge number there (2^63 rounded
  to pages).
- In both, file pages the kernel can drop before it kills (inactive_file in memory.stat) are not
  counted as used: a model file read once stays in the page cache, charged to the cgroup, until
  something needs the room.

`root` is the filesystem root to read under, so tests can point it at fixture files.
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path

# cgroup v1 writes "no limit" as PAGE_COUNTER_MAX pages: 9223372036854771712 with 4 KiB pages
_NO_LIMIT = 1 << 60


@dataclass(frozen=True)
class HostMemory:
    total_bytes: int  # MemTotal, or the cgroup limit when that is smaller
    available_bytes: int  # what a job can still get: the smallest of MemAvailable and each cgroup's room
    process_bytes: int = 0  # this process's resident set now (a loaded model, torch itself)
    limit_bytes: int | None = None  # the tightest cgroup limit; None: no cgroup limit
    limit_source: str = ""  # the file that set limit_bytes, and a launch's share of the RAM
    budget_bytes: int | None = None  # --ram-budget: the user's cap on what a job may use
    simulated: bool = False  # plan --ram: no machine was read

    @property
    def usable_bytes(self) -> int:
        """What a job in this process may reach at its peak: what is free plus what the process holds
        now (its own resident set is part of the peak the planner estimates), capped by the budget."""
        usable = self.available_bytes + self.process_bytes
        if self.budget_bytes is not None:
            usable = min(usable, self.budget_bytes)
        return max(0, usable)

    def describe(self) -> str:
        from lowvram_gen.hardware.bytesize import format_size

        if self.simulated:
            return f"{format_size(self.usable_bytes)} (simulated)"
        text = (f"{format_size(self.usable_bytes)} usable: {format_size(self.available_bytes)} available of "
                f"{format_size(self.total_bytes)}")
        if self.limit_bytes is not None:
            text += f" (cgroup limit {format_size(self.limit_bytes)}, {self.limit_source})"
        elif self.limit_source:
            text += f" ({self.limit_source})"
        if self.process_bytes:
            text += f", {format_size(self.process_bytes)} held by this process"
        if self.budget_bytes is not None:
            text += f", --ram-budget {format_size(self.budget_bytes)}"
        return text

    def as_dict(self) -> dict:
        data = asdict(self)
        data["usable_bytes"] = self.usable_bytes
        return data


def _read(path: Path) -> str | None:
    try:
        return path.read_text()
    except (OSError, UnicodeDecodeError):
        return None


def _number(path: Path) -> int | None:
    text = _read(path)
    if text is None:
        return None
    text = text.strip()
    if text == "max":
        return None
    try:
        value = int(text)
    except ValueError:
        return None
    return None if value >= _NO_LIMIT else value


def _meminfo(root: Path) -> dict[str, int]:
    out = {}
    for line in (_read(root / "proc/meminfo") or "").splitlines():
        key, _, rest = line.partition(":")
        parts = rest.split()
        if parts and parts[0].isdigit():
            out[key] = int(parts[0]) * (1024 if parts[1:2] == ["kB"] else 1)
    return out


def _stat(path: Path, key: str) -> int:
    for line in (_read(path) or "").splitlines():
        name, _, value = line.partition(" ")
        if name == key and value.strip().isdigit():
            return int(value)
    return 0


def _cgroup_dirs(root: Path) -> list[tuple[str, Path]]:
    """(version, directory) of this process's memory cgroup and each of its parents, innermost first."""
    found = []
    for line in (_read(root / "proc/self/cgroup") or "").splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        _, controllers, rel = parts
        rel = rel.strip().lstrip("/")
        if "memory" in controllers.split(","):
            base, version = root / "sys/fs/cgroup/memory", "v1"
        elif parts[0] == "0" and controllers == "":
            base, version = root / "sys/fs/cgroup", "v2"
        else:
            continue
        here = base / rel if rel else base
        while True:
            found.append((version, here))
            if here == base:
                break
            here = here.parent
    # v1's memory controller, when present, is the one that limits memory (a hybrid system's v2 tree
    # then has no memory controller)
    v1 = [f for f in found if f[0] == "v1"]
    return v1 or found


def _cgroup_room(root: Path) -> tuple[int | None, int | None, str]:
    """(tightest limit, room left under it, the file that set it) over the process's cgroups."""
    best: tuple[int | None, int | None, str] = (None, None, "")
    for version, d in _cgroup_dirs(root):
        if version == "v1":
            limit, usage = _number(d / "memory.limit_in_bytes"), _number(d / "memory.usage_in_bytes")
            name = "memory.limit_in_bytes"
            reclaimable = _stat(d / "memory.stat", "total_inactive_file") or _stat(d / "memory.stat", "inactive_file")
        else:
            limit, usage = _number(d / "memory.max"), _number(d / "memory.current")
            name = "memory.max"
            reclaimable = _stat(d / "memory.stat", "inactive_file")
        if limit is None:
            continue
        room = max(0, limit - max(0, (usage or 0) - reclaimable))
        if best[1] is None or room < best[1]:
            rel = d.relative_to(root) if d.is_relative_to(root) else d
            best = (limit, room, f"/{rel}/{name}")
    return best


def _local_processes() -> int:
    """How many processes of one launch share this machine's RAM (accelerate/torchrun set LOCAL_WORLD_SIZE)."""
    import os

    try:
        return max(1, int(os.environ.get("LOCAL_WORLD_SIZE", "1")))
    except ValueError:
        return 1


def process_rss(root: Path = Path("/")) -> int:
    """This process's resident set now, in bytes (0 where /proc is not there)."""
    for line in (_read(root / "proc/self/status") or "").splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


def probe_host(budget_bytes: int | None = None, root: str | Path = "/") -> HostMemory:
    """System RAM as a job in this process can use it. Where nothing can be read (not Linux), the
    total comes from os.sysconf and the available memory is taken as the total."""
    root = Path(root)
    info = _meminfo(root)
    total = info.get("MemTotal") or _sysconf_total()
    available = info.get("MemAvailable", total)
    limit, room, source = _cgroup_room(root)
    if limit is not None:
        total = min(total, limit) if total else limit
        available = min(available, room if room is not None else available)
    share = _local_processes()
    if share > 1:  # `accelerate launch` on this machine: every process loads its own copy of the model
        available //= share
        source = f"{source + '; ' if source else ''}shared by {share} processes (LOCAL_WORLD_SIZE)"
    return HostMemory(total_bytes=int(total), available_bytes=int(available), process_bytes=process_rss(root),
                      limit_bytes=limit, limit_source=source, budget_bytes=budget_bytes)


def simulated_host(size: str) -> HostMemory:
    """`plan --ram SIZE`: a machine with exactly that much RAM free for the job."""
    from lowvram_gen.hardware.bytesize import parse_size

    n = parse_size(size, "--ram")
    return HostMemory(total_bytes=n, available_bytes=n, simulated=True)


def _sysconf_total() -> int:
    import os

    try:
        return int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    except (ValueError, OSError, AttributeError):
        return 0


# glibc's mallopt parameters (malloc.h)
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3
LOAD_MMAP_THRESHOLD = 64 * 1024  # while loading: every block over 64 KiB is its own mapping, freed at once
RUN_MMAP_THRESHOLD = 32 * 1024 * 1024  # after: glibc's own upper bound, so activations reuse the heap


@contextmanager
def returning_freed_memory():
    """Load weights with glibc handing freed memory back to the kernel at once.

    Loading converts and quantizes tensor by tensor, freeing a temporary for each; glibc keeps freed heap
    blocks for reuse (its mmap threshold grows to 32 MiB as big blocks are freed), so the process's memory
    ratchets up to the size of everything it ever held: loading the real-size SDXL folder with int8
    weights (3.4 GiB of them) peaked at 14.4 GiB of anonymous memory and kept 14.0 GiB, and was killed in
    an 8 GiB cgroup; with the threshold fixed at 64 KiB it peaked at 4.7 GiB (docs/benchmarks.md). A1111
    preloads tcmalloc for the same reason. After the load the threshold goes to glibc's upper bound (the
    activations of each step reuse the heap) and the heap's free top is trimmed. No-op without glibc."""
    libc = _glibc()
    if libc is not None:
        libc.mallopt(_M_MMAP_THRESHOLD, LOAD_MMAP_THRESHOLD)
        libc.mallopt(_M_TRIM_THRESHOLD, LOAD_MMAP_THRESHOLD)
    try:
        yield
    finally:
        if libc is not None:
            libc.mallopt(_M_MMAP_THRESHOLD, RUN_MMAP_THRESHOLD)
            libc.malloc_trim(0)


def _glibc():
    import ctypes
    import ctypes.util
    import platform

    if platform.system() != "Linux" or not platform.libc_ver()[0] == "glibc":
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        libc.mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
        return libc if hasattr(libc, "malloc_trim") else None
    except OSError:
        return None
