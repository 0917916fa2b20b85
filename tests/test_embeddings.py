"""Textual-inversion embeddings by name and as `embedding:name`, A1111's file layouts, safe loading."""

from __future__ import annotations

import hashlib
import os

import numpy as np
import pytest
import torch

from lowvram_gen.engines.sd import apply as apply_mod
from lowvram_gen.hardware.device import probe
from lowvram_gen.errors import InvalidRequest, UnsafeCheckpoint
from lowvram_gen.models.loading import load, reload_components
from lowvram_gen.models.resolve import resolve
from lowvram_gen.networks import embeddings as emb
from lowvram_gen.networks.metadata import network_fields
from lowvram_gen.presets import load_presets

CPU = probe("cpu")


@pytest.fixture()
def emb_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("LOWVRAM_GEN_MODELS", str(tmp_path / "models"))
    folder = tmp_path / "models" / "embeddings"
    folder.mkdir(parents=True)
    return folder


@pytest.fixture()
def pipe(tiny_path):
    return load(resolve("tiny"), "float32").pipe


def vectors(n: int, dim: int = 32, seed: int = 0) -> torch.Tensor:
    return torch.randn(n, dim, generator=torch.Generator().manual_seed(seed)) * 2


def save_st(path, tensors: dict):
    from safetensors.torch import save_file

    save_file(tensors, str(path))
    return path


def save_a1111_pt(path, vec: torch.Tensor):
    """A1111's own .pt layout (what its training tab writes)."""
    torch.save({"string_to_token": {"*": 265}, "string_to_param": {"*": vec}, "name": path.stem, "step": 1000,
                "sd_checkpoint": "abc", "sd_checkpoint_name": "model"}, path)
    return path


def image(pipe, prompt, negative=None):
    out = pipe(prompt, negative_prompt=negative, num_inference_steps=2, width=64, height=64,
               generator=torch.Generator().manual_seed(3), output_type="np")
    return out.images[0]


def run(pipe, prompt, negative="", reapply=None):
    used = emb.load_embeddings_used(pipe, prompt, negative, reapply)
    return image(pipe, used.prompt, used.negative_prompt or None), used


def test_one_vector_safetensors_by_name_changes_the_image(emb_dir, pipe):
    plain = image(pipe, "a tinyemb cat")  # no file yet: the word is just letters
    vec = vectors(1)
    save_st(emb_dir / "tinyemb.safetensors", {"emb_params": vec})
    out, used = run(pipe, "a tinyemb cat")
    assert [u.name for u in used.used] == ["tinyemb"] and used.prompt == "a tinyemb cat"
    assert not np.array_equal(out, plain)
    token = pipe.tokenizer.convert_tokens_to_ids("tinyemb")
    assert torch.equal(pipe.text_encoder.get_input_embeddings().weight[token].detach(), vec[0])
    again, _ = run(pipe, "a tinyemb cat")  # once per pipeline: the second job loads nothing
    assert np.array_equal(again, out)
    assert np.array_equal(image(pipe, "a cat"), image(load(resolve("tiny"), "float32").pipe, "a cat"))


def test_two_vector_a1111_pt_uses_both_vectors(emb_dir, pipe):
    vec = vectors(2, seed=1)
    save_a1111_pt(emb_dir / "twovec.pt", vec)
    save_st(emb_dir / "firstonly.safetensors", {"emb_params": vec[:1]})
    two, used = run(pipe, "a twovec cat")
    one, _ = run(pipe, "a firstonly cat")
    assert not np.array_equal(two, one)  # the second vector counts
    ids = [pipe.tokenizer.convert_tokens_to_ids(t) for t in ("twovec", "twovec_1")]
    assert torch.equal(pipe.text_encoder.get_input_embeddings().weight[ids].detach(), vec)
    fields = network_fields(embeddings=used.used)
    whole = hashlib.sha256((emb_dir / "twovec.pt").read_bytes()).hexdigest()[:12]
    assert fields == {"TI hashes": f"twovec: {whole}"}


