"""A body's model names checked before its request is (a1111/api_names.py says why the API takes names, not server
paths): the hires upscaler, each ControlNet unit's model (the names of /controlnet/model_list, models/controlnet.py),
the prompts' <lora:NAME> tags (those of /sdapi/v1/loras, networks/lora.py) and the VAE (those of /sdapi/v1/sd-vae,
models/vae.py); a path only inside the folders of --api-allow-paths. In the API's layer, as these look at the model
folders (a1111/ does not).

A plain LoRA name that matches no file is tolerated as A1111 tolerates it: its tag is left out of the prompt with a
warning and the job runs (networks/names.py: `Names.left_out`); a name that looks like a path is still refused.
"""

from __future__ import annotations

from pathlib import Path
from typing import Iterable

from lowvram_gen.a1111.api_names import CONTROLNETS, LORAS, VAES, allowed_path, check_upscaler, refused
from lowvram_gen.a1111.fields import api_key

# the prompts whose <lora:NAME> tags are checked as names
PROMPTS = ("prompt", "negative_prompt", "hires_prompt", "hires_negative")


def check(fields: dict, allowed: tuple[Path, ...] = ()) -> list[str]:
    """The request `fields` of a body (before the request's own checks look for a file, which would tell a client
    what the server's disk holds): the hires upscaler and each unit's model as listed names, or paths inside
    `allowed` (replaced by the resolved path); LoRA tags that look like paths the same. Returns the warnings of the
    LoRA tags left out (unknown names, as A1111 leaves them out)."""
    if "vae" in fields:
        fields["vae"] = check_vae(fields["vae"], api_key("vae"), allowed)
    if "hires_upscaler" in fields:
        fields["hires_upscaler"] = check_upscaler(fields["hires_upscaler"], api_key("hires_upscaler"), allowed)
    units = fields.get("controlnets")
    for i, unit in enumerate(units if isinstance(units, list) else ()):
        if isinstance(unit, dict) and "model" in unit:
            unit["model"] = check_controlnet(unit["model"], f"ControlNet unit {i} model", allowed)
    check_lora_names({api_key(name): fields.get(name) for name in PROMPTS}, allowed)
    return without_unknown_loras(fields)


def without_unknown_loras(fields: dict) -> list[str]:
    """The prompts of `fields` without the <lora:NAME> tags of LoRAs that are not there (the negative prompts' tags
    are not applied: the job warns about them as they are); the warnings that say so."""
    from lowvram_gen.networks.names import Names

    names, warnings = Names(), []
    for name in ("prompt", "hires_prompt"):
        if isinstance(fields.get(name), str):
            fields[name], said = names.left_out(fields[name], api_key(name))
            warnings += said
    return warnings


def check_vae(value, field: str, allowed: Iterable[Path] = ()) -> object:
    """A VAE as the API takes it (override_settings.sd_vae, /options' sd_vae): Automatic, None, a name of
    /sdapi/v1/sd-vae (its file name or stem, any case), or a path inside an allowed folder (returned resolved)."""
    from lowvram_gen.errors import InvalidRequest
    from lowvram_gen.models import vae

    if not isinstance(value, str) or vae.is_own(value):
        return value
    if "/" not in value and "\\" not in value:
        try:
            vae.find(value, paths=False)
            return value
        except InvalidRequest:
            pass
    path = allowed_path(value, allowed)
    if path is None:
        raise refused(field, value, VAES)
    return path


def check_controlnet(value, field: str, allowed: Iterable[Path] = ()) -> object:
    """A ControlNet unit's model as the API takes it (its `[hash]` already taken off): a name of
    /controlnet/model_list (a file's stem, with or without its suffix, or a folder's name; any case), or a path
    inside an allowed folder (returned resolved). Empty is left to the request's check ("give a model")."""
    from lowvram_gen.models.controlnet import SUFFIXES, available

    if not isinstance(value, str) or not value.strip():
        return value
    name = value.strip()
    stem = name[: -len(Path(name).suffix)] if Path(name).suffix.lower() in SUFFIXES else name
    names = {key.lower() for key in available()}
    if "/" not in name and "\\" not in name and stem.lower() in names:
        return value
    path = allowed_path(name, allowed)
    if path is None:
        raise refused(field, value, CONTROLNETS)
    return path


def check_lora_names(texts: dict[str, str], allowed: Iterable[Path] = ()) -> None:
    """The LoRAs of the prompts' `<lora:NAME>` tags (`texts`: field -> prompt): a name that looks like a path (a
    folder separator, `~`, a leading dot, or a LoRA file suffix) must be a listed one or lie inside an allowed
    folder. A plain unknown name is left to the job (it looks in the LoRA folder only)."""
    from lowvram_gen.networks.lora import SUFFIXES, available_loras
    from lowvram_gen.networks.tags import extract_lora_tags

    listed = {key.lower() for key in available_loras()}
    refs = [(field, ref.name) for field, text in texts.items() if isinstance(text, str) and text
            for ref in extract_lora_tags(text)[1]]
    for field, name in refs:
        suffix = Path(name).suffix.lower()
        pathlike = "/" in name or "\\" in name or name.startswith(("~", ".")) or suffix in SUFFIXES
        if not pathlike:
            continue
        stem = name[: -len(suffix)] if suffix in SUFFIXES else name
        if "/" not in stem and "\\" not in stem and not stem.startswith(("~", ".")) and stem.lower() in listed:
            continue
        if allowed_path(name, allowed) is None:
            raise refused(field, name, LORAS)
