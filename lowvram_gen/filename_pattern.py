"""A1111's "Images filename pattern" (`samples_filename_pattern`): the part of a saved image's name after its counter,
written with `[tag]`s (`[seed]-[prompt_words]`, `[model_name]-[steps]-[cfg]`, `[datetime<%Y%m%d>]`...).

The rules are A1111's (modules/images.py FilenameGenerator), written from their description:

* A name is `{counter:05d}-{decoration}.png`, the decoration being the pattern with each `[tag]` replaced by its
  value; an empty pattern keeps today's names (`{counter}-{seed}-{prompt slug}`: outputs.next_image_path), and a
  pattern whose values all come out empty too (so the counter never stands alone, which the numbering could not read
  back).
* `[prompt]` is the prompt's words joined by `_`, `[prompt_spaces]` joined by spaces, `[prompt_words]` its first 30
  words joined by spaces (A1111's cap); `[prompt_hash]` the first 8 hex digits of its sha256.
* `[datetime]` is `%Y%m%d%H%M%S`, `[datetime<FORMAT>]` takes a strftime format; `[date]` is `%Y-%m-%d`.
* `[batch_number]` is the image's place in its batch and `[generation_number]` in the job (1-based), both empty
  for a job of one image (A1111 leaves them out there).
* An unknown `[tag]` is refused naming it and the allowed ones (A1111 would write it into the name as typed).

Every value, and the pattern's own text, goes through the same whitelist as our prompt slugs (outputs.safe_slug:
letters, digits, and `-`, `_`, `.`, space, `,`, `(`, `)`, `+`, `=`, `@` between them), so a prompt or a pattern
cannot name a folder, a device, or a character some system refuses; the decoration is cut to outputs' slug limit.
Only the standard library: the CLI checks a pattern before it imports torch.
"""

from __future__ import annotations

import hashlib
import re
from datetime import datetime
from pathlib import Path

from lowvram_gen.errors import InvalidRequest

MAX_PATTERN = 256  # characters of a pattern
PROMPT_WORDS = 30  # A1111's cap on [prompt_words]
DATETIME = "%Y%m%d%H%M%S"  # A1111's default_time_format
_TAG = re.compile(r"\[([^\[\]]*)\]")
_ARG = re.compile(r"^(\w+)((?:<[^<>]*>)*)$")
_LITERAL = re.compile(r"^[\w\- .,()+=@]*$")  # what the pattern's own text may hold
_STRFTIME = re.compile(r"^(?:%[aAbBdHjmMpSUwWyYzZ%]|[\w\- .,()+=@])*$")  # the strftime formats a name may hold

# tag -> what it is, in the words the error and the Settings tab show
TAGS = {
    "seed": "the image's seed", "steps": "steps", "cfg": "CFG scale", "width": "width", "height": "height",
    "sampler": "the sampler's name", "scheduler": "the schedule type", "clip_skip": "clip skip",
    "denoising": "denoising strength (img2img, inpaint)", "model_name": "the model's file or folder name",
    "prompt": "the prompt, words joined by _", "prompt_spaces": "the prompt, words joined by spaces",
    "prompt_words": f"the prompt's first {PROMPT_WORDS} words", "prompt_hash": "8 hex digits of the prompt's sha256",
    "negative_prompt": "the negative prompt, words joined by _",
    "date": "YYYY-MM-DD", "datetime": f"{DATETIME}, or [datetime<FORMAT>] with a strftime format",
    "job_timestamp": "the job's start, YYYYmmddHHMMSS",
    "batch_number": "the image's place in its batch (empty for batches of one)",
    "generation_number": "the image's place in the job (empty for a job of one image)",
    "none": "nothing (a pattern of [none] alone keeps today's names)",
}


def _allowed() -> str:
    return ", ".join(f"[{t}]" for t in TAGS)


