"""A1111's refiner (1.6+, issue 32 item 5): one sampler run, its model swapped at the switch.

The rule, learnt from A1111's `apply_refiner` (modules/sd_samplers_common.py): before each call of the denoiser the
sampler's current noise level gives a completed ratio, `(999 - t) / 1000` where t is the index of the model's
training noise level nearest to it (a timestep sampler, DDIM/PLMS/UniPC, passes the timestep itself); from the first
call whose ratio reaches `refiner_switch_at` the refiner's UNet answers every call of that sampler run, with its own
conditioning (an SDXL refiner: OpenCLIP-G's embeddings alone and the aesthetic-score time ids, 6.0 for the prompt and
2.5 for the negative, A1111's defaults), on the same latents: no decode, no second sampler, no new noise. With hires
fix the refiner runs in the second pass (A1111's default "Hires fix: which pass to enable refiner for"). The same
family rule as A1111 otherwise: any UNet model of the same latent space can refine (an SD 1.5 refining an SD 1.5).

Diffusers' own hand-over (`denoising_end`/`denoising_start`, two pipeline calls) restarts the scheduler in the
second call, which equals this only for first-order samplers; here the pipeline call stays one, and the base UNet's
forward routes each call (`switching`), so any sampler (multistep, second order, ours in ksamplers/) keeps its state.

Memory: the two UNets are never on the device together. At the switch the base's denoiser leaves the device (its
model-offload hooks offload it, the budget split's resident part goes to the host, a resident UNet moves to the CPU)
before the refiner's UNet moves in; after the pass the refiner goes back to the host and the base returns where its
preset keeps it. Each move is recorded in `Switch.moves` (what tests and the plan read). The refiner's pipeline is
held in system RAM by the Session between jobs that name it.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from pathlib import Path

from lowvram_gen.errors import InvalidRequest

HIGH_AESTHETIC, LOW_AESTHETIC = 6.0, 2.5  # A1111's sdxl_refiner_high/low_aesthetic_score defaults (prompt/negative)


@dataclass
class Refiner:
    """A loaded refiner: its pipeline (held on the host) and its name as the PNG writes it."""

    spec: str
    pipe: object
    title: str  # A1111's short title: `name [hash]` for a file, the folder's or hub id's name otherwise
    dtype: str = "float32"
    quantize: str = "none"  # the job's --quantize, as the base's: its UNet (and text encoder) stored so


def title_of(source) -> str:
    """A1111's `Refiner: name [hash]`: a checkpoint file's stem and the first 10 hex digits of its sha256; a folder
    or hub id by its name (it has no one file to hash)."""
    if source.kind == "single_file":
        from lowvram_gen.networks import files

        return f"{Path(source.path).stem} [{files.sha256(Path(source.path))[:10]}]"
    return source.spec if source.kind in ("hub", "tiny") else Path(source.path).name


def load(spec: str, dtype: str, kept: Refiner | None = None, whole: bool = True, quantize: str = "none",
         quantize_on: str | None = None) -> Refiner:
    """The refiner named `spec` (as --model takes a model), loaded on the host at `dtype`, its UNet and text encoder
    quantized as they load where the job's first preset `quantize`s the base's (models/loading.load, the base's
    path); `kept` when it is the same model at the same dtype and storage (the Session keeps the last one in RAM),
    unless its UNet was set to stream for a smaller preset and this job's first preset runs it `whole` (read again:
    diffusers' group offloading stays on a module)."""
    from lowvram_gen.models.loading import load as load_model
    from lowvram_gen.models.resolve import resolve

    streamed = kept is not None and getattr(kept.pipe.unet, "_lowvram_streamed", False)
    if kept is not None and (kept.spec, kept.dtype, kept.quantize) == (spec, dtype, quantize) \
            and not (whole and streamed):
        return kept
    source = resolve(spec)
    return Refiner(spec, load_model(source, dtype, quantize, quantize_on).pipe, title_of(source), dtype, quantize)


def runs(request) -> bool:
    """Whether `request` runs a refiner at all (a switch at 1 never reaches it, as in A1111)."""
    return bool(request.refiner) and request.refiner_switch_at < 1


