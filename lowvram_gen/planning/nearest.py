"""What does fit, when a job does not fit the card and RAM it was planned for: one sentence naming the nearest card
(with the same RAM) and the nearest RAM (with the same card) on which the planner's pick runs the job at its full
size with weights no lossier than int8, read from RAM (not from disk). `plan` prints it ("would fit: ...") and puts
it in its JSON ("nearest"); benchmarks/plan_table.py writes it beside each target of the README's table.

A job "fits" when the pick makes the requested size (not capped and upscaled), fits the VRAM and the RAM, and keeps
its weights lossless or in 8 bits: int4 (visibly lossy) and weights paged from disk (slow) run, and the sentence says
what would run the job without them. The sizes tried are the cards and RAM sizes people buy (CARDS_GIB, RAM_GIB),
each a whole plan, so the search costs a few dozen plans at most and runs only when the job does not fit.
"""

from __future__ import annotations

from typing import Callable

from lowvram_gen.hardware.bytesize import GiB
from lowvram_gen.planning.estimate import rendered_size
from lowvram_gen.planning.planner import Plan, shared_estimates, storage

CARDS_GIB = (2, 3, 4, 6, 8, 10, 12, 16, 20, 24, 32, 48, 80)
RAM_GIB = (4, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256)
PlanOn = Callable[[int, int], Plan]  # (VRAM GiB, RAM GiB) -> the plan the job gets there


def status(result: Plan, width: int, height: int) -> str:
    """'fits' | 'int4' (fits only with 4-bit weights) | 'disk' (only with weights read from disk) | 'capped' (made
    smaller and upscaled, or over the VRAM) | 'ram' (nothing fits the RAM: the planner refuses)."""
    if result.refusal:  # the RAM's, or (a clip, planning/video_fit.py) no candidate fitting the card at its size
        return "ram" if not any(e.fits_host for e in result.estimates) else "capped"
    row = next((e for e in result.estimates if e.name == result.preset.name), None)
    if row is None or not row.fits or not row.fits_host or row.capped or (row.width, row.height) != (width, height):
        return "capped"
    if storage(result.preset.memory) == "int4":
        return "int4"
    if result.preset.memory.paged_weights:
        return "disk"
    return "fits"


_WHY = {"int4": "runs only with 4-bit weights (visibly lossy)", "disk": "runs only reading its weights from disk",
        "capped": "does not fit at its full size", "ram": "does not fit the RAM"}


def nearest(plan_on: PlanOn, result: Plan, label: str, width: int, height: int, vram_gib: float,
            ram_gib: float) -> str:
    """One sentence: why the job does not fit `vram_gib` of VRAM and `ram_gib` of RAM, and the nearest card and RAM
    that do; "" when it fits."""
    why = status(result, width, height)
    if why == "fits":
        return ""
    with shared_estimates():  # the same job on each size tried: the same estimates asked again
        return _nearest(plan_on, why, label, width, height, vram_gib, ram_gib)


def _nearest(plan_on: PlanOn, why: str, label: str, width: int, height: int, vram_gib: float, ram_gib: float) -> str:
    def fits(v: int, r: int) -> Plan | None:
        found = plan_on(v, r)
        return found if status(found, width, height) == "fits" else None

    more_vram = next(((v, p) for v in CARDS_GIB if v > vram_gib + 0.01 for p in [fits(v, ram_gib)] if p), None)
    more_ram = next(((r, p) for r in RAM_GIB if r > ram_gib + 0.01 for p in [fits(vram_gib, r)] if p), None)
    ways = []
    if more_vram:
        ways.append(f"on a {more_vram[0]} GiB card with the same RAM ({more_vram[1].preset.name})")
    if more_ram:
        ways.append(f"with {more_ram[0]} GiB of RAM on the same card ({more_ram[1].preset.name})")
    if not ways:  # neither alone: the least card with the most RAM, then the least RAM with that card
        card = next((v for v in CARDS_GIB if v > vram_gib + 0.01 and fits(v, RAM_GIB[-1])), None)
        ram = card and next((r for r in RAM_GIB if fits(card, r)), None)
        if card and ram:
            ways.append(f"on a {card} GiB card with {ram} GiB of RAM ({fits(card, ram).preset.name})")
    here = f"{_gib(vram_gib)} GiB of VRAM and {_gib(ram_gib)} GiB of RAM"
    what = " or ".join(ways) if ways else f"on nothing up to a {CARDS_GIB[-1]} GiB card with {RAM_GIB[-1]} GiB of RAM"
    return f"{label} at {width}x{height} {_WHY[why]} on {here}; at int8 or better and full size it fits {what}"


def _gib(n: float) -> str:
    return f"{n:.3g}"


def device_gib(device) -> tuple[float, float]:
    """(VRAM, RAM) of a device in GiB as `nearest` takes them: the card's total, the RAM the job may use."""
    return device.total_bytes / GiB, device.host.usable_bytes / GiB


def plan_nearest(session, request, device, profile, result: Plan, model: str) -> str:
    """`nearest` for `lowvram-gen plan`: each size tried is planned as `generate` would plan it there (the Session's
    presets, flags and remembered failures); "" on a CPU, where no card is to be had."""
    if not device.is_accelerator:
        return ""
    from lowvram_gen import families

    label = families.by_arch(profile[0].arch).label if profile[0].arch != "custom" else model
    vram, ram = device_gib(device)
    # the size the family's pipeline renders the job at (HiDream: its native area), which the plan's rows are at: a
    # row at another size would read as a job made smaller
    width, height = rendered_size(profile[0], request.width, request.height)
    return nearest(lambda v, r: session.plan(request, session.device(vram=f"{v:g}GiB", ram=f"{r:g}GiB"),
                                             profile=profile),
                   result, label or model, width, height, vram, ram)
