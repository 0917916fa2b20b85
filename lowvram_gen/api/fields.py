"""A1111's txt2img/img2img JSON body -> one `GenerationRequest` (validated once, as every front end's is).

The body's fields are A1111's (its `StableDiffusionProcessingTxt2Img`/`Img2Img` and the API's own:
sampler_index, send_images, save_images, script_name, alwayson_scripts...), with A1111's API defaults where
a field is left out: steps 50, sampler Euler, denoising strength 0.75. Each field is one of:

- mapped onto a request field (prompt, seed, sampler_name + scheduler, enable_hr and the hr_* fields, init_images,
  mask and the inpaint fields, override_settings...);
- one of A1111's that has no effect here at its neutral value (restore_faces false, eta 1, s_noise 1, mask
  blur without a mask...): accepted silently at that value, named in a warning at any other;
- refused with the reason, where ignoring it would make another image than asked (a latent mask apart from the
  mask, a script, an always-on script other than ControlNet's);
- `alwayson_scripts: {"controlnet": {"args": [unit, ...]}}`: A1111's ControlNet extension's units (its field names,
  base64 images), read by the batch lines' parser (control/api.py) into the request's `controlnets`;
- unknown: ignored, and named in a warning.

A bad value is the request's `InvalidRequest` renamed to the JSON field (`invalid cfg_scale: 31; a number from
0 to 30`), which the routes answer 422 with FastAPI's validation shape, as A1111 answers a value its model refuses.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Any, Callable

from lowvram_gen.control.api import SCRIPT_NAMES, with_units
from lowvram_gen.errors import InvalidRequest
from lowvram_gen.request import GenerationRequest, as_bool

ANY = object()  # a field accepted at any value: it has no effect here whatever it says

# A1111's API defaults of the fields it echoes in `parameters` (its processing classes' and its API model's)
COMMON_DEFAULTS: dict[str, Any] = {
    "prompt": "", "negative_prompt": "", "styles": None, "seed": -1, "subseed": -1, "subseed_strength": 0,
    "seed_resize_from_h": -1, "seed_resize_from_w": -1, "sampler_name": None, "scheduler": None, "batch_size": 1,
    "n_iter": 1, "steps": 50, "cfg_scale": 7.0, "width": 512, "height": 512, "restore_faces": None, "tiling": None,
    "do_not_save_samples": False, "do_not_save_grid": False, "eta": None, "denoising_strength": 0.75,
    "s_min_uncond": None, "s_churn": None, "s_tmax": None, "s_tmin": None, "s_noise": None, "override_settings": None,
    "override_settings_restore_afterwards": True, "refiner_checkpoint": None, "refiner_switch_at": None,
    "disable_extra_networks": False, "firstpass_image": None, "comments": None, "sampler_index": "Euler",
    "script_name": None, "script_args": [], "send_images": True, "save_images": False, "alwayson_scripts": {},
    "force_task_id": None, "infotext": None,
}
TXT2IMG_DEFAULTS: dict[str, Any] = {
    **COMMON_DEFAULTS, "enable_hr": False, "firstphase_width": 0, "firstphase_height": 0, "hr_scale": 2.0,
    "hr_upscaler": None, "hr_second_pass_steps": 0, "hr_resize_x": 0, "hr_resize_y": 0, "hr_checkpoint_name": None,
    "hr_sampler_name": None, "hr_scheduler": None, "hr_prompt": "", "hr_negative_prompt": "",
    "hr_cfg": None,  # Forge's Hires CFG Scale (None: the first pass's CFG)
}
IMG2IMG_DEFAULTS: dict[str, Any] = {
    **COMMON_DEFAULTS, "init_images": None, "resize_mode": 0, "image_cfg_scale": None, "mask": None,
    "mask_blur_x": 4, "mask_blur_y": 4, "mask_blur": None, "mask_round": True, "inpainting_fill": 0,
    "inpaint_full_res": True, "inpaint_full_res_padding": 0, "inpainting_mask_invert": 0,
    "initial_noise_multiplier": None, "latent_mask": None, "include_init_images": False,
}

# A1111's fields that do nothing here at these values (ANY: at every value), and what a warning says otherwise
NEUTRAL: dict[str, tuple[tuple, str]] = {
    "restore_faces": ((None, False), "face restoration is not part of lowvram-gen"),
    "tiling": ((None, False), "tiling (seamless textures) is not part of lowvram-gen"),
    "eta": ((None, 0, 1), "the diffusers schedulers run their own noise (eta 1 for the ancestral samplers, 0 for "
                          "DDIM)"),
    "s_churn": ((None, 0), "k-diffusion's sampler parameters are not part of diffusers' schedulers"),
    "s_tmax": ((None, 0, math.inf), "k-diffusion's sampler parameters are not part of diffusers' schedulers"),
    "s_tmin": ((None, 0), "k-diffusion's sampler parameters are not part of diffusers' schedulers"),
    "s_noise": ((None, 1), "k-diffusion's sampler parameters are not part of diffusers' schedulers"),
    "s_min_uncond": ((None, 0), "negative guidance minimum sigma is not part of lowvram-gen"),
    "do_not_save_samples": ((None, False), "lowvram-gen always saves the images in its output folder"),
    "do_not_save_grid": (ANY, ""),  # no grid is made
    "firstphase_width": ((None, 0), "the old hires fix's first-pass size is not used: give width and height"),
    "firstphase_height": ((None, 0), "the old hires fix's first-pass size is not used: give width and height"),
    "hr_checkpoint_name": ((None, "", "Use same checkpoint"), "the hires pass runs on the job's own model"),
    "refiner_checkpoint": ((None, "", "None"), "a refiner is not part of lowvram-gen"),
    "refiner_switch_at": (ANY, ""),  # only with refiner_checkpoint
    "disable_extra_networks": ((None, False), "LoRA tags in the prompt are always used"),
    "firstpass_image": ((None, ""), "a first-pass image for hires fix is not used"),
    "comments": (ANY, ""),
    "force_task_id": (ANY, ""),
    "infotext": ((None, ""), "the fields are read from the JSON, not from an infotext"),
    "sampler_index": (ANY, ""),  # A1111's older name of sampler_name, read when sampler_name is not given
    "script_args": (ANY, ""),  # only with script_name, which is refused
    "image_cfg_scale": (ANY, ""),  # instruct-pix2pix models only, as in A1111
    "initial_noise_multiplier": ((None, 1), "the init image's noise is not scaled"),
    "resize_mode": ((None, 0), "the init image is resized to width x height (resize_mode 0, A1111's Just resize)"),
    # inpainting's settings: mapped with a mask (_inpaint); without one they do nothing in A1111 either
    **{name: (ANY, "") for name in ("mask_blur", "mask_blur_x", "mask_blur_y", "mask_round", "inpainting_fill",
                                    "inpaint_full_res", "inpaint_full_res_padding", "inpainting_mask_invert")},
}
# the request's field names (its InvalidRequest's) -> the JSON field that set them
JSON_NAMES: dict[str, str] = {
    "prompt": "prompt", "negative prompt": "negative_prompt", "width": "width", "height": "height", "steps": "steps",
    "cfg scale": "cfg_scale", "seed": "seed", "batch size": "batch_size", "sampler": "sampler_name",
    "schedule type": "scheduler", "init image": "init_images", "strength": "denoising_strength",
    "hires scale": "hr_scale", "hires upscaler": "hr_upscaler", "hires steps": "hr_second_pass_steps",
    "hires denoise": "denoising_strength", "hires resize": "hr_resize_x", "hires resize width": "hr_resize_x",
    "hires resize height": "hr_resize_y", "hires sampler": "hr_sampler_name", "hires schedule type": "hr_scheduler",
    "hires cfg": "hr_cfg", "hires prompt": "hr_prompt", "hires negative prompt": "hr_negative_prompt", "clip skip": "override_settings.CLIP_stop_at_last_layers",
    "variation seed": "subseed", "variation seed strength": "subseed_strength",
    "seed resize from": "seed_resize_from_w", "seed resize from width": "seed_resize_from_w",
    "seed resize from height": "seed_resize_from_h", "model": "override_settings.sd_model_checkpoint",
    "batch count": "n_iter", "mask": "mask", "mask blur": "mask_blur", "inpaint area": "inpaint_full_res",
    "mask padding": "inpaint_full_res_padding", "masked content": "inpainting_fill",
    "invert mask": "inpainting_mask_invert",
}
# what a job refuses in the prompt: the message keeps its name (`invalid LoRA: ...`), the 422's loc says the field
IN_PROMPT = {"LoRA": "prompt", "loras": "prompt", "embedding": "prompt"}
# the same for what the request or the job refuses of the ControlNet units as a whole (their control mode, their
# count, a ControlNet for another model family, ControlNet with a mask)
OF_THE_UNITS = {name: "alwayson_scripts.controlnet" for name in (
    "control mode", "control_mode", "controlnets", "alwayson_scripts controlnet", "controlnet", "ControlNet")}


@dataclass
class Mapped:
    """A body as a request, and what the answer needs of it."""

    request: GenerationRequest
    warnings: list[str] = field(default_factory=list)
    parameters: dict = field(default_factory=dict)  # the body as A1111 echoes it (its defaults filled in)
    send_images: bool = True
    # the request fields override_settings set that stay for later jobs (override_settings_restore_afterwards
    # false): "model", "clip_skip"
    keep_settings: tuple[str, ...] = ()


def renamed(exc: InvalidRequest) -> InvalidRequest:
    """`exc` naming the JSON field instead of the request's (`invalid cfg_scale: ...`)."""
    name = JSON_NAMES.get(exc.field, exc.field)
    return exc if name == exc.field else InvalidRequest(name, exc.value, exc.allowed)


