"""Textual-inversion embeddings used by name in prompts, as in A1111, plus `embedding:name`.

A1111 loads every file in `embeddings/` and swaps in the vectors wherever the prompt's tokens spell a
file's stem; a misspelt name is just text. We do the same for bare names (whole words, any case) and
also accept ComfyUI's explicit `embedding:name`, which is the one form that can say "unknown
embedding": it raises InvalidRequest listing the files there are.

An embedding is loaded once per pipeline with diffusers' `load_textual_inversion` as a new token
named like the file (multi-vector files get `name_1`, `name_2`... which diffusers' prompt conversion
expands). Files: A1111 `.pt` (`string_to_param: {'*': tensor}`, read weights-only), `.safetensors`
with `emb_params`, or SDXL's `clip_l` (first text encoder) and `clip_g` (second). A file that does
not fit the model (an SD 1.5 embedding on SDXL; an SDXL one, `clip_l`/`clip_g`, on SD 1.x/2.x or the
SDXL refiner, even where `clip_l`'s width matches) is skipped with a warning when named bare, an error
when named with `embedding:`; A1111 skips them too (its width check: 2048 is not 768).
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from lowvram_gen import families
from lowvram_gen.errors import InvalidRequest, ModelLoadError
from lowvram_gen.networks import files
from lowvram_gen.networks.hooks import hooks_lifted

log = logging.getLogger(__name__)

SUFFIXES = (".safetensors", ".pt", ".bin")
_STATE = "_lowvram_embeddings"  # on the pipeline: {stem: _Loaded}
_EXPLICIT = re.compile(r"\bembedding:([^\s,()\[\]{}<>|]+)", re.IGNORECASE)
_PAIRS = (("text_encoder", "tokenizer"), ("text_encoder_2", "tokenizer_2"))


@dataclass
class UsedEmbedding:
    name: str  # the file stem: the token in the prompt
    path: Path

    @property
    def hash(self) -> str:
        """A1111's `TI hashes` value: the first 12 hex digits of the whole file's sha256."""
        return files.sha256(self.path)[:12]


@dataclass
class EmbeddingsUsed:
    prompt: str  # what the text encoder gets: `embedding:x` -> `x`
    negative_prompt: str
    used: list[UsedEmbedding] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)


@dataclass
class _Loaded:
    stamp: tuple[int, int]
    rows: dict  # text encoder attribute -> (token ids, vectors): restored if the encoder is reloaded


def explicit_names(text: str) -> list[str]:
    """The names written `embedding:NAME` in `text`: the one form that says "this is an embedding"."""
    return [m.group(1) for m in _EXPLICIT.finditer(text or "")]


def embedding_dirs() -> list[Path]:
    return files.kind_dirs("embeddings")


def available_embeddings() -> dict[str, Path]:
    found: dict[str, Path] = {}
    for folder in embedding_dirs():
        for stem, path in files.scan(folder, SUFFIXES).items():
            found.setdefault(stem, path)
    return found


def read_embedding(path: Path) -> dict[str, object]:
    """{'clip_l' | 'clip_g' | 'any': tensor [vectors, dim]} from an embedding file, read safely."""
    import torch

    from lowvram_gen.models.safe_files import check_safetensors, unpickle_weights_only

    if path.suffix.lower() == ".safetensors":
        check_safetensors(path)
        from safetensors.torch import load_file

        data = load_file(str(path))
    else:
        data = unpickle_weights_only(path)
    if not isinstance(data, dict):
        raise ModelLoadError(f"embedding {path} holds a {type(data).__name__}, not a dict")
    if "clip_l" in data or "clip_g" in data:
        out = {k: data[k] for k in ("clip_l", "clip_g") if isinstance(data.get(k), torch.Tensor)}
    elif isinstance(data.get("string_to_param"), dict) and data["string_to_param"]:
        out = {"any": next(iter(data["string_to_param"].values()))}
    elif isinstance(data.get("emb_params"), torch.Tensor):
        out = {"any": data["emb_params"]}
    else:
        tensors = [v for v in data.values() if isinstance(v, torch.Tensor)]
        if len(tensors) != 1:
            raise ModelLoadError(f"embedding {path}: unknown layout (keys: {', '.join(map(str, list(data)[:6]))}); "
                                 "expected string_to_param, emb_params, clip_l/clip_g or one tensor")
        out = {"any": tensors[0]}
    for key, t in out.items():
        if not isinstance(t, torch.Tensor) or t.ndim not in (1, 2) or not t.is_floating_point():
            raise ModelLoadError(f"embedding {path}: {key} is not a float tensor of vectors")
        out[key] = t.detach().reshape(-1, t.shape[-1]).float()
    return out


def _plan(pipe, vectors: dict) -> list[tuple[str, str, object]]:
    """[(text encoder attr, tokenizer attr, vectors)] for this pipeline, or [] if the file does not fit."""
    encoders = [(te, tok) for te, tok in _PAIRS if getattr(pipe, te, None) is not None
                and getattr(pipe, tok, None) is not None]
    dims = [getattr(pipe, te).get_input_embeddings().weight.shape[-1] for te, _ in encoders]
    if len(encoders) == 2:  # SDXL: both vectors are needed
        pick = [vectors.get("clip_l"), vectors.get("clip_g")]
    elif len(encoders) == 1 and "clip_g" not in vectors:
        pick = [vectors.get("any", vectors.get("clip_l"))]  # a lone clip_l tensor is one tensor, as in A1111
    else:
        # an SDXL file (clip_l and clip_g) on a one-encoder model: its clip_l is 768 wide like SD 1.x's
        # token embeddings, but it was trained beside clip_g; A1111 skips it (2048 wide, not 768)
        return []
    if any(v is None or v.shape[-1] != d for v, d in zip(pick, dims)):
        return []
    return [(te, tok, v) for (te, tok), v in zip(encoders, pick)]


def takes_embeddings(pipe) -> bool:
    """Whether the pipeline loads textual-inversion embeddings: its family's record says (`textual_inversion`); a
    family no record knows is asked whether its pipeline object has diffusers' loader."""
    said = families.of_pipe(pipe).textual_inversion
    return hasattr(pipe, "load_textual_inversion") if said is None else said


