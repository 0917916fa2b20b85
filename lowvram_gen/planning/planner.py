"""Pick the fastest candidate whose estimate fits, and the ladder of cheaper ones below it.

A candidate is a preset x a weight storage (as the preset says, int8, int4) x, for presets with
`offload = "budget"`, the residency that fits: how many bytes of the denoiser stay on the GPU, the
rest streamed every step (planning/residency.py); beside a candidate whose host peak does not fit the RAM, the
same with its text encoders read from disk for each job (+te-reload, a diffusers folder only). Each gets an estimate of its peak memory
(planning/estimate.py) and of its seconds per step (planning/timing.py: compute plus the bytes moved
over the bus). The plan is the fastest lossless candidate that fits; a slightly lossy one (int8, fp8
weights) only when it is LOSSY_MARGIN faster or nothing lossless fits, a visibly lossy one (4-bit) only
when nothing else fits; the plan says which and why in its warnings and `loss_note`. Where nothing fits at the
requested size, the largest capped size that fits wins (upscaled after), speed breaking ties. A forced preset (--medvram,
--lowvram, --novram, --cpu, --preset) replaces the choice, as in A1111 and ComfyUI.

The ladder the out-of-memory recovery steps down is this same list: from the chosen candidate, each
next rung is the fastest candidate (lossless first) whose estimate is smaller than the last rung's,
so every step down needs less memory and costs as little time as it can.
"""

from __future__ import annotations

import contextlib
import copy
from dataclasses import dataclass, field, replace

from lowvram_gen.hardware.device import DeviceInfo, format_size
from lowvram_gen.planning import bus as bus_mod
from lowvram_gen.planning import host as host_mod
from lowvram_gen.planning import speed, timing
from lowvram_gen import families
from lowvram_gen.models.profile import calibration
from lowvram_gen.planning.estimate import Estimate, estimate, rendered_size
from lowvram_gen.planning.sizes import capped_size, size_multiple, vae_tile_size
from lowvram_gen.presets import Preset, gpu_ladder
from lowvram_gen.settings import precision_suffix

STORAGE_VARIANTS = ("int8", "int4")  # weight storage tried on top of each preset that stores fp16/bf16
# What a weight storage costs the image: 8-bit weights (int8, fp8) change it slightly, 4-bit ones visibly.
# 16-bit weights computed in float32 (half) change no number of the result.
LOSS = {"none": "none", "half": "none", "fp8": "slight", "int8": "slight", "int4": "visible"}
LOSSY = ("int4",)  # visibly lossy: only when nothing else fits
# A slightly lossy candidate (int8, fp8) is picked over the fastest lossless one only when its estimated step
# is at least this much shorter: a few percent is within the estimate's error and not worth the detail
LOSSY_MARGIN = 0.15
RUNG_STEP = 0.8  # a budget rung below another is sized to 80 % of its estimate: a step worth retrying
ASSUMED_STEPS = 20  # spreads per-job transfers over a job's steps when the request does not say
# text_encoders = "reloaded" (+te-reload) reads the encoders' files once per job: the bytes a second read from
# disk, a judgement (a SATA SSD reads about 500 MB/s, an NVMe drive several times that, a hard disk a quarter):
# a candidate that reloads is estimated slower by its encoders' file bytes at this speed, spread over the steps
DISK_BYTES_PER_S = 500e6
TE_RELOAD = "+te-reload"
DISK = "+disk"


@dataclass
class PresetEstimate:
    """One row of the plan: a candidate and its estimates."""

    name: str
    estimate_bytes: int
    fits: bool
    width: int
    height: int
    batch: int
    skipped_reason: str = ""
    breakdown: dict = field(default_factory=dict)
    streamed_bytes_per_step: int = 0
    est_seconds_per_step: float = 0.0
    lossy: bool = False  # 4-bit weights: visibly lossy
    capped: bool = False  # made below the requested size and upscaled (the preset's max_pixels)
    why: str = ""  # why this row was chosen, or why not
    # what must cross the bus each step at least, whatever the offload: the denoiser's weights (as this
    # candidate stores them) that do not fit beside its activations and the overhead in the usable memory
    lower_bound_bytes_per_step: int = 0
    # system RAM (planning/host.py): the candidate's host peak, and whether it fits the machine's RAM
    # (True where the RAM is unknown: `plan --vram` without `--ram`)
    host_peak_bytes: int = 0
    fits_host: bool = True
    host: dict = field(default_factory=dict)
    loss: str = "none"  # what the weights' storage costs the image: none | slight (int8, fp8) | visible (int4)
    # where est_seconds_per_step comes from: the assumed constants, or scaled by what jobs measured on this
    # device (planning/speed.py): source, factor, jobs, basis, and the assumed figure before the scaling
    timing: dict = field(default_factory=dict)

    def as_dict(self) -> dict:
        return {"name": self.name, "estimate_bytes": self.estimate_bytes, "fits": self.fits, "width": self.width,
                "height": self.height, "batch": self.batch, "skipped_reason": self.skipped_reason,
                "streamed_bytes_per_step": self.streamed_bytes_per_step,
                "est_seconds_per_step": round(self.est_seconds_per_step, 4), "lossy": self.lossy, "loss": self.loss,
                "capped": self.capped, "why": self.why,
                "lower_bound_bytes_per_step": self.lower_bound_bytes_per_step, "breakdown": self.breakdown,
                "host_peak_bytes": self.host_peak_bytes, "fits_host": self.fits_host, "host": self.host,
                "timing": self.timing}


