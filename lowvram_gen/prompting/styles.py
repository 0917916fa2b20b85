"""A1111's saved prompt styles (`styles.csv`): read, applied to a request's prompts, saved, and taken back out of a
prompt (PNG Info's paste).

The file is A1111's: UTF-8 (a BOM or none), a header row `name,prompt,negative_prompt` (A1111's older `name,text`
too), one style a row, quoted as Python's csv module quotes; empty rows and rows whose name starts with `#` are
skipped, and a later row of the same name wins, as A1111 reads it. A style's text holding `{prompt}` puts the
user's prompt there (every `{prompt}` in it); any other style's text is appended after ", " (an empty prompt or an
empty style adds nothing). Several styles apply in the order given, each to the result of the one before, the
negative prompt the same way with the styles' negative texts.

A missing file is no styles (A1111's); a file that is not CSV we can read (a header without `name`, a row with more
cells than the header, a quote left open) is one `InvalidRequest` naming the file and the line. Saving a style
re-reads the file, replaces or adds that one row (the others kept, in their order), copies the old file to
`styles.csv.bak` (A1111 keeps that backup too) and writes the new one through a temporary file and a rename, so a
crash never leaves half a file.

Taking styles back out (A1111's `extract_styles_from_prompt`): the last style applied is found first (its text at
the end of the prompt, or around it for a `{prompt}` style, in the prompt and the negative prompt both), removed,
and so on; a style is taken only where applying it again gives the prompt back exactly, so a rerun with the
styles named makes the same prompt (A1111's own check is looser: "cat, dog" never yields "catdog" here).

Standard library only, and `errors`/`paths`: the request's layer reads it.
"""

from __future__ import annotations

import csv
import dataclasses
import io
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable

from lowvram_gen.errors import InvalidRequest
from lowvram_gen.paths import write_atomically

FILE_NAME = "styles.csv"  # A1111's, in the folder it runs in
COLUMNS = ("name", "prompt", "negative_prompt")
PLACEHOLDER = "{prompt}"


@dataclass(frozen=True)
class Style:
    name: str
    prompt: str = ""
    negative_prompt: str = ""


def merge(style_text: str, prompt: str) -> str:
    """One style's text applied to a prompt (A1111's rule)."""
    if PLACEHOLDER in style_text:
        return style_text.replace(PLACEHOLDER, prompt)
    return ", ".join(part for part in (prompt.strip(), style_text.strip()) if part)


def apply_all(prompt: str, texts: Iterable[str]) -> str:
    for text in texts:
        prompt = merge(text, prompt)
    return prompt


def _unwrap(style_text: str, prompt: str) -> str | None:
    """The prompt `style_text` was applied to, or None where it was not (A1111's extract_style_text_from_prompt,
    checked by applying the style again)."""
    text, whole = style_text.strip(), prompt.strip()
    if PLACEHOLDER in text:
        left, _, right = text.partition(PLACEHOLDER)
        if len(whole) < len(left) + len(right) or not (whole.startswith(left) and whole.endswith(right)):
            return None
        inner = whole[len(left):len(whole) - len(right)]
    elif whole.endswith(text):
        inner = whole[:len(whole) - len(text)]
        inner = inner[:-2] if inner.endswith(", ") else inner
    else:
        return None
    return inner if merge(style_text, inner).strip() == whole else None


@dataclass(frozen=True)
class StyleBook:
    """The styles of one file, by name in the file's order; `path`: where they were read (what errors name)."""

    path: Path
    styles: dict[str, Style] = dataclasses.field(default_factory=dict)

    @property
    def names(self) -> list[str]:
        return list(self.styles)

    def check(self, names: Iterable[str]) -> list[Style]:
        """The styles of `names`, in that order; an unknown one is refused in one sentence naming it and the
        styles there are."""
        found = []
        for name in names:
            if name not in self.styles:
                there = (f"the styles there: {', '.join(self.styles)}" if self.styles
                         else "it has no styles" if self.path.is_file() else "that file does not exist")
                raise InvalidRequest("style", name, f"no such style in {self.path}; {there}")
            found.append(self.styles[name])
        return found

    def expand(self, prompt: str, negative: str, names: Iterable[str]) -> tuple[str, str]:
        """(prompt, negative prompt) with the styles of `names` applied, in order."""
        styles = self.check(names)
        return apply_all(prompt, (s.prompt for s in styles)), apply_all(negative, (s.negative_prompt for s in styles))

    def extract(self, prompt: str, negative: str) -> tuple[list[str], str, str]:
        """(the styles found, in the order to apply them; the prompt and negative prompt without them)."""
        found: list[str] = []
        left = [s for s in self.styles.values() if s.prompt or s.negative_prompt]
        while True:
            for style in left:
                inner, inner_negative = _unwrap(style.prompt, prompt), _unwrap(style.negative_prompt, negative)
                if inner is not None and inner_negative is not None:
                    prompt, negative = inner, inner_negative
                    left.remove(style)
                    found.append(style.name)
                    break
            else:
                return found[::-1], prompt, negative


def parse(text: str, path: Path) -> dict[str, Style]:
    """The styles of a styles.csv's text (a BOM already removed); `path` names the file in errors."""
    def bad(line: int, why: str) -> InvalidRequest:
        return InvalidRequest("styles file", str(path), f"line {line}: {why}")

    reader = csv.reader(io.StringIO(text, newline=""), skipinitialspace=True, strict=True)
    styles: dict[str, Style] = {}
    header: list[str] | None = None
    try:
        for row in reader:
            line = reader.line_num
            if header is None:
                header = [cell.strip() for cell in row]
                if "name" not in header or not ({"prompt", "text"} & set(header)):
                    raise bad(line, f"the header is {','.join(header)!r}; A1111's is 'name,prompt,negative_prompt'")
                continue
            if not row or not any(cell.strip() for cell in row):
                continue
            if len(row) > len(header):
                raise bad(line, f"{len(row)} cells where the header has {len(header)}: quote a text that holds a "
                                "comma (\"a, b\")")
            cells = dict(zip(header, row))
            name = cells.get("name", "").strip()
            if not name or name.startswith("#"):
                continue
            styles[name] = Style(name, cells.get("prompt", cells.get("text", "")) or "",
                                 cells.get("negative_prompt", "") or "")
    except csv.Error as exc:
        raise bad(reader.line_num, f"not CSV ({exc}): a quote left open?") from None
    return styles


