"""A1111's infotext fields for the networks a job used, so Civitai and sd-parsers find them.

A1111 writes `Lora hashes: "name: 0123456789ab, other: ..."` and `TI hashes: "name: ..."` (the
value is quoted because it holds `:` and `,`; `outputs.a1111_parameters` does that). The name is the
one typed in the prompt with `:` and `,` removed; the hash is `lora.lora_hash` / the embedding's
whole-file sha256, 12 hex digits each.
"""

from __future__ import annotations

from lowvram_gen.networks.tags import LoraRef


def _clean(name: str) -> str:
    return name.replace(":", "").replace(",", "")


def network_fields(loras: list[LoraRef] = (), embeddings: list = ()) -> dict[str, str]:
    """{'Lora hashes': ..., 'TI hashes': ...}, only the non-empty ones; merge into the A1111 fields.

    `embeddings`: `embeddings.UsedEmbedding` items (anything with `.name` and `.hash`)."""
    from lowvram_gen.networks.lora import find_lora, lora_hash

    fields = {}
    pairs = []
    for ref in loras:
        path = find_lora(ref.name)
        shown = ref.name if ref.name in (path.stem, path.name) else path.stem  # a path: A1111 shows names
        pairs.append(f"{_clean(shown)}: {lora_hash(path)}")
    if pairs:
        fields["Lora hashes"] = ", ".join(dict.fromkeys(pairs))
    seen = {}
    for emb in embeddings:
        seen.setdefault(_clean(emb.name), emb.hash)
    if seen:
        fields["TI hashes"] = ", ".join(f"{k}: {v}" for k, v in seen.items())
    return fields
