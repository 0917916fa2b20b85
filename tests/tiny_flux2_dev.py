"""Test utility: a tiny FLUX.2 [dev] pipeline (Flux2Pipeline) built offline with the shapes diffusers' own tests use
(tests/pipelines/flux2/test_pipeline_flux2.py, `get_dummy_components`): a Flux2Transformer2DModel with a guidance
input, a Mistral3ForConditionalGeneration text encoder (a Mistral language model and a Pixtral vision tower) and the
32-channel AutoencoderKLFlux2 at one block.

Two changes from diffusers' dummies, both so the pipeline runs as its users call it (no test-only arguments):
- the tokenizer is built here offline (diffusers' test downloads Mistral Small 3.1's processor): a byte-level BPE
  over the 256 byte symbols with Mistral's special tokens and a chat template of Mistral's shape
  ([SYSTEM_PROMPT]...[/SYSTEM_PROMPT][INST]...[/INST]); the real one is a PixtralProcessor over the Tekken tokenizer,
  but the pipeline only calls its `apply_chat_template` on text, which this one answers the same way;
- the Mistral model has 31 layers (of width 16) because the call reads hidden states 10, 20 and 30 by default
  (`text_encoder_out_layers`), which diffusers' test overrides to (1,). The transformer's joint_attention_dim is
  those three layers side by side (3 x 16).
Seeded random weights: the images are noise.
"""

from __future__ import annotations

import torch

MISTRAL_WIDTH = 16
MISTRAL_LAYERS = 31  # hidden_states[30] exists: the embeddings and 30 layers, and one more
OUT_LAYERS = 3  # (10, 20, 30): the call's default text_encoder_out_layers
MISTRAL_SPECIAL = ("<unk>", "<s>", "</s>", "<pad>", "[INST]", "[/INST]", "[SYSTEM_PROMPT]", "[/SYSTEM_PROMPT]",
                   "[IMG]")
# Mistral Small 3.1's turns (system, user), text parts only: what Flux2Pipeline's format_input gives it
MISTRAL_CHAT_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}"
    "{% if message['role'] == 'system' %}{{ '[SYSTEM_PROMPT]' }}{% elif message['role'] == 'user' %}{{ '[INST]' }}"
    "{% endif %}"
    "{% if message['content'] is string %}{{ message['content'] }}{% else %}"
    "{% for part in message['content'] %}{% if part['type'] == 'text' %}{{ part['text'] }}{% endif %}{% endfor %}"
    "{% endif %}"
    "{% if message['role'] == 'system' %}{{ '[/SYSTEM_PROMPT]' }}{% elif message['role'] == 'user' %}"
    "{{ '[/INST]' }}{% else %}{{ eos_token }}{% endif %}{% endfor %}")


def byte_level_tokenizer(special: tuple[str, ...], model_max_length: int = 512, **named):
    """A byte-level BPE tokenizer (the kind of Mistral's Tekken and Llama 3's): the `special` tokens first, then the
    256 byte symbols, with merges for ' a'..' z'; `named`: bos_token, eos_token, pad_token, unk_token."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    table = bytes_to_unicode()
    vocab = {s: i for i, s in enumerate(special)}
    for b in range(256):
        vocab.setdefault(table[b], len(vocab))
    merges = [(table[ord(" ")], c) for c in "abcdefghijklmnopqrstuvwxyz"]
    for a, b in merges:
        vocab[a + b] = len(vocab)
    core = Tokenizer(models.BPE(vocab=vocab, merges=merges))
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    core.decoder = decoders.ByteLevel()
    tok = PreTrainedTokenizerFast(tokenizer_object=core, model_max_length=model_max_length, **named)
    tok.add_special_tokens({"additional_special_tokens": [t for t in special if t not in named.values()]})
    return tok


def mistral_tokenizer(model_max_length: int = 512):
    """Mistral's special tokens and chat template over a byte-level BPE (the Tekken tokenizer's kind)."""
    tok = byte_level_tokenizer(MISTRAL_SPECIAL, model_max_length, bos_token="<s>", eos_token="</s>",
                               unk_token="<unk>", pad_token="<pad>")
    tok.chat_template = MISTRAL_CHAT_TEMPLATE
    return tok


def build_tiny_flux2_dev(wide: bool = False):
    """Flux2Pipeline over seeded tiny components (FLUX.2 [dev]'s layout: a guidance input, no negative prompt).
    `wide`: a transformer 4 heads of 32 wide (128) instead of 2 of 16 (32), which sdnq's int8 skips as too narrow."""
    from diffusers import AutoencoderKLFlux2, FlowMatchEulerDiscreteScheduler, Flux2Pipeline, Flux2Transformer2DModel
    from transformers import Mistral3Config, Mistral3ForConditionalGeneration

    tokenizer = mistral_tokenizer()
    torch.manual_seed(0)
    transformer = Flux2Transformer2DModel(
        patch_size=1, in_channels=4, num_layers=1, num_single_layers=1, attention_head_dim=32 if wide else 16,
        num_attention_heads=4 if wide else 2, joint_attention_dim=MISTRAL_WIDTH * OUT_LAYERS,
        timestep_guidance_channels=256, axes_dims_rope=[8, 8, 8, 8] if wide else [4, 4, 4, 4], guidance_embeds=True)
    special = tokenizer.convert_tokens_to_ids
    config = Mistral3Config(
        text_config={"model_type": "mistral", "vocab_size": len(tokenizer), "hidden_size": MISTRAL_WIDTH,
                     "intermediate_size": 37, "max_position_embeddings": 512, "num_attention_heads": 4,
                     "num_hidden_layers": MISTRAL_LAYERS, "num_key_value_heads": 2, "rms_norm_eps": 1e-05,
                     "rope_theta": 1000000000.0, "sliding_window": None, "bos_token_id": special("<s>"),
                     "eos_token_id": special("</s>"), "pad_token_id": special("<pad>")},
        vision_config={"model_type": "pixtral", "hidden_size": 16, "num_hidden_layers": 1, "num_attention_heads": 4,
                       "intermediate_size": 37, "image_size": 30, "patch_size": 6, "num_channels": 3},
        bos_token_id=special("<s>"), eos_token_id=special("</s>"), pad_token_id=special("<pad>"),
        image_seq_length=4, vision_feature_layer=-1, image_token_index=special("[IMG]"))
    torch.manual_seed(0)
    text_encoder = Mistral3ForConditionalGeneration(config)
    torch.manual_seed(0)
    vae = AutoencoderKLFlux2(
        sample_size=32, in_channels=3, out_channels=3, down_block_types=("DownEncoderBlock2D",),
        up_block_types=("UpDecoderBlock2D",), block_out_channels=(4,), layers_per_block=1, latent_channels=1,
        norm_num_groups=1, use_quant_conv=False, use_post_quant_conv=False)
    return Flux2Pipeline(scheduler=FlowMatchEulerDiscreteScheduler(), vae=vae, text_encoder=text_encoder,
                         tokenizer=tokenizer, transformer=transformer)