def test_explicit_form_equals_bare_name_and_unknown_is_an_error(emb_dir, pipe):
    save_st(emb_dir / "tinyemb.safetensors", {"emb_params": vectors(1)})
    bare, _ = run(pipe, "a tinyemb cat")
    explicit, used = run(pipe, "a embedding:tinyemb cat")
    assert used.prompt == "a tinyemb cat" and np.array_equal(bare, explicit)
    with_suffix, _ = run(pipe, "a embedding:tinyemb.safetensors cat")
    assert np.array_equal(bare, with_suffix)
    with pytest.raises(InvalidRequest) as err:
        emb.load_embeddings_used(pipe, "a cat", "embedding:nosuch")
    assert "nosuch" in str(err.value) and "tinyemb" in str(err.value)


def test_negative_prompt_embedding_and_case(emb_dir, pipe):
    save_st(emb_dir / "BadHands.safetensors", {"emb_params": vectors(1, seed=4)})
    plain = image(pipe, "a cat", "badhands")
    out, used = run(pipe, "a cat", "badhands, blurry")
    assert used.negative_prompt == "BadHands, blurry" and [u.name for u in used.used] == ["BadHands"]
    assert not np.array_equal(out, plain)


def test_pickle_embedding_that_would_run_code_is_refused(emb_dir, pipe):
    class Evil:
        def __reduce__(self):
            return (os.system, ("echo pwned",))

    torch.save({"string_to_param": {"*": vectors(1)}, "x": Evil()}, emb_dir / "evil.pt")
    with pytest.raises(UnsafeCheckpoint):
        emb.load_embeddings_used(pipe, "an evil cat")
    assert "evil" not in pipe.tokenizer.get_vocab()


def test_wrong_size_embedding_is_skipped_bare_and_refused_explicit(emb_dir, pipe):
    save_st(emb_dir / "bigemb.safetensors", {"emb_params": vectors(1, dim=768)})
    used = emb.load_embeddings_used(pipe, "a bigemb cat")
    assert used.used == [] and "does not fit" in used.warnings[0]
    with pytest.raises(InvalidRequest, match="does not fit"):
        emb.load_embeddings_used(pipe, "a embedding:bigemb cat")


@pytest.mark.parametrize("preset", ["lowvram", "novram", "medvram"])
def test_embedding_under_offload_presets(preset, emb_dir, pipe):
    save_st(emb_dir / "tinyemb.safetensors", {"emb_params": vectors(1)})
    plain = load(resolve("tiny"), "float32").pipe
    reference, _ = run(plain, "a tinyemb cat")
    settings = load_presets()[preset].memory
    apply_mod.apply_settings(pipe, settings, CPU)
    calls = []

    def reapply():
        calls.append(1)
        apply_mod.apply_settings(pipe, settings, CPU)

    out, _ = run(pipe, "a tinyemb cat", reapply=reapply)
    assert calls == [1]
    if not settings.fp8_storage:
        assert np.abs(out - reference).max() < 1e-4
    else:
        assert np.isfinite(out).all()


def test_reloaded_text_encoder_gets_its_rows_back(emb_dir, tiny_path):
    model = load(resolve("tiny"), "float32")
    save_st(emb_dir / "tinyemb.safetensors", {"emb_params": vectors(1)})
    first, _ = run(model.pipe, "a tinyemb cat")
    reload_components(model, ["text_encoder"], "float32")  # what the runner does to restore precision
    again, _ = run(model.pipe, "a tinyemb cat")
    assert np.array_equal(first, again)


