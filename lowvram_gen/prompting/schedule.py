"""A1111's prompt editing, alternation and `AND`: which prompt text each denoising step reads (pure Python).

Written from the rules of A1111's `prompt_parser` (its grammar, its doctests and its callers in processing.py and
sd_samplers_cfg_denoiser.py; A1111 is AGPL, none of its code is copied):

* `[from:to:when]` reads `from` up to step `when`, then `to`; `[to:when]` reads nothing, then `to`; `[from::when]`
  reads `from`, then nothing. Groups nest, in `from` and `to` and in `( )` / `[ ]` emphasis, which is kept as text
  for the attention parser (prompting.parse) to weigh later.
* `when` is a number (`+`/`-`, decimals, an exponent). With a `.` in it, it is a fraction of the steps
  (`0.5` of 20 is 10; `1.5` clamps to all of them); without one, a step number. The result is cut to an int and
  clamped to the steps; one below 1 never holds, so `to` is read from the first step.
* hires fix's second pass (`hires_steps`): a step number counts on from the first pass's steps (`[a:b:25]` after a
  20-step first pass switches at the second pass's step 5) and a fraction from 1.0 (`1.5` is half of the second
  pass); both passes' timelines make one line. `use_old_scheduling` is A1111's "Old prompt editing timelines"
  option (a number below 1 is a fraction, no hires offset).
* `[a|b|c]` reads a at step 1, b at step 2, c at 3, a at 4 ...; an empty option is the empty text.
* What does not parse (a `|` outside brackets, a lone `\\` at the end) is read as typed, whole, at every step.
  Brackets that close nothing, and groups that do not parse, are kept as text.
* A schedule is `[[end_at_step, text], ...]`: `text` is read while the step is at most `end_at_step`.
  A1111's denoiser counts its model calls from 0 (`step_for_call`) against a schedule made for the steps times
  2 for its second-order samplers (Heun, DPM2, DPM2 a, DPM++ 2S a, DPM++ SDE, Restart: `total_steps`); img2img's
  schedule is made for the request's steps, though the pass runs fewer of them.
* `AND` (a whole word) splits a positive prompt into parts mixed by composable diffusion; each part may end in
  `:weight` (`a cat :1.2`), default 1 (`split_and`). The negative prompt is never split (A1111 schedules it whole).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

# A1111's second-order samplers: their schedule is made for twice the steps (two model calls a step)
SECOND_ORDER = frozenset({"DPM2", "DPM2 a", "DPM++ 2S a", "DPM++ SDE", "Heun", "Restart"})

_PLAIN = re.compile(r"(?:[^\\\[\]():|]|\\.)+")
_WHEN = re.compile(r"\s*([+-]?(?:\d+\.\d*|\.\d+|\d+)(?:[eE][+-]?\d+)?)\s*\]")
_AND = re.compile(r"\bAND\b")
_WEIGHT = re.compile(r"^((?:\s|.)*?)(?:\s*:\s*([-+]?(?:\d+\.?|\d*\.\d+)))?\s*$")
_SYNTAX = re.compile(r"[\[\]|]|\bAND\b|:\s*[-+]?[.\d]+\s*$")


class _NoParse(Exception):
    """A group that is not a group: its bracket is text (at the top level) or the whole prompt is (inside)."""


@dataclass
class _Edit:
    before: list | None  # None: `[to:when]`
    after: list
    when: str  # as typed: a '.' makes it a fraction


@dataclass
class _Alternate:
    options: list


def _items(text: str, i: int, top: bool) -> tuple[list, int]:
    """The items from `i` up to a closing `) ] : |` (inside a group) or the end (at the top level, where a bracket
    or colon that starts or closes nothing is text)."""
    items: list = []
    while i < len(text):
        plain = _PLAIN.match(text, i)
        if plain:
            items.append(plain.group(0))
            i = plain.end()
            continue
        char = text[i]
        if char in "([":
            try:
                group, i = _group(text, i)
                items.extend(group)
                continue
            except _NoParse:
                if not top:
                    raise
        elif not top:
            return items, i
        if char in "[]():":
            items.append(char)
            i += 1
            continue
        raise _NoParse(char)  # '|' outside brackets, a lone backslash at the end: A1111 reads the prompt as typed
    return items, i


def _at(text: str, i: int) -> str:
    return text[i] if i < len(text) else ""


def _group(text: str, i: int) -> tuple[list, int]:
    """The group opening at `text[i]` (`(` or `[`) as items, and where it ends; _NoParse if it does not parse."""
    inner, j = _items(text, i + 1, False)
    close = _at(text, j)
    if text[i] == "(":
        if close == ")":
            return ["(", *inner, ")"], j + 1
        if close == ":":
            second, k = _items(text, j + 1, False)
            if _at(text, k) == ")":
                return ["(", *inner, ":", *second, ")"], k + 1
        raise _NoParse(text[i:])
    if close == "]":
        return ["[", *inner, "]"], j + 1
    if close == "|":
        options = [inner]
        while _at(text, j) == "|":
            option, j = _items(text, j + 1, False)
            options.append(option)
        if _at(text, j) == "]":
            return [_Alternate(options)], j + 1
        raise _NoParse(text[i:])
    if close == ":":
        when = _WHEN.match(text, j + 1)
        if when:  # [to:when]
            return [_Edit(None, inner, when.group(1))], when.end()
        after, k = _items(text, j + 1, False)
        when = _WHEN.match(text, k + 1) if _at(text, k) == ":" else None
        if when:
            return [_Edit(inner, after, when.group(1))], when.end()
    raise _NoParse(text[i:])


def _parse(prompt: str) -> list | None:
    try:
        return _items(prompt, 0, True)[0]
    except _NoParse:
        return None


def _walk(items):
    for item in items:
        if isinstance(item, _Edit):
            yield item
            for part in (item.before or [], item.after):
                yield from _walk(part)
        elif isinstance(item, _Alternate):
            yield item
            for option in item.options:
                yield from _walk(option)


def _text(items, step: int, whens: dict) -> str:
    out = []
    for item in items:
        if isinstance(item, str):
            out.append(item)
        elif isinstance(item, _Edit):
            out.append(_text(item.before or [], step, whens) if step <= whens[id(item)] else
                       _text(item.after, step, whens))
        else:
            out.append(_text(item.options[(step - 1) % len(item.options)], step, whens))
    return "".join(out)


def schedule(prompt: str, steps: int, hires_steps: int | None = None,
             use_old_scheduling: bool = False) -> list[list]:
    """[[end_at_step, text], ...] as A1111's get_learned_conditioning_prompt_schedules gives for one prompt (no
    `AND` splitting: see split_and). `hires_steps`: the schedule of hires fix's second pass, `steps` then being
    the first pass's."""
    if hires_steps is None or use_old_scheduling:
        int_offset, fraction_offset, total = 0, 0.0, steps
    else:
        int_offset, fraction_offset, total = steps, 1.0, hires_steps
    items = _parse(prompt)
    if items is None:
        return [[total, prompt]]
    ends, whens = {total}, {}
    for node in _walk(items):
        if isinstance(node, _Alternate):
            ends.update(range(1, total + 1))
            continue
        value = float(node.when)
        if use_old_scheduling:
            value = value * total if value < 1 else value
        elif "." in node.when:
            value = (value - fraction_offset) * total
        else:
            value = value - int_offset
        when = min(total, int(value))
        whens[id(node)] = when
        if when >= 1:
            ends.add(when)
    return [[end, _text(items, end, whens)] for end in sorted(ends)]


