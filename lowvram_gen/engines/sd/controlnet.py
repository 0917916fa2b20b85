"""ControlNet in a Stable Diffusion job: the job's ControlNets on the loaded pipeline, and its denoise call.

`use_controlnets` puts the job's ControlNets (models/controlnet.py keeps them loaded) on the base pipeline as
`controlnet0`, `controlnet1`, ... in unit order, and takes off those of an earlier job (their offload hooks
removed, moved back to system RAM, kept for a later job). There the memory settings see them as they see the
UNet (engines/sd/apply.py: cast, quantized, placed, offloaded, streamed, split under budget), so every rung of
the ladder re-applies to them without a reload.

`for_pass` gives a denoise pass its pipeline and arguments: diffusers' ControlNet pipeline for the pass
(`StableDiffusionControlNetPipeline`, its Img2Img and Inpaint, and the SDXL ones) made over the loaded pipeline's
components with the auto-pipelines' `from_pipe`, as engines/sd/pipeline.img2img_pipe makes the img2img one (no
weights copied, cast or read), with `controlnet_conditioning_scale`, `guess_mode` (the conditional half only, for
"ControlNet is more important") and the control maps at the pass's size (control/preprocess.py); `plan` puts A1111's
extension's rules on the ControlNets for the pass (control/weights.py: the per-output scales of the control modes,
the guidance start/end steps, hires fix's softening) with forward hooks. Hires fix's second pass gets the control image
resized to the hires size (its preprocessor run there), as A1111's extension does ("Hr Option: Both"); an inpaint
pass with "Only masked" gets it cut with the init image's crop box first (Pass.control_crop), as the extension
does for `inpaint_full_res`.
SD3 and Flux pipelines get diffusers' SD3/Flux ControlNet pipelines the same way (`transformer_pass`, at the end), and
so do the issue-30 families with one (Qwen-Image, Z-Image, SANA): several Qwen-Image units through its union wrapper
(`several`), and Qwen-Image's and Z-Image's ControlNet inpaint pipelines taking the engine's inpaint call
(`inpaint_class`).
"""

from __future__ import annotations

import contextlib
import functools
import weakref
from dataclasses import dataclass

from lowvram_gen.control.weights import cond_only, is_soft, runs_at, soft_scales
from lowvram_gen.errors import InvalidRequest
from lowvram_gen.families import ControlNetFacts, Task
from lowvram_gen.families.execution import task_of
from lowvram_gen.models import controlnet as models
from lowvram_gen.networks.hooks import unhook


def sources(request) -> list:
    """The resolved ControlNet sources of the request's units (no weights read)."""
    return [models.resolve_controlnet(unit.model) for unit in request.controlnets]


def attach_for(pipe, request, dtype: str, quantize: str = "none", quantize_on: str | None = None) -> bool:
    """Load (or reuse) the request's ControlNets at `dtype` (`quantize`: int8/int4 while loading, as the pipeline's
    first preset says) and put them on `pipe`, each model once (two units may share one: A1111 users run two canny
    units with two images); True when the set on the pipeline changed (its memory settings must go on again)."""
    base = models.base_config(pipe)  # the UNet's or the transformer's: what a single file's config is completed from
    modules = [models.kept(pipe, s, base, dtype, quantize, quantize_on) for s in sources(request)]
    distinct = list({id(m): m for m in modules}.values())
    changed = use_controlnets(pipe, distinct)
    pipe._lowvram_unit_slots = [next(i for i, d in enumerate(distinct) if d is m) for m in modules]
    return changed


def unit_modules(pipe, count: int) -> list:
    """The ControlNet module of each of the job's `count` units (attach_for's mapping; one per slot without it)."""
    modules = list(models.attached(pipe).values())
    slots = vars(pipe).get("_lowvram_unit_slots")
    if slots is None or len(slots) != count or max(slots, default=-1) >= len(modules):
        slots = list(range(len(modules)))
    if len(slots) != count:
        raise RuntimeError(f"{count} ControlNet unit(s) asked for, {len(modules)} on the pipeline: attach_for must run "
                           "before the job")
    return [modules[i] for i in slots]


