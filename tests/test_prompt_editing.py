"""Prompt editing `[a:b:when]`, alternation `[a|b]` and `AND` (prompting/schedule.py, engines/sd/prompt_steps.py).

The schedules are checked against A1111's own `get_learned_conditioning_prompt_schedules` output held here as data:
its doctests (modules/prompt_parser.py) and the example in its source comment, and cases worked out from its grammar
and step rule (marked `rule`). The images are checked against references that switch or mix the embeddings
themselves: diffusers' callback_on_step_end replacing prompt_embeds, and a UNet wrapper running each prompt apart.
"""

from __future__ import annotations

import numpy as np
import pytest
from PIL import Image

from lowvram_gen.prompting.schedule import schedule, split_and, text_for_step, total_steps, variants

A1111_DOCTESTS = [  # (prompt, steps, hires_steps, schedule): A1111's doctests
    ("test", 10, None, [[10, "test"]]),
    ("a [b:3]", 10, None, [[3, "a "], [10, "a b"]]),
    ("a [b: 3]", 10, None, [[3, "a "], [10, "a b"]]),
    ("a [[[b]]:2]", 10, None, [[2, "a "], [10, "a [[b]]"]]),
    ("[(a:2):3]", 10, None, [[3, ""], [10, "(a:2)"]]),
    ("a [b : c : 1] d", 10, None, [[1, "a b  d"], [10, "a  c  d"]]),
    ("a[b:[c:d:2]:1]e", 10, None, [[1, "abe"], [2, "ace"], [10, "ade"]]),
    ("a [unbalanced", 10, None, [[10, "a [unbalanced"]]),
    ("a [b:.5] c", 10, None, [[5, "a  c"], [10, "a b c"]]),
    ("((a][:b:c [d:3]", 10, None, [[3, "((a][:b:c "], [10, "((a][:b:c d"]]),
    ("[a|(b:1.1)]", 10, None, [[1, "a"], [2, "(b:1.1)"], [3, "a"], [4, "(b:1.1)"], [5, "a"], [6, "(b:1.1)"],
                               [7, "a"], [8, "(b:1.1)"], [9, "a"], [10, "(b:1.1)"]]),
    ("[fe|]male", 10, None, [[1, "female"], [2, "male"], [3, "female"], [4, "male"], [5, "female"], [6, "male"],
                             [7, "female"], [8, "male"], [9, "female"], [10, "male"]]),
    ("[fe|||]male", 10, None, [[1, "female"], [2, "male"], [3, "male"], [4, "male"], [5, "female"], [6, "male"],
                               [7, "male"], [8, "male"], [9, "female"], [10, "male"]]),
    ("a [b:.5] c", 10, 10, [[10, "a b c"]]),  # hires fix's second pass: a fraction counts from 1.0
    ("a [b:1.5] c", 10, 10, [[5, "a  c"], [10, "a b c"]]),
    # the example in A1111's source comment
    ("fantasy landscape with a [mountain:lake:0.25] and [an oak:a christmas tree:0.75][ in foreground::0.6]"
     "[ in background:0.25] [shoddy:masterful:0.5]", 100, None,
     [[25, "fantasy landscape with a mountain and an oak in foreground shoddy"],
      [50, "fantasy landscape with a lake and an oak in foreground in background shoddy"],
      [60, "fantasy landscape with a lake and an oak in foreground in background masterful"],
      [75, "fantasy landscape with a lake and an oak in background masterful"],
      [100, "fantasy landscape with a lake and a christmas tree in background masterful"]]),
]