def json_field(exc: InvalidRequest) -> str | None:
    """The JSON field (dotted inside override_settings) a refused value came from; None when it is not one."""
    unit = unit_field(exc)
    if unit is not None:
        return unit
    name = IN_PROMPT.get(exc.field) or OF_THE_UNITS.get(exc.field, exc.field)
    known = name in JSON_NAMES.values() or name in TXT2IMG_DEFAULTS or name in IMG2IMG_DEFAULTS or name == "image"
    return name if known or name.startswith(("override_settings.", "alwayson_scripts")) else None


def _neutral(value: Any, allowed) -> bool:
    if allowed is ANY:
        return True
    if isinstance(value, (list, dict)):
        return not value
    return any(value == a for a in allowed)


def map_body(body: Any, kind: str, model: str, clip_skip: int, outdir: str,
             find_model: Callable[[str], str | None], init_image: Callable[[Any], str] | None = None) -> Mapped:
    """The request of a txt2img (`kind`) or img2img body. `model` and `clip_skip`: the API's current ones (what
    override_settings may change for this job); `find_model`: a checkpoint title -> model spec (None: unknown);
    `init_image`: a base64 image -> the path of a file holding it (img2img)."""
    if not isinstance(body, dict):
        raise InvalidRequest("body", body, "send a JSON object of A1111's fields")
    defaults = TXT2IMG_DEFAULTS if kind == "txt2img" else IMG2IMG_DEFAULTS
    given = dict(body)
    # null is the default, as A1111's optional fields take it
    got = {**defaults, **{k: v for k, v in given.items() if k in defaults and v is not None}}
    warnings = [f"unknown field {name!r} ignored" for name in given if name not in defaults]
    _refuse_what_would_change_the_image(got)
    for name, (allowed, why) in NEUTRAL.items():
        if name in given and name in defaults and not _neutral(given[name], allowed):
            warnings.append(f"{name} {given[name]!r} is not used: {why}")
    if got["styles"]:
        warnings.append(f"styles {got['styles']!r} are not used: lowvram-gen has no saved styles (put their text in "
                        "the prompt)")
    settings, keep = _override_settings(got, model, clip_skip, find_model, warnings)
    fields = dict(
        prompt=got["prompt"], negative_prompt=got["negative_prompt"] or "", width=got["width"], height=got["height"],
        steps=got["steps"], cfg_scale=got["cfg_scale"], seed=got["seed"], batch_size=got["batch_size"],
        batch_count=got["n_iter"],
        sampler=got["sampler_name"] or got["sampler_index"] or "Euler", schedule_type=got["scheduler"],
        subseed=got["subseed"], subseed_strength=got["subseed_strength"],
        seed_resize_from_w=_off_below_1(got["seed_resize_from_w"]),
        seed_resize_from_h=_off_below_1(got["seed_resize_from_h"]),
        model=settings["model"], clip_skip=settings["clip_skip"], outdir=outdir,
        extra={"api": kind},
    )
    if kind == "txt2img":
        fields.update(_hires(got))
        if fields.get("hires_scale") == 1 and not (got["hr_resize_x"] or got["hr_resize_y"]):
            warnings.append("enable_hr with hr_scale 1 and no hr_resize_x/y makes no hires pass here (A1111 runs its "
                            "second pass at the same size)")
    else:
        fields.update(_img2img(got, warnings, init_image))
    fields.update(_controlnet(got, fields, init_image))
    try:
        request = GenerationRequest(**fields).validated()
    except InvalidRequest as exc:
        raise renamed(exc) from None
    _check_controlnet_models(request)
    parameters = dict(got)
    if kind == "img2img" and not as_bool("include_init_images", got["include_init_images"]):
        parameters["init_images"] = parameters["mask"] = None  # as A1111 echoes them
    return Mapped(request, warnings, parameters, as_bool("send_images", got["send_images"]), keep)