def _describe(vectors: dict) -> str:
    return ", ".join(f"{k}: {tuple(v.shape)}" for k, v in vectors.items())


def _token_ids(tokenizer, name: str, count: int) -> list[int]:
    tokens = [name] + [f"{name}_{i}" for i in range(1, count)]
    return [tokenizer.convert_tokens_to_ids(t) for t in tokens]


def _load(pipe, name: str, path: Path, plan) -> _Loaded:
    rows = {}
    for te_attr, tok_attr, vec in plan:
        tokenizer = getattr(pipe, tok_attr)
        if name in tokenizer.get_vocab():
            raise InvalidRequest("embedding", name, f"{path.name}: the tokenizer already has a token {name!r}; "
                                 "rename the file to use it")
        try:
            pipe.load_textual_inversion(vec, token=name, text_encoder=getattr(pipe, te_attr), tokenizer=tokenizer)
        except ValueError as exc:
            raise ModelLoadError(f"embedding {path} could not be loaded: {exc}") from None
        rows[te_attr] = (_token_ids(tokenizer, name, vec.shape[0]), vec)
    return _Loaded(_stamp(path), rows)


def _stamp(path: Path) -> tuple[int, int]:
    st = path.stat()
    return st.st_mtime_ns, st.st_size


def _rows_intact(pipe, entry: _Loaded) -> bool:
    import torch

    for te_attr, (ids, vec) in entry.rows.items():
        weight = getattr(pipe, te_attr).get_input_embeddings().weight
        if weight.shape[0] <= max(ids) or weight.device.type == "meta":
            return False
        if not torch.equal(weight.detach()[ids].cpu(), vec.to(weight.dtype)):
            return False
    return True


def _restore_rows(pipe, entry: _Loaded) -> None:
    """A text encoder reloaded from disk lost the added rows; the tokenizer kept the tokens."""
    import torch

    for te_attr, (ids, vec) in entry.rows.items():
        tokenizer = getattr(pipe, _PAIRS[[p[0] for p in _PAIRS].index(te_attr)][1])
        encoder = getattr(pipe, te_attr)
        if encoder.get_input_embeddings().weight.shape[0] < len(tokenizer):
            encoder.resize_token_embeddings(len(tokenizer))
        weight = encoder.get_input_embeddings().weight
        with torch.no_grad():
            weight[ids] = vec.to(device=weight.device, dtype=weight.dtype)


def load_embeddings_used(pipe, prompt: str, negative: str = "",
                         reapply_memory: Callable[[], object] | None = None) -> EmbeddingsUsed:
    """Load the embeddings the prompts name (once per pipeline) and return the prompts for the
    text encoder, what was used (for `TI hashes`) and warnings."""
    available = available_embeddings()
    result = EmbeddingsUsed(prompt, negative)
    wanted: dict[str, tuple[Path, bool]] = {}  # stem -> (path, named explicitly)

    def explicit(match: re.Match) -> str:
        path = files.find(match.group(1), available, "embedding", embedding_dirs(), SUFFIXES)
        wanted[path.stem] = (path, True)
        return path.stem

    texts = [_EXPLICIT.sub(explicit, t) for t in (prompt, negative)]
    for stem, path in available.items():
        pattern = re.compile(rf"(?<![\w-]){re.escape(stem)}(?![\w-])", re.IGNORECASE)
        if any(pattern.search(t) for t in texts):
            texts = [pattern.sub(stem, t) for t in texts]  # the added token is spelt like the file
            wanted.setdefault(stem, (path, False))
    result.prompt, result.negative_prompt = texts
    if not wanted:
        return result
    if not takes_embeddings(pipe):
        result.warnings.append(f"{type(pipe).__name__} does not take textual-inversion embeddings: "
                               f"{', '.join(wanted)} ignored")
        return result
    loaded: dict[str, _Loaded] = getattr(pipe, _STATE, None) or {}
    todo, repair = [], []
    for stem, (path, named) in wanted.items():
        entry = loaded.get(stem)
        if entry is not None and entry.stamp == _stamp(path):
            if not _rows_intact(pipe, entry):
                repair.append(entry)
            result.used.append(UsedEmbedding(stem, path))
            continue
        if entry is not None:
            result.warnings.append(f"embedding {path.name} changed on disk; restart to use the new version")
            result.used.append(UsedEmbedding(stem, path))
            continue
        vectors = read_embedding(path)
        plan = _plan(pipe, vectors)
        if not plan:
            why = f"embedding {path} does not fit {type(pipe).__name__} ({_describe(vectors)}; " + (
                "an SDXL embedding, for SDXL models only)" if "clip_g" in vectors
                else "is it for another model family?)")
            if named:
                raise InvalidRequest("embedding", stem, why)
            result.warnings.append(why + ": skipped")
            continue
        todo.append((stem, path, plan))
    if todo or repair:
        with hooks_lifted(pipe, reapply_memory):
            for entry in repair:
                _restore_rows(pipe, entry)
            for stem, path, plan in todo:
                loaded[stem] = _load(pipe, stem, path, plan)
                result.used.append(UsedEmbedding(stem, path))
                log.info("loaded embedding %s", path)
        setattr(pipe, _STATE, loaded)
    return result
