"""The plan of a job with A1111's refiner (issue 32 item 5; the run: engines/sd/refiner.py).

The two UNets are never on the device together: at the switch the base's denoiser leaves before the refiner's
comes in, and the refiner goes back to the host after its pass. So the device's peak is the larger of the two halves
(the base's, which the preset's estimate counts, or the same job with the refiner's UNet in the base's place), the
refiner's weights are held in system RAM beside the base's for the whole job, and each refined pass moves the
refiner's UNet over the bus twice (in, and out again), plus the base's twice where the preset keeps it resident (off
at the switch, back for the next pass). The seconds are those bytes over the plan's bus (planning/bus.py).

Each candidate of the plan counts the refiner too (`RefinerLoad`, which planning/planner.py's rows add): its RAM
column holds the refiner's weights (as the base's are kept: the load dtype, the preset's quantization) and, after the switch, what
of the base comes back to the host in its place; its VRAM estimate holds what a whole refiner UNet needs above the
base's denoiser (a streaming preset streams the refiner's too: nothing above). So the RAM refusal and the preset
choice see a refiner that does not fit.
"""

from __future__ import annotations

from dataclasses import dataclass

from lowvram_gen.hardware.device import format_size
from lowvram_gen.planning.estimate import DTYPE_BYTES


WHOLE = ("none", "model")  # offloads that put a UNet whole on the device for its calls (the others stream it)


@dataclass(frozen=True)
class RefinerLoad:
    """The refiner as each candidate of a plan counts it: `name` as the user gave it, `profile` its ModelProfile."""

    name: str
    profile: object

    def _kept(self, settings) -> dict[str, int]:
        # loaded as the base is (engines/sd/refiner.load): the load dtype, the preset's int8/int4 quantization
        from lowvram_gen.planning.host import kept_bytes

        return kept_bytes(self.profile, settings)

    def unet_bytes(self, settings) -> int:
        return int(self._kept(settings).get(self.profile.denoiser, 0))

    def ram_bytes(self, settings) -> int:
        return int(sum(self._kept(settings).values()))

    def host_bytes(self, settings, on_gpu: bool, base_back_bytes: int) -> int:
        """What the refiner adds to a candidate's RAM peak: all of it held on the host until the switch; after it,
        its UNet on the device where the offload moves it whole, and `base_back_bytes` of the base (a resident
        UNet, a budget split's resident part) back on the host in its place."""
        held = self.ram_bytes(settings)
        if not on_gpu:
            return held
        moved = self.unet_bytes(settings) if settings.offload in WHOLE else 0
        return max(held, held - moved + base_back_bytes)

    def extra_vram_bytes(self, settings, base_denoiser_bytes: int) -> int:
        """What the refiner's half needs on the device above the base's: a whole UNet larger than the base's
        denoiser as stored; nothing where the preset streams it (block by block, as the base's)."""
        if settings.offload not in WHOLE:
            return 0
        return max(0, self.unet_bytes(settings) - int(base_denoiser_bytes))


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
