"""Prompt embeddings with A1111 weighting and chunking, for diffusers' SD 1.x/2.x and SDXL pipelines.

Why our own encoder and not compel or sd_embed: see docs/prompt-syntax.md. In short, A1111's math
is small (scale each token's hidden state by its weight, then restore the chunk's mean), and none
of the libraries does it with A1111's chunking, BREAK, and first-chunk pooled embeds.

What it follows from diffusers' `encode_prompt`, so that a plain prompt of up to 75 tokens gives
the same tensors as passing the string: the layer taken (SD: the last hidden state; SDXL:
hidden_states[-2] of both encoders, concatenated on the feature axis; for clip skip see `layer_for`),
the attention mask only for encoders configured to use one, the output dtype (SD: text_encoder's,
SDXL: text_encoder_2's), and SDXL's zeros for an empty negative prompt when the model says
`force_zeros_for_empty_prompt`.
What it follows from A1111: chunks of 75 tokens (see `chunks`), one encoder call per chunk, the
weights applied per chunk and per encoder with the chunk's mean restored ("Original" emphasis),
chunks concatenated on the sequence axis, SDXL's pooled embeds from the first chunk, and positive
and negative padded with empty-prompt chunks to the same length so CFG can batch them: A1111's
"Pad prompt/negative prompt" option, off by default there (its default runs the UNet on each at its
own length; see docs/prompt-syntax.md, "Differences from A1111").
Clip skip is A1111's "Clip skip" N (1: off), not diffusers' `clip_skip` (layers skipped, N - 1); unlike
diffusers (whose negative prompt ignores `clip_skip`), it applies to both prompts, as in A1111.

The encoders are called as modules, so accelerate/diffusers offload hooks (model CPU offload,
group offload) move them as usual; token ids go to each encoder's execution device.
"""

from __future__ import annotations

import math

from dataclasses import dataclass, field
from typing import Any

from lowvram_gen.families import Task
from lowvram_gen.families.execution import task_of
from lowvram_gen.prompting.chunks import embedding_groups, empty_chunk, token_weights
from lowvram_gen.prompting.parse import find_unsupported, strip_syntax, uses_syntax

MIN_MEAN_RATIO = 0.25  # see _emphasis: outside [0.25, 4] the mean carries no information


@dataclass
class PromptEmbeds:
    """What a diffusers SD/SDXL pipeline call takes instead of prompt strings; batch = num_images."""

    prompt_embeds: Any
    negative_prompt_embeds: Any = None
    pooled_prompt_embeds: Any = None
    negative_pooled_prompt_embeds: Any = None
    warnings: list[str] = field(default_factory=list)

    def as_kwargs(self) -> dict:
        names = ("prompt_embeds", "negative_prompt_embeds", "pooled_prompt_embeds", "negative_pooled_prompt_embeds")
        return {name: getattr(self, name) for name in names if getattr(self, name) is not None}


def prompt_encoding(pipe) -> str | None:
    """The record's prompt encoding ('clip', 'clip_pair') for its txt2img and img2img pipelines, or None for pipelines
    whose prompts we do not encode (SD3, Flux, ..., and the family's other pipelines)."""
    record, task = task_of(pipe)
    return record.prompt_encoding if task in (Task.TXT2IMG, Task.IMG2IMG) else None


def syntax_warnings(prompt: str, negative: str = "") -> list[str]:
    """find_unsupported for both prompts, the negative one's prefixed."""
    return [*find_unsupported(prompt or ""), *(f"negative prompt: {w}" for w in find_unsupported(negative or ""))]


def plain_prompt_for(pipe, text: str) -> tuple[str, list[str]]:
    """The string to pass to a pipeline `encode_prompts` does not handle, and the warnings to show:
    its own text encoders (T5, ...) would read `(word:1.3)` as characters, so the syntax is stripped
    and the user told that weights are ignored. For SD/SDXL the text is returned as typed."""
    if prompt_encoding(pipe) is not None or not uses_syntax(text or ""):
        return text, []
    plain = strip_syntax(text)
    return plain, [f"{type(pipe).__name__} does not take A1111 weights: brackets, weights, escapes and "
                   f"BREAK are ignored and the text is encoded as {plain!r}", *find_unsupported(text)]


