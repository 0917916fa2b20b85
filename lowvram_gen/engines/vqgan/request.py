"""A VQGAN-CLIP job as every front end builds it, and its validation (no torch: checked before any model work).

Options follow nerdyrodent/VQGAN-CLIP, so its users find what they know: text prompts
``text:weight:stop`` separated by ``|`` (negative weights push away from a text, ``stop`` stops a
prompt pulling once its loss is below it), image prompts (``path:weight:stop``), an init image,
init noise, iterations, save-every, cutouts (``cutn``, ``cut_pow``), augmentations, learning rate
and optimizer. A colon that belongs to the text is written ``\\:``.
"""

from __future__ import annotations

import dataclasses
import math
import random
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

from lowvram_gen.errors import InvalidRequest
from lowvram_gen.request import MAX_BATCH, MAX_SEED, as_bool, as_float, as_int, as_side, clean_prompt

# Caps: they bound what a typo can cost; presets cap the size further (and upscale afterwards).
MAX_ITERATIONS = 10_000  # nerdyrodent's default is 500; long runs are 1000-3000
MAX_CUTN = 256  # VQGAN-CLIP's default is 32-64; past 256 CLIP's gradient no longer improves
MAX_PROMPTS = 16  # text and image prompts together
MAX_WEIGHT = 100.0
MAX_LR = 10.0
MAX_CUT_POW = 10.0
MAX_INIT_WEIGHT = 100.0
OPTIMIZERS = ("Adam", "AdamW", "Adagrad", "Adamax", "RMSprop", "RAdam", "NAdam", "SGD")
INIT_NOISE = ("none", "pixels", "gradient")
# nerdyrodent's augmentation codes; the default is its default set.
AUGMENTS = {
    "Ji": "colour jitter", "Sh": "sharpness", "Gn": "gaussian noise", "Pe": "perspective", "Ro": "rotation",
    "Af": "affine", "Et": "elastic", "Ts": "thin plate spline", "Cr": "crop", "Er": "erasing", "Re": "resized crop",
}
DEFAULT_AUGMENTS = ("Af", "Pe", "Ji", "Er")
TINY_SPECS = ("tiny", "tiny-vqgan-clip")

_PLAIN_NUMBER = re.compile(r"^\s*[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?\s*$|^\s*[-+]?(?:inf|infinity|nan)\s*$", re.I)
_NUMBERISH = re.compile(r"^\s*[-+.]?\d[\d.eE+-]*\s*$|^\s*[-+]{2,}\d")  # looks meant as a number, but is it one?
_SPLIT_COLON = re.compile(r"(?<!\\):")
PROMPT_HELP = "a prompt is text:weight:stop, e.g. 'a red fox:1.5' or 'blurry:-0.5' (write \\: for a colon in the text)"


@dataclass(frozen=True)
class PromptSpec:
    text: str  # a text, or the path of an image prompt
    weight: float = 1.0
    stop: float = float("-inf")  # stop pulling once this prompt's loss is below it


def _number(field_name: str, item: str, part: str, what: str) -> float:
    try:
        value = float(part)
    except ValueError:
        raise InvalidRequest(field_name, item, f"the {what} {part.strip()!r} is not a number; {PROMPT_HELP}") from None
    if math.isnan(value):
        raise InvalidRequest(field_name, item, f"the {what} is NaN; {PROMPT_HELP}")
    return value


def split_prompt(item: str, field_name: str = "prompt") -> PromptSpec:
    """``text[:weight[:stop]]``. Only trailing parts that are numbers count as weight/stop, so
    ``at 3:30 pm`` stays text; a trailing part that looks like a broken number (``1.5.2``) is an error."""
    parts = _SPLIT_COLON.split(item)
    numbers: list[str] = []
    while len(parts) > 1 and len(numbers) < 2:
        last = parts[-1]
        if _PLAIN_NUMBER.match(last):
            numbers.insert(0, parts.pop())
        elif _NUMBERISH.match(last):
            _number(field_name, item, last, "weight" if numbers else "value")
        else:
            break
    text = ":".join(parts).replace("\\:", ":").strip()
    if not text:
        if len(numbers) == 2:  # "1:2": a text "1" with weight 2 rather than nothing at all
            text, numbers = numbers[0].strip(), numbers[1:]
        else:
            raise InvalidRequest(field_name, item, f"the prompt text is empty; {PROMPT_HELP}")
    weight, stop = 1.0, float("-inf")
    if numbers:
        weight = _number(field_name, item, numbers[0], "weight")
        if math.isinf(weight) or weight == 0 or abs(weight) > MAX_WEIGHT:
            raise InvalidRequest(field_name, item, f"the weight {numbers[0].strip()!r} must be a non-zero number from "
                                                   f"-{MAX_WEIGHT:g} to {MAX_WEIGHT:g} (negative: push away from it)")
    if len(numbers) == 2:
        stop = _number(field_name, item, numbers[1], "stop")
        if stop == float("inf"):
            raise InvalidRequest(field_name, item, "the stop 'inf' would never let this prompt pull; use a number "
                                                   "or -inf (never stop)")
    return PromptSpec(text, weight, stop)


