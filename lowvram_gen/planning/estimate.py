"""Estimate the peak device memory of a text-to-image job before running it.

estimate(profile, width, height, batch, settings) -> Estimate, where the profile (models/profile.py: ModelProfile,
profile_builtin, profile_from_folder) holds everything the estimate needs and comes from configs only (no
weights are read).

The model (docs/benchmarks.md, "Memory estimator", has the numbers behind it):

    peak = max over phases (text encode, one UNet step, VAE decode) of
           weights resident in that phase + activations of that phase,   plus a fixed overhead.

Activations are a shape-derived feature times a fitted coefficient. The UNet feature walks the UNet
config: at each resolution level it adds the skip connections still held for the up path to the
working set of the largest block at that level (a GEGLU transformer block holds ~19 C per token; a
resnet ~3.5 x its input channels). The VAE feature is the largest decoder stage (3 C_in + C_out at
its resolution). Both are elements per latent pixel per image; times pixels, images and bytes per
element, times the coefficient that benchmarks/calibrate_memory.py fits to real forward passes of SD 1.5,
SD 2.1 and SDXL. A transformer denoiser (SD3, Flux, PixArt ...) is a stack of same-width blocks over
one token stream: its feature is (image tokens + the text tokens joint attention carries beside them)
x hidden width per image, and the coefficient (fitted to SD3-medium and FLUX.1-dev blocks, and per family to one
step of each issue-30 family's own pipeline at 512-1024 px) is how many stream-sized tensors its largest block holds
at once. Attention adds no tokens^2 term: SDPA runs
flash / memory-efficient kernels on CUDA and a flash kernel on the CPU, and the measurements grow
linearly in tokens. Built-in architectures (and folders whose denoiser matches one) use their own
fitted coefficient; other models use the coefficient fitted over all of them. SANA's blocks add a term that does
not grow with the tokens: a copy of their largest 1x1 convolution's weight (profile.pointwise_conv, times the
fitted fit.pointwise_conv), and its pipeline renders every job at a resolution bin (rendered_size): the step and
the decode are the bin's, the image is resized to the size asked after.

No torch import: this module is the formula alone.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from types import SimpleNamespace

from lowvram_gen import families
from lowvram_gen.models.profile import TEXT_TOKENS, ModelProfile, calibration
from lowvram_gen.planning import residency
from lowvram_gen.planning import video
from lowvram_gen.settings import MemorySettings

DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2}
FP8_BYTES = 1
# Bytes a weight of a quantized layer takes with its scales (sdnq, weight-only; models/quantize.py),
# measured on real-size fp16 layers: int8 1.004 (one byte plus per-channel scales); int4 0.563 for a
# Linear and 0.625 for a 3x3 convolution (half a byte plus a scale per group). UNets are mostly
# convolutions (68.5 % of SD 1.5's weights), so int4 is counted at 0.61.
# The layers it leaves alone (norms, biases, embeddings: about the layers fp8 storage leaves) stay in
# the compute dtype; one layer is dequantized while it runs.
QUANTIZED_BYTES = {"int8": 1.01, "int4": 0.61}
MiB = 1024**2

# What torch.cuda.max_memory_allocated() does not count but the card must still hold once the job
# runs: kernels loaded lazily on first use (CUDA >= 12.2 loads modules lazily by default, so they land
# after the probe), cuBLAS/cuDNN handles and workspaces (PyTorch's default cuBLAS workspace config
# ":4096:8" alone is 32 MiB per stream), and the caching allocator's rounding of blocks. The CUDA
# context itself is created before the probe and is already missing from its free memory; the OS
# and other programs are device.py's reserve. 384 MiB is a judgement, not a measurement (no GPU
# here), below ComfyUI's minimum_inference_memory() (0.8 GiB + 400 MiB reserve) because that also
# covers activations, which we count separately. See docs/benchmarks.md.
OVERHEAD_BYTES = 384 * MiB

# Used when calibration.json has no fit (first run of the calibration script); overwritten by the fit.
_DEFAULT_FIT = {
    "unet": {"global": 1.0, "per_call": 0.0},
    "vae": {"global": 1.0, "per_call": 0.0},
    "transformer": {"global": 12.0, "per_call": 0.0},
    "slicing": 1.0,
}

# Block names of ControlNets in a budget split (planning/controlnet.py PREFIX: controlnet0:<block>)
controlnet_prefix = "controlnet"
# Tile overlap of diffusers' AutoencoderKL tiled decode (tile_overlap_factor).
VAE_TILE_OVERLAP = 0.25


def text_encoder_bytes(profile: ModelProfile, name: str, dtype: str, quantize: str = "none") -> int:
    """Bytes of the text encoder `name` as loaded at `dtype` (with `quantize` int8/int4, while loading): what sdnq
    leaves unquantized (text_quant_kept: embeddings, norms, the float32-kept layers) stays at the dtype, and
    in a float16 load the float32-kept layers are float32. One count for the VRAM estimate and the host's."""
    n = profile.params.get(name, 0)
    b = DTYPE_BYTES[dtype]
    fp32 = profile.text_fp32_kept.get(name, 0) if dtype == "float16" else 0
    q = QUANTIZED_BYTES.get(quantize)
    if q:
        kept = max(profile.text_quant_kept.get(name) or profile.largest_layer.get(name, 0), fp32)
        return int((n - kept) * q + (kept - fp32) * b + fp32 * 4)
    return int((n - fp32) * b + fp32 * 4)


