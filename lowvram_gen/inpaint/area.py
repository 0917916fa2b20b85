"""Where an inpaint pass works and how its images go back: A1111's "Whole picture" and "Only masked".

Whole picture: the init image and the mask resized to the pass's size by the request's resize mode (Just resize:
Lanczos; Crop and resize, Resize and fill: control/resize.py, the mask as its image, as A1111 resizes both); the
result keeps the (resized) init image outside the blurred mask, the overlay mask doubled as A1111's is, so the
repainted area reaches the mask's edge.
Only masked: the mask's box grown by the padding and to the job's aspect ratio (masks.to_aspect) is cut from the
init image and the mask and brought to the pass's size with A1111's "resize and fill" (control/resize.py's
init_resized: a box the canvas's edge kept from the job's aspect is scaled to fit and its edge rows or columns
stretched over the rest, never distorted); the denoiser sees that size, never the canvas. The result is brought
back to the box's size with "crop and resize" (the fill's bands cut off again), pasted into the init image at its
own size, and keeps the original outside the blurred mask.
"Fill" (and the latent contents, which A1111 fills first too) paints the masked area of the pass's init image first.

The ladder's first step on a big canvas (`masked_rung`): a whole-picture job that ran out of memory goes on as only
masked, the mask's box denoised at the scale the whole picture had (never below the model's native side), so the
memory follows the box, not the canvas; the image keeps the whole picture's size.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from lowvram_gen.control.resize import init_resized
from lowvram_gen.inpaint import masks


@dataclass
class Area:
    """One job's inpaint geometry: its init image at its own size (the canvas) and mask (masks.Prepared)."""

    init: object  # PIL RGB, the canvas
    prepared: masks.Prepared
    only_masked: bool
    padding: int
    content: str  # masks.CONTENTS
    size: tuple[int, int]  # the job's size (request width x height)
    out_size: tuple[int, int] | None = None  # masked_rung: the size the whole picture's images had
    # the request's resize mode (control/resize.py): how the whole picture's init and mask meet the job's size, and
    # how a masked rung's canvas goes back to it; only masked's box ignores it, as A1111's does
    resize: str = "resize"

    # a step down must save at least this much: a box nearly the canvas's costs what the whole picture did
    RUNG_MOST_PIXELS = 0.75

    @property
    def box(self) -> tuple[int, int, int, int] | None:
        """Only masked: the box of the canvas that is repainted (None for the whole picture)."""
        if not self.only_masked:
            return None
        box = masks.crop_box(self.prepared.soft, self.padding)
        return masks.to_aspect(box, *self.size, self.init.size) if box is not None else None

    @property
    def control_crop(self) -> tuple | None:
        """Only masked: ((canvas width, height), box), what a ControlNet unit's image is cut with (resized to the
        canvas first), as A1111's extension cuts it with the init image's crop; None for the whole picture."""
        box = self.box
        return None if box is None else (tuple(self.init.size), tuple(box))

    def for_pass(self, size: tuple[int, int]) -> tuple[object, object]:
        """(init image, mask) at the pass's size: whole, resized, or the box cut and resized and filled; masked content
        other than "original" paints the masked area of the init first (A1111 fills for its latent contents too)."""
        init, mask = self.init, self.prepared.soft
        box = self.box
        mode = self.resize  # A1111 resizes the mask by the image's mode; an only-masked cut is always filled
        if box is not None:
            init, mask, mode = init.crop(box), mask.crop(box), "fill"
        init, mask = _sized(init, size, mode), _sized(mask, size, mode)
        if self.content != "original":
            init = masks.fill(init, mask)
        return init, mask

    def masked_rung(self, size: tuple[int, int], multiple: int, native: int) -> tuple["Area", tuple[int, int]] | None:
        """The ladder's only-masked step for this whole-picture job now at pass size `size`: (the only-masked area,
        its pass size), or None where it saves too little (an only-masked job already, a mask box near the canvas).
        The pass size is the box at the whole picture's scale, its shorter side at least min(`native`, the pass's),
        sides in `multiple`s."""
        if self.only_masked:
            return None
        box = masks.crop_box(self.prepared.soft, self.padding)
        if box is None:
            return None
        x0, y0, x1, y1 = masks.to_aspect(box, *size, self.init.size)
        scale = size[0] / self.init.size[0]  # the whole-picture pass's pixels per canvas pixel
        w, h = (x1 - x0) * scale, (y1 - y0) * scale
        grow = max(1.0, min(native, *size) / min(w, h))  # a model makes poor pictures below its native size
        sides = [min(side, max(multiple, round(v * grow / multiple) * multiple)) for v, side in zip((w, h), size)]
        if sides[0] * sides[1] > self.RUNG_MOST_PIXELS * size[0] * size[1]:
            return None
        return replace(self, only_masked=True, out_size=self.size), (sides[0], sides[1])

    def finish(self, images: list) -> list:
        """The generated images (at the job's size) with the original kept outside the blurred mask."""
        box = self.box
        if box is None:
            base = _sized(self.init, self.size, self.resize)
            soft = _sized(self.prepared.soft, self.size, self.resize)
            overlay = soft.point(lambda v: min(255, v * 2))  # A1111's whole-picture overlay mask, doubled
            return [masks.overlay(_sized(im.convert("RGB"), self.size, "resize"), base, overlay) for im in images]
        x0, y0, x1, y1 = box
        out = []
        for im in images:
            pasted = self.init.copy()
            pasted.paste(init_resized(im.convert("RGB"), x1 - x0, y1 - y0, "crop"), (x0, y0))
            done = masks.overlay(pasted, self.init, self.prepared.soft)
            out.append(done if self.out_size in (None, done.size) else init_resized(done, *self.out_size, self.resize))
        return out


def _sized(image, size: tuple[int, int], mode: str):
    """`image` at `size` by A1111's resize `mode` (resize, or fill for an only-masked cut), in its own mode (a mask
    stays L: the fill's canvas is RGB)."""
    if image.size == tuple(size):
        return image
    return init_resized(image, *size, mode).convert(image.mode)


def area_for(request, init) -> Area | None:
    """The request's inpaint geometry for its init image (None without a mask)."""
    if not request.mask:
        return None
    prepared = masks.prepare(request.mask, init.size, request.invert_mask, request.mask_blur,
                             getattr(request, "mask_round", True))
    return Area(init, prepared, request.inpaint_area == "masked", request.mask_padding, request.masked_content,
                (request.width, request.height), resize=request.resize_mode)