def text_for_step(entries: list[list], step: int) -> str:
    """The text a schedule gives at denoiser call `step` (from 0): the first entry that lasts to it, as A1111's
    reconstruct_cond_batch picks (the first entry when the step is past them all)."""
    for end, text in entries:
        if step <= end:
            return text
    return entries[0][1]


def split_and(prompt: str) -> list[tuple[str, float]]:
    """A positive prompt's composable parts [(text, weight), ...], as A1111's get_multicond_prompt_list: split at
    each whole word `AND`, a `:number` at the end of a part is its weight (default 1), trailing spaces dropped."""
    parts = []
    for sub in _AND.split(prompt):
        match = _WEIGHT.search(sub)
        text, weight = match.groups() if match is not None else (sub, None)
        parts.append((text, float(weight) if weight is not None else 1.0))
    return parts


def total_steps(steps: int, sampler: str) -> int:
    """The step count A1111 makes a pass's schedule for: twice the steps for its second-order samplers."""
    return steps * 2 if sampler in SECOND_ORDER else steps


def uses_editing(prompt: str) -> bool:
    """Whether `prompt` may change between steps or mix parts (cheap pre-check: then `is_plain` decides)."""
    return bool(_SYNTAX.search(prompt or ""))


def is_plain(prompt: str, negative: bool = False) -> bool:
    """Whether `prompt` reads the same text, unsplit and unweighted, at every step of any pass (so it needs no
    switching): no `AND`, no `:weight` at the end (a positive prompt's), no editing or alternation group."""
    if not uses_editing(prompt):
        return True
    parts = [(prompt, 1.0)] if negative else split_and(prompt)
    if len(parts) != 1 or parts[0][1] != 1.0:
        return False
    items = _parse(parts[0][0])
    return items is None or next(_walk(items), None) is None


def variants(prompt: str, steps: int, hires_steps: int | None = None, negative: bool = False) -> list[str]:
    """Every distinct text the prompt's schedule reads over `steps` (or hires fix's second pass), `AND` parts
    split (not for a negative prompt), in order of first use: what the text encoders encode, once each."""
    parts = [(prompt, 1.0)] if negative else split_and(prompt)
    seen: dict[str, None] = {}
    for text, _ in parts:
        for _, variant in schedule(text, steps, hires_steps):
            seen.setdefault(variant)
    return list(seen)


def edits_prompts(request) -> bool:
    """Whether a GenerationRequest's prompts (its hires fix's own too) switch between steps or mix parts: such a job
    encodes its variants while the denoiser runs, so its text encoders stay loaded (the planner does not reload them)."""
    texts = [(request.prompt, request.negative_prompt)]
    if request.hires:
        texts.append(tuple(request.hires_texts))
    return any(not (is_plain(p or "") and is_plain(n or "", True)) for p, n in texts)


def editing_refusal(who: str) -> str:
    """The one sentence for a model whose text encoders are not the CLIPs we encode per step (SD3, Flux, ...)."""
    return (f"{who} does not take A1111 prompt editing, alternation or AND (its text encoders are not the CLIP "
            "models we encode per step): write one plain prompt")