def _off_below_1(value: Any) -> Any:
    """A1111's seed-resize sides: 0 or -1 (its default) is off."""
    return 0 if isinstance(value, (int, float)) and not isinstance(value, bool) and value < 1 else value


def _refuse_what_would_change_the_image(got: dict) -> None:
    if got.get("latent_mask"):
        raise InvalidRequest("latent_mask", "<image>", "a latent mask apart from the mask is not supported: send "
                                                       "the mask alone")
    if got["script_name"]:
        raise InvalidRequest("script_name", got["script_name"], "lowvram-gen has no scripts (GET /sdapi/v1/scripts "
                                                                "lists none): leave script_name out")
    scripts = got["alwayson_scripts"]
    if not isinstance(scripts, dict):
        raise InvalidRequest("alwayson_scripts", repr(scripts), 'send a JSON object: {"controlnet": {"args": '
                                                                "[unit, ...]}} or {}")
    others = [name for name in scripts if name not in SCRIPT_NAMES]
    if others:
        raise InvalidRequest("alwayson_scripts", ", ".join(map(repr, others)),
                             "lowvram-gen has no always-on scripts but ControlNet's (\"controlnet\": {\"args\": "
                             "[unit, ...]}): leave the others out")


def _override_settings(got: dict, model: str, clip_skip: int, find_model,
                       warnings: list[str]) -> tuple[dict, tuple[str, ...]]:
    """The job's model and clip skip (override_settings over the API's), and the ones to keep for later jobs
    (override_settings_restore_afterwards false)."""
    settings = got["override_settings"] or {}
    if not isinstance(settings, dict):
        raise InvalidRequest("override_settings", settings, "send a JSON object of settings, e.g. "
                                                            '{"sd_model_checkpoint": "tiny"}')
    out = {"model": model, "clip_skip": clip_skip}
    for key, value in settings.items():
        if key == "sd_model_checkpoint":
            spec = find_model(value) if isinstance(value, str) else None
            if spec is None:
                raise InvalidRequest("override_settings.sd_model_checkpoint", value,
                                     "no such model: GET /sdapi/v1/sd-models lists their titles")
            out["model"] = spec
        elif key == "CLIP_stop_at_last_layers":
            out["clip_skip"] = value
        else:
            warnings.append(f"override_settings.{key} is not used: lowvram-gen has no such setting")
    restore = as_bool("override_settings_restore_afterwards", got["override_settings_restore_afterwards"])
    keep = () if restore else tuple(name for name, key in (("model", "sd_model_checkpoint"),
                                                          ("clip_skip", "CLIP_stop_at_last_layers")) if key in settings)
    return out, keep


