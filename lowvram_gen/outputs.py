"""Saving images: file names, atomic never-overwriting writes, A1111-compatible metadata.

Why it looks the way it does:

* Names follow AUTOMATIC1111 (``00012-1234-a-lighthouse-at-dusk.png`` in ``outputs/<date>/``) so
  people coming from it find their images where they expect, sorted in the order they were made.
* The prompt part of a name is built from a whitelist (letters, digits and their combining marks,
  joined by ``-``) rather than a blacklist: whatever is in the prompt (``../``, NUL, bidi overrides,
  emoji, ``CON``) cannot escape the folder or produce a name that Linux, macOS or Windows refuses.
  It is capped at 120 bytes so the whole name fits 143 bytes (eCryptfs) and Windows' 260-character
  paths have room for the folder.
* A PNG is first written to a hidden temporary file in the same folder and fsync'ed, then hard-linked
  under its final name. ``os.link`` fails if the name exists, so another process that took the same
  name in between is never overwritten (we take the next counter instead), and a crash or a full disk
  leaves at most a ``.*.tmp`` file, never a truncated PNG under a final name; the next image saved in
  that folder removes such a file once it is a minute old (a batch removes them all at its start).
* The ``parameters`` text chunk is A1111's, so existing viewers and parsers read our images; our own
  ``lowvram_gen`` chunk holds JSON (what tier ran, the retry log) for our tools.

Only the standard library and Pillow are imported: the CLI and the batch script import this module
before deciding whether to load torch at all.
"""

from __future__ import annotations

import errno
import json
import logging
import operator
import os
import re
import secrets
import time
import unicodedata
from datetime import date
from pathlib import Path
from typing import Callable, Iterable

from PIL import Image
from PIL.PngImagePlugin import PngInfo

from lowvram_gen.errors import OutputError
from lowvram_gen.safe_json import BadJson, loads as safe_loads

log = logging.getLogger(__name__)

NAME_MAX = 255  # bytes in one file name on ext4, APFS, NTFS (UTF-16 units <= UTF-8 bytes)
SLUG_MAX = 120  # default prompt part; see the module docstring
PARAMETERS_KEY = "parameters"  # A1111's PNG text chunk
METADATA_KEY = "lowvram_gen"  # ours, JSON

# Windows refuses these as a name's stem, whatever the case or extension (it also counts the
# superscript digits ¹²³ as digits here, and we keep those characters in slugs).
_WINDOWS_RESERVED = frozenset(
    {"CON", "PRN", "AUX", "NUL"}
    | {f"{dev}{n}" for dev in ("COM", "LPT") for n in "123456789\u00b9\u00b2\u00b3"}
)
# Letters that render as nothing: harmless to the file system but they make names that look alike.
_INVISIBLE = frozenset("\u034f\u115f\u1160\u3164\uffa0")
_APOSTROPHES = frozenset("'\u2019")  # "cat's" -> "cats", not "cat-s"
_COUNTER = re.compile(r"^(\d{5,})-(.+)$")  # 00012-..., and 100000-... after 99999 images
_EXT = re.compile(r"^[A-Za-z0-9]{1,16}$")
TEMP_NAME = re.compile(r"^\..+\.[0-9a-f]{12}\.tmp$")  # _write_temp's names: .<final name>.<12 hex>.tmp
STALE_TEMP_S = 60.0  # a temporary file untouched this long has no live writer (see is_stale_temp)
# Filesystems without hard links (FAT/exFAT sticks, some network shares) answer os.link with these.
_NO_HARDLINKS = frozenset(
    getattr(errno, name)
    for name in ("EPERM", "ENOTSUP", "EOPNOTSUPP", "EXDEV", "ENOSYS", "EINVAL", "EMLINK")
    if hasattr(errno, name)
)
_MAX_TRIES = 1000  # names tried before giving up on a folder that keeps filling up


# ---------------------------------------------------------------------------------------- names


def default_outdir(root: str | Path = "outputs", today: date | None = None) -> Path:
    """``<root>/<YYYY-MM-DD>/`` (local date), as A1111 does; not created here."""
    return Path(root) / (today or date.today()).isoformat()


