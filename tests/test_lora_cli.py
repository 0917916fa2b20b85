"""LoRA and embeddings end to end: the CLI, the session's per-job flow and the PNG's A1111 text."""

from __future__ import annotations

import json

import numpy as np
import pytest
from PIL import Image

from lowvram_gen import GenerationRequest
from lowvram_gen.cli.main import main
from lowvram_gen.errors import InvalidRequest
from lowvram_gen.models.loading import load
from lowvram_gen.models.resolve import resolve
from lowvram_gen.networks.lora import find_lora, lora_hash
from lowvram_gen.outputs import parse_a1111_parameters, read_png_metadata
from lowvram_gen.session import Session

from lora_files import kohya_state, save


@pytest.fixture()
def models(tmp_path, monkeypatch, tiny_path):
    root = tmp_path / "models"
    monkeypatch.setenv("LOWVRAM_GEN_MODELS", str(root))
    save(kohya_state(load(resolve("tiny"), "float32").pipe), root / "Lora" / "tiny_kohya.safetensors")
    return root


def generate(prompt, outdir, capsys, *extra):
    code = main(["generate", prompt, "--model", "tiny", "--steps", "2", "--width", "64", "--height", "64",
                 "--seed", "5", "--outdir", str(outdir), "--json", *extra])
    assert code == 0
    return json.loads(capsys.readouterr().out)


def pixels(path):
    return np.asarray(Image.open(path).convert("RGB"))


def test_cli_lora_tag_changes_the_image_and_is_recorded(models, tmp_path, capsys):
    with_tag = generate("a cat <lora:tiny_kohya:0.8>", tmp_path / "a", capsys)
    plain = generate("a cat", tmp_path / "b", capsys)
    assert not np.array_equal(pixels(with_tag["images"][0]), pixels(plain["images"][0]))
    text = read_png_metadata(with_tag["images"][0])[0]
    assert "Lora hashes" in text
    fields = parse_a1111_parameters(text)
    assert fields["prompt"] == "a cat <lora:tiny_kohya:0.8>"  # as typed, like A1111
    assert fields["Lora hashes"] == f"tiny_kohya: {lora_hash(find_lora('tiny_kohya'))}"
    assert "Lora hashes" not in read_png_metadata(plain["images"][0])[0]
    flag = generate("a cat", tmp_path / "c", capsys, "--lora", "tiny_kohya:0.8")
    assert np.array_equal(pixels(flag["images"][0]), pixels(with_tag["images"][0]))


def test_session_switches_loras_off_between_jobs(models, tmp_path):
    session = Session()
    base = session.generate(GenerationRequest(prompt="a cat", width=64, height=64, steps=2, seed=5,
                                              outdir=str(tmp_path)))
    pipe = session.model.pipe
    lora = session.generate(GenerationRequest(prompt="a cat <lora:tiny_kohya:1>", width=64, height=64, steps=2,
                                              seed=5, outdir=str(tmp_path)))
    again = session.generate(GenerationRequest(prompt="a cat", width=64, height=64, steps=2, seed=5,
                                               outdir=str(tmp_path)))
    assert session.model.pipe is pipe  # never reloaded
    assert not np.array_equal(pixels(base.images[0]), pixels(lora.images[0]))
    assert np.array_equal(pixels(base.images[0]), pixels(again.images[0]))


def test_unknown_lora_and_bad_weight_are_clear_errors(models, tmp_path, capsys):
    code = main(["generate", "a cat <lora:nosuch:1>", "--model", "tiny", "--steps", "1", "--width", "64",
                 "--height", "64", "--outdir", str(tmp_path)])
    err = capsys.readouterr().err
    assert code == 2 and "nosuch" in err and "tiny_kohya" in err
    with pytest.raises(InvalidRequest, match="abc"):
        GenerationRequest(prompt="a <lora:x:abc>").validated()
    with pytest.raises(InvalidRequest, match="heavy"):
        GenerationRequest(prompt="a", loras=("x:heavy",)).validated()
    assert GenerationRequest(loras="a:0.5, b").validated().loras == ("a:0.5", "b")