def _hires(got: dict) -> dict:
    """hires fix's request fields, with enable_hr (A1111 ignores the hr_* fields without it): hr_scale, or
    hr_resize_x/y (a side 0: from the other), hr_upscaler (A1111's names: Latent and its modes, None, Lanczos,
    Nearest, a model), hr_second_pass_steps, denoising_strength, and the second pass's own hr_sampler_name,
    hr_scheduler, hr_cfg, hr_prompt, hr_negative_prompt (empty or A1111's "Use same ...": the first pass's)."""
    if not as_bool("enable_hr", got["enable_hr"]):
        return {}
    return dict(hires_scale=got["hr_scale"], hires_upscaler=got["hr_upscaler"] or "Latent",
                hires_steps=got["hr_second_pass_steps"], hires_denoise=got["denoising_strength"],
                hires_resize_w=got["hr_resize_x"], hires_resize_h=got["hr_resize_y"],
                hires_sampler=got["hr_sampler_name"] or "", hires_schedule_type=got["hr_scheduler"] or "",
                hires_cfg=got["hr_cfg"] or 0.0, hires_prompt=got["hr_prompt"] or "",
                hires_negative=got["hr_negative_prompt"] or "")


def _img2img(got: dict, warnings: list[str], init_image: Callable[[Any], str] | None) -> dict:
    images = got["init_images"]
    if not isinstance(images, list) or not images:
        raise InvalidRequest("init_images", images, "send a list with one base64 image (PNG or JPEG; a data: URL "
                                                    "works too)")
    if len(images) > 1:
        warnings.append(f"init_images has {len(images)} images: only the first is used")
    if init_image is None:
        raise ValueError("img2img needs init_image to store the image")
    fields = dict(init_image=init_image(images[0]), strength=got["denoising_strength"])
    if got["mask"]:
        fields.update(_inpaint(got, warnings, init_image))
    return fields