def use_controlnets(pipe, modules: list) -> bool:
    """`modules` on `pipe` as controlnet0, controlnet1, ... (see the module doc); True when that changed anything."""
    current = models.attached(pipe)
    wanted = {f"controlnet{i}": m for i, m in enumerate(modules)}
    if list(current) == list(wanted) and all(current[k] is wanted[k] for k in wanted):
        return False
    state = getattr(pipe, "_lowvram_state", None)
    for slot, module in current.items():
        unhook(module)
        if state is not None:  # the precision it lost goes with the module (apply.needs_reload reads it)
            module._lowvram_floor = state["floor"].pop(slot, None)
        vars(pipe).pop(slot)
        if all(p.device.type != "meta" for p in module.parameters()):
            module.to("cpu")
    for slot, module in wanted.items():
        setattr(pipe, slot, module)
        floor = getattr(module, "_lowvram_floor", None)
        if state is not None and floor is not None:
            state["floor"][slot] = floor
    return True


def control_pipe(pipe, img2img: bool, controlnet, inpaint: bool = False):
    """diffusers' ControlNet pipeline over the loaded pipeline's components (StableDiffusionControlNetPipeline, its
    Img2Img, with `inpaint` its Inpaint, the SDXL ones), as pipeline.img2img_pipe makes the img2img one: the
    auto-pipelines' `from_pipe`, which picks the ControlNet class when given a `controlnet`. Not
    DiffusionPipeline.from_pipe: it casts every shared model to its `dtype` argument, float32 when not given
    (diffusers 0.42), which would undo the memory settings (fp16 weights doubled in place, sdnq's int8 refused)."""
    from diffusers import AutoPipelineForImage2Image, AutoPipelineForInpainting, AutoPipelineForText2Image

    record, task = task_of(pipe)
    wanted = Task.CONTROLNET_INPAINT if inpaint else Task.CONTROLNET_IMG2IMG if img2img else Task.CONTROLNET
    if task not in (Task.TXT2IMG, Task.IMG2IMG) or not record.has_task(wanted):
        raise InvalidRequest("controlnet", type(pipe).__name__,
                             "ControlNet needs an SD 1.x/2.x, SDXL, SD3 or Flux text-to-image pipeline")
    auto = AutoPipelineForInpainting if inpaint else AutoPipelineForImage2Image if img2img else \
        AutoPipelineForText2Image
    made = auto.from_pipe(pipe, controlnet=controlnet)
    made.set_progress_bar_config(disable=True)
    return made


def for_pass(pipe, step) -> tuple[object, dict] | None:
    """(the ControlNet pipeline, its control arguments) for a denoise pass (engines/sd/pipeline.Pass), or None when
    the request has no ControlNet units."""
    from lowvram_gen.control.preprocess import control_map

    units = step.request.controlnets
    if not units:
        return None
    modules = unit_modules(pipe, len(units))
    if transformer_controlnet(pipe) is not None:
        return transformer_pass(pipe, step, modules)
    img2img = step.init is not None
    control = control_pipe(pipe, img2img, modules[0] if len(modules) == 1 else modules, inpaint=step.mask is not None)
    control.scheduler = pipe.scheduler  # the sampler chosen for this job
    maps = [control_map(u.image, step.width, step.height, u.preprocessor, u.canny_low, u.canny_high,
                        crop=step.control_crop, resize=u.resize_mode) for u in units]
    one = len(units) == 1
    # guidance start/end and the per-output scales are the extension's (control/weights.py), applied by `plan`'s
    # hooks: diffusers' own window (control_guidance_start/end) is left at the whole run. Its guess mode stays for
    # "ControlNet is more important": it runs the ControlNet on the conditional half of the CFG batch only.
    kwargs = {"image" if not img2img else "control_image": maps[0] if one else maps,
              "controlnet_conditioning_scale": units[0].weight if one else [u.weight for u in units],
              "guess_mode": cond_only(step.request.control_mode)}
    plan(control, modules, units, step.request.control_mode, step.hires)
    return control, kwargs


