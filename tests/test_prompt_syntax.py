"""A1111 prompt syntax: the parser against A1111's documented rules, the chunks and token weights that
reach the encoders, and the embeddings (identical to diffusers for plain prompts, A1111's emphasis
math for weighted ones, 75-token chunks for long ones) on the embedded tiny SD and SDXL models."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
import torch

from lowvram_gen.prompting.chunks import empty_chunk, token_weights
from lowvram_gen.prompting.encode import PromptEmbeds, encode_prompts, plain_prompt_for, prompt_encoding
from lowvram_gen.prompting.parse import (BREAK, PromptSyntaxError, find_unsupported, is_break, parse_attention,
                                         strip_syntax, uses_syntax)

R, S = 1.1, 1 / 1.1  # A1111: ( ) multiplies attention by 1.1, [ ] divides by 1.1

# Expected (text, weight) pairs, written from A1111's wiki rules ("Features: Attention/emphasis").
PARSE_TABLE = [
    ("normal text", [("normal text", 1.0)]),
    ("an (important) word", [("an ", 1.0), ("important", R), (" word", 1.0)]),
    ("((word))", [("word", R * R)]),
    ("(((word)))", [("word", R * R * R)]),
    ("[word]", [("word", S)]),
    ("[[word]]", [("word", S * S)]),
    ("(word:0.5)", [("word", 0.5)]),
    ("(word: 1.5 )", [("word", 1.5)]),
    ("(word:+.5) x", [("word", 0.5), (" x", 1.0)]),
    ("(word:2.)", [("word", 2.0)]),
    ("((word:1.5))", [("word", 1.5 * R)]),
    ("[(word:1.5)]", [("word", 1.5 * S)]),
    ("(word:abc)", [("word:abc", R)]),  # not a number: the colon is text, the brackets plain ( )
    ("(unbalanced", [("unbalanced", R)]),  # closed at the end
    ("a [unbalanced", [("a ", 1.0), ("unbalanced", S)]),
    ("a) b]", [("a) b]", 1.0)]),  # closing brackets with nothing open are literal
    ("a:1.5) b", [("a:1.5) b", 1.0)]),  # a weight with no bracket open is literal
    (r"\(literal\]", [("(literal]", 1.0)]),
    (r"\[x\) \\ y", [("[x) \\ y", 1.0)]),
    (r"(a \(b\))", [("a (b)", R)]),
    ("(unnecessary)(parens)", [("unnecessaryparens", R)]),  # equal weights merge
    ("a BREAK b", [("a", 1.0), (BREAK, -1.0), ("b", 1.0)]),
    ("a BREAK BREAK b", [("a", 1.0), (BREAK, -1.0), ("", 1.0), (BREAK, -1.0), ("b", 1.0)]),
    ("(a) BREAK [b]", [("a", R), ("", 1.0), (BREAK, -1.0), ("", 1.0), ("b", S)]),
    ("a break b, aBREAK", [("a break b, aBREAK", 1.0)]),  # only upper case, only as a word
    ("", [("", 1.0)]),
    ("()", [("", 1.0)]),
    ("a (((house:1.3)) [on] a (hill:0.5), sun, (((sky))).", [
        ("a ", 1.0), ("house", 1.3 * R * R), (" ", R), ("on", S * R), (" a ", R), ("hill", 0.5 * R),
        (", sun, ", R), ("sky", R ** 4), (".", R)]),
]


@pytest.mark.parametrize("text,expected", PARSE_TABLE, ids=[repr(t) for t, _ in PARSE_TABLE])
def test_parse_attention_follows_a1111_rules(text, expected):
    got = parse_attention(text)
    assert [t for t, _ in got] == [t for t, _ in expected]
    assert [w for _, w in got] == pytest.approx([w for _, w in expected], rel=1e-12)
    assert [is_break(p) for p in got] == [t is BREAK for t, _ in expected]


@pytest.mark.parametrize("text", ["(word:1.2.3)", "(word:.)", "(word:-.)"])
def test_a_malformed_weight_is_refused_like_a1111_with_a_message(text):
    with pytest.raises(PromptSyntaxError, match="not a number"):
        parse_attention(text)
    assert any("not a number" in w for w in find_unsupported(text))
    assert strip_syntax(text) == text and uses_syntax(text)


@pytest.mark.parametrize("text,plain", [
    ("a (red:1.3) [cat] BREAK ((dog))", "a red cat dog"),
    (r"\(x\)", "(x)"),
    ("plain words", "plain words"),
])
def test_strip_syntax_leaves_the_words(text, plain):
    assert strip_syntax(text) == plain
    assert uses_syntax(text) == (text != plain)


@pytest.mark.parametrize("text,needle", [
    ("a cat <lora:foo:0.7>", "'<lora:foo:0.7>'"),
    ("(a BREAK b)", "BREAK inside brackets"),
])
def test_unsupported_syntax_is_named(text, needle):
    assert any(needle in w for w in find_unsupported(text))


@pytest.mark.parametrize("text", ["a (b:1.2) [c] BREAK d", r"\[a:b:10\]", "[a:(b:1.2)]", "ANDROID", "",
                                  # implemented since issue 32 (prompting/schedule.py): no warning any more
                                  "a [cat:dog:10] b", "a [cat:0.5]", "a [cat::5]", "a [cat|dog] b", "a cat AND a dog"])
def test_supported_syntax_gives_no_warning(text):
    assert find_unsupported(text) == []


def test_the_parser_modules_do_not_import_torch():
    code = "import sys, lowvram_gen.prompting.parse, lowvram_gen.prompting.chunks; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


# ---- token ids and weights that reach the encoder (tiny tokenizer: one token per character,
# the last character of a word carries "</w>") ----

@pytest.fixture(scope="module")
def sd(tiny_path):
    import diffusers

    pipe = diffusers.AutoPipelineForText2Image.from_pretrained(tiny_path)
    pipe.set_progress_bar_config(disable=True)
    return pipe


@pytest.fixture(scope="module")
def sdxl(tiny_sdxl_path):
    import diffusers

    pipe = diffusers.AutoPipelineForText2Image.from_pretrained(tiny_sdxl_path)
    pipe.set_progress_bar_config(disable=True)
    return pipe


def _readable(tokenizer, chunks):
    """Per chunk: the prompt tokens as strings with their weights (BOS/EOS/padding left out)."""
    return [[(tokenizer.convert_ids_to_tokens(i), w)
             for i, w in zip(c.ids[1:c.length + 1], c.weights[1:c.length + 1])] for c in chunks]


TOKEN_TABLE = [
    ("ab c", [[("a", 1.0), ("b</w>", 1.0), ("c</w>", 1.0)]]),
    ("a (bc:1.5) d", [[("a</w>", 1.0), ("b", 1.5), ("c</w>", 1.5), ("d</w>", 1.0)]]),
    ("[x] ((y))", [[("x</w>", S), ("y</w>", R * R)]]),
    ("(x, y)", [[("x</w>", R), (",</w>", R), ("y</w>", R)]]),
    (r"\(x", [[("(</w>", 1.0), ("x</w>", 1.0)]]),
    ("a BREAK b", [[("a</w>", 1.0)], [("b</w>", 1.0)]]),
    ("a BREAK BREAK (b)", [[("a</w>", 1.0)], [], [("b</w>", R)]]),
    ("a BREAK", [[("a</w>", 1.0)]]),
    ("", [[]]),
]


@pytest.mark.parametrize("text,expected", TOKEN_TABLE, ids=[repr(t) for t, _ in TOKEN_TABLE])
def test_token_weights(sd, text, expected):
    chunks = token_weights(sd.tokenizer, text)
    got = _readable(sd.tokenizer, chunks)
    assert [[t for t, _ in c] for c in got] == [[t for t, _ in c] for c in expected]
    assert [[w for _, w in c] for c in got] == [pytest.approx([w for _, w in c], rel=1e-12) for c in expected]
    tok = sd.tokenizer
    for c in chunks:  # [BOS] tokens [EOS] [PAD]..., 77 long, specials at weight 1
        assert len(c.ids) == len(c.weights) == 77
        assert c.ids[0] == tok.bos_token_id and c.ids[c.length + 1] == tok.eos_token_id
        assert set(c.ids[c.length + 2:]) <= {tok.pad_token_id}
        assert c.weights[0] == c.weights[c.length + 1] == 1.0 and set(c.weights[c.length + 2:]) <= {1.0}


def test_padding_uses_the_tokenizers_pad_token_after_eos(sd):
    """SD 2.x and SDXL's second tokenizer pad with '!' (id 0), not EOS: as A1111 and diffusers do."""
    from copy import deepcopy

    tok = deepcopy(sd.tokenizer)
    tok.pad_token = "!"
    chunk = token_weights(tok, "ab")[0]
    assert chunk.ids[:4] == (tok.bos_token_id, *tok.convert_tokens_to_ids(["a", "b</w>"]), tok.eos_token_id)
    assert set(chunk.ids[4:]) == {tok.pad_token_id} != {tok.eos_token_id}
    assert chunk.attention_mask == [1] * 4 + [0] * 73


