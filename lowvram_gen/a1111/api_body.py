"""A1111's txt2img/img2img JSON body -> one `GenerationRequest` (validated once, as every front end's is).

The body's fields are A1111's (its `StableDiffusionProcessingTxt2Img`/`Img2Img` and the API's own:
sampler_index, send_images, save_images, script_name, alwayson_scripts...), with A1111's API defaults where
a field is left out (sampler Euler, denoising strength 0.75), but for the steps and CFG scale: the model family's
(20 / 7 for SD, 9 / 0 for Z-Image Turbo ...; A1111's API would run 50 steps), which `info` reports. Each field is one of:

- mapped onto a request field (prompt, seed, sampler_name + scheduler, enable_hr and the hr_* fields, init_images,
  mask and the inpaint fields, override_settings...);
- one of A1111's that has no effect here at its neutral value (restore_faces false, eta 1, s_noise 1, mask
  blur without a mask...): accepted silently at that value, named in a warning at any other;
- refused with the reason, where ignoring it would make another image than asked (a latent mask apart from the
  mask, a script, an always-on script other than ControlNet's);
- `alwayson_scripts: {"controlnet": {"args": [unit, ...]}}`: A1111's ControlNet extension's units (its field names,
  base64 images), read by the batch lines' parser (a1111/controlnet_units.py) into the request's `controlnets`;
- unknown: ignored, and named in a warning.

A1111's tolerance is kept where scripts count on it: a width or height that is no multiple of 8 runs at the size
A1111's latent gives (rounded down to one, a warning says so), and an unknown LoRA tag is left out with a warning
(api/names.py); the CLI and the UI refuse both.

A bad value is the request's `InvalidRequest` renamed to the JSON field (`invalid cfg_scale: 31; a number from
0 to 30`), which the routes answer 422 with FastAPI's validation shape, as A1111 answers a value its model refuses.

Which key is which field, its default and its policy are a1111/fields.py's table; this module applies them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

from lowvram_gen.a1111 import api_names
from lowvram_gen.a1111.controlnet_units import SCRIPT_NAMES, unit_field, with_units
from lowvram_gen.a1111.fields import BOTH, FIELDS, IMG2IMG, REFUSED, TXT2IMG, WARNED, Field, api_key, read_refiner
from lowvram_gen.a1111.unipc_options import DEFAULTS as UNIPC_DEFAULTS
from lowvram_gen.errors import InvalidRequest
from lowvram_gen.request import MAX_SIDE, MIN_SIDE, GenerationRequest, as_bool, as_int
from lowvram_gen.rng import DEFAULT as DEFAULT_RNG

# A1111's API defaults of the fields it echoes in `parameters` (its processing classes' and its API model's)
_BODY = [f for f in FIELDS if f.api and "." not in f.api]
TXT2IMG_DEFAULTS: dict[str, Any] = {f.api: f.default for f in _BODY if f.body in (BOTH, TXT2IMG)}
IMG2IMG_DEFAULTS: dict[str, Any] = {f.api: f.default for f in _BODY if f.body in (BOTH, IMG2IMG)}
# the request's field names (its InvalidRequest's) -> the JSON field that set them
JSON_NAMES: dict[str, str] = {said: f.api for f in FIELDS if f.request and f.api
                              for said in (f.said or (f.name.replace("_", " "),))}
_SETTINGS = {f.api.partition(".")[2]: f for f in FIELDS if f.api and f.api.startswith("override_settings.")}
# what a job refuses in the prompt: the message keeps its name (`invalid LoRA: ...`), the 422's loc says the field
IN_PROMPT = {"LoRA": "prompt", "loras": "prompt", "embedding": "prompt"}
LATENT_SCALE = 8  # px of the image per latent pixel, in A1111's latent (its opt_f)
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
    keep_settings: tuple[str, ...] = ()  # "model", "clip_skip", "vae", "rng", "img2img_fix_steps", "ensd"
    script_args: list | None = None  # script_name's script_args as sent (api/scripts.py reads them)
    script: str | None = None  # script_name, lower case: "x/y/z plot", or img2img's "loopback", "sd upscale"


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


def map_body(body: Any, kind: str, model: str, clip_skip: int, outdir: str,
             find_model: Callable[[str], str | None], init_image: Callable[[Any], str] | None = None,
             names: Callable[[dict], list[str]] | None = None, vae: str = "Automatic",
             rng: str = DEFAULT_RNG, fix_steps: bool = False, ensd: int = 0, unipc: dict | None = None) -> Mapped:
    """The request of a txt2img (`kind`) or img2img body. `model`, `clip_skip`, `vae`, `rng` (randn_source) and
    `fix_steps` (A1111's img2img_fix_steps), `ensd` (eta_noise_seed_delta), `unipc` (the uni_pc_* settings by request
    field, unipc_options.SETTINGS; None: A1111's defaults): the API's current ones (what override_settings may change
    for this job);
    `find_model`: a checkpoint title -> model spec (None: unknown); `init_image`: a base64 image -> the path of a file
    holding it (img2img); `names`: checks the request fields' upscaler, ControlNet and LoRA names before the request's
    own checks look for files (api/names.py: names, not server paths), and returns its warnings (the unknown LoRA tags
    it left out)."""
    if not isinstance(body, dict):
        raise InvalidRequest("body", body, "send a JSON object of A1111's fields")
    defaults = TXT2IMG_DEFAULTS if kind == "txt2img" else IMG2IMG_DEFAULTS
    given = dict(body)
    # null is the default, as A1111's optional fields take it
    echo = {**defaults, **{k: v for k, v in given.items() if k in defaults and v is not None}}
    warnings = [f"unknown field {name!r} ignored" for name in given if name not in defaults]
    specs = [f for f in _BODY if f.api in defaults]
    got = {f.name: echo[f.api] for f in specs}  # by our names: the request's, A1111's own for its own fields
    script, script_args = _script(got, kind)  # before the refusals: the API runs script_name's scripts
    for spec in specs:
        if spec.policy == REFUSED and not spec.neutral_value(got[spec.name]):
            raise spec.refusal(got[spec.name])
    _check_scripts(got)
    warnings += [f.warning(given[f.api]) for f in specs
                 if f.policy == WARNED and f.api in given and not f.neutral_value(given[f.api])]
    settings, keep = _override_settings(got, model, clip_skip, vae, find_model, warnings, rng, fix_steps, ensd,
                                        unipc)
    fields = {f.name: _value(f, got) for f in specs if f.request and not f.when and f.name != "init_image"}
    fields.update(model=settings["model"], clip_skip=settings["clip_skip"], vae=settings["vae"], rng=settings["rng"],
                  img2img_fix_steps=settings["img2img_fix_steps"], ensd=settings["ensd"], outdir=outdir,
                  extra={"api": kind}, **{name: settings[name] for name in UNIPC_DEFAULTS})
    if fields.get("refiner") and str(fields["refiner"]).strip().lower() != "none":  # a checkpoint's title or name
        text = str(fields["refiner"])
        found = find_model(text) or find_model(read_refiner("refiner", text))  # `name [hash]`: its name
        if found is None:  # a listed checkpoint only, as sd_model_checkpoint: never a path of the server's
            raise api_names.refused(api_key("refiner"), text, api_names.MODELS)
        fields["refiner"] = found
    if "filename_pattern" in settings:  # override_settings.samples_filename_pattern (else the API's, api/routes.py)
        fields["filename_pattern"] = settings["filename_pattern"]
    unset = _family_defaults(given, fields)
    warnings += _latent_sides(fields)
    if kind == "txt2img":
        fields.update(_hires(specs, got))
        if fields.get("hires_scale") == 1 and not (got["hires_resize_w"] or got["hires_resize_h"]):
            warnings.append(f"enable_hr with {api_key('hires_scale')} 1 and no {api_key('hires_resize_w')}/"
                            f"{api_key('hires_resize_h')} makes no hires pass here (A1111 runs its second pass at "
                            "the same size)")
    else:
        fields.update(_img2img(specs, got, warnings, init_image, _edits(fields["model"])))
    fields.update(_controlnet(got, fields, init_image))
    if names is not None:
        warnings += names(fields) or []
    try:
        request = GenerationRequest(**fields).validated()
    except InvalidRequest as exc:
        raise renamed(exc) from None
    _check_controlnet_models(request)
    parameters = dict(echo)
    parameters.update({api_key(name): None for name in unset})  # the model family's, which `info` says
    if kind == "img2img" and not as_bool("include_init_images", got["include_init_images"]):
        parameters[api_key("init_image")] = parameters[api_key("mask")] = None  # as A1111 echoes them
    return Mapped(request, warnings, parameters, as_bool("send_images", got["send_images"]), keep, script_args,
                  script)


def _family_defaults(given: dict, fields: dict) -> tuple[str, ...]:
    """Steps and CFG scale a body leaves out (or sends null) are the model family's (families/record.py `sampling`:
    20 / 7 for SD 1.x/2.x and SDXL, 9 / 0 for Z-Image Turbo ...), as the CLI's and the web UI's are, not A1111's API
    defaults (50 / 7, made for SD); a client that sends them gets its own. The names of the fields left to the family."""
    unset = tuple(name for name in ("steps", "cfg_scale") if given.get(api_key(name)) is None)
    fields.update({name: None for name in unset})
    return unset


def _latent_sides(fields: dict) -> list[str]:
    """Width and height as A1111's latent makes them (width // 8 x height // 8: a 500x300 body makes a 496x296
    image), with a warning for each side that changed; the request refuses such a side from the CLI and the UI. A
    side that is no whole number, or too small once rounded down, is left for the request to refuse."""
    warnings = []
    for name in ("width", "height"):
        value = fields.get(name)
        try:
            side = as_int(name, value, MIN_SIDE, MAX_SIDE)
        except InvalidRequest:
            continue
        if side % LATENT_SCALE and side - side % LATENT_SCALE >= MIN_SIDE:
            fields[name] = side - side % LATENT_SCALE
            warnings.append(f"{api_key(name)} {side} is not a multiple of {LATENT_SCALE}: ran at {fields[name]}, as "
                            "A1111's latent does")
    return warnings


def _value(spec: Field, got: dict) -> Any:
    """The request value of `spec` from the body: its `empty` where A1111's value is empty, after an alias that is
    A1111's own older key (sampler_index, read where sampler_name is not given); the seed-resize sides 0 or -1 (its
    default) off."""
    value = got[spec.name]
    if spec.empty is not None and not value:
        value = next((got[alias] for alias in spec.aliases if got.get(alias)), None) or spec.empty
    if spec.name in ("seed_resize_from_w", "seed_resize_from_h"):
        value = _off_below_1(value)
    return value


def _off_below_1(value: Any) -> Any:
    """A1111's seed-resize sides: 0 or -1 (its default) is off."""
    return 0 if isinstance(value, (int, float)) and not isinstance(value, bool) and value < 1 else value


