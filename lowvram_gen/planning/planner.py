"""Pick the fastest preset whose estimate fits, and the ladder of cheaper ones below it.

Presets are tried fastest first and the first that fits is chosen, so less VRAM can only ever
give the same or a slower preset. A forced preset (--medvram, --lowvram, --novram, --cpu,
--preset) replaces the choice, as in A1111 and ComfyUI; the ladder below it still applies.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from lowvram_gen.device import DeviceInfo, format_size
from lowvram_gen.presets import Preset, gpu_ladder
from lowvram_gen.planning.estimate import estimate
from lowvram_gen.planning.sizes import capped_size, vae_tile_size


@dataclass
class PresetEstimate:
    name: str
    estimate_bytes: int
    fits: bool
    width: int
    height: int
    batch: int
    skipped_reason: str = ""
    breakdown: dict = field(default_factory=dict)

    def as_dict(self) -> dict:
        return {"name": self.name, "estimate_bytes": self.estimate_bytes, "fits": self.fits, "width": self.width,
                "height": self.height, "batch": self.batch, "skipped_reason": self.skipped_reason,
                "breakdown": self.breakdown}


@dataclass
class Plan:
    preset: Preset
    ladder: list[Preset]  # the chosen preset first, then every cheaper one
    estimates: list[PresetEstimate]
    reason: str

    def as_dict(self) -> dict:
        return {"preset": self.preset.name, "ladder": [p.name for p in self.ladder], "reason": self.reason,
                "presets": [e.as_dict() for e in self.estimates]}


def plan(device: DeviceInfo, profile, width: int, height: int, batch: int, presets: dict[str, Preset],
         forced: Preset | None = None, failed: set[str] = frozenset(), cfg: bool = True) -> Plan:
    ladder = gpu_ladder(presets)
    tile = vae_tile_size(device)  # the tile apply_settings will give the VAE on this device

    def row(p: Preset) -> PresetEstimate:
        w, h = capped_size(width, height, p.max_pixels)
        b = min(batch, p.max_batch)
        est = estimate(profile, w, h, b, p.memory, cfg=cfg, vae_tile=tile)
        if p.device == "cpu":  # system RAM: nothing to fit into
            return PresetEstimate(p.name, est.total_bytes, True, w, h, b, "", est.as_dict())
        fits = device.is_accelerator and est.total_bytes <= device.usable_bytes
        reason = "ran out of memory before on this device for a job this size" if p.name in failed else ""
        return PresetEstimate(p.name, est.total_bytes, fits, w, h, b, reason, est.as_dict())

    result = choose(device, presets, [row(p) for p in ladder], forced,
                    "the ladder lowers the resolution if needed")
    if result.preset.device == "cpu":  # the CPU runs it: its estimate too, after the GPU rows
        result.estimates.append(row(result.preset))
    return result


def choose(device: DeviceInfo, presets: dict[str, Preset], estimates: list[PresetEstimate],
           forced: Preset | None = None, last_resort: str = "") -> Plan:
    """The plan from per-preset estimates (GPU ladder order), whatever engine made them."""
    ladder = gpu_ladder(presets)
    if forced is not None:
        below = [p for p in ladder if forced.device == "gpu" and p.rank > forced.rank]
        return Plan(forced, [forced, *below], estimates, f"forced by the user: {forced.name}")
    if not device.is_accelerator:
        cpu = next((p for p in presets.values() if p.device == "cpu"), None)
        if cpu is None:
            raise ValueError("no preset with device = 'cpu' in the presets folder")
        return Plan(cpu, [cpu], estimates, "no GPU found: the cpu preset")
    for i, (p, e) in enumerate(zip(ladder, estimates)):
        if e.fits and not e.skipped_reason:
            return Plan(p, ladder[i:], estimates,
                        f"fastest preset whose estimate fits the {format_size(device.usable_bytes)} usable")
    last = ladder[-1]
    return Plan(last, [last], estimates, f"no preset's estimate fits; starting at the cheapest ({last_resort})")