@dataclass
class Plan:
    preset: Preset
    ladder: list[Preset]  # the chosen candidate first, then every cheaper rung
    estimates: list[PresetEstimate]
    reason: str
    warnings: list[str] = field(default_factory=list)
    bus: bus_mod.Bus = bus_mod.ASSUMPTION  # the host-to-device bandwidth the step times were estimated with
    # one sentence when no candidate fits the machine's RAM: what the job needs, what there is, what would
    # fit. A job with a refusal is stopped before loading (the kernel would kill it, unannounced)
    refusal: str = ""
    # why the chosen candidate's weights lose detail when the planner picked that over a lossless one (int8 for
    # speed): also in `warnings`, and written into the PNGs it makes
    loss_note: str = ""
    refiner: object = None  # planning/refiner.RefinerPlan: a refiner's swap, RAM and bus time; None: no refiner
    video: object = None  # planning/video.VideoJob: the frames and tokens a clip's plan counted; None: an image job

    def as_dict(self) -> dict:
        return {"preset": self.preset.name, "ladder": [p.name for p in self.ladder], "reason": self.reason,
                "warnings": list(self.warnings), "bus": self.bus.as_dict(), "refusal": self.refusal,
                "loss_note": self.loss_note, "refiner": self.refiner.as_dict() if self.refiner else None,
                **({"video": self.video.as_dict()} if self.video is not None else {}),
                "presets": [e.as_dict() for e in self.estimates]}


def storage(settings) -> str:
    """How the denoiser's weights are stored under `settings`: none | fp8 | half | int8 | int4."""
    if settings.quantize != "none":
        return settings.quantize
    return "fp8" if settings.fp8_storage else "half" if settings.half_storage else "none"


def variants(preset: Preset, quantize_forced: bool = False, half_files: bool = False) -> list[Preset]:
    """`preset` as written, then with int8 and int4 weights when it stores them at full width (not when
    the user chose the weights' storage: --quantize, a batch line's or the UI's Quantize). The cpu
    preset too: there they save system RAM, the one memory a CPU job has, and so does keeping a half-precision
    checkpoint's 16-bit weights for float32 compute (`half_files`: the model's files are 16-bit), which
    changes no number of the result."""
    out = [preset]
    if preset.device == "cpu" and half_files and preset.memory.dtype == "float32" and storage(preset.memory) == "none":
        out.append(replace(preset, name=f"{preset.name}+half", memory=replace(preset.memory, half_storage=True)))
    if storage(preset.memory) == "none" and not quantize_forced:
        for q in STORAGE_VARIANTS:
            out.append(replace(preset, name=f"{preset.name}+{q}", memory=replace(preset.memory, quantize=q)))
    return out