XYZ_SCRIPT = "x/y/z plot"  # A1111's script title as its API names it (any case)
IMG2IMG_SCRIPTS = ("loopback", "sd upscale")  # A1111's img2img-only scripts (lowvram_gen/img2img_scripts)


def _script(got: dict, kind: str) -> tuple[str | None, list | None]:
    """script_name (lower case) and its script_args list for a script we run: "x/y/z plot" (any case), and on
    img2img "loopback" and "sd upscale" (the body's script_name then done with); (None, None) for none; any other
    script is left for script_name's refusal."""
    name = got["script_name"]
    key = name.strip().lower() if isinstance(name, str) else None
    if key in IMG2IMG_SCRIPTS and kind != "img2img":
        raise InvalidRequest("script_name", name, "A1111 has it on img2img only: send it to /sdapi/v1/img2img")
    if key != XYZ_SCRIPT and key not in IMG2IMG_SCRIPTS:
        return None, None
    got["script_name"] = None
    args = got["script_args"]
    if args is None and key in IMG2IMG_SCRIPTS:
        args = []  # A1111's defaults
    if not isinstance(args, list):
        raise InvalidRequest("script_args", args, f"send the {name.strip()} script's arguments as a list, in "
                                                  "A1111's order (GET /sdapi/v1/script-info)")
    return key, args


