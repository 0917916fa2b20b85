"""Scaled real folders of the issue-30 families (Z-Image, Flux.2 Klein, Qwen-Image, Chroma, Lumina 2, CogView4, SANA,
HiDream, Flux.2 dev) for the host-memory benchmark.

`build(key)` writes an ordinary diffusers folder from the family's shipped configs (lowvram_gen/configs/KEY) with
seeded random bfloat16 weights (as the published repos store them), every component at its real width but fewer
blocks, as realsize.py cuts FLUX.1 (the whole models are 12-41 GB; this machine's agents share 24 GiB): SCALE gives
the overrides. The planner profiles the folder's own configs, so its estimate is for exactly what was built, and
host_peaks.py compares the two. The tokenizer is tests/tiny_tokenizers.py's offline Qwen2 one (its ids fit the real
vocabulary; the pipelines pad or cut the prompt to their own lengths), the scheduler the family's shipped config.

Flux2KleinPipeline reads the hidden states of its text encoder's layers 9, 18 and 27, so Klein's Qwen3 keeps 28
layers and has its MLP width cut to 1/16 instead (the attention and the 2560-wide stream it hands on stay real).
"""

from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path

CONFIGS = Path(__file__).resolve().parents[1] / "lowvram_gen" / "configs"
TESTS = Path(__file__).resolve().parents[1] / "tests"

# component -> config overrides; a text encoder's are applied to its text_config too where it has one
SCALE = {
    "z-image": {"transformer": {"n_layers": 2, "n_refiner_layers": 1},
                "text_encoder": {"num_hidden_layers": 4}},
    "flux2-klein": {"transformer": {"num_layers": 1, "num_single_layers": 1},
                    "text_encoder": {"num_hidden_layers": 28, "intermediate_size": 608}},
    "qwen-image": {"transformer": {"num_layers": 1},
                   "text_encoder": {"num_hidden_layers": 1, "vision_config": {"depth": 2}}},
    "chroma": {"transformer": {"num_layers": 1, "num_single_layers": 1}, "text_encoder": {"num_layers": 2}},
    "lumina2": {"transformer": {"num_layers": 1, "num_refiner_layers": 1},
                "text_encoder": {"num_hidden_layers": 2}},
    "cogview4": {"transformer": {"num_layers": 1}, "text_encoder": {"num_hidden_layers": 1}},
    "sana": {"transformer": {"num_layers": 1}, "text_encoder": {"num_hidden_layers": 2}},
    # HiDream at half width: the transformer 10 of 20 heads (1280 wide), 1 + 1 blocks (each with its mixture-of-experts
    # feed-forward), T5 and Llama 2048 wide (caption_channels follows) at 2 layers, the CLIPs at 2 layers. The
    # transformer reads one Llama layer's hidden states per block (llama_layers), so the Llama keeps as many layers as
    # it has blocks. Its pipeline renders every size at 1024 x 1024 (CFG on: two images a step, and the decode at that
    # size): at full width the run's planned peak was 7.9 GiB, at the 8 GiB a run here may take
    "hidream": {"transformer": {"num_layers": 1, "num_single_layers": 1, "llama_layers": [0, 1],
                                "caption_channels": [2048, 2048], "num_attention_heads": 10},
                "text_encoder": {"num_hidden_layers": 2}, "text_encoder_2": {"num_hidden_layers": 2},
                "text_encoder_3": {"num_layers": 2, "d_model": 2048, "num_heads": 32, "d_ff": 5120},
                "text_encoder_4": {"num_hidden_layers": 2, "hidden_size": 2048, "num_attention_heads": 16,
                                   "num_key_value_heads": 4, "intermediate_size": 7168}},
    # Flux.2 dev at half width (the whole model is 32B + 24B; 1/2 keeps the run near 5 GiB, under the 8 GiB a run here
    # may take): the transformer 24 of 48 heads (3072 wide), 1 + 1 blocks; Mistral 2560 of 5120 wide, its MLP at
    # 1/16 (2048), 30 of 40 layers (Flux2Pipeline reads the hidden states of layers 10, 20 and 30), one vision layer
    "flux2-dev": {"transformer": {"num_layers": 1, "num_single_layers": 1, "num_attention_heads": 24,
                                  "joint_attention_dim": 3 * 2560},
                  "text_encoder": {"text_config": {"hidden_size": 2560, "num_attention_heads": 16,
                                                   "num_key_value_heads": 4, "intermediate_size": 2048,
                                                   "num_hidden_layers": 30},
                                   "vision_config": {"num_hidden_layers": 1}}},
}
# the offline tokenizer each family's folder gets (tests/): its ids must fit the real vocabulary
TOKENIZERS = {"chroma": "t5", "lumina2": "gemma", "cogview4": "glm", "sana": "gemma", "hidream": "hidream",
              "flux2-dev": "mistral"}
KEYS = tuple(SCALE)


def folder(key: str) -> Path:
    root = os.environ.get("LOWVRAM_GEN_BENCH") or Path.home() / ".cache" / "lowvram-gen" / "bench"
    return Path(root) / f"{key}-scaled-bf16"