def _words(n: int, word: str = "x") -> str:
    return " ".join([word] * n)


def test_chunks_split_at_75_tokens_and_back_up_to_a_recent_comma(sd):
    tok = sd.tokenizer
    # 70 one-token words, "y," (2 tokens: the comma is token 72), then 10 more words: 82 tokens
    text = _words(70) + " y, " + _words(10, "z")
    assert [c.length for c in token_weights(tok, text)] == [72, 10]  # the 3 z's after the comma moved on
    assert [c.length for c in token_weights(tok, text, backtrack=0)] == [75, 7]
    far = _words(40) + " y, " + _words(40, "z")  # comma 34 tokens before the end of the chunk: too far
    assert [c.length for c in token_weights(tok, far)] == [75, 7]


# ---- embeddings ----

def _diffusers_sd(pipe, prompt, negative, n=1):
    return pipe.encode_prompt(prompt, "cpu", n, True, negative)


@pytest.mark.parametrize("prompt,negative", [("a red cat, sitting", "blurry"), ("", ""), (_words(75), "x")])
def test_plain_prompts_give_diffusers_own_embeddings_sd(sd, prompt, negative):
    ours = encode_prompts(sd, prompt, negative, 2, "cpu")
    ref_pos, ref_neg = _diffusers_sd(sd, prompt, negative, 2)
    assert torch.equal(ours.prompt_embeds, ref_pos) and torch.equal(ours.negative_prompt_embeds, ref_neg)
    assert ours.pooled_prompt_embeds is None and ours.warnings == []
    assert set(ours.as_kwargs()) == {"prompt_embeds", "negative_prompt_embeds"}


