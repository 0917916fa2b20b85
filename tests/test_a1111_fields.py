"""A1111's vocabulary in one table (a1111/fields.py): every labelled field written to a PNG reads back to the same
request value, each field's one policy holds in the API and in a batch line alike, A1111's own texts read back,
and A1111's field names are written in one module."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest
from PIL import Image

from lowvram_gen.a1111.api_body import map_body
from lowvram_gen.a1111.fields import (ANY, BATCH, BY_NAME, FIELDS, IMG2IMG, LABELS, NOT_BUILT, REFUSED, USED, WARNED,
                                      label)
from lowvram_gen.a1111.infotext import a1111_fields, controlnet_fields, request_fields
from lowvram_gen.batch.files import expand, parse_options, read_entries
from lowvram_gen.control.units import ControlNetUnit
from lowvram_gen.errors import InvalidRequest
from lowvram_gen.outputs import a1111_parameters, parse_a1111_parameters
from lowvram_gen.request import GenerationRequest
from lowvram_gen.schedules import AUTOMATIC
from lowvram_gen.schedules import label as schedule_label

PACKAGE = Path(__file__).resolve().parent.parent / "lowvram_gen"
INPAINT = dict(init_image="in.png", mask="mask.png")
HIRES = dict(hires_scale=2.0)
UNIT = ControlNetUnit("control_v11p_sd15_canny", weight=0.5, guidance_start=0.1, guidance_end=0.9,
                      preprocessor="canny", canny_low=50, canny_high=150)
# each labelled request field: a request that writes it with a value other than the default
EXAMPLES = {
    "steps": dict(steps=33), "sampler": dict(sampler="DPM++ 2M"), "schedule_type": dict(schedule_type="karras"),
    "cfg_scale": dict(cfg_scale=4.5), "seed": dict(seed=1234), "width": dict(width=640, height=384),
    "height": dict(width=384, height=640), "subseed": dict(subseed=77, subseed_strength=0.3),
    "subseed_strength": dict(subseed=5, subseed_strength=0.25),
    "seed_resize_from_w": dict(seed_resize_from_w=256, seed_resize_from_h=320),
    "seed_resize_from_h": dict(seed_resize_from_w=320, seed_resize_from_h=256),
    "model": dict(model="runwayml/stable-diffusion-v1-5"), "quantize": dict(quantize="int8"),
    "clip_skip": dict(clip_skip=2), "strength": dict(init_image="in.png", strength=0.4),
    "mask_blur": dict(INPAINT, mask_blur=9), "invert_mask": dict(INPAINT, invert_mask=True),
    "inpaint_area": dict(INPAINT, inpaint_area="masked", mask_padding=40),
    "mask_padding": dict(INPAINT, inpaint_area="masked", mask_padding=12),
    "masked_content": dict(INPAINT, masked_content="latent-nothing"),
    "hires_denoise": dict(HIRES, hires_denoise=0.3), "hires_sampler": dict(HIRES, hires_sampler="DPM++ 2M"),
    "hires_prompt": dict(HIRES, hires_prompt="a red fox"), "hires_negative": dict(HIRES, hires_negative="blur"),
    "hires_cfg": dict(HIRES, hires_cfg=4.0), "hires_schedule_type": dict(HIRES, hires_schedule_type="karras"),
    "hires_resize_w": dict(HIRES, hires_resize_w=640, hires_resize_h=512),
    "hires_resize_h": dict(HIRES, hires_resize_w=512, hires_resize_h=640), "hires_scale": dict(hires_scale=1.5),
    "hires_steps": dict(HIRES, hires_steps=7), "hires_upscaler": dict(HIRES, hires_upscaler="Latent (nearest)"),
    "controlnets": dict(controlnets=(UNIT,), control_mode="prompt"),
    "vae": dict(vae="vae-ft-mse-840000-ema-pruned.safetensors"), "rng": dict(rng="nv"), "ensd": dict(ensd=31337),
    "unipc_variant": dict(unipc_variant="bh2"), "unipc_skip_type": dict(unipc_skip_type="logSNR"),
    "unipc_order": dict(unipc_order=2), "unipc_lower_order_final": dict(unipc_lower_order_final=False),
    "tiling": dict(tiling=True),
    "refiner": dict(refiner="sd_xl_refiner_1.0"), "refiner_switch_at": dict(refiner="r", refiner_switch_at=0.65),
}
# labels A1111 writes and we read, that our PNGs do not write: each of them is one image of its batch
READ_ONLY = {"batch_size": ("Batch size: 4", 4)}


def _written(request: GenerationRequest) -> str:
    """`request`'s PNG text, as engines/sd/job.py writes it (the sampler and schedule type as they ran)."""
    schedule = None if request.schedule_type == AUTOMATIC else schedule_label(request.schedule_type)
    hires = None
    if request.hires_sampler or request.hires_schedule_type:
        name, kind = request.hires_sampling
        hires = (name, None if kind == AUTOMATIC else schedule_label(kind))
    fields = {**controlnet_fields(request, [u.model for u in request.controlnets]),
              **a1111_fields(request, (request.sampler, schedule), request.seed, "cpu", request.output_size(),
                             request.quantize or "none", hires_sampler=hires,
                             vae=None if request.vae in ("Automatic", "None") else (request.vae, "0123abcdef"))}
    return a1111_parameters(request.prompt, request.negative_prompt, fields)


