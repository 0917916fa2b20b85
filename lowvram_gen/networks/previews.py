"""The extra-network cards' data (A1111's "Extra networks"): one `Card` per LoRA, embedding and checkpoint file found
by the folder scans the jobs use (networks/lora.py, networks/embeddings.py, models/discover.py), with the preview
image A1111 keeps beside the file, its description and A1111's user metadata, and the text a click puts in the prompt.

A1111's rules, read from its modules/ui_extra_networks.py and ui_extra_networks_lora.py:
- the preview of `NAME.safetensors` is the first file of `NAME.png`, `NAME.preview.png`, `NAME.jpg`,
  `NAME.preview.jpg`, ... (png, jpg, jpeg, webp, gif, each without then with `.preview`) beside it; a diffusers
  folder's is beside the folder, named after it;
- the description is `NAME.txt` or `NAME.description.txt`; `NAME.json` (A1111's card editor writes it) may hold
  `description`, `activation text` and `preferred weight`, and its description wins;
- a LoRA card inserts `<lora:NAME:W>`, W the preferred weight when the JSON has one, else the default multiplier
  (A1111's `extra_networks_default_multiplier`, 1), then its activation text after a space; an embedding's card
  inserts its name; a click on a card whose tag is already in the prompt takes that tag out again.

Previews are only ever the files found beside a listed model file: a client names a card (kind and name), never a
path, so no request can make the server read any other file (docs/FAULTS.md 34). Nothing here imports gradio.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from lowvram_gen.safe_json import BadJson, load_file

PREVIEW_EXTENSIONS = ("png", "jpg", "jpeg", "webp", "gif")
DEFAULT_MULTIPLIER = 1.0  # A1111's extra_networks_default_multiplier
KINDS = {"lora": "Lora", "embedding": "Textual Inversion", "checkpoint": "Checkpoints"}  # A1111's tab names
USER_METADATA_BYTES = 1 << 20  # NAME.json: A1111's card editor writes a few lines
DESCRIPTION_BYTES = 64 * 1024


@dataclass(frozen=True)
class Card:
    kind: str  # a key of KINDS
    name: str  # what the card shows and the prompt uses: the file's stem (a diffusers folder's name)
    path: Path  # the model file (or diffusers folder)
    preview: Path | None = None
    description: str = ""
    activation_text: str = ""
    preferred_weight: float = 0.0  # 0: none set (A1111's)
    value: str = ""  # a checkpoint card's Model box value (the Model list's entry)


def preview_of(path: Path) -> Path | None:
    """The preview image A1111 shows for the model file or diffusers folder `path`, or None."""
    base = path.parent / (path.stem if path.is_file() else path.name)
    for ext in PREVIEW_EXTENSIONS:
        for candidate in (base.with_name(f"{base.name}.{ext}"), base.with_name(f"{base.name}.preview.{ext}")):
            if candidate.is_file():
                return candidate
    return None


def _text(path: Path) -> str:
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return f.read(DESCRIPTION_BYTES).strip()
    except OSError:
        return ""


def user_metadata(path: Path) -> dict:
    """A1111's `NAME.json` beside the model file (the card editor's: description, activation text, preferred weight),
    {} where there is none or it is not a JSON object (a broken file never hides the card)."""
    base = path.parent / (path.stem if path.is_file() else path.name)
    json_file = base.with_name(base.name + ".json")
    if not json_file.is_file():
        return {}
    try:
        data = load_file(json_file, max_bytes=USER_METADATA_BYTES, what=str(json_file))
    except (BadJson, OSError, UnicodeDecodeError):
        return {}
    return data if isinstance(data, dict) else {}


def card(kind: str, name: str, path: Path, value: str = "") -> Card:
    """The card of one file, its preview, description and user metadata read from beside it."""
    meta = user_metadata(path)
    base = path.parent / (path.stem if path.is_file() else path.name)
    description = meta.get("description") if isinstance(meta.get("description"), str) else ""
    if not description:
        for suffix in (".txt", ".description.txt"):
            description = _text(base.with_name(base.name + suffix))
            if description:
                break
    activation = meta.get("activation text")
    try:
        weight = float(meta.get("preferred weight") or 0.0)
    except (TypeError, ValueError):
        weight = 0.0
    return Card(kind, name, path, preview_of(path), description.strip(),
                activation.strip() if isinstance(activation, str) else "", weight if 0 < abs(weight) < 100 else 0.0,
                value)


def lora_cards() -> list[Card]:
    from lowvram_gen.networks.lora import available_loras

    return sorted((card("lora", n, p) for n, p in available_loras().items()), key=lambda c: c.name.lower())


def embedding_cards() -> list[Card]:
    from lowvram_gen.networks.embeddings import available_embeddings

    return sorted((card("embedding", n, p) for n, p in available_embeddings().items()), key=lambda c: c.name.lower())


def checkpoint_cards(models_folder=None) -> list[Card]:
    """The local checkpoints of the Model list (models/discover.py), each with the Model box value it sets; the
    embedded tiny models and the hub cache's repos have no file beside which a preview could be."""
    from lowvram_gen.models.discover import local_checkpoints

    cards = [card("checkpoint", Path(s).stem if Path(s).is_file() else Path(s).name, Path(s), s)
             for s in dict.fromkeys(local_checkpoints(models_folder))]
    return sorted(cards, key=lambda c: c.name.lower())