EDITING_REFUSAL = ("prompt editing, alternation and AND with a refiner are not built yet (the refiner's part reads "
                   "one conditioning, not A1111's per-step schedule): write a plain prompt, or run it without the "
                   "refiner")


def check_prompts(request) -> None:
    """Refuses, before anything loads, a refined job whose prompts switch between steps or mix AND parts: the
    per-step hooks (engines/sd/prompt_steps.py) sit on the base's UNet, and the refiner would read the edited
    prompt's text as one plain prompt (an AND batch does not even fit its call)."""
    from lowvram_gen.prompting.schedule import edits_prompts

    if runs(request) and edits_prompts(request):
        raise InvalidRequest("prompt", request.prompt, EDITING_REFUSAL)


def check(pipe, request, refiner: Refiner | None) -> None:
    """What cannot refine here, in one sentence each, before any step runs."""
    from lowvram_gen.prompting.encode import prompt_encoding

    if not runs(request):
        return
    check_prompts(request)
    name = type(pipe).__name__
    if getattr(pipe, "unet", None) is None or prompt_encoding(pipe) is None:
        raise InvalidRequest("refiner", request.refiner, f"{name} has no UNet to hand over: a refiner runs after an "
                                                         "SD 1.x/2.x or SDXL model")
    for what, refused in (("inpainting", request.mask), ("ControlNet", request.controlnets),
                          ("an edit's reference images", getattr(request, "reference_images", None))):
        if refused:
            raise InvalidRequest("refiner", request.refiner, f"a refiner with {what} is not built yet (issue 32 item "
                                                             "5 covers txt2img, img2img and hires fix)")
    if refiner is None:
        return
    own = refiner.pipe
    if getattr(own, "unet", None) is None or prompt_encoding(own) is None:
        raise InvalidRequest("refiner", request.refiner, f"{type(own).__name__} is not a UNet model of SD 1.x/2.x or "
                                                         "SDXL, so it cannot take over the sampling")
    if (own.unet.config.in_channels, _scaling(own)) != (pipe.unet.config.in_channels, _scaling(pipe)):
        raise InvalidRequest("refiner", request.refiner, f"it works in another latent space than {request.model} "
                                                         "(its UNet's channels or its VAE's scaling differ)")


def networks(refiner: Refiner | None, request, texts) -> list[str]:
    """The job's LoRAs and embeddings on the refiner, as A1111's network hooks stay on whatever checkpoint runs:
    each of the job's LoRAs (--lora first, then the prompt's tags) through the base's loading path
    (networks/lora.activate_loras), its layers that match nothing in the refiner left out with the loader's one
    warning naming it, and one that fits nothing there (another width, no layer of its) skipped with one warning
    naming it; the embeddings the prepared prompts name, resolved for the refiner's tokenizer (one that does not fit
    it skipped with a warning). Returns the warnings. A job without LoRAs switches the refiner's off."""
    if refiner is None or not runs(request):
        return []
    from lowvram_gen.errors import ModelLoadError
    from lowvram_gen.networks.embeddings import load_embeddings_used
    from lowvram_gen.networks.lora import activate_loras
    from lowvram_gen.networks.tags import extract_lora_tags, merge_refs, parse_lora_flag

    pipe = refiner.pipe
    refs, _ = merge_refs([parse_lora_flag(f) for f in request.loras] + extract_lora_tags(request.prompt)[1])
    kept, warnings = [], []
    for ref in refs:
        try:
            said = activate_loras(pipe, [ref])
        except ModelLoadError as exc:
            warnings.append(f"refiner {refiner.title}: LoRA {ref.name} is not applied to it ({str(exc).rstrip('.')})")
            continue
        kept.append(ref)
        warnings += [f"refiner {refiner.title}: {w}" for w in said]
    activate_loras(pipe, kept)  # exactly the ones that fit, at the job's weights
    prompts = [(texts.prompt, texts.negative_prompt)] + ([(texts.hires.prompt, texts.hires.negative_prompt)]
                                                          if texts.hires else [])
    for prompt, negative in prompts:
        used = load_embeddings_used(pipe, prompt, negative)  # the base's prompts spell each embedding as its file
        warnings += [f"refiner {refiner.title}: {w}" for w in used.warnings]
    return warnings


