"""The plan of a clip (Session.plan's video branch), and, where no rung runs it, the frame count or size that would.

A clip is never made shorter or smaller without the user's word (FAULTS 37): the plan of a video job is made at the
frames and size asked, no preset's max_pixels caps it unless the request allows a lower resolution upscaled after
(`allow_upscale`), and when no candidate fits the card and the RAM the plan carries a refusal: one sentence with
what it needs, what there is, and `would fit:` the most frames that fit at the size asked and the largest size (same
aspect, the model's size multiple) that fits the frames asked, each found by bisection over whole plans (a few
dozen estimates each, the same rows the ladder has).
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Callable

from lowvram_gen.hardware.device import format_size
from lowvram_gen.planning import video
from lowvram_gen.planning.planner import Plan

PlanAt = Callable[[object, int, int], Plan]  # (the clip's profile, width, height) -> the plan made there


def folder_video(record, spec: str, folder):
    """The record's Video facts of the model folder `folder` (None: the record's own, a built-in's shipped configs
    where it has them): the variant the folder's model_index.json says (Family.video_facts)."""
    from lowvram_gen.families import sampling
    from lowvram_gen.models.profile import CONFIGS

    if folder is None and record.builtin and (CONFIGS / record.builtin).is_dir():
        folder = CONFIGS / record.builtin
    return record.video_facts(sampling.folder_facts(spec, Path(folder) if folder else None))


def chosen_row(result: Plan):
    return next((e for e in result.estimates if e.name == result.preset.name), None)


def runs(result: Plan, allow_upscale: bool) -> bool:
    """Whether the plan's pick runs the clip as asked: it fits the card and the RAM, at the size asked (or a capped
    one where the request allows upscaling), and nothing refused it."""
    if result.refusal:
        return False
    row = chosen_row(result)
    return row is not None and row.fits and row.fits_host and (allow_upscale or not row.capped)


def plan_clip(plan_at: PlanAt, profile, facts, request, label: str, forced: bool = False,
              bus_bytes_per_s: float | None = None) -> Plan:
    """The plan of `request`'s clip on the model `profile` (its configs' profile) whose Video facts are `facts`: the
    frames and tokens counted (`Plan.video`), Wan 2.2 A14B's swap, and the refusal where nothing runs it."""
    clip, job = video.planned(profile, facts, request)
    result = plan_at(clip, request.width, request.height)
    row = chosen_row(result)
    swap = int((row.breakdown or {}).get("expert_swap_bytes", 0)) if row else 0
    bus = bus_bytes_per_s or result.bus.bytes_per_s
    result.video = replace(job, swap_bytes=swap, swap_seconds=swap / bus if bus and swap else 0.0)
    allow = bool(request.allow_upscale)
    if forced and not result.refusal:  # a preset the user named runs as named: only the RAM refuses it
        return result
    if runs(result, allow):
        return result
    sentence = result.refusal or _needs(result, label, job)
    fit = would_fit(plan_at, profile, facts, request, allow)
    result.refusal = f"{sentence}; would fit: {fit}" if fit else (
        f"{sentence}; no shorter clip at this size and no smaller size with these frames fits: use a bigger card or "
        "more RAM")
    return result


def _needs(result: Plan, label: str, job: video.VideoJob) -> str:
    """What the clip needs at its least and what the machine has."""
    rows = result.estimates
    what = f"{label} at {job.width}x{job.height} with {job.frames} frames"
    in_ram = [r for r in rows if r.fits_host]
    if not in_ram:
        least = min(rows, key=lambda r: r.host_peak_bytes)
        return f"{what} needs about {format_size(least.host_peak_bytes)} of system RAM even at {least.name}"
    least = min(in_ram, key=lambda r: r.estimate_bytes)
    on_card = [r for r in rows if r.fits]
    if on_card:  # the card could hold it, but not beside what the RAM can hold
        ram = min(on_card, key=lambda r: r.host_peak_bytes)
        return (f"{what} fits the card and the RAM only apart: the least VRAM of the candidates that fit the RAM is "
                f"about {format_size(least.estimate_bytes)} ({least.name}), the least RAM of those that fit the card "
                f"about {format_size(ram.host_peak_bytes)} ({ram.name}); a clip is never made shorter or smaller on "
                "its own")
    return (f"{what} needs about {format_size(least.estimate_bytes)} of VRAM even at {least.name}, more than the card "
            "has usable (a clip is never made shorter or smaller on its own)")


def valid_frames(temporal: int, below: int) -> list[int]:
    """The frame counts the model takes (temporal x k + 1) below `below`, longest first."""
    return [n for n in range(below - 1, 0, -1) if (n - 1) % temporal == 0]


def would_fit(plan_at: PlanAt, profile, facts, request, allow_upscale: bool) -> str:
    """'49 frames at 832x480, or 81 frames at 640x368' (what runs, each alone); '' where neither does."""
    frames = int(request.frames or facts.frames)
    temporal = int(profile.vae_temporal if profile.vae_video else facts.temporal) or facts.temporal
    width, height = int(request.width), int(request.height)

    def ok(n: int, w: int, h: int) -> bool:
        clip, _ = video.planned(profile, facts, request, frames=n)
        return runs(plan_at(clip, w, h), allow_upscale)

    ways = []
    counts = valid_frames(temporal, frames)
    n = _last_true(counts, lambda k: ok(k, width, height))  # the most frames that fit at this size
    if n is not None:
        ways.append(f"{n} frames at {width}x{height}")
    m = max(1, int(profile.vae_scale_factor) * max(1, int(profile.transformer_patch)))
    sides = [k * m for k in range(width // m - 1, 0, -1)]  # narrower widths, the aspect kept
    sized = [(w, max(m, round(w * height / width / m) * m)) for w in sides]
    best = _last_true(sized, lambda wh: ok(frames, *wh))
    if best is not None:
        ways.append(f"{frames} frames at {best[0]}x{best[1]}")
    return " or ".join(ways)


def _last_true(items: list, fits: Callable[[object], bool]):
    """The first item of `items` (largest first) for which `fits` holds, by bisection (fits holds for a suffix)."""
    lo, hi = 0, len(items)  # answer in [lo, hi); hi: none
    if not items or not fits(items[-1]):
        return None
    hi = len(items) - 1  # items[hi] fits
    while lo < hi:
        mid = (lo + hi) // 2
        if fits(items[mid]):
            hi = mid
        else:
            lo = mid + 1
    return items[hi]