RULE_CASES = [  # worked out from A1111's grammar and step rule
    ("[cat:dog:0.5]", 10, None, [[5, "cat"], [10, "dog"]]),
    ("[cat:dog:5]", 10, None, [[5, "cat"], [10, "dog"]]),
    ("[cat::3]", 10, None, [[3, "cat"], [10, ""]]),
    ("[a:b:0]", 10, None, [[10, "b"]]),  # below step 1: `to` from the start
    ("[a:b:-1]", 10, None, [[10, "b"]]),
    ("[a:b:20]", 10, None, [[10, "a"]]),  # clamped to the steps: never switches
    ("[a:b:1.0]", 10, None, [[10, "a"]]),  # a '.': a fraction, all of the steps
    ("[a:b:1e1]", 20, None, [[10, "a"], [20, "b"]]),  # no '.': a step number
    ("[a:b: 3 ]", 10, None, [[3, "a"], [10, "b"]]),
    ("[a:b:15]", 10, 10, [[5, "a"], [10, "b"]]),  # hires: a step number counts on from the first pass
    ("a|b", 10, None, [[10, "a|b"]]),  # '|' outside brackets: read as typed
    ("[a:b:2", 10, None, [[10, "[a:b:2"]]),
    (r"\[a:b:2\]", 10, None, [[10, r"\[a:b:2\]"]]),
    ("[a|b|c]", 4, None, [[1, "a"], [2, "b"], [3, "c"], [4, "a"]]),
    ("[[a|b]:c:2]", 4, None, [[1, "a"], [2, "b"], [3, "c"], [4, "c"]]),
    ("(a:1.2) [b:c:2]", 4, None, [[2, "(a:1.2) b"], [4, "(a:1.2) c"]]),
]


@pytest.mark.parametrize("prompt,steps,hires,expected", A1111_DOCTESTS + RULE_CASES)
def test_schedules_equal_a1111s(prompt, steps, hires, expected):
    assert schedule(prompt, steps, hires) == expected


def test_old_scheduling_option_reads_a_number_below_1_as_a_fraction_without_hires_offset():
    assert schedule("[a:b:0.5]", 10, 10, use_old_scheduling=True) == [[5, "a"], [10, "b"]]
    assert schedule("[a:b:1.5]", 10, None, use_old_scheduling=True) == [[1, "a"], [10, "b"]]


@pytest.mark.parametrize("prompt,parts", [
    ("a AND b", [("a", 1.0), (" b", 1.0)]),
    ("a cat:1.2 AND dog :0.5", [("a cat", 1.2), (" dog", 0.5)]),
    ("ANDROID", [("ANDROID", 1.0)]),
    ("x AND", [("x", 1.0), ("", 1.0)]),
    ("(cat:1.2)", [("(cat:1.2)", 1.0)]),
])
def test_and_splits_as_a1111s_multicond_list(prompt, parts):
    assert split_and(prompt) == parts


def test_a1111_counts_calls_from_0_against_the_schedule():
    entries = schedule("[cat:dog:2]", 4)
    assert [text_for_step(entries, call) for call in range(4)] == ["cat", "cat", "cat", "dog"]
    assert [text_for_step(schedule("[a|b]", 4), call) for call in range(4)] == ["a", "a", "b", "a"]
    assert total_steps(10, "Heun") == 20 and total_steps(10, "Euler") == 10


def test_variants_are_every_text_the_encoders_read():
    assert variants("a [cat:dog:0.5] AND [x|y]", 4) == ["a cat", "a dog", " x", " y"]
    assert variants("[bad|ugly] AND x", 4, negative=True) == ["bad AND x", "ugly AND x"]
    assert variants("plain", 4) == ["plain"]


@pytest.mark.parametrize("prompt,negative,plain", [
    ("a (cat:1.2) [dog] BREAK x", False, True),
    ("a [cat:dog:25]", False, False),  # past a 20-step first pass, but hires fix's second pass may switch
    ("a [cat|dog]", False, False),
    ("a AND b", False, False),
    ("photo, 4:3", False, False),  # A1111: the part "photo, 4" at weight 3
    ("photo, 4:3", True, True),  # a negative prompt is never split or weighted
    ("a|b", False, True),  # read as typed
])
def test_is_plain(prompt, negative, plain):
    from lowvram_gen.prompting.schedule import is_plain

    assert is_plain(prompt, negative) is plain


