"""LoRA on the issue-30 families (Qwen-Image, Qwen-Image-Edit(-Plus), Z-Image, Flux.2 Klein and dev, FLUX.1 Kontext,
SANA, Chroma, Lumina 2, HiDream, CogView4): each family's tiny folder run with a LoRA file made here (seeded random weights on the tiny transformer's real module names,
tests/tiny_loras.py) in each key layout its users download and diffusers' loader reads, compared with plain
diffusers' own `load_lora_weights` at the same weight; the LoRA changes the image, weight 0 is no LoRA, and a
simulated out-of-memory steps down without loading the LoRA again. Table-driven: a family added to `FAMILIES`
(with its builder, pipeline, call and layouts) gets every test; the editing models are run as `edit` with
reference images (made 64x64 in diffusers' modules for both sides, as tests/test_family_edit.py does). A layout
diffusers' loader does not convert for a family is refused in one sentence naming the family and the layout.
Seeded random weights: the images are noise.
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
from PIL import Image
from tiny_cogview4 import build_tiny_cogview4
from tiny_dit import BUILDERS
from tiny_edit import build_tiny_kontext, build_tiny_qwen_image_edit
from tiny_flux2 import build_tiny_flux2_klein
from tiny_flux2_dev import build_tiny_flux2_dev
from tiny_hidream import build_tiny_hidream
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
    refs: int = 0  # reference images: an editing model, run as `edit`
    side: int = 64  # the image's width and height (HiDream renders its native area only)
    refused: tuple[str, ...] = ()  # layouts its users meet that diffusers' loader does not convert for it


FAMILIES = {
    # diffusers' Qwen-Image converter reads kohya's lora_unet_ names and ComfyUI's diffusion_model. prefix
    "qwen-image": Case(build_tiny_qwen_image, "QwenImagePipeline", ("diffusers", "kohya", "comfy"),
                       call={"true_cfg_scale": 4.0}),
    # Qwen-Image-Edit's LoRAs are Qwen-Image's layouts (its pipeline has the same loader); a FLUX-style file is not
    "qwen-image-edit": Case(build_tiny_qwen_image_edit, "QwenImageEditPipeline", ("diffusers", "kohya", "comfy"),
                            call={"true_cfg_scale": 4.0}, refs=1, refused=("kohya-bfl-double",)),
    "qwen-image-edit-plus": Case(lambda: build_tiny_qwen_image_edit(plus=True), "QwenImageEditPlusPipeline",
                                 ("diffusers", "comfy"), call={"true_cfg_scale": 4.0}, refs=2),
    "z-image": Case(build_tiny_zimage, "ZImagePipeline", ("diffusers", "kohya", "comfy")),
    # Flux.2's converter reads sd-scripts' names on BFL's layout (fused qkv split into to_q/to_k/to_v)
    "flux2-klein": Case(build_tiny_flux2_klein, "Flux2KleinPipeline", ("diffusers", "kohya-bfl"), negative=None),
    # Flux.2 dev: also ai-toolkit's BFL layout and ComfyUI's diffusion_model. on diffusers' names; sd-scripts' names
    # on diffusers' modules are dropped by the converter
    "flux2-dev": Case(build_tiny_flux2_dev, "Flux2Pipeline", ("diffusers", "kohya-bfl", "ai-toolkit-bfl", "comfy"),
                      negative=None, refused=("kohya",)),
    # Kontext's LoRAs are FLUX.1's (FluxLoraLoaderMixin): diffusers' and sd-scripts' on BFL's layout (double blocks:
    # its converter splits a single block's linear1 at the real model's widths)
    "flux-kontext": Case(build_tiny_kontext, "FluxKontextPipeline", ("diffusers", "kohya-bfl-double"), negative=None,
                         call={"guidance_scale": 4.0, "max_area": 64 * 64}, refs=1, refused=("kohya", "comfy")),
    "sana": Case(BUILDERS["sana"], "SanaPipeline", ("diffusers",), refused=("kohya", "comfy")),  # no SANA converter
    # ChromaPipeline takes FLUX.1's loader (FluxLoraLoaderMixin) and its sd-scripts converter
    "chroma": Case(BUILDERS["chroma"], "ChromaPipeline", ("diffusers", "kohya-bfl-double")),
    # diffusers' Lumina 2 converter splits qkv at the real model's widths: a tiny model reads diffusers keys only
    "lumina2": Case(BUILDERS["lumina2"], "Lumina2Pipeline", ("diffusers",)),
    # HiDream's converter takes ComfyUI's / ai-toolkit's diffusion_model. prefix, not sd-scripts' names
    "hidream": Case(build_tiny_hidream, "HiDreamImagePipeline", ("diffusers", "comfy"), side=128, refused=("kohya",)),
    # CogView4's loader has no converter: diffusers' layout only
    "cogview4": Case(build_tiny_cogview4, "CogView4Pipeline", ("diffusers",), refused=("kohya", "comfy")),
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
             for i, layout in enumerate(case.layouts + case.refused)}
    return key, str(folder), root, loras


@pytest.fixture(scope="module")
def refs(tmp_path_factory) -> list[str]:
    """Two seeded reference images (64x64) for the editing models."""
    path = tmp_path_factory.mktemp("refs")
    rng = np.random.default_rng(0)
    for i in range(2):
        Image.fromarray(rng.integers(0, 255, (64, 64, 3), dtype=np.uint8)).save(path / f"ref{i}.png")
    return [str(path / f"ref{i}.png") for i in range(2)]


@pytest.fixture(autouse=True)
def small_refs(monkeypatch):
    """The edit pipelines' reference-image sizes made 64x64, for ours and plain diffusers' alike (see the module
    doc): at about 1024x1024 Qwen-Image-Edit's video-style VAE takes a minute a call on this CPU."""
    import diffusers.pipelines.flux.pipeline_flux_kontext as kontext
    import diffusers.pipelines.qwenimage.pipeline_qwenimage_edit as edit
    import diffusers.pipelines.qwenimage.pipeline_qwenimage_edit_plus as plus

    original = edit.calculate_dimensions
    monkeypatch.setattr(edit, "calculate_dimensions", lambda _area, ratio: original(64 * 64, ratio))
    for name in ("VAE_IMAGE_SIZE", "CONDITION_IMAGE_SIZE"):
        monkeypatch.setattr(plus, name, 64 * 64)
    monkeypatch.setattr(kontext, "PREFERRED_KONTEXT_RESOLUTIONS", [(64, 64)])