def _input_device(module, fallback):
    """Where `module`'s inputs must be: its offload hook's onload device, else its own device."""
    try:
        from diffusers.utils.torch_utils import get_module_execution_device

        return get_module_execution_device(module)
    except Exception:  # an older diffusers, or a module without parameters
        return fallback


def _emphasis(z, weights):
    """A1111's "Original" emphasis on one chunk: multiply, then restore the mean (in float32)."""
    import torch

    if all(w == 1.0 for w in weights):
        return z  # exactly what it was: plain prompts stay bit-identical to diffusers
    z32 = z.float()
    before = z32.mean()
    z32 = z32 * torch.tensor(weights, dtype=torch.float32, device=z.device).reshape(1, -1, 1)
    ratio = float(before / z32.mean())
    # A real CLIP's hidden states have a clear non-zero mean and the ratio stays near 1. A mean near
    # zero (untrained LayerNorm biases, as in the embedded tiny models) makes it noise that can blow
    # the embedding up to NaN in the UNet: then the weights are applied without the rescale.
    if math.isfinite(ratio) and MIN_MEAN_RATIO <= ratio <= 1 / MIN_MEAN_RATIO:
        z32 = z32 * ratio
    return z32.to(z.dtype)


def layer_for(kind: str, clip_skip: int) -> int:
    """The hidden state (index into `hidden_states`) that A1111's "Clip skip" N takes.

    SD 1.x/2.x: hidden_states[-N] through the encoder's final layer norm (N = 1 is the encoder's own
    output, the last layer through that norm), as A1111 does and as diffusers' `clip_skip = N - 1`. For SD 2.x
    A1111 itself ignores the setting (its OpenCLIP wrapper always takes the penultimate layer, which a
    diffusers SD 2.x text encoder already ends at); diffusers applies it as here (Forge applies it too).
    SDXL: hidden_states[-max(N, 2)] of both encoders, without the final norm, as Forge does. Here
    diffusers differs (its `clip_skip = c` takes [-(c + 2)], so its `clip_skip=1` moves an SDXL prompt
    one layer off what the A1111 family makes): A1111 (by default) ignores Clip skip on SDXL, which is
    the same image for N = 1 and 2, the "Clip skip: 2" that SDXL anime models' sample images carry."""
    if kind == "clip":
        return -clip_skip
    return -max(clip_skip, 2)


def _final_layer_norm(encoder):
    """A CLIP text model's final layer norm: `final_layer_norm` on transformers 5's CLIPTextModel, under
    `text_model` on older ones (where diffusers' own `clip_skip` still looks for it)."""
    norm = getattr(encoder, "final_layer_norm", None)
    return norm if norm is not None else encoder.text_model.final_layer_norm


def check_clip_skip(pipe, clip_skip: int) -> None:
    """InvalidRequest for a clip skip past the first layer of this pipeline's text encoders (only the
    embedded tiny models, with 2 layers, are that shallow: real CLIPs have 12 or more)."""
    kind = prompt_encoding(pipe)
    if kind is None or clip_skip <= 1:
        return
    for _, encoder in _pairs(pipe, kind):
        layers = int(getattr(encoder.config, "num_hidden_layers", 0) or 0)
        if layers and -layer_for(kind, clip_skip) > layers + 1:  # hidden_states: the embeddings and each layer
            from lowvram_gen.errors import InvalidRequest

            raise InvalidRequest("clip skip", clip_skip, f"this model's text encoder has {layers} layers: "
                                                         f"use a clip skip from 1 to {layers + 1}")


