"""The LoRA and embedding files a job names, found before any model is loaded.

A LoRA is always named on purpose (`<lora:NAME>` in the prompt, `--lora NAME`), and so is an embedding
written `embedding:NAME`: a name that matches no file is bad input, and it is refused with the validation
errors, before the model loads (a minute for SDXL on a small machine) rather than after. A bare word that
spells an embedding's file name is not a reference: A1111 reads every other word as text, so a word with no
file behind it is just a word and is never refused here. LoRA tags in the negative prompt are not applied
(the job warns about them), so they are not looked up either.

The REST API asks for A1111's tolerance instead (`Names.left_out`): a prompt's `<lora:NAME>` whose NAME matches no
file is taken out of the prompt with a warning, and the job runs without it, as A1111 runs it ("Networks not found"),
so scripts written for A1111 keep working; the CLI, the UI and batch lines keep refusing it.

Only the folders are listed (no torch, no file is opened); `Names` lists them once, so a batch checks every
line of its prompt file against one listing.
"""

from __future__ import annotations

from pathlib import Path
from typing import Iterable

from lowvram_gen.errors import InvalidRequest
from lowvram_gen.networks import embeddings, files, lora
from lowvram_gen.networks.tags import extract_lora_tags, parse_lora_flag, without_loras


class Names:
    """The LoRA and embedding files there are, listed when first needed, and the check of a job's names."""

    def __init__(self):
        self._loras: dict[str, Path] | None = None
        self._embeddings: dict[str, Path] | None = None

    def loras(self) -> dict[str, Path]:
        if self._loras is None:
            self._loras = lora.available_loras()
        return self._loras

    def embeddings(self) -> dict[str, Path]:
        if self._embeddings is None:
            self._embeddings = embeddings.available_embeddings()
        return self._embeddings

    def check(self, prompt: str, negative_prompt: str = "", loras: Iterable[str] = ()) -> None:
        """InvalidRequest naming the first LoRA (`--lora` values first, then the prompt's tags) or
        `embedding:NAME` that matches no file, where it was looked for and what is there."""
        text, refs, _ = extract_lora_tags(prompt or "")
        negative, _, _ = extract_lora_tags(negative_prompt or "")
        for ref in [parse_lora_flag(f) for f in loras] + refs:
            files.find(ref.name, self.loras(), "LoRA", lora.lora_dirs(), lora.SUFFIXES)
        for name in embeddings.explicit_names(text) + embeddings.explicit_names(negative):
            files.find(name, self.embeddings(), "embedding", embeddings.embedding_dirs(), embeddings.SUFFIXES)

    def left_out(self, prompt: str, where: str = "prompt") -> tuple[str, list[str]]:
        """A1111's tolerance of a LoRA it cannot find: (`prompt` without the `<lora:NAME>` tags whose NAME matches
        no file, a warning naming each), for the API; the tags of LoRAs that are there stay as they are."""
        missing = []
        for ref in extract_lora_tags(prompt or "")[1]:
            try:
                files.find(ref.name, self.loras(), "LoRA", lora.lora_dirs(), lora.SUFFIXES)
            except InvalidRequest:
                missing.append(ref.name)
        if not missing:
            return prompt, []
        return without_loras(prompt, set(missing)), [
            f"LoRA {name!r} of the {where} not found: its tag was left out and the job ran without it, as A1111 "
            "does (Networks not found)" for name in dict.fromkeys(missing)]


def check_names(prompt: str, negative_prompt: str = "", loras: Iterable[str] = ()) -> None:
    """`Names().check(...)` for one job."""
    Names().check(prompt, negative_prompt, loras)