@pytest.mark.parametrize("negative", ["blurry", ""])
def test_plain_prompts_give_diffusers_own_embeddings_sdxl(sdxl, negative):
    """An empty negative is passed to diffusers as None (as the engine does): SDXL then uses zeros."""
    ours = encode_prompts(sdxl, "a red cat, sitting", negative, 2, "cpu")
    ref = sdxl.encode_prompt("a red cat, sitting", device="cpu", num_images_per_prompt=2,
                             do_classifier_free_guidance=True, negative_prompt=negative or None)
    got = (ours.prompt_embeds, ours.negative_prompt_embeds, ours.pooled_prompt_embeds,
           ours.negative_pooled_prompt_embeds)
    assert all(torch.equal(a, b) for a, b in zip(got, ref))
    assert (not negative) == (not ours.negative_prompt_embeds.any())


# ---- clip skip (A1111's "Clip skip" N, 1: off; issue 19) ----

@pytest.fixture
def diffusers_clip_skip(monkeypatch):
    """diffusers' own SD `clip_skip` reaches for `text_encoder.text_model.final_layer_norm`, which transformers 5's
    CLIPTextModel no longer has (it is `final_layer_norm` there): give it that path for the comparison."""
    from types import SimpleNamespace

    def shim(pipe):
        encoder = pipe.text_encoder
        if not hasattr(encoder, "text_model"):
            monkeypatch.setattr(encoder, "text_model", SimpleNamespace(final_layer_norm=encoder.final_layer_norm),
                                raising=False)
        return pipe

    return shim