@pytest.mark.parametrize("name", sorted(LABELS))
def test_every_labelled_field_is_written_and_read_back_to_the_same_request_value(name):
    assert set(EXAMPLES) | set(READ_ONLY) == set(LABELS)  # a new labelled field needs its example here
    if name in READ_ONLY:
        text, value = READ_ONLY[name]
        assert request_fields(parse_a1111_parameters(f"x\nSteps: 2, Seed: 1, {text}")).fields[name] == value
        return
    request = GenerationRequest(**{"prompt": "a cat", "negative_prompt": "lowres", "sampler": "Euler", **EXAMPLES[name]})
    assert getattr(request, name) != getattr(GenerationRequest(), name)  # the example says something
    text = _written(request)
    assert label(name).format(0) in text
    read = request_fields(parse_a1111_parameters(text))
    assert read.fields[name] == getattr(request, name) and read.ignored == [] and read.unusable == []
    for other, value in EXAMPLES[name].items():  # what the example set besides the field reads back too
        assert read.fields.get(other, value) == value


# A1111's own texts (1.10's img2img inpaint; an older one's padding label, the inverted mask) and what they set
A1111_TEXTS = [
    ("a cat on a sofa\nNegative prompt: lowres, blurry\nSteps: 30, Sampler: DPM++ 2M, Schedule type: Karras, "
     "CFG scale: 7, Seed: 1234, Size: 512x512, Model hash: 6ce0161689, Model: v1-5-pruned-emaonly, "
     "Denoising strength: 0.75, Mask blur: 4, Inpaint area: Only masked, Masked area padding: 32, "
     "Masked content: fill, Version: v1.10.1",
     {"prompt": "a cat on a sofa", "negative_prompt": "lowres, blurry", "steps": 30, "sampler": "DPM++ 2M",
      "schedule_type": "karras", "cfg_scale": 7.0, "seed": 1234, "width": 512, "height": 512,
      "model": "v1-5-pruned-emaonly", "strength": 0.75, "mask_blur": 4, "inpaint_area": "masked", "mask_padding": 32,
      "masked_content": "fill"}),
    ("x\nSteps: 20, Mask mode: Inpaint not masked, Inpaint area: Whole picture",
     {"prompt": "x", "negative_prompt": "", "steps": 20, "invert_mask": True, "inpaint_area": "whole"}),
]


@pytest.mark.parametrize("text,expected", A1111_TEXTS)
def test_a1111s_own_texts_read_back_as_before(text, expected):
    read = request_fields(parse_a1111_parameters(text))
    assert (read.fields, read.ignored, read.notes) == (expected, [], [])


def test_an_older_label_reads_and_a_mask_mode_a1111_does_not_write_is_refused_naming_it():
    # A1111 before 1.6 wrote the padding under a label with a comma (its own parser reads it from its dict only)
    assert request_fields({"Only masked padding, pixels": "16"}).fields["mask_padding"] == 16
    with pytest.raises(InvalidRequest, match="'Mask mode' in the image's parameters: 'Inpaint all'; expected "
                                             "'Inpaint masked' or 'Inpaint not masked'"):
        request_fields(parse_a1111_parameters("x\nSteps: 20, Seed: 1, Mask mode: Inpaint all"))


# ------------------------------------------------------------------------------------------------ one policy


@pytest.fixture
def init_png(tmp_path):
    path = tmp_path / "init.png"
    Image.new("RGB", (64, 64), "white").save(path)
    return str(path)


def _api(tmp_path, init_png, **body):
    """map_body of `body` as the API gets it: img2img where the field is img2img's, else txt2img."""
    img2img = any(BY_NAME.get(k) is not None and BY_NAME[k].body == IMG2IMG for k in body)
    extra = dict(init_images=["<base64>"]) if img2img else {}
    return map_body(dict(prompt="x", steps=1, width=64, height=64, **extra, **body),
                    "img2img" if img2img else "txt2img", "tiny", 1, str(tmp_path), find_model=lambda title: None,
                    init_image=lambda value, *where: init_png)


def _line(tmp_path, name, value):
    """The jobs of a one-line .jsonl file with `name: value`."""
    path = tmp_path / "line.jsonl"
    path.write_text('{"prompt": "x", "steps": 1, "%s": %s}\n' % (name, value))
    return expand(read_entries(path), {})


WARNED_FIELDS = sorted(name for name, spec in NOT_BUILT.items() if spec.policy == WARNED)