class _Rows:
    """Estimates of candidates for one job on one device."""

    def __init__(self, device: DeviceInfo, profile, width: int, height: int, batch: int, cfg: bool, steps: int,
                 failed: set[str], model: str = "", reloadable: bool = True, single_file: bool = False,
                 own_size: bool = False, refiner=None):
        self.refiner = refiner  # planning/refiner.RefinerLoad: counted in each row's RAM and VRAM; None: none
        self.device, self.profile, self.cfg, self.steps, self.failed = device, profile, cfg, steps, failed
        self.own_size = own_size  # the pipeline renders width x height whatever it is given: no preset caps it
        self.reloadable = reloadable  # the text encoders can come back from their own files (a diffusers folder)
        self.single_file = single_file  # one checkpoint file: its text encoders load whole, quantized after
        self.width, self.height, self.batch = width, height, batch
        self.tile = vae_tile_size(device)  # the tile apply_settings will give the VAE on this device
        self.multiple = size_multiple(profile)  # a capped size the pipeline takes, as the engine caps it
        self.budgets: list[Preset] = []  # budget presets unsized (plan() fills it): the ladder sizes them per rung
        self.flops_coefficients = calibration().get("flops", {})
        self.bus = bus_mod.for_device(device.name)  # doctor's measurement of this GPU, else the assumption
        self.learned = speed.Learned(device.name, model, self.record_compute)  # what jobs measured here
        # estimates by (size, settings): the budget presets' bisections, sized again under each rung of the ladder,
        # ask for the same settings many times; an estimate is a pure function of them within one plan
        self._estimates: dict[tuple, Estimate] = _shared(profile, cfg, self.tile)

    def size(self, p: Preset) -> tuple[int, int, int]:
        w, h = (self.width, self.height) if self.own_size else capped_size(self.width, self.height, p.max_pixels,
                                                                           self.multiple)
        return (*rendered_size(self.profile, w, h), min(self.batch, p.max_batch))

    def estimate(self, p: Preset) -> Estimate:
        w, h, b = self.size(p)
        return self._estimate(w, h, b, p.memory)

    def _estimate(self, w: int, h: int, b: int, memory) -> Estimate:
        key = (w, h, b, memory)
        found = self._estimates.get(key)
        if found is None:
            found = self._estimates[key] = estimate(self.profile, w, h, b, memory, cfg=self.cfg, vae_tile=self.tile)
        return found

    def sized(self, p: Preset, limit: int | None = None) -> Preset | None:
        """A budget preset with its residency filled: the most resident bytes whose estimate fits `limit`
        (default: the usable memory); None when not even all-streamed fits, or when nothing would stay
        (that is the group preset's job). Other presets as they are."""
        if p.memory.offload != "budget" or p.memory.resident_bytes or not self.device.is_accelerator:
            return p
        blocks = self.profile.residency_blocks
        if not blocks:
            return None
        usable = self.device.usable_bytes if limit is None else limit
        lo, hi = 0, sum(c for _, c in blocks) * 4  # bytes: at most every block at 4 bytes an element
        if self.estimate_resident(p, 1).total_bytes > usable:
            return None
        if self.estimate_resident(p, hi).total_bytes <= usable:
            lo = hi  # every block fits
        tolerance = min(1 << 20, max(1, hi >> 10))  # a MiB, or finer for a small model
        while hi - lo > tolerance:  # bisect: the estimate grows with the resident bytes
            mid = (lo + hi) // 2
            lo, hi = (mid, hi) if self.estimate_resident(p, mid).total_bytes <= usable else (lo, mid)
        kept = self.estimate_resident(p, max(lo, 1)).resident_bytes
        return _resident(p, kept) if kept > 0 else None

    def estimate_resident(self, p: Preset, nbytes: int) -> Estimate:
        """The estimate of `_resident(p, nbytes)` without naming it (the bisection above asks a few dozen)."""
        w, h, b = self.size(p)
        memory = replace(p.memory, resident_bytes=int(nbytes))
        return self._estimate(w, h, b, memory)

    def host_settings(self, p: Preset):
        """`p`'s memory settings as they run on this device (a CPU computes float16 presets in float32, as
        engines/sd/apply.effective_settings runs them)."""
        on_cpu = p.device == "cpu" or not self.device.is_accelerator
        return replace(p.memory, dtype="float32") if on_cpu and p.memory.dtype == "float16" else p.memory

    def host(self, p: Preset, resident_bytes: int = 0) -> host_mod.HostEstimate:
        """The candidate's system RAM peak, with the settings as they run on this device."""
        w, h, b = self.size(p)
        settings = self.host_settings(p)
        kind = "cpu" if p.device == "cpu" or not self.device.is_accelerator else self.device.kind
        return host_mod.host_estimate(self.profile, settings, kind, w, h, b, self.cfg, resident_bytes,
                                      pinned=kind == "cuda" and settings.pin_memory, single_file=self.single_file)

    def fits_host(self, peak: int) -> bool:
        return self.device.host is None or peak <= self.device.host.usable_bytes

    def row(self, p: Preset) -> PresetEstimate:
        row = self._row(p)
        hest = self.host(p, row.breakdown.get("resident_bytes", 0) if p.memory.offload == "budget" else 0)
        row.host_peak_bytes, row.host = hest.peak_bytes, hest.as_dict()
        if self.refiner is not None:
            self._with_refiner(p, row)
        row.fits_host = self.fits_host(row.host_peak_bytes)
        if p.memory.paged_weights:  # a step reads the denoiser from disk when its pages do not all fit beside the rest
            settings = self.host_settings(p)
            den = host_mod.paged(self.profile, settings, host_mod.kept_bytes(self.profile, settings)).get(
                self.profile.denoiser, 0)
            if p.device == "gpu" and self.device.is_accelerator:  # what stays on the GPU is read once
                den = min(den, row.streamed_bytes_per_step)
            room = self.device.host.usable_bytes - row.host_peak_bytes if self.device.host else den
            if room < den:
                row.est_seconds_per_step += den / DISK_BYTES_PER_S
                row.timing["disk_read_seconds_per_step"] = round(den / DISK_BYTES_PER_S, 6)
        row.loss = LOSS.get(storage(p.memory), "none")
        return row

    def _with_refiner(self, p: Preset, row: PresetEstimate) -> None:
        """The refiner's RAM and VRAM (planning/refiner.RefinerLoad) added to `row`, where the base's are counted."""
        settings = self.host_settings(p)
        on_gpu = p.device == "gpu" and self.device.is_accelerator
        den = row.breakdown.get("denoiser_bytes", 0)
        back = {"none": den, "budget": row.breakdown.get("resident_bytes", 0)}.get(p.memory.offload, 0)
        ram = self.refiner.host_bytes(settings, on_gpu, back)
        row.host_peak_bytes += ram
        row.host = {**row.host, "refiner_bytes": ram}
        if on_gpu:
            extra = self.refiner.extra_vram_bytes(settings, den)
            row.estimate_bytes += extra
            row.breakdown = {**row.breakdown, "refiner_extra_bytes": extra}
            row.fits = row.estimate_bytes <= self.device.usable_bytes

    def record_compute(self, r: speed.StepTiming) -> float:
        """The assumed compute seconds of a measured step, under this plan's constants."""
        return timing.compute_seconds(r.flops, r.storage, r.on_gpu, r.dtype, self.bus.half_flops, self.bus.slowdown)

    def parts(self, p: Preset, est: Estimate | None = None) -> speed.StepTiming:
        """What the step estimate of `p` at this job's size is made of, as a record (measured_s 0)."""
        w, h, b = self.size(p)
        est = est or self.estimate(p)
        # CFG's two halves: a doubled batch, or (Wan's video) a second forward: the same compute either way
        images = b * (2 if self.cfg and (self.profile.cfg_batch or self.profile.cfg_two_forwards) else 1)
        on_gpu = p.device == "gpu"
        bus = self.bus.bytes_per_s if p.memory.pin_memory else self.bus.pageable_bytes_per_s
        transfer = timing.transfer_seconds(est.streamed_bytes_per_step, est.moved_bytes_per_job, self.steps, on_gpu,
                                           bus)
        return speed.StepTiming(self.device.name, self.learned.model, p.name, storage(p.memory),
                                p.memory.offload if on_gpu else "cpu", on_gpu, p.memory.dtype, w, h, b,
                                timing.step_flops(self.profile, w, h, images, self.flops_coefficients), transfer, 0.0)

    def _row(self, p: Preset) -> PresetEstimate:
        w, h, b = self.size(p)
        est = self.estimate(p)
        on_gpu = p.device == "gpu"
        parts = self.parts(p, est)
        assumed = self.record_compute(parts)
        learned = self.learned.correction(parts.storage, parts.offload, on_gpu, parts.work)
        reload_s = 0.0
        if p.memory.text_encoders == "reloaded":  # the encoders read from disk once per job
            reload_s = host_mod.encoder_file_bytes(self.profile) / DISK_BYTES_PER_S / max(1, self.steps)
        seconds = parts.transfer_s + reload_s + assumed * learned.factor
        timed = {**learned.as_dict(), "assumed_seconds_per_step": round(parts.transfer_s + reload_s + assumed, 6)}
        if reload_s:
            timed["text_encoder_reload_seconds_per_step"] = round(reload_s, 6)
        lossy = storage(p.memory) in LOSSY
        if not on_gpu:  # system RAM: nothing to fit into
            return PresetEstimate(p.name, est.total_bytes, True, w, h, b, "", est.as_dict(), 0, seconds, lossy,
                                  timing=timed)
        fits = self.device.is_accelerator and est.total_bytes <= self.device.usable_bytes
        reason = "ran out of memory before on this device for a job this size" if p.name in self.failed else ""
        capped = w * h < self.width * self.height
        room = self.device.usable_bytes - est.unet_bytes - est.overhead_bytes
        return PresetEstimate(p.name, est.total_bytes, fits, w, h, b, reason, est.as_dict(),
                              est.streamed_bytes_per_step, seconds, lossy, capped,
                              lower_bound_bytes_per_step=max(0, est.denoiser_bytes - room), timing=timed)