@pytest.mark.parametrize("clip_skip", [2, 3])
def test_clip_skip_gives_diffusers_own_clip_skip_sd(sd, diffusers_clip_skip, clip_skip):
    """A1111's N is diffusers' clip_skip = N - 1 on SD 1.x/2.x (hidden_states[-N], then the final layer norm). The
    negative prompt gets it too (as in A1111; diffusers' own negative ignores clip_skip): it equals diffusers'
    encoding of the same text as a prompt."""
    pipe = diffusers_clip_skip(sd)
    ours = encode_prompts(pipe, "a red cat, sitting", "blurry", 2, "cpu", clip_skip=clip_skip)
    ref_pos, _ = pipe.encode_prompt("a red cat, sitting", "cpu", 2, True, "blurry", clip_skip=clip_skip - 1)
    ref_neg, _ = pipe.encode_prompt("blurry", "cpu", 2, True, "", clip_skip=clip_skip - 1)
    assert torch.allclose(ours.prompt_embeds, ref_pos) and torch.allclose(ours.negative_prompt_embeds, ref_neg)
    off = encode_prompts(pipe, "a red cat, sitting", "blurry", 2, "cpu", clip_skip=1)
    assert torch.equal(off.prompt_embeds, encode_prompts(pipe, "a red cat, sitting", "blurry", 2, "cpu").prompt_embeds)
    assert not torch.allclose(ours.prompt_embeds, off.prompt_embeds)
    assert not torch.allclose(ours.negative_prompt_embeds, off.negative_prompt_embeds)


def test_clip_skip_on_sdxl_is_forges_and_diffusers_one_layer_less(sdxl):
    """SDXL: N = 1 and 2 are SDXL's own penultimate layer (A1111 ignores Clip skip on SDXL; Forge takes
    hidden_states[-max(N, 2)]), so an SDXL image with `Clip skip: 2` is the usual one; N = 3 is diffusers'
    clip_skip=1 ([-(1 + 2)]). The pooled embeds never change."""
    def ref(clip_skip):
        return sdxl.encode_prompt("a red cat, sitting", device="cpu", num_images_per_prompt=2,
                                  do_classifier_free_guidance=True, negative_prompt="blurry", clip_skip=clip_skip)

    plain = ref(None)
    for n in (1, 2):
        ours = encode_prompts(sdxl, "a red cat, sitting", "blurry", 2, "cpu", clip_skip=n)
        assert torch.equal(ours.prompt_embeds, plain[0]) and torch.equal(ours.negative_prompt_embeds, plain[1])
    three = encode_prompts(sdxl, "a red cat, sitting", "blurry", 2, "cpu", clip_skip=3)
    deeper = ref(1)
    assert torch.allclose(three.prompt_embeds, deeper[0]) and not torch.allclose(three.prompt_embeds, plain[0])
    assert torch.equal(three.pooled_prompt_embeds, plain[2]) and torch.equal(three.pooled_prompt_embeds, deeper[2])
    negative_three = encode_prompts(sdxl, "blurry", "", 2, "cpu", clip_skip=3).prompt_embeds
    assert torch.allclose(three.negative_prompt_embeds, negative_three)  # the negative is skipped as well


def test_a_clip_skip_deeper_than_the_encoder_is_a_clear_error(sd, sdxl):
    from lowvram_gen.errors import InvalidRequest

    for pipe in (sd, sdxl):  # the tiny encoders have 2 layers: hidden_states are the embeddings and 2 layers
        with pytest.raises(InvalidRequest) as err:
            encode_prompts(pipe, "a cat", "", 1, "cpu", clip_skip=4)
        assert "invalid clip skip: 4" in str(err.value) and "from 1 to 3" in str(err.value)


def test_clip_skip_with_int8_text_encoders_is_diffusers_clip_skip(tiny_path, diffusers_clip_skip):
    """sdnq-quantized encoders (--quantize int8): the layer is taken from the same quantized model as
    diffusers' clip_skip takes it."""
    from lowvram_gen.models.loading import load
    from lowvram_gen.models.quantize import is_quantized, quantize_module
    from lowvram_gen.models.resolve import resolve

    pipe = diffusers_clip_skip(load(resolve("tiny"), "float32").pipe)
    quantize_module(pipe.text_encoder, "int8")
    assert any(is_quantized(m) for m in pipe.text_encoder.modules())
    ours = encode_prompts(pipe, "a red cat, sitting", "", 1, "cpu", clip_skip=2)
    ref, _ = pipe.encode_prompt("a red cat, sitting", "cpu", 1, True, "", clip_skip=1)
    torch.testing.assert_close(ours.prompt_embeds, ref)
    assert not torch.allclose(ours.prompt_embeds, encode_prompts(pipe, "a red cat, sitting", "", 1, "cpu").prompt_embeds)


