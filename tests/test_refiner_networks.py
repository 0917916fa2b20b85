"""The job's LoRAs and embeddings on A1111's refiner (engines/sd/refiner.networks): a tiny LoRA built for the tiny
SDXL refiner changes the refined image as plain diffusers' `load_lora_weights` on both pipelines does; its layers
the refiner lacks are skipped with one warning naming it, and a LoRA that fits nothing there is skipped so. Prompt
editing, alternation and AND with a refiner are refused in one sentence before loading (engines/sd/refiner.py)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from lora_files import _linears, _pair, save  # tests/lora_files.py
from test_refiner import NEGATIVE, PROMPT, pixels, reference  # tests/test_refiner.py
from tiny_refiner import build_tiny_refiner, save_tiny_refiner  # tests/tiny_refiner.py
from lowvram_gen import GenerationRequest
from lowvram_gen.models.loading import load
from lowvram_gen.models.resolve import resolve
from lowvram_gen.session import Session

SWITCH = 0.3


@pytest.fixture(scope="module")
def refiner_path(tmp_path_factory):
    return save_tiny_refiner(tmp_path_factory.mktemp("tiny-refiner"))


@pytest.fixture()
def lora_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("LOWVRAM_GEN_MODELS", str(tmp_path / "models"))
    return tmp_path / "models" / "Lora"


def refiner_lora(seed: int = 4, first_encoder: bool = True) -> dict:
    """kohya keys on the tiny refiner's UNet attention (the cross-attention's key/value left out: their width is the
    refiner's encoder's, not the base's, and the job puts the LoRA on the base too) and its text encoder (`lora_te2_`);
    with `first_encoder`, the base's first encoder too (`lora_te1_`: the refiner has none)."""
    g = torch.Generator().manual_seed(seed)
    own = build_tiny_refiner()
    state = {}
    for name, m in _linears(own.unet, True):
        if "attn2.to_k" in name or "attn2.to_v" in name:
            continue
        key = "lora_unet_" + name.replace(".", "_")
        state[f"{key}.lora_down.weight"], state[f"{key}.lora_up.weight"] = _pair(m, g, 1.0)
        state[f"{key}.alpha"] = torch.tensor(4.0)
    encoders = [("lora_te2_", own.text_encoder_2)]
    if first_encoder:
        encoders.append(("lora_te1_", load(resolve("tiny-sdxl"), "float32").pipe.text_encoder))
    for prefix, encoder in encoders:
        for name, m in _linears(encoder, False):
            key = prefix + "text_model_" + name.removeprefix("text_model.").replace(".", "_")
            state[f"{key}.lora_down.weight"], state[f"{key}.lora_up.weight"] = _pair(m, g, 0.5)
            state[f"{key}.alpha"] = torch.tensor(4.0)
    return state


def run(session, tmp_path, prompt: str, refiner_path, sampler="Euler"):
    return session.generate(GenerationRequest(prompt=prompt, negative_prompt=NEGATIVE, width=64, height=64, steps=6,
                                              cfg_scale=6.0, seed=3, model="tiny-sdxl", sampler=sampler,
                                              outdir=str(tmp_path), refiner=refiner_path, refiner_switch_at=SWITCH))


def test_the_jobs_lora_is_on_the_refiner_as_diffusers_puts_it_there(refiner_path, lora_dir, tiny_sdxl_path,
                                                                    tmp_path):
    path = save(refiner_lora(), lora_dir / "reflora.safetensors")
    session = Session(device="cpu")
    result = run(session, tmp_path, f"{PROMPT} <lora:reflora:1>", refiner_path)
    made = pixels(result.images[0])
    expected, took = reference(tiny_sdxl_path, refiner_path, "Euler", SWITCH, path)
    assert took is not None
    assert np.abs(made - expected).max() <= 2
    base_only, _ = reference(tiny_sdxl_path, refiner_path, "Euler", SWITCH, path, on_refiner=False)
    assert np.abs(made - base_only).max() > 10  # the LoRA on the refiner changed the refined image
    said = [w for w in result.warnings if "reflora" in w and "refiner" in w]
    assert len(said) == 1 and "match nothing" in said[0]  # its first encoder's layers: one warning naming it
    plain = pixels(run(session, tmp_path, PROMPT, refiner_path).images[0])  # the next job without it: switched off
    unrefined, _ = reference(tiny_sdxl_path, refiner_path, "Euler", SWITCH)
    assert np.abs(plain - unrefined).max() <= 2


