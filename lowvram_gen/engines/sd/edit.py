"""Editing models in a Stable Diffusion job (issue 30): the reference images of an edit, driven by the family record's
`Edit` (families/record.py): which argument of the call takes them, how many, how the pipeline resizes them.

An edit is the family's edit pipeline (its record's Task.EDIT: QwenImageEditPipeline, FluxKontextPipeline,
Flux2KleinPipeline's `image`, ...) called as the txt2img pass is, with the reference images beside the prompt: the
same ladder, presets, budget and saving. Where the loaded pipeline is not that class it is made over the same
components (kept_pipe), as img2img's is. What a family cannot do is refused in one sentence naming it before any
step runs: an edit on a model without an edit pipeline, more reference images than it takes, and txt2img/img2img on
a model whose call needs a reference image (Qwen-Image-Edit; its inpaint pipeline takes the init image, and runs).

Nothing here imports torch or diffusers at import time: `edit_record_of_spec` is read by the CLI and the REST API
before any model loads.
"""

from __future__ import annotations

from pathlib import Path

from lowvram_gen import families
from lowvram_gen.engines.sd.kept import kept_pipe
from lowvram_gen.errors import InvalidRequest
from lowvram_gen.families import Family, Task
from lowvram_gen.families.execution import task_of
from lowvram_gen.families.spec import edit_record_of_spec


def _named(record: Family, pipe) -> str:
    return record.name or type(pipe).__name__


def editing_models() -> str:
    """The families that edit, as a refusal names them ('Qwen-Image-Edit, FLUX.1 Kontext and Flux.2 Klein')."""
    names = list(dict.fromkeys(r.name for r in families.all_families() if r.has_task(Task.EDIT)))
    return " and ".join(filter(None, (", ".join(names[:-1]), names[-1]))) if names else "none"


def check(pipe, request) -> None:
    """What this pipeline cannot do with the request's edit, or without one, in one sentence naming the family."""
    record, task = task_of(pipe)
    refs = tuple(getattr(request, "reference_images", ()) or ())
    if refs:
        check_references(record, len(refs), _named(record, pipe))
        return
    mask = getattr(request, "mask", None)
    if mask and record.has_task(Task.INPAINT):  # its inpaint pipeline edits the init image (Qwen-Image-Edit's)
        return
    if record.edit is not None and record.edit.needs_image:
        what = "img2img" if mask is None and getattr(request, "init_image", None) else "inpaint" if mask else "txt2img"
        raise InvalidRequest("task", what, f"{record.name} edits images and needs a reference image: use lowvram-gen "
                                           "edit PROMPT --image IMAGE")


def check_references(record: Family, count: int, named: str) -> None:
    """An edit of `count` reference images on the family `record` (`named` in the sentence): refused where it has no
    edit pipeline or takes fewer images. `generate` checks it on the loaded pipeline, `plan` on the planned record."""
    if not record.has_task(Task.EDIT) or record.edit is None:
        raise InvalidRequest("task", "edit", f"{named} has no edit pipeline in diffusers: edit with an editing model "
                                             f"({editing_models()})")
    most = record.edit.max_images
    if count > most:
        raise InvalidRequest("reference images", count,
                             f"{record.name} takes at most {most} reference image{'s' if most > 1 else ''}")


def edit_pipe(pipe):
    """The family's edit pipeline over the loaded components: the loaded pipeline itself where it is that class."""
    name = families.of_pipe(pipe).pipeline_for(Task.EDIT)
    if type(pipe).__name__ == name:
        return pipe
    from lowvram_gen.engines.sd.inpaint import _Direct

    return kept_pipe(pipe, _Direct(name), "_lowvram_edit")


def read(paths) -> list:
    """The reference images as RGB PIL images, read once per job."""
    from PIL import Image

    images = []
    for path in paths:
        with Image.open(path) as image:
            images.append(image.convert("RGB"))
    return images


def call_kwargs(pipe, references: list | None, width: int, height: int) -> dict:
    """The call's edit arguments: the reference images (one image where the family takes one, else a list) under
    the record's argument, and the output area where the call rescales the asked size to one of its own
    (Kontext's `max_area`: the image is made at the asked size, as txt2img's is)."""
    record = families.of_pipe(pipe)
    edit = record.edit
    if edit is None:
        return {}
    out = {edit.max_area_argument: width * height} if edit.max_area_argument else {}
    if references:
        out[edit.argument] = references[0] if edit.max_images == 1 else list(references)
    return out


def per_call(pipe) -> int | None:
    """Images one edit call makes at most (1 where the call takes one prompt: Qwen-Image-Edit-Plus); None: any."""
    edit = families.of_pipe(pipe).edit
    return None if edit is None or edit.batches else 1


def reference_tokens(record: Family, sizes: list[tuple[int, int]], latent_scale: int, patch: int) -> int:
    """Tokens the reference images add to each image's stream: each resized as its pipeline does (`Edit.resize`:
    to about `pixels`, or only down to them), in latents of `latent_scale` px, `patch` x `patch` latents a token."""
    edit = record.edit
    if edit is None:
        return 0
    tokens = 0
    for w, h in sizes:
        area = w * h
        if edit.resize == "area" or area > edit.pixels:
            area = edit.pixels
        tokens += int(area / (latent_scale * patch) ** 2)
    return tokens


def planned(profile, record: Family | None, request):
    """`profile` (models/profile.ModelProfile) with the request's reference images counted as tokens beside the image
    tokens, at the sizes the family's pipeline resizes them to (a transformer family with an edit task only)."""
    import dataclasses

    refs = getattr(request, "reference_images", ())
    if refs and record is not None and not record.is_generic:  # as generate refuses them, before any plan
        check_references(record, len(refs), record.name)
    if not refs or record is None or record.edit is None or profile.denoiser != "transformer":
        return profile
    from PIL import Image

    sizes = []
    for path in refs:
        with Image.open(path) as image:  # the header only
            sizes.append(image.size)
    tokens = reference_tokens(record, sizes, int(profile.vae_scale_factor), int(profile.transformer_patch))
    return dataclasses.replace(profile, reference_tokens=tokens)


def infotext_fields(request) -> dict:
    """What the PNG says of an edit: its reference images by file name (A1111 has no such field; ours, as Forge's
    'Init image' note)."""
    refs = getattr(request, "reference_images", ())
    return {"Reference images": ", ".join(Path(p).name for p in refs)} if refs else {}


def img2img_as_edit(fields: dict) -> dict:
    """An img2img job's request fields (the web UI's img2img tab) as an edit where the model is an editing model and
    no mask is given: the init image is the reference image, and the strength and the resize mode are not used (the
    edit pipeline sizes its references itself), as the REST API's img2img does with an editing model
    (a1111/api_body.py); the request refuses a resize mode beside reference images. Other models' fields come back
    as they are."""
    if fields.get("mask") or not fields.get("init_image") or edit_record_of_spec(str(fields.get("model") or "")) \
            is None:
        return fields
    out = {k: v for k, v in fields.items() if k not in ("init_image", "strength", "resize_mode")}
    return {**out, "reference_images": (fields["init_image"],)}