def _run(kind: str, encoder, chunk, clip_skip: int, device):
    """One chunk through one encoder: (hidden states [1, 77, D] with weights applied, pooled or None).
    The encoder is called as a whole (its offload hooks move it); the final layer norm of a clip skip is
    called as a module after it, so its own hook (leaf-level group offload) brings it to the device."""
    import torch

    ids = torch.tensor([chunk.ids], dtype=torch.long, device=_input_device(encoder, device))
    if kind == "clip":
        mask = None
        if getattr(encoder.config, "use_attention_mask", False):
            mask = torch.tensor([chunk.attention_mask], dtype=torch.long, device=ids.device)
        if clip_skip <= 1:
            z = encoder(ids, attention_mask=mask)[0]
        else:
            hidden = encoder(ids, attention_mask=mask, output_hidden_states=True).hidden_states
            z = _final_layer_norm(encoder)(hidden[layer_for(kind, clip_skip)])
        return _emphasis(z, chunk.weights), None
    out = encoder(ids, output_hidden_states=True)
    pooled = out[0] if out[0].ndim == 2 else None
    z = out.hidden_states[layer_for(kind, clip_skip)]
    return _emphasis(z, chunk.weights), pooled


def _textual_inversion(pipe, tokenizer):
    """diffusers' multi-vector textual-inversion rewrite for this tokenizer, where one is loaded
    (only then: `maybe_convert_prompt` also makes the tokenizer log a length warning on long text)."""
    convert = getattr(pipe, "maybe_convert_prompt", None)
    added = set(getattr(tokenizer, "added_tokens_encoder", {})) - set(getattr(tokenizer, "all_special_tokens", []))
    return (lambda text: convert(text, tokenizer)) if convert is not None and added else None


def _pairs(pipe, kind: str):
    if kind == "clip":
        return [(pipe.tokenizer, pipe.text_encoder)]
    pairs = [(pipe.tokenizer, pipe.text_encoder), (pipe.tokenizer_2, pipe.text_encoder_2)]
    return [(t, e) for t, e in pairs if t is not None and e is not None]  # the SDXL refiner has only the second


def prompt_chunks(pipe, text: str, kind: str | None = None) -> list[list]:
    """Per text encoder (SDXL: two), the chunks of `text` it is given (`chunks.token_weights`), with the
    pipeline's textual-inversion embeddings expanded and each multi-vector one kept whole in one chunk."""
    out = []
    for tok, _ in _pairs(pipe, kind or prompt_encoding(pipe)):
        convert = _textual_inversion(pipe, tok)
        out.append(token_weights(tok, text, convert=convert, groups=embedding_groups(tok) if convert else None))
    return out


def _encode(pipe, kind: str, text: str, clip_skip: int, device):
    """Per-chunk embeddings [1, 77, D] of `text` and the pooled embeds of its first chunk (SDXL)."""
    import torch

    pairs = _pairs(pipe, kind)
    per_encoder = prompt_chunks(pipe, text, kind)
    count = max(len(c) for c in per_encoder)
    chunks, pooled = [], None
    for i in range(count):
        parts = []
        for (tok, encoder), encoder_chunks in zip(pairs, per_encoder):
            chunk = encoder_chunks[i] if i < len(encoder_chunks) else empty_chunk(tok)
            z, pool = _run(kind, encoder, chunk, clip_skip, device)
            parts.append(z)
            if i == 0 and pool is not None:
                pooled = pool  # the last encoder's (text_encoder_2), as diffusers keeps
        chunks.append(torch.cat(parts, dim=-1) if len(parts) > 1 else parts[0])
    return chunks, pooled