def safe_slug(prompt: str, max_bytes: int = SLUG_MAX) -> str:
    """A file-name-safe slug of ``prompt``: lowercase words of letters/digits joined by ``-``.

    Everything that is not a letter, a digit or a combining mark after one (punctuation, path
    separators, control and format characters such as NUL or bidi overrides, emoji, lone
    surrogates) separates words, so the result never holds ``/ \\ : * ? " < > |``, dots or spaces.
    Letters of every script are kept (NFC), and the result is cut to ``max_bytes`` of UTF-8 on a
    character boundary. Windows device names get a ``_`` appended; nothing left gives ``"image"``.
    """
    if max_bytes < 1:
        raise ValueError(f"max_bytes must be at least 1, got {max_bytes}")
    text = unicodedata.normalize("NFC", str(prompt).lower())
    words: list[str] = []
    word: list[str] = []
    size = 0  # bytes so far; lets a 1 MB prompt stop early
    for ch in text:
        if ch in _APOSTROPHES:
            continue
        cat = unicodedata.category(ch)
        if ch not in _INVISIBLE and (cat[0] in "LN" or (cat[0] == "M" and word)):
            word.append(ch)
            size += len(ch.encode("utf-8"))
        elif word:
            words.append("".join(word))
            word = []
            size += 1  # the "-" that joins it to the next word
        if size > max_bytes:
            break
    if word:
        words.append("".join(word))
    slug = _cut_utf8("-".join(words), max_bytes).rstrip("-")
    if slug.upper() in _WINDOWS_RESERVED:
        slug = slug[: max_bytes - 1] + "_"  # reserved names are ASCII: slicing is by bytes
    return slug or _cut_utf8("image", max_bytes)


def next_image_path(outdir: str | Path, seed: int | None, prompt: str, ext: str = "png",
                    decoration: str = "") -> Path:
    """The next free A1111-style name in ``outdir``: ``{counter:05d}-{seed}-{slug}.{ext}``
    (``{counter:05d}-{slug}.{ext}`` for an image no seed made, such as an upscale), or
    ``{counter:05d}-{decoration}.{ext}`` where a file name pattern gave one (filename_pattern.py: already made of
    safe characters; cut here to the slug's limit).

    ``counter`` is one more than the highest counter prefix already in the folder (0 when there is
    none), so earlier files are never overwritten. Creates ``outdir``. The result is only a plan:
    another process may take the name before we write, which `save_png` handles.
    """
    folder = Path(outdir)
    ext = ext.lstrip(".")
    if not _EXT.match(ext):
        raise ValueError(f"invalid image extension {ext!r}: 1 to 16 ASCII letters or digits")
    seed_part = "" if seed is None else f"{operator.index(seed)}-"  # 1.5 or "7" is a caller bug, not to round
    try:
        folder.mkdir(parents=True, exist_ok=True)
        counter = _next_counter(folder)
    except OSError as exc:
        raise OutputError(_describe(folder, exc)) from exc
    fixed = len(f"{counter:05d}-{seed_part}.{ext}".encode()) + 2  # 2: room for the counter to grow
    if fixed >= NAME_MAX:
        raise ValueError(f"seed {seed} is too long for a file name")
    if decoration:
        return folder / f"{counter:05d}-{_cut_utf8(decoration, SLUG_MAX).rstrip('. ')}.{ext}"
    slug = safe_slug(prompt, min(SLUG_MAX, NAME_MAX - fixed))
    return folder / f"{counter:05d}-{seed_part}{slug}.{ext}"


def derived_name(source: str | Path, suffix: str) -> str:
    """The prompt part of a name for an image made from ``source`` (an upscale): the source's stem without
    its counter, then ``-suffix`` unless the stem already ends with it. ``00009-7-a-fox.png`` upscaled is
    ``00010-7-a-fox-upscaled.png`` (next counter, the seed and prompt kept), not ``00010-00009-7-a-fox-upscaled``
    with the old counter doubling up, and upscaling that again gives ``00011-7-a-fox-upscaled.png``."""
    stem = Path(source).stem
    m = _COUNTER.match(stem)
    stem = m.group(2) if m else stem
    return stem if stem.endswith(f"-{suffix}") else f"{stem}-{suffix}"


