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

Video (issue 33): a clip's latents, (batch, channels, frames, h, w) or LTX-Video's packed sequence, are previewed by
their middle latent frame through the approximation (`video_renderer`, `video_frame`): Wan 2.1's and Wan 2.2 A14B's
16 channels ("wan21"), Wan 2.2 TI2V 5B's 48 ("wan22"), LTX-Video's 128 ("ltxv"), told apart by the VAE's channels.

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


# The factors are data published with ComfyUI: comfy/latent_formats.py, classes SD15, SDXL, SD3, Flux, Flux2, Wan21,
# Wan22 and LTXV (latent_rgb_factors, latent_rgb_factors_bias),
# https://github.com/comfyanonymous/ComfyUI/blob/master/comfy/latent_formats.py
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
    # Wan 2.2 TI2V 5B's VAE (48 channels, 16x spatial): ComfyUI's Wan22 format. Wan 2.2 A14B keeps Wan 2.1's VAE
    # ("wan21"). A video's latents are (batch, channels, frames, h, w): a preview shows one latent frame (video_frame)
    "wan22": LatentFormat(
        ((0.0119, 0.0103, 0.0046), (-0.1062, -0.0504, 0.0165), (0.0140, 0.0409, 0.0491), (-0.0813, -0.0677, 0.0607),
         (0.0656, 0.0851, 0.0808), (0.0264, 0.0463, 0.0912), (0.0295, 0.0326, 0.0590), (-0.0244, -0.0270, 0.0025),
         (0.0443, -0.0102, 0.0288), (-0.0465, -0.0090, -0.0205), (0.0359, 0.0236, 0.0082), (-0.0776, 0.0854, 0.1048),
         (0.0564, 0.0264, 0.0561), (0.0006, 0.0594, 0.0418), (-0.0319, -0.0542, -0.0637), (-0.0268, 0.0024, 0.0260),
         (0.0539, 0.0265, 0.0358), (-0.0359, -0.0312, -0.0287), (-0.0285, -0.1032, -0.1237), (0.1041, 0.0537, 0.0622),
         (-0.0086, -0.0374, -0.0051), (0.0390, 0.0670, 0.2863), (0.0069, 0.0144, 0.0082), (0.0006, -0.0167, 0.0079),
         (0.0313, -0.0574, -0.0232), (-0.1454, -0.0902, -0.0481), (0.0714, 0.0827, 0.0447), (-0.0304, -0.0574, -0.0196),
         (0.0401, 0.0384, 0.0204), (-0.0758, -0.0297, -0.0014), (0.0568, 0.1307, 0.1372), (-0.0055, -0.0310, -0.0380),
         (0.0239, -0.0305, 0.0325), (-0.0663, -0.0673, -0.0140), (-0.0416, -0.0047, -0.0023), (0.0166, 0.0112, -0.0093),
         (-0.0211, 0.0011, 0.0331), (0.1833, 0.1466, 0.2250), (-0.0368, 0.0370, 0.0295), (-0.3441, -0.3543, -0.2008),
         (-0.0479, -0.0489, -0.0420), (-0.0660, -0.0153, 0.0800), (-0.0101, 0.0068, 0.0156),
         (-0.0690, -0.0452, -0.0927),
         (-0.0145, 0.0041, 0.0015), (0.0421, 0.0451, 0.0373), (0.0504, -0.0483, -0.0356), (-0.0837, 0.0168, 0.0055)),
        (0.0317, -0.0878, -0.1388), None),
    # LTX-Video's VAE (128 channels, 32x spatial, 8x temporal): ComfyUI's LTXV format. LTXPipeline holds its latents
    # packed into a sequence (batch, frames x h x w, channels), normalised by the VAE's latents_mean / std as ComfyUI's
    # are; `video_frame` unpacks them with the pipeline's own `_unpack_latents`
    "ltxv": LatentFormat(
        ((1.1202e-02, -6.3815e-04, -1.0021e-02), (8.6031e-02, 6.5813e-02, 9.5409e-04),
         (-1.2576e-02, -7.5734e-03, -4.0528e-03), (9.4063e-03, -2.1688e-03, 2.6093e-03),
         (3.7636e-03, 1.2765e-02, 9.1548e-03), (2.1024e-02, -5.2973e-03, 3.4373e-03),
         (-8.8896e-03, -1.9703e-02, -1.8761e-02), (-1.3160e-02, -1.0523e-02, 1.9709e-03),
         (-1.5152e-03, -6.9891e-03, -7.5810e-03), (-1.7247e-03, 4.6560e-04, -3.3839e-03),
         (1.3617e-02, 4.7077e-03, -2.0045e-03), (1.0256e-02, 7.7318e-03, 1.3948e-02),
         (-1.6108e-02, -6.2151e-03, 1.1561e-03), (7.3407e-03, 1.5628e-02, 4.4865e-04),
         (9.5357e-04, -2.9518e-03, -1.4760e-02), (1.9143e-02, 1.0868e-02, 1.2264e-02),
         (4.4575e-03, 3.6682e-05, -6.8508e-03), (-4.5681e-04, 3.2570e-03, 7.7929e-03),
         (3.3902e-02, 3.3405e-02, 3.7454e-02), (-2.3001e-02, -2.4877e-03, -3.1033e-03),
         (5.0265e-02, 3.8841e-02, 3.3539e-02), (-4.1018e-03, -1.1095e-03, 1.5859e-03),
         (-1.2689e-01, -1.3107e-01, -2.1005e-01), (2.6276e-02, 1.4189e-02, -3.5963e-03),
         (-4.8679e-03, 8.8486e-03, 7.8029e-03), (-1.6610e-03, -4.8597e-03, -5.2060e-03),
         (-2.1010e-03, 2.3610e-03, 9.3796e-03), (-2.2482e-02, -2.1305e-02, -1.5087e-02),
         (-1.5753e-02, -1.0646e-02, -6.5083e-03), (-4.6975e-03, 5.0288e-03, -6.7390e-03),
         (1.1951e-02, 2.0712e-02, 1.6191e-02), (-6.3704e-03, -8.4827e-03, -9.5483e-03),
         (7.2610e-03, -9.9326e-03, -2.2978e-02), (-9.1904e-04, 6.2882e-03, 9.5720e-03),
         (-3.7178e-02, -3.7123e-02, -5.6713e-02), (-1.3373e-01, -1.0720e-01, -5.3801e-02),
         (-5.3702e-03, 8.1256e-03, 8.8397e-03), (-1.5247e-01, -2.1437e-01, -2.1843e-01),
         (3.1441e-02, 7.0335e-03, -9.7541e-03), (2.1528e-03, -8.9817e-03, -2.1023e-02),
         (3.8461e-03, -5.8957e-03, -1.5014e-02), (-4.3470e-03, -1.2940e-02, -1.5972e-02),
         (-5.4781e-03, -1.0842e-02, -3.0204e-03), (-6.5347e-03, 3.0806e-03, -1.0163e-02),
         (-5.0414e-03, -7.1503e-03, -8.9686e-04), (-8.5851e-03, -2.4351e-03, 1.0674e-03),
         (-9.0016e-03, -9.6493e-03, 1.5692e-03), (5.0914e-03, 1.2099e-02, 1.9968e-02),
         (1.3758e-02, 1.1669e-02, 8.1958e-03), (-1.0518e-02, -1.1575e-02, -4.1307e-03),
         (-2.8410e-02, -3.1266e-02, -2.2149e-02), (2.9336e-03, 3.6511e-02, 1.8717e-02),
         (-1.6703e-02, -1.6696e-02, -4.4529e-03), (4.8818e-02, 4.0063e-02, 8.7410e-03),
         (-1.5066e-02, -5.7328e-04, 2.9785e-03), (-1.7613e-02, -8.1034e-03, 1.3086e-02),
         (-9.2633e-03, 1.0803e-02, -6.3489e-03), (3.0851e-03, 4.7750e-04, 1.2347e-02),
         (-2.2785e-02, -2.3043e-02, -2.6005e-02), (-2.4787e-02, -1.5389e-02, -2.2104e-02),
         (-2.3572e-02, 1.0544e-03, 1.2361e-02), (-7.8915e-03, -1.2271e-03, -6.0968e-03),
         (-1.1478e-02, -1.2543e-03, 6.2679e-03), (-5.4229e-02, 2.6644e-02, 6.3394e-03),
         (4.4216e-03, -7.3338e-03, -1.0464e-02), (-4.5013e-03, 1.6082e-03, 1.4420e-02),
         (1.3673e-02, 8.8877e-03, 4.1253e-03), (-1.0145e-02, 9.0072e-03, 1.5695e-02),
         (-5.6234e-03, 1.1847e-03, 8.1261e-03), (-3.7171e-03, -5.3538e-03, 1.2590e-03),
         (2.9476e-02, 2.1424e-02, 3.0424e-02), (-3.4925e-02, -2.4340e-02, -2.5316e-02),
         (-3.4127e-02, -2.2406e-02, -1.0589e-02), (-1.7342e-02, -1.3249e-02, -1.0719e-02),
         (-2.1478e-03, -8.6051e-03, -2.9878e-03), (1.2089e-03, -4.2391e-03, -6.8569e-03),
         (9.0411e-04, -6.6886e-03, -6.7547e-05), (1.6048e-02, -1.0057e-02, -2.8929e-02),
         (1.2290e-03, 1.0163e-02, 1.8861e-02), (1.7264e-02, 2.7257e-04, 1.3785e-02),
         (-1.3482e-02, -3.6427e-03, 6.7481e-04), (4.6782e-03, -5.2423e-03, 2.4467e-03),
         (-5.9113e-03, -6.2244e-03, -1.8162e-03), (1.5496e-02, 1.4582e-02, 1.9514e-03),
         (7.4958e-03, 1.5886e-03, -8.2305e-03), (1.9086e-02, 1.6360e-03, -3.9674e-03),
         (-5.7021e-03, -2.7307e-03, -4.1066e-03), (1.7450e-03, 1.4602e-02, 2.5794e-02),
         (-8.2788e-04, 2.2902e-03, 4.5161e-03), (1.1632e-02, 8.9193e-03, -7.2813e-03),
         (7.5721e-03, 2.6784e-03, 1.1393e-02), (5.1939e-03, 3.6903e-03, 1.4049e-02),
         (-1.8383e-02, -2.2529e-02, -2.4477e-02), (5.8842e-04, -5.7874e-03, -1.4770e-02),
         (-1.6125e-02, -8.6101e-03, -1.4533e-02), (2.0540e-02, 2.0729e-02, 6.4338e-03),
         (3.3587e-03, -1.1226e-02, -1.6444e-02), (-1.4742e-03, -1.0489e-02, 1.7097e-03),
         (2.8130e-02, 2.3546e-02, 3.2791e-02), (-1.8532e-02, -1.2842e-02, -8.7756e-03),
         (-8.0533e-03, -1.0771e-02, -1.7536e-02), (-3.9009e-03, 1.6150e-02, 3.3359e-02),
         (-7.4554e-03, -1.4154e-02, -6.1910e-03), (3.4734e-03, -1.1370e-02, -1.0581e-02),
         (1.1476e-02, 3.9281e-03, 2.8231e-03), (7.1639e-03, -1.4741e-03, -3.8066e-03),
         (2.2250e-03, -8.7552e-03, -9.5719e-03), (2.4146e-02, 2.1696e-02, 2.8056e-02),
         (-5.4365e-03, -2.4291e-02, -1.7802e-02), (7.4263e-03, 1.0510e-02, 1.2705e-02),
         (6.2669e-03, 6.2658e-03, 1.9211e-02), (1.6378e-02, 9.4933e-03, 6.6971e-03),
         (1.7173e-02, 2.3601e-02, 2.3296e-02), (-1.4568e-02, -9.8279e-03, -1.1556e-02),
         (1.4431e-02, 1.4430e-02, 6.6362e-03), (-6.8230e-03, 1.8863e-02, 1.4555e-02),
         (6.1156e-03, 3.4700e-03, -2.6662e-03), (-2.6983e-03, -5.9402e-03, -9.2276e-03),
         (1.0235e-02, 7.4173e-03, -7.6243e-03), (-1.3255e-02, 1.9322e-02, -9.2153e-04),
         (2.4222e-03, -4.8039e-03, -1.5759e-02), (2.6244e-02, 2.5951e-02, 2.0249e-02),
         (1.5711e-02, 1.8498e-02, 2.7407e-03), (-2.1714e-03, 4.7214e-03, -2.2443e-02),
         (-7.4747e-03, 7.4166e-03, 1.4430e-02), (-8.3906e-03, -7.9776e-03, 9.7927e-03),
         (3.8321e-02, 9.6622e-03, -1.9268e-02), (-1.4605e-02, -6.7032e-03, 3.9675e-03)),
        (-0.0571, -0.1657, -0.2512), None),
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
    we have none (a family no record knows, or one without a format here). A video pipeline's is its VAE's
    (`video_format`: Wan 2.1 and Wan 2.2 share WanPipeline, with 16 or 48 channels)."""
    record = families.of_pipe(pipe)
    if record.is_video:
        return video_format(pipe)
    key = record.latent_format
    return key if key in FORMATS else None


def renderer(pipe, method: str = "auto", models: Path | None = None) -> tuple[Render | None, str]:
    """The function that makes a pass's previews for `pipe`, and the method it uses ("approx", "taesd"; "off" with
    None). "taesd" without its weights here is a clear error naming where they go (before any step runs); "auto"
    then falls back to approx. A pipeline whose latents we cannot read gives None ("off")."""
    method = check_method(method)
    if families.of_pipe(pipe).is_video:
        return video_renderer(pipe, method)
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


# -- video latents (issue 33) ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class VideoGeometry:
    """How a video pipeline holds its latents: the VAE's spatial compression, and for a pipeline that packs them into a
    sequence (LTX-Video), its own `_unpack_latents` with the transformer's spatial and temporal patch sizes."""

    spatial: int
    unpack: Callable | None = None  # LTXPipeline._unpack_latents(latents, frames, h, w, patch, patch_t); None: 5-D
    patch: int = 1
    patch_t: int = 1


