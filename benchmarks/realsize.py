"""Real-size Stable Diffusion folders with seeded random weights, for the host-memory benchmark.

`build("sd15" | "sdxl" | "flux", dest)` writes an ordinary diffusers folder whose UNet, VAE and text encoders
have the real architectures (lowvram_gen/configs) and fp16 weights, as the published checkpoints
store them: SD 1.5 is about 2.1 GB of safetensors, SDXL about 6.9 GB. `flux` is FLUX.1-dev in bfloat16
(as black-forest-labs store it) with its transformer cut to FLUX_LAYERS (2 double-stream + 4 single-stream
blocks of the real width, 1.31 B of 11.9 B parameters, 2.6 GB: the full one would not fit this machine's RAM) and
everything else real: CLIP-L, T5-XXL (4.76 B parameters, 9.5 GB), the VAE and the scheduler config; about
12 GB of safetensors. The weights are random
(normal, std 0.02; norms at one, biases at zero), so the images are noise, but every byte that
loading, quantizing and running moves is the real amount. The tokenizer is the embedded tiny model's
(built offline); its ids fit the real vocabulary. Flux's T5 tokenizer is tests/tiny_transformers.py's
offline one (T5's special tokens and single characters); FluxPipeline pads to 512 tokens whatever the
prompt, so T5 runs its real sequence length.

Built once into `folder(arch)` ($LOWVRAM_GEN_BENCH or ~/.cache/lowvram-gen/bench) and reused; each
component is made on the meta device and filled in place, so building SDXL holds one fp16 copy.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path

CONFIGS = Path(__file__).resolve().parents[1] / "lowvram_gen" / "configs"
ARCHS = ("sd15", "sdxl", "flux")
# Flux's transformer at reduced depth (config overrides written into the folder), as calibrate_memory.py cuts
# it; the planner profiles the folder's config, so its estimate is for this depth too.
FLUX_LAYERS = {"num_layers": 2, "num_single_layers": 4}
DTYPES = {"sd15": "float16", "sdxl": "float16", "flux": "bfloat16"}
SCHEDULERS = {  # the published models' own schedulers and settings (as models/tiny.py builds them)
    "sd15": ("PNDMScheduler", dict(beta_start=0.00085, beta_end=0.012, beta_schedule="scaled_linear",
                                   num_train_timesteps=1000, skip_prk_steps=True, set_alpha_to_one=False,
                                   steps_offset=1)),
    "sdxl": ("EulerDiscreteScheduler", dict(beta_start=0.00085, beta_end=0.012, beta_schedule="scaled_linear",
                                            num_train_timesteps=1000, steps_offset=1, timestep_spacing="leading",
                                            interpolation_type="linear", prediction_type="epsilon")),
    "flux": ("FlowMatchEulerDiscreteScheduler", dict(num_train_timesteps=1000, shift=3.0, use_dynamic_shifting=True,
                                                     base_shift=0.5, max_shift=1.15, base_image_seq_len=256,
                                                     max_image_seq_len=4096)),  # FLUX.1-dev's
}


def folder(arch: str) -> Path:
    root = os.environ.get("LOWVRAM_GEN_BENCH") or Path.home() / ".cache" / "lowvram-gen" / "bench"
    if arch == "flux":
        blocks = f"{FLUX_LAYERS['num_layers']}d{FLUX_LAYERS['num_single_layers']}s"
        return Path(root) / f"flux-{blocks}-realsize-bf16"
    return Path(root) / f"{arch}-realsize-fp16"


def t5_tokenizer():
    """tests/tiny_transformers.py's offline T5 tokenizer (T5's <pad> 0, </s> 1, <unk> 2 and a Unigram
    vocabulary of single characters), copied so that building needs nothing from tests/."""
    import string

    from transformers import T5TokenizerFast

    chars = string.ascii_lowercase + string.digits + string.punctuation
    vocab = [("<pad>", 0.0), ("</s>", 0.0), ("<unk>", 0.0), ("\u2581", -2.0)]
    vocab += [("\u2581" + c, -3.0) for c in chars] + [(c, -4.0) for c in chars]
    return T5TokenizerFast(vocab=vocab, extra_ids=0, model_max_length=512)


def _component(library: str, class_name: str, config: dict, seed: int, dtype: str = "float16"):
    """The component on the CPU in `dtype` (16-bit) with seeded random weights, never held in float32."""
    import importlib

    import torch

    cls = getattr(importlib.import_module(library), class_name)
    previous = torch.get_default_dtype()
    torch.set_default_dtype(getattr(torch, dtype))
    try:
        with torch.device("meta"):
            if library == "diffusers":
                model = cls.from_config(config)
            else:
                model = cls(cls.config_class.from_dict(config))
    finally:
        torch.set_default_dtype(previous)
    model = model.to_empty(device="cpu")
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("bias"):
                p.zero_()
            elif p.ndim == 1:  # norm scales
                p.fill_(1.0)
            else:
                p.normal_(0.0, 0.02, generator=g)
        for name, b in model.named_buffers():  # position ids and the like: as the config builds them
            if b.dtype in (torch.int64, torch.int32):
                if b.dim():
                    b.copy_(torch.arange(b.shape[-1]).expand_as(b))
                else:  # a batch norm's num_batches_tracked (Flux.2's VAE)
                    b.zero_()
            elif name.endswith("running_var"):  # a batch norm's statistics, left unset by to_empty
                b.fill_(1.0)
            elif name.endswith("running_mean"):
                b.zero_()
        # tied weights as a published checkpoint has them (T5's encoder.embed_tokens is its `shared`): built
        # on the meta device they come out as two tensors, filled with different values, and transformers then
        # refuses to tie them at load and keeps both (0.25 GB more of T5-XXL than the real model holds)
        tied = getattr(model, "_tied_weights_keys", None)
        if isinstance(tied, dict):
            params = dict(model.named_parameters(remove_duplicate=False))
            for target, source in tied.items():
                if target in params and source in params and params[target] is not params[source]:
                    params[target].copy_(params[source])
    if library == "transformers":  # to_empty gave tied tables (T5's shared / embed_tokens) a copy each: one again
        model.tie_weights()
    return model.eval()


def build(arch: str, dest: Path | None = None) -> Path:
    """The real-size random-weight folder of `arch`, built if it is not there yet."""
    if arch not in ARCHS:
        raise ValueError(f"arch {arch!r}: use one of {', '.join(ARCHS)}")
    dest = Path(dest or folder(arch))
    if (dest / "model_index.json").is_file():
        return dest
    import diffusers

    sys.path.insert(0, str(CONFIGS.parents[1]))
    from lowvram_gen.models.tiny import _tokenizer

    tmp = dest.with_name(dest.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    index = json.loads((CONFIGS / arch / "model_index.json").read_text())
    parts = {}
    for seed, (name, spec) in enumerate(sorted(index.items())):
        if name.startswith("_") or not isinstance(spec, list) or not (CONFIGS / arch / name / "config.json").is_file():
            continue
        config = json.loads((CONFIGS / arch / name / "config.json").read_text())
        if arch == "flux" and name == "transformer":
            config.update(FLUX_LAYERS)
        if arch == "flux" and name.startswith("text_encoder"):
            config["torch_dtype"] = DTYPES[arch]
        model = _component(spec[0], spec[1], config, seed, DTYPES[arch])
        model.save_pretrained(tmp / name, safe_serialization=True, max_shard_size="5GB")
        parts[name] = spec
        del model
        print(f"built {arch}/{name}", file=sys.stderr, flush=True)
    sched_cls, sched_kw = SCHEDULERS[arch]
    getattr(diffusers, sched_cls)(**sched_kw).save_pretrained(tmp / "scheduler")
    parts["scheduler"] = ["diffusers", sched_cls]
    for name in [n for n in index if n.startswith("tokenizer")]:
        if index[name][1].startswith("T5"):
            t5_tokenizer().save_pretrained(tmp / name)
            parts[name] = ["transformers", "T5TokenizerFast"]
        else:
            _tokenizer().save_pretrained(tmp / name)
            parts[name] = ["transformers", "CLIPTokenizer"]
    extra = {"requires_safety_checker": False} if arch == "sd15" else {}
    if arch == "sdxl":
        extra = {"force_zeros_for_empty_prompt": True}
    if arch == "sd15":
        parts.update(safety_checker=[None, None], feature_extractor=[None, None])
    model_index = {"_class_name": index["_class_name"], "_diffusers_version": diffusers.__version__, **extra, **parts}
    (tmp / "model_index.json").write_text(json.dumps(model_index, indent=2))
    os.rename(tmp, dest)
    return dest


def stored_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in Path(path).rglob("*.safetensors"))


if __name__ == "__main__":
    for a in sys.argv[1:] or ARCHS:
        p = build(a)
        print(f"{a}: {p} ({stored_bytes(p) / 1e9:.2f} GB of safetensors)")
