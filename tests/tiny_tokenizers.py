"""Test utility: tokenizers of the 2026 families' text encoders, built offline (no hub): Qwen2's byte-level BPE
(Qwen-Image's Qwen2.5-VL, Z-Image's and Flux.2 Klein's Qwen3) and Gemma's (SANA's and Lumina 2's Gemma 2).

Each is the real tokenizer class with a tiny vocabulary: the 256 byte symbols (so any text encodes), a few merges,
and the family's special tokens, plus a chat template where the pipeline calls `apply_chat_template`. The text
encoders the tests build take `len(tokenizer)` as their vocabulary size. T5's is in tiny_transformers.py.
"""

from __future__ import annotations

# the special tokens Qwen2/2.5-VL/3 pipelines name in their prompt templates (diffusers' pipelines format them as text)
QWEN_SPECIAL = ("<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|vision_start|>", "<|vision_end|>",
                "<|vision_pad|>", "<|image_pad|>", "<|video_pad|>", "<think>", "</think>")
# Qwen's own template, as its tokenizer_config.json has it (system/user/assistant turns; no tools)
QWEN_CHAT_TEMPLATE = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' }}"
    "{% if message['content'] is string %}{{ message['content'] }}{% else %}"
    "{% for part in message['content'] %}{% if part['type'] == 'text' %}{{ part['text'] }}{% endif %}{% endfor %}"
    "{% endif %}{{ '<|im_end|>\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}"
    "{% if enable_thinking is defined and enable_thinking is false %}{{ '<think>\n\n</think>\n\n' }}{% endif %}"
    "{% endif %}")


def _byte_symbols() -> list[str]:
    """GPT-2's byte-to-unicode table (what byte-level BPE vocabularies are written in): 256 printable symbols."""
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    return [bytes_to_unicode()[b] for b in range(256)]


def qwen2_tokenizer(model_max_length: int = 512):
    """A Qwen2Tokenizer (Qwen2.5-VL's and Qwen3's class): byte-level BPE over the 256 byte symbols with merges for
    'Ġa'..'Ġz' (space + letter), Qwen's special tokens and its chat template; pad is <|endoftext|> as Qwen's."""
    from transformers import Qwen2Tokenizer

    symbols = _byte_symbols()
    vocab = {s: i for i, s in enumerate(symbols)}
    space = symbols[ord(" ")]
    merges = [(space, c) for c in "abcdefghijklmnopqrstuvwxyz"]
    for a, b in merges:
        vocab[a + b] = len(vocab)
    tok = Qwen2Tokenizer(vocab=vocab, merges=merges, unk_token=None, eos_token="<|im_end|>",
                         pad_token="<|endoftext|>", model_max_length=model_max_length)
    tok.add_special_tokens({"additional_special_tokens": [t for t in QWEN_SPECIAL if t != "<|endoftext|>"]})
    tok.add_tokens(["<|endoftext|>"], special_tokens=True)
    tok.chat_template = QWEN_CHAT_TEMPLATE
    return tok


def gemma_tokenizer(model_max_length: int = 512):
    """A GemmaTokenizer (Gemma 2's class): <pad> 0, <eos> 1, <bos> 2, <unk> 3, then the byte symbols' characters
    as a BPE vocabulary (no merges); Gemma's turn markers as special tokens."""
    from transformers import GemmaTokenizer

    vocab = {"<pad>": 0, "<eos>": 1, "<bos>": 2, "<unk>": 3}
    for c in " abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789.,:;!?'\"()-_/▁\n":
        vocab.setdefault(c, len(vocab))
    tok = GemmaTokenizer(vocab=vocab, merges=[], model_max_length=model_max_length)
    tok.add_special_tokens({"additional_special_tokens": ["<start_of_turn>", "<end_of_turn>"]})
    return tok