def _check_scripts(got: dict) -> None:
    """alwayson_scripts: ControlNet's alone, as an object."""
    scripts = got["alwayson_scripts"]
    if not isinstance(scripts, dict):
        raise InvalidRequest("alwayson_scripts", repr(scripts), 'send a JSON object: {"controlnet": {"args": '
                                                                "[unit, ...]}} or {}")
    others = [name for name in scripts if name not in SCRIPT_NAMES]
    if others:
        raise InvalidRequest("alwayson_scripts", ", ".join(map(repr, others)),
                             "lowvram-gen has no always-on scripts but ControlNet's (\"controlnet\": {\"args\": "
                             "[unit, ...]}): leave the others out")


def _override_settings(got: dict, model: str, clip_skip: int, vae: str, find_model,
                       warnings: list[str], rng: str = DEFAULT_RNG,
                       fix_steps: bool = False, ensd: int = 0, unipc: dict | None = None) -> tuple[dict, tuple[str, ...]]:
    """The job's model, clip skip, VAE, RNG source, img2img_fix_steps, ENSD and UniPC settings (override_settings over
    the API's), and the ones to keep for later jobs (override_settings_restore_afterwards false)."""
    settings = got["override_settings"] or {}
    model_key = api_key("model").partition(".")[2]
    if not isinstance(settings, dict):
        raise InvalidRequest("override_settings", settings, "send a JSON object of settings, e.g. "
                                                            f'{{"{model_key}": "tiny"}}')
    out = {"model": model, "clip_skip": clip_skip, "vae": vae, "rng": rng, "img2img_fix_steps": fix_steps,
           "ensd": ensd, **UNIPC_DEFAULTS, **(unipc or {})}
    for key, value in settings.items():
        spec = _SETTINGS.get(key)
        if spec is None:
            warnings.append(f"override_settings.{key} is not used: lowvram-gen has no such setting")
        elif spec.name == "model":
            found = find_model(value) if isinstance(value, str) else None
            if found is None:  # a listed title, model name or file name only: never a path of the server's
                raise api_names.refused(spec.api, value, api_names.MODELS)
            out["model"] = found
        else:
            out[spec.name] = value
    restore = as_bool("override_settings_restore_afterwards", got["override_settings_restore_afterwards"])
    keep = () if restore else tuple(spec.name for key, spec in _SETTINGS.items() if key in settings)
    return out, keep


