"""inpaint's own flags (A1111's img2img > Inpaint): `--mask`, `--mask-blur`, `--inpaint-area`, `--mask-padding`,
`--masked-content`, `--invert-mask`, `--no-mask-round`. No heavy imports."""

from __future__ import annotations

import argparse


def add_inpaint_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("inpainting (A1111's img2img > Inpaint)")
    g.add_argument("--mask", required=True, metavar="IMAGE",
                   help="white is repainted, black kept (an RGBA layer: its drawn, opaque part); another size than "
                        "--init's is resized to it")
    g.add_argument("--mask-blur", dest="mask_blur", metavar="N", help="blur the mask's edge by N px, 0-64 (default 4)")
    g.add_argument("--inpaint-area", dest="inpaint_area", metavar="whole|masked",
                   help="whole (default: the picture at --width x --height) or masked (A1111's 'Only masked': the "
                        "mask's box plus --mask-padding, generated at --width x --height and pasted back; memory then "
                        "follows the job's size, not the image's)")
    g.add_argument("--mask-padding", dest="mask_padding", metavar="N",
                   help="only masked: px around the mask's box, 0-256 (default 32)")
    g.add_argument("--masked-content", dest="masked_content", metavar="original|fill|latent-noise|latent-nothing",
                   help="what the masked area starts from: original (default), fill (the colours around it), "
                        "latent-noise, latent-nothing (A1111's)")
    g.add_argument("--invert-mask", dest="invert_mask", action="store_const", const=True, default=None,
                   help="repaint the mask's black part instead (A1111's 'Inpaint not masked')")
    g.add_argument("--no-mask-round", dest="mask_round", action="store_const", const=False, default=None,
                   help="keep a grey mask grey in the latents too (A1111's API mask_round false, as its Soft "
                        "inpainting sets it): by default the latent mask is rounded to black and white and an alpha "
                        "layer cut at 128; the blur, fill and paste back use the grey either way")