# ------------------------------------------------------------------------------------ calibration


def _fit() -> dict:
    return calibration().get("fit") or _DEFAULT_FIT


def _fit_table(kind: str) -> dict:
    return _fit().get(kind) or _DEFAULT_FIT[kind]


def _coefficient(kind: str, profile: ModelProfile) -> float:
    """The profile's architecture's fitted coefficient; else that of a family measured through its own pipeline
    whose denoiser is the same class (a folder at another depth or width of it, Klein 9B beside Klein 4B, Qwen-Image
    Edit beside Qwen-Image: the coefficient is a block's working set in stream-sized tensors, so the class carries
    it); else the global one."""
    table = _fit_table(kind)
    if profile.arch in table:
        return float(table[profile.arch])
    same = _own_fit_by_class(kind).get(profile.denoiser_class) if profile.denoiser_class else None
    return float(table[same] if same in table else table["global"])


def _vae_coefficient(profile: ModelProfile, dtype_bytes: int) -> float:
    """The VAE coefficient at `dtype_bytes`. The 16-bit one is fitted on bf16 decodes; a float32 decode (a CPU's
    int8/int4 or full-precision job) holds less than twice that where the VAE upcasts parts of its decode to
    float32 whatever its dtype (DC-AE's linear attention and RMSNorm), so float32 has its own fit
    (`fit.vae_float32`, calibrate_memory.py's -fp32 points), looked up as `_coefficient` does. A VAE with a 16-bit
    coefficient of its own but no float32 point keeps that one (not measured: the safe side)."""
    if dtype_bytes == 4:
        table = _fit().get("vae_float32") or {}
        own = _fit_table("vae")
        same = _own_fit_by_class("vae").get(profile.denoiser_class) if profile.denoiser_class else None
        for arch in (profile.arch, same):
            if arch in table:
                return float(table[arch])
            if arch in own:
                return float(own[arch])
        if "global" in table:
            return float(table["global"])
    return _coefficient("vae", profile)


# _own_fit_by_class's tables by kind, with the calibration they were read from: every estimate asks (the planner's
# searches make thousands), and the table changes only with the calibration, which reload_calibration reads anew (a
# new dict, so the identity check below reads the table again).
_OWN_FITS: dict[str, tuple[dict, dict[str, str]]] = {}


def _own_fit_by_class(kind: str) -> dict[str, str]:
    """Denoiser class -> the architecture whose own-pipeline points (calibrate_memory.py "pipeline" or
    "own_coefficient") fitted `kind`'s coefficient (read once per calibration, see _OWN_FITS; the caller must not
    change the dict it gets)."""
    cal = calibration()
    hit = _OWN_FITS.get(kind)
    if hit is not None and hit[0] is cal:
        return hit[1]
    _OWN_FITS[kind] = (cal, _read_own_fits(cal, kind))
    return _OWN_FITS[kind][1]


