"""What a finished job gives back, whatever the engine: the images and how they were made."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field


@dataclass
class GenerationResult:
    images: list[str]
    seeds: list[int]
    width: int
    height: int
    steps: int
    sampler: str
    model: str
    model_path: str
    seconds: float
    preset: str
    attempts: list[dict]
    summary: str
    generated_width: int
    generated_height: int
    upscaled: bool
    device: str
    warnings: list[str] = field(default_factory=list)
    nsfw: list[bool] = field(default_factory=list)
    schedule_type: str = "automatic"  # the request's (A1111 1.9+'s Schedule type); SD jobs only
    # a video job (issue 33): the clip's path (mp4, or an animated WebP without PyAV), its frames' PNGs when asked
    # for (`save_frames`), how many frames it has and at what fps; `images` is empty for a clip. `videos`: every
    # clip of a batch count, in order (`video` stays the first)
    video: str | None = None
    videos: list[str] = field(default_factory=list)
    frames: list[str] = field(default_factory=list)
    frame_count: int = 0
    fps: float | None = None

    def as_json(self) -> dict:
        return asdict(self)
