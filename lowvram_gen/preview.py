"""Live previews: an RGB picture of a pass's latents while it denoises, made on the CPU.

Two ways, as A1111 and ComfyUI offer them (`METHODS`; "auto" takes TAESD where its weights are here, else approx):

- approx: a linear map of the latent channels to RGB, per latent format (`FORMATS`). No model, a few
  multiply-adds a latent pixel.
- taesd: the Tiny AutoEncoder (diffusers' `AutoencoderTiny`), when its decoder is already on this machine:
  in `models/VAE-approx/` (under ./models or $LOWVRAM_GEN_MODELS), as A1111 keeps it (`taesd_decoder.pt`,
  `taesdxl_decoder.pt`; also `taesd3_decoder` and `taef1_decoder`, and ComfyUI's `.pth`/`.safetensors` of the
  same names), or a diffusers folder named as its hub repo (`models/VAE-approx/taesd`, ...), or that repo in the
  Hugging Face cache (`madebyollin/taesd`, ...). SANA, whose latents have no published linear map, has only this:
  madebyollin's `taesana_decoder.pth` (the 32x variant, which AutoencoderTiny cannot hold: `f32_decoder`). Nothing is
  ever downloaded.

A preview never touches the GPU or its memory budget: the one latent it shows is copied to the CPU in float32
first, and TAESD runs on the CPU. The approximation is made in the step (about 0.1 s for a 1024x1024 image on two
CPU cores); TAESD, which takes seconds on a CPU at that size, is made on a worker thread, so the steps never wait
for it (`Previews`). torch, diffusers and PIL are imported when a preview is made, not on import.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable

from lowvram_gen import families
from lowvram_gen.errors import InvalidRequest, ModelLoadError
from lowvram_gen.networks.files import models_root

log = logging.getLogger(__name__)
METHODS = ("auto", "approx", "taesd", "off")
TAESD_FOLDER = "VAE-approx"  # A1111's folder for the approximate decoders
TAESD_SUFFIXES = (".safetensors", ".pt", ".pth")


@dataclass(frozen=True)
class LatentFormat:
    """How a model family's latents look to a preview. `factors`: one (R, G, B) row per latent channel, applied
    to the latents as the denoiser holds them (scaled, and shifted for SD3/Flux); `bias` added after; `packed`:
    Flux's 2x2 patches packed into a sequence; `taesd`: the decoder's A1111 file stem and its hub repo."""

    factors: tuple[tuple[float, float, float], ...]  # empty: no published map, no approximation (TAESD only)
    bias: tuple[float, float, float] | None
    taesd: tuple[str, str | None] | None  # None: no TAESD decoder we know of (approx only); repo None: file only
    packed: bool = False
    taesd_f32: bool = False  # the decoder is madebyollin's 32x variant (F32Decoder), not diffusers' AutoencoderTiny


# The factors are data published with ComfyUI: comfy/latent_formats.py, classes SD15, SDXL, SD3, Flux, Flux2 and Wan21
# (latent_rgb_factors, latent_rgb_factors_bias), https://github.com/comfyanonymous/ComfyUI/blob/master/comfy/latent_formats.py
# Z-Image, Lumina 2 and Chroma have FLUX.1's VAE ("flux"), Qwen-Image Wan 2.1's ("wan21"), Flux.2 its own ("flux2"), as
# ComfyUI's comfy/supported_models.py gives them. SANA's 32-channel DC-AE has no published map, so no approximation:
# its previews are TAESANA's (madebyollin/taesd's taesana_decoder.pth, the 32x "f32" variant) where that file is here.
FORMATS = {
    "sd": LatentFormat(  # SD 1.x / 2.x
        ((0.3512, 0.2297, 0.3227), (0.3250, 0.4974, 0.2350), (-0.2829, 0.1762, 0.2721), (-0.2120, -0.2616, -0.7177)),
        None, ("taesd_decoder", "madebyollin/taesd")),
    "sdxl": LatentFormat(
        ((0.3651, 0.4232, 0.4341), (-0.2533, -0.0042, 0.1068), (0.1076, 0.1111, -0.0362), (-0.3165, -0.2492, -0.2188)),
        (0.1084, -0.0175, -0.0011), ("taesdxl_decoder", "madebyollin/taesdxl")),
    "sd3": LatentFormat(
        ((-0.0922, -0.0175, 0.0749), (0.0311, 0.0633, 0.0954), (0.1994, 0.0927, 0.0458), (0.0856, 0.0339, 0.0902),
         (0.0587, 0.0272, -0.0496), (-0.0006, 0.1104, 0.0309), (0.0978, 0.0306, 0.0427), (-0.0042, 0.1038, 0.1358),
         (-0.0194, 0.0020, 0.0669), (-0.0488, 0.0130, -0.0268), (0.0922, 0.0988, 0.0951), (-0.0278, 0.0524, -0.0542),
         (0.0332, 0.0456, 0.0895), (-0.0069, -0.0030, -0.0810), (-0.0596, -0.0465, -0.0293), (-0.1448, -0.1463, -0.1189)),
        (0.2394, 0.2135, 0.1925), ("taesd3_decoder", "madebyollin/taesd3")),
    "flux": LatentFormat(
        ((-0.0346, 0.0244, 0.0681), (0.0034, 0.0210, 0.0687), (0.0275, -0.0668, -0.0433), (-0.0174, 0.0160, 0.0617),
         (0.0859, 0.0721, 0.0329), (0.0004, 0.0383, 0.0115), (0.0405, 0.0861, 0.0915), (-0.0236, -0.0185, -0.0259),
         (-0.0245, 0.0250, 0.1180), (0.1008, 0.0755, -0.0421), (-0.0515, 0.0201, 0.0011), (0.0428, -0.0012, -0.0036),
         (0.0817, 0.0765, 0.0749), (-0.1264, -0.0522, -0.1103), (-0.0280, -0.0881, -0.0499), (-0.1262, -0.0982, -0.0778)),
        (-0.0329, -0.0718, -0.0851), ("taef1_decoder", "madebyollin/taef1"), packed=True),
    # Flux.2's 32-channel VAE latents, as ComfyUI's Flux2 format reads them: patchified 2x2 into 128 channels (channel
    # c*4 + 2*row + col, the order of diffusers' Flux2 _patchify_latents) and normalised by the VAE's batch norm, as the
    # denoiser holds them; the factors apply to the 32 channels once the patches are put back on their grid, which
    # `_unpacked` does for the sequence the pipeline packs them into (the same layout as FLUX.1's packing)
    "flux2": LatentFormat(
        ((0.0058, 0.0113, 0.0073), (0.0495, 0.0443, 0.0836), (-0.0099, 0.0096, 0.0644), (0.2144, 0.3009, 0.3652),
         (0.0166, -0.0039, -0.0054), (0.0157, 0.0103, -0.0160), (-0.0398, 0.0902, -0.0235), (-0.0052, 0.0095, 0.0109),
         (-0.3527, -0.2712, -0.1666), (-0.0301, -0.0356, -0.0180), (-0.0107, 0.0078, 0.0013), (0.0746, 0.0090, -0.0941),
         (0.0156, 0.0169, 0.0070), (-0.0034, -0.0040, -0.0114), (0.0032, 0.0181, 0.0080), (-0.0939, -0.0008, 0.0186),
         (0.0018, 0.0043, 0.0104), (0.0284, 0.0056, -0.0127), (-0.0024, -0.0022, -0.0030), (0.1207, -0.0026, 0.0065),
         (0.0128, 0.0101, 0.0142), (0.0137, -0.0072, -0.0007), (0.0095, 0.0092, -0.0059), (0.0000, -0.0077, -0.0049),
         (-0.0465, -0.0204, -0.0312), (0.0095, 0.0012, -0.0066), (0.0290, -0.0034, 0.0025), (0.0220, 0.0169, -0.0048),
         (-0.0332, -0.0457, -0.0468), (-0.0085, 0.0389, 0.0609), (-0.0076, 0.0003, -0.0043), (-0.0111, -0.0460, -0.0614)),
        (-0.0329, -0.0718, -0.0851), None, packed=True),
    # Wan 2.1's VAE, Qwen-Image's: ComfyUI's Wan21 format (its latents normalised by the VAE's latents_mean / std, as
    # QwenImagePipeline holds them), packed 2x2 into a sequence as FLUX.1's
    "wan21": LatentFormat(
        ((-0.1299, -0.1692, 0.2932), (0.0671, 0.0406, 0.0442), (0.3568, 0.2548, 0.1747), (0.0372, 0.2344, 0.1420),
         (0.0313, 0.0189, -0.0328), (0.0296, -0.0956, -0.0665), (-0.3477, -0.4059, -0.2925), (0.0166, 0.1902, 0.1975),
         (-0.0412, 0.0267, -0.1364), (-0.1293, 0.0740, 0.1636), (0.0680, 0.3019, 0.1128), (0.0032, 0.0581, 0.0639),
         (-0.1251, 0.0927, 0.1699), (0.0060, -0.0633, 0.0005), (0.3477, 0.2275, 0.2950), (0.1984, 0.0913, 0.1861)),
        (-0.1835, -0.0868, -0.3360), None, packed=True),
    # SANA's DC-AE (f32c32): no linear map published; madebyollin's TAESANA decoder file only (it is published in the
    # taesd GitHub repository, not as a diffusers folder on the hub)
    "dc-ae": LatentFormat((), None, ("taesana_decoder", None), taesd_f32=True),
}

Render = Callable[[object, int, int], object]  # (latents of one image on the CPU, width, height) -> PIL image


def check_method(value) -> str:
    """A preview method from the UI, the API or a caller: one of METHODS (case and spaces ignored)."""
    method = value.strip().lower() if isinstance(value, str) else value
    if method not in METHODS:
        raise InvalidRequest("live preview method", value, "use one of: " + ", ".join(METHODS))
    return method


def latent_format(pipe) -> str | None:
    """The latent format of a pipeline (any of its family's), as its family's record says (FORMATS' key); None where
    we have none (a family no record knows, or one without a format here)."""
    key = families.of_pipe(pipe).latent_format
    return key if key in FORMATS else None


def renderer(pipe, method: str = "auto", models: Path | None = None) -> tuple[Render | None, str]:
    """The function that makes a pass's previews for `pipe`, and the method it uses ("approx", "taesd"; "off" with
    None). "taesd" without its weights here is a clear error naming where they go (before any step runs); "auto"
    then falls back to approx. A pipeline whose latents we cannot read gives None ("off")."""
    method = check_method(method)
    key = latent_format(pipe)
    if method == "off" or key is None:
        return None, "off"
    # whether the denoiser holds its latents packed into a sequence is the family's (its record), not the format's
    fmt = replace(FORMATS[key], packed=families.of_pipe(pipe).packed_latents)
    scale = int(getattr(pipe, "vae_scale_factor", 8) or 8)
    if method == "approx" and not fmt.factors:
        return None, "off"  # no published map (SANA): no preview, as for a family with no format
    if method == "taesd" and fmt.taesd is None:
        raise InvalidRequest("live preview method", "taesd", f"no TAESD decoder is known for {families.of_pipe(pipe).name}"
                             "'s latents: use auto or approx")
    if method in ("auto", "taesd") and fmt.taesd is not None:
        found = find_taesd(fmt, models)
        if found is not None:
            decoder = _Taesd(found, fmt.taesd_f32)
            return (lambda latents, width, height: decoder.image(_unpacked(latents, fmt, width, height, scale),
                                                                 (width, height))), "taesd"
        if method == "taesd":
            stem, repo = fmt.taesd
            where = f"{stem}.pt (or .pth, .safetensors)" + (f" or the diffusers folder {repo.split('/')[1]}" if repo
                                                              else "")
            cache = f", or have {repo} in the Hugging Face cache" if repo else ""
            raise InvalidRequest("live preview method", "taesd",
                                 f"no TAESD decoder for this model: put {where} in "
                                 f"{(models or models_root()) / TAESD_FOLDER}{cache}; or use auto"
                                 + ("/approx" if fmt.factors else ""))
    if not fmt.factors:  # auto, and no decoder here: no preview rather than a made-up map
        return None, "off"
    return (lambda latents, width, height: approx(_unpacked(latents, fmt, width, height, scale), fmt,
                                                  (width, height))), "approx"


class Previews:
    """A job's live previews: `post(latents, width, height, step, total)` every `every` steps, `show(image, step,
    total)` with `render(latents, width, height)`'s image. `background` (TAESD): made on a worker thread that runs
    while there is a preview to make; the steps never wait for it, and a preview posted while the one before is
    still being made waits in one slot, where a newer one replaces it (the newest is shown). A preview that fails
    is logged and the job's previews stop there; the job goes on."""

    def __init__(self, every: int, render: Render, show, background: bool = False):
        self.every, self.render, self.show, self.background = every, render, show, background
        self._lock = threading.Lock()
        self._waiting: tuple | None = None  # the newest preview not yet being made
        self._worker: threading.Thread | None = None
        self.failed = False

    def post(self, latents, width: int, height: int, step: int, total: int) -> None:
        if self.failed:
            return
        if not self.background:
            self._make((latents, width, height, step, total))
            return
        with self._lock:
            self._waiting = (latents, width, height, step, total)
            if self._worker is None:
                self._worker = threading.Thread(target=self._work, daemon=True, name="lowvram-gen preview")
                self._worker.start()

    def _work(self) -> None:
        while True:
            with self._lock:
                item, self._waiting = self._waiting, None
                if item is None or self.failed:
                    self._worker = None
                    return
            self._make(item)

    def _make(self, item: tuple) -> None:
        latents, width, height, step, total = item
        try:
            image = self.render(latents, width, height)
        except Exception:  # noqa: BLE001 - a preview must never end the job it shows
            self.failed = True
            log.warning("live preview failed; no more previews for this job", exc_info=True)
            return
        self.show(image, step, total)


def _unpacked(latents, fmt: LatentFormat, width: int, height: int, scale: int):
    """(C, h, w) from one image's latents as the denoiser holds them ((1, C, h, w); Flux: (1, sequence, C*4), its
    2x2 patches packed, put back on their grid)."""
    latents = latents[0]
    if not fmt.packed:
        return latents
    rows, cols = height // (scale * 2), width // (scale * 2)
    channels = latents.shape[-1] // 4
    return latents.view(rows, cols, channels, 2, 2).permute(2, 0, 3, 1, 4).reshape(channels, rows * 2, cols * 2)


def approx(latents, fmt: LatentFormat, size: tuple[int, int]):
    """The linear latent -> RGB approximation of (C, h, w) latents, as an RGB PIL image of `size`."""
    import torch

    factors = torch.tensor(fmt.factors, dtype=torch.float32)
    if latents.shape[0] != factors.shape[0]:
        raise ValueError(f"latents with {latents.shape[0]} channels; this format has {factors.shape[0]}")
    bias = torch.tensor(fmt.bias, dtype=torch.float32) if fmt.bias else None
    rgb = torch.nn.functional.linear(latents.float().permute(1, 2, 0), factors.T, bias)  # (h, w, 3) about [-1, 1]
    return _to_image(rgb.permute(2, 0, 1), size)


def _to_image(rgb, size: tuple[int, int]):
    """(3, h, w) in [-1, 1] -> an RGB PIL image of `size` (NaN/Inf, from a diverging pass, shown as grey)."""
    import torch
    from PIL import Image

    rgb = torch.nan_to_num(rgb.float(), nan=0.0, posinf=1.0, neginf=-1.0).clamp(-1, 1)
    pixels = ((rgb + 1) * 127.5).round().to(torch.uint8).permute(1, 2, 0).contiguous().numpy()
    image = Image.fromarray(pixels, "RGB")
    return image if image.size == size else image.resize(size, Image.BILINEAR)


# -- TAESD ------------------------------------------------------------------------------------------------------


def find_taesd(fmt: LatentFormat, models: Path | None = None) -> Path | None:
    """Where this format's TAESD decoder is: an A1111/ComfyUI file or a diffusers folder in models/VAE-approx, else
    the hub repo's folder in the Hugging Face cache (config and weights both there); None when it is nowhere."""
    stem, repo = fmt.taesd
    folder = (models or models_root()) / TAESD_FOLDER
    for suffix in TAESD_SUFFIXES:
        if (folder / f"{stem}{suffix}").is_file():
            return folder / f"{stem}{suffix}"
    if repo is None:
        return None
    local = folder / repo.split("/")[1]
    if (local / "config.json").is_file():
        return local
    from huggingface_hub import try_to_load_from_cache

    config = try_to_load_from_cache(repo, "config.json")
    if isinstance(config, str):
        cached = Path(config).parent
        if any((cached / f"diffusion_pytorch_model{s}").is_file() for s in (".safetensors", ".bin")):
            return cached
    return None


_DECODERS: dict[tuple[str, int], object] = {}  # (path, mtime_ns) -> AutoencoderTiny on the CPU, loaded once
_LOCK = threading.Lock()


class _Taesd:
    """A TAESD decoder on the CPU in float32. A file from models/VAE-approx reads the latents as the denoiser holds
    them (as A1111 and ComfyUI feed it); a diffusers folder, as a pipeline feeds its VAE (its config's scaling and
    shift undone first)."""

    def __init__(self, path: Path, f32: bool = False):
        self.path, self.f32 = path, f32
        self.model = load_taesd(path, f32)

    def image(self, latents, size: tuple[int, int]):
        import torch

        x = latents.float()[None]
        if self.f32:  # madebyollin's own module: the latents as the denoiser holds them in, [0, 1] out
            with torch.inference_mode():
                rgb = self.model(x)[0].clamp(0, 1) * 2 - 1
            return _to_image(rgb, size)
        config = self.model.config
        if self.path.is_dir():
            x = x / config.scaling_factor + config.shift_factor
        with torch.inference_mode():
            rgb = self.model.decode(x, return_dict=False)[0][0]  # [-1, 1]
        return _to_image(rgb, size)


def load_taesd(path: Path, f32: bool = False):
    """An AutoencoderTiny on the CPU (float32) from a diffusers folder or an A1111/ComfyUI decoder file (the
    original TAESD layout: an nn.Sequential whose first entry is the clamp diffusers' DecoderTiny applies itself,
    so its layer i is diffusers' decoder.layers[i - 1]), cached per file while the process runs. `f32`: the file is
    madebyollin's 32x decoder (TAESANA), which AutoencoderTiny cannot hold: loaded into `f32_decoder`'s module."""
    key = (str(path), path.stat().st_mtime_ns)
    with _LOCK:
        if key in _DECODERS:
            return _DECODERS[key]
        import torch
        from diffusers import AutoencoderTiny

        if path.is_dir():
            model = AutoencoderTiny.from_pretrained(str(path), torch_dtype=torch.float32, local_files_only=True)
        elif f32:
            model = _f32_from_file(path)
        else:
            model = _from_file(path)
        model = model.to("cpu", torch.float32).eval()
        _DECODERS[key] = model
        return model


def _decoder_state(path: Path) -> dict:
    if path.suffix.lower() == ".safetensors":
        from safetensors.torch import load_file

        from lowvram_gen.models.safe_files import check_safetensors

        check_safetensors(path)  # a renamed pickle is refused, never unpickled
        state = load_file(str(path), device="cpu")
    else:
        from lowvram_gen.models.safe_files import load_pickle_weights_only

        state = load_pickle_weights_only(path)
    return state


def _from_file(path: Path):
    from diffusers import AutoencoderTiny

    state = _decoder_state(path)
    try:
        layers = {f"{int(k.split('.', 1)[0]) - 1}.{k.split('.', 1)[1]}": v for k, v in state.items()}
        first = layers["0.weight"]  # conv(latent channels -> width)
        model = AutoencoderTiny(latent_channels=first.shape[1], decoder_block_out_channels=(first.shape[0],) * 4,
                                encoder_block_out_channels=(first.shape[0],) * 4)
        model.decoder.layers.load_state_dict(layers)
    except (ValueError, KeyError, IndexError, RuntimeError) as exc:
        raise ModelLoadError(f"{path} is not a TAESD decoder (A1111's taesd_decoder.pt layout): "
                             f"{str(exc).splitlines()[0]}") from None
    return model


def f32_decoder(latent_channels: int = 32):
    """madebyollin's TAESD decoder with 32x upscaling (taesd.py's F32Decoder, TAESANA's), layer for layer, so its
    published state dict loads by name: a clamp, conv to 256, then five stages of three residual blocks each
    followed by a 2x upsample and a conv (256 -> 128 -> 64 ...), a last block and a conv to RGB in [0, 1]."""
    import torch
    from torch import nn

    def conv(n_in, n_out, **kw):
        return nn.Conv2d(n_in, n_out, 3, padding=1, **kw)

    class Clamp(nn.Module):
        def forward(self, x):
            return torch.tanh(x / 3) * 3

    class Block(nn.Module):
        def __init__(self, n):
            super().__init__()
            self.conv = nn.Sequential(conv(n, n), nn.ReLU(), conv(n, n), nn.ReLU(), conv(n, n))
            self.skip, self.fuse = nn.Identity(), nn.ReLU()

        def forward(self, x):
            return self.fuse(self.conv(x) + self.skip(x))

    layers = [Clamp(), conv(latent_channels, 256), nn.ReLU()]
    for n_in, n_out in ((256, 128), (128, 64), (64, 64), (64, 64), (64, 64)):
        layers += [Block(n_in), Block(n_in), Block(n_in), nn.Upsample(scale_factor=2), conv(n_in, n_out, bias=False)]
    return nn.Sequential(*layers, Block(64), conv(64, 3))


def _f32_from_file(path: Path):
    state = _decoder_state(path)
    try:
        first = state["1.weight"]  # conv(latent channels -> 256)
        model = f32_decoder(first.shape[1])
        model.load_state_dict(state)
    except (ValueError, KeyError, IndexError, RuntimeError) as exc:
        raise ModelLoadError(f"{path} is not a TAESANA decoder (madebyollin's taesana_decoder.pth layout): "
                             f"{str(exc).splitlines()[0]}") from None
    return model