def _scaling(pipe) -> float:
    vae = getattr(pipe, "vae", None)
    return float(getattr(getattr(vae, "config", None), "scaling_factor", 0) or 0)


def completed_ratio(scheduler, timestep) -> float:
    """A1111's completed ratio at the denoiser call for `timestep` (the UNet's argument): the index of the training
    noise level nearest to the call's sigma (a scheduler without sigmas: the timestep itself), as (999 - index)/1000."""
    import torch

    t = float(torch.as_tensor(timestep).max())
    sigmas = getattr(scheduler, "sigmas", None)
    steps = getattr(scheduler, "timesteps", None)
    table = getattr(scheduler, "alphas_cumprod", None)
    if sigmas is not None and steps is not None and table is not None and len(steps) and len(sigmas) >= len(steps):
        at = int(torch.argmin((steps.float().cpu() - t).abs()))
        sigma = float(sigmas[at])
        levels = ((1 - table.float().cpu()) / table.float().cpu()) ** 0.5
        index = int(torch.argmin((levels - sigma).abs()))
    else:
        index = int(round(t))
    return (999 - index) / 1000


@dataclass
class Conds:
    """The refiner's conditioning for a pass, each with the negative's first where CFG batches them (diffusers'
    order, the one the base pipeline's UNet input has)."""

    embeds: object
    added: dict | None  # SDXL's text_embeds and time_ids; None for an SD 1.x/2.x refiner


def conditioning(refiner: Refiner, texts, n: int, cfg: bool, width: int, height: int) -> Conds:
    """The refiner's own conditioning for `n` images of the pass's size: our A1111-weighted encoder on the refiner's
    text encoders (an SDXL refiner has only OpenCLIP-G's), and for an SDXL UNet its time ids as A1111 makes them:
    original size (height, width), crop (0, 0), then the aesthetic score (a refiner's UNet, 5 ids) or the target size
    (a base SDXL refining, 6 ids)."""
    import torch

    from lowvram_gen.prompting.encode import encode_prompts

    pipe = refiner.pipe
    embeds = encode_prompts(pipe, texts.prompt, texts.negative_prompt, n, None, clip_skip=texts.clip_skip, do_cfg=cfg)
    config = pipe.unet.config
    if config.get("addition_embed_type") != "text_time":
        hidden = torch.cat([embeds.negative_prompt_embeds, embeds.prompt_embeds]) if cfg else embeds.prompt_embeds
        return Conds(hidden, None)
    pooled_dim = embeds.pooled_prompt_embeds.shape[-1]
    ids = config.projection_class_embeddings_input_dim - pooled_dim
    aesthetic = ids == 5 * config.addition_time_embed_dim

    def time_ids(score: float):
        tail = (score,) if aesthetic else (height, width)
        return torch.tensor([[height, width, 0, 0, *tail]], dtype=embeds.prompt_embeds.dtype).repeat(n, 1)

    if not cfg:
        return Conds(embeds.prompt_embeds, dict(text_embeds=embeds.pooled_prompt_embeds,
                                                time_ids=time_ids(HIGH_AESTHETIC)))
    return Conds(torch.cat([embeds.negative_prompt_embeds, embeds.prompt_embeds]),
                 dict(text_embeds=torch.cat([embeds.negative_pooled_prompt_embeds, embeds.pooled_prompt_embeds]),
                      time_ids=torch.cat([time_ids(LOW_AESTHETIC), time_ids(HIGH_AESTHETIC)])))


@dataclass
class Switch:
    """One pass's hand-over: whether it happened, at which call, and the moves of the UNets (("base", "off"),
    ("refiner", "on"), ...) in the order they were made."""

    at_call: int | None = None
    calls: int = 0
    moves: list = field(default_factory=list)


def _device_of(module) -> str:
    param = next(module.parameters(), None)
    return "cpu" if param is None else str(param.device)


def _base_off(pipe, runner, moves: list) -> str | None:
    """The base's denoiser off the device before the refiner comes in; returns the device a resident UNet was on
    (put back after the pass), None where its preset's hooks bring it back themselves."""
    if runner is not None:
        runner.place_resident(False)  # the budget split's resident part to the host
    for hook in getattr(pipe, "_all_hooks", None) or ():  # model CPU offload: every component to the host
        hook.offload()
    where = _device_of(pipe.unet)
    resident = where not in ("cpu", "meta") and not hasattr(pipe.unet, "_hf_hook")
    if resident:
        pipe.unet.to("cpu")
    moves.append(("base", "off"))
    return where if resident else None


