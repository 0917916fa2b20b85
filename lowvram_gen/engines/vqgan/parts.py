"""The differentiable pieces of VQGAN-CLIP, after nerdyrodent/VQGAN-CLIP (itself after Katherine Crowson's notebook).

* `vector_quantize`: snap each latent vector to its nearest codebook entry; the gradient passes
  straight through to the continuous latent (`ReplaceGrad`), so the optimiser moves z, not codes.
* `MakeCutouts`: random square crops (sizes drawn with `cut_pow`), resized to CLIP's input size,
  then kornia augmentations and a little noise; all cutouts of an iteration are made at once, so
  encoding them in chunks gives exactly the gradient of encoding them together.
* `Prompt`: spherical distance between CLIP embeddings, weight (negative: push away) and stop
  (a cutout whose loss is below it no longer pulls).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn


class ReplaceGrad(torch.autograd.Function):
    """Forward `x_forward`, backward into `x_backward`: the straight-through estimator."""

    @staticmethod
    def forward(ctx, x_forward, x_backward):
        ctx.shape = x_backward.shape
        return x_forward

    @staticmethod
    def backward(ctx, grad_in):
        return None, grad_in.sum_to_size(ctx.shape)


class ClampWithGrad(torch.autograd.Function):
    """Clamp, but let through the gradients that would move a clamped value back into range."""

    @staticmethod
    def forward(ctx, x, lo, hi):
        ctx.lo, ctx.hi = lo, hi
        ctx.save_for_backward(x)
        return x.clamp(lo, hi)

    @staticmethod
    def backward(ctx, grad_in):
        (x,) = ctx.saved_tensors
        return grad_in * (grad_in * (x - x.clamp(ctx.lo, ctx.hi)) >= 0), None, None


replace_grad = ReplaceGrad.apply
clamp_with_grad = ClampWithGrad.apply


def vector_quantize(x: torch.Tensor, codebook: torch.Tensor) -> torch.Tensor:
    """x: [..., e]; the nearest codebook rows, with the gradient passed straight through to x."""
    d = x.pow(2).sum(dim=-1, keepdim=True) + codebook.pow(2).sum(dim=1) - 2 * x @ codebook.T
    x_q = codebook[d.argmin(-1)]
    return replace_grad(x_q, x)


def spherical_distance(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Great-circle distance squared (x2) between the normalised rows of x [n, 1, d] and y [1, m, d]."""
    x, y = F.normalize(x, dim=-1), F.normalize(y, dim=-1)
    return x.sub(y).norm(dim=-1).div(2).arcsin().pow(2).mul(2)


class Prompt(nn.Module):
    """One text or image prompt: embeddings [m, d], weight, stop."""

    def __init__(self, embed: torch.Tensor, weight: float = 1.0, stop: float = float("-inf"), label: str = ""):
        super().__init__()
        self.register_buffer("embed", embed.detach().float())
        self.weight, self.stop, self.label = float(weight), float(stop), label

    def loss_sum(self, image_embeds: torch.Tensor) -> torch.Tensor:
        """Sum over these cutouts of the mean over the prompt's embeddings; / cutn gives nerdyrodent's mean."""
        dists = spherical_distance(image_embeds.float().unsqueeze(1), self.embed.unsqueeze(0))  # [n, m]
        dists = dists * math.copysign(1.0, self.weight)
        stop = torch.full_like(dists, self.stop)
        return abs(self.weight) * replace_grad(dists, torch.maximum(dists, stop)).sum() / dists.shape[1]


