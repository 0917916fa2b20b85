"""A parsed prompt as 77-token chunks of token ids and per-token weights, the way A1111 builds them.

Why chunks: CLIP sees 77 positions (BOS, 75 tokens, EOS). A1111 encodes a longer prompt 75 tokens
at a time, each chunk with its own BOS/EOS and padding, and concatenates the results, so nothing
past token 75 is dropped. Its rules, followed here (no torch needed):

* Each parsed fragment is tokenized on its own, without special tokens; its tokens take its weight.
* A chunk is full at 75 tokens. When the next token does not fit and the chunk had a comma in its
  last `backtrack` tokens (A1111's "comma padding backtrack", default 20), the tokens after that
  comma move to the next chunk, so a phrase is not cut in two.
* `BREAK` closes the current chunk early (an empty chunk too, for BREAK BREAK).
* A multi-vector textual-inversion embedding is never cut in two: when its tokens (one per vector)
  would not fit in what is left of the chunk, the chunk is closed (padded) and the embedding starts
  the next one (A1111's `tokenize_line`: `if len(chunk.tokens) + emb_len > chunk_length: next_chunk()`).
  `groups` names the embeddings: first token id -> the ids of all its vectors' tokens.
* A chunk is laid out [BOS] tokens [EOS] [PAD]...: with SD 1.x the pad token is EOS (A1111 pads with
  EOS), with SD 2.x / SDXL's second tokenizer it is the tokenizer's own pad token, as A1111 and
  diffusers' `encode_prompt` both do. BOS, EOS and padding have weight 1.
* An empty prompt is one chunk; a prompt ending in BREAK does not add an empty chunk.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from lowvram_gen.prompting.parse import is_break, parse_attention

COMMA_BACKTRACK = 20  # A1111's default for "comma_padding_backtrack"


@dataclass(frozen=True)
class TokenChunk:
    """One encoder input: `ids` and `weights` have the tokenizer's model_max_length entries (77);
    `length` is the number of prompt tokens in it (the rest is BOS, EOS and padding)."""

    ids: tuple[int, ...]
    weights: tuple[float, ...]
    length: int

    @property
    def attention_mask(self) -> list[int]:
        """1 up to and including EOS, 0 on padding: what the tokenizer's own padding would give."""
        return [1] * (self.length + 2) + [0] * (len(self.ids) - self.length - 2)


def chunk_size(tokenizer) -> int:
    """Prompt tokens per chunk: model_max_length less BOS and EOS (75 for CLIP)."""
    limit = getattr(tokenizer, "model_max_length", 77)
    return limit - 2 if 2 < limit <= 1024 else 75


def _layout(tokenizer, ids: list[int], weights: list[float]) -> TokenChunk:
    size = chunk_size(tokenizer)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    fill = size - len(ids)
    return TokenChunk(
        ids=tuple([tokenizer.bos_token_id, *ids, tokenizer.eos_token_id] + [pad] * fill),
        weights=tuple([1.0, *weights, 1.0] + [1.0] * fill),
        length=len(ids),
    )


def empty_chunk(tokenizer) -> TokenChunk:
    """The chunk of an empty prompt: what A1111 pads the shorter of prompt and negative with."""
    return _layout(tokenizer, [], [])


def embedding_groups(tokenizer) -> dict[int, tuple[int, ...]]:
    """The multi-vector textual inversions added to `tokenizer` as diffusers adds them (a token `name`,
    then `name_1`, `name_2`...; its `maybe_convert_prompt` expands `name` to all of them): first token
    id -> the ids of all of them, for those with more than one vector."""
    added = getattr(tokenizer, "added_tokens_encoder", None) or {}
    special = set(getattr(tokenizer, "all_special_tokens", []))
    groups: dict[int, tuple[int, ...]] = {}
    for token, first in added.items():
        if token in special or f"{token}_1" not in added:
            continue
        ids, i = [first], 1
        while f"{token}_{i}" in added:
            ids.append(added[f"{token}_{i}"])
            i += 1
        groups[first] = tuple(ids)
    return groups


def token_weights(tokenizer, text: str, *, backtrack: int = COMMA_BACKTRACK,
                  convert: Callable[[str], str] | None = None,
                  groups: dict[int, tuple[int, ...]] | None = None) -> list[TokenChunk]:
    """`text` (A1111 syntax) as the chunks its text encoder will see. `convert` rewrites each
    fragment before tokenizing (diffusers' textual-inversion `maybe_convert_prompt`); `groups`: the
    multi-vector embeddings' token ids (`embedding_groups`), kept whole in one chunk."""
    size = chunk_size(tokenizer)
    comma = tokenizer.get_vocab().get(",</w>")
    parts = parse_attention(text)
    texts = [p[0] if convert is None else convert(p[0]) for p in parts if not is_break(p)]
    tokenized = iter(tokenizer(texts, add_special_tokens=False, truncation=False, verbose=False)["input_ids"]
                     if texts else [])

    chunks: list[TokenChunk] = []
    ids: list[int] = []
    weights: list[float] = []
    last_comma = -1

    def close() -> None:
        nonlocal ids, weights, last_comma
        chunks.append(_layout(tokenizer, ids, weights))
        ids, weights, last_comma = [], [], -1

    for part in parts:
        if is_break(part):
            close()
            continue
        weight = part[1]
        tokens = next(tokenized)
        for position, token in enumerate(tokens):
            if token == comma:
                last_comma = len(ids)
            elif backtrack and len(ids) == size and last_comma != -1 and len(ids) - last_comma <= backtrack:
                keep = last_comma + 1
                moved_ids, moved_weights = ids[keep:], weights[keep:]
                ids, weights = ids[:keep], weights[:keep]
                close()
                ids, weights = moved_ids, moved_weights
            if len(ids) == size:
                close()
            group = groups.get(token) if groups else None
            if group and tuple(tokens[position:position + len(group)]) == group \
                    and len(ids) + len(group) > size >= len(group):
                close()  # the whole embedding goes to the next chunk, as in A1111
            ids.append(token)
            weights.append(weight)
    if ids or not chunks:
        close()
    return chunks
