"""Prompt files for `lowvram-gen batch`: read .txt / .jsonl / .csv into jobs, one bad line at a time.

A line that cannot become a valid request is reported with its line number and skipped; the
others run (docs/FAULTS.md 26). Everything here is standard library plus `request.py` and the listing of
the LoRA and embedding folders (`networks/names.py`: a line naming a LoRA that is not there is a bad line
too): a whole file is checked before any model is loaded, and `--dry-run` needs no torch.

Formats:

* ``.txt``: one prompt per line; blank lines and lines starting with ``#`` are ignored. A line
  starting with ``--`` holds A1111 "prompts from file" options, split with shlex:
  ``--prompt "a cat" --negative_prompt "blurry" --steps 30 --seed 5 --sampler_name "DPM++ 2M Karras"``;
  ``--image IMG`` (repeatable) makes the line an edit of those reference images (an editing model's).
* ``.jsonl``: one JSON object per line with request fields, plus ``engine`` (``sd`` or ``vqgan``)
  and ``repeat``; ``controlnets`` is a list of unit objects (a1111/controlnet_units.py: A1111's extension keys too, and its
  API's ``alwayson_scripts``).
* ``.csv``: a header row of request fields; empty cells take the command line's value.

Video (issue 33): a line with ``video: true`` (``--video true`` on a .txt line, a ``video`` column) or a ``frames``
field is a video job (engine ``video``): a clip made by the same Session as ``lowvram-gen video`` makes it, with the
video options ``frames`` (0 or left out: the model's own count), ``fps``, ``cfg_scale_2``, ``init_image`` (its first
frame: image-to-video), ``save_frames`` and ``allow_upscale``.

Job identity (for resume): the hash of the validated request (engine, prompt, size, steps, seed,
sampler, model, ...; not the output folder) plus how many identical requests came before it in the
file, so two identical lines with random seeds are two jobs, and inserting a comment or reordering
lines does not redo anything.
"""

from __future__ import annotations

import csv
import dataclasses
import hashlib
import json
import shlex
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from lowvram_gen import safe_json
from lowvram_gen.a1111.controlnet_units import with_units
from lowvram_gen.a1111.fields import ALIASES as A1111_ALIASES
from lowvram_gen.a1111.fields import BATCH_ONLY, BY_NAME, NOT_BUILT, line_fields
from lowvram_gen.a1111.unipc_options import DEFAULTS as UNIPC_DEFAULTS
from lowvram_gen.engines.vqgan.request import VqganRequest
from lowvram_gen.errors import InvalidRequest, LowVramError
from lowvram_gen.networks.names import Names
from lowvram_gen.request import MAX_SEED, GenerationRequest, as_bool, as_int
from lowvram_gen.samplers import split_sampler
from lowvram_gen.schedules import AUTOMATIC, label

FORMATS = {".txt": "txt", ".prompts": "txt", ".jsonl": "jsonl", ".ndjson": "jsonl", ".csv": "csv"}
MAX_REPEAT = 10_000  # per line; bounds what a typo can queue

# Field aliases accepted in every format: A1111's names (a1111/fields.py: its options and API fields)
ALIASES = {**A1111_ALIASES, **BATCH_ONLY}
# seed_resize_from and hires_resize: "WxH", both sides at once (GenerationRequest.from_mapping)
REQUEST_FIELDS = frozenset(f.name for f in dataclasses.fields(GenerationRequest)) | {"seed_resize_from",
                                                                                      "hires_resize"}
# options of a .txt line that take every word up to the next --option, as A1111 reads --prompt
PROMPT_OPTIONS = tuple(name for f in ("prompt", "negative_prompt", "hires_prompt", "hires_negative")
                       for name in (f, *BY_NAME[f].aliases))
