"""What a video job adds to the memory estimate (issue 33): its frames, the tokens every transformer forward runs
over, the decode of a causal 3-D VAE, and Wan 2.2 A14B's expert swap.

    latent frames   (frames - 1) / temporal + 1 (Wan: 81 -> 21; the VAE's temporal compression, as its config says)
    tokens          latent frames / patch_t x (H / spatial / patch) x (W / spatial / patch): one forward's stream
                    (Wan 2.1 at 832x480, 81 frames: 21 x 30 x 52 = 32760). The transformer's activations are the
                    estimate's transformer feature at that token count (planning/estimate.transformer_tokens);
                    Wan's CFG is a second forward (cfg_batch False: the same peak, twice the compute), LTX's a
                    doubled batch
    decode          Wan (AutoencoderKLWan._decode): latent frame by latent frame, a feature cache carried between
                    them, each call making `temporal` output frames; the frames are joined with torch.cat as they
                    come, so the peak is one latent frame's decode at full size x temporal frames, plus the clip so far
                    and its copy (the join, then the clamp). LTX (AutoencoderKLLTXVideo): every frame at once, unless
                    framewise (chunks of 16 frames) or tiled. Tiled (vae.enable_tiling(): the plan's tiled rung), one
                    spatial tile at a time (Wan 256 px tiles at a 192 px stride, LTX 512 at 448), the decoded tiles
                    kept until they are blended into the clip
    experts         Wan 2.2 A14B: `transformer` for the high-noise steps, `transformer_2` for the rest. The GPU holds one
                    expert's resident/streamed part at a time (the estimate counts one denoiser), the host both (every
                    component in params); at the boundary the running one's GPU part leaves and the other's comes in:
                    those bytes cross the bus once (`swap_bytes`), never per step

`planned(profile, video, request)` makes the profile of one job (as engines/sd/edit.planned adds an edit's reference
tokens): the frames and latent frames, Wan's two-forward CFG, whether the image encoder runs. The coefficient of the
decode is fitted per VAE (calibration.json `fit.vae_video`, benchmarks/video_estimate_check.py) on measured peaks.

No torch import; no import of planning/estimate.py (it imports this module).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

# AutoencoderKLWan's and AutoencoderKLLTXVideo's tiling defaults (tile_sample_min_*, tile_sample_stride_*)
WAN_TILE, WAN_STRIDE = 256, 192
LTX_TILE, LTX_STRIDE = 512, 448
LTX_FRAME_TILE = 16  # LTX framewise decoding: frames per temporal tile (tile_sample_min_num_frames)
# the decode's working set per latent pixel of one output frame, in vae_feature units, where no fit says otherwise
DEFAULT_VIDEO_VAE_COEF = 1.0


@dataclass(frozen=True)
class VideoJob:
    """What the plan counted of a clip: `plan --json`'s "video" and its one text line."""

    frames: int
    latent_frames: int
    width: int
    height: int
    tokens: int  # per transformer forward, per clip
    forwards: int  # transformer forwards a step (Wan's CFG: 2; LTX's doubled batch: 1)
    temporal: int
    spatial: int
    patch: int
    experts: int = 1
    image_encoder: bool = False  # the job runs the image encoder (image-to-video, Wan 2.1 I2V)
    upscale_allowed: bool = False
    swap_bytes: int = 0  # Wan 2.2 A14B: bytes that cross the bus at the expert switch (the chosen candidate's)
    swap_seconds: float = 0.0

    def line(self) -> str:
        """'video: 81 frames -> 21 latent frames, 32760 tokens per forward' (and the experts' swap)."""
        return describe(self.as_dict())

    def as_dict(self) -> dict:
        return {"frames": self.frames, "latent_frames": self.latent_frames, "width": self.width,
                "height": self.height, "tokens": self.tokens, "forwards": self.forwards,
                "temporal": self.temporal, "spatial": self.spatial, "patch": self.patch, "experts": self.experts,
                "image_encoder": self.image_encoder, "upscale_allowed": self.upscale_allowed,
                "swap_bytes": self.swap_bytes, "swap_seconds": round(self.swap_seconds, 3)}