def check_pattern(pattern, field: str = "filename pattern") -> str:
    """The pattern as typed ("" for None), or InvalidRequest naming an unknown tag (and the allowed ones), a
    character a file name may not hold, or a bad `[datetime<FORMAT>]`."""
    if pattern is None:
        return ""
    if not isinstance(pattern, str):
        raise InvalidRequest(field, pattern, f"a text such as [seed]-[prompt_words]; tags: {_allowed()}")
    if len(pattern) > MAX_PATTERN:
        raise InvalidRequest(field, pattern[:40] + "…", f"at most {MAX_PATTERN} characters")
    pos = 0
    for m in _TAG.finditer(pattern):
        _check_literal(pattern[pos:m.start()], pattern, field)
        pos = m.end()
        arg = _ARG.match(m.group(1))
        if arg is None or arg.group(1).lower() not in TAGS:
            raise InvalidRequest(field, pattern, f"unknown tag [{m.group(1)}]; allowed: {_allowed()}")
        args = re.findall(r"<([^<>]*)>", arg.group(2))
        if args and arg.group(1).lower() != "datetime":
            raise InvalidRequest(field, pattern, f"[{m.group(1)}]: only [datetime<FORMAT>] takes an argument")
        if len(args) > 1 or (args and not _STRFTIME.match(args[0])):
            raise InvalidRequest(field, pattern, f"[{m.group(1)}]: give one strftime format of %Y %m %d %H %M %S "
                                                 "(and -, _, space), e.g. [datetime<%Y%m%d-%H%M>]")
    _check_literal(pattern[pos:], pattern, field)
    return pattern


def _check_literal(text: str, pattern: str, field: str) -> None:
    if not _LITERAL.match(text):
        bad = next(c for c in text if not _LITERAL.match(c))
        raise InvalidRequest(field, pattern, f"{bad!r} cannot be in a file name here: use letters, digits, "
                                             "- _ . , ( ) + = @ and spaces between the [tags]")


def _words(text: str) -> list[str]:
    from lowvram_gen.outputs import safe_slug

    slug = safe_slug(text or "", 10_000)
    return [] if slug == "image" and "image" not in (text or "").lower() else slug.split("-")


def _number(value) -> str:
    if value is None:
        return ""
    if isinstance(value, float):
        return f"{value:g}"
    return str(value)


def values(request, seed: int | None, *, sampler: str = "", model_path: str | Path | None = None,
           index: int = 0, now: datetime | None = None, started: datetime | None = None) -> dict:
    """Each tag's value for the image `index` (0-based, in the job) of `request` made with `seed`; `model_path`: the
    checkpoint file that made it, where it is one."""
    now = now or datetime.now()
    words = _words(request.prompt)
    width, height = request.output_size() if hasattr(request, "output_size") else (request.width, request.height)
    per_batch = max(1, int(getattr(request, "batch_size", 1) or 1))
    total = per_batch * max(1, int(getattr(request, "batch_count", 1) or 1))
    edit = getattr(request, "init_image", None)
    return {
        "seed": _number(seed), "steps": _number(request.steps), "cfg": _number(request.cfg_scale),
        "width": str(width), "height": str(height), "sampler": sampler or request.sampler or "",
        "scheduler": getattr(request, "schedule_type", "") or "", "clip_skip": _number(request.clip_skip),
        "denoising": _number(request.strength) if edit else "",
        # a checkpoint file's stem, as A1111's; else the model as given (tiny, a folder's or a hub id's last part)
        "model_name": Path(str(model_path)).stem if model_path else Path(str(request.model or "")).name,
        "prompt": "_".join(words), "prompt_spaces": " ".join(words),
        "prompt_words": " ".join(words[:PROMPT_WORDS]),
        "prompt_hash": hashlib.sha256((request.prompt or "").encode()).hexdigest()[:8],
        "negative_prompt": "_".join(_words(request.negative_prompt)),
        "date": now.strftime("%Y-%m-%d"), "datetime": now.strftime(DATETIME),
        "job_timestamp": (started or now).strftime(DATETIME),
        "batch_number": "" if per_batch == 1 else str(index % per_batch + 1),
        "generation_number": "" if total == 1 else str(index + 1),
        "none": "",
    }


def _safe(text: str) -> str:
    """`text` with what the whitelist refuses replaced by `_` (values such as a sampler's `DPM++ 2M` or a model's
    file name keep their letters)."""
    return "".join(c if _LITERAL.match(c) else "_" for c in text)


def decoration(pattern: str, tag_values: dict) -> str:
    """The pattern with its tags replaced by `tag_values` (`values`), safe for a file name; "" when nothing is left
    (the caller keeps today's name then)."""
    pattern = check_pattern(pattern)

    def replace(m: re.Match) -> str:
        arg = _ARG.match(m.group(1))
        tag, args = arg.group(1).lower(), re.findall(r"<([^<>]*)>", arg.group(2))
        if tag == "datetime" and args and args[0]:
            return datetime.strptime(tag_values["datetime"], DATETIME).strftime(args[0])
        return tag_values[tag]

    out = _safe(_TAG.sub(replace, pattern))
    # no leading dot or dash (a hidden file, an option), no trailing dot or space (Windows drops them)
    out = out.lstrip(".- ").rstrip(". ")
    return out if any(c.isalnum() for c in out) else ""
