"""LoRA and embeddings end to end: the CLI, the session's per-job flow and the PNG's A1111 text."""

from __future__ import annotations

import json
import re

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


def test_unknown_lora_or_embedding_is_refused_before_the_model_loads(models, tmp_path, capsys, monkeypatch):
    """Issue 18: an unknown LoRA was found only after the model had loaded (a minute for a real one)."""
    from lowvram_gen import session as session_mod
    from lowvram_gen.networks.names import check_names

    def no_load(*a, **k):
        raise AssertionError("the model was loaded for a job that names an unknown LoRA or embedding")

    monkeypatch.setattr(session_mod, "load", no_load)
    lora_folder, emb_folder = str((models / "Lora").resolve()), str((models / "embeddings").resolve())
    for args, said, where in ((["a fox <lora:nosuch:1>"], "invalid LoRA: 'nosuch'", lora_folder),
                              (["a fox", "--lora", "gone:0.5"], "invalid LoRA: 'gone'", lora_folder),
                              (["a fox embedding:noemb"], "invalid embedding: 'noemb'", emb_folder),
                              (["a fox", "--negative", "embedding:noemb"], "invalid embedding: 'noemb'", emb_folder)):
        code = main(["generate", *args, "--steps", "1", "--width", "64", "--height", "64", "--outdir", str(tmp_path)])
        err = capsys.readouterr().err
        assert code == 2, err
        assert err.count("\n") == 1 and err.startswith(f"error: {said}; no ") and where in err, err
    assert "there are: tiny_kohya" in main_err(["a fox <lora:nosuch>"], tmp_path, capsys)  # the names there are
    # the Python API (the UI's and the batch's path): the session refuses before it loads
    with pytest.raises(InvalidRequest, match="nosuch") as err:
        Session().generate(GenerationRequest(prompt="a fox <lora:nosuch:1>", width=64, height=64, steps=1,
                                             outdir=str(tmp_path)))
    assert lora_folder in str(err.value)
    # only what is unambiguously a reference: a bare word is text (as in A1111), and a LoRA tag in the negative
    # prompt is not applied (the job warns), so neither is looked up
    check_names("a nosuch fox", "<lora:notthere:1>")
    assert not list(tmp_path.rglob("*.png"))


def main_err(args, outdir, capsys):
    assert main(["generate", *args, "--steps", "1", "--width", "64", "--height", "64", "--outdir", str(outdir)]) == 2
    return capsys.readouterr().err


def test_many_loras_are_not_all_listed_the_closest_are(tmp_path, monkeypatch):
    from lowvram_gen.networks.files import LISTED_MAX
    from lowvram_gen.networks.names import check_names

    monkeypatch.setenv("LOWVRAM_GEN_MODELS", str(tmp_path))
    folder = tmp_path / "Lora"
    folder.mkdir()
    for i in range(LISTED_MAX + 3):
        (folder / f"style_{i:02d}.safetensors").write_bytes(b"")
    (folder / "add_detail.safetensors").write_bytes(b"")
    with pytest.raises(InvalidRequest) as err:
        check_names("a fox", loras=("add_detail_v2:0.5",))
    text = str(err.value)
    assert f"there are {LISTED_MAX + 4}, the closest: add_detail" in text and "style_00" not in text


def test_lora_for_another_base_model_is_one_complete_sentence(models, tmp_path, capfd, tiny_sdxl_path):
    """Issue 18: diffusers logged one 'size mismatch' line per layer (97 for a real SDXL LoRA) and our message
    was cut after torch's heading, before the shapes."""
    xl = load(resolve("tiny-sdxl"), "float32").pipe
    from lora_files import peft_state

    save(peft_state(xl), models / "Lora" / "for_sdxl.safetensors")
    capfd.readouterr()
    code = main(["generate", "a fox <lora:for_sdxl:1>", "--model", "tiny", "--steps", "1", "--width", "64",
                 "--height", "64", "--outdir", str(tmp_path)])
    err = capfd.readouterr().err  # the file descriptor: diffusers' log handler holds the real stderr
    assert code == 2
    lines = err.strip().splitlines()
    assert len(lines) < 5, err
    assert "size mismatch" not in err and "unsuccessful" not in err
    message = lines[-1]
    assert message.startswith("error: LoRA for_sdxl.safetensors is for another base model than this "
                              "StableDiffusionPipeline")
    assert re.search(r"e\.g\. \S+lora_A\.weight is 4x64 in the file but 4x32 in the model", message), message
    assert message.endswith(f"({models / 'Lora' / 'for_sdxl.safetensors'})")


def test_an_sdxl_embedding_with_an_sd_model_is_a_json_warning_and_the_job_runs(models, tmp_path, capsys):
    from safetensors.torch import save_file
    import torch

    folder = models / "embeddings"
    folder.mkdir(parents=True, exist_ok=True)
    save_file({"clip_l": torch.ones(2, 32), "clip_g": torch.ones(2, 64)}, str(folder / "xlneg.safetensors"))
    out = generate("a cat", tmp_path / "a", capsys, "--negative", "xlneg, blurry")
    assert len(out["images"]) == 1
    assert [w for w in out["warnings"] if "xlneg.safetensors" in w and "an SDXL embedding" in w]
    assert "TI hashes" not in read_png_metadata(out["images"][0])[0]


def test_the_apis_tolerant_mode_leaves_out_unknown_lora_tags_only(tmp_path, monkeypatch):
    """Issue 29 item 16: the REST API leaves an unknown <lora:NAME> out with a warning, as A1111 does (the CLI and
    the UI refuse it: the test above); the tags of LoRAs that are there stay as typed."""
    from lowvram_gen.networks.names import Names
    from lowvram_gen.networks.tags import without_loras

    monkeypatch.setenv("LOWVRAM_GEN_MODELS", str(tmp_path))
    (tmp_path / "Lora").mkdir()
    (tmp_path / "Lora" / "there.safetensors").write_bytes(b"")
    text, warnings = Names().left_out("a fox <lora:There:0.5> <lora:gone:0.8> <lyco:gone2>, sky")
    assert text == "a fox <lora:There:0.5>, sky"
    assert [w.split(" of ")[0] for w in warnings] == ["LoRA 'gone'", "LoRA 'gone2'"]
    assert Names().left_out("a fox <lora:there>") == ("a fox <lora:there>", [])
    assert without_loras("<hypernet:x:1> a <lora:y>", {"y"}) == "<hypernet:x:1> a"