def _next_counter(folder: Path) -> int:
    """1 + the highest counter prefix of any entry in ``folder``; 0 when there is none. Stale temporary files
    of `save_png` met on the way are removed (`is_stale_temp`): a killed `generate` left them."""
    highest = -1
    with os.scandir(folder) as entries:
        for entry in entries:
            m = _COUNTER.match(entry.name)
            if m:
                highest = max(highest, int(m.group(1)))
            elif is_stale_temp(entry):
                _unlink_quietly(Path(entry.path))
    return highest + 1


def is_stale_temp(entry: os.DirEntry, now: float | None = None) -> bool:
    """Whether ``entry`` is a temporary file of `_write_temp` (TEMP_NAME) untouched for STALE_TEMP_S: no live
    write leaves its file that long (it is written, fsync'ed and linked in one go), so its writer was killed.
    Only our own names are ever matched: nobody else's file is removed."""
    if not TEMP_NAME.match(entry.name):
        return False
    try:
        if not entry.is_file(follow_symlinks=False):
            return False
        age = (time.time() if now is None else now) - entry.stat(follow_symlinks=False).st_mtime
    except OSError:
        return False
    return age > STALE_TEMP_S


def _cut_utf8(text: str, max_bytes: int) -> str:
    """``text`` cut to at most ``max_bytes`` of UTF-8, never inside a character."""
    return text.encode("utf-8")[:max_bytes].decode("utf-8", "ignore")


def _bumped(original: Path, taken: int) -> Path:
    """The name to try after ``original`` and ``taken - 1`` names after it were taken: the next
    free counter for our names, else ``stem-<taken>.ext``."""
    m = _COUNTER.match(original.name)
    if m:
        counter = max(int(m.group(1)) + taken, _next_counter(original.parent))
        prefix, stem, suffix = f"{counter:05d}-", Path(m.group(2)).stem, original.suffix
    else:
        prefix, stem, suffix = "", original.stem, f"-{taken}{original.suffix}"
    room = NAME_MAX - len((prefix + suffix).encode())
    return original.with_name(prefix + _cut_utf8(stem, room) + suffix)


# ------------------------------------------------------------------------------------ metadata


def _format_value(value: object) -> str:
    """A1111's look: 7.0 -> "7", 7.5 -> "7.5"; quoted (JSON) when the value would break parsing.

    A1111 quotes values holding ``,``, ``:`` or a newline. We also quote values that start with a
    quote or have surrounding spaces, which A1111's own parser would otherwise alter.
    """
    if isinstance(value, float):
        text = str(int(value)) if value.is_integer() else repr(value)
    else:
        text = str(value)
    if any(c in text for c in ",:\n") or text.startswith('"') or text != text.strip():
        return json.dumps(text, ensure_ascii=False)
    return text


# A1111's own pattern (modules/infotext_utils.py), so we split lines exactly as it does.
_PARAM = re.compile(r'\s*(\w[\w \-/]+):\s*("(?:\\.|[^\\"])+"|[^,]*)(?:,|$)')
_KEY = re.compile(r"\w[\w \-/]*[\w\-/]")
_NEGATIVE = "Negative prompt:"


def a1111_parameters(prompt: str, negative_prompt: str, fields: dict) -> str:
    """A1111's ``parameters`` text: prompt, ``Negative prompt: ...`` (when not empty), fields.

    Fields keep their dict order; ``None`` values are left out, as A1111 does. Keys must be what
    A1111's parser reads back (at least two word characters, spaces, ``-`` or ``/``).
    """
    parts = []
    for key, value in fields.items():
        if not _KEY.fullmatch(key):
            raise ValueError(f"invalid A1111 field name {key!r}: use letters, digits, space, - or /")
        if value is not None:
            parts.append(f"{key}: {_format_value(value)}")
    text = prompt
    if negative_prompt:
        text += f"\n{_NEGATIVE} {negative_prompt}"
    if parts:
        text += "\n" + ", ".join(parts)
    return text