def test_weights_scale_hidden_states_then_restore_the_chunk_mean(sd):
    """A1111's "Original" emphasis, checked against the formula on the unweighted encoding."""
    plain = encode_prompts(sd, "a cat sat", "", 1, "cpu").prompt_embeds
    weighted = encode_prompts(sd, "a (cat:1.5) [sat]", "", 1, "cpu").prompt_embeds
    w = torch.ones(77)
    w[2:5] = 1.5  # BOS, "a</w>", then c a t</w>
    w[5:8] = S  # s a t</w>
    expected = plain * w.reshape(1, -1, 1)
    ratio = float(plain.mean() / expected.mean())
    if 0.25 <= ratio <= 4:  # the tiny model's mean is ~0 (untrained LayerNorm): then no rescale, see below
        expected = expected * ratio
    torch.testing.assert_close(weighted, expected, atol=1e-6, rtol=1e-5)
    assert not torch.allclose(weighted, plain)
    assert torch.equal(encode_prompts(sd, "a (cat:1) sat", "", 1, "cpu").prompt_embeds, plain)


def test_emphasis_restores_the_mean_as_a1111_and_skips_a_mean_that_is_noise():
    """With a real CLIP's clear non-zero mean the weighted chunk gets its old mean back (A1111's
    "Original"); with a mean near zero (ratio outside [0.25, 4]) rescaling would amplify noise up to
    NaN in the UNet (it did with the tiny model), so the weights apply without it."""
    from lowvram_gen.prompting.encode import _emphasis

    weights = [1.0] * 70 + [1.5] * 7
    z = torch.randn(1, 77, 8, generator=torch.Generator().manual_seed(0)) + 3.0  # mean ~3, like a real CLIP's
    out = _emphasis(z, weights)
    torch.testing.assert_close(out.mean(), z.mean())
    assert not torch.allclose(out, z)
    centred = z - z.mean()  # mean exactly ~0: the ratio is noise
    scaled = _emphasis(centred, weights)
    torch.testing.assert_close(scaled, centred * torch.tensor(weights).reshape(1, -1, 1))


def test_weighting_applies_to_the_negative_prompt_too(sd):
    a = encode_prompts(sd, "x", "ugly", 1, "cpu").negative_prompt_embeds
    b = encode_prompts(sd, "x", "(ugly:1.5)", 1, "cpu").negative_prompt_embeds
    assert a.shape == b.shape and not torch.allclose(a, b)


def test_a_200_token_prompt_is_three_chunks_and_nothing_is_cut(sd):
    text = _words(50, "abcd")  # 4 tokens per word: 200 tokens
    chunks = token_weights(sd.tokenizer, text)
    assert [c.length for c in chunks] == [75, 75, 50]
    emb = encode_prompts(sd, text, "", 1, "cpu")
    assert emb.prompt_embeds.shape == (1, 231, 32) and emb.negative_prompt_embeds.shape == (1, 231, 32)
    other = encode_prompts(sd, text[:-4] + "wxyz", "", 1, "cpu").prompt_embeds
    assert torch.equal(other[:, :154], emb.prompt_embeds[:, :154])  # the first two chunks: unchanged
    assert not torch.allclose(other[:, 154:], emb.prompt_embeds[:, 154:])  # the end of the prompt counts


def test_positive_and_negative_are_padded_with_empty_chunks_to_one_length(sd):
    empty = encode_prompts(sd, "", "", 1, "cpu").prompt_embeds
    long = _words(100)  # 100 tokens: 2 chunks
    emb = encode_prompts(sd, long, "short", 1, "cpu")
    assert emb.prompt_embeds.shape == emb.negative_prompt_embeds.shape == (1, 154, 32)
    assert torch.equal(emb.negative_prompt_embeds[:, 77:], empty)
    flipped = encode_prompts(sd, "short", long, 1, "cpu")
    assert flipped.prompt_embeds.shape == (1, 154, 32) and torch.equal(flipped.prompt_embeds[:, 77:], empty)
    assert torch.equal(flipped.negative_prompt_embeds, emb.prompt_embeds)