def latent_channels(pipe) -> int | None:
    """The channels of a pipeline's latents, from its VAE's config (Wan: z_dim; LTX: latent_channels)."""
    config = getattr(getattr(pipe, "vae", None), "config", None) or {}
    channels = config.get("z_dim") or config.get("latent_channels")
    return int(channels) if channels else None


def video_format(pipe) -> str | None:
    """The latent format (FORMATS' key) of a video pipeline: Wan's by its VAE's channels (16: Wan 2.1 and Wan 2.2
    A14B, "wan21"; 48: Wan 2.2 TI2V 5B, "wan22"), LTX-Video's "ltxv"; None where the map does not fit the VAE's
    latents (a test's tiny VAE with other channels, a family without a map): then no preview, never a wrong one."""
    record = families.of_pipe(pipe)
    channels = latent_channels(pipe)
    key = {"wan": {16: "wan21", 48: "wan22"}.get(channels), "ltx-video": "ltxv"}.get(record.group,
                                                                                     record.latent_format)
    if key not in FORMATS or len(FORMATS[key].factors) != channels:
        return None
    return key


def video_geometry(pipe) -> VideoGeometry:
    """The pipeline's latent geometry: Wan's `vae_scale_factor_spatial`; LTX's `vae_spatial_compression_ratio`,
    its transformer's patch sizes and the pipeline class's `_unpack_latents` (its latents are packed)."""
    if hasattr(pipe, "vae_spatial_compression_ratio"):  # LTX-Video
        return VideoGeometry(int(pipe.vae_spatial_compression_ratio), type(pipe)._unpack_latents,
                             int(getattr(pipe, "transformer_spatial_patch_size", 1) or 1),
                             int(getattr(pipe, "transformer_temporal_patch_size", 1) or 1))
    return VideoGeometry(int(getattr(pipe, "vae_scale_factor_spatial", 8) or 8))


