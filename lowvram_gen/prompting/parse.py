"""A1111's attention syntax read into (text, weight) pairs: pure Python, no torch, cheap to import.

The rules are those of AUTOMATIC1111's `parse_prompt_attention` (the "Original" emphasis mode, its
default), written from its documentation and doctests so that a prompt pasted from A1111 or Civitai
weights the same tokens by the same factors:

* `(x)` multiplies by 1.1, `[x]` divides by 1.1, `(x:w)` multiplies by w; nesting multiplies.
* Brackets still open at the end are closed there; a closing bracket with nothing open is literal text.
* `\\(` `\\)` `\\[` `\\]` `\\\\` are the literal characters; a lone backslash is dropped (as in A1111).
* `(x:w)` takes A1111's number form `[+-]?[.0-9]+` (spaces allowed around it). Anything else after
  the colon (`(x:abc)`, `(x:1e2)`) is not a weight: the colon and the text stay literal and the
  brackets count as plain `( )`. A number of that form that Python cannot read (`1.2.3`, `.`) makes
  A1111 stop with an error; here it raises `PromptSyntaxError`, which says where.
* `BREAK` (upper case, a whole word) ends the current 75-token chunk. It is returned as the pair
  `(BREAK, -1.0)`, where `BREAK` is a marker object, so a typed `(BREAK:-1)` cannot be mistaken for it.
  One deliberate difference: inside brackets A1111 multiplies its marker too, which turns it into the
  word "BREAK" at weight -1.1 (a bug); here it stays a break and `find_unsupported` says so.
* Runs of equal weight are merged; an empty prompt is `[("", 1.0)]`.

Prompt editing, alternation and `AND` are read before this parser, per step (prompting/schedule.py), and
`<lora:...>` tags are not handled here (a job's `networks.prepare` takes them out first): `find_unsupported`
names what is left that we do not follow, so that the caller can warn instead of silently encoding it.
"""

from __future__ import annotations

import re

ROUND = 1.1
SQUARE = 1 / 1.1
BREAK_WEIGHT = -1.0


class PromptSyntaxError(ValueError):
    """A prompt A1111 itself would refuse (a malformed `(x:w)` weight)."""


class _BreakMarker(str):
    """The BREAK marker: a str, so parts stay (text, weight) pairs, but told apart by identity."""

    __slots__ = ()


BREAK = _BreakMarker("BREAK")

# One alternative per A1111 token kind, tried in A1111's order at each position.
_TOKEN = re.compile(r"""
    (?P<escape>\\[()\[\]\\]?)           # \( \) \[ \] \\ : that character; a lone backslash: nothing
  | (?P<open>[(\[])
  | :\s*(?P<weight>[+-]?[.\d]+)\s*\)    # ':1.3)' closes a round bracket with an explicit weight
  | (?P<close>[)\]])
  | (?P<text>[^\\()\[\]:]+)
  | (?P<colon>:)
""", re.X)
_BREAK_SPLIT = re.compile(r"\s*\bBREAK\b\s*", re.S)
_EXTRA_NETWORK = re.compile(r"<[A-Za-z_]\w*:[^<>]+>")


def is_break(part: tuple[str, float]) -> bool:
    return part[0] is BREAK


def _weight(number: str) -> float:
    try:
        return float(number)
    except ValueError:
        raise PromptSyntaxError(
            f"'(...:{number})': {number!r} is not a number (A1111 stops with an error on it too); "
            "write the weight like 1.2 or .5") from None


def _parse(text: str) -> tuple[list[tuple[str, float]], list[str]]:
    """(parts, notes): notes are the places where we knowingly differ from A1111."""
    parts: list[list] = []  # [text, weight, is_break]
    rounds: list[int] = []
    squares: list[int] = []
    notes: list[str] = []

    def scale(start: int, factor: float) -> None:
        for part in parts[start:]:
            if not part[2]:
                part[1] *= factor

    for m in _TOKEN.finditer(text):
        kind, s = m.lastgroup, m.group(0)
        if kind == "escape":
            parts.append([s[1:], 1.0, False])
        elif kind == "open":
            (rounds if s == "(" else squares).append(len(parts))
        elif kind == "weight" and rounds:
            scale(rounds.pop(), _weight(m.group("weight")))
        elif s == ")" and rounds:
            scale(rounds.pop(), ROUND)
        elif s == "]" and squares:
            scale(squares.pop(), SQUARE)
        else:  # text, a colon, an unmatched closer, a weight with no bracket open: all literal
            for i, piece in enumerate(_BREAK_SPLIT.split(s)):
                if i:
                    parts.append([BREAK, BREAK_WEIGHT, True])
                    if rounds or squares:
                        notes.append("BREAK inside brackets: A1111 would encode the word 'BREAK' at a "
                                     "negative weight there (a bug); here it ends the chunk as everywhere else")
                parts.append([piece, 1.0, False])

    # unclosed brackets end at the end of the prompt, round ones first (the order of A1111's float products)
    for pos in rounds:
        scale(pos, ROUND)
    for pos in squares:
        scale(pos, SQUARE)

    merged: list[list] = []
    for part in parts:
        prev = merged[-1] if merged else None
        if prev is not None and not part[2] and not prev[2] and prev[1] == part[1]:
            prev[0] += part[0]
        else:
            merged.append(list(part))
    return [(p[0], p[1]) for p in merged] or [("", 1.0)], notes


def parse_attention(text: str) -> list[tuple[str, float]]:
    """`text` as A1111 weights it: [(text, weight), ...], with (BREAK, -1.0) where a chunk ends."""
    return _parse(text)[0]


def uses_syntax(text: str) -> bool:
    """Whether `text` means anything other than its literal characters to the A1111 parser."""
    try:
        return _parse(text)[0] != [(text, 1.0)]
    except PromptSyntaxError:
        return True


def strip_syntax(text: str) -> str:
    """The words without weights, brackets, escapes or BREAK: for encoders that take plain text.
    A prompt the parser refuses is returned as typed."""
    try:
        parts = parse_attention(text)
    except PromptSyntaxError:
        return text
    return "".join(" " if is_break(p) else p[0] for p in parts).strip()


def find_unsupported(text: str) -> list[str]:
    """One warning per piece of A1111 syntax in `text` that is not implemented here, saying what happens to it
    instead, and where a prompt differs from or is refused by A1111's parser. Prompt editing, alternation and `AND`
    are implemented (prompting/schedule.py): the attention parser reads each step's text, which has none of them."""
    found: list[str] = []
    for tag in _EXTRA_NETWORK.findall(text):
        found.append(f"{tag!r}: A1111 extra networks (LoRA, hypernetworks) are not loaded from the prompt; "
                     "the tag is encoded as text")
    try:
        found.extend(dict.fromkeys(_parse(text)[1]))
    except PromptSyntaxError as exc:
        found.append(str(exc))
    return found