def _inpaint(got: dict, warnings: list[str], init_image: Callable[..., str]) -> dict:
    """A1111's inpaint fields as the request's (its API's defaults: mask blur 4, inpainting_fill 0 = fill, only
    masked with padding 0): mask_blur (else mask_blur_x), inpainting_fill 0-3, inpaint_full_res, its padding,
    inpainting_mask_invert; the mask stored as the init image is."""
    blur_x, blur_y = got["mask_blur_x"], got["mask_blur_y"]
    blur = got["mask_blur"] if got["mask_blur"] is not None else blur_x
    if got["mask_blur"] is None and blur_x != blur_y:
        warnings.append(f"mask_blur_y {blur_y!r} is not used: the mask is blurred the same both ways (mask_blur_x)")
    if got["mask_round"] not in (True, None):
        warnings.append("mask_round false is not used: the mask is rounded to black and white")
    invert = got["inpainting_mask_invert"]
    return dict(mask=init_image(got["mask"], "mask"), mask_blur=blur, masked_content=got["inpainting_fill"],
                inpaint_area=got["inpaint_full_res"], mask_padding=got["inpaint_full_res_padding"],
                invert_mask=invert)


def _controlnet(got: dict, fields: dict, init_image: Callable[..., str] | None) -> dict:
    """The request's `controlnets` and `control_mode` from alwayson_scripts' ControlNet units (control/api.py: the
    extension's unit fields, disabled units left out), each unit's base64 image stored as the init image is."""
    scripts = {k: v for k, v in got["alwayson_scripts"].items() if k in SCRIPT_NAMES}
    if not scripts:
        return {}
    if len(scripts) > 1:
        raise InvalidRequest("alwayson_scripts", ", ".join(map(repr, scripts)), "give the ControlNet units once")
    if init_image is None:
        raise ValueError("ControlNet units need init_image to store their images")
    out = with_units({"alwayson_scripts": scripts, "width": fields["width"], "height": fields["height"]},
                     image=lambda field, value: init_image(value, field))
    return {k: out[k] for k in ("controlnets", "control_mode") if k in out and out[k]}


def _check_controlnet_models(request: GenerationRequest) -> None:
    """Each unit's model found (models/ControlNet by name, as /controlnet/model_list lists them, a folder, a file or
    a hub id) before the job queues, so a 422 names the unit whose model is not there."""
    if not request.controlnets:
        return
    from lowvram_gen.models.controlnet import resolve_controlnet

    for i, unit in enumerate(request.controlnets):
        try:
            resolve_controlnet(unit.model)
        except InvalidRequest as exc:
            raise InvalidRequest(f"ControlNet unit {i} model", unit.model,
                                 f"{exc.allowed}; GET /controlnet/model_list lists the models") from None


# the unit's field as its errors name it (control/units.py, control/api.py) -> the extension's JSON key
UNIT_KEYS = {"image": "image", "control image": "image", "model": "model", "weight": "weight",
             "guidance start": "guidance_start", "guidance end": "guidance_end", "preprocessor": "module",
             "canny low threshold": "threshold_a", "canny high threshold": "threshold_b", "resize_mode": "resize_mode",
             "mask": "mask", "hr_option": "hr_option"}
_UNIT = re.compile(r"^ControlNet unit (\d+)(?: (.+))?$")


def unit_field(exc: InvalidRequest) -> str | None:
    """`alwayson_scripts.controlnet.args.N.key` for a refused value of ControlNet unit N (None: not a unit's)."""
    match = _UNIT.match(exc.field)
    if match is None:
        return None
    what = match.group(2) or ""
    key = exc.value if what == "field" and isinstance(exc.value, str) else UNIT_KEYS.get(what)
    return f"alwayson_scripts.controlnet.args.{match.group(1)}" + (f".{key}" if key else "")