def test_editing_is_no_longer_warned_about():
    from lowvram_gen.prompting.parse import find_unsupported

    assert find_unsupported("a [cat:dog:5] AND [x|y]") == []


# ---- images on the tiny models ----

@pytest.fixture(scope="module")
def pipes(tiny_path, tiny_sdxl_path):
    import diffusers

    out = {}
    for name, path in (("sd", tiny_path), ("sdxl", tiny_sdxl_path)):
        pipe = diffusers.AutoPipelineForText2Image.from_pretrained(path)
        pipe.scheduler = diffusers.EulerDiscreteScheduler.from_config(pipe.scheduler.config)
        pipe.set_progress_bar_config(disable=True)
        out[name] = pipe
    return out


def _switching(pipe, prompt, negative="", steps=4):
    from lowvram_gen import GenerationRequest
    from lowvram_gen.engines.sd import prompt_steps
    from lowvram_gen.engines.sd.pipeline import Pass, Texts

    request = GenerationRequest(prompt=prompt, negative_prompt=negative, steps=steps, width=64, height=64)
    step = Pass(request, [5], 64, 64)
    return prompt_steps.for_pass(pipe, step, Texts(prompt, negative), cfg=True)


def _run(pipe, steps=4, **kwargs):
    import torch

    return pipe(num_inference_steps=steps, guidance_scale=7.0, width=32, height=32, output_type="latent",
                generator=torch.Generator().manual_seed(5), **kwargs).images


@pytest.mark.parametrize("name,prompt,texts", [
    ("sd", "a [cat:dog:2]", ["a cat", "a cat", "a cat", "a dog"]),  # calls 0, 1, 2 read "a cat" (A1111's count)
    ("sdxl", "a [cat:dog:2]", ["a cat", "a cat", "a cat", "a dog"]),
    ("sd", "a [cat|dog]", ["a cat", "a cat", "a dog", "a cat"]),
])
def test_editing_equals_a_reference_that_swaps_the_embeddings_at_each_step(pipes, name, prompt, texts):
    import torch

    from lowvram_gen.engines.sd import prompt_steps
    from lowvram_gen.prompting.encode import encode_prompts

    pipe = pipes[name]
    switching = _switching(pipe, prompt)
    with prompt_steps.switched(pipe, switching):
        ours = _run(pipe, **switching.call_kwargs(True))
    encoded = {text: encode_prompts(pipe, text, "", 1, "cpu") for text in set(texts)}

    def swap(_pipe, i, _t, tensors):  # diffusers' own hook: the next step reads what it returns
        if i + 1 < len(texts):
            now = encoded[texts[i + 1]]
            tensors["prompt_embeds"] = torch.cat([now.negative_prompt_embeds, now.prompt_embeds])
            if "add_text_embeds" in tensors:
                tensors["add_text_embeds"] = torch.cat([now.negative_pooled_prompt_embeds, now.pooled_prompt_embeds])
        return tensors

    inputs = ["latents", "prompt_embeds"] + (["add_text_embeds"] if name == "sdxl" else [])
    first = encoded[texts[0]].as_kwargs()
    reference = _run(pipe, **first, callback_on_step_end=swap, callback_on_step_end_tensor_inputs=inputs)
    assert torch.equal(ours, reference)
    assert not torch.equal(ours, _run(pipe, **first))


def test_the_negative_prompt_is_scheduled_too(pipes):
    switching = _switching(pipes["sd"], "a cat", "[bad:ugly:2]")
    assert switching.uncond(2)[0] is switching.table["bad"][0] and switching.uncond(3)[0] is switching.table["ugly"][0]
    assert list(switching.table) == ["a cat", "bad", "ugly"]