def test_sdxl_embedding_goes_to_both_encoders(emb_dir, tiny_sdxl_path):
    xl = load(resolve("tiny-sdxl"), "float32").pipe
    l_vec, g_vec = vectors(2, seed=5), vectors(2, seed=6)
    save_st(emb_dir / "xlemb.safetensors", {"clip_l": l_vec, "clip_g": g_vec})
    save_st(emb_dir / "sd15emb.safetensors", {"emb_params": vectors(1, seed=7)})
    plain = image(xl, "a xlemb cat")
    out, used = run(xl, "a xlemb cat")
    assert not np.array_equal(out, plain)
    for te, tok, vec in (("text_encoder", "tokenizer", l_vec), ("text_encoder_2", "tokenizer_2", g_vec)):
        ids = [getattr(xl, tok).convert_tokens_to_ids(t) for t in ("xlemb", "xlemb_1")]
        assert torch.equal(getattr(xl, te).get_input_embeddings().weight[ids].detach(), vec)
    skipped = emb.load_embeddings_used(xl, "a sd15emb cat")  # an SD 1.x embedding: A1111 skips it too
    assert skipped.used == [] and "does not fit" in skipped.warnings[0]


def test_multi_vector_embedding_at_the_75_token_edge_moves_whole_to_the_next_chunk(emb_dir, pipe):
    """A1111's tokenize_line: an embedding whose vectors do not fit in what is left of the chunk closes it
    (padded) and starts the next one; one that fits stays. Plain text still splits at 75."""
    from lowvram_gen.prompting.encode import encode_prompts, prompt_chunks

    save_st(emb_dir / "fourvec.safetensors", {"emb_params": vectors(4, seed=8)})
    tok = pipe.tokenizer
    used = emb.load_embeddings_used(pipe, " ".join(["x"] * 72) + " fourvec")
    ids = tuple(tok.convert_tokens_to_ids(t) for t in ("fourvec", "fourvec_1", "fourvec_2", "fourvec_3"))
    x = tok.convert_tokens_to_ids("x</w>")

    straddling = prompt_chunks(pipe, used.prompt)[0]  # 72 x's + 4 vectors: would end at 76
    assert [c.length for c in straddling] == [72, 4]
    first, second = straddling
    assert first.ids[1:73] == (x,) * 72 and first.ids[73] == tok.eos_token_id and set(first.ids[74:]) == {
        tok.pad_token_id}
    assert second.ids[1:5] == ids and second.ids[5] == tok.eos_token_id
    at_73 = prompt_chunks(pipe, " ".join(["x"] * 73) + " fourvec")[0]
    assert [c.length for c in at_73] == [73, 4] and at_73[1].ids[1:5] == ids

    fits = prompt_chunks(pipe, " ".join(["x"] * 71) + " fourvec y")[0]  # ends exactly at 75: stays
    assert [c.length for c in fits] == [75, 1] and fits[0].ids[72:76] == ids
    plain = prompt_chunks(pipe, " ".join(["x"] * 76))[0]
    assert [c.length for c in plain] == [75, 1]

    embeds = encode_prompts(pipe, used.prompt, "", 1, "cpu").prompt_embeds
    assert embeds.shape == (1, 154, 32)


def test_sdxl_embedding_with_an_sd_model_is_skipped_with_a_warning(emb_dir, pipe):
    """An SDXL file (clip_l + clip_g) on SD 1.x: its clip_l is as wide as the model's token embeddings
    (768 on real models, 32 here) but A1111 skips the file (2048 is not 768), and so do we, saying why."""
    save_st(emb_dir / "xlonly.safetensors", {"clip_l": vectors(2, dim=32, seed=9), "clip_g": vectors(2, dim=64)})
    plain = image(pipe, "a xlonly cat")
    out, used = run(pipe, "a xlonly cat")
    assert used.used == [] and "xlonly" not in pipe.tokenizer.get_vocab()
    assert len(used.warnings) == 1 and "xlonly.safetensors" in used.warnings[0]
    assert "an SDXL embedding" in used.warnings[0] and used.warnings[0].endswith("skipped")
    assert np.array_equal(out, plain)  # the word is just text, as in A1111
    with pytest.raises(InvalidRequest, match="an SDXL embedding"):
        emb.load_embeddings_used(pipe, "a embedding:xlonly cat")