@pytest.fixture()
def models(family, monkeypatch):
    monkeypatch.setenv("LOWVRAM_GEN_MODELS", str(family[2]))
    return family


def plain(key: str, folder: str, refs: list, lora=None, weight: float = WEIGHT, seed: int = 7) -> np.ndarray:
    """Plain diffusers' image: the folder's pipeline, the LoRA file through its own load_lora_weights at `weight`."""
    import diffusers

    case = FAMILIES[key]
    pipe = getattr(diffusers, case.pipeline).from_pretrained(folder)
    if lora is not None:
        pipe.load_lora_weights(str(lora), adapter_name="x")
        pipe.set_adapters(["x"], adapter_weights=[weight])
    extra = {"negative_prompt": case.negative} if case.negative else {}
    if case.refs:
        images = [Image.open(p).convert("RGB") for p in refs[:case.refs]]
        extra["image"] = images[0] if len(images) == 1 else images
    image = pipe(prompt="a castle", width=case.side, height=case.side, num_inference_steps=2, **case.call, **extra,
                 generator=torch.Generator().manual_seed(seed)).images[0]
    return np.asarray(image.convert("RGB"), dtype=int)


def request(key: str, folder: str, tmp_path, refs: list, **kw) -> GenerationRequest:
    case = FAMILIES[key]
    base = dict(prompt="a castle", negative_prompt=case.negative or "", model=folder, width=case.side,
                height=case.side, steps=2, seed=7, cfg_scale=4.0, outdir=str(tmp_path),
                reference_images=tuple(refs[:case.refs]))
    return GenerationRequest(**{**base, **kw}).validated()


def command(key: str, folder: str, refs: list, *args) -> list[str]:
    """The CLI's words for the family's job: `edit` with its reference images for an editing model."""
    case = FAMILIES[key]
    side = str(case.side)
    words = ["edit", "a castle", *[w for p in refs[:case.refs] for w in ("--image", p)]] if case.refs else \
        ["generate", "a castle"]
    return [*words, "--model", folder, "--width", side, "--height", side, "--preset", "cpu", *args]


# families that take LoRAs tested elsewhere: SD3 and FLUX.1 (tests/test_lora.py), Flux.2 Klein 9B (Klein 4B's record);
# the video families' pipelines have diffusers' LoRA loader (their records say so), but a clip with LoRAs is refused in
# one sentence before loading (engines/video/checks.py; tests/test_video_engine.py): not built yet
ELSEWHERE = {"sd3", "flux", "flux2-klein-9b", families.GENERIC.key,
             *(r.key for r in families.all_families() if r.is_video)}


def test_every_family_with_a_loader_is_in_the_table():
    """A family whose record says it takes LoRAs is tested here, and only those."""
    for key in FAMILIES:
        assert families.by_name(key).lora == "diffusers", key
    takes = {r.key for r in families.all_families() if r.lora == "diffusers"}
    assert takes - ELSEWHERE == set(FAMILIES)