def test_sdxl_uses_both_encoders_and_pools_the_first_chunk(sdxl):
    text = _words(50, "abcd")  # 200 tokens: 3 chunks
    emb = encode_prompts(sdxl, text, "ugly", 2, "cpu")
    assert emb.prompt_embeds.shape == emb.negative_prompt_embeds.shape == (2, 231, 64)
    assert emb.pooled_prompt_embeds.shape == emb.negative_pooled_prompt_embeds.shape == (2, 32)
    first = token_weights(sdxl.tokenizer_2, text)[0]
    ids = torch.tensor([first.ids])
    with torch.no_grad():
        out1 = sdxl.text_encoder(torch.tensor([token_weights(sdxl.tokenizer, text)[0].ids]),
                                 output_hidden_states=True)
        out2 = sdxl.text_encoder_2(ids, output_hidden_states=True)
    torch.testing.assert_close(emb.prompt_embeds[:1, :77, :32], out1.hidden_states[-2], atol=0, rtol=0)
    torch.testing.assert_close(emb.prompt_embeds[:1, :77, 32:], out2.hidden_states[-2], atol=0, rtol=0)
    torch.testing.assert_close(emb.pooled_prompt_embeds[:1], out2[0], atol=0, rtol=0)
    changed_end = encode_prompts(sdxl, text[:-4] + "wxyz", "ugly", 1, "cpu")
    assert torch.equal(changed_end.pooled_prompt_embeds, emb.pooled_prompt_embeds[:1])
    changed_start = encode_prompts(sdxl, "wxyz" + text[4:], "ugly", 1, "cpu")
    assert not torch.allclose(changed_start.pooled_prompt_embeds, emb.pooled_prompt_embeds[:1])


def test_sdxl_weights_apply_to_both_encoders(sdxl):
    plain = encode_prompts(sdxl, "a cat", "", 1, "cpu").prompt_embeds
    weighted = encode_prompts(sdxl, "a (cat:1.4)", "", 1, "cpu").prompt_embeds
    assert not torch.allclose(weighted[..., :32], plain[..., :32])
    assert not torch.allclose(weighted[..., 32:], plain[..., 32:])


def test_without_cfg_the_negative_is_skipped(sd, sdxl):
    for pipe in (sd, sdxl):
        emb = encode_prompts(pipe, "a cat", "ugly", 1, "cpu", do_cfg=False)
        assert emb.negative_prompt_embeds is None and emb.negative_pooled_prompt_embeds is None
        assert "negative_prompt_embeds" not in emb.as_kwargs()


def test_warnings_name_unsupported_syntax_in_prompt_and_negative(sd):
    emb = encode_prompts(sd, "a cat <lora:foo:0.7>", "(bad BREAK hands)", 1, "cpu")
    text = "\n".join(emb.warnings)
    assert "'<lora:foo:0.7>'" in text
    assert "negative prompt: BREAK inside brackets" in text


class StableDiffusion3Pipeline:  # a stand-in: only the class name and no SD/SDXL base class matter
    pass


class FluxPipeline:
    pass


@pytest.mark.parametrize("stub", [StableDiffusion3Pipeline(), FluxPipeline()], ids=["sd3", "flux"])
def test_other_pipelines_get_none_and_the_plain_text_with_a_warning(stub):
    assert prompt_encoding(stub) is None and encode_prompts(stub, "a (cat:1.3)", "", 1, "cpu") is None
    text, warnings = plain_prompt_for(stub, "a (cat:1.3) BREAK [dog]")
    assert text == "a cat dog"
    assert len(warnings) == 1 and type(stub).__name__ in warnings[0] and "ignored" in warnings[0]
    assert plain_prompt_for(stub, "a cat") == ("a cat", [])
    _, warnings = plain_prompt_for(stub, "a (cat) <lora:x:1>")  # (prompt editing is refused: test_prompt_editing.py)
    assert any("'<lora:x:1>'" in w for w in warnings)