def _hires(specs: list[Field], got: dict) -> dict:
    """hires fix's request fields, with enable_hr (A1111 ignores the hr_* fields without it): the scale, or the
    resize sides (a side 0: from the other), the upscaler (A1111's names: Latent and its modes, None, Lanczos,
    Nearest, a model), the second pass's steps, denoising strength, and its own sampler, schedule type, CFG, prompt
    and negative prompt (empty or A1111's "Use same ...": the first pass's)."""
    if not as_bool("enable_hr", got["enable_hr"]):
        return {}
    return {f.name: _value(f, got) for f in specs if f.when == "hires"}


def _edits(model: str) -> bool:
    """Whether `model` is an editing model (engines/sd/edit.py: its folder's pipeline has an edit task)."""
    from lowvram_gen.families.spec import edit_record_of_spec  # no torch: model_index.json only

    return edit_record_of_spec(model) is not None


def _img2img(specs: list[Field], got: dict, warnings: list[str], init_image: Callable[[Any], str] | None,
             edit: bool = False) -> dict:
    """The init image (the first of init_images), and the mask's fields; with an editing model (`edit`) and no mask,
    every image of init_images is a reference image of an edit instead, and the denoising strength is not used."""
    images, key = got["init_image"], api_key("init_image")
    if not isinstance(images, list) or not images:
        raise InvalidRequest(key, images, "send a list with one base64 image (PNG or JPEG; a data: URL works too)")
    if edit and not got["mask"] and init_image is not None:
        warnings.append(f"an editing model: {key} are its reference images ({api_key('strength')} is not used)")
        if got["resize_mode"] not in (None, 0):
            warnings.append(f"{api_key('resize_mode')} {got['resize_mode']!r} is not used: an editing model's "
                            "pipeline sizes its reference images itself")
        return dict(reference_images=[init_image(image) for image in images], resize_mode="resize")
    if len(images) > 1:
        warnings.append(f"{key} has {len(images)} images: only the first is used")
    if init_image is None:
        raise ValueError("img2img needs init_image to store the image")
    fields = dict(init_image=init_image(images[0]))
    if got["mask"]:
        fields.update(_inpaint(specs, got, warnings, init_image))
    return fields


def _inpaint(specs: list[Field], got: dict, warnings: list[str], init_image: Callable[..., str]) -> dict:
    """A1111's inpaint fields as the request's (its API's defaults: mask blur 4, masked content 0 = fill, only
    masked with padding 0): the mask blur (else mask_blur_x), masked content 0-3, the inpaint area, its padding,
    the mask's inversion, mask_round; the mask stored as the init image is."""
    fields = {f.name: got[f.name] for f in specs if f.when == "inpaint"}
    blur_x, blur_y = got["mask_blur_x"], got["mask_blur_y"]
    if got["mask_blur"] is None:
        fields["mask_blur"] = blur_x
        if blur_x != blur_y:
            warnings.append(f"mask_blur_y {blur_y!r} is not used: the mask is blurred the same both ways "
                            "(mask_blur_x)")
    fields["mask"] = init_image(got["mask"], "mask")
    return fields


def _controlnet(got: dict, fields: dict, init_image: Callable[..., str] | None) -> dict:
    """The request's `controlnets` and `control_mode` from alwayson_scripts' ControlNet units (a1111/controlnet_units.py: the
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
    """Each unit's model found (models/ControlNet by name, as /controlnet/model_list lists them; through the API a
    path only inside --api-allow-paths, api/names.py) before the job queues, so a 422 names the unit whose model is
    not there."""
    if not request.controlnets:
        return
    from lowvram_gen.models.controlnet import resolve_controlnet

    for i, unit in enumerate(request.controlnets):
        try:
            resolve_controlnet(unit.model)
        except InvalidRequest as exc:
            raise InvalidRequest(f"ControlNet unit {i} model", unit.model,
                                 f"{exc.allowed}; GET /controlnet/model_list lists the models") from None