@dataclass(frozen=True)
class UnitRule:
    """What one unit's call of its ControlNet gets in a pass: the soft factors or not, and its guidance window."""

    soft: bool
    start: float
    end: float


def plan(control, modules: list, units, control_mode: str, hires: bool) -> None:
    """Put the extension's rules for this pass on the units' ControlNets: each module's units in call order (two units
    may share one module; diffusers' MultiControlNetModel calls them in unit order, each once a step), its call count
    reset, the pass's pipeline (weakly) to read the steps it runs. The hooks go on each module once."""
    rules: dict[int, list[UnitRule]] = {}
    for module, unit in zip(modules, units):
        rules.setdefault(id(module), []).append(UnitRule(is_soft(control_mode, unit.preprocessor, hires),
                                                         unit.guidance_start, unit.guidance_end))
    for module in {id(m): m for m in modules}.values():
        module._lowvram_rules = rules[id(module)]
        module._lowvram_calls = 0
        module._lowvram_pass = weakref.ref(control)
        if not getattr(module, "_lowvram_rule_hooks", None):
            module._lowvram_rule_hooks = (module.register_forward_pre_hook(_before, with_kwargs=True),
                                          module.register_forward_hook(_after))


def _pass_step(module, call: int) -> tuple[int, int] | None:
    """(the step of the pass this denoiser call is in, the pass's steps) for the `call`-th call of this unit: the
    pipeline's timesteps (what it runs, img2img's and hires fix's counted from their start) over its scheduler's
    order (a second-order sampler calls the model twice a step), a warm-up call (PLMS's: its schedule's timesteps
    beyond steps x order) counted with the first step, as A1111's PLMS makes two calls in its first step; None
    outside a diffusers pipeline's loop."""
    control = module._lowvram_pass()
    timesteps = getattr(control, "_num_timesteps", None) if control is not None else None
    if not timesteps:
        return None
    scheduler = getattr(control, "scheduler", None)
    order = max(1, int(getattr(scheduler, "order", 1) or 1))
    schedule, asked = getattr(scheduler, "timesteps", None), getattr(scheduler, "num_inference_steps", None)
    warmup = max(0, len(schedule) - int(asked) * order) if schedule is not None and asked else 0
    return max(0, call - warmup) // order, max(1, -(-(int(timesteps) - warmup) // order))


