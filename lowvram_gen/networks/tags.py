"""A1111 extra-network tags in prompts (`<lora:name:weight>`) and the `--lora name[:weight]` flag.

The tags are taken out of the text sent to the text encoder (A1111 does the same); the PNG keeps the
prompt as typed. Anything we read differently from A1111 comes back as a warning, never silently:
`<lyco:...>` is read as `<lora:...>` (A1111 1.5+ does too), `<hypernet:...>` is not supported and
dropped, extra arguments (`:te=`, `:unet=`, `:dyn=`, a second positional weight) are ignored.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from lowvram_gen.errors import InvalidRequest

_TAG = re.compile(r"<(lora|lyco|hypernet):([^>]*)>", re.IGNORECASE)


@dataclass(frozen=True)
class LoraRef:
    name: str  # as typed: a file stem, a stem with suffix, or a path
    weight: float = 1.0


def _weight(text: str, where: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise InvalidRequest("LoRA weight", text, f"in {where}: the weight must be a number, e.g. <lora:name:0.8>") from None
    if value != value or value in (float("inf"), float("-inf")):
        raise InvalidRequest("LoRA weight", text, f"in {where}: the weight must be a finite number")
    return value


def extract_lora_tags(prompt: str) -> tuple[str, list[LoraRef], list[str]]:
    """(prompt without the tags, the LoRAs asked for in order, warnings).

    `<lora:name>` has weight 1.0. A malformed weight raises InvalidRequest naming it. Whitespace left
    where a tag was is collapsed so `a cat <lora:x:1>, sky` becomes `a cat, sky`.
    """
    refs: list[LoraRef] = []
    warnings: list[str] = []

    def take(match: re.Match) -> str:
        kind, body = match.group(1).lower(), match.group(2)
        tag = match.group(0)
        if kind == "hypernet":
            warnings.append(f"{tag}: hypernetworks are not supported; the tag was removed from the prompt")
            return ""
        items = [i.strip() for i in body.split(":")]
        name = _name_of(match)
        if not name:
            raise InvalidRequest("LoRA tag", tag, "write <lora:NAME> or <lora:NAME:WEIGHT>")
        positional = [i for i in items[1:] if "=" not in i]
        named = [i for i in items[1:] if "=" in i]
        weight = _weight(positional[0], tag) if positional else 1.0
        extra = positional[1:] + named
        if extra:
            warnings.append(f"{tag}: extra arguments {', '.join(extra)} are ignored; weight {weight:g} is used "
                            "for the text encoder and the UNet alike")
        if kind == "lyco":
            warnings.append(f"{tag}: read as <lora:{name}:{weight:g}> (as A1111 1.5+ does); LyCORIS types other "
                            "than LoRA/LoCon may fail to load")
        refs.append(LoraRef(name, weight))
        return ""

    text = _TAG.sub(take, prompt)
    if refs or warnings:
        text = _tidy(text)
    return text, refs, warnings


def _name_of(match: re.Match) -> str | None:
    """The LoRA a tag names (None for a `<hypernet:...>` tag): its text up to the first `:`."""
    if match.group(1).lower() == "hypernet":
        return None
    return match.group(2).split(":")[0].strip()


def _tidy(text: str) -> str:
    """The whitespace a taken-out tag leaves collapsed: `a cat <lora:x:1>, sky` -> `a cat, sky`."""
    text = re.sub(r"[ \t]{2,}", " ", text)
    return re.sub(r"[ \t]+([,.;])", r"\1", text).strip()


def without_loras(prompt: str, names: set[str]) -> str:
    """`prompt` with the `<lora:...>`/`<lyco:...>` tags that name one of `names` taken out (the tags read as
    `extract_lora_tags` reads them), the rest as typed."""
    text = _TAG.sub(lambda m: "" if _name_of(m) in names else m.group(0), prompt)
    return prompt if text == prompt else _tidy(text)


def parse_lora_flag(value: str) -> LoraRef:
    """`--lora name`, `--lora name:0.8`, `--lora path/to/file.safetensors:0.5` (a Windows drive
    letter `C:\\...` is not taken for a weight)."""
    text = value.strip()
    if not text:
        raise InvalidRequest("--lora", value, "give NAME or NAME:WEIGHT")
    head, sep, tail = text.rpartition(":")
    if not sep:
        return LoraRef(text)
    if len(head) == 1 and head.isalpha() and tail[:1] in ("\\", "/"):
        return LoraRef(text)  # C:\loras\x.safetensors
    if not head:
        raise InvalidRequest("--lora", value, "give NAME or NAME:WEIGHT")
    return LoraRef(head, _weight(tail, f"--lora {value}"))


def merge_refs(refs: list[LoraRef]) -> tuple[list[LoraRef], list[str]]:
    """One entry per name: a LoRA named twice (tag and flag, or two tags) gets the sum of the weights."""
    merged: dict[str, float] = {}
    warnings = []
    for ref in refs:
        if ref.name in merged:
            warnings.append(f"LoRA {ref.name} is asked for more than once: the weights are added up")
            merged[ref.name] += ref.weight
        else:
            merged[ref.name] = ref.weight
    return [LoraRef(n, w) for n, w in merged.items()], warnings