def parse_a1111_parameters(text: str) -> dict:
    """Inverse of `a1111_parameters`, and a reader of texts written by A1111 itself.

    Returns ``{"prompt", "negative_prompt", <field>: <str value>...}``. As in A1111, the last line
    counts as the fields line only when it holds at least three ``Key: value`` pairs, and the first
    line starting with ``Negative prompt:`` starts the negative prompt. So the round trip holds for
    any prompts and for three fields or more (we always write Steps, Sampler, CFG scale, Seed...),
    unless a prompt line itself starts with ``Negative prompt:``.
    """
    result: dict = {"prompt": "", "negative_prompt": ""}
    body = text.rstrip()
    lines = body.split("\n")
    last = lines[-1]
    if len(_PARAM.findall(last)) >= 3:
        lines = lines[:-1]
        for key, value in _PARAM.findall(last):
            if len(value) >= 2 and value[0] == value[-1] == '"':
                try:
                    value = safe_loads(value, what="a quoted parameter")
                except ValueError:
                    pass
            result[key] = value
    else:
        lines = text.split("\n")  # no fields: keep the text exactly as it was
    for i, line in enumerate(lines):
        if line.startswith(_NEGATIVE):
            first = line[len(_NEGATIVE) :]
            first = first[1:] if first.startswith(" ") else first
            result["prompt"] = "\n".join(lines[:i])
            result["negative_prompt"] = "\n".join([first, *lines[i + 1 :]])
            break
    else:
        result["prompt"] = "\n".join(lines)
    return result


# ----------------------------------------------------------------------------------- writing


def save_png(image: Image.Image, path: Path, parameters: str, metadata: dict) -> Path:
    """Write ``image`` as a PNG at ``path``, or at the next free name; returns the path written.

    Atomic and never overwriting (see the module docstring). ``OSError`` (read-only folder, disk
    full, ...) becomes `OutputError` naming the folder and the reason; any other exception (a crash
    in the encoder, Ctrl-C) passes through. Either way the temporary file is removed and no file
    appears under a final name.
    """
    path = Path(path)
    folder = path.parent
    info = PngInfo()
    info.add_text(PARAMETERS_KEY, parameters)  # tEXt, or iTXt (UTF-8) when not Latin-1
    # default=str: a Path or enum in the metadata must not lose an image that took minutes.
    info.add_text(METADATA_KEY, json.dumps(metadata, default=str))
    tmp: Path | None = None
    try:
        folder.mkdir(parents=True, exist_ok=True)
        tmp = _write_temp(image, info, path)
        final = _link_into_place(tmp, path)
    except OSError as exc:
        raise OutputError(_describe(folder, exc)) from exc
    finally:
        if tmp is not None:
            _unlink_quietly(tmp)
    _fsync_dir(folder)
    return final


def save_new_file(path: str | Path, write: Callable[[Path], None], what: str = "file", next_free: bool = True) -> Path:
    """Write a file of any kind as `save_png` writes a PNG: ``write(tmp)`` fills a new hidden temporary name beside
    ``path`` (TEMP_NAME, so a killed writer's leftover is cleaned up as a PNG's is), it is fsync'ed and linked under
    ``path`` or the next free name, never over an existing file; returns the path written. ``OSError`` becomes
    `OutputError` naming the folder and ``what`` (a video, its sidecar); anything else passes through, and either way
    no file appears under a final name. ``next_free=False``: ``path`` or nothing (a clip's sidecar must have the
    clip's name), an existing file refused with `OutputError`. video_out.py writes clips and sidecars through it."""
    path = Path(path)
    folder = path.parent
    tmp = path.with_name(f".{_cut_utf8(path.name, 100)}.{secrets.token_hex(6)}.tmp")
    try:
        folder.mkdir(parents=True, exist_ok=True)
        try:
            write(tmp)
            fd = os.open(tmp, os.O_RDWR | getattr(os, "O_BINARY", 0))
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
            if next_free:
                final = _link_into_place(tmp, path)
            else:
                _link_exactly(tmp, path)
                final = path
        finally:
            _unlink_quietly(tmp)
    except FileExistsError as exc:
        raise OutputError(f"could not save the {what} as {path}: a file of that name exists and is kept") from exc
    except OSError as exc:
        raise OutputError(_describe(folder, exc, what)) from exc
    _fsync_dir(folder)
    return final


def save_images(
    images: Iterable[Image.Image],
    outdir: str | Path,
    seeds: Iterable[int],
    prompt: str,
    parameters_for: Callable[[int, int], str],
    metadata_for: Callable[[int, int], dict],
) -> list[Path]:
    """Save a batch: image ``i`` with ``seeds[i]``, texts from ``parameters_for(i, seed)`` and
    ``metadata_for(i, seed)``. Images saved before a failure stay on disk."""
    images, seeds = list(images), list(seeds)
    if len(images) != len(seeds):
        raise ValueError(f"{len(images)} images but {len(seeds)} seeds")
    paths = []
    for i, (image, seed) in enumerate(zip(images, seeds)):
        path = next_image_path(outdir, seed, prompt)
        paths.append(save_png(image, path, parameters_for(i, seed), metadata_for(i, seed)))
    return paths