def read(path: str | Path) -> StyleBook:
    """The styles in `path`; none when it does not exist."""
    path = Path(path)
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return StyleBook(path)
    except OSError as exc:
        raise InvalidRequest("styles file", str(path), f"cannot be read ({exc.strerror or exc})") from None
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line = raw[:exc.start].count(b"\n") + 1
        raise InvalidRequest("styles file", str(path), f"line {line}: not UTF-8 text; save it as UTF-8") from None
    return StyleBook(path, parse(text, path))


def text_of(styles: Iterable[Style]) -> str:
    """A styles.csv's text as A1111 writes it (a BOM, the header, every text quoted where csv needs)."""
    out = io.StringIO(newline="")
    writer = csv.writer(out, lineterminator="\r\n")
    writer.writerow(COLUMNS)
    for style in styles:
        writer.writerow((style.name, style.prompt, style.negative_prompt))
    return "\ufeff" + out.getvalue()


def save(path: str | Path, style: Style) -> StyleBook:
    """Add `style` to the file (or replace the one of its name), keeping the others and a `.bak` of the old file;
    written atomically. A name that is empty or starts with `#` is refused (A1111 would never read it back)."""
    name = style.name.strip() if isinstance(style.name, str) else ""
    if not name or name.startswith("#"):
        raise InvalidRequest("style name", style.name, "give the style a name (not starting with #)")
    path = Path(path)
    book = read(path)  # a malformed file is refused before anything is written over it
    styles = dict(book.styles)
    styles[name] = dataclasses.replace(style, name=name)
    if path.is_file():
        shutil.copyfile(path, f"{path}.bak")
    write_atomically(path, text_of(styles.values()))
    return StyleBook(path, styles)


def default_path() -> Path:
    """A1111's place: styles.csv in the folder the app runs in."""
    return Path.cwd() / FILE_NAME


class StylesFile:
    """One styles file, read again when it changes on disk (another program, or a save from another tab)."""

    def __init__(self, path: str | Path | None = None):
        self.path = Path(path).expanduser().absolute() if path else default_path()
        self._seen: tuple[Any, StyleBook] | None = None

    def _stamp(self):
        try:
            stat = os.stat(self.path)
        except OSError:
            return None
        return stat.st_mtime_ns, stat.st_size

    def book(self) -> StyleBook:
        stamp = self._stamp()
        if self._seen is None or self._seen[0] != stamp or stamp is None:
            self._seen = (stamp, read(self.path))
        return self._seen[1]

    def save(self, style: Style) -> StyleBook:
        book = save(self.path, style)
        self._seen = (self._stamp(), book)
        return book


def check_names(value: Any) -> tuple[str, ...]:
    """A request's `styles`: names as a list (the API's, the UI's), or text with commas between them (a batch
    line's, a CSV cell's); each stripped, empty ones dropped. Whether they exist is the file's to say."""
    items = value.split(",") if isinstance(value, str) else list(value or ())
    if not all(isinstance(v, str) for v in items):
        raise InvalidRequest("styles", value, "give styles by their names (text)")
    return tuple(dict.fromkeys(v.strip() for v in items if v.strip()))


def expanded(request, book: StyleBook):
    """`request` with its styles applied to its prompts (the hires ones too where given, as A1111's) and `styles`
    emptied, so applying them again changes nothing; the names go to `extra["styles"]` (the PNG's JSON)."""
    if not request.styles:
        return request
    names = request.styles
    prompt, negative = book.expand(request.prompt, request.negative_prompt, names)
    changes = {"prompt": prompt, "negative_prompt": negative}
    if request.hires_prompt or request.hires_negative:
        hires = book.expand(request.hires_prompt or request.prompt, request.hires_negative or request.negative_prompt,
                            names)
        changes.update(hires_prompt=hires[0] if request.hires_prompt else "",
                       hires_negative=hires[1] if request.hires_negative else "")
    return dataclasses.replace(request, **changes, styles=(), extra={**request.extra, "styles": list(names)})


def take_out(fields: dict, book: StyleBook) -> dict:
    """A PNG's request fields (a1111/infotext.py's) with the styles of `book` taken out of the prompts and named in
    `styles` (A1111's paste, its default "Apply": an image without them names none). Where the image has a hires
    prompt, it must hold the same styles, or nothing is taken out (A1111's rule): the hires prompt without them
    is kept, or "" where it equals the prompt's."""
    found, prompt, negative = book.extract(fields.get("prompt", ""), fields.get("negative_prompt", ""))
    hires = {}
    if fields.get("hires_prompt") or fields.get("hires_negative"):
        hires_found, hires_prompt, hires_negative = book.extract(fields.get("hires_prompt") or fields.get("prompt", ""),
                                                                 fields.get("hires_negative")
                                                                 or fields.get("negative_prompt", ""))
        if hires_found != found:
            return fields
        hires = {"hires_prompt": "" if hires_prompt == prompt else hires_prompt,
                 "hires_negative": "" if hires_negative == negative else hires_negative}
    return {**fields, "prompt": prompt, "negative_prompt": negative, **hires, "styles": tuple(found)}
