"""Prompt editing, alternation and `AND` on SD 1.x/2.x and SDXL: the conditioning switched per denoiser call.

prompting/schedule.py says which text each step reads (A1111's rules); here each distinct text of the pass is
encoded once (prompting.encode.encode_variants) and the UNet's call is hooked for the pass (`switched`): a forward
pre-hook puts the call's conditioning in (cross-attention states, and SDXL's pooled text embeds), a forward hook
mixes the `AND` parts. The pipeline and its sampler stay diffusers' own, so txt2img, img2img, inpainting, hires
fix's second pass and ControlNet all switch the same way.

* The step is A1111's: the denoiser's call count from 0 (`calls`), against a schedule made for the steps, twice
  them for A1111's second-order samplers (schedule.total_steps), as A1111's CFG denoiser counts. img2img's and
  inpainting's schedule is made for the request's steps, though the pass runs fewer (A1111's too).
* `AND` (composable diffusion): the UNet runs the negative and every part in one batch, and the pipeline is
  handed `uncond + sum_i w_i (cond_i - uncond)` as the prompt's half, so its own CFG gives A1111's
  `uncond + scale * sum_i w_i (cond_i - uncond)`. Other inputs of the batch (ControlNet's residuals, SDXL's time
  ids) take the prompt half's values for each part. A ControlNet reads the first part's conditioning.
* Every variant, the negative's too, is padded to the longest's chunks with the empty prompt's chunk, as prompt
  and negative are (docs/prompt-syntax.md).
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

from lowvram_gen.errors import InvalidRequest
from lowvram_gen.prompting import schedule as sched
from lowvram_gen.prompting.encode import encode_variants, prompt_encoding


def needs_switching(prompt: str, negative: str) -> bool:
    """Whether a pass with these prompts may read more than one text or mixes parts (else it runs as before)."""
    return not (sched.is_plain(prompt or "") and sched.is_plain(negative or "", True))


def refusal(pipe) -> str:
    """The one sentence for a pipeline whose text encoders we do not run (SD3, Flux, ...)."""
    return sched.editing_refusal(type(pipe).__name__)


@dataclass
class Switching:
    """One pass's texts per denoiser call, and their embeddings (one image's: [1, tokens, width])."""

    parts: list  # per AND part: (schedule entries, weight)
    negative: list  # the negative's schedule entries
    table: dict  # text -> (embeddings, pooled or None)
    zero_negative: bool  # SDXL's zeros for an empty negative (force_zeros_for_empty_prompt)
    images: int
    calls: int = 0  # the UNet calls made so far: A1111's step

    def conds(self, call: int) -> list:
        return [(*self.table[sched.text_for_step(entries, call)], weight) for entries, weight in self.parts]

    def uncond(self, call: int):
        if self.zero_negative:
            embeds, pooled = self.table[sched.text_for_step(self.parts[0][0], call)]
            return embeds * 0, None if pooled is None else pooled * 0
        return self.table[sched.text_for_step(self.negative, call)]

    def call_kwargs(self, cfg: bool) -> dict:
        """The pipeline call's text arguments: the first call's, which the hooks replace at every call."""
        embeds, pooled, _ = self.conds(0)[0]
        n = self.images
        out = dict(prompt_embeds=_repeat(embeds, n))
        if pooled is not None:
            out["pooled_prompt_embeds"] = _repeat(pooled, n)
        if cfg:
            neg, neg_pooled = self.uncond(0)
            out["negative_prompt_embeds"] = _repeat(neg, n)
            if neg_pooled is not None:
                out["negative_pooled_prompt_embeds"] = _repeat(neg_pooled, n)
        return out

    def mixes(self) -> bool:
        return len(self.parts) > 1 or self.parts[0][1] != 1.0


def _repeat(t, n: int):
    return t.repeat(n, *([1] * (t.ndim - 1)))


def for_pass(pipe, step, texts, cfg: bool) -> Switching | None:
    """The pass's Switching (its texts encoded now), or None where both prompts read one text throughout."""
    request = step.request
    if not needs_switching(texts.prompt, texts.negative_prompt):
        return None
    kind = prompt_encoding(pipe)
    if kind is None:
        raise InvalidRequest("prompt", texts.prompt, refusal(pipe))
    from lowvram_gen.samplers import a1111_name

    name = a1111_name(pipe.scheduler)
    if step.hires:  # its timeline goes on from the first pass's (schedule.schedule)
        steps = (sched.total_steps(request.steps, name), sched.total_steps(step.num_steps, name))
    else:
        steps = (sched.total_steps(step.num_steps, name), None)
    parts = [(sched.schedule(text, *steps), weight) for text, weight in sched.split_and(texts.prompt or "")]
    negative = sched.schedule(texts.negative_prompt or "", *steps)
    mixes = len(parts) > 1 or parts[0][1] != 1.0
    if mixes and not cfg:
        raise InvalidRequest("cfg_scale", request.cfg_scale if step.cfg_scale is None else step.cfg_scale,
                             "AND and a prompt's ':weight' mix prompts against the negative prompt, which needs a "
                             "CFG scale above 1")
    zero = kind == "clip_pair" and not texts.negative_prompt and pipe.config.get("force_zeros_for_empty_prompt", False)
    wanted = [text for entries, _ in parts for _, text in entries]
    if cfg and not zero:
        wanted += [text for _, text in negative]
    table = encode_variants(pipe, wanted, texts.clip_skip)
    return Switching(parts, negative, table, zero, len(step.seeds))


