"""A1111's token counter on each prompt box (txt2img, img2img, Inpaint; prompt and negative prompt): `n/75`, and
`n/150`, `n/225`... once the prompt runs past a chunk, counted as our text encoders will see the prompt.

A1111's rule (its `update_token_counter`): the prompt without its extra-network tags (`<lora:...>`), each variant of
its prompt-editing schedule counted and the longest shown; a count is 75 for each chunk before the last (a BREAK
or the comma backtrack closes a chunk early, and the count says so) plus the last chunk's tokens, shown against the
chunks' room (75 x chunks). Here the chunks are prompting/chunks.py's (`token_weights`, what prompting/encode.py
encodes), so BREAK, the comma backtrack and a textual-inversion embedding (counted as its vectors, kept whole in one
chunk) count exactly as they are encoded.

The tokenizer is the UI model's own (its folder's `tokenizer/`: the embedded tiny models' too), loaded alone and
kept (a few per process); never the model. A single-file checkpoint, a hub id or a model that cannot be found counts
with CLIP's vocabulary shipped with lowvram-gen (models/offline_configs.py), which every SD family's CLIP tokenizer
uses: the same count. Prompt editing (`[a:b:10]`, `[a|b]`, AND) is counted by `prompting.schedule.variants` where
it is built; without it the text is counted as parsed today.

The page asks for the count as the user types, as A1111's does: each change of the box restarts a timer in the
browser, which clicks the counter's hidden button DEBOUNCE_MS after the last key; that click, a Steps or Model change
and the page's load count, unqueued, so a running job never holds the counter back.
"""

from __future__ import annotations

import copy
import html
import logging
import math
import re
import threading
from functools import lru_cache
from pathlib import Path

log = logging.getLogger(__name__)
DEBOUNCE_MS = 500  # A1111's token counter waits as long after the last key
_LOCK = threading.Lock()
# A1111's way: each change of the box (re)starts a timer in the browser, and the timer clicks the counter's hidden
# button DEBOUNCE_MS after the last key; the button's click asks the server for the count
DEBOUNCE_JS = """() => {
  window.lowvramTokenTimers = window.lowvramTokenTimers || {};
  const button = "%s";
  clearTimeout(window.lowvramTokenTimers[button]);
  window.lowvramTokenTimers[button] = setTimeout(() => {
    const found = document.getElementById(button);
    if (found) found.click();
  }, %d);
}"""


def _variants(text: str, steps: int) -> list[str]:
    """Every prompt the schedule uses (prompt editing, alternation, `AND` parts: prompting.schedule.variants)."""
    from lowvram_gen.prompting.schedule import variants

    try:
        return list(variants(text, steps)) or [text]
    except Exception:  # noqa: BLE001 - a half-typed prompt: counted as typed, as A1111's counter does
        return [text]


@lru_cache(maxsize=4)
def _tokenizer_of(folder: str | None):
    from transformers import AutoTokenizer, CLIPTokenizer

    if folder is not None:
        try:
            return AutoTokenizer.from_pretrained(folder)
        except (OSError, ValueError) as exc:
            log.warning("token counter: could not read the tokenizer in %s (%s); counting with CLIP's", folder, exc)
    from lowvram_gen.models.offline_configs import clip_bpe_files

    return CLIPTokenizer.from_pretrained(str(clip_bpe_files()), model_max_length=77)  # vocab.json, merges.txt


def _tokenizer_folder(model: str | None) -> str | None:
    """The model's first tokenizer folder: an embedded tiny model (built once) or a diffusers folder; None for the
    rest (a file, a checkpoint name, a hub id: never fetched for a count)."""
    from lowvram_gen.models.tiny import TINY_MODELS, ensure_tiny

    spec = (model or "").strip()
    if not spec:
        return None
    folder = ensure_tiny(spec) if spec in TINY_MODELS else Path(spec).expanduser()
    tokenizer = folder / "tokenizer"
    return str(tokenizer) if (tokenizer / "tokenizer_config.json").is_file() else None


def tokenizer_for(model: str | None):
    """The tokenizer a prompt for `model` is counted with (kept: a few per process)."""
    with _LOCK:
        return _tokenizer_of(_tokenizer_folder(model))


@lru_cache(maxsize=256)
def _vectors(path: str, stamp: tuple[int, int]) -> int:
    """How many vectors (tokens) an embedding file holds (its first encoder's, for an SDXL file)."""
    from lowvram_gen.networks.embeddings import read_embedding

    vectors = read_embedding(Path(path))
    return int(next(iter(vectors.values())).shape[0])


