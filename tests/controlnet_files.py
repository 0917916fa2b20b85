"""Test utility: tiny ControlNets for the tiny models, as folders and as single files people download.

`ControlNetModel.from_unet` copies the UNet's down path; its zero convolutions (the residual outputs and the
conditioning embedding's last conv) start at zero, which would make any ControlNet a no-op. Here they get
seeded random values, so a ControlNet changes the image and a wrong one would show: the embedded
`tiny-controlnet`'s way (models/tiny.py `seeded_controlnet`). For `tiny`, a test can take that one
(`models.controlnet.resolve_controlnet("tiny-controlnet").path`) instead of building its own.

Files: a diffusers folder (`save_pretrained`), a single `.safetensors` in diffusers' key layout (as
`diffusers_xl_canny_mid.safetensors` is), and a `.pth` in the original layout with `control_model.` keys (as
`control_v11p_sd15_canny.pth` is: input_blocks, zero_convs, input_hint_block, middle_block_out), the inverse of
diffusers' convert_controlnet_checkpoint, derived from it as tests/ldm_layout.py derives the UNet's.
"""

from __future__ import annotations

from pathlib import Path

from ldm_layout import _resnet  # tests/ldm_layout.py: diffusers resnet names -> LDM ResBlock names


def build(unet, seed: int = 0, scale: float = 0.05):
    """A ControlNet for `unet` whose zero convolutions hold seeded random values, made as the embedded
    `tiny-controlnet` is (models/tiny.py): build(tiny's UNet, seed=1) is that one."""
    from lowvram_gen.models.tiny import seeded_controlnet

    return seeded_controlnet(unet, seed, scale)


def save_folder(cn, folder: Path) -> Path:
    cn.save_pretrained(folder, safe_serialization=True)
    return folder


def save_safetensors(cn, path: Path) -> Path:
    from safetensors.torch import save_file

    save_file({k: v.contiguous() for k, v in cn.state_dict().items()}, str(path))
    return path


def to_ldm(cn) -> dict:
    """The ControlNet's state dict in the original (ControlNet 1.1 .pth) layout, `control_model.` prefixed."""
    lpb = cn.config.layers_per_block
    fixed = {"conv_in": "input_blocks.0.0", "time_embedding.linear_1": "time_embed.0",
             "time_embedding.linear_2": "time_embed.2", "controlnet_cond_embedding.conv_in": "input_hint_block.0",
             "controlnet_cond_embedding.conv_out": "input_hint_block.14", "controlnet_mid_block": "middle_block_out.0",
             "add_embedding.linear_1": "label_emb.0.0", "add_embedding.linear_2": "label_emb.0.2"}  # SDXL's
    out = {}
    for key, value in cn.state_dict().items():
        parts = key.split(".")
        prefix, _, leaf = key.rpartition(".")
        new = None
        if prefix in fixed:
            new = f"{fixed[prefix]}.{leaf}"
        elif parts[0] == "down_blocks":
            b, kind, j, rest = int(parts[1]), parts[2], int(parts[3]), ".".join(parts[4:])
            if kind == "resnets":
                new = f"input_blocks.{1 + b * (lpb + 1) + j}.0.{_resnet(rest)}"
            elif kind == "attentions":
                new = f"input_blocks.{1 + b * (lpb + 1) + j}.1.{rest}"
            elif kind == "downsamplers":
                new = f"input_blocks.{1 + b * (lpb + 1) + lpb}.0.op.{rest.split('.', 1)[1]}"
        elif parts[0] == "mid_block":
            kind, j, rest = parts[1], int(parts[2]), ".".join(parts[3:])
            new = f"middle_block.{2 * j}.{_resnet(rest)}" if kind == "resnets" else f"middle_block.1.{rest}"
        elif parts[0] == "controlnet_down_blocks":
            new = f"zero_convs.{parts[1]}.0.{leaf}"
        elif parts[0] == "controlnet_cond_embedding" and parts[1] == "blocks":
            new = f"input_hint_block.{2 * (int(parts[2]) + 1)}.{leaf}"
        if new is None:
            raise KeyError(f"no original-layout name for ControlNet key {key!r}")
        out["control_model." + new] = value.contiguous()
    return out


def save_ldm_pth(cn, path: Path) -> Path:
    import torch

    torch.save(to_ldm(cn), str(path))
    return path


def in_hub_cache(folder: Path, repo: str, cache: Path, monkeypatch) -> Path:
    """`folder` as the snapshot of `repo` in a Hugging Face cache at `cache` (refs/main pointing at it), that cache
    made huggingface_hub's, offline; the snapshot's path."""
    import shutil

    import huggingface_hub.constants as hf_constants

    snapshot = cache / ("models--" + repo.replace("/", "--")) / "snapshots" / ("0" * 40)
    shutil.copytree(folder, snapshot)
    (snapshot.parents[1] / "refs").mkdir()
    (snapshot.parents[1] / "refs" / "main").write_text("0" * 40)
    monkeypatch.setattr(hf_constants, "HF_HUB_CACHE", str(cache))
    monkeypatch.setattr(hf_constants, "HF_HUB_OFFLINE", True)
    return snapshot


def out_of_memory_once(net) -> list:
    """Simulated OOM (the ladder tests' way): `net`'s next forward raises torch.OutOfMemoryError, once; the list
    it returns gets an item when it has."""
    import torch

    failed: list = []

    def once(module, args, kwargs):
        if not failed:
            failed.append(1)
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB (simulated)")

    net.register_forward_pre_hook(once, with_kwargs=True)
    return failed


def random_image(path, seed: int = 0, side: int = 64) -> str:
    """A seeded noise image of `side` px saved at `path` (a control, init or reference image); its path."""
    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(seed)
    Image.fromarray((rng.random((side, side, 3)) * 255).astype("uint8")).save(path)
    return str(path)


def steps_down_once(monkeypatch, first, second):
    """Simulated OOM (see out_of_memory_once): `first` (a request) runs at highvram and loads the job's ControlNet;
    its forward then raises torch.OutOfMemoryError once in `second`, which must finish one rung down (medvram) with
    the same ControlNet object, loaded once. (the session, `second`'s result)."""
    from lowvram_gen.models import controlnet as models
    from lowvram_gen.session import Session

    calls = []
    real = models.load_controlnet
    monkeypatch.setattr(models, "load_controlnet", lambda *a, **k: calls.append(1) or real(*a, **k))
    session = Session(preset="highvram")
    session.generate(first)
    net = session.model.pipe.controlnet0
    failed = out_of_memory_once(net)
    result = session.generate(second)
    assert failed and [(a["preset"], a["stage"], a["outcome"]) for a in result.attempts][:2] == [
        ("highvram", "denoise", "oom"), ("medvram", "denoise", "ok")]
    assert session.model.pipe.controlnet0 is net and calls == [1]
    return session, result