def test_a_lora_that_fits_nothing_in_the_refiner_is_skipped_with_one_warning(refiner_path, lora_dir, tmp_path):
    xl = load(resolve("tiny-sdxl"), "float32").pipe
    g = torch.Generator().manual_seed(9)
    state = {}
    for name, m in _linears(xl.text_encoder, False):  # the base's first encoder only: nothing of it in the refiner
        key = "lora_te1_text_model_" + name.removeprefix("text_model.").replace(".", "_")
        state[f"{key}.lora_down.weight"], state[f"{key}.lora_up.weight"] = _pair(m, g, 0.5)
        state[f"{key}.alpha"] = torch.tensor(4.0)
    save(state, lora_dir / "te1only.safetensors")
    result = run(Session(device="cpu"), tmp_path, f"{PROMPT} <lora:te1only:1>", refiner_path)
    said = [w for w in result.warnings if "te1only" in w]
    assert len(said) == 1 and "not applied" in said[0] and "refiner" in said[0]


@pytest.mark.parametrize("prompt", ["a [cat:dog:0.5]", "a [cat|dog]", "a cat AND a dog :0.5"])
def test_prompt_editing_with_a_refiner_is_refused_in_one_sentence_before_loading(prompt, refiner_path, tmp_path,
                                                                                 monkeypatch):
    """The per-step hooks sit on the base's UNet and the refiner's part reads one conditioning: refused before any
    model loads (the loader is made to fail, so reaching it fails the test)."""
    from lowvram_gen.errors import InvalidRequest
    from lowvram_gen.engines.sd import refiner as refiner_mod

    session = Session(device="cpu")
    monkeypatch.setattr(session, "load_model", lambda *a, **k: pytest.fail("the model loaded"))
    monkeypatch.setattr(refiner_mod, "load", lambda *a, **k: pytest.fail("the refiner loaded"))
    with pytest.raises(InvalidRequest) as refused:
        run(session, tmp_path, prompt, refiner_path)
    said = str(refused.value)
    assert "refiner" in said and "prompt editing" in said and ". " not in said.rstrip(".") and "\n" not in said
    session.plan(GenerationRequest(prompt=prompt, model="tiny-sdxl", width=64, height=64, refiner=refiner_path,
                                   refiner_switch_at=1))  # a switch at 1 runs no refiner: nothing to refuse


def test_quantize_applies_to_the_refiners_unet_as_to_the_bases(refiner_path, tmp_path):
    """--quantize int8: the refiner loads through the base's quantizing path (models/loading.load), its UNet and text
    encoder stored in int8; a job without it reads the refiner again at full precision."""
    from lowvram_gen.models.quantize import kinds

    session = Session(device="cpu")
    session.generate(GenerationRequest(prompt=PROMPT, width=64, height=64, steps=3, seed=3, model="tiny-sdxl",
                                       outdir=str(tmp_path), refiner=refiner_path, refiner_switch_at=SWITCH,
                                       quantize="int8"))
    held = session.refiner
    assert held.quantize == "int8" and kinds(held.pipe).get("unet") == "int8"
    assert kinds(session.model.pipe).get("unet") == "int8"  # as the base's
    session.generate(GenerationRequest(prompt=PROMPT, width=64, height=64, steps=3, seed=3, model="tiny-sdxl",
                                       outdir=str(tmp_path), refiner=refiner_path, refiner_switch_at=SWITCH,
                                       quantize="none"))
    assert session.refiner is not held and "unet" not in kinds(session.refiner.pipe)