# a .txt line's edit reference images (`lowvram-gen edit`'s --image), each option one image, repeatable
EDIT_IMAGE_OPTIONS = ("image", "reference_images")
BATCH_FIELDS = frozenset({"engine", "repeat"})  # per line, not part of a GenerationRequest
# the engine of a video line, and the line's field that makes one (`video: true`; or a `frames` field); on a
# VQGAN-CLIP line `video` is its own (the progress video)
VIDEO = "video"
# what a line may name: the request's fields, the batch's, their aliases, and A1111's that are not built here
# (a1111/fields.py NOT_BUILT: accepted with a warning, or refused, by each one's policy)
LINE_NAMES = (REQUEST_FIELDS | BATCH_FIELDS | {VIDEO} | set(ALIASES) | set(NOT_BUILT)) - {"extra", "outdir"}
SHOWN_NAMES = sorted(LINE_NAMES - set(NOT_BUILT))  # what an unknown name's error lists


class BatchError(LowVramError):
    """The batch cannot start (no such file, unknown format, bad CSV header, folder in use)."""

    exit_code = 2


@dataclass
class Entry:
    """One non-blank line (or CSV row) of a prompt file: its fields, or why it is malformed."""

    line: int
    fields: dict | None = None
    error: str | None = None
    warnings: list[str] = field(default_factory=list)


@dataclass
class Job:
    line: int
    repeat: int  # 0..n-1 among the repeats of its line
    engine: str
    request: Any  # GenerationRequest for 'sd'
    request_hash: str
    key: str  # request_hash:occurrence, unique in the file; what the manifest records


@dataclass
class BadLine:
    line: int
    error: str


@dataclass
class JobList:
    jobs: list[Job]
    bad: list[BadLine]
    warnings: list[str]


# ------------------------------------------------------------------------------------ engines


def _build_sd(fields: dict) -> GenerationRequest:
    try:
        return GenerationRequest.from_mapping(with_units(fields))  # ControlNet units, A1111's API keys too
    except InvalidRequest as exc:
        raise _with_every_field(exc) from None


def _build_vqgan(fields: dict):
    # VQGAN-CLIP: `steps` means iterations, a negative prompt becomes a prompt with weight -1, and the
    # SD-only fields (cfg_scale, sampler, model, config) do not apply (engines/vqgan_request.py). No torch.
    try:
        return VqganRequest.from_batch_fields(fields)
    except InvalidRequest as exc:
        raise _with_every_field(exc) from None


def _with_every_field(exc: InvalidRequest) -> InvalidRequest:
    """An unknown key on a line gets both engines' fields, labelled; other errors pass unchanged.

    The usual mistake is a VQGAN-CLIP field on a line without "engine": "vqgan" (or an SD field on
    a vqgan line), and each request type alone would only list its own fields.
    """
    if exc.field != "field" or not exc.allowed.startswith("allowed fields"):
        return exc
    not_per_line = {"extra", "outdir"}  # extra is kept for the app; the output folder is the batch's
    sd = sorted(REQUEST_FIELDS - not_per_line | {VIDEO})
    vqgan = sorted({f.name for f in dataclasses.fields(VqganRequest)} - not_per_line | {"steps", "negative_prompt"})
    return InvalidRequest("field", exc.value, f"Stable Diffusion lines take {', '.join(sd)}; "
                                              f'"engine": "vqgan" lines take {", ".join(vqgan)}; '
                                              f"every line takes {', '.join(sorted(BATCH_FIELDS))}")


def _build_video(fields: dict) -> GenerationRequest:
    """A video line's request: frames 0 (the model's own count) where the line gives none."""
    return _build_sd({**fields, "frames": fields.get("frames", 0)})


ENGINES: dict[str, Callable[[dict], Any]] = {"sd": _build_sd, "vqgan": _build_vqgan, VIDEO: _build_video}