@pytest.mark.parametrize("name", ["sd", "sdxl"])
def test_and_with_weights_equals_composable_diffusion_run_prompt_by_prompt(pipes, name, monkeypatch):
    import torch

    from lowvram_gen.engines.sd import prompt_steps
    from lowvram_gen.prompting.encode import encode_prompts

    pipe = pipes[name]
    switching = _switching(pipe, "a cat AND a dog :0.7")
    with prompt_steps.switched(pipe, switching):
        ours = _run(pipe, **switching.call_kwargs(True))
    cat, dog = (encode_prompts(pipe, text, "", 1, "cpu") for text in ("a cat", " a dog"))
    forward = pipe.unet.forward

    def composed(sample, t, encoder_hidden_states, **kw):  # each prompt apart, then A1111's sum
        added = kw.pop("added_cond_kwargs", None)

        def run(embeds, pooled):
            extra = {"added_cond_kwargs": {"time_ids": added["time_ids"][:1], "text_embeds": pooled}} if added else {}
            return forward(sample[:1], t, encoder_hidden_states=embeds, **kw, **extra)[0]

        uncond = run(cat.negative_prompt_embeds, cat.negative_pooled_prompt_embeds)
        first = run(cat.prompt_embeds, cat.pooled_prompt_embeds)
        second = run(dog.prompt_embeds, dog.pooled_prompt_embeds)
        return (torch.cat([uncond, uncond + 1.0 * (first - uncond) + 0.7 * (second - uncond)]),)

    monkeypatch.setattr(pipe.unet, "forward", composed)
    reference = _run(pipe, **cat.as_kwargs())
    monkeypatch.undo()
    torch.testing.assert_close(ours, reference, rtol=1e-4, atol=1e-4)
    assert not torch.allclose(ours, _run(pipe, **cat.as_kwargs()), atol=1e-3)


def test_a_pipeline_with_other_text_encoders_is_refused_in_one_sentence():
    from lowvram_gen import GenerationRequest
    from lowvram_gen.engines.sd import prompt_steps
    from lowvram_gen.engines.sd.pipeline import Pass, Texts
    from lowvram_gen.errors import InvalidRequest

    class FluxPipeline:  # a stand-in: the class name and no SD/SDXL base class are what matter
        pass

    request = GenerationRequest(prompt="a [cat:dog:2]", steps=4, width=64, height=64)
    with pytest.raises(InvalidRequest) as caught:
        prompt_steps.for_pass(FluxPipeline(), Pass(request, [1], 64, 64), Texts("a [cat:dog:2]", ""), cfg=True)
    message = str(caught.value)
    assert "FluxPipeline" in message and "prompt editing" in message and message.count(". ") == 0


def _pixels(result):
    return np.asarray(Image.open(result.images[0]), dtype=int)


def test_a_cat_dog_image_differs_from_both_and_its_png_keeps_the_prompt(tmp_path):
    from lowvram_gen import GenerationRequest
    from lowvram_gen.outputs import parse_a1111_parameters, read_png_metadata
    from lowvram_gen.session import Session

    request = dict(width=64, height=64, steps=6, seed=3, sampler="Euler", outdir=str(tmp_path))
    images = {p: Session().generate(GenerationRequest(prompt=p, **request))
              for p in ("a cat", "a dog", "a [cat:dog:0.5]")}
    edited = _pixels(images["a [cat:dog:0.5]"])
    assert not np.array_equal(edited, _pixels(images["a cat"]))
    assert not np.array_equal(edited, _pixels(images["a dog"]))
    assert not any("prompt editing" in w for w in images["a [cat:dog:0.5]"].warnings)
    params, _ = read_png_metadata(images["a [cat:dog:0.5]"].images[0])
    assert parse_a1111_parameters(params)["prompt"] == "a [cat:dog:0.5]"


