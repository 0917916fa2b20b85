"""The video engine (issue 33): Wan 2.1 / 2.2 and LTX-Video clips through diffusers' own pipelines, on the memory
layer the images use (the Runner's presets, the Ladder, budget streaming, int8/int4).

- checks.py: what a request asks of the model, refused in one sentence before anything loads (frames, size, fps,
  init image, a video request for an image model and the other way round).
- experts.py: Wan 2.2 A14B's two experts, one on the device at a time, swapped once at the boundary.
- pipelines.py: the pipeline a job calls (image-to-video over the loaded components) and its sampler.
- job.py: `run_video_job`, the denoise and the decode as stages of the ladder, and the clip saved.
- decode.py: latents to frames, as the pipelines' own code does it, tiled on out-of-memory.
- the live preview of the middle frame: lowvram_gen/preview.py's renderer (video_renderer), as the images'.

Nothing here is imported by lowvram_gen at import time; torch and diffusers are imported where a job needs them.
"""
