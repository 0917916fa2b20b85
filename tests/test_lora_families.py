"""LoRA on the issue-30 families (Qwen-Image, Z-Image, Flux.2 Klein, SANA, Chroma, Lumina 2): each family's tiny
folder run with a LoRA file made here (seeded random weights on the tiny transformer's real module names,
tests/tiny_loras.py) in each key layout its users download and diffusers' loader reads, compared with plain
diffusers' own `load_lora_weights` at the same weight; the LoRA changes the image, weight 0 is no LoRA, and a
simulated out-of-memory steps down without loading the LoRA again. Table-driven: a family added to `FAMILIES`
(with its builder, pipeline, call and layouts) gets every test. Seeded random weights: the images are noise.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Callable

import numpy as np
import pytest
import torch
from ladder_checks import out_of_memory_steps_down
from lora_files import save
from tiny_dit import BUILDERS
from tiny_flux2 import build_tiny_flux2_klein
from tiny_loras import lora_state
from tiny_qwen import build_tiny_qwen_image
from tiny_transformers import cli, pixels
from tiny_zimage import build_tiny_zimage

from lowvram_gen import GenerationRequest, families
from lowvram_gen.networks import lora as lora_mod
from lowvram_gen.session import Session

MAX_DIFF = 2  # of 255: "equal to plain diffusers"
WEIGHT = 0.7


@dataclass(frozen=True)
class Case:
    build: Callable
    pipeline: str
    layouts: tuple[str, ...]  # tests/tiny_loras.py's layouts diffusers' loader of the family reads
    negative: str | None = "fog"  # the family takes a negative prompt (Flux.2 Klein's call has none)
    # what plain diffusers is called with for `--cfg 4` (and the negative prompt)
    call: dict = field(default_factory=lambda: {"guidance_scale": 4.0})


FAMILIES = {
    # diffusers' Qwen-Image converter reads kohya's lora_unet_ names and ComfyUI's diffusion_model. prefix
    "qwen-image": Case(build_tiny_qwen_image, "QwenImagePipeline", ("diffusers", "kohya", "comfy"),
                       call={"true_cfg_scale": 4.0}),
    "z-image": Case(build_tiny_zimage, "ZImagePipeline", ("diffusers", "kohya", "comfy")),
    # Flux.2's converter reads sd-scripts' names on BFL's layout (fused qkv split into to_q/to_k/to_v)
    "flux2-klein": Case(build_tiny_flux2_klein, "Flux2KleinPipeline", ("diffusers", "kohya-bfl"), negative=None),
    "sana": Case(BUILDERS["sana"], "SanaPipeline", ("diffusers",)),  # diffusers has no SANA converter
    # ChromaPipeline takes FLUX.1's loader (FluxLoraLoaderMixin) and its sd-scripts converter
    "chroma": Case(BUILDERS["chroma"], "ChromaPipeline", ("diffusers", "kohya-bfl-double")),
    # diffusers' Lumina 2 converter splits qkv at the real model's widths: a tiny model reads diffusers keys only
    "lumina2": Case(BUILDERS["lumina2"], "Lumina2Pipeline", ("diffusers",)),
}


@pytest.fixture(scope="module", params=list(FAMILIES))
def family(request, tmp_path_factory):
    """(family key, its tiny folder, {layout: LoRA file}) with the LoRA files in a models root's Lora/ folder."""
    key = request.param
    case = FAMILIES[key]
    folder = tmp_path_factory.mktemp(f"tiny-{key}")
    pipe = case.build()
    pipe.save_pretrained(folder, safe_serialization=True)
    assert json.loads((folder / "model_index.json").read_text())["_class_name"] == case.pipeline
    root = tmp_path_factory.mktemp(f"models-{key}")
    loras = {layout: save(lora_state(pipe.transformer, layout, seed=i), root / "Lora" / f"{key}_{layout}.safetensors")
             for i, layout in enumerate(case.layouts)}
    return key, str(folder), root, loras


@pytest.fixture()
def models(family, monkeypatch):
    monkeypatch.setenv("LOWVRAM_GEN_MODELS", str(family[2]))
    return family


def plain(key: str, folder: str, lora=None, weight: float = WEIGHT, seed: int = 7) -> np.ndarray:
    """Plain diffusers' image: the folder's pipeline, the LoRA file through its own load_lora_weights at `weight`."""
    import diffusers

    case = FAMILIES[key]
    pipe = getattr(diffusers, case.pipeline).from_pretrained(folder)
    if lora is not None:
        pipe.load_lora_weights(str(lora), adapter_name="x")
        pipe.set_adapters(["x"], adapter_weights=[weight])
    extra = {"negative_prompt": case.negative} if case.negative else {}
    image = pipe(prompt="a castle", width=64, height=64, num_inference_steps=2, **case.call, **extra,
                 generator=torch.Generator().manual_seed(seed)).images[0]
    return np.asarray(image.convert("RGB"), dtype=int)