def describe(job: dict) -> str:
    """The text line of a VideoJob's dict (`plan`'s, and shapes.shape_lines')."""
    text = (f"video: {job['frames']} frames -> {job['latent_frames']} latent frames, {job['tokens']} tokens per forward"
            + (f", {job['forwards']} forwards a step (CFG)" if job["forwards"] > 1 else ""))
    if job["experts"] > 1:
        text += (f"; two experts, one on the GPU at a time, swapped once ({job['swap_bytes'] / 2**30:.1f} GiB over the "
                 f"bus, about {job['swap_seconds']:.1f} s)")
    return text


def latent_frames(profile, frames: int, temporal: int = 0) -> int:
    """Latent frames of a clip of `frames` frames: the VAE's temporal compression as its config says (the profile's),
    else `temporal` (the record's)."""
    t = int(getattr(profile, "vae_temporal", 0) or 0) if getattr(profile, "vae_video", "") else 0
    t = t or temporal or 4
    return (int(frames) - 1) // t + 1


def tokens(profile, width: int, height: int, frames_latent: int) -> int:
    """Tokens one clip puts through every transformer block at width x height over `frames_latent` latent frames:
    whole patches, as the pipelines' patch embedding makes them."""
    sf, p = profile.vae_scale_factor, max(1, profile.transformer_patch)
    pt = max(1, int(getattr(profile, "transformer_patch_t", 1) or 1))
    return (frames_latent // pt) * (height // sf // p) * (width // sf // p)


def frames_factor(profile) -> float:
    """How many latent frames' worth of image tokens one forward carries (1 for an image job)."""
    if not getattr(profile, "video_frames", 0):
        return 1.0
    pt = max(1, int(getattr(profile, "transformer_patch_t", 1) or 1))
    return float(max(1, profile.latent_frames // pt))


def planned(profile, video, request, frames: int | None = None, image: bool | None = None):
    """(the profile of `request`'s clip, its VideoJob): `video` the record's Video facts of the folder (temporal,
    frames a job of 0 frames makes, experts, image encoder); `frames` overrides the request's (the would-fit search)."""
    n = int(frames if frames is not None else (request.frames or video.frames))
    lat = latent_frames(profile, n, video.temporal)
    image = bool(request.init_image) if image is None else image
    two = not profile.cfg_batch  # Wan: cond then uncond, two forwards (LTX doubles the batch instead)
    job = replace(profile, video_frames=n, latent_frames=lat, cfg_two_forwards=two,
                  image_job=image and "image_encoder" in profile.params)
    cfg = (request.cfg_scale or 0) > 1
    return job, VideoJob(frames=n, latent_frames=lat, width=int(request.width), height=int(request.height),
                         tokens=tokens(profile, request.width, request.height, lat),
                         forwards=2 if cfg and two else 1,
                         temporal=int(profile.vae_temporal if profile.vae_video else video.temporal),
                         spatial=int(profile.vae_scale_factor), patch=int(profile.transformer_patch),
                         experts=profile.experts, image_encoder=job.image_job,
                         upscale_allowed=bool(getattr(request, "allow_upscale", False)))


# A video transformer block's working set per token, in elements: HIDDEN_TENSORS tensors of its width and FFN_TENSORS
# of its feed-forward's inner width (the projection's output and its GELU), fitted to the measured forwards of the
# width-scaled Wan 2.1 1.3B and 14B (benchmarks/results/video_memory.json: their FFNs are 5.8x and 2.7x the width, and
# the slopes of their two token counts give 7.6 and 1.9). fit.transformer_video scales it per variant (Wan 2.2 TI2V
# carries a timestep embedding per token; LTX's blocks differ). Beside the tokens, the prompt's embeddings at the text
# encoder's width (TEXT_TENSORS of them: the intercept of those measurements, 3-5 MiB for 512 x 4096), per clip.
HIDDEN_TENSORS = 7.6
FFN_TENSORS = 1.9
TEXT_TENSORS = 1.0


def variant(profile) -> str:
    """The key of a clip's fitted coefficients: 'ltx', 'wan22' (Wan 2.2 TI2V's 16x VAE, a timestep per token), 'wan'
    (Wan 2.1, and each of Wan 2.2 A14B's experts)."""
    if profile.vae_video == "whole":  # (LTX-Video's VAE decodes every frame at once)
        return "ltx"
    return "wan22" if profile.vae_scale_factor == 16 else "wan"


def transformer_bytes(profile, width: int, height: int, images: int, dtype_bytes: int, coef: float,
                      text_coef: float = TEXT_TENSORS) -> int:
    """Activations of one transformer forward over `images` clips (LTX's CFG: 2; Wan's: 1, its second forward after):
    the tokens times a block's working set per token (HIDDEN_TENSORS x width + FFN_TENSORS x FFN width) times `coef`,
    and `text_coef` prompt embeddings at the text encoder's width (fit.transformer_video_text where fitted)."""
    n = tokens(profile, width, height, profile.latent_frames)
    hidden = profile.transformer_hidden
    ffn = profile.transformer_ffn or 4 * hidden
    text = text_coef * (profile.text_tokens or (0,))[0] * (profile.transformer_text_dim or hidden)
    return int((coef * n * (HIDDEN_TENSORS * hidden + FFN_TENSORS * ffn) + text) * images * dtype_bytes)


def decode_bytes(profile, width: int, height: int, batch: int, dtype_bytes: int, feature: float, coef: float,
                 tiling: bool = False) -> int:
    """Activations of decoding a clip of `profile.video_frames` frames at width x height (see the module doc).
    `feature`: the VAE's working set per latent pixel (estimate.vae_feature), `coef` its fitted video coefficient."""
    sf = profile.vae_scale_factor
    lh, lw = math.ceil(height / sf), math.ceil(width / sf)
    frames = int(profile.video_frames)
    temporal = max(1, int(profile.vae_temporal or 1))
    clip = 3 * frames * height * width * dtype_bytes * batch  # the decoded clip

    def working(h: int, w: int, out_frames: int) -> float:
        return coef * feature * h * w * out_frames * dtype_bytes

    if profile.vae_video == "whole":
        whole = working(lh, lw, frames) * batch + clip
        if not tiling:
            return int(whole)
        chunk = min(frames, LTX_FRAME_TILE + temporal)  # framewise: one temporal tile (and its overlap) at a time
        tile = max(1, LTX_TILE // sf)
        th, tw = min(lh, tile), min(lw, tile)
        kept = clip / ((LTX_STRIDE / LTX_TILE) ** 2 if (lh > tile or lw > tile) else 1.0)
        return int(min(whole, working(th, tw, chunk) + kept + clip))
    # Wan: one latent frame at a time (temporal output frames), the clip joined as it comes (cat + clamp: two copies)
    one = working(lh, lw, temporal) * batch + 2 * clip
    tile = max(1, WAN_TILE // sf)
    if not tiling or (lh <= tile and lw <= tile):
        return int(one)
    # tiled: a tile's decode, the decoded tiles (overlapping: 256 at a 192 stride) and the blended clip
    kept = clip / (WAN_STRIDE / WAN_TILE) ** 2
    return int(min(one, working(tile, tile, temporal) * batch + kept + clip))


def swap_bytes(profile, settings, den_w: int, placed: int) -> int:
    """Bytes that cross the bus at Wan 2.2 A14B's expert switch under `settings` (0 for one denoiser): the running
    expert's GPU part out and the other's in, once (whole experts under none/model; under budget `placed`, a split's
    resident blocks and fixed part; nothing extra where both stream every step)."""
    if profile.experts < 2:
        return 0
    off = settings.offload
    if off in ("none", "model"):
        return 2 * int(den_w)
    if off == "budget":
        return 2 * int(placed)
    return 0


def step_flops(profile, width: int, height: int, forwards: int) -> float:
    """FLOPs of one denoising step of a clip: per forward, 2 x parameters x tokens (the projections) plus the
    self-attention's 4 x tokens^2 x width per block (scores and their product with the values), which at 30k
    tokens outweighs the rest (Wan 2.1 1.3B at 832x480, 81 frames: 2.0e14 of attention, 0.9e14 of projections)."""
    n = tokens(profile, width, height, profile.latent_frames)
    params = profile.params.get(profile.denoiser, 0)
    layers = profile.transformer_layers or 1
    return float(forwards) * (2.0 * params * n + 4.0 * n * n * profile.transformer_hidden * layers)