def make_augments(codes, cut_size: int) -> nn.Module:
    """nerdyrodent's augmentation codes as kornia augmentations, with its settings."""
    import kornia.augmentation as K

    size = (cut_size, cut_size)
    table = {
        "Ji": lambda: K.ColorJitter(brightness=0.1, contrast=0.1, saturation=0.1, hue=0.1, p=0.7),
        "Sh": lambda: K.RandomSharpness(sharpness=0.3, p=0.5),
        "Gn": lambda: K.RandomGaussianNoise(mean=0.0, std=1.0, p=0.5),
        "Pe": lambda: K.RandomPerspective(distortion_scale=0.7, p=0.7),
        "Ro": lambda: K.RandomRotation(degrees=15, p=0.7),
        "Af": lambda: K.RandomAffine(degrees=15, translate=(0.1, 0.1), shear=5, p=0.7, padding_mode="zeros",
                                     keepdim=True),
        "Et": lambda: K.RandomElasticTransform(p=0.7),
        "Ts": lambda: K.RandomThinPlateSpline(scale=0.8, same_on_batch=True, p=0.7),
        "Cr": lambda: K.RandomCrop(size=size, pad_if_needed=True, padding_mode="reflect", p=0.5),
        "Er": lambda: K.RandomErasing(scale=(0.1, 0.4), ratio=(0.3, 1 / 0.3), same_on_batch=True, p=0.7),
        "Re": lambda: K.RandomResizedCrop(size=size, scale=(0.1, 1), ratio=(0.75, 1.333), cropping_mode="resample",
                                          p=0.5),
    }
    return nn.Sequential(*(table[c]() for c in codes))


class MakeCutouts(nn.Module):
    """`cutn` random crops of an image batch [1, 3, H, W] in [0, 1], as CLIP-sized augmented cutouts."""

    def __init__(self, cut_size: int, augments=(), cut_pow: float = 1.0, noise_fac: float = 0.1):
        super().__init__()
        self.cut_size, self.cut_pow, self.noise_fac = cut_size, cut_pow, noise_fac
        self.augs = make_augments(augments, cut_size)

    def forward(self, image: torch.Tensor, cutn: int) -> torch.Tensor:
        side_y, side_x = image.shape[2:4]
        max_size = min(side_x, side_y)
        min_size = min(side_x, side_y, self.cut_size)
        cutouts = []
        for _ in range(cutn):
            size = int(torch.rand([]) ** self.cut_pow * (max_size - min_size) + min_size)
            ox = int(torch.randint(0, side_x - size + 1, ()))
            oy = int(torch.randint(0, side_y - size + 1, ()))
            crop = image[:, :, oy:oy + size, ox:ox + size]
            cutouts.append(F.interpolate(crop, (self.cut_size, self.cut_size), mode="bilinear", align_corners=False,
                                         antialias=size > self.cut_size))
        batch = torch.cat(cutouts, dim=0)
        if len(self.augs):
            batch = self.augs(batch)
        if self.noise_fac:
            facs = batch.new_empty([cutn, 1, 1, 1]).uniform_(0, self.noise_fac)
            batch = batch + facs * torch.randn_like(batch)
        return batch


def make_optimizer(name: str, params, lr: float) -> torch.optim.Optimizer:
    if name == "SGD":
        return torch.optim.SGD(params, lr=lr, momentum=0.9)
    return getattr(torch.optim, name)(params, lr=lr)


def pil_to_tensor(image) -> torch.Tensor:
    """PIL RGB -> [1, 3, H, W] float in [0, 1] (no torchvision needed)."""
    import numpy as np

    array = np.asarray(image.convert("RGB"), dtype=np.float32) / 255.0
    return torch.from_numpy(array.copy()).permute(2, 0, 1).unsqueeze(0)


def tensor_to_pil(x: torch.Tensor):
    from PIL import Image

    array = (x[0].detach().float().clamp(0, 1).permute(1, 2, 0).cpu().numpy() * 255).round().astype("uint8")
    return Image.fromarray(array)


def noise_image(kind: str, width: int, height: int, generator: torch.Generator):
    """nerdyrodent's init noise: random pixels, or a gradient between random colours."""
    from PIL import Image

    if kind == "pixels":
        x = torch.rand(1, 3, height, width, generator=generator)
        return tensor_to_pil(x)
    a, b = torch.rand(3, generator=generator), torch.rand(3, generator=generator)
    horizontal = bool(torch.rand((), generator=generator) < 0.5)
    t = torch.linspace(0, 1, width if horizontal else height)
    line = a[:, None] * (1 - t) + b[:, None] * t  # [3, n]
    x = line[:, None, :].expand(3, height, width) if horizontal else line[:, :, None].expand(3, height, width)
    return tensor_to_pil(x.unsqueeze(0)).resize((width, height), Image.Resampling.BILINEAR)
