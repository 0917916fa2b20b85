"""Resolving --model and what happens when loading fails (docs/FAULTS.md 3, 7)."""

from __future__ import annotations

import json

import pytest

from lowvram_gen import GenerationRequest
from lowvram_gen.errors import ModelLoadError
from lowvram_gen.models.resolve import resolve
from lowvram_gen.session import Session


def test_embedded_and_folder(tiny_path):
    assert resolve("tiny").kind == "tiny"
    folder = resolve(str(tiny_path))
    assert folder.kind == "folder" and folder.path == tiny_path


def test_hub_id_offline_and_not_cached_names_it_and_how_to_get_it():
    with pytest.raises(ModelLoadError) as err:
        resolve("someone/not-cached-model")
    message = str(err.value)
    assert "'someone/not-cached-model'" in message and "hf download someone/not-cached-model" in message


@pytest.mark.parametrize("spec,words", [
    ("./missing.safetensors", "not found"),
    ("/no/such/folder", "not found"),
    ("not a model!", "not an embedded model"),
])
def test_unknown_specs(spec, words):
    with pytest.raises(ModelLoadError, match=words):
        resolve(spec)


def test_folder_without_model_index(tmp_path):
    with pytest.raises(ModelLoadError, match="model_index.json"):
        resolve(str(tmp_path))


def test_a_broken_model_leaves_the_loaded_one_usable(tmp_path, tiny_path):
    session = Session()
    first = session.generate(GenerationRequest(prompt="x", width=64, height=64, steps=1, outdir=str(tmp_path)))
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "model_index.json").write_text(json.dumps({"_class_name": "StableDiffusionPipeline",
                                                         "unet": ["diffusers", "UNet2DConditionModel"]}))
    with pytest.raises(ModelLoadError):
        session.generate(GenerationRequest(prompt="x", width=64, height=64, steps=1, model=str(broken),
                                           outdir=str(tmp_path)))
    assert session.model is not None and session.model.source.kind == "tiny"
    again = session.generate(GenerationRequest(prompt="x", width=64, height=64, steps=1, outdir=str(tmp_path)))
    assert len(again.images) == 1 and first.model_path == again.model_path