@pytest.mark.parametrize("name", WARNED_FIELDS)
def test_a_warned_field_is_accepted_with_one_warning_in_the_api_and_in_a_batch_line(name, tmp_path, init_png):
    spec = BY_NAME[name]
    said = [] if spec.neutral == ANY else [f"{name} 7 is not used: {spec.why}"]
    line = _line(tmp_path, name, 7)
    assert not line.bad and len(line.jobs) == 1 and line.warnings == [f"line 1: {w}" for w in said]
    if spec.body != BATCH:
        assert _api(tmp_path, init_png, **{name: 7}).warnings == said
    for value in (spec.neutral if spec.neutral != ANY else ()):  # A1111's defaults: silent in both
        if value is not None:
            assert _line(tmp_path, name, str(value).lower() if isinstance(value, bool) else f'"{value}"').warnings \
                == []
            if spec.body != BATCH and value != float("inf"):
                assert _api(tmp_path, init_png, **{name: value}).warnings == []


def test_a_txt_lines_warned_option_is_accepted_with_its_warning():
    """Issue 28: the fields a batch line refused and the API warned of are warned of in both (sampler_index: used)."""
    assert {name: BY_NAME[name].policy for name in ("restore_faces", "tiling", "styles", "sampler_index")} == \
        {"restore_faces": WARNED, "tiling": USED, "styles": USED, "sampler_index": USED}
    fields, warnings = parse_options("--prompt x --restore_faces true --tiling false --styles cinematic")
    assert fields == {"prompt": "x", "tiling": "false", "styles": "cinematic"}
    assert warnings == ["restore_faces 'true' is not used: face restoration is not part of lowvram-gen"]


@pytest.mark.parametrize("name,value,shown", [("script_name", '"Prompt matrix"', "'Prompt matrix'"),
                                              ("latent_mask", '"iVBORw0KGgo"', "'<image>'")])
def test_a_refused_field_is_refused_in_the_api_and_in_a_batch_line_naming_the_value(name, value, shown, tmp_path,
                                                                                   init_png):
    assert BY_NAME[name].policy == REFUSED
    message = f"invalid {name}: {shown}; {BY_NAME[name].why}"
    line = _line(tmp_path, name, value)
    assert not line.jobs and [b.error for b in line.bad] == [message]
    with pytest.raises(InvalidRequest) as exc:
        _api(tmp_path, init_png, **{name: value.strip('"')})
    assert str(exc.value) == message
    assert not _line(tmp_path, name, "null").bad and _api(tmp_path, init_png, **{name: None}).warnings == []


def test_sampler_index_is_a1111s_older_name_of_sampler_name_in_the_api_and_in_a_batch_line(tmp_path, init_png):
    assert BY_NAME["sampler_index"].policy == USED
    assert _api(tmp_path, init_png, sampler_index="DPM++ 2M").request.sampler == "DPM++ 2M"
    assert _api(tmp_path, init_png, sampler_index="Euler", sampler_name="Heun").request.sampler == "Heun"
    fields, warnings = parse_options("--prompt x --sampler_index 'DPM++ 2M'")
    assert fields == {"prompt": "x", "sampler": "DPM++ 2M"} and warnings == []
    assert _line(tmp_path, "sampler_index", '"Euler a"').jobs[0].request.sampler == "Euler a"


def test_the_table_holds_each_name_once():
    """Each name is one field's, and an alias names one request field and is none's own name (sampler_index aside:
    A1111's own API key too, with its default there)."""
    names = [f.name for f in FIELDS]
    assert len(names) == len(set(names))
    aliases = [a for f in FIELDS for a in f.aliases]
    request = {f.name for f in dataclasses.fields(GenerationRequest)}
    assert len(aliases) == len(set(aliases)) and not set(aliases) & request
    assert set(aliases) & set(names) == {"sampler_index"}
    assert {f.name for f in FIELDS if f.request} <= request
    assert all(f.policy in (USED, WARNED, REFUSED) for f in FIELDS)
    assert all(f.why for f in FIELDS if f.policy in (WARNED, REFUSED) and f.neutral != ANY)


# A1111's names that only a1111/fields.py writes (the UI's widgets carry A1111's UI labels of their own)
ONE_MODULE = ("inpainting_fill", "inpaint_full_res", "inpainting_mask_invert", "hr_upscaler", "hr_scale",
              "hr_second_pass_steps", "hr_resize_x", "denoising_strength", "sampler_index", "Hires upscaler",
              "Hires upscale", "Hires steps", "Mask blur", "Masked content", "Masked area padding", "Seed resize from",
              "Variation seed", "Lowvram preset")


@pytest.mark.parametrize("name", ONE_MODULE)
def test_a1111s_field_names_are_written_in_one_module(name):
    quoted = re.compile(r"""["']%s["']""" % re.escape(name))
    found = sorted(str(p.relative_to(PACKAGE)) for p in PACKAGE.rglob("*.py")
                   if p.relative_to(PACKAGE).parts[0] != "ui" and quoted.search(p.read_text()))
    assert found == ["a1111/fields.py"]
