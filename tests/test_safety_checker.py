"""docs/FAULTS.md 20: an image blacked out by the model's own safety checker is labelled as such.

No real safety-checker weights exist offline, so the embedded tiny SD model is saved again, as an
ordinary diffusers folder, with a tiny `StableDiffusionSafetyChecker` (seeded random CLIP weights)
and a `CLIPImageProcessor` listed in its model_index.json: loading goes through the normal code.
The checker flags an image when a cosine score exceeds its threshold; thresholds of -10 flag every
image, +10 never flag, which makes the outcome deterministic whatever the random weights compute.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from PIL import Image

from lowvram_gen import GenerationRequest
from lowvram_gen.cli.main import main
from lowvram_gen.outputs import parse_a1111_parameters, read_png_metadata
from lowvram_gen.session import Session

BLACKED_OUT = "the model's safety checker blacked out"


def _with_checker(tiny_path, target, threshold: float):
    import torch
    from diffusers import StableDiffusionPipeline
    from diffusers.pipelines.stable_diffusion.safety_checker import StableDiffusionSafetyChecker
    from transformers import CLIPConfig, CLIPImageProcessor

    tiny = StableDiffusionPipeline.from_pretrained(str(tiny_path))
    small = dict(hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2)
    config = CLIPConfig(
        text_config=dict(small, vocab_size=100, max_position_embeddings=16, bos_token_id=0, eos_token_id=1,
                         pad_token_id=1),
        vision_config=dict(small, image_size=32, patch_size=8),
        projection_dim=16,
    )
    torch.manual_seed(0)
    checker = StableDiffusionSafetyChecker(config).eval()
    with torch.no_grad():  # the score is cos(image, concept) - threshold; flagged when above 0
        checker.concept_embeds_weights.fill_(threshold)
        checker.special_care_embeds_weights.fill_(threshold)
    extractor = CLIPImageProcessor(size={"shortest_edge": 32}, crop_size={"height": 32, "width": 32})
    components = {**tiny.components, "safety_checker": checker, "feature_extractor": extractor}
    StableDiffusionPipeline(**components, requires_safety_checker=True).save_pretrained(target,
                                                                                        safe_serialization=True)
    index = json.loads((target / "model_index.json").read_text())
    assert index["safety_checker"] == ["stable_diffusion", "StableDiffusionSafetyChecker"]
    assert index["feature_extractor"] == ["transformers", "CLIPImageProcessor"]
    return str(target)


@pytest.fixture(scope="module")
def flags_everything(tiny_path, tmp_path_factory):
    return _with_checker(tiny_path, tmp_path_factory.mktemp("checker") / "flags-everything", -10.0)


@pytest.fixture(scope="module")
def flags_nothing(tiny_path, tmp_path_factory):
    return _with_checker(tiny_path, tmp_path_factory.mktemp("checker") / "flags-nothing", 10.0)


def pixels(path) -> np.ndarray:
    return np.asarray(Image.open(path).convert("RGB"))


def test_flagged_images_are_black_and_labelled_everywhere(flags_everything, tmp_path, capsys):
    code = main(["generate", "a lighthouse", "--model", flags_everything, "--width", "64", "--height", "64",
                 "--steps", "2", "--seed", "3", "--batch", "2", "--outdir", str(tmp_path), "--json"])
    captured = capsys.readouterr()
    assert code == 0
    result = json.loads(captured.out)  # the CLI's --json
    assert result["nsfw"] == [True, True]
    assert any(BLACKED_OUT + " 2 image(s)" in w for w in result["warnings"])
    assert f"warning: {BLACKED_OUT} 2 image(s)" in captured.err  # what the CLI shows a person
    # a safety-checker black is not mistaken for a broken half-precision decode (no float32 retry, no error)
    assert [a["outcome"] for a in result["attempts"]] == ["ok", "ok"]
    assert len(result["images"]) == 2
    for path in result["images"]:
        assert pixels(path).max() == 0  # black
        text, meta = read_png_metadata(path)
        assert meta["nsfw_filtered"] is True
        assert parse_a1111_parameters(text)["Safety checker"] == "blacked out"  # seen in any PNG-info viewer


def test_unflagged_images_are_untouched_and_not_labelled(flags_nothing, tmp_path):
    request = dict(prompt="a lighthouse", width=64, height=64, steps=2, seed=3, outdir=str(tmp_path))
    result = Session().generate(GenerationRequest(model=flags_nothing, **request))
    assert result.nsfw == [False]
    assert not any(BLACKED_OUT in w for w in result.warnings) and "safety" not in result.summary.lower()
    text, meta = read_png_metadata(result.images[0])
    assert meta["nsfw_filtered"] is False
    assert "Safety checker" not in parse_a1111_parameters(text)
    image = pixels(result.images[0])
    assert image.max() > 0
    # the checker passed the image through as it was: same pixels as the same model without a checker
    plain = Session().generate(GenerationRequest(model="tiny", **request))
    assert np.array_equal(image, pixels(plain.images[0]))


def test_only_the_flagged_image_of_a_batch_is_black_and_labelled(flags_nothing, tmp_path):
    import torch

    session = Session()
    session.load_model(flags_nothing, None, "float32")  # the normal loading code, then steer the checker
    checker = session.model.pipe.safety_checker
    with torch.no_grad():
        for p in (checker.concept_embeds, checker.special_care_embeds):
            p.fill_(1.0)
        for p in (checker.concept_embeds_weights, checker.special_care_embeds_weights):
            p.fill_(0.5)

    def steer(_module, _args, out):  # image 0 points at the concepts (cos 1: flagged), image 1 away (cos -1)
        out = out.clone()
        out[0], out[1] = 1.0, -1.0
        return out

    checker.visual_projection.register_forward_hook(steer)
    result = session.generate(GenerationRequest(prompt="a boat", width=64, height=64, steps=2, seed=10, batch_size=2,
                                                model=flags_nothing, outdir=str(tmp_path)))
    assert result.nsfw == [True, False]
    assert any(BLACKED_OUT + " 1 image(s)" in w for w in result.warnings)
    flagged, kept = result.images
    assert pixels(flagged).max() == 0 and pixels(kept).max() > 0
    assert [read_png_metadata(p)[1]["nsfw_filtered"] for p in result.images] == [True, False]
    assert "Safety checker" in read_png_metadata(flagged)[0] and "Safety checker" not in read_png_metadata(kept)[0]


def test_hires_fix_checks_only_the_final_image(flags_everything, tmp_path, monkeypatch):
    """As in A1111: a first pass blacked out by the checker would become the init of the second pass and
    come back as an unlabelled dark image, so only the final decode is checked."""
    from diffusers import StableDiffusionPipeline

    checked = []
    real = StableDiffusionPipeline.run_safety_checker

    def counting(self, image, *args):
        checked.append(tuple(image.shape[-2:]))
        return real(self, image, *args)

    monkeypatch.setattr(StableDiffusionPipeline, "run_safety_checker", counting)
    result = Session().generate(GenerationRequest(prompt="a lighthouse", width=64, height=64, steps=2, seed=3,
                                                  hires_scale=2, hires_upscaler="lanczos", hires_steps=1,
                                                  model=flags_everything, outdir=str(tmp_path)))
    assert checked == [(128, 128)]  # the 64 px first pass was not checked; the 128 px result was
    assert result.nsfw == [True] and pixels(result.images[0]).max() == 0
    assert read_png_metadata(result.images[0])[1]["nsfw_filtered"] is True


def test_a_pipeline_that_decodes_itself_reports_its_checker_flags(flags_everything, tmp_path, monkeypatch):
    """Pipelines other than SD/SDXL (LCM, PAG, ...) decode and safety-check inside their own call; their
    `nsfw_content_detected` must reach the result like ours. Simulated by treating SD as one of them."""
    from lowvram_gen.engines.sd import pipeline as sd

    monkeypatch.setattr(sd, "splits_decode", lambda pipe: False)
    result = Session().generate(GenerationRequest(prompt="a lighthouse", width=64, height=64, steps=2, seed=3,
                                                  batch_size=2, model=flags_everything, outdir=str(tmp_path)))
    assert result.nsfw == [True, True]
    assert any(BLACKED_OUT + " 2 image(s)" in w for w in result.warnings)
    assert all(pixels(p).max() == 0 and read_png_metadata(p)[1]["nsfw_filtered"] for p in result.images)