_SHARED: list[dict] = []  # the estimates of the shared_estimates scopes open, the innermost last


@contextlib.contextmanager
def shared_estimates():
    """Within it, the plans made share their estimates where profile (the same object), CFG and VAE tile agree: a
    search that plans one job on many devices (planning/nearest.py) asks each card the same budget bisections. Only
    what the estimate reads comes into the key (the size, the settings, the profile, CFG, the tile), and the scope
    keeps each profile it saw, so that its id is not reused while the scope lasts."""
    _SHARED.append({})
    try:
        yield
    finally:
        _SHARED.pop()


def _shared(profile, cfg: bool, tile) -> dict:
    """The estimates a _Rows keeps: its own, or the innermost shared_estimates scope's for this profile."""
    if not _SHARED:
        return {}
    return _SHARED[-1].setdefault((id(profile), cfg, tile), (profile, {}))[1]


def step_parts(device: DeviceInfo, profile, preset: Preset, width: int, height: int, batch: int, cfg: bool,
               steps: int, model: str) -> speed.StepTiming:
    """What the planner's step estimate of `preset` at this size is made of (FLOPs, transfers), for a pass that
    ran there to be recorded with its measured time (planning/speed.py)."""
    return _Rows(device, profile, width, height, batch, cfg, steps, set(), model).parts(preset)


def _resident(p: Preset, nbytes: int) -> Preset:
    """`p` with `nbytes` of the denoiser resident, named for it (budget@2.5GiB) so that the ladder,
    the summary and the remembered failures tell its rungs apart."""
    base = p.name.split("@")[0]
    return replace(p, name=f"{base}@{format_size(nbytes).replace(' ', '')}",
                   memory=replace(p.memory, resident_bytes=int(nbytes)))


def plan(device: DeviceInfo, profile, width: int, height: int, batch: int, presets: dict[str, Preset],
         forced: Preset | None = None, failed: set[str] = frozenset(), cfg: bool = True,
         steps: int = ASSUMED_STEPS, quantize_forced: bool = False, model: str = "",
         reloadable: bool = True, single_file: bool = False, full_precision: bool = False,
         own_size: bool = False, refiner=None) -> Plan:
    """`full_precision` (--no-half, --precision full): no candidate computes in 16 bits (the presets' own dtypes
    are float32 already: Session applies the flag to them), so no cpu+bf16 either. `model`: the name the user gave the model (its spec), under which this device's measured step times
    are kept (planning/speed.py). `reloadable`: the model is a diffusers folder, whose text encoders can be
    read again from their own subfolders (+te-reload candidates); a single-file checkpoint has no
    per-component files (reloading an encoder would read the whole checkpoint), so it gets none.
    `single_file`: such a checkpoint's text encoders load at full precision and are quantized after (its denoiser
    is quantized as it loads: planning/host._load_peak). `own_size`: width x height is what the pipeline renders
    whatever it is given (Qwen-Image-Edit's inpaint): no preset's max_pixels caps it. `refiner`: a
    planning/refiner.RefinerLoad, counted in every candidate's RAM and VRAM."""
    rows = _Rows(device, profile, width, height, batch, cfg, steps, set(failed), model, reloadable, single_file,
                 own_size, refiner)
    candidates, rows.budgets = _candidates(rows, presets, quantize_forced)
    if forced is not None and forced.device == "cpu":  # --cpu: on the CPU, its weights as the RAM allows
        result = _choose_cpu(rows, {forced.name: forced}, quantize_forced, named=True)
        result.reason = result.reason.replace("no GPU found", f"forced by the user: {forced.name}")
    elif forced is not None:
        forced = rows.sized(forced) or forced
        chosen = (forced, next((r for p, r in candidates if p == forced), None) or rows.row(forced))
        if not chosen[1].fits_host and len(_pin_variants(forced, device)) > 1:  # the same preset, no pinned copies
            unpinned = _pin_variants(forced, device)[1]
            row = next((r for p, r in candidates if p == unpinned), None) or rows.row(unpinned)
            forced, chosen = (unpinned, (unpinned, row)) if row.fits_host else (forced, chosen)
        reload = None if chosen[1].fits_host else _te_variant(forced, rows)  # the same, encoders per job
        if reload is not None:
            row = next((r for p, r in candidates if p == reload), None) or rows.row(reload)
            forced, chosen = (reload, (reload, row)) if row.fits_host else (forced, chosen)
        disk = None if chosen[1].fits_host else _disk_variant(forced, rows)  # the same, weights from their files
        if disk is not None:
            row = rows.row(disk)
            forced, chosen = (disk, (disk, row)) if row.fits_host else (forced, chosen)
        result = Plan(forced, _ladder(chosen, candidates, rows), [r for _, r in candidates],
                      f"forced by the user: {forced.name}")
        if not chosen[1].fits_host:
            result.refusal = _refusal(rows, [chosen], presets)
    elif not device.is_accelerator:
        result = _choose_cpu(rows, presets, quantize_forced, full_precision=full_precision)
    else:
        if not any(r.fits_host for _, r in candidates):  # the last rung: the weights read from their files
            candidates += _with_disk(rows, candidates)
            rows.budgets += [d for d in (_disk_variant(b, rows) for b in rows.budgets) if d is not None]
        result = _choose(device, candidates, rows, quantize_forced)
        if not result.refusal and not any(r.fits_host for _, r in candidates):
            result.refusal = _refusal(rows, candidates, presets)
    result.bus = rows.bus
    result.warnings += [rows.bus.warning] if rows.bus.warning else []
    if result.preset.memory.paged_weights and not result.refusal:
        row = next((r for r in result.estimates if r.name == result.preset.name), None)
        read = row.host.get("paged_bytes", 0) if row else 0
        result.warnings.append(f"{result.preset.name}: nothing else fits the RAM, so {read / 1e9:.1f} GB of weights "
                               "stay in their files and are read from disk as the layers run: slow where a step "
                               "rereads them (keep the model on a fast disk)")
    if storage(result.preset.memory) in LOSSY and not result.refusal:
        why = "" if forced or quantize_forced else " (nothing lossless fits this card at this size)"
        result.warnings.append(f"{result.preset.name} stores the weights in 4 bits: the image loses some quality{why}")
    return result


