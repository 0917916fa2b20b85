"""Estimate the peak system RAM (the host's memory) of a job, beside planning/estimate.py's VRAM peak.

When RAM runs out the kernel's OOM killer ends the process and nothing can step down, so the planner
never picks a candidate whose host peak does not fit (hostmem.py says what the machine has). The peak
is the larger of two phases, plus the process itself:

    load   components loaded one after the other: those already loaded, at the bytes they keep,
           plus the one loading, at its bytes plus the transient of loading it (its file's pages as
           they are read, when they are converted to another dtype or quantized on the way)
    run    every component at the bytes it keeps in RAM, plus (on a CPU) the activations of the
           largest phase, plus (on a GPU streaming from RAM with a CUDA stream) the pinned copies
           diffusers' group offloading makes of the denoiser's streamed groups

    check  after the load, every floating weight is checked for NaN/Inf (models/checkpoint.check_finite):
           the converted components at the bytes they keep, plus torch.isfinite's temporaries for
           the largest piece it checks (CHECK_FINITE_BYTES a weight of CHECK_FINITE_CHUNK weights), the
           checked component's mapped pages on top

    + BASELINE: Python, torch, diffusers and transformers themselves (+ CUDA_HOST on a GPU)

With paged_weights (+disk, the last rung) the weights that stay memory-mapped from their files (`paged`)
leave the peak: the kernel drops their clean pages under pressure and reads them again as the layers run.
What must fit is everything else plus PAGED_WORKING_SET; `paged_bytes` says how much the job reads
from its files, and an unlimited run's RSS shows them all.

With text_encoders = "reloaded" (settings.py) the load and run phases are those of the pipeline without
its text encoders, and a third phase comes in:

    encode the text encoders read from disk for a job, at the bytes they keep (+ sdnq's scratch while
           they are quantized as they load), beside what the rest of the pipeline keeps in RAM then
           (its run-phase weights and pinned copies, not the activations: the denoiser has not run)

The encoders' own activations are left out: a prompt's tokens are a few hundred, kilobytes to a few MB.

What a component keeps in RAM: on the CPU, everything; on a GPU with offload = "none", nothing after
it is placed (the load phase still held it all: pipelines load on the host, then move); under model,
group, sequential and budget offload, everything but a budget split's resident part. Its bytes: int8
or int4 weights (quantized while loading, models/loading.py) at QUANTIZED_BYTES, a GGUF denoiser at
its stored size, the rest at the load dtype.

The constants are measured on this project's benchmark (benchmarks/host_peaks.py: real-size SD 1.5
and SDXL folders under cgroup limits; docs/benchmarks.md has the table), except where a comment says
it is a judgement.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, replace

from lowvram_gen import families
from lowvram_gen.hardware.hostmem import RUN_MMAP_THRESHOLD
from lowvram_gen.models.profile import ModelProfile
from lowvram_gen.planning import estimate as memory
from lowvram_gen.planning import video
from lowvram_gen.settings import MemorySettings

MiB = 1024**2
GiB = 1024**3
# Resident set of the CLI process with torch, diffusers and transformers imported and nothing loaded:
# measured (benchmarks/host_peaks.py, "baseline"). Gradio adds to it in the web UI, but the UI's
# process is measured as it runs (hostmem.process_rss), so that part is never estimated.
BASELINE_BYTES = 660 * MiB
# The CUDA context, cuBLAS/cuDNN and the kernels they load, in host memory: a judgement (no GPU here),
# from torch processes that report 1-1.5 GB more RSS once CUDA is up.
CUDA_HOST_BYTES = 1 * GiB
# Bytes of file pages resident per byte of a component's file while it is converted (to another dtype,
# or quantized) as it loads: safetensors maps the file and the pages read stay resident until the
# component is built (measured: SD 1.5's UNet file, 1.7 GB, was all resident at the peak).
LOAD_TRANSIENT = 1.0
# Anonymous memory above the weights while a component is quantized as it loads, in float32 copies of
# its largest layer (sdnq rounds one layer at a time, in float32): measured 0.32 GiB for SD 1.5 and 0.40
# for SDXL (largest UNet layer 29.5M weights: 118 MB in float32), 0.55 GiB for a FLUX.1 transformer cut
# to 2+4 blocks (largest 56.6M: 226 MB), loading with returning_freed_memory (hostmem.py).
QUANTIZE_LOAD_TRANSIENT = 3.0
# File pages resident per byte of a component's file while it is quantized as it loads: fitted to the peak RSS
# of the three unlimited quantizing cells of benchmarks/host_peaks.py (SD 1.5 int8, SDXL int8 and int4: their
# pages at the peak were 70-86 % of the UNet's file; with 1.0 the estimate was 7-13 % high). Why sdnq's
# load keeps fewer of them resident than a plain conversion is not established.
QUANTIZE_LOAD_PAGES = 0.85
# On a CPU, the activations of a step and of the decode (the VRAM model's estimates for the same shapes,
# which match a CPU's: SD 1.5 at 512 px measured 0.29 GiB for the CFG step and 0.94 GiB for the decode,
# estimated 0.28 and 1.00) times what glibc's heap adds: fitted to the CLI's run phase of SD 1.5 at
# 512 px under the cpu preset (1.53 GiB over the weights, against 1.28 estimated).
CPU_ACTIVATION_FACTOR = 1.2
# glibc serves a block of at least this many bytes with a mapping of its own, unmapped when it is freed: the
# threshold hardware/hostmem.returning_freed_memory sets after the load (glibc's upper bound). A step whose hidden
# states are this large hands its activations back to the kernel as they are freed, so the decode takes their place
# instead of coming on top (`_cpu_activations`).
MMAP_THRESHOLD = RUN_MMAP_THRESHOLD
# cpu+half: each layer is upcast into float32 temporaries for its forward and its stored 16-bit tensors put
# back (engines/sd/casting.py): a float32 copy of the layer running, freed at once, so nothing is added. With
# diffusers' own hook, which casts back to fresh copies, SDXL's cpu+half run held 2.24 GiB over the weights
# against 1.39 GiB of activations; with ours the same run held 2.05 GiB of anonymous memory in all, its
# 6.4 GiB of weights staying in the files' pages (docs/benchmarks.md).
# models/checkpoint.check_finite runs torch.isfinite over every floating weight after the load (and after text
# encoders are reloaded): on the CPU it holds, for what it checks, a float32 upcast and boolean temporaries.
# Measured (VmHWM over a 100M-weight tensor, torch 2.14 CPU): 5.0 bytes a weight for bfloat16, 7.0 for float32.
# Checked a tensor at a time, the scaled Qwen-Image folder's 545M-weight embedding and lm_head each added 2.5 GiB
# of anonymous memory, the job's peak (host_peaks.py --trace); check_finite now checks CHECK_FINITE_CHUNK weights
# at a time (models/checkpoint.CHECK_FINITE_CHUNK, the same number), so the term is at most 112 MB.
CHECK_FINITE_BYTES = {1: 5, 2: 5, 4: 7}  # per weight, by the checked tensor's bytes a weight (fp8: upcast too)
CHECK_FINITE_CHUNK = 1 << 24
# paged_weights: the pages of the files that must stay resident for a layer to run (the layer being computed
# and the next one the kernel reads ahead), as a floor under everything else: a judgement, checked by running
# real-size SDXL under a limit below its weights (docs/benchmarks.md, "offload to disk")
PAGED_WORKING_SET = 512 * MiB


@dataclass(frozen=True)
class HostEstimate:
    peak_bytes: int
    phase: str  # 'load' | 'run' | 'encode'
    baseline_bytes: int
    weights_bytes: int  # every component as kept in RAM during the run
    load_bytes: int  # the load phase's peak, baseline included
    load_file_pages_bytes: int  # file pages resident while a component is converted: reclaimable, not in the peak
    run_bytes: int  # the run phase's peak, baseline included
    pinned_bytes: int = 0  # pinned copies of what group offloading streams with a CUDA stream
    activation_bytes: int = 0  # on the CPU: the largest phase's activations
    # text_encoders = "reloaded": the encode phase's peak, baseline included (0: the encoders are kept, and
    # counted in the load and run phases instead)
    encode_bytes: int = 0
    # paged_weights: the weights read from their files' pages as the layers run, not in the peak
    paged_bytes: int = 0
    # the weights held in RAM during the run as their files' pages (memory-mapped): in the peak unless paged
    mapped_bytes: int = 0

    @property
    def rss_peak_bytes(self) -> int:
        """What an unlimited run's peak RSS shows: the peak plus the file pages resident while loading (and, with
        paged weights, every page the run reads)."""
        return max(self.run_bytes + self.paged_bytes, self.encode_bytes, self.load_bytes + self.load_file_pages_bytes)

    def as_dict(self) -> dict:
        return {**asdict(self), "rss_peak_bytes": self.rss_peak_bytes}


def denoisers(profile: ModelProfile) -> tuple[str, ...]:
    """The components stored as the denoiser is (quantized, fp8, paged alike): the denoiser, and Wan 2.2 A14B's second
    expert `transformer_2` (the same shape; planning/video.py)."""
    return (profile.denoiser, "transformer_2") if profile.params.get("transformer_2") else (profile.denoiser,)


def kept_bytes(profile: ModelProfile, settings: MemorySettings) -> dict[str, int]:
    """Bytes each component holds once loaded, as `settings` store it (no placement taken into account)."""
    b = memory.DTYPE_BYTES[settings.dtype]
    q = memory.QUANTIZED_BYTES.get(settings.quantize)
    den = profile.denoiser
    dens = denoisers(profile)
    out = {}
    for name, n in profile.params.items():
        if name == den and profile.denoiser_quantized:  # GGUF: as the file stores it
            out[name] = (n - profile.denoiser_quantized) * b + profile.denoiser_quantized_bytes
        elif q and name in dens:
            out[name] = (n - profile.quantized_kept) * q + profile.quantized_kept * b
        elif name.startswith("text_encoder") and (q or not settings.half_storage):
            # sdnq leaves the token embedding (the largest layer of a CLIP or T5 encoder) alone, and the layers
            # the model keeps in float32: T5's `wo` projections, 1.0 B of T5-XXL's 4.76 B parameters, stay at the
            # load dtype (measured on FLUX.1's T5-XXL at int8 in a float32 load: 11.5 GiB anonymous peak where
            # counting the embedding alone planned 8.1; docs/benchmarks.md "FLUX.1"), float32 in a float16 load
            out[name] = memory.text_encoder_bytes(profile, name, settings.dtype, settings.quantize)
        elif settings.half_storage:  # 16-bit as the file stores them; a text encoder's embeddings at the dtype
            emb = profile.largest_layer.get(name, 0) if name.startswith("text_encoder") else 0
            out[name] = min(n * b, profile_file_bytes(profile, name) - emb * 2 + emb * b)
        elif name in dens and settings.fp8_storage:
            out[name] = (n - profile.fp8_kept) * memory.FP8_BYTES + profile.fp8_kept * b
        else:
            out[name] = n * b
    return {k: int(v) for k, v in out.items()}


def mapped(profile: ModelProfile, settings: MemorySettings, name: str) -> bool:
    """Whether `name` keeps its weights memory-mapped from its file after loading: it loads at the dtype
    its file stores (diffusers then uses the safetensors mapping as the weights; measured: an fp16 SD
    1.5 folder loaded at float16 adds 0.15 GB of anonymous memory for 2.0 GB of weights) and nothing
    rewrites them (int8/int4, fp8, a GGUF denoiser). Its pages are read, and become resident, when a
    forward or a move to the GPU touches them."""
    n = profile.params.get(name, 0)
    if not n or (name in denoisers(profile) and (profile.denoiser_quantized or settings.fp8_storage)):
        return False
    if settings.quantize != "none" and (name in denoisers(profile) or name.startswith("text_encoder")):
        return False
    width = 2 if settings.half_storage else memory.DTYPE_BYTES[settings.dtype]
    if round(profile_file_bytes(profile, name) / n) != width and not tied_twice(profile, name, width):
        return False
    # 16-bit files: float16 and bfloat16 are the same width, and loading one as the other converts it
    return width != 2 or settings.half_storage or settings.dtype == file_half_dtype(profile)


def tied_twice(profile: ModelProfile, name: str, width: int) -> int:
    """The bytes of a text encoder's token embedding stored a second time in its `width`-byte file, else 0: T5's
    `shared` and `encoder.embed_tokens` are one tensor that transformers saves under both names (the scaled Chroma
    folder's T5: 2.5 bytes a weight). It loads mapped all the same, and the whole file's pages show in the RSS
    (measured: host_peaks.py's Chroma cell held every page of it)."""
    n, emb = profile.params.get(name, 0), profile.largest_layer.get(name, 0)
    if not name.startswith("text_encoder") or not n or not emb:
        return 0
    extra = profile_file_bytes(profile, name) - n * width
    return emb * width if abs(extra - emb * width) <= 0.01 * n * width else 0


def file_half_dtype(profile: ModelProfile) -> str:
    """The 16-bit dtype of the model's files: as read from the folder, else the published checkpoints' (the family
    record's: bfloat16 for FLUX.1, float16 for the others)."""
    return profile.file_dtype or families.by_arch(profile.arch).file_dtype


def paged(profile: ModelProfile, settings: MemorySettings, kept: dict[str, int]) -> dict[str, int]:
    """The bytes of each component that stay in its file's pages after loading: a mapped component's weights
    (a text encoder's embeddings less, under half storage: they are cast to the compute dtype) and a GGUF
    denoiser's quantized blocks (models/gguf_file.py maps them; measured: benchmarks/gguf_rss.py)."""
    out = {}
    for name in profile.params:
        if mapped(profile, settings, name):
            emb = profile.largest_layer.get(name, 0) if name.startswith("text_encoder") and settings.half_storage else 0
            out[name] = max(0, kept[name] - emb * memory.DTYPE_BYTES[settings.dtype])
        elif name == profile.denoiser and profile.denoiser_quantized:
            out[name] = int(profile.denoiser_quantized_bytes)
    return out


def can_page(profile: ModelProfile, settings: MemorySettings) -> bool:
    """Whether the denoiser's weights stay in its file's pages under `settings` (what paged_weights relies on)."""
    return profile.denoiser in paged(profile, settings, kept_bytes(profile, settings))


def half_files(profile: ModelProfile) -> bool:
    """Whether the model's weight files are 16-bit (what half storage keeps): the published checkpoints
    and folders whose denoiser file holds about 2 bytes a parameter."""
    n = profile.params.get(profile.denoiser, 0)
    return bool(n) and not profile.denoiser_quantized and round(profile_file_bytes(profile, profile.denoiser) / n) == 2


def _mapped_twice(profile: ModelProfile, settings: MemorySettings) -> int:
    width = 2 if settings.half_storage else memory.DTYPE_BYTES[settings.dtype]
    return sum(tied_twice(profile, n, width) for n in profile.params if mapped(profile, settings, n))


def _load_peak(profile: ModelProfile, settings: MemorySettings, kept: dict[str, int],
               single_file: bool = False) -> tuple[int, int]:
    """Components load one after the other; at the worst moment every converted component is loaded
    (mapped ones are not read yet) and the one whose conversion costs most is being loaded: its file's
    pages are resident beside what it becomes (measured: SD 1.5's fp16 UNet loaded at float32 peaks at
    its 3.4 GB plus its 1.7 GB file). fp8 storage casts after the load: the denoiser is whole at the
    dtype first. int8/int4 quantize layer by layer as the component loads (models/loading.py).

    A single-file checkpoint with int8/int4 (models/checkpoint.load_single_file): its UNet is quantized as it
    loads, as from a folder, but its text encoders load whole at the dtype (diffusers builds them from the
    file's keys, with no `from_pretrained` for a quantizer to hook into) and are quantized after the load, as
    is an SD3 / Flux transformer (its family's SingleFile.quantize_on_load is None); every component is read (none stays mapped), and the
    scratch is the largest of theirs. A GGUF denoiser is kept as stored (no scratch).

    Returns (the bytes that must fit, the file pages on top): the kernel drops clean file pages under
    pressure instead of killing, so they show in an unlimited run's peak RSS but need not fit."""
    b = memory.DTYPE_BYTES[settings.dtype]
    if single_file and settings.quantize != "none":
        whole = replace(settings, quantize="none")
        held = kept_bytes(profile, whole)
        if profile.denoiser == "unet":  # quantized as it loads; a GGUF one is as stored either way
            held[profile.denoiser] = kept[profile.denoiser]
        scratch = max((QUANTIZE_LOAD_TRANSIENT * _largest_quantized_layer(profile, n) * 4 for n in profile.params
                       if n.startswith("text_encoder") or (n == profile.denoiser and not profile.denoiser_quantized)),
                      default=0)
        pages = max((int(LOAD_TRANSIENT * profile_file_bytes(profile, n)) for n in profile.params
                     if not mapped(profile, whole, n)), default=0)
        return int(sum(held.values()) + scratch), pages
    converted = [name for name in profile.params if not mapped(profile, settings, name)]
    whole, pages = 0, 0
    for name in converted:
        extra = profile.params[name] * b - kept[name] if name == profile.denoiser and settings.fp8_storage else 0
        if settings.quantize != "none" and (name in denoisers(profile) or name.startswith("text_encoder")):
            extra = QUANTIZE_LOAD_TRANSIENT * _largest_quantized_layer(profile, name) * 4
        whole = max(whole, extra)  # whole at the dtype before the cast to fp8, or quantizing scratch
        quantized = settings.quantize != "none" and (name in denoisers(profile) or name.startswith("text_encoder"))
        pages = max(pages, (QUANTIZE_LOAD_PAGES if quantized else LOAD_TRANSIENT) * profile_file_bytes(profile, name))
    return int(sum(kept[n] for n in converted) + whole), int(pages)


def _check_finite_transient(profile: ModelProfile, settings: MemorySettings) -> tuple[int, str | None]:
    """torch.isfinite's temporaries at the largest floating tensor the check after the load meets
    (CHECK_FINITE_BYTES), and its component. A quantized denoiser's largest layers are int8/int4 or GGUF blocks,
    which the check skips; a text encoder's embedding stays at the load dtype under int8/int4 (sdnq leaves it)."""
    width = 2 if settings.half_storage else memory.DTYPE_BYTES[settings.dtype]
    worst, at = 0, None
    for name, n in profile.params.items():
        if not n or (name in denoisers(profile) and (profile.denoiser_quantized or settings.quantize != "none")):
            continue
        t = min(profile.largest_layer.get(name, 0), CHECK_FINITE_CHUNK) * CHECK_FINITE_BYTES.get(width, 7)
        if t > worst:
            worst, at = t, name
    return int(worst), at


def _check_finite_peak(profile: ModelProfile, settings: MemorySettings, kept: dict[str, int]) -> tuple[int, int]:
    """The check after the load: (what must fit, the mapped pages on top) at the worst tensor: the converted
    components at their kept bytes plus its temporaries, and its component's file pages if that one is mapped
    (the check reads them; the pages of components checked before it are clean and may have been dropped)."""
    worst, at = _check_finite_transient(profile, settings)
    held = sum(kept[n] for n in profile.params if not mapped(profile, settings, n))
    pages = profile_file_bytes(profile, at) if at and mapped(profile, settings, at) else 0
    return int(held + worst), int(pages)


def _largest_quantized_layer(profile: ModelProfile, name: str) -> int:
    """Weights of `name`'s largest layer sdnq quantizes: a text encoder's largest is its token embedding, which
    sdnq leaves alone, so its feed-forward projection is taken (4 x hidden squared: CLIP's is 4x, T5's 2.5x)."""
    if name.startswith("text_encoder"):
        encoders = sorted(n for n in profile.params if n.startswith("text_encoder"))
        i = encoders.index(name)
        hidden = profile.text_hidden[i] if i < len(profile.text_hidden) else 0
        return min(4 * hidden * hidden, profile.largest_layer.get(name, 0)) if hidden else 0
    return profile.largest_layer.get(name, 0)


def profile_file_bytes(profile: ModelProfile, name: str) -> int:
    """The bytes of `name`'s weight file: as measured in the folder, else 2 bytes a parameter (the
    published checkpoints store fp16 or bf16)."""
    stored = getattr(profile, "file_bytes", {}) or {}
    if stored.get(name):
        return int(stored[name])
    if name == profile.denoiser and profile.denoiser_quantized:
        return int((profile.params[name] - profile.denoiser_quantized) * 2 + profile.denoiser_quantized_bytes)
    return int(profile.params.get(name, 0) * 2)


def host_estimate(profile: ModelProfile, settings: MemorySettings, device_kind: str, width: int,
                  height: int, batch: int, cfg: bool = True, resident_bytes: int = 0,
                  pinned: bool = False, single_file: bool = False) -> HostEstimate:
    """The host peak of one job (see the module doc). `settings`: the effective ones on this device (the
    cpu preset's float32, not the preset's float16). `resident_bytes`: what a budget split keeps on the
    GPU (not in RAM during the run). `pinned`: group offloading pins copies of what it streams (CUDA,
    unless the settings ask it not to). `single_file`: the model is one checkpoint file, whose text encoders
    are quantized after they load whole (`_load_peak`)."""
    if settings.text_encoders == "reloaded" and profile.text_encoders:
        return _with_encoders_reloaded(profile, settings, device_kind, width, height, batch, cfg,
                                       resident_bytes, pinned)
    kept = kept_bytes(profile, settings)
    total_kept = sum(kept.values())
    on_cpu = device_kind == "cpu"
    base = BASELINE_BYTES + (CUDA_HOST_BYTES if device_kind == "cuda" else 0)
    act = 0
    if on_cpu:
        b = memory.DTYPE_BYTES[settings.dtype]
        cfg = cfg and profile.cfg_batch
        images = batch * (2 if cfg else 1)
        act = _cpu_activations(profile, settings, width, height, batch, images, b)
        # a mapped text encoder's file read whole at the load, its embedding's second copy too (tied_twice)
        in_ram = total_kept + _mapped_twice(profile, settings)
    elif settings.offload == "none":
        # placed on the device after loading; moving a mapped component reads its whole file once. Wan 2.2 A14B:
        # the expert not running waits in RAM (one on the GPU at a time: planning/video.py)
        idle = sum(kept[n] for n in denoisers(profile)[1:])
        in_ram = idle + max((profile_file_bytes(profile, n) for n in profile.params
                             if n not in denoisers(profile)[1:] and mapped(profile, settings, n)), default=0)
    elif settings.offload == "budget":
        in_ram = max(0, total_kept - int(resident_bytes))
    else:
        in_ram = total_kept
    pinned_bytes = 0
    if pinned and not on_cpu and settings.offload in ("group", "sequential", "budget"):
        # a pinned copy of the denoiser's streamed groups, made when the hooks go on (the text encoders and the
        # VAE, which run once per job, stream unpinned: engines/sd/apply.PipelineOps.group_offload)
        # (Wan 2.2 A14B: each expert's streamed groups, both hooked; one resident part on the GPU at a time)
        pinned_bytes = min(in_ram, sum(max(0, kept.get(n, 0) - int(resident_bytes)) for n in denoisers(profile)))
    load, pages = _load_peak(profile, settings, kept, single_file)
    check, check_pages = _check_finite_peak(profile, settings, kept)
    rss_load = max(load + pages, check + check_pages)
    load = max(load, check)
    pages = rss_load - load
    in_file = paged(profile, settings, kept)
    mapped_bytes = min(in_ram, sum(in_file.values()))
    paged_bytes = 0
    if settings.paged_weights:
        paged_bytes = mapped_bytes
        in_ram += PAGED_WORKING_SET - paged_bytes
        if profile.denoiser_quantized:  # a GGUF denoiser's blocks are counted in the load too: mapped, not read
            load -= in_file.get(profile.denoiser, 0)
    run = base + in_ram + pinned_bytes + act
    load += base
    phase, peak = ("load", load) if load >= run else ("run", run)
    return HostEstimate(peak_bytes=int(peak), phase=phase, baseline_bytes=int(base), weights_bytes=int(in_ram),
                        load_bytes=int(load), load_file_pages_bytes=pages, run_bytes=int(run),
                        pinned_bytes=int(pinned_bytes), activation_bytes=int(act), paged_bytes=int(paged_bytes),
                        mapped_bytes=int(mapped_bytes))



def _cpu_activations(profile: ModelProfile, settings: MemorySettings, width: int, height: int, batch: int,
                     images: int, b: int) -> int:
    """The run phase's activations on a CPU. glibc keeps the step's freed blocks under its mmap threshold in the
    heap, so the decode's come on top of them: the two add up, they do not take turns as on a GPU's caching
    allocator (SD 1.5's 10 MiB hidden states). A step whose hidden states (images x tokens x width) are over the
    threshold frees them to the kernel instead, and the decode, whose tensors are larger still, takes their place:
    then the larger of the two (HiDream at its 1024 x 1024 in float32, 40 MiB hidden states at half width: the trace
    of host_peaks.py's int8 cell held the weights, 0.4-0.6 GiB more after the step, then the decode's 3.6 GiB; the
    sum had planned 1.2 x (0.9 + 4.0) GiB over the weights, +35 %)."""
    unet = memory.unet_activation_bytes(profile, width, height, images, b, settings.attention)
    vae = memory.vae_activation_bytes(profile, width, height, batch, b, settings.vae_slicing, settings.vae_tiling)
    both = max(unet, vae) if _hidden_state_bytes(profile, width, height, images, b) >= MMAP_THRESHOLD else unet + vae
    return int(CPU_ACTIVATION_FACTOR * both)


def _hidden_state_bytes(profile: ModelProfile, width: int, height: int, images: int, b: int) -> int:
    """Bytes of one hidden state of the denoiser's step: the image tokens at the transformer's width, or the latent
    at the UNet's first width (the size its blocks hand on)."""
    width, height = memory.rendered_size(profile, width, height)
    sf = profile.vae_scale_factor
    hw = math.ceil(height / sf) * math.ceil(width / sf)
    if profile.unet_channels:
        return int(images * hw * profile.unet_channels[0] * b)
    tokens = hw / max(1, profile.transformer_patch) ** 2 * video.frames_factor(profile)  # a clip: all its frames
    return int(images * tokens * (profile.transformer_hidden or 0) * b)


def _with_encoders_reloaded(profile: ModelProfile, settings: MemorySettings, device_kind: str, width: int,
                            height: int, batch: int, cfg: bool, resident_bytes: int, pinned: bool) -> HostEstimate:
    """text_encoders = "reloaded": the load and run phases of the pipeline without its text encoders (it is
    loaded without them, and they have left before the denoiser runs), and the encode phase: the encoders
    at their kept bytes, plus sdnq's scratch for the one quantized as it loads, beside the rest's weights
    (and pinned copies) as they sit in RAM between denoiser runs."""
    encoders = profile.text_encoders
    rest = replace(profile, params={k: v for k, v in profile.params.items() if k not in encoders})
    kept = replace(settings, text_encoders="kept")
    without = host_estimate(rest, kept, device_kind, width, height, batch, cfg, resident_bytes, pinned)
    enc_kept = kept_bytes(profile, kept)
    scratch = 0
    if settings.quantize != "none":  # one at a time: load_component quantizes each as it loads
        scratch = max(int(QUANTIZE_LOAD_TRANSIENT * _largest_quantized_layer(profile, n) * 4) for n in encoders)
    # the whole pipeline is checked for NaN/Inf once the encoders are back (models/loading.reload_components)
    scratch = max(scratch, _check_finite_transient(profile, kept)[0])
    encode = (without.baseline_bytes + without.weights_bytes + without.pinned_bytes
              + sum(enc_kept[n] for n in encoders) + scratch)
    peak, phase = max((without.peak_bytes, without.phase), (encode, "encode"))
    pages = max(without.load_file_pages_bytes,
                max((int(LOAD_TRANSIENT * profile_file_bytes(profile, n)) for n in encoders
                     if not mapped(profile, kept, n)), default=0))
    return replace(without, peak_bytes=int(peak), phase=phase, encode_bytes=int(encode),
                             load_file_pages_bytes=pages)


def encoder_file_bytes(profile: ModelProfile) -> int:
    """The bytes of the text encoders' weight files: what text_encoders = "reloaded" reads per job."""
    return sum(profile_file_bytes(profile, n) for n in profile.text_encoders)