def test_hires_fix_second_pass_switches_on_its_own_timeline(tmp_path):
    from lowvram_gen import GenerationRequest
    from lowvram_gen.session import Session

    # 4 first-pass steps: `[cat:dog:6]` reads "a cat" all through the first pass and switches at the second's step 2
    request = dict(width=64, height=64, steps=4, seed=3, sampler="Euler", hires_scale=1.5, hires_steps=4,
                   hires_denoise=0.7, outdir=str(tmp_path))
    edited = Session().generate(GenerationRequest(prompt="a [cat:dog:6]", **request))
    cat = Session().generate(GenerationRequest(prompt="a cat", **request))
    assert not np.array_equal(_pixels(edited), _pixels(cat))


def test_a_transformer_family_is_refused_before_any_loading():
    """`plan` reads the family from its built-in config: Flux's T5 and CLIP are not encoded per step here."""
    from lowvram_gen import GenerationRequest
    from lowvram_gen.errors import InvalidRequest
    from lowvram_gen.session import Session

    session = Session()
    device = session.device(vram="8GiB", ram="32GiB")
    profile = session.model_profile("flux", None, ())
    request = GenerationRequest(model="flux", prompt="a [cat|dog] AND a fox", width=512, height=512, steps=4)
    with pytest.raises(InvalidRequest) as caught:
        session.plan(request, device, profile=profile)
    assert "Flux" in str(caught.value) and "prompt editing" in str(caught.value)
    session.plan(GenerationRequest(model="flux", prompt="a cat", width=512, height=512, steps=4), device,
                 profile=profile)  # a plain prompt plans as before


def test_img2img_and_second_order_samplers_take_a1111s_step_counts(pipes):
    """img2img: the schedule is made for the request's steps though fewer run; Heun: for twice the steps (A1111's
    second-order samplers count two denoiser calls a step)."""
    import diffusers

    from lowvram_gen import GenerationRequest
    from lowvram_gen.engines.sd import prompt_steps
    from lowvram_gen.engines.sd.pipeline import Pass, Texts

    pipe = pipes["sd"]
    request = GenerationRequest(prompt="[cat:dog:0.5]", steps=10, width=64, height=64)
    img2img = Pass(request, [1], 64, 64, init=[Image.new("RGB", (64, 64))], strength=0.5)
    switching = prompt_steps.for_pass(pipe, img2img, Texts("[cat:dog:0.5]", ""), cfg=True)
    assert switching.parts[0][0] == [[5, "cat"], [10, "dog"]]
    euler = pipe.scheduler
    pipe.scheduler = diffusers.HeunDiscreteScheduler.from_config(euler.config)
    try:
        switching = prompt_steps.for_pass(pipe, Pass(request, [1], 64, 64), Texts("[cat:dog:0.5]", ""), cfg=True)
    finally:
        pipe.scheduler = euler
    assert switching.parts[0][0] == [[10, "cat"], [20, "dog"]]


def test_controlnet_and_and_switch_together(tmp_path, tiny_path):
    """A ControlNet job reads the step's conditioning too (its unit runs on the first AND part's)."""
    import sys
    from pathlib import Path

    from diffusers import UNet2DConditionModel

    from lowvram_gen import GenerationRequest
    from lowvram_gen.control.units import ControlNetUnit
    from lowvram_gen.session import Session

    sys.path.insert(0, str(Path(__file__).parent))
    import controlnet_files as files  # tests/controlnet_files.py

    net = files.save_folder(files.build(UNet2DConditionModel.from_pretrained(tiny_path, subfolder="unet"), seed=1),
                            tmp_path / "tiny-cn")
    Image.fromarray(np.full((64, 64, 3), 200, dtype=np.uint8)).save(tmp_path / "control.png")
    unit = ControlNetUnit(str(net), str(tmp_path / "control.png"))
    request = dict(width=64, height=64, steps=4, seed=3, sampler="Euler", outdir=str(tmp_path), controlnets=(unit,))
    mixed = Session().generate(GenerationRequest(prompt="a [cat|dog] AND a boat :0.5", **request))
    plain = Session().generate(GenerationRequest(prompt="a cat", **request))
    assert not np.array_equal(_pixels(mixed), _pixels(plain))