def _candidates(rows: _Rows, presets: dict[str, Preset],
                quantize_forced: bool) -> tuple[list[tuple[Preset, PresetEstimate]], list[Preset]]:
    """Every GPU preset x weight storage (x unpinned streaming, where the RAM is known on CUDA), sized; and
    the budget presets unsized, which the ladder sizes again below each rung."""
    candidates: list[tuple[Preset, PresetEstimate]] = []
    budgets = []
    for base in gpu_ladder(presets):
        for p in variants(base, quantize_forced):
            for v in _pin_variants(p, rows.device):
                if v.memory.offload == "budget" and not v.memory.resident_bytes:
                    budgets.append(v)
                sized = rows.sized(v)
                if sized is None:
                    continue
                row = rows.row(sized)
                candidates.append((sized, row))
                reload = None if row.fits_host else _te_variant(sized, rows)
                if reload is not None:
                    candidates.append((reload, rows.row(reload)))
                    if v.memory.offload == "budget" and not v.memory.resident_bytes:
                        budgets.append(_te_variant(v, rows))
    return candidates, budgets


def _te_variant(p: Preset, rows: _Rows) -> Preset | None:
    """`p` with its text encoders read from disk for each job and dropped before the denoiser runs
    (settings.text_encoders), where that can be done: a diffusers folder whose family encodes prompts apart from
    the call (`rows.reloadable`, Session.plan) with text encoders, `p` keeping them. None otherwise. Offered only beside a candidate whose host peak does not
    fit the RAM (the callers check): the reload costs a read from disk per job."""
    if not rows.reloadable or not rows.profile.text_encoders or p.memory.text_encoders != "kept":
        return None
    base, at, resident = p.name.partition("@")  # budget@2.5GiB -> budget+te-reload@2.5GiB, as the ladder names it
    return replace(p, name=f"{base}{TE_RELOAD}{at}{resident}", memory=replace(p.memory, text_encoders="reloaded"))


def _pin_variants(p: Preset, device: DeviceInfo) -> list[Preset]:
    """`p`, and `p` streaming without pinned host copies when it streams on CUDA and the RAM is known: the
    copies double the streamed weights in RAM, which the machine may not have."""
    streams = p.memory.offload in ("group", "sequential", "budget") and p.memory.pin_memory
    if not streams or device.kind != "cuda" or device.host is None:
        return [p]
    return [p, replace(p, name=f"{p.name}+unpinned", memory=replace(p.memory, pin_memory=False))]


def _disk_variant(p: Preset, rows: _Rows) -> Preset | None:
    """`p` with its weights left in their files' pages (settings.paged_weights), the last rung: where the
    denoiser stays memory-mapped under `p` (loaded at the dtype its file stores, or a GGUF's blocks) and, on a
    GPU, is streamed by group offloading on CUDA (model offload and a resident placement copy it into RAM).
    None otherwise, and for a single-file checkpoint (a GGUF denoiser's blocks excepted: measured mapped).
    Offered only when no other candidate fits the RAM (the callers check): a step may read the whole
    denoiser from disk."""
    gpu = p.device == "gpu" and rows.device.is_accelerator
    if p.memory.paged_weights or p.memory.text_encoders == "reloaded" or (gpu and (
            rows.device.kind != "cuda" or p.memory.offload not in ("group", "sequential", "budget"))):
        return None  # (encoders left in their files need no reloading)
    if (rows.single_file or not rows.reloadable) and not rows.profile.denoiser_quantized:
        # a single file's tensors are converted to diffusers' layout as it loads (not measured mapped); a job with
        # LoRAs or embeddings (not reloadable) changes the weights it loads
        return None
    paged = replace(p.memory, paged_weights=True, pin_memory=False)
    if not host_mod.can_page(rows.profile, rows.host_settings(replace(p, memory=paged))):
        return None
    base, at, resident = p.name.partition("@")
    base = base.replace("+unpinned", "")  # +disk never pins
    return replace(p, name=f"{base}{DISK}{at}{resident}", memory=paged)


