"""Everything a job does with LoRAs and embeddings, in one call for the engine/session.

`prepare()` runs after the job's first preset is applied and before the pipeline runs: it takes the
`<lora:...>` tags out of the prompts, switches the job's LoRAs on (and the previous job's off), loads
the embeddings the prompts name, and returns the prompts for the text encoders, the A1111 fields
for the PNG and warnings. The PNG keeps the prompt as typed, tags included, as A1111 does.

Hires fix's own prompts (A1111's Hires prompt / Hires negative prompt) go the same way: their embeddings are
loaded with the job's, and their LoRA tags are the prompt's (the request refuses others, see
`GenerationRequest._check_hires_loras`): they are only taken out.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Iterable

import re

from lowvram_gen.networks.embeddings import _EXPLICIT, available_embeddings, load_embeddings_used
from lowvram_gen.networks.lora import activate_loras
from lowvram_gen.networks.metadata import network_fields
from lowvram_gen.networks.tags import extract_lora_tags, merge_refs, parse_lora_flag


@dataclass
class NetworkJob:
    prompt: str  # for the text encoder: tags out, `embedding:x` -> `x`
    negative_prompt: str
    fields: dict = field(default_factory=dict)  # 'Lora hashes' / 'TI hashes' for the A1111 parameters
    warnings: list[str] = field(default_factory=list)
    hires: tuple[str, str] | None = None  # hires fix's (prompt, negative prompt) for the encoders, where given


def prepare(pipe, prompt: str, negative_prompt: str = "", loras: Iterable[str] = (),
            reapply_memory: Callable[[], object] | None = None,
            hires: tuple[str, str] | None = None) -> NetworkJob:
    """`loras`: `--lora NAME[:W]` values; they come first, then the prompt's tags. `hires`: the second pass's own
    (prompt, negative prompt), or None."""
    text, refs, warnings = extract_lora_tags(prompt)
    negative, negative_refs, more = extract_lora_tags(negative_prompt)
    warnings += more
    if negative_refs:
        names = ", ".join(r.name for r in negative_refs)
        warnings.append(f"LoRA tags in the negative prompt are not applied ({names}); put them in the prompt")
    refs, more = merge_refs([parse_lora_flag(f) for f in loras] + refs)
    warnings += more
    warnings += activate_loras(pipe, refs, reapply_memory)
    used = load_embeddings_used(pipe, text, negative, reapply_memory)
    embeddings, warnings = list(used.used), warnings + used.warnings
    second = None
    if hires is not None:
        texts = [extract_lora_tags(t)[0] for t in hires]  # the same LoRAs as the prompt's (the request checked)
        hires_used = load_embeddings_used(pipe, *texts, reapply_memory)
        second = (hires_used.prompt, hires_used.negative_prompt)
        embeddings += hires_used.used
        warnings += [w for w in hires_used.warnings if w not in warnings]
    return NetworkJob(used.prompt, used.negative_prompt, network_fields(refs, embeddings), warnings, second)


def uses_networks(prompt: str, negative_prompt: str = "", loras: Iterable[str] = ()) -> bool:
    """Whether a job would load LoRAs or textual-inversion embeddings (they change the text encoders): a
    --lora flag, a `<lora:...>` tag, `embedding:name`, or the name of an embedding file in a prompt, as
    `prepare` finds them. text_encoders = "reloaded" is not planned for such a job: the encoders read from disk
    for each job would come without the LoRA's text-encoder layers and the embeddings' token rows."""
    if list(loras) or extract_lora_tags(prompt or "")[1]:
        return True
    texts = (prompt or "", negative_prompt or "")
    if any(_EXPLICIT.search(t) for t in texts):
        return True
    return any(re.search(rf"(?<![\w-]){re.escape(stem)}(?![\w-])", t, re.IGNORECASE)
               for stem in available_embeddings() for t in texts)


def request_uses_networks(request) -> bool:
    """`uses_networks` for every prompt of a GenerationRequest: the first pass's and hires fix's own."""
    return uses_networks(request.prompt, request.negative_prompt, request.loras) or bool(
        request.hires and uses_networks(request.hires_prompt, request.hires_negative))