def video_renderer(pipe, method: str = "auto") -> tuple[Render | None, str]:
    """`renderer` of a video pipeline: the approximation of the middle latent frame (no TAESD decoder is known for
    video latents: "taesd" is refused in one sentence, "auto" is the approximation)."""
    if method == "off":
        return None, "off"
    if method == "taesd":
        raise InvalidRequest("live preview method", "taesd", f"no TAESD decoder is known for "
                             f"{families.of_pipe(pipe).name}'s video latents: use auto or approx")
    key = video_format(pipe)
    if key is None:
        return None, "off"
    fmt, geometry = FORMATS[key], video_geometry(pipe)
    return (lambda latents, width, height: approx(video_frame(latents, geometry, width, height), fmt,
                                                  (width, height))), "approx"


def video_frame(latents, geometry: VideoGeometry, width: int, height: int, frame: int | None = None):
    """(C, h, w): latent frame `frame` (None: the middle one) of one clip's latents as the denoiser holds them,
    (1, C, frames, h, w), or packed (1, sequence, C x patches) where the pipeline packs them (LTX-Video)."""
    if latents.dim() == 3:  # packed: unpacked on the latent grid the size gives, as the pipeline itself does
        rows, cols = height // geometry.spatial, width // geometry.spatial
        frames = latents.shape[1] // (rows * cols)
        latents = geometry.unpack(latents, frames, rows, cols, geometry.patch, geometry.patch_t)
    clip = latents[0]  # (C, frames, h, w)
    index = clip.shape[1] // 2 if frame is None else frame
    if not -clip.shape[1] <= index < clip.shape[1]:
        raise ValueError(f"latent frame {index} of a clip of {clip.shape[1]} latent frames")
    return clip[:, index]


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