def cards_of(kind: str, models_folder=None) -> list[Card]:
    """The cards of `kind` (a key of KINDS), sorted by name (ignoring case), as the folders hold them now."""
    if kind == "lora":
        return lora_cards()
    if kind == "embedding":
        return embedding_cards()
    if kind == "checkpoint":
        return checkpoint_cards(models_folder)
    raise ValueError(f"extra-network kind {kind!r}: allowed {', '.join(KINDS)}")


def matching(cards: list[Card], query: str) -> list[Card]:
    """The cards whose name, file name or description holds every word of `query` (ignoring case), as A1111's search
    box filters them; an empty query keeps all. (Not the folders above the file: every card would match their
    words.)"""
    words = (query or "").lower().split()
    return [c for c in cards if all(w in f"{c.name}\n{c.path.name}\n{c.description}".lower() for w in words)]


def _number(weight: float) -> str:
    return f"{weight:g}"  # 1.0 -> "1", as A1111's JavaScript writes the multiplier


def default_weight() -> str:
    """The weight of a LoRA tag a card or the picker adds, as the prompt shows it ("1")."""
    return _number(DEFAULT_MULTIPLIER)


def tag(c: Card, multiplier: float = DEFAULT_MULTIPLIER) -> str:
    """What a click on `c` puts in the prompt: `<lora:NAME:W>` (and the activation text), an embedding's name; for a
    checkpoint card, the Model box's value."""
    if c.kind == "lora":
        text = f"<lora:{c.name}:{_number(c.preferred_weight or multiplier)}>"
        return f"{text} {c.activation_text}" if c.activation_text else text
    if c.kind == "embedding":
        return c.name
    return c.value or str(c.path)


def _removable(c: Card, text: str) -> re.Pattern:
    """The tag of `c` as it may already be in a prompt: a LoRA's at any weight (A1111 takes it out so), with its
    activation text; an embedding's name as a word."""
    if c.kind == "lora":
        pattern = rf"<lora:{re.escape(c.name)}(?::[^>]*)?>"
        if c.activation_text:
            pattern += rf"(?:\s*{re.escape(c.activation_text)})?"
        return re.compile(pattern)
    return re.compile(rf"(?<![\w-]){re.escape(text)}(?![\w-])")


def toggled(prompt: str | None, c: Card, multiplier: float = DEFAULT_MULTIPLIER) -> str:
    """`prompt` after a click on `c`: its tag added at the end after a space, or, where the prompt has it already,
    taken out (A1111's cardClicked: tryToRemoveExtraNetworkFromPrompt, else add)."""
    prompt = prompt or ""
    text = tag(c, multiplier)
    pattern = _removable(c, text)
    if pattern.search(prompt):
        out = pattern.sub("", prompt, count=1)
        return re.sub(r"[ \t]{2,}", " ", out).strip()
    return appended(prompt, text)


def appended(prompt: str | None, text: str) -> str:
    """`prompt` with `text` added at its end, a space between (A1111's extra_networks_add_text_separator)."""
    prompt = (prompt or "").rstrip()
    return f"{prompt} {text}" if prompt else text


def find_card(kind: str, name: str, models_folder=None) -> Card | None:
    """The card of `kind` named `name` exactly, or None: how a client's choice becomes a file (never by its path)."""
    if kind not in KINDS or not isinstance(name, str):
        return None
    return next((c for c in cards_of(kind, models_folder) if c.name == name), None)


__all__ = ["Card", "DEFAULT_MULTIPLIER", "KINDS", "PREVIEW_EXTENSIONS", "appended", "card", "cards_of",
           "default_weight", "find_card", "matching", "preview_of", "tag", "toggled", "user_metadata"]