def line_engine(fields: dict) -> str:
    """The engine of a line's fields (taking out its `engine`, and its `video` but on a VQGAN-CLIP line, where
    `video` is the progress video beside the image): `video` for `video: true` or a `frames` field, else its
    `engine` (sd by default); a contradiction is one sentence naming the field."""
    engine = fields.pop("engine", "sd")
    if not isinstance(engine, str) or engine.strip().lower() not in ENGINES:
        raise InvalidRequest("engine", engine, "use 'sd' (Stable Diffusion), 'vqgan' (VQGAN-CLIP) or 'video' "
                                               "(a clip)")
    engine = engine.strip().lower()
    if engine == "vqgan":
        if "frames" in fields:
            raise InvalidRequest("frames", fields["frames"], "VQGAN-CLIP makes images (its `video` is a progress "
                                                             "video): leave engine out for a video model's clip")
        return engine
    video = as_bool("video", fields.pop("video")) if "video" in fields else None
    if video is False and (engine == VIDEO or "frames" in fields):
        raise InvalidRequest("video", False, "this line gives frames (or engine video): leave video out or make it "
                                             "true")
    return VIDEO if video or "frames" in fields else engine


def request_hash(engine: str, request) -> str:
    """A stable hash of what a job makes: every request field but the output folder and extras."""
    data = dataclasses.asdict(request)
    data.pop("outdir", None)
    data.pop("extra", None)
    # steps and CFG left out (None: the model family's, filled in when the job runs) hash as the numbers a line
    # without them had before families had defaults (A1111's 20 / 7), so an SD line keeps its hash and its resume
    if "cfg_scale" in data:
        data["steps"] = 20 if data.get("steps") is None else data["steps"]
        data["cfg_scale"] = 7.0 if data.get("cfg_scale") is None else data["cfg_scale"]
    if data.get("batch_count") == 1:  # added later: a job of one batch keeps the hash it had
        data.pop("batch_count", None)
    if data.get("quantize") is None:  # added later: requests without it keep the hashes they had
        data.pop("quantize", None)
    schedule = data.pop("schedule_type", AUTOMATIC)  # added later too: a line's 'DPM++ 2M Karras' keeps its hash
    if schedule != AUTOMATIC and f"{data['sampler']} {label(schedule)}" in _COMBINED:
        data["sampler"] = f"{data['sampler']} {label(schedule)}"
    elif schedule != AUTOMATIC:
        data["schedule_type"] = schedule
    if data.get("clip_skip") == 1:  # likewise
        data.pop("clip_skip", None)
    if data.get("vae") == "Automatic":  # the VAE selector, added later: a job with the model's own keeps its hash
        data.pop("vae", None)
    for name, off in (("subseed", -1), ("subseed_strength", 0.0), ("seed_resize_from_w", 0), ("seed_resize_from_h", 0),
                      ("hires_resize_w", 0), ("hires_resize_h", 0), ("hires_sampler", ""),
                      ("hires_schedule_type", ""), ("hires_cfg", 0.0), ("hires_prompt", ""), ("hires_negative", ""),
                      ("rng", "gpu"), ("ensd", 0), ("tiling", False), ("styles", ()), ("refiner", None),
                      ("refiner_switch_at", 0.8), ("filename_pattern", ""), *UNIPC_DEFAULTS.items()):
        if data.get(name) == off:  # variation seed, hires, RNG, ENSD, tiling, styles, refiner, file name pattern,
            data.pop(name, None)  # UniPC: added later; off, the hash stays
    if data.get("hires_upscaler") in _OLD_UPSCALER:  # A1111's spelling now: a line's job keeps its hash
        data["hires_upscaler"] = _OLD_UPSCALER[data["hires_upscaler"]]
    if not data.get("controlnets"):  # ControlNet, added later: a job without it keeps its hash
        data.pop("controlnets", None)
    for unit in data.get("controlnets") or ():  # a unit's resize mode, added later: Just Resize keeps the hash
        if unit.get("resize_mode") == "resize":
            unit.pop("resize_mode")
    if data.get("resize_mode") == "resize":  # img2img's resize mode, added later: Just resize keeps the hash
        data.pop("resize_mode", None)
    if data.get("control_mode") == "balanced":
        data.pop("control_mode", None)
    if data.get("mask") is None:  # inpainting, added later: a job without a mask keeps its hash
        for name in ("mask", "mask_blur", "inpaint_area", "mask_padding", "masked_content", "invert_mask",
                     "mask_round"):
            data.pop(name, None)
    if data.get("mask_round") is True:  # A1111's mask_round, added later: on (its default), the hash stays
        data.pop("mask_round")
    if not data.get("reference_images"):  # edit, added later: a job without reference images keeps its hash
        data.pop("reference_images", None)
    if not data.get("img2img_fix_steps"):  # A1111's img2img_fix_steps, added later: off, the hash stays
        data.pop("img2img_fix_steps", None)
    for name, off in (("frames", None), ("fps", None), ("cfg_scale_2", None), ("save_frames", False),
                      ("allow_upscale", False)):  # video, added later: an image job keeps its hash
        if name in data and data[name] == off:
            data.pop(name)
    text = json.dumps({"engine": engine, **data}, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


# the sampler names that held their schedule type before requests had schedule_type
_COMBINED = frozenset({"LMS Karras", "DPM++ 2M Karras", "DPM++ 2M SDE Karras"})
# the built-in upscalers' names as requests spelt them before A1111's spellings
_OLD_UPSCALER = {"Latent": "latent", "Lanczos": "lanczos"}


def _merged(defaults: dict, fields: dict) -> dict:
    """A line's fields over the command line's; a line's combined sampler name ('DPM++ 2M Karras') wins over
    --schedule-type, and a line's schedule type over the one in --sampler's name, as on the generate command line."""
    merged = {**defaults, **fields}
    if "sampler" in fields and "schedule_type" not in fields and "schedule_type" in defaults:
        merged["schedule_type"] = split_sampler(fields["sampler"])[1] or defaults["schedule_type"]
    if "schedule_type" in fields and "sampler" not in fields and "sampler" in defaults:
        merged["sampler"] = split_sampler(defaults["sampler"])[0]
    return merged


# ------------------------------------------------------------------------------------ reading


def detect_format(path: Path, fmt: str | None = None) -> str:
    if fmt:
        return fmt
    found = FORMATS.get(path.suffix.lower())
    if not found:
        raise BatchError(f"unknown prompt file type {path.suffix or '(none)'!r} for {path}; use .txt, .jsonl or "
                         f".csv, or name the format with --format txt|jsonl|csv")
    return found


def read_entries(path: str | Path, fmt: str | None = None) -> list[Entry]:
    path = Path(path)
    fmt = detect_format(path, fmt)
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise BatchError(f"cannot read the prompt file {path}: {exc.strerror or exc}") from exc
    lines: list[tuple[int, str | None]] = []  # (line number, text or None when not UTF-8)
    for number, raw in enumerate(data.split(b"\n"), start=1):
        if number == 1 and raw.startswith(b"\xef\xbb\xbf"):
            raw = raw[3:]  # a UTF-8 byte order mark (Excel, Notepad)
        raw = raw[:-1] if raw.endswith(b"\r") else raw
        try:
            lines.append((number, raw.decode("utf-8")))
        except UnicodeDecodeError:
            lines.append((number, None))
    return {"txt": _read_txt, "jsonl": _read_jsonl, "csv": _read_csv}[fmt](lines)


_NOT_UTF8 = "not valid UTF-8 text; save the file as UTF-8"


def _read_txt(lines) -> list[Entry]:
    entries = []
    for number, text in lines:
        if text is None:
            entries.append(Entry(number, error=_NOT_UTF8))
            continue
        stripped = text.strip()
        if not stripped or stripped.startswith("#"):
            continue
        if stripped.startswith("--"):
            try:
                fields, warnings = parse_options(stripped)
            except ValueError as exc:
                entries.append(Entry(number, error=str(exc)))
            else:
                entries.append(Entry(number, fields=fields, warnings=warnings))
        else:
            entries.append(Entry(number, fields={"prompt": stripped}))
    return entries


def parse_options(text: str) -> tuple[dict, list[str]]:
    """A1111's per-line options: ``--name value``; ``--prompt`` and ``--negative_prompt`` take every
    word up to the next ``--`` option (as A1111 does); ``--name=value`` works too."""
    try:
        words = shlex.split(text)
    except ValueError as exc:
        raise ValueError(f"cannot split the options ({exc}); check the quotes") from None
    fields: dict[str, str] = {}
    warnings: list[str] = []
    pos = 0
    while pos < len(words):
        word = words[pos]
        if not word.startswith("--") or len(word) == 2:
            raise ValueError(f"expected an option like --steps, got {word!r}")
        name, eq, value = word[2:].partition("=")
        name = name.replace("-", "_").lower()
        values = [value] if eq else []
        pos += 1
        if name in PROMPT_OPTIONS:
            while pos < len(words) and not words[pos].startswith("--"):
                values.append(words[pos])
                pos += 1
        elif not eq:
            if pos >= len(words):
                raise ValueError(f"option --{name} needs a value")
            values.append(words[pos])
            pos += 1
        if not values:
            raise ValueError(f"option --{name} needs a value")
        if name in EDIT_IMAGE_OPTIONS:  # an edit's reference images: repeatable, as the edit command's --image
            fields.setdefault("reference_images", []).append(" ".join(values))
            continue
        if name not in LINE_NAMES and name != "outdir":
            raise ValueError(f"unknown option --{name}; allowed: " + ", ".join("--" + a for a in SHOWN_NAMES))
        try:
            canonical = line_fields({name: " ".join(values)}, warnings)  # A1111's not built: warned or refused
        except InvalidRequest as exc:
            raise ValueError(str(exc)) from None
        for key, value in canonical.items():
            if key in fields:
                raise ValueError(f"option --{name} is given twice")
            fields[key] = value
    return fields, warnings


def _read_jsonl(lines) -> list[Entry]:
    entries = []
    for number, text in lines:
        if text is None:
            entries.append(Entry(number, error=_NOT_UTF8))
            continue
        if not text.strip() or text.lstrip().startswith("#"):
            continue
        try:
            obj = safe_json.loads(text, what=f"line {number}")
        except safe_json.BadJson as exc:  # nested too deep fails this line, not the batch (no RecursionError)
            entries.append(Entry(number, error=exc.problem))
            continue
        if not isinstance(obj, dict):
            entries.append(Entry(number, error=f"expected a JSON object {{...}}, got {type(obj).__name__}"))
            continue
        entries.append(Entry(number, fields={k: v for k, v in obj.items() if v is not None}))
    return entries


def _header_name(cell: str) -> str:
    return cell.strip().lower().replace(" ", "_").replace("-", "_")


def _read_csv(lines) -> list[Entry]:
    entries: list[Entry] = []
    good: list[str] = []
    numbers: list[int] = []
    for number, text in lines:
        if text is None:
            entries.append(Entry(number, error=_NOT_UTF8))
        else:
            good.append(text + "\n")  # csv joins a quoted cell's lines with what ends them
            numbers.append(number)
    reader = csv.reader(good)
    header: list[str] | None = None
    while True:
        start = numbers[reader.line_num] if reader.line_num < len(numbers) else None
        try:
            row = next(reader)
        except StopIteration:
            break
        except csv.Error as exc:
            entries.append(Entry(start or 0, error=f"malformed CSV ({exc})"))
            continue
        if not any(cell.strip() for cell in row):
            continue
        if header is None:
            header = [_header_name(c) for c in row]
            bad = [h for h in header if h not in LINE_NAMES]
            if bad or len(set(header)) != len(header):
                why = f"unknown column(s) {', '.join(map(repr, bad))}" if bad else "a column is named twice"
                raise BatchError(f"CSV header on line {start}: {why}; columns may be: {', '.join(SHOWN_NAMES)}")
            continue
        if len(row) > len(header):
            entries.append(Entry(start, error=f"{len(row)} cells but the header has {len(header)} columns"))
            continue
        fields = {name: cell.strip() for name, cell in zip(header, row) if cell.strip()}
        entries.append(Entry(start, fields=fields))
    entries.sort(key=lambda e: e.line)
    return entries


# ---------------------------------------------------------------------------------- expanding


def normalise_fields(fields: dict, warnings: list[str] | None = None) -> dict:
    """A line's fields by the request's names (a1111/fields.py line_fields: aliases, and A1111's fields that are not
    built here warned about in `warnings` or refused, by their policy)."""
    return line_fields(fields, [] if warnings is None else warnings)


def expand(entries: list[Entry], defaults: dict, repeat: int = 1, seed_start: int | None = None,
           styles=None) -> JobList:
    """Turn entries into jobs: line fields over the command line's `defaults`, `repeat` copies
    each (a line's own ``repeat``/``n_iter`` wins), seeds as described in the README. `styles`: the styles file
    (prompting/styles.StylesFile), read when a line names a style: an unknown one makes a bad line."""
    jobs: list[Job] = []
    bad: list[BadLine] = []
    warnings: list[str] = []
    seen: Counter = Counter()
    counter = seed_start
    default_batch = int(defaults.get("batch_size", 1))
    names = Names()  # the LoRA and embedding folders, listed once for the whole file
    for entry in entries:
        warnings.extend(f"line {entry.line}: {w}" for w in entry.warnings)
        if entry.error is not None:
            bad.append(BadLine(entry.line, entry.error))
            if counter is not None:  # keep later seeds stable when this line gets fixed
                counter += repeat * default_batch
            continue
        try:
            said: list[str] = []
            fields = normalise_fields(entry.fields or {}, said)
            warnings.extend(f"line {entry.line}: {w}" for w in said)
            engine = line_engine(fields)
            copies = as_int("repeat", fields.pop("repeat"), 1, MAX_REPEAT) if "repeat" in fields else repeat
            if "outdir" in fields:
                raise InvalidRequest("outdir", fields["outdir"], "the output folder is set for the whole batch "
                                                                 "with --outdir")
            extra = fields.get("extra", {})
            if not isinstance(extra, dict):
                raise InvalidRequest("extra", extra, "extra must be a JSON object")
            base = ENGINES[engine](_merged(defaults, fields) if engine != "vqgan" else {**defaults, **fields})
            if engine != "vqgan":  # an unknown LoRA is a bad line like any other, found by --dry-run too
                names.check(base.prompt, base.negative_prompt, base.loras)
                if base.hires:
                    names.check(*base.hires_texts)
                if base.styles and styles is not None:
                    styles.book().check(base.styles)
        except LowVramError as exc:
            bad.append(BadLine(entry.line, str(exc)))
            if counter is not None:
                counter += repeat * default_batch
            continue
        seed_given = "seed" in fields or "seed" in defaults
        batch = getattr(base, "image_count", base.batch_size)  # Stable Diffusion: batch count x batch size
        for r in range(copies):
            if seed_given:
                seed = base.seed if base.seed < 0 else (base.seed + r * batch) % (MAX_SEED + 1)
            elif counter is not None:
                seed = counter % (MAX_SEED + 1)
                counter += batch
            else:
                seed = -1
            request = dataclasses.replace(base, seed=seed)
            digest = request_hash(engine, request)
            key = f"{digest}:{seen[digest]}"
            seen[digest] += 1
            request = dataclasses.replace(request, extra={**request.extra, "batch_job": key})
            jobs.append(Job(entry.line, r, engine, request, digest, key))
    return JobList(jobs, bad, warnings)