def encode_prompts(pipe, prompt: str, negative: str = "", num_images: int = 1, device=None, *,
                   clip_skip: int = 1, do_cfg: bool = True) -> PromptEmbeds | None:
    """Embeddings of `prompt` and `negative` (A1111 syntax, any length) for an SD/SDXL pipeline,
    each repeated `num_images` times along the batch axis; None for other pipelines (use
    `plain_prompt_for`). `do_cfg=False` skips the negative (the pipeline ignores it without CFG).
    `clip_skip`: A1111's "Clip skip" (1: off; see `layer_for`).
    Raises PromptSyntaxError for a prompt A1111 itself refuses (a malformed weight), InvalidRequest
    for a clip skip deeper than the encoders (`check_clip_skip`)."""
    kind = prompt_encoding(pipe)
    if kind is None:
        return None
    import torch

    clip_skip = int(clip_skip or 1)
    check_clip_skip(pipe, clip_skip)

    device = torch.device(device) if device is not None else pipe._execution_device
    warnings = syntax_warnings(prompt, negative)
    with torch.no_grad():
        pos, pooled = _encode(pipe, kind, prompt or "", clip_skip, device)
        neg = neg_pooled = None
        zero_negative = kind == "clip_pair" and not negative and pipe.config.get("force_zeros_for_empty_prompt", False)
        if do_cfg and not zero_negative:
            neg, neg_pooled = _encode(pipe, kind, negative or "", clip_skip, device)
            if len(neg) != len(pos):  # pad the shorter with empty-prompt chunks: A1111's pad_cond_uncond
                empty = _encode(pipe, kind, "", clip_skip, device)[0][0]
                short = neg if len(neg) < len(pos) else pos
                short.extend([empty] * abs(len(pos) - len(neg)))
        embeds = torch.cat(pos, dim=1)
        if do_cfg and zero_negative:
            neg_embeds, neg_pooled = torch.zeros_like(embeds), torch.zeros_like(pooled)
        else:
            neg_embeds = torch.cat(neg, dim=1) if neg is not None else None

    dtype = _output_dtype(pipe, kind)

    def batch(t):
        if t is None:
            return None
        t = t.to(device=device, dtype=dtype)
        return t.repeat(num_images, *([1] * (t.ndim - 1)))

    return PromptEmbeds(batch(embeds), batch(neg_embeds), batch(pooled), batch(neg_pooled), warnings)


def _output_dtype(pipe, kind: str):
    """The embeddings' dtype, as diffusers' encode_prompt gives them (SD: text_encoder's, SDXL: text_encoder_2's)."""
    encoder = pipe.text_encoder if kind == "clip" else getattr(pipe, "text_encoder_2", None)
    encoder = encoder if encoder is not None else pipe.text_encoder
    return encoder.dtype if encoder is not None else pipe.unet.dtype


def encode_variants(pipe, texts: list[str], clip_skip: int = 1, device=None) -> dict[str, tuple]:
    """{text: (embeddings [1, 77k, D], pooled [1, P] or None)} for each text, each encoded once as `encode_prompts`
    encodes a prompt (A1111 weighting, chunks, clip skip), all padded with the empty prompt's chunk to the same
    number of chunks so that any of them can stand in for another at a denoising step (prompt editing, AND)."""
    import torch

    kind = prompt_encoding(pipe)
    clip_skip = int(clip_skip or 1)
    check_clip_skip(pipe, clip_skip)
    device = torch.device(device) if device is not None else pipe._execution_device
    dtype = _output_dtype(pipe, kind)
    with torch.no_grad():
        encoded = {text: _encode(pipe, kind, text, clip_skip, device) for text in dict.fromkeys(texts)}
        longest = max(len(chunks) for chunks, _ in encoded.values())
        empty = None
        if any(len(chunks) < longest for chunks, _ in encoded.values()):
            empty = _encode(pipe, kind, "", clip_skip, device)[0][0]
        out = {}
        for text, (chunks, pooled) in encoded.items():
            chunks = chunks + [empty] * (longest - len(chunks))
            out[text] = (torch.cat(chunks, dim=1).to(device=device, dtype=dtype),
                         None if pooled is None else pooled.to(device=device, dtype=dtype))
    return out
