"""Real-size Stable Diffusion folders with seeded random weights, for the host-memory benchmark.

`build("sd15" | "sdxl", dest)` writes an ordinary diffusers folder whose UNet, VAE and text encoders
have the real architectures (lowvram_gen/configs) and fp16 weights, as the published checkpoints
store them: SD 1.5 is about 2.1 GB of safetensors, SDXL about 6.9 GB. The weights are random
(normal, std 0.02; norms at one, biases at zero), so the images are noise, but every byte that
loading, quantizing and running moves is the real amount. The tokenizer is the embedded tiny model's
(built offline); its ids fit the real vocabulary.

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
ARCHS = ("sd15", "sdxl")
SCHEDULERS = {  # the published models' own schedulers and settings (as models/tiny.py builds them)
    "sd15": ("PNDMScheduler", dict(beta_start=0.00085, beta_end=0.012, beta_schedule="scaled_linear",
                                   num_train_timesteps=1000, skip_prk_steps=True, set_alpha_to_one=False,
                                   steps_offset=1)),
    "sdxl": ("EulerDiscreteScheduler", dict(beta_start=0.00085, beta_end=0.012, beta_schedule="scaled_linear",
                                            num_train_timesteps=1000, steps_offset=1, timestep_spacing="leading",
                                            interpolation_type="linear", prediction_type="epsilon")),
}


def folder(arch: str) -> Path:
    root = os.environ.get("LOWVRAM_GEN_BENCH") or Path.home() / ".cache" / "lowvram-gen" / "bench"
    return Path(root) / f"{arch}-realsize-fp16"


def _component(library: str, class_name: str, config: dict, seed: int):
    """The component on the CPU in float16 with seeded random weights, never held in float32."""
    import importlib

    import torch

    cls = getattr(importlib.import_module(library), class_name)
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.float16)
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
                b.copy_(torch.arange(b.shape[-1]).expand_as(b))
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
        model = _component(spec[0], spec[1], config, seed)
        model.save_pretrained(tmp / name, safe_serialization=True)
        parts[name] = spec
        del model
        print(f"built {arch}/{name}", file=sys.stderr, flush=True)
    sched_cls, sched_kw = SCHEDULERS[arch]
    getattr(diffusers, sched_cls)(**sched_kw).save_pretrained(tmp / "scheduler")
    parts["scheduler"] = ["diffusers", sched_cls]
    for name in [n for n in index if n.startswith("tokenizer")]:
        _tokenizer().save_pretrained(tmp / name)
        parts[name] = ["transformers", "CLIPTokenizer"]
    extra = {"requires_safety_checker": False} if arch == "sd15" else {"force_zeros_for_empty_prompt": True}
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