def test_lora_from_the_cli_equals_plain_diffusers_in_each_layout(models, refs, tmp_path, capsys):
    key, folder, _root, loras = models
    case = FAMILIES[key]
    for layout in case.layouts:
        path = loras[layout]
        args = command(key, folder, refs, "--steps", "2", "--seed", "7", "--cfg", "4", "--outdir",
                       str(tmp_path / layout), "--json", "--lora", f"{path.stem}:{WEIGHT}")
        code, out, err = cli(capsys, *args, *(["--negative", case.negative] if case.negative else []))
        assert code == 0, err
        result = json.loads(out)
        assert result["warnings"] == [], (layout, result["warnings"])
        ours = pixels(result["images"][0])
        assert np.abs(ours - plain(key, folder, refs, path)).max() <= MAX_DIFF, layout


def test_the_lora_changes_the_image_and_weight_zero_is_none(models, refs, tmp_path):
    key, folder, _root, loras = models
    path = loras["diffusers"]
    session = Session(preset="cpu")
    none = pixels(session.generate(request(key, folder, tmp_path, refs)).images[0])
    tagged = pixels(session.generate(request(key, folder, tmp_path, refs, prompt=f"a castle <lora:{path.stem}:1>"))
                    .images[0])
    zero = pixels(session.generate(request(key, folder, tmp_path, refs, loras=(f"{path.stem}:0",))).images[0])
    after = pixels(session.generate(request(key, folder, tmp_path, refs)).images[0])  # switched off for the next job
    assert np.abs(tagged - none).max() > 10
    assert np.abs(zero - none).max() <= 1
    assert np.array_equal(after, none)
    assert np.abs(none - plain(key, folder, refs)).max() <= MAX_DIFF


def test_out_of_memory_steps_down_with_the_lora_kept(models, refs, tmp_path, monkeypatch):
    """Simulated: the transformer runs out of memory in every step at highvram. The job finishes at medvram with the
    LoRA on, equal to the same job run without the fault, and the LoRA file is not loaded again for the retry."""
    key, folder, _root, loras = models
    path = loras["diffusers"]
    loads = []
    real_load = lora_mod._load
    monkeypatch.setattr(lora_mod, "_load", lambda pipe, p, name: loads.append(p) or real_load(pipe, p, name))
    result = out_of_memory_steps_down(lambda **kw: request(key, folder, tmp_path, refs, loras=(f"{path.stem}:1",),
                                                           **kw))
    assert result.warnings == []
    # one load for the warm-up job, one in the session the check compares with: none for the retry
    assert loads == [path, path]


def test_a_lora_of_other_shapes_is_one_sentence_naming_the_family(models, refs, tmp_path, capfd):
    """A LoRA whose layers have the family's names but other widths (another model's): one sentence naming the
    family, no traceback."""
    key, folder, root, loras = models
    from safetensors.torch import load_file

    state = {k: torch.cat([v, v[:, :3]], dim=1) if k.endswith("lora_A.weight") else v
             for k, v in load_file(str(loras["diffusers"])).items()}
    save(state, root / "Lora" / "wider.safetensors")
    capfd.readouterr()
    # the file descriptor's stderr: diffusers' log handler holds the real one
    code, _out, err = cli(capfd, *command(key, folder, refs, "--lora", "wider", "--steps", "1", "--outdir",
                                          str(tmp_path)))
    lines = err.strip().splitlines()
    assert code == 2, lines
    name = families.by_name(key).name
    assert lines[-1].startswith("error: LoRA wider.safetensors is for another base model than this "
                                f"{FAMILIES[key].pipeline} (not {name}?)"), lines[-1]
    (root / "Lora" / "wider.safetensors").unlink()


def test_a_layout_diffusers_does_not_convert_for_the_family_is_one_sentence_naming_both(models, refs, tmp_path, capfd):
    """A LoRA in a layout its users meet that diffusers' loader of this family does not convert (sd-scripts' names
    where it reads diffusers' only, a FLUX-style file on Qwen-Image-Edit, ...): one sentence naming the family and the
    layout, no traceback, and the next job runs."""
    key, folder, _root, loras = models
    case = FAMILIES[key]
    said = {"kohya": "kohya/sd-scripts' layout", "kohya-bfl-double": "kohya/sd-scripts' layout on BFL's original",
            "comfy": "ComfyUI/ai-toolkit's layout"}
    name = families.by_name(key).name
    negative = ["--negative", case.negative] if case.negative else []
    for layout in case.refused:
        capfd.readouterr()
        code, _out, err = cli(capfd, *command(key, folder, refs, "--lora", loras[layout].stem, "--steps", "1",
                                              "--outdir", str(tmp_path), *negative))
        lines = err.strip().splitlines()
        assert code == 2 and "Traceback" not in err, lines
        assert lines[-1].startswith(f"error: LoRA {loras[layout].name} "), lines[-1]
        assert said[layout] in lines[-1] and (f"for {name};" in lines[-1] or f"(not {name})?" in lines[-1]), lines[-1]
    if case.refused:
        code, _out, err = cli(capfd, *command(key, folder, refs, "--steps", "1", "--outdir", str(tmp_path), *negative))
        assert code == 0, err