def parse_prompts(text: str, field_name: str = "prompt") -> list[PromptSpec]:
    """``a:1|b:-0.5:0.9`` -> PromptSpecs; an empty item between two ``|`` is an error."""
    if not text.strip():
        return []
    items = text.split("|")
    specs = []
    for item in items:
        if not item.strip():
            raise InvalidRequest(field_name, text, "an empty prompt between '|' separators; remove the extra '|'")
        specs.append(split_prompt(item.strip(), field_name))
    return specs


def _as_tuple(field_name: str, value: Any) -> tuple[str, ...]:
    """A list of strings, or one string separated by '|' (the CLI and prompt files)."""
    if value is None or value == "":
        return ()
    if isinstance(value, str):
        return tuple(v.strip() for v in value.split("|") if v.strip())
    if isinstance(value, (list, tuple)) and all(isinstance(v, str) for v in value):
        return tuple(v.strip() for v in value if v.strip())
    raise InvalidRequest(field_name, value, "give a list of texts or one text separated by '|'")


def _image_file(field_name: str, item: str, path_text: str) -> str:
    path = Path(path_text).expanduser()
    if not path.is_file():
        raise InvalidRequest(field_name, item, "no such image file")
    try:
        from PIL import Image

        with Image.open(path) as im:
            im.verify()
    except Exception as exc:  # noqa: BLE001 - any reason Pillow gives is "not an image we can read"
        raise InvalidRequest(field_name, item, f"not a readable image ({type(exc).__name__})") from None
    return str(path)


def _choice(field_name: str, value: Any, allowed: tuple[str, ...]) -> str:
    if isinstance(value, str):
        for name in allowed:
            if name.lower() == value.strip().lower():
                return name
    raise InvalidRequest(field_name, value, "use one of " + ", ".join(allowed))




def _spec(field_name: str, value: Any) -> str:
    if not isinstance(value, str) or not value.strip():
        raise InvalidRequest(field_name, value, "give tiny, a hub id, a local folder or a file")
    return value.strip()