STREAMING = ("budget", "group", "sequential")  # presets whose base UNet does not fit whole: the refiner's streams


def _refiner_on(refiner: Refiner, runner, device: str, moves: list) -> bool:
    """The refiner's UNet onto the device: whole, or, under a preset that streams the base's (its weights do not fit
    whole), streamed block by block with diffusers' group offloading (put on once, kept between passes: on the host
    between its calls). Returns whether it streams."""
    applied = getattr(runner, "applied", None)
    unet = refiner.pipe.unet
    if applied is not None and applied.offload in STREAMING:
        if not getattr(unet, "_lowvram_streamed", False):
            import torch

            unet.enable_group_offload(onload_device=torch.device(device), offload_device=torch.device("cpu"),
                                      offload_type="block_level", num_blocks_per_group=1)
            unet._lowvram_streamed = True
        moves.append(("refiner", "streamed"))
        return True
    if getattr(unet, "_lowvram_streamed", False):
        raise InvalidRequest("refiner", refiner.spec, "it is streamed for a smaller card's preset since an earlier "
                                                      "job; unload the models (or restart) to run it whole")
    unet.to(device)
    moves.append(("refiner", "on"))
    return False


@contextlib.contextmanager
def switching(pipe, step, refiner: Refiner | None, device: str, runner=None, scheduler_of=None):
    """Inside the block, the base UNet's forward hands every call from the switch on to the refiner (see the
    module's docstring); yields the pass's `Switch`. `step`: the pass (pipeline.Pass). A no-op (None) without a
    refiner, or in hires fix's first pass (the refiner refines the second)."""
    request = step.request
    if refiner is None or not runs(request) or (request.hires and not step.hires):
        yield None
        return
    from lowvram_gen.engines.sd.pipeline import Texts

    unet = pipe.unet
    record = Switch()
    texts = step.texts or Texts.of(request)
    conds: dict = {}
    state: dict = {"back": None, "streamed": False}
    scheduler_of = scheduler_of or (lambda: pipe.scheduler)
    own_forward = vars(unet).get("forward")  # an offload hook's, where one wraps it
    original = unet.forward

    def refined(sample, timestep, encoder_hidden_states=None, *args, **kwargs):
        record.calls += 1
        if record.at_call is None:
            if completed_ratio(scheduler_of(), timestep) < request.refiner_switch_at:
                return original(sample, timestep, encoder_hidden_states, *args, **kwargs)
            record.at_call = record.calls - 1
            state["back"] = _base_off(pipe, runner, record.moves)
            state["streamed"] = _refiner_on(refiner, runner, device, record.moves)
        n = len(step.seeds)
        cfg = sample.shape[0] == 2 * n
        if cfg not in conds:
            conds[cfg] = conditioning(refiner, texts, n, cfg, step.width, step.height)
        cond = conds[cfg]
        own = refiner.pipe.unet
        to = dict(device=sample.device, dtype=own.dtype)
        kwargs["added_cond_kwargs"] = None if cond.added is None else {k: v.to(**to) for k, v in cond.added.items()}
        kwargs.pop("timestep_cond", None)  # an LCM base's guidance embedding is not the refiner's
        out = own(sample.to(own.dtype), timestep, cond.embeds.to(**to), *args, **kwargs)
        first = out[0] if isinstance(out, tuple) else out.sample
        first = first.to(sample.dtype)
        return (first, *out[1:]) if isinstance(out, tuple) else type(out)(sample=first)

    unet.forward = refined
    try:
        yield record
    finally:
        if own_forward is None:
            vars(unet).pop("forward", None)
        else:
            unet.forward = own_forward
        if record.at_call is not None:
            if not state["streamed"]:  # a streamed one is on the host already between its calls
                refiner.pipe.unet.to("cpu")  # held on the host between passes
            record.moves.append(("refiner", "off"))
            if state["back"] is not None:
                unet.to(state["back"])
                record.moves.append(("base", "on"))