def _with_embeddings(tokenizer, text: str):
    """(text, tokenizer, convert, groups) with the embeddings the text names added to a copy of the tokenizer as a
    pipeline adds them (networks/embeddings.py: `name`, `name_1`... and diffusers' prompt conversion); the
    tokenizer as it is when it names none."""
    from lowvram_gen.networks.embeddings import _EXPLICIT, available_embeddings

    available = available_embeddings()
    text = _EXPLICIT.sub(lambda m: m.group(1), text)
    used = {}
    for stem, path in available.items():
        pattern = re.compile(rf"(?<![\w-]){re.escape(stem)}(?![\w-])", re.IGNORECASE)
        if pattern.search(text) and stem not in tokenizer.get_vocab():
            try:
                st = path.stat()
                used[stem] = _vectors(str(path), (st.st_mtime_ns, st.st_size))
            except Exception as exc:  # noqa: BLE001 - an unreadable file is the job's error; counted as text here
                log.debug("token counter: %s not counted as an embedding: %s", path, exc)
                continue
            text = pattern.sub(stem, text)
    if not used:
        return text, tokenizer, None, None
    from diffusers.loaders.textual_inversion import TextualInversionLoaderMixin

    from lowvram_gen.prompting.chunks import embedding_groups

    tokenizer = copy.deepcopy(tokenizer)
    for stem, count in used.items():
        tokenizer.add_tokens([stem] + [f"{stem}_{i}" for i in range(1, count)])
    convert = lambda part: TextualInversionLoaderMixin._maybe_convert_prompt(None, part, tokenizer)  # noqa: E731
    return text, tokenizer, convert, embedding_groups(tokenizer)


def count(text: str, tokenizer, steps: int = 20) -> tuple[int, int]:
    """(tokens, room) of `text` as A1111's counter gives them: the longest variant of its schedule, LoRA tags out."""
    from lowvram_gen.networks.tags import extract_lora_tags
    from lowvram_gen.prompting.chunks import chunk_size, token_weights

    size = chunk_size(tokenizer)
    best = 0
    for variant in _variants(text or "", steps):
        try:
            variant = extract_lora_tags(variant)[0]
        except ValueError:  # a half-typed <lora:x:> tag: counted as typed
            pass
        plain, tok, convert, groups = _with_embeddings(tokenizer, variant)
        try:
            chunks = token_weights(tok, plain, convert=convert, groups=groups)
        except ValueError:  # a weight A1111 refuses too, `(x:1.2.3)`: counted as plain text while it is typed
            chunks = token_weights(tok, plain.replace("(", " ").replace(")", " "), convert=convert, groups=groups)
        best = max(best, size * (len(chunks) - 1) + chunks[-1].length)
    return best, size * math.ceil(max(best, 1) / size)


def shown(tokens: int, room: int) -> str:
    """The counter's HTML: `n/75`."""
    return f'<span class="lowvram-token-count">{tokens}/{room}</span>'


def counted(text, steps, model) -> str:
    """The counter for a prompt box: its text, the tab's Steps (the schedule's) and Model box."""
    try:
        steps = int(steps) if steps else 20
    except (TypeError, ValueError):
        steps = 20
    try:
        return shown(*count(text or "", tokenizer_for(model), max(1, min(steps, 150))))
    except Exception as exc:  # noqa: BLE001 - the counter never stops the page; the job says what is wrong
        log.warning("token counter: %s", exc)
        return shown(0, 75)


# the counter sits over its prompt box's bottom-right corner, as A1111's sits over the top-right one: no row of its own
CSS = """
.lowvram-token-counter { margin-top: -2.4em !important; margin-bottom: 0.2em !important; text-align: right;
  padding-right: 1.2em; pointer-events: none; z-index: 5; min-height: 0 !important; font-size: 0.85em; opacity: 0.8; }
"""


def box(elem_id: str):
    """The counter (elem_id `elem_id`), a small line under its prompt box, and its hidden button
    (`{elem_id}-button`). Returns (counter, button)."""
    import gradio as gr

    counter = gr.HTML(shown(0, 75), elem_id=elem_id, elem_classes=["lowvram-token-counter"], padding=False)
    button = gr.Button("count tokens", visible="hidden", elem_id=f"{elem_id}-button")
    return counter, button


def wire(app, prompt, counter: tuple, steps, model) -> None:
    """Count `prompt` into `counter` (`box`'s) as it is typed (debounced in the browser), when the Steps or the
    Model change, and when the page loads (a remembered prompt, or one a reload kept)."""
    shown_in, button = counter
    inputs, js = [prompt, steps, model], DEBOUNCE_JS % (html.escape(button.elem_id, quote=True), DEBOUNCE_MS)
    prompt.change(None, None, None, js=js, queue=False, api_visibility="private", show_progress="hidden")
    for source in (button.click, steps.release, model.change, app.load):
        source(counted, inputs, [shown_in], queue=False, api_visibility="private", show_progress="hidden",
               **({} if source == app.load else {"trigger_mode": "always_last"}))