@dataclass(frozen=True)
class VqganRequest:
    """One VQGAN-CLIP job. Defaults follow nerdyrodent/VQGAN-CLIP's generate.py."""

    prompt: str = ""  # text prompts: "text:weight:stop|text:weight:stop"
    image_prompts: tuple[str, ...] = ()  # "path[:weight[:stop]]"
    init_image: str | None = None
    init_weight: float = 0.0  # pull z towards the init image's codes (0: only a starting point)
    init_noise: str = "none"  # none | pixels | gradient (without an init image)
    width: int = 512
    height: int = 512
    iterations: int = 500
    save_every: int = 50  # progress image every N iterations (0: only the final image)
    cutn: int = 32  # cutouts per iteration
    cut_pow: float = 1.0  # >1: smaller cutouts (details), <1: larger ones (composition)
    lr: float = 0.1
    optimizer: str = "Adam"
    augments: tuple[str, ...] = DEFAULT_AUGMENTS
    seed: int = -1  # -1: random; the seed used is recorded
    batch_size: int = 1  # images, one after another, with seeds seed, seed+1, ...
    vqgan: str = "tiny"  # tiny, a diffusers VQModel folder or hub id, or a taming .ckpt (+ .yaml)
    vqgan_config: str | None = None  # the taming .yaml, when it is not beside the .ckpt
    clip: str = "tiny"  # tiny, a CLIP hub id or folder, or an OpenAI name such as ViT-B/32
    video: bool = False  # a progress video beside the final image (mp4 with PyAV, else animated WebP)
    outdir: str | None = None
    preset: str | None = None
    extra: dict = field(default_factory=dict)

    def validated(self) -> "VqganRequest":
        prompt = clean_prompt("prompt", self.prompt)
        texts = parse_prompts(prompt)
        images = _as_tuple("image prompt", self.image_prompts)
        for item in images:
            spec = split_prompt(item, "image prompt")
            _image_file("image prompt", item, spec.text)
        if not texts and not images:
            raise InvalidRequest("prompt", self.prompt, "give a text prompt or an image prompt: VQGAN-CLIP needs "
                                                        "something to steer towards")
        if len(texts) + len(images) > MAX_PROMPTS:
            raise InvalidRequest("prompt", f"<{len(texts) + len(images)} prompts>",
                                 f"at most {MAX_PROMPTS} text and image prompts together")
        init = None
        if self.init_image not in (None, ""):
            if not isinstance(self.init_image, str):
                raise InvalidRequest("init image", self.init_image, "give the path of an image file")
            init = _image_file("init image", self.init_image, self.init_image)
        iterations = as_int("iterations", self.iterations, 1, MAX_ITERATIONS)
        none = isinstance(self.augments, str) and self.augments.strip().lower() == "none"
        augments = () if none else _as_tuple("augments", self.augments)
        for a in augments:
            if a not in AUGMENTS:
                raise InvalidRequest("augments", a, "use codes from "
                                     + ", ".join(f"{k} ({v})" for k, v in AUGMENTS.items()))
        return dataclasses.replace(
            self,
            prompt=prompt,
            image_prompts=images,
            init_image=init,
            init_weight=as_float("init weight", self.init_weight, 0.0, MAX_INIT_WEIGHT),
            init_noise=_choice("init noise", self.init_noise, INIT_NOISE),
            width=as_side("width", self.width, multiple=16),
            height=as_side("height", self.height, multiple=16),
            iterations=iterations,
            save_every=as_int("save every", self.save_every, 0, MAX_ITERATIONS, " (0: only the final image)"),
            cutn=as_int("cutn", self.cutn, 1, MAX_CUTN),
            cut_pow=_positive("cut power", self.cut_pow, MAX_CUT_POW),
            lr=_positive("learning rate", self.lr, MAX_LR),
            optimizer=_choice("optimizer", self.optimizer, OPTIMIZERS),
            augments=tuple(dict.fromkeys(augments)),
            seed=as_int("seed", self.seed, -1, MAX_SEED, " (-1 means random)"),
            batch_size=as_int("batch size", self.batch_size, 1, MAX_BATCH),
            vqgan=_spec("vqgan", self.vqgan),
            vqgan_config=_spec("vqgan config", self.vqgan_config) if self.vqgan_config else None,
            clip=_spec("clip", self.clip),
            video=as_bool("video", self.video),
            preset=self.preset or None,
        )

    def text_prompts(self) -> list[PromptSpec]:
        return parse_prompts(self.prompt)

    def image_prompt_specs(self) -> list[PromptSpec]:
        return [split_prompt(item, "image prompt") for item in self.image_prompts]

    def resolved_seeds(self) -> list[int]:
        base = self.seed if self.seed >= 0 else random.SystemRandom().randrange(0, MAX_SEED + 1)
        return [(base + i) % (MAX_SEED + 1) for i in range(self.batch_size)]

    @property
    def model_name(self) -> str:
        """One name for logs, metadata and the remembered failures."""
        if self.vqgan in TINY_SPECS and self.clip in TINY_SPECS:
            return "tiny-vqgan-clip"
        return f"{self.vqgan}+{self.clip}"

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any]) -> "VqganRequest":
        """From a dict (JSON line, form fields); unknown keys are an error naming the allowed ones."""
        names = {f.name for f in dataclasses.fields(cls)}
        aliases = {"image_prompt": "image_prompts", "cuts": "cutn", "num_cuts": "cutn", "cut_power": "cut_pow",
                   "learning_rate": "lr", "step_size": "lr", "max_iterations": "iterations",
                   "display_freq": "save_every",
                   "vqgan_checkpoint": "vqgan", "clip_model": "clip", "batch": "batch_size"}
        kwargs: dict[str, Any] = {}
        for key, value in data.items():
            name = aliases.get(key, key)
            if name not in names or name == "extra" and not isinstance(value, dict):
                raise InvalidRequest("field", key, "allowed fields: " + ", ".join(sorted(names - {"outdir"})))
            if name in kwargs:
                raise InvalidRequest("field", key, f"{name!r} is given twice")
            kwargs[name] = value
        return cls(**kwargs).validated()

    @classmethod
    def from_batch_fields(cls, fields: Mapping[str, Any]) -> "VqganRequest":
        """A prompt-file line with engine 'vqgan' (the batch command's own defaults merged in).

        Text prompt files and CSV columns only know the txt2img field names, so ``steps`` means
        iterations and a negative prompt becomes a prompt with weight -1; ``cfg_scale``, ``sampler``,
        ``clip_skip``, the variation seed fields, ``model`` and ``config`` belong to Stable Diffusion and do not apply
        to VQGAN-CLIP.
        """
        data = {k: v for k, v in fields.items()
                if k not in ("cfg_scale", "sampler", "schedule_type", "clip_skip", "subseed", "subseed_strength",
                             "seed_resize_from", "seed_resize_from_w", "seed_resize_from_h", "model", "config")}
        steps = data.pop("steps", None)
        if steps is not None and "iterations" not in data and "max_iterations" not in data:
            data["iterations"] = steps
        negative = data.pop("negative_prompt", None)
        if isinstance(negative, str) and negative.strip():
            prompt = data.get("prompt") or ""
            data["prompt"] = "|".join(p for p in (str(prompt).strip(), f"{negative.strip()}:-1") if p)
        return cls.from_mapping(data)


def _positive(field_name: str, value: Any, hi: float) -> float:
    allowed = f"a number above 0 and at most {hi:g}"
    try:
        number = as_float(field_name, value, 0.0, hi)
    except InvalidRequest:
        raise InvalidRequest(field_name, value, allowed) from None
    if number <= 0:
        raise InvalidRequest(field_name, value, allowed)
    return number