def _before(module, args, kwargs):
    """Before a ControlNet call: this unit's scale for it taken off diffusers' arguments (its weight, and guess mode's
    own scaling, are put on by `_after`, as the extension scales), the step counted."""
    rules = getattr(module, "_lowvram_rules", None)
    module._lowvram_now = None
    if not rules or isinstance(kwargs.get("conditioning_scale", ()), (list, tuple)):
        return None  # not a pass's unit, or a union ControlNet's per-condition scales: diffusers' own rules
    call = module._lowvram_calls
    module._lowvram_calls += 1
    rule = rules[call % len(rules)]
    at = _pass_step(module, call // len(rules))
    weight = kwargs["conditioning_scale"]
    weight = float(weight) if not hasattr(weight, "item") else float(weight.item())
    module._lowvram_now = (weight if at is None or runs_at(*at, rule.start, rule.end) else 0.0, rule.soft)
    return args, {**kwargs, "conditioning_scale": 1.0, "guess_mode": False}


def _after(module, _args, output):
    now = getattr(module, "_lowvram_now", None)
    if now is None:
        return output
    weight, soft = now
    # the output object's kind (diffusers' ControlNetOutput, or a plain tuple), not a family
    named = hasattr(output, "mid_block_res_sample")
    down, mid = (output.down_block_res_samples, output.mid_block_res_sample) if named else output
    outputs = [*down, mid]
    scales = [weight * f for f in soft_scales(len(outputs))] if soft else [weight] * len(outputs)
    scaled = [r * s for r, s in zip(outputs, scales)]
    down, mid = tuple(scaled[:-1]), scaled[-1]
    return type(output)(down_block_res_samples=down, mid_block_res_sample=mid) if named else (down, mid)


def infotext_fields(pipe, request) -> dict:
    """`ControlNet N` fields of the PNG text, each unit's model named as it was found (a1111/infotext.py)."""
    from lowvram_gen.a1111.infotext import controlnet_fields

    modules = unit_modules(pipe, len(request.controlnets)) if request.controlnets else []
    labels = []
    for i, unit in enumerate(request.controlnets):
        source = getattr(modules[i], "_lowvram_source", None)
        labels.append(source.label if source is not None else unit.model)
    return controlnet_fields(request, labels)


# ------------------------------------------------------------------------------------------ SD3, Flux and the others
# diffusers' StableDiffusion3ControlNetPipeline, FluxControlNetPipeline and FluxControlNetImg2ImgPipeline (and the
# Qwen-Image, Z-Image and SANA ones their records name), made over
# the loaded pipeline by the same auto-pipelines' `from_pipe` (no weight copied, cast or read). They take the control
# map as `control_image` in txt2img too, have no guess mode, and SD3's has no img2img: planning/controlnet.py's
# `transformer_refusal` says so, before the model loads (session) and here. Several units: diffusers'
# SD3MultiControlNetModel / FluxMultiControlNetModel, which the pipelines make of a list.

_NEGATIVE = ("negative_prompt", "negative_prompt_2", "negative_prompt_embeds", "negative_pooled_prompt_embeds")


def transformer_controlnet(pipe) -> ControlNetFacts | None:
    """The ControlNet facts of a transformer family (SD3, Flux) for its text-to-image and image-to-image pipelines,
    which the ControlNet ones are made from (the family's record); None for others (a UNet family's go through
    `control_pipe`)."""
    record, task = task_of(pipe)
    if record.controlnet is None or record.denoiser != "transformer" or task not in (Task.TXT2IMG, Task.IMG2IMG):
        return None
    return record.controlnet


def transformer_pass(pipe, step, modules: list) -> tuple[object, dict]:
    """(diffusers' SD3/Flux ControlNet pipeline, its control arguments) for a denoise pass (see for_pass)."""
    from lowvram_gen.control.preprocess import control_map
    from lowvram_gen.planning.controlnet import transformer_refusal, union_refusal

    units = step.request.controlnets
    img2img = step.init is not None
    inpaint = step.mask is not None
    facts = transformer_controlnet(pipe)
    why = transformer_refusal(facts.kind, img2img, step.request.control_mode, inpaint) or \
        (inpaint_refusal(facts, step.request, modules) if inpaint else None)
    if not inpaint and facts.inpaint == "control" and any(facts.inpaint_model(m.config) for m in modules):
        why = (f"this is a {facts.label} inpainting ControlNet (it reads the image to repaint and its mask): "
               "inpaint with it, an init image and a mask")
    if why:
        raise InvalidRequest("controlnet", units[0].model, why)
    if not facts.mixes_kinds and len({getattr(m, "input_hint_block", None) is None for m in modules}) > 1:
        # FluxMultiControlNetModel reads the control images one way for all, as its first ControlNet wants them
        raise InvalidRequest("controlnet", units[1].model, f"{facts.label} ControlNets of the two kinds (XLabs', with "
                             "a conditioning embedding, and InstantX's, on VAE latents) cannot run together in "
                             "diffusers")
    why = unit_refusal(facts, units) or union_refusal(facts.kind, len({id(m) for m in modules}))
    if why:
        raise InvalidRequest("controlnet", units[-1].model, why)
    control = _transformer_control_pipe(pipe, img2img, modules[0] if len(modules) == 1 else several(facts, modules),
                                        inpaint)
    lend_transformer(pipe, modules, facts)
    control.set_progress_bar_config(disable=True)
    control.scheduler = pipe.scheduler  # the sampler chosen for this job
    maps = [control_map(u.image, step.width, step.height, u.preprocessor, u.canny_low, u.canny_high,
                        crop=step.control_crop, resize=u.resize_mode) for u in units]
    one = len(units) == 1
    kwargs = {"control_image": maps[0] if one else maps,
              "controlnet_conditioning_scale": units[0].weight if one else [u.weight for u in units]}
    if facts.guidance_window:
        kwargs.update(control_guidance_start=units[0].guidance_start if one else [u.guidance_start for u in units],
                      control_guidance_end=units[0].guidance_end if one else [u.guidance_end for u in units])
    return control, kwargs


def unit_refusal(facts: ControlNetFacts, units) -> str | None:
    """Why the job's units cannot run in the family's ControlNet pipeline (None: they can): several units where
    diffusers has no multi-ControlNet for it, a guidance window where its call takes none."""
    if len(units) > 1 and not facts.multi:
        return (f"diffusers' {facts.label} ControlNet pipeline runs one ControlNet unit, not {len(units)}: run one "
                "unit at a time")
    if not facts.guidance_window and any((u.guidance_start, u.guidance_end) != (0.0, 1.0) for u in units):
        return (f"diffusers' {facts.label} ControlNet pipeline has no guidance start/end: leave them at 0 and 1 (the "
                "whole run)")
    return None


def _transformer_control_pipe(pipe, img2img: bool, controlnet, inpaint: bool = False):
    """The family's ControlNet pipeline over `pipe`'s components: the auto-pipelines' `from_pipe` where they map the
    family (SD3, Flux, Qwen-Image), else the record's ControlNet pipeline class built of the same component objects
    (SANA: the auto-pipelines have no ControlNet entry for it); an inpaint one (`inpaint`) as `inpaint_class` makes it.
    Neither copies, casts nor reads a weight."""
    import diffusers
    from diffusers import AutoPipelineForImage2Image, AutoPipelineForText2Image

    record, _task = task_of(pipe)
    if inpaint:
        cls = inpaint_class(record.pipeline_for(Task.CONTROLNET_INPAINT), record.controlnet.inpaint)
    else:
        name = record.pipeline_for(Task.CONTROLNET_IMG2IMG if img2img else Task.CONTROLNET)
        auto = AutoPipelineForImage2Image if img2img else AutoPipelineForText2Image
        try:
            return auto.from_pipe(pipe, controlnet=controlnet)
        except ValueError:  # "AutoPipeline can't find a pipeline linked to ..."
            if name is None:
                raise
        cls = getattr(diffusers, name)
    expected, _optional = cls._get_signature_keys(cls)
    parts = {k: v for k, v in pipe.components.items() if k in expected}
    return cls(**parts, controlnet=controlnet)


def several(facts: ControlNetFacts, modules: list):
    """What the family's ControlNet pipeline takes for several units: the list of their ControlNets, or where diffusers
    has a union wrapper for the family (`facts.multi_union`: Qwen-Image's QwenImageMultiControlNetModel) that wrapper
    around their one ControlNet (planning/controlnet.union_refusal refuses two)."""
    if facts.multi_union is None:
        return modules
    import diffusers

    return getattr(diffusers, facts.multi_union)(list({id(m): m for m in modules}.values()))


def inpaint_refusal(facts: ControlNetFacts, request, modules: list) -> str | None:
    """Why the job's units cannot inpaint in the family's ControlNet inpaint pipeline (None: they can): it runs one
    ControlNet; Qwen-Image's ('control') needs an inpainting ControlNet (the image's latents and the mask as extra
    input channels); it repaints the masked area from noise, so A1111's latent masked contents have nothing to act
    on."""
    label = facts.label
    if len(modules) > 1 or len(request.controlnets) > 1:
        return (f"diffusers' {label} ControlNet inpaint pipeline runs one ControlNet unit, not "
                f"{len(request.controlnets)}: inpaint with one unit")
    if facts.inpaint_model is not None and not facts.inpaint_model(modules[0].config):
        return (f"{label} ControlNet inpainting takes a ControlNet that reads the image and its mask "
                f"({facts.inpaint_example}), not this one: give such a one, or use this one in txt2img")
    content = getattr(request, "masked_content", "original")
    if content in ("latent-noise", "latent-nothing"):  # original and fill are pixels: what it blanks anyway
        return (f"masked content {content!r} has nothing to act on in diffusers' {label} ControlNet inpaint "
                "pipeline (it repaints the masked area from noise, not from the image's latents): use original or "
                "fill")
    return None


@functools.cache
def inpaint_class(name: str, style: str):
    """diffusers' ControlNet inpaint pipeline `name` taking the call the engine makes of every inpaint pipeline
    (`image`: the images to repaint, `mask_image`, `strength`): 'control' hands them over as `control_image` and
    `control_mask` (Qwen-Image's: the unit's ControlNet reads them; its control map is unused), 'image' as `image`
    and `mask_image` beside the unit's `control_image` (Z-Image's). Both repaint the masked area from noise:
    `strength` has nothing to act on and is dropped (the job's warnings say so: engines/sd/inpaint.job_warnings)."""
    import diffusers

    base = getattr(diffusers, name)

    def __call__(self, *args, image=None, mask_image=None, strength=None, **kwargs):
        one = isinstance(mask_image, list) and len(mask_image) == 1
        mask = mask_image[0] if one else mask_image
        if style == "control":
            kwargs.update(control_image=image[0] if one and isinstance(image, list) else image, control_mask=mask)
        else:
            kwargs.update(image=image, mask_image=mask)
        return base.__call__(self, *args, **kwargs)

    # a subclass of diffusers' class (task_of reads the record's task through the MRO), named as it is
    return type(name, (base,), {"__call__": __call__, "__doc__": base.__doc__, "__module__": __name__})


def lend_transformer(pipe, modules: list, facts: ControlNetFacts) -> None:
    """A ControlNet that runs on the transformer's own modules (`facts.borrows`: Z-Image's, which diffusers'
    from_transformer puts on it as its pipeline is built) holds them only during its forward: taken off now, lent by
    a forward pre-hook (from `pipe`'s transformer of that moment) and taken off again after. Otherwise they would be
    its submodules between steps, and the memory settings (casting, offload hooks, budget streaming) would count and
    hook the transformer's weights a second time under the ControlNet."""
    if not facts.borrows:
        return
    for module in modules:
        _unlend(module, facts.borrows)
        if getattr(module, "_lowvram_lend_hooks", None) is None:
            module._lowvram_lend_hooks = (
                module.register_forward_pre_hook(lambda m, _args: _lend(m, pipe)),
                module.register_forward_hook(lambda m, _args, _out: _unlend(m, facts.borrows)))


def _lend(module, pipe) -> None:
    type(module).from_transformer(module, pipe.transformer)  # returns the module: not the forward's arguments


def _unlend(module, names: tuple[str, ...]) -> None:
    for name in names:
        setattr(module, name, None)


def fit_call(control, kwargs: dict) -> dict:
    """`kwargs` without the negative-prompt arguments a ControlNet pipeline does not take, as its family's record says
    (FluxControlNetImg2ImgPipeline has none: Flux ignores a negative prompt without true CFG, as engines/sd/job.py
    warns)."""
    record, task = task_of(control)
    if task is not None and record.takes_negative_prompt(task):
        return kwargs
    return {k: v for k, v in kwargs.items() if k not in _NEGATIVE}


@contextlib.contextmanager
def seeded(control, seeds: list[int], device: str):
    """SD3's ControlNet pipeline encodes the control image with the VAE and samples those latents from torch's global
    random state, not from the call's generators (its record's `global_rng_control_latents`): seeded from the pass's
    first seed here (and that state restored after), so a seed gives the same image each time, as every other
    pipeline does. Others, and no ControlNet pipeline (None): nothing."""
    import torch

    facts = task_of(control)[0].controlnet if control is not None else None
    if facts is None or not facts.global_rng_control_latents:
        yield
        return
    kind = torch.device(device).type
    with torch.random.fork_rng(devices=[] if kind == "cpu" else None, device_type=kind if kind != "cpu" else "cuda"):
        torch.manual_seed(seeds[0])
        yield