def _read_own_fits(cal: dict, kind: str) -> dict[str, str]:
    archs = {m["arch"] for m in cal.get("measurements", []) if m.get("component") == kind
             and any(m.get("options", {}).get(k) for k in ("pipeline", "own_coefficient"))}
    profiles = cal.get("profiles", {})
    return {profiles[a]["denoiser_class"]: a for a in sorted(archs) if profiles.get(a, {}).get("denoiser_class")}


def _weight_copies(profile: ModelProfile) -> float:
    """Copies of the largest pointwise convolution's weight (profile.pointwise_conv) a transformer forward holds at
    its peak beside the per-token working set: fit.pointwise_conv by architecture, or by denoiser class as the
    coefficient is; 1.0 where none is fitted (the weight reordered once for the kernel)."""
    table = _fit().get("pointwise_conv") or {}
    if profile.arch in table:
        return float(table[profile.arch])
    same = _own_fit_by_class("transformer").get(profile.denoiser_class) if profile.denoiser_class else None
    return float(table.get(same, 1.0))


def _video_coefficient(kind: str, profile: ModelProfile, tiled: bool = False,
                       default: float = video.DEFAULT_VIDEO_VAE_COEF) -> float:
    """A clip's coefficient (planning/video.py): calibration.json's video_fit.transformer_video / .vae_video by the
    variant ('wan': Wan 2.1 and A14B, 'wan22': Wan 2.2 TI2V, 'ltx'; a tiled decode's own where fitted: 'wan-tiled'),
    fitted by benchmarks/video_estimate_check.py on measured peaks (a key of its own, which calibrate_memory.py's refit
    of `fit` leaves alone); 1.0 where none is fitted."""
    table = (calibration().get("video_fit") or {}).get(kind) or {}
    key = video.variant(profile)
    if tiled and f"{key}-tiled" in table:
        return float(table[f"{key}-tiled"])
    return float(table.get(key, table.get("global", default)))


def _per_call(kind: str) -> float:
    """Images' worth of activations a forward needs whatever its batch (fitted from batch pairs)."""
    return float(_fit_table(kind).get("per_call", 0.0))


# ------------------------------------------------------------------------------------ features
# Elements per latent pixel per image (the UNet and VAE features), before the fitted coefficient.


def _unet_levels(profile: ModelProfile):
    """Per resolution level (up path, where the most skips are held): (resolution factor, skips held,
    channels, input channels of the first resnet, has attention, heads)."""
    c = profile.unet_channels
    n = len(c)
    lpb = profile.unet_layers_per_block
    res = [4.0**-level for level in range(n)]
    # skips consumed by the up block of each level, all at that level's resolution
    skips = [res[i] * (lpb * c[i] + (c[i - 1] if i > 0 else c[0])) for i in range(n)]
    for i in range(n):
        c_prev = c[i + 1] if i + 1 < n else c[-1]
        attn = profile.unet_attention[i] or (i == n - 1 and profile.unet_mid_attention)
        yield res[i], sum(skips[: i + 1]), c[i], c_prev + c[i], attn, profile.unet_heads[i]


def unet_feature(profile: ModelProfile) -> float:
    """Peak live elements of one UNet forward, per latent pixel per image, from the UNet's shape."""
    if not profile.unet_channels:  # a transformer denoiser: see transformer_feature
        return float(profile.transformer_hidden) / profile.transformer_patch**2
    ff = 3 + profile.unet_ff_inner * 2  # residuals + norm + GEGLU projection + gelu(gate) + product
    best = 0.0
    for res, held, c, c_in, attn, _ in _unet_levels(profile):
        best = max(best, held + res * max(3.5 * c_in, ff * c if attn else 0.0))
    return best


def rendered_size(profile: ModelProfile, width: int, height: int) -> tuple[int, int]:
    """(width, height) the pipeline renders a width x height job at, so the estimates count the image tokens that run:
    the size asked; where it bins resolutions (profile.resolution_bins: SANA) the bin whose aspect ratio is nearest the
    job's, as diffusers' classify_height_width_bin picks it; where its family's record says its pipeline picks a size
    of its own (record.rendered_size: HiDream's native area, keeping the aspect) that size, for a pipeline with this
    profile's VAE. The denoiser and the decode run at that size; the image is resized after."""
    if profile.resolution_bins:
        _, h, w = min(profile.resolution_bins, key=lambda b: abs(b[0] - height / width))
        return w, h
    record = families.by_key(profile.family) if profile.family else families.by_arch(profile.arch)
    if record.rendered_size is None:
        return width, height
    return record.rendered_size(SimpleNamespace(vae_scale_factor=profile.vae_scale_factor), width, height)