def _with_disk(rows: _Rows, options: list[tuple[Preset, PresetEstimate]]) -> list[tuple[Preset, PresetEstimate]]:
    """The +disk variants of `options` (each once), estimated."""
    out, seen = [], set()
    for p, _ in options:
        d = _disk_variant(p, rows)
        if d is not None and d.name not in seen:
            seen.add(d.name)
            out.append((d, rows.row(d)))
    return out


def cpu_variants(cpu: Preset, rows: _Rows, quantize_forced: bool = False, named: bool = False,
                 full_precision: bool = False) -> list[Preset]:
    """The cpu preset's candidates: as written (float32), its weights in 16 bits, int8, int4; and computing in
    bfloat16 where this CPU does that in hardware (DeviceInfo.bf16: AVX512-BF16 or AMX), unless the user asked
    for float32 (`full_precision`: --no-half, --precision full). A preset the user named (`named`: --cpu,
    --preset cpu) computes in the dtype its file says: +bf16 is the automatic pick's alone; its weights are stored
    as the RAM allows, as before (+half, int8, int4, +te-reload, +disk)."""
    out = variants(cpu, quantize_forced, host_mod.half_files(rows.profile))
    if named or full_precision:
        return out
    if rows.device.kind == "cpu" and rows.device.bf16 and cpu.memory.dtype == "float32" and storage(cpu.memory) == "none":
        memory = replace(cpu.memory, dtype="bfloat16")
        plain = replace(memory, vae_float32=False, upcast_attention=False)  # the launch's precision flags, named
        out.insert(1, replace(cpu, name=f"{cpu.name}+bf16{precision_suffix(plain, memory)}", memory=memory))
    return out


def _choose_cpu(rows: _Rows, presets: dict[str, Preset], quantize_forced: bool, named: bool = False,
                full_precision: bool = False) -> Plan:
    """No accelerator: the cpu preset, with int8/int4 weights when its float32 weights do not fit the RAM
    (the fastest that fits; 4 bits only when nothing lossless does). `named`, `full_precision`: see cpu_variants."""
    cpu = next((p for p in presets.values() if p.device == "cpu"), None)
    if cpu is None:
        raise ValueError("no preset with device = 'cpu' in the presets folder")
    options = []
    for v in cpu_variants(cpu, rows, quantize_forced, named, full_precision):
        options.append((v, rows.row(v)))
        reload = None if options[-1][1].fits_host else _te_variant(v, rows)
        if reload is not None:
            options.append((reload, rows.row(reload)))
    if not any(r.fits_host for _, r in options):  # the last rung: the weights read from their files
        options += _with_disk(rows, options)
    fitting = [(p, r) for p, r in options if r.fits_host]
    estimates = [r for _, r in options]
    if not fitting:
        plan_ = Plan(cpu, [cpu], estimates, "no GPU found: the cpu preset")
        plan_.refusal = _refusal(rows, options, presets)
        return plan_
    chosen, _ = _prefer_lossless(fitting)  # the reason below says why its weights are not float32
    reason = "no GPU found: the cpu preset"
    if chosen[0] is not cpu:
        have = format_size(rows.device.host.usable_bytes) if rows.device.host else "?"
        kept = {"half": "16-bit weights computed in float32", "none": "float32 weights"}.get(
            storage(chosen[0].memory), f"{storage(chosen[0].memory)} weights")
        if chosen[0].memory.dtype == "bfloat16" and storage(chosen[0].memory) == "none":
            kept = "bfloat16 weights and compute (this CPU has bfloat16 instructions)"
        if chosen[0].memory.text_encoders == "reloaded":
            kept += ", the text encoders read from disk for each job and dropped before the denoiser runs"
        if chosen[0].memory.paged_weights:
            kept += ", the weights left in their files and read from disk as the layers run"
        if any(p is cpu and r.fits_host for p, r in options):  # float32 fits: the pick is the faster one
            reason += f" with {kept} (estimated faster than float32, which fits the {have} of RAM usable too)"
        else:
            reason += f" with {kept} (the whole pipeline in float32 needs more than the {have} of RAM usable)"
    for p, r in options:
        r.why = "fastest that fits the RAM" if r is chosen[1] else (
            "slower" if r.fits_host else f"host peak {format_size(r.host_peak_bytes)} does not fit the RAM")
    return Plan(chosen[0], [chosen[0]], estimates, reason)


GGUF_Q4_BYTES = 4.5 / 8  # bytes a weight of a Q4_K GGUF file (4.5 bits: 4-bit values, scales per block)


