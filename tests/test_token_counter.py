"""Issue 32 item 7: A1111's token counter (lowvram_gen/ui/token_counter.py), counted as prompting/chunks.py makes the
text encoder's chunks: 75 tokens are 75/75, 76 are 76/150, a BREAK or the comma backtrack closes a chunk early (the
count says so, as A1111's does), a textual-inversion embedding counts its vectors and is never cut in two, LoRA tags
are taken out; the tokenizer is the UI model's own (the tiny model's byte-level one here: one token a letter), loaded
alone, and CLIP's shipped vocabulary for a model it cannot read a tokenizer of."""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import save_file

from lowvram_gen.prompting.chunks import token_weights
from lowvram_gen.ui import token_counter


@pytest.fixture(scope="module")
def tiny_tok(tiny_path):
    return token_counter.tokenizer_for("tiny")


def words(n: int, word: str = "a") -> str:
    return " ".join([word] * n)  # the tiny tokenizer: "a" is one token ("a</w>")


def test_one_chunk_then_two(tiny_tok):
    assert token_counter.count("", tiny_tok) == (0, 75)
    assert token_counter.count(words(75), tiny_tok) == (75, 75)
    assert token_counter.count(words(76), tiny_tok) == (76, 150)
    assert token_counter.count(words(151), tiny_tok) == (151, 225)


def test_break_and_the_comma_backtrack_close_a_chunk_as_the_encoder_sees_it(tiny_tok):
    assert token_counter.count("a BREAK b", tiny_tok) == (76, 150)  # the first chunk counts whole, as in A1111
    text = words(70) + " , " + words(10, "b")  # the comma at token 71: the 10 b's move to the next chunk
    chunks = token_weights(tiny_tok, text)
    assert [c.length for c in chunks] == [71, 10]
    assert token_counter.count(text, tiny_tok) == (85, 150)


def test_lora_tags_are_taken_out_and_weights_are_not_text(tiny_tok):
    assert token_counter.count("a <lora:style:0.8> b", tiny_tok) == (2, 75)
    assert token_counter.count("(a:1.3) [b]", tiny_tok) == (2, 75)


def test_an_embedding_counts_its_vectors_and_is_never_cut(tiny_tok, tmp_path, monkeypatch):
    folder = tmp_path / "models" / "embeddings"
    folder.mkdir(parents=True)
    save_file({"emb_params": torch.zeros(3, 32)}, str(folder / "shiny.safetensors"))
    monkeypatch.setenv("LOWVRAM_GEN_MODELS", str(tmp_path / "models"))
    assert token_counter.count("a shiny", tiny_tok) == (4, 75)
    assert token_counter.count("a embedding:shiny", tiny_tok) == (4, 75)
    # 73 tokens, then 3 vectors that do not fit in the 2 left: the chunk closes, the embedding starts the next one
    assert token_counter.count(words(73) + " shiny", tiny_tok) == (78, 150)
    assert "shiny" not in tiny_tok.get_vocab()  # counted on a copy: the cached tokenizer is unchanged


def test_the_counter_shows_n_over_room_and_never_fails(tiny_path):
    assert token_counter.counted(words(76), 20, "tiny") == token_counter.shown(76, 150)
    assert "76/150" in token_counter.shown(76, 150)
    assert token_counter.counted("a (b:1.2.3", None, "tiny") .endswith("/75</span>")  # half typed: still a count


def test_a_model_without_a_readable_tokenizer_counts_with_clips_vocabulary(tmp_path):
    clip = token_counter.tokenizer_for(str(tmp_path / "model.safetensors"))
    assert clip.tokenize("a cat, sitting") == ["a</w>", "cat</w>", ",</w>", "sitting</w>"]
    assert token_counter.count("a cat, (sitting:1.2) on a mat", clip) == (7, 75)


def test_prompt_editing_counts_its_longest_variant(tiny_tok):
    """A1111's counter counts the longest prompt the schedule uses: `[a:b b b:0.5]` reads "a" then "b b b" (3),
    `[a|b b]` alternates "a" and "b b" (2), and each `AND` part is its own prompt (the longer one, 3)."""
    assert token_counter.count("[a:b b b:0.5]", tiny_tok, steps=20)[0] == 3
    assert token_counter.count("[a|b b]", tiny_tok, steps=20)[0] == 2
    assert token_counter.count("a AND b b b", tiny_tok, steps=20)[0] == 3