def _config(key: str, name: str) -> dict:
    config = json.loads((CONFIGS / key / name / "config.json").read_text())
    for field, value in SCALE[key].get(name, {}).items():
        if isinstance(value, dict):
            config[field] = {**config.get(field, {}), **value}
        else:
            config[field] = value
            if isinstance(config.get("text_config"), dict):
                config["text_config"][field] = value
    if name.startswith("text_encoder"):
        config["torch_dtype"] = "bfloat16"
    return config


def _tokenizers(kind: str) -> dict:
    """{folder name: tokenizer} of a family's folder, built offline as its tests/tiny_*.py builds them; `kind`: a
    TOKENIZERS value ("qwen2" where the family has none there)."""
    from tiny_flux2_dev import byte_level_tokenizer, mistral_tokenizer
    from tiny_tokenizers import gemma_tokenizer, qwen2_tokenizer
    from tiny_transformers import t5_tokenizer

    if kind == "hidream":  # CLIP's two, T5's and Llama 3's byte-level BPE (tests/tiny_hidream.py)
        from lowvram_gen.models.tiny import _tokenizer

        llama = byte_level_tokenizer(("<|begin_of_text|>", "<|end_of_text|>", "<|eot_id|>"),
                                     bos_token="<|begin_of_text|>", eos_token="<|end_of_text|>",
                                     pad_token="<|end_of_text|>", unk_token=None)
        clip = _tokenizer()
        clip.model_max_length = 248  # HiDream's CLIPs take 248 positions; the pipeline pads them to 128
        return {"tokenizer": clip, "tokenizer_2": clip, "tokenizer_3": t5_tokenizer(), "tokenizer_4": llama}
    if kind == "mistral":  # Flux.2 dev's chat template over a byte-level BPE (tests/tiny_flux2_dev.py)
        return {"tokenizer": mistral_tokenizer()}
    if kind == "t5":
        return {"tokenizer": t5_tokenizer()}
    if kind == "glm":  # CogView4's: byte-level, GLM's specials first (tests/tiny_cogview4.py)
        from tokenizers.processors import TemplateProcessing

        tokenizer = byte_level_tokenizer(("<|endoftext|>", "[gMASK]", "<sop>"), eos_token="<|endoftext|>",
                                         pad_token="<|endoftext|>")
        # GLM-4's tokenizer starts every text with [gMASK]<sop>: without them the pipeline's empty negative prompt
        # is zero tokens, which the encoder cannot reshape
        ids = [(t, tokenizer.convert_tokens_to_ids(t)) for t in ("[gMASK]", "<sop>")]
        tokenizer.backend_tokenizer.post_processor = TemplateProcessing(single="[gMASK] <sop> $A", special_tokens=ids)
        return {"tokenizer": tokenizer}
    return {"tokenizer": gemma_tokenizer() if kind == "gemma" else qwen2_tokenizer()}


def build(key: str, dest: Path | None = None) -> Path:
    """The scaled folder of `key`, built if it is not there yet."""
    if key not in SCALE:
        raise ValueError(f"family {key!r}: use one of {', '.join(KEYS)}")
    dest = Path(dest or folder(key))
    if (dest / "model_index.json").is_file():
        return dest
    import diffusers

    sys.path.insert(0, str(TESTS))
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from realsize import _component

    tmp = dest.with_name(dest.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    index = json.loads((CONFIGS / key / "model_index.json").read_text())
    parts = {}
    for seed, (name, spec) in enumerate(sorted(index.items())):
        if name.startswith("_") or not isinstance(spec, list) or not (CONFIGS / key / name / "config.json").is_file():
            continue
        model = _component(spec[0], spec[1], _config(key, name), seed, "bfloat16")
        if _config(key, name).get("tie_word_embeddings") and hasattr(model, "lm_head"):
            # one tensor, stored once, as Qwen3's published files have it (built apart, the file held both: 2.6
            # bytes a parameter, which the planner does not take for a bf16 file it can keep mapped)
            model.lm_head.weight = model.get_input_embeddings().weight
        model.save_pretrained(tmp / name, safe_serialization=True, max_shard_size="5GB")
        parts[name] = spec
        print(f"built {key}/{name}: {sum(p.numel() for p in model.parameters()) / 1e9:.2f} B parameters",
              file=sys.stderr, flush=True)
        del model
    scheduler = json.loads((CONFIGS / key / "scheduler" / "scheduler_config.json").read_text())
    getattr(diffusers, scheduler["_class_name"]).from_config(scheduler).save_pretrained(tmp / "scheduler")
    parts["scheduler"] = ["diffusers", scheduler["_class_name"]]
    for name, tokenizer in _tokenizers(TOKENIZERS.get(key, "qwen2")).items():
        tokenizer.save_pretrained(tmp / name)
        parts[name] = ["transformers", type(tokenizer).__name__]
    extra = {k: v for k, v in index.items() if not k.startswith("_") and not isinstance(v, list)}
    model_index = {"_class_name": index["_class_name"], "_diffusers_version": diffusers.__version__, **extra, **parts}
    (tmp / "model_index.json").write_text(json.dumps(model_index, indent=2))
    os.rename(tmp, dest)
    return dest


if __name__ == "__main__":
    from realsize import stored_bytes

    for k in sys.argv[1:] or KEYS:
        p = build(k)
        print(f"{k}: {p} ({stored_bytes(p) / 1e9:.2f} GB of safetensors)")