def transformer_tokens(profile: ModelProfile, hw: int) -> float:
    """Tokens one image puts through every transformer block: hw latent pixels in patches, plus the
    text tokens that joint attention (SD3, Flux) carries beside them, and an edit's reference images' latent tokens
    (Kontext, Qwen-Image-Edit, Flux.2: in the same stream)."""
    # a clip: every latent frame's tokens in one stream (planning/video.py)
    return (hw / profile.transformer_patch**2 * video.frames_factor(profile) + profile.joint_text_tokens
            + profile.reference_tokens)


def transformer_feature(profile: ModelProfile, hw: int) -> float:
    """Elements of one image's token stream (tokens x hidden): what a transformer block's working set
    is a multiple of. The fitted coefficient is that multiple (see docs/benchmarks.md)."""
    return transformer_tokens(profile, hw) * profile.transformer_hidden


def _denoiser_elements(profile: ModelProfile, hw: int) -> tuple[str, float]:
    """(calibration kind, elements per image with coefficient 1) of one denoiser forward."""
    if profile.unet_channels:
        return "unet", unet_feature(profile) * hw
    return "transformer", transformer_feature(profile, hw)


def _sliced_attention_terms(profile: ModelProfile, hw: float):
    """Per attention level: (elements per latent pixel per image live during self-attention,
    score elements of one slice). pipe.enable_attention_slicing('auto') computes heads // 2 rows of
    the (batch x heads, tokens, tokens) score matrix at a time, whatever the batch."""
    for res, held, c, _, attn, heads in _unet_levels(profile):
        if attn:
            tokens = hw * res
            yield held + res * 8 * c, max(1, heads // 2) * tokens * tokens


def vae_feature(profile: ModelProfile) -> float:
    """Peak live elements of the VAE decode, per latent pixel per image."""
    rev = list(reversed(profile.vae_channels))
    best, c_in = 0.0, rev[0]
    for i, c_out in enumerate(rev):
        scale = 4.0**i
        resnet = scale * (3 * c_in + c_out)
        upsample = scale * c_out * 9 if i < len(rev) - 1 else 0.0  # input + interpolated + conv output
        best = max(best, resnet, upsample)
        c_in = c_out
    return best


def _score_bytes(profile: ModelProfile, dtype_bytes: int) -> int:
    """Bytes per attention score held at the peak of diffusers' get_attention_scores: two score-sized
    tensors at once (the baddbmm input buffer and the scores, then the scores and the probabilities),
    in float32 when the UNet upcasts attention (SD 2.1)."""
    return 2 * (4 if profile.unet_upcast_attention else dtype_bytes)


# ------------------------------------------------------------------------------------- estimate


@dataclass(frozen=True)
class Estimate:
    total_bytes: int  # predicted peak device memory of the job
    weights_bytes: int  # weights resident on the device at the peak
    unet_bytes: int  # activations of one denoiser step, UNet or transformer (CFG doubles the batch)
    vae_bytes: int  # activations of the VAE decode
    overhead_bytes: int  # fixed allowance: kernels, cuBLAS/cuDNN workspaces, allocator rounding
    peak_phase: str = "unet"  # 'text' | 'unet' (the denoiser, UNet or transformer) | 'vae'
    # bytes the offload hooks move host-to-device: every denoising step (streamed blocks or layers),
    # and once per job (whole models moved in when they run, the resident part of a budget split moved
    # in before the denoise and out before the decode)
    streamed_bytes_per_step: int = 0
    moved_bytes_per_job: int = 0
    resident_bytes: int = 0  # offload = "budget": the denoiser's blocks kept on the GPU (after the split)
    denoiser_bytes: int = 0  # the denoiser's weights as stored (fp8/int8/int4/GGUF: fewer bytes)
    # the ControlNets' part of the denoiser (planning/controlnet.py): their weights as stored, and of those the bytes
    # on the GPU for the whole denoise and the bytes streamed in every step
    controlnet_bytes: int = 0
    controlnet_resident_bytes: int = 0
    controlnet_streamed_bytes_per_step: int = 0
    # Wan 2.2 A14B: the bytes crossing the bus at the expert switch, once a job (in moved_bytes_per_job too)
    expert_swap_bytes: int = 0
    image_encoder_bytes: int = 0  # image-to-video: the image encoder's weights (Wan 2.1 I2V's CLIP vision model)

    def as_dict(self) -> dict:
        return asdict(self)


def unet_activation_bytes(profile: ModelProfile, width: int, height: int, images: int, dtype_bytes: int,
                          attention: str = "sdpa") -> int:
    """Activations of one denoiser forward over `images` latents (CFG: 2 per image)."""
    width, height = rendered_size(profile, width, height)
    if profile.is_video_job and profile.transformer_hidden:  # a clip's tokens (planning/video.py)
        return video.transformer_bytes(profile, width, height, images, dtype_bytes,
                                       _video_coefficient("transformer_video", profile),
                                       _video_coefficient("transformer_video_text", profile, default=video.TEXT_TENSORS))
    sf = profile.vae_scale_factor
    hw = math.ceil(height / sf) * math.ceil(width / sf)
    kind, elements = _denoiser_elements(profile, hw)
    coef = _coefficient(kind, profile)
    n = images + _per_call(kind)
    # SANA's 1x1 convolutions: a copy of the largest weight per forward, whatever the tokens and the batch (on the CPU
    # oneDNN reorders it for its kernel; the measured peak has it: docs/benchmarks.md)
    act = coef * elements * n * dtype_bytes + _weight_copies(profile) * profile.pointwise_conv * dtype_bytes
    if attention == "slicing" and profile.unet_channels:
        # the score slices are live during self-attention, not at the feed-forward peak: the peak is
        # the larger of the two
        for working, scores in _sliced_attention_terms(profile, hw):
            act = max(act, coef * working * hw * n * dtype_bytes
                      + _fit()["slicing"] * scores * _score_bytes(profile, dtype_bytes))
    inpaint = inpaint_input_bytes(profile, hw, n, dtype_bytes)
    act += inpaint
    if profile.controlnet_units and profile.controlnet_hidden:  # an SD3/Flux ControlNet (planning/controlnet.py)
        held = profile.controlnet_held * hw * n * dtype_bytes  # its residual streams, as they are (no working set)
        summed = held if profile.controlnet_units > 1 else 0.0
        working = coef * transformer_tokens(profile, hw) * profile.controlnet_hidden * n * dtype_bytes
        own = max(working + held, 3 * held) + summed
        images = profile.controlnet_units * 3 * hw * sf * sf * n * dtype_bytes
        act = max(act + held, own) + images
    elif profile.controlnet_units:  # planning/controlnet.py: its residuals beside the UNet's step, or its own forward
        held = coef * profile.controlnet_held * hw * n * dtype_bytes
        summed = held if profile.controlnet_units > 1 else 0.0  # the residuals of the units before it
        # an inpainting UNet's mask and masked-image latents are held while the ControlNet runs too (half of
        # inpaint_input_bytes: the other half is the UNet step's concatenated input)
        own = coef * profile.controlnet_peak * hw * n * dtype_bytes + summed + inpaint / 2
        images = profile.controlnet_units * 3 * hw * sf * sf * n * dtype_bytes  # the control images, whole pass
        act = max(act + held, own) + images
    return int(act)


def inpaint_input_bytes(profile: ModelProfile, hw: int, n: float, dtype_bytes: int) -> int:
    """An inpainting UNet's inputs beyond the latents (in_channels 9: the mask and the masked image's latents),
    counted twice: held for the whole pass, and again in the step's concatenated input. 0 for a 4-channel UNet."""
    extra = profile.unet_in_channels - 4 if profile.unet_channels else 0
    return int(2 * max(0, extra) * hw * n * dtype_bytes)


def vae_activation_bytes(profile: ModelProfile, width: int, height: int, images: int, dtype_bytes: int,
                         slicing: bool = False, tiling: bool = False, tile_px: int | None = None) -> int:
    """Activations of decoding `images` latents, with diffusers' VAE slicing and tiling (tiles of
    `tile_px` pixels, as apply.vae_tile_size picks them; None: the VAE config's own tile size)."""
    width, height = rendered_size(profile, width, height)
    if profile.is_video_job:  # a clip's decode (planning/video.py): frame by frame (Wan), or all at once (LTX)
        return video.decode_bytes(profile, width, height, images, dtype_bytes, vae_feature(profile),
                                  _video_coefficient("vae_video", profile, tiling), tiling)
    sf = profile.vae_scale_factor
    lh, lw = math.ceil(height / sf), math.ceil(width / sf)
    coef = _vae_coefficient(profile, dtype_bytes) * vae_feature(profile) * dtype_bytes
    image = 3 * (lh * sf) * (lw * sf) * dtype_bytes  # one decoded image

    def decode(h: int, w: int, n: int) -> float:
        return coef * h * w * (n + _per_call("vae"))

    best = decode(lh, lw, images)
    per_call = images
    if slicing and images > 1:
        # one image at a time; the decoded slices and their torch.cat stay until the end
        best = min(best, decode(lh, lw, 1) + 2 * images * image)
        per_call = 1
    tile = max(1, (tile_px or profile.vae_sample_size) // sf)
    if tiling and (lh > tile or lw > tile):
        # one tile decoded at a time; the decoded tiles (overlapping) and the blended result stay
        tiles_kept = per_call * image / (1 - VAE_TILE_OVERLAP) ** 2
        extra_slices = 2 * images * image if per_call == 1 and images > 1 else 0
        best = min(best, decode(min(lh, tile), min(lw, tile), per_call) + tiles_kept + per_call * image + extra_slices)
    return int(best)


def text_activation_bytes(profile: ModelProfile, prompts: int, dtype_bytes: int) -> int:
    """Text encoders: their prompt length (CLIP 77, T5 the pipeline's), every hidden state kept (SDXL
    reads the penultimate one). Not calibrated; the text phase is the peak only when its weights are."""
    tokens = profile.text_tokens or (TEXT_TOKENS,) * len(profile.text_hidden)
    return int(sum(prompts * t * h * (layers + 16) * dtype_bytes
                   for h, layers, t in zip(profile.text_hidden, profile.text_layers, tokens)))


# The denoiser's blocks at bytes as stored, by the identity of the profile's tuple and the bytes per element: one
# tuple per model and storage, so that residency.split parses each piece tree once (its _FORESTS) and the planner's
# bisection does not rebuild the list per estimate. The profile's tuple is kept beside its scaled one, so its id is
# not reused while the entry lives.
_SCALED: dict[tuple[int, float], tuple[tuple, tuple[tuple[str, int], ...]]] = {}


def _scaled_blocks(blocks: tuple[tuple[str, int], ...], bpe: float) -> tuple[tuple[str, int], ...]:
    if type(blocks) is not tuple:  # a list could change: no cache
        return tuple((n, int(c * bpe)) for n, c in blocks)
    hit = _SCALED.get((id(blocks), bpe))
    if hit is not None and hit[0] is blocks:
        return hit[1]
    scaled = tuple((n, int(c * bpe)) for n, c in blocks)
    if len(_SCALED) >= 64:
        _SCALED.clear()
    _SCALED[(id(blocks), bpe)] = (blocks, scaled)
    return scaled


def estimate(profile: ModelProfile, width: int, height: int, batch: int, settings: MemorySettings,
             cfg: bool = True, vae_tile: int | None = None) -> Estimate:
    """Peak device memory of generating `batch` images of width x height in one forward pass each step
    (`vae_tile`: the VAE tile edge in pixels when the settings tile the VAE; None: the VAE's default)."""
    if width <= 0 or height <= 0 or batch <= 0:
        raise ValueError(f"width, height and batch must be positive, got {width}x{height}, batch {batch}")
    if settings.dtype not in DTYPE_BYTES:
        raise ValueError(f"dtype {settings.dtype!r} is not one of {', '.join(DTYPE_BYTES)}")
    b = DTYPE_BYTES[settings.dtype]
    # Wan's clips: CFG's second forward streams the offloaded weights a second time each step (planning/video.py)
    forwards = 2 if cfg and profile.cfg_two_forwards else 1
    cfg = cfg and profile.cfg_batch  # Flux: no CFG batch whatever the guidance scale
    images = batch * (2 if cfg else 1)
    # SDXL-style pipelines decode in float32 when the VAE is float16 and its config says force_upcast
    vae_b = 4 if (settings.dtype == "float16" and profile.vae_force_upcast) or settings.vae_float32 else b

    unet_act = unet_activation_bytes(profile, width, height, images, b, settings.attention)
    vae_act = vae_activation_bytes(profile, width, height, batch, vae_b, settings.vae_slicing, settings.vae_tiling,
                                   vae_tile)
    text_act = text_activation_bytes(profile, 2 if cfg else 1, b)

    den = profile.denoiser
    p = profile.params
    te_names = profile.text_encoders
    q_bytes = QUANTIZED_BYTES.get(settings.quantize)
    te_each = [text_encoder_bytes(profile, n, settings.dtype, settings.quantize) for n in te_names]
    den_full = p.get(den, 0) * b
    # the denoiser's weights as stored; narrower storage adds the one layer dequantized while it runs
    if q_bytes and not profile.denoiser_quantized:  # weight-only int8/int4 (models/quantize.py)
        den_stored = (p.get(den, 0) - profile.quantized_kept) * q_bytes + profile.quantized_kept * b
    elif profile.denoiser_quantized:  # GGUF: the stored size
        den_stored = (p.get(den, 0) - profile.denoiser_quantized) * b + profile.denoiser_quantized_bytes
    elif settings.fp8_storage:  # (a GGUF denoiser is never given fp8 storage: engines/sd/apply.py)
        den_stored = (p.get(den, 0) - profile.fp8_kept) * FP8_BYTES + profile.fp8_kept * b
    else:
        den_stored = den_full
    narrow = den_stored != den_full
    scratch = profile.largest_layer.get(den, 0) * b if narrow else 0  # the layer dequantized while it runs
    den_w = den_stored + scratch
    den_scale = den_stored / den_full if den_full else 1.0  # bytes as stored per byte at the dtype
    vae_w = p.get("vae", 0) * (4 if settings.vae_float32 else b)  # --no-half-vae: kept in float32
    vae_w_decode = p.get("vae", 0) * vae_b
    cn_n, cn_kept = profile.controlnet_params, profile.controlnet_quant_kept
    cn_w = int((cn_n - cn_kept) * q_bytes + cn_kept * b if q_bytes and not profile.denoiser_quantized else cn_n * b)
    cn_resident, cn_streamed = (cn_w, 0) if settings.offload in ("none", "model") else (0, cn_w)

    # a video folder's image encoder (Wan 2.1 I2V): on the device with the rest under none, else a phase of its own
    # where the job runs it (image-to-video), moved in whole (its activations, 257 tokens, are left out)
    ie_w = p.get("image_encoder", 0) * b
    ie_run = ie_w if profile.image_job else 0
    off = settings.offload
    streamed, per_job, resident = 0, 0, 0
    if off == "model":
        per_job = sum(te_each) + den_w + vae_w_decode + ie_run
    elif off in ("group", "sequential"):
        streamed, per_job = den_w, sum(te_each) + vae_w_decode + ie_run
    if off == "none":
        rest = sum(te_each) + den_w + ie_w
        phases = {"text": (rest + vae_w, text_act), "unet": (rest + vae_w, unet_act),
                  "vae": (rest + max(vae_w, vae_w_decode), vae_act)}
    else:
        model_phases = {"text": (max(te_each, default=0), text_act), "unet": (den_w, unet_act),
                        "vae": (vae_w_decode, vae_act)}
        if ie_run:
            model_phases["image"] = (ie_run, 0)
        phases = model_phases
        if off in ("group", "sequential", "budget"):
            def leaf(name: str, nbytes: float) -> float:
                # the running layer and the prefetched one; under fp8 storage each is upcast to
                # the compute dtype while it runs, so count them at that size
                return 2 * profile.largest_layer.get(name, 0) * nbytes

            blocks = sorted(profile.denoiser_blocks, reverse=True) or [p.get(den, 0)]
            # the unmatched top-level group stays loaded; one block group runs while the next is
            # prefetched on a CUDA stream (two blocks resident)
            group_den = (profile.denoiser_unmatched + sum(blocks[:2])) * b * den_scale + scratch
            # text encoders are offloaded leaf by leaf under both modes (apply.PipelineOps.group_offload)
            # a text encoder's window: its two largest neighbouring leaves (profile.leaf_window), else twice its largest
            te_leaf = max((profile.leaf_window[n] * b if profile.leaf_window.get(n) else leaf(n, b) for n in te_names),
                          default=0)
            group = {"text": (min(te_leaf, model_phases["text"][0]), text_act),
                     "unet": (min(group_den, den_w), unet_act), "vae": model_phases["vae"],
                     **({"image": model_phases["image"]} if ie_run else {})}
            phases = group
            if off == "budget":
                # blocks kept on the GPU for the whole job (the planner's split, planning/residency.py);
                # the rest streamed one block at a time with the next one prefetched
                bpe = b * den_scale  # bytes per denoiser element as stored (fp8 or quantized: fewer)
                blocks = _scaled_blocks(profile.residency_blocks, bpe)
                # a quantized, GGUF or casting-hooked layer is no plain Linear, which alone is cut by rows
                plain = not (q_bytes or settings.fp8_storage or settings.half_storage or profile.denoiser_quantized)
                split = residency.split(blocks, settings.resident_bytes, rows=plain)
                kept = int(profile.residency_fixed * bpe) + split.resident_bytes
                if cn_n:  # the ControlNets' blocks in the same split (planning/controlnet.py names them); their
                    # fixed part (embeddings, conv_in, the last zero convolution) stays with the resident part
                    cn_streamed = min(cn_w, sum(c for n, c in zip(split.streamed, split.streamed_sizes)
                                                if n.startswith(controlnet_prefix)))
                    cn_resident = cn_w - cn_streamed
                streamed, resident = split.streamed_bytes_per_step, split.resident_bytes
                # the resident part is on the GPU only while the denoiser runs: moved in before the
                # denoise and out before the VAE decode (engines/sd/stepdown.py), so the decode has its room
                per_job = sum(te_each) + vae_w_decode + 2 * kept + ie_run
                # nor while the prompts are encoded: it goes on at the denoiser's first forward (Runner.place_resident)
                phases = {"text": group["text"],
                          "unet": (min(kept + split.in_flight_bytes + scratch, den_w), unet_act),
                          "vae": group["vae"], **({"image": group["image"]} if ie_run else {})}
            if off == "sequential":
                den_leaf = leaf(den, b)
                phases = {"text": (min(te_leaf, group["text"][0]), text_act),
                          "unet": (min(den_leaf, group["unet"][0]), unet_act),
                          "vae": (min(leaf("vae", vae_b), group["vae"][0]), vae_act),
                          **({"image": (min(leaf("image_encoder", b), ie_run), 0)} if ie_run else {})}
    # Wan 2.2 A14B: the other expert's GPU part comes in at the switch (and the first's leaves), once a job
    placed = int(profile.residency_fixed * b * den_scale) + resident if off == "budget" else 0  # a split's GPU part
    swap = video.swap_bytes(profile, settings, den_w, placed)
    per_job += swap
    phase, (weights, act) = max(phases.items(), key=lambda kv: kv[1][0] + kv[1][1])
    weights = int(weights)
    total = weights + int(act) + OVERHEAD_BYTES
    return Estimate(total_bytes=total, weights_bytes=weights, unet_bytes=unet_act, vae_bytes=vae_act,
                    overhead_bytes=OVERHEAD_BYTES, peak_phase=phase, streamed_bytes_per_step=int(streamed * forwards),
                    moved_bytes_per_job=int(per_job), resident_bytes=int(resident), denoiser_bytes=int(den_stored),
                    controlnet_bytes=cn_w, controlnet_resident_bytes=int(cn_resident),
                    controlnet_streamed_bytes_per_step=int(cn_streamed), expert_swap_bytes=int(swap),
                    image_encoder_bytes=int(ie_w))