def _refusal(rows: _Rows, tried: list[tuple[Preset, PresetEstimate]], presets: dict[str, Preset]) -> str:
    """One sentence: what the job needs at the least, what the machine has, and what would fit."""
    host = rows.device.host
    have = format_size(host.usable_bytes) + (" (simulated)" if host.simulated else " usable")
    least_p, least = min(tried, key=lambda pr: pr[1].host_peak_bytes)
    label = families.by_arch(rows.profile.arch).label or "this model"  # a built-in architecture by its record
    size = f"{least.width}x{least.height}"
    held = f" with its refiner {rows.refiner.name}" if rows.refiner is not None else ""
    sentence = (f"{label} at {size}{held} needs about {format_size(least.host_peak_bytes)} of system RAM even at "
                f"{least_p.name}; this machine has {have}")
    # what would fit: any candidate the user's choices ruled out, then a smaller file of the same model
    others = _candidates(rows, presets, False)[0] if rows.device.is_accelerator else []
    cpu = next((p for p in presets.values() if p.device == "cpu"), None)
    if not rows.device.is_accelerator and cpu is not None:
        others = [(v, rows.row(v)) for v in cpu_variants(cpu, rows)]
        others += [(t, rows.row(t)) for t in (_te_variant(v, rows) for v, _ in list(others)) if t is not None]
    fits = [(p, r) for p, r in others if r.fits_host and (r.fits or not rows.device.is_accelerator)]
    if fits:
        p, r = min(fits, key=lambda pr: (pr[1].lossy, pr[1].est_seconds_per_step))
        if storage(p.memory) in ("int8", "int4"):
            return f"{sentence}; --quantize {storage(p.memory)} would fit (about {format_size(r.host_peak_bytes)})"
        return (f"{sentence}; {p.name} would fit (about {format_size(r.host_peak_bytes)}): the planner picks it "
                "without a forced preset")
    gguf = _gguf_q4_peak(rows, least_p)
    if gguf is not None and rows.refiner is not None:  # the refiner stays as it is beside a GGUF base
        gguf = (gguf[0], gguf[1] + least.host.get("refiner_bytes", 0))
    if gguf is not None and rows.fits_host(gguf[1]):
        return (f"{sentence}; a Q4_K GGUF of its {rows.profile.denoiser} ({gguf[0] / 1e9:.1f} GB) with --quantize "
                f"int4 would fit (about {format_size(gguf[1])})")
    alone = _without_refiner(rows, presets)
    if alone is not None:
        return (f"{sentence}; without the refiner {alone[0].name} would fit (about "
                f"{format_size(alone[1].host_peak_bytes)})")
    return f"{sentence}; nothing smaller fits: run it on a machine with more free RAM, or close other programs"


def _without_refiner(rows: _Rows, presets: dict[str, Preset]) -> tuple[Preset, PresetEstimate] | None:
    """The fastest candidate that fits the machine with the same job run without its refiner; None without a
    refiner, or where nothing fits even so."""
    if rows.refiner is None:
        return None
    alone = copy.copy(rows)
    alone.refiner = None
    if rows.device.is_accelerator:
        tried = _candidates(alone, presets, False)[0]
    else:
        cpu = next((p for p in presets.values() if p.device == "cpu"), None)
        tried = [(v, alone.row(v)) for v in cpu_variants(cpu, alone)] if cpu is not None else []
    fits = [(p, r) for p, r in tried if r.fits_host and (r.fits or not rows.device.is_accelerator)]
    return min(fits, key=lambda pr: (pr[1].lossy, pr[1].est_seconds_per_step)) if fits else None


def _gguf_q4_peak(rows: _Rows, p: Preset) -> tuple[int, int] | None:
    """(file bytes, host peak) of the same job with the denoiser as a Q4_K GGUF file and int4 text encoders."""
    prof = rows.profile
    if prof.denoiser_quantized:
        return None
    n = prof.params.get(prof.denoiser, 0)
    file_bytes = int(n * GGUF_Q4_BYTES)
    gguf = replace(prof, denoiser_quantized=n, denoiser_quantized_bytes=file_bytes, file_bytes={})
    settings = replace(p.memory, quantize="int4", fp8_storage=False)
    if p.device == "cpu" or not rows.device.is_accelerator:
        settings = replace(settings, dtype="float32" if settings.dtype == "float16" else settings.dtype)
    kind = "cpu" if p.device == "cpu" or not rows.device.is_accelerator else rows.device.kind
    w, h, b = rows.size(p)
    est = host_mod.host_estimate(gguf, settings, kind, w, h, b, rows.cfg, 0, pinned=False)
    return file_bytes, est.peak_bytes


def _prefer_lossless(pool: list[tuple[Preset, PresetEstimate]]) -> tuple[tuple[Preset, PresetEstimate], str]:
    """The fastest candidate of `pool` whose weights lose nothing; a slightly lossy one (int8, fp8) instead only
    when its estimated step is LOSSY_MARGIN shorter, or when nothing in `pool` is lossless. With it, one
    sentence saying which lossy storage was picked and why ('' when the choice loses nothing)."""
    key = lambda pr: (pr[1].est_seconds_per_step, pr[1].estimate_bytes)  # noqa: E731
    lossless = [pr for pr in pool if pr[1].loss == "none"]
    fastest = min(pool, key=key)
    if not lossless:
        chosen = min(pool, key=lambda pr: (pr[1].lossy, *key(pr)))
        return chosen, _stores(chosen) + ": nothing lossless fits" if chosen[1].loss != "none" else ""
    best = min(lossless, key=key)
    if fastest[1].loss == "none" or fastest[1].est_seconds_per_step > best[1].est_seconds_per_step * (1 - LOSSY_MARGIN):
        return best, ""
    shorter = 1 - fastest[1].est_seconds_per_step / best[1].est_seconds_per_step
    return fastest, (f"{_stores(fastest)}: picked because its step is estimated {shorter:.0%} shorter than the "
                     f"fastest lossless candidate's ({best[1].name}, {best[1].est_seconds_per_step:.2f} s); "
                     f"a lossy candidate must be {LOSSY_MARGIN:.0%} faster")


