"""Inpainting (A1111's img2img > Inpaint): the mask's options on a request and what is done to the pixels.

No torch here: the request checks its mask (masks.py) before anything heavy is imported. The mask's geometry per
pass (whole picture or only masked, the blur, the paste back) is masks.py and area.py; the denoise call with
diffusers' inpaint pipelines is engines/sd/inpaint.py.
"""
