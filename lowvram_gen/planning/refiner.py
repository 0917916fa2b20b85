"""The plan of a job with A1111's refiner (issue 32 item 5; the run: engines/sd/refiner.py).

The two UNets are never on the device together: at the switch the base's denoiser leaves before the refiner's
comes in, and the refiner goes back to the host after its pass. So the device's peak is the larger of the two halves
(the base's, which the preset's estimate counts, or the same job with the refiner's UNet in the base's place), the
refiner's weights are held in system RAM beside the base's for the whole job, and each refined pass moves the
refiner's UNet over the bus twice (in, and out again), plus the base's twice where the preset keeps it resident (off
at the switch, back for the next pass). The seconds are those bytes over the plan's bus (planning/bus.py).
"""

from __future__ import annotations

from dataclasses import dataclass

from lowvram_gen.hardware.device import format_size
from lowvram_gen.planning.estimate import DTYPE_BYTES


@dataclass(frozen=True)
class RefinerPlan:
    """What the refiner adds to a plan (`Plan.refiner`; `plan --json`'s "refiner")."""

    name: str
    base_unet_bytes: int  # the base's denoiser weights at the chosen preset's dtype
    refiner_unet_bytes: int  # the refiner's UNet at that dtype
    ram_bytes: int  # every component of the refiner, held in system RAM for the job
    swap_bytes: int  # moved over the bus for the hand-overs of the whole job
    swap_seconds: float
    passes: int  # refined passes (one per batch of the batch count)
    extra_vram_bytes: int  # the refiner half's peak above the base half's (its UNet larger), else 0

    def as_dict(self) -> dict:
        return dict(name=self.name, base_unet_bytes=self.base_unet_bytes, refiner_unet_bytes=self.refiner_unet_bytes,
                    ram_bytes=self.ram_bytes, swap_bytes=self.swap_bytes, swap_seconds=round(self.swap_seconds, 3),
                    passes=self.passes, extra_vram_bytes=self.extra_vram_bytes)

    def describe(self) -> str:
        """One line for `plan` and the plan's warnings."""
        extra = (f"; its half needs {format_size(self.extra_vram_bytes)} more VRAM than the base's"
                 if self.extra_vram_bytes else "")
        return (f"refiner {self.name}: swapped at the switch (the base's UNet, {format_size(self.base_unet_bytes)}, "
                f"leaves the device before the refiner's, {format_size(self.refiner_unet_bytes)}, comes in), "
                f"{format_size(self.swap_bytes)} over the bus in {self.passes} pass(es), about "
                f"{self.swap_seconds:.2g} s; held in RAM: {format_size(self.ram_bytes)}{extra}")


def plan_refiner(name: str, base, refiner, dtype: str, resident: bool, bus_bytes_per_s: float,
                 passes: int = 1) -> RefinerPlan:
    """The refiner's part of the plan: `base` and `refiner` are ModelProfiles (models/profile.py), `dtype` the chosen
    preset's compute dtype, `resident` whether that preset keeps the base's UNet on the device between calls (no
    offload), `passes` the refined passes of the job."""
    width = DTYPE_BYTES.get(dtype, 4)
    base_unet = int(base.params.get(base.denoiser, 0) * width)
    own = int(refiner.params.get(refiner.denoiser, 0) * width)
    ram = int(sum(refiner.params.values()) * width)
    moved = passes * (2 * own + (2 * base_unet if resident else 0))
    return RefinerPlan(name, base_unet, own, ram, moved, moved / max(bus_bytes_per_s, 1.0), passes,
                       max(0, own - base_unet))