@contextlib.contextmanager
def switched(pipe, switching: Switching | None):
    """`pipe`'s UNet (and ControlNet) read `switching`'s conditioning at each call inside the block."""
    if switching is None:
        yield
        return
    handles = [pipe.unet.register_forward_pre_hook(_unet_before(switching), with_kwargs=True),
               pipe.unet.register_forward_hook(_unet_after(switching), with_kwargs=True)]
    control = getattr(pipe, "controlnet", None)
    if control is not None and hasattr(control, "register_forward_pre_hook"):
        handles.append(control.register_forward_pre_hook(_control_before(switching), with_kwargs=True))
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()


def _blocks(switching: Switching, batch: int, first_only: bool = False):
    """(cfg, [negative's (embeds, pooled)] + [each part's]) for a call of `batch` rows."""
    n = switching.images
    cfg = batch == 2 * n
    if batch not in (n, 2 * n):
        raise RuntimeError(f"prompt editing: a denoiser batch of {batch} rows for {n} images")
    conds = switching.conds(switching.calls)
    conds = conds[:1] if first_only else conds
    return cfg, ([switching.uncond(switching.calls)] if cfg else []) + [(e, p) for e, p, _ in conds]


def _stack(pairs, index: int, like, n: int):
    import torch

    return torch.cat([_repeat(pair[index].to(like.device, like.dtype), n) for pair in pairs])


def _with_conditioning(kwargs: dict, pairs, n: int) -> dict:
    kwargs = dict(kwargs)
    kwargs["encoder_hidden_states"] = _stack(pairs, 0, kwargs["encoder_hidden_states"], n)
    added = kwargs.get("added_cond_kwargs")
    if added and added.get("text_embeds") is not None and pairs[0][1] is not None:
        kwargs["added_cond_kwargs"] = {**added, "text_embeds": _stack(pairs, 1, added["text_embeds"], n)}
    return kwargs


def _control_before(switching: Switching):
    def hook(_module, args, kwargs):
        if "encoder_hidden_states" not in kwargs:
            return None
        _, pairs = _blocks(switching, kwargs["encoder_hidden_states"].shape[0], first_only=True)
        return args, _with_conditioning(kwargs, pairs, switching.images)

    return hook


def _expand(value, batch: int, n: int, cfg: bool, parts: int):
    """A batch input of the call with the prompt half repeated once per AND part."""
    import torch

    if isinstance(value, (tuple, list)):
        return type(value)(_expand(v, batch, n, cfg, parts) for v in value)
    if isinstance(value, dict):
        return {k: _expand(v, batch, n, cfg, parts) for k, v in value.items()}
    if not isinstance(value, torch.Tensor) or value.ndim == 0 or value.shape[0] != batch:
        return value
    negative, positive = (value[:n], value[n:]) if cfg else (value[:0], value)
    return torch.cat([negative] + [positive] * parts)


def _unet_before(switching: Switching):
    def hook(_module, args, kwargs):
        n = switching.images
        batch = kwargs["encoder_hidden_states"].shape[0]
        cfg, pairs = _blocks(switching, batch)
        parts = len(pairs) - (1 if cfg else 0)
        if parts > 1:
            args = _expand(tuple(args), batch, n, cfg, parts)
            kwargs = {k: v if k == "encoder_hidden_states" else _expand(v, batch, n, cfg, parts)
                      for k, v in kwargs.items()}
        return args, _with_conditioning(kwargs, pairs, n)

    return hook


def _unet_after(switching: Switching):
    def hook(_module, _args, _kwargs, output):
        weights = [w for _, w in switching.parts]
        switching.calls += 1
        if not switching.mixes():
            return None
        import torch

        n = switching.images
        noise = output[0] if isinstance(output, tuple) else output.sample
        negative = noise[:n]
        mixed = negative + sum(w * (noise[n * (i + 1):n * (i + 2)] - negative) for i, w in enumerate(weights))
        combined = torch.cat([negative, mixed.to(noise.dtype)])
        if isinstance(output, tuple):
            return (combined, *output[1:])
        return type(output)(sample=combined)

    return hook