def test_img2img_twins_are_handled(sd, sdxl):
    from diffusers import AutoPipelineForImage2Image

    assert prompt_encoding(AutoPipelineForImage2Image.from_pipe(sd)) == "clip"
    assert prompt_encoding(AutoPipelineForImage2Image.from_pipe(sdxl)) == "clip_pair"
    assert plain_prompt_for(sd, "(a)") == ("(a)", [])  # SD keeps the syntax: encode_prompts applies it


def test_encoding_under_group_offload_gives_the_same_embeddings(tiny_path):
    from lowvram_gen.engines.sd import apply as apply_mod
    from lowvram_gen.hardware.device import probe
    from lowvram_gen.models.loading import load
    from lowvram_gen.models.resolve import resolve
    from lowvram_gen.settings import MemorySettings

    pipe = load(resolve("tiny"), "float32").pipe
    prompt = "a (cat:1.3), " + _words(90)
    references = {n: encode_prompts(pipe, prompt, "ugly", 1, "cpu", clip_skip=n) for n in (1, 2)}
    for offload in ("group", "model"):
        applied = apply_mod.apply_settings(pipe, MemorySettings(dtype="float32", offload=offload), probe("cpu"))
        try:
            assert applied.effective.offload == offload
            for clip_skip, reference in references.items():  # clip skip calls the final layer norm on its own
                emb = encode_prompts(pipe, prompt, "ugly", 1, clip_skip=clip_skip)  # the execution device
                torch.testing.assert_close(emb.prompt_embeds, reference.prompt_embeds)
                torch.testing.assert_close(emb.negative_prompt_embeds, reference.negative_prompt_embeds)
        finally:
            apply_mod.apply_settings(pipe, MemorySettings(dtype="float32"), probe("cpu"))


def _image(pipe, **kwargs):
    out = pipe(num_inference_steps=2, width=64, height=64, guidance_scale=7.0, output_type="np",
               generator=[torch.Generator().manual_seed(s) for s in (1, 2)], **kwargs)
    return out.images


@pytest.mark.parametrize("which,negative", [("sd", "blurry"), ("sdxl", "")])
def test_end_to_end_embeds_give_the_same_images_as_prompt_strings(request, which, negative):
    """What the engine will do: n images from embeds of batch n, against the prompt string with
    num_images_per_prompt=n (diffusers encodes it once and repeats it, as we do; `[prompt] * n`
    runs the encoder on a batch of n, which differs in the last float bits on SDXL)."""
    pipe = request.getfixturevalue(which)
    prompt = "a red cat, sitting"
    strings = _image(pipe, prompt=prompt, negative_prompt=negative or None, num_images_per_prompt=2)
    embeds = encode_prompts(pipe, prompt, negative, 2, "cpu")
    assert isinstance(embeds, PromptEmbeds)
    np.testing.assert_array_equal(_image(pipe, **embeds.as_kwargs()), strings)
    weighted = encode_prompts(pipe, "a (red:1.6) cat, sitting", negative, 2, "cpu")
    assert not np.array_equal(_image(pipe, **weighted.as_kwargs()), strings)


def test_empty_chunk_is_bos_eos_and_padding(sd):
    chunk = empty_chunk(sd.tokenizer)
    assert chunk.length == 0 and chunk.ids[:2] == (sd.tokenizer.bos_token_id, sd.tokenizer.eos_token_id)
    assert chunk == token_weights(sd.tokenizer, "")[0]


def test_the_syntax_doc_is_current_on_networks_embeddings_and_cond_uncond_padding():
    """Issue 19: the doc said LoRA tags and embeddings by name were not implemented, and called padding
    prompt and negative to one length A1111's behaviour, which is only its non-default option."""
    from pathlib import Path

    doc = " ".join((Path(__file__).parent.parent / "docs" / "prompt-syntax.md").read_text().split())
    assert "embeddings by file name are not implemented" not in doc
    assert "not loaded, the tag is encoded as text" not in doc
    assert "LoRA tags and textual-inversion embeddings by file name (and `embedding:name`) are implemented" in doc
    assert "A1111's \"pad cond/uncond\")" not in doc
    assert "`pad_cond_uncond`), which is **off** by default" in doc
    assert "runs the UNet twice per step" in doc and "differ slightly from A1111's defaults" in doc
    assert "the chunk is closed (padded) and the embedding starts the next one" in doc