def _largest(pool: list[tuple[Preset, PresetEstimate]]) -> list[tuple[Preset, PresetEstimate]]:
    """The candidates of `pool` that make the most pixels (each capped at its preset's max_pixels)."""
    most = max((r.width * r.height for _, r in pool), default=0)
    return [(p, r) for p, r in pool if r.width * r.height == most]


def _stores(candidate: tuple[Preset, PresetEstimate]) -> str:
    bits = {"fp8": "8-bit floats", "int8": "8-bit integers", "int4": "4 bits"}.get(storage(candidate[0].memory), "")
    return f"{candidate[1].name} stores the weights in {bits} ({candidate[1].loss}ly lossy)"


def _choose(device: DeviceInfo, candidates: list[tuple[Preset, PresetEstimate]], rows: _Rows,
            quantize_forced: bool = False) -> Plan:
    usable = format_size(device.usable_bytes)
    fitting = [(p, r) for p, r in candidates if r.fits and r.fits_host and not r.skipped_reason]
    uncapped = [(p, r) for p, r in fitting if not r.capped]
    # what loses least first: 4-bit weights before a lower resolution upscaled afterwards; where every candidate
    # is capped, the largest size that fits (then upscaled to the requested one, as A1111 and ComfyUI users
    # expect), speed breaking ties: never a smaller image because it is faster
    pool = [(p, r) for p, r in uncapped if not r.lossy] or uncapped or _largest(fitting)
    estimates = [r for _, r in candidates]
    if pool:
        chosen, note = _prefer_lossless(pool)
        lossless = chosen[1].loss == "none" and not chosen[1].capped
        at = (f" at the largest size that fits ({chosen[1].width}x{chosen[1].height}, upscaled after)"
              if chosen[1].capped else "")
        chosen[1].why = (f"fastest estimated step ({chosen[1].est_seconds_per_step:.2f} s) of the candidates that fit "
                         f"the {usable} usable{at}" + (f"; {note}" if note else ""))
        for p, r in candidates:
            if r is not chosen[1]:
                r.why = r.why or ("slower" if (p, r) in pool and (r.loss == "none" or not lossless) else
                                  f"loses detail ({r.loss}ly lossy weights) for less than {LOSSY_MARGIN:.0%} of speed"
                                  if (p, r) in pool else
                                  f"a smaller size ({r.width}x{r.height})" if (p, r) in fitting and not uncapped else
                                  "loses more (4-bit weights or a capped size)" if (p, r) in fitting else
                                  r.skipped_reason or (f"host peak {format_size(r.host_peak_bytes)} does not fit the RAM"
                                                       if not r.fits_host else
                                                       f"estimate {format_size(r.estimate_bytes)} does not fit"))
        reason = f"fastest candidate whose estimate fits the {usable} usable"
        if not uncapped:
            reason += f" at the largest size that fits ({chosen[1].width}x{chosen[1].height}, upscaled after)"
        if not any(r.loss == "none" for _, r in uncapped):
            reason += " (nothing lossless fits at the full size)"
        result = Plan(chosen[0], _ladder(chosen, candidates, rows), estimates, reason)
        if note and chosen[1].loss == "slight" and not quantize_forced:  # the user's --quantize needs no reason
            result.loss_note = note
            result.warnings.append(note)
        return result
    if not candidates:
        raise ValueError("no GPU preset in the presets folder")
    in_ram = [(p, r) for p, r in candidates if r.fits_host] or candidates  # none: plan() refuses the job
    last = min(in_ram, key=lambda pr: (pr[1].estimate_bytes, pr[1].est_seconds_per_step))
    last[1].why = "the smallest estimate: nothing fits"
    return Plan(last[0], [last[0]], estimates,
                f"no candidate's estimate fits; starting at the cheapest ({format_size(last[1].estimate_bytes)}; "
                "the ladder lowers the resolution if needed)")


def _ladder(chosen: tuple[Preset, PresetEstimate], candidates: list[tuple[Preset, PresetEstimate]],
            rows: _Rows) -> list[Preset]:
    """The chosen candidate, then each time the fastest whose estimate is smaller: full size (else the largest
    capped size), lossless and the chosen candidate's weight storage first (a rung that stores the weights
    otherwise is re-applied with a quantization or a reload from disk, so it comes after those that only move
    them). Budget presets are sized again under each rung (RUNG_STEP of it), so after an out-of-memory the next
    rung can be the same split with fewer blocks resident."""
    kept = storage(chosen[0].memory)
    ladder = [chosen[0]]
    current = chosen[1].estimate_bytes
    while True:
        below = [(p, r) for p, r in candidates if r.estimate_bytes < current and p not in ladder]
        for p in rows.budgets:
            sized = rows.sized(p, int(current * RUNG_STEP))
            if sized is not None and sized not in ladder:
                below.append((sized, rows.row(sized)))
        below = [(p, r) for p, r in below if r.fits_host]  # a rung the RAM cannot hold would be killed
        if not below:
            return ladder
        p, r = min(below, key=lambda pr: (pr[1].capped, -pr[1].width * pr[1].height, pr[1].lossy,
                                          storage(pr[0].memory) != kept,
                                          pr[1].est_seconds_per_step, pr[1].estimate_bytes))
        ladder.append(p)
        current = r.estimate_bytes


def choose(device: DeviceInfo, presets: dict[str, Preset], estimates: list[PresetEstimate],
           forced: Preset | None = None, last_resort: str = "") -> Plan:
    """The plan from per-preset estimates in GPU ladder order (VQGAN-CLIP's, which has no streaming or
    weight storage to weigh): the first preset that fits."""
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