def read_png_metadata(path: str | Path) -> tuple[str | None, dict | None]:
    """``(A1111 parameters text, our JSON dict)`` of an image; ``None`` for what is absent or
    unreadable (an image from another tool, a hand-edited chunk)."""
    with Image.open(path) as im:
        texts = dict(getattr(im, "text", None) or im.info)
    parameters = texts.get(PARAMETERS_KEY)
    parameters = str(parameters) if isinstance(parameters, str) else None
    try:
        metadata = safe_loads(texts[METADATA_KEY], what=f"the {METADATA_KEY} text of {path}")
    except (KeyError, TypeError):
        metadata = None
    except BadJson as exc:  # a downloaded image's chunk: nested too deep must not crash the reader
        if exc.kind != "invalid":
            log.warning("ignoring %s", exc)
        metadata = None
    return parameters, metadata if isinstance(metadata, dict) else None


def _write_temp(image: Image.Image, info: PngInfo, final: Path) -> Path:
    """Encode to a new hidden ``.<name>.<random>.tmp`` beside ``final`` and fsync it."""
    tmp = final.with_name(f".{_cut_utf8(final.name, 100)}.{secrets.token_hex(6)}.tmp")
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_BINARY", 0)
    fd = os.open(tmp, flags, 0o666)  # 0o666 & ~umask: the same mode as any file the user saves
    try:
        with os.fdopen(fd, "wb") as f:
            image.save(f, format="PNG", pnginfo=info)
            f.flush()
            os.fsync(f.fileno())
    except BaseException:
        _unlink_quietly(tmp)
        raise
    return tmp


def _link_into_place(tmp: Path, path: Path) -> Path:
    """Give ``tmp`` a final name that nobody holds: ``path`` or the next free one."""
    candidate, use_links, taken = path, True, 0
    for _ in range(_MAX_TRIES):
        try:
            if use_links:
                os.link(tmp, candidate)  # fails with EEXIST instead of overwriting
            else:
                _reserve_and_replace(tmp, candidate)
            return candidate
        except FileExistsError:
            taken += 1
            candidate = _bumped(path, taken)
        except OSError as exc:
            if not use_links or exc.errno not in _NO_HARDLINKS:
                raise
            use_links = False  # retry this name without hard links
    raise OSError(errno.EEXIST, f"no free file name after {_MAX_TRIES} tries near {path.name}")


def _link_exactly(tmp: Path, path: Path) -> None:
    """``tmp`` linked as ``path``; FileExistsError where that name is taken (no other name is tried)."""
    try:
        os.link(tmp, path)
    except FileExistsError:
        raise
    except OSError as exc:
        if exc.errno not in _NO_HARDLINKS:
            raise
        _reserve_and_replace(tmp, path)


def _reserve_and_replace(tmp: Path, candidate: Path) -> None:
    """Fallback without hard links: claim the name with O_EXCL, then rename over our own claim.

    A crash between the two steps leaves an empty file (never a truncated PNG) under the name.
    """
    os.close(os.open(candidate, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666))
    try:
        os.replace(tmp, candidate)
    except BaseException:
        _unlink_quietly(candidate)
        raise


def _unlink_quietly(path: Path) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass


def _fsync_dir(folder: Path) -> None:
    """Make the new directory entry durable (POSIX); best effort, Windows cannot open folders."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _describe(folder: Path, exc: OSError, what: str = "image") -> str:
    """A message for people: the folder, the OS reason and what to do."""
    reason = exc.strerror or str(exc) or type(exc).__name__
    code = errno.errorcode.get(exc.errno or 0)
    if code:
        reason += f" ({code})"
    if exc.errno in (errno.ENOSPC, getattr(errno, "EDQUOT", -1)):
        advice = "free some disk space or choose another output folder"
    else:
        advice = "choose a writable output folder"
    return f"could not save the {what} in {folder}: {reason}; earlier images are intact; {advice}"