def request(key: str, folder: str, tmp_path, **kw) -> GenerationRequest:
    case = FAMILIES[key]
    base = dict(prompt="a castle", negative_prompt=case.negative or "", model=folder, width=64, height=64, steps=2,
                seed=7, cfg_scale=4.0, outdir=str(tmp_path))
    return GenerationRequest(**{**base, **kw}).validated()


def test_every_family_with_a_loader_is_in_the_table():
    """A family whose record says it takes LoRAs is tested here (the other issue-30 records are added with theirs)."""
    for key in FAMILIES:
        assert families.by_name(key).lora == "diffusers", key


def test_lora_from_the_cli_equals_plain_diffusers_in_each_layout(models, tmp_path, capsys):
    key, folder, _root, loras = models
    case = FAMILIES[key]
    for layout, path in loras.items():
        args = ["generate", "a castle", "--model", folder, "--width", "64", "--height", "64", "--steps", "2",
                "--seed", "7", "--cfg", "4", "--preset", "cpu", "--outdir", str(tmp_path / layout), "--json",
                "--lora", f"{path.stem}:{WEIGHT}"]
        code, out, err = cli(capsys, *args, *(["--negative", case.negative] if case.negative else []))
        assert code == 0, err
        result = json.loads(out)
        assert result["warnings"] == [], (layout, result["warnings"])
        ours = pixels(result["images"][0])
        assert np.abs(ours - plain(key, folder, path)).max() <= MAX_DIFF, layout


def test_the_lora_changes_the_image_and_weight_zero_is_none(models, tmp_path):
    key, folder, _root, loras = models
    path = loras["diffusers"]
    session = Session(preset="cpu")
    none = pixels(session.generate(request(key, folder, tmp_path)).images[0])
    tagged = pixels(session.generate(request(key, folder, tmp_path, prompt=f"a castle <lora:{path.stem}:1>"))
                    .images[0])
    zero = pixels(session.generate(request(key, folder, tmp_path, loras=(f"{path.stem}:0",))).images[0])
    after = pixels(session.generate(request(key, folder, tmp_path)).images[0])  # switched off for the next job
    assert np.abs(tagged - none).max() > 10
    assert np.abs(zero - none).max() <= 1
    assert np.array_equal(after, none)
    assert np.abs(none - plain(key, folder)).max() <= MAX_DIFF


def test_out_of_memory_steps_down_with_the_lora_kept(models, tmp_path, monkeypatch):
    """Simulated: the transformer runs out of memory in every step at highvram. The job finishes at medvram with the
    LoRA on, equal to the same job run without the fault, and the LoRA file is not loaded again for the retry."""
    key, folder, _root, loras = models
    path = loras["diffusers"]
    loads = []
    real_load = lora_mod._load
    monkeypatch.setattr(lora_mod, "_load", lambda pipe, p, name: loads.append(p) or real_load(pipe, p, name))
    result = out_of_memory_steps_down(lambda **kw: request(key, folder, tmp_path, loras=(f"{path.stem}:1",), **kw))
    assert result.warnings == []
    # one load for the warm-up job, one in the session the check compares with: none for the retry
    assert loads == [path, path]


def test_a_lora_of_other_shapes_is_one_sentence_naming_the_family(models, tmp_path, capfd):
    """A LoRA whose layers have the family's names but other widths (another model's): one sentence naming the
    family, no traceback."""
    key, folder, root, loras = models
    from safetensors.torch import load_file

    state = {k: torch.cat([v, v[:, :3]], dim=1) if k.endswith("lora_A.weight") else v
             for k, v in load_file(str(loras["diffusers"])).items()}
    save(state, root / "Lora" / "wider.safetensors")
    capfd.readouterr()
    # the file descriptor's stderr: diffusers' log handler holds the real one
    code, _out, err = cli(capfd, "generate", "a castle <lora:wider:1>", "--model", folder, "--width", "64",
                          "--height", "64", "--steps", "1", "--preset", "cpu", "--outdir", str(tmp_path))
    lines = err.strip().splitlines()
    assert code == 2, lines
    name = families.by_name(key).name
    assert lines[-1].startswith("error: LoRA wider.safetensors is for another base model than this "
                                f"{FAMILIES[key].pipeline} (not {name}?)"), lines[-1]
    (root / "Lora" / "wider.safetensors").unlink()
