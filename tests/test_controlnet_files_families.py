"""Single-file ControlNets of the issue-30 families as users download them: Z-Image's (alibaba-pai's
Z-Image-Turbo-Fun-Controlnet-Union `.safetensors`, 1.0, 2.0 and 2.1, the keys diffusers' ZImageControlNetModel has:
its single-file loader passes them through), SANA's and Qwen-Image's in diffusers' layout. The config comes from the
file's header (nothing fetched), completed from the base transformer's at load; the file runs as its folder does,
from the CLI and from models/ControlNet by name; the plan counts it. A file diffusers cannot read (SANA's original
`.pth`) gets one sentence saying what to give instead.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from controlnet_files import random_image
from tiny_controlnets import BUILDERS, _randomised, tiny_sana_two_blocks
from tiny_qwen import build_tiny_qwen_image
from tiny_transformers import cli, pixels
from tiny_zimage import build_tiny_zimage

from lowvram_gen.errors import ModelLoadError
from lowvram_gen.models import controlnet as models

MODELS = {"qwen-image": build_tiny_qwen_image, "z-image": build_tiny_zimage, "sana": tiny_sana_two_blocks}


def zimage_variant(kind: str, seed: int = 4):
    """The tiny Z-Image ControlNet (tests/tiny_controlnets.py) as Union 2.0 ('control_layers': no refiner of its own,
    33 input channels) or 2.1 ('control_noise_refiner': refiner blocks with their own projections)."""
    from diffusers import ZImageControlNetModel

    return _randomised(ZImageControlNetModel(
        control_layers_places=[0, 1], control_refiner_layers_places=[0, 1], control_in_dim=33,
        add_control_noise_refiner=kind, all_patch_size=(2,), all_f_patch_size=(1,), dim=32, n_refiner_layers=2,
        n_heads=2, n_kv_heads=2, norm_eps=1e-5, qk_norm=True), seed, scale=0.2)


def save_file(net, path, extra: dict | None = None):
    from safetensors.torch import save_file as save

    save({**{k: v.contiguous() for k, v in net.state_dict().items()}, **(extra or {})}, str(path))
    return str(path)


@pytest.fixture(scope="module", params=list(MODELS))
def made(request, tmp_path_factory):
    key = request.param
    root = tmp_path_factory.mktemp(f"cn-file-{key}")
    MODELS[key]().save_pretrained(root / "model", safe_serialization=True)
    net = BUILDERS[key]()
    net.save_pretrained(root / "folder", safe_serialization=True)
    (root / "models" / "ControlNet").mkdir(parents=True)
    file = save_file(net, root / "models" / "ControlNet" / f"{key}-union.safetensors")
    return dict(key=key, model=str(root / "model"), folder=str(root / "folder"), file=file, root=root,
                control=random_image(root / "control.png"))


def _run(capsys, made, controlnet, tmp_path) -> np.ndarray:
    code, out, err = cli(capsys, "generate", "a castle", "--negative", "fog", "--model", made["model"], "--width",
                         "64", "--height", "64", "--steps", "2", "--seed", "7", "--cfg", "4", "--preset", "cpu",
                         "--outdir", str(tmp_path), "--json", "--controlnet", f"{controlnet}:0.8",
                         "--control-image", made["control"])
    assert code == 0, err
    return pixels(json.loads(out)["images"][0])


def test_a_single_file_runs_as_its_folder(made, tmp_path, capsys, monkeypatch):
    """The file by path and by name in models/ControlNet: the folder's image, its config from the header."""
    derived = models.config_of(models.resolve_controlnet(made["file"]))
    saved = models.config_of(models.resolve_controlnet(made["folder"]))
    assert derived["_class_name"] == saved["_class_name"]
    by_folder = _run(capsys, made, made["folder"], tmp_path / "folder")
    assert np.array_equal(_run(capsys, made, made["file"], tmp_path / "file"), by_folder)
    monkeypatch.setenv("LOWVRAM_GEN_MODELS", str(made["root"] / "models"))
    assert np.array_equal(_run(capsys, made, f"{made['key']}-union", tmp_path / "name"), by_folder)


def test_the_loaded_file_is_the_folders_model(made):
    """Every config field diffusers built the folder's with (the base's head counts and layer places included) and
    every weight."""
    import diffusers

    base_class = {"qwen-image": "QwenImageTransformer2DModel", "z-image": "ZImageTransformer2DModel",
                  "sana": "SanaTransformer2DModel"}[made["key"]]
    base = dict(getattr(diffusers, base_class).load_config(made["model"], subfolder="transformer"))
    a = models.load_controlnet(models.resolve_controlnet(made["file"]), base, "float32")
    b = models.load_controlnet(models.resolve_controlnet(made["folder"]), base, "float32")
    assert type(a) is type(b)
    for key, value in b.config.items():
        if not key.startswith("_") and key != "control_refiner_layers_places":  # unused without its refiner kind
            got = a.config.get(key)
            assert (list(got) if isinstance(got, (list, tuple)) else got) == \
                (list(value) if isinstance(value, (list, tuple)) else value), key
    assert all(torch.equal(a.state_dict()[k], v) for k, v in b.state_dict().items())


def test_the_plan_counts_the_file_as_the_folder(made, capsys):
    args = ["plan", "--json", "--vram", "4GiB", "--model", made["model"], "--width", "512", "--height", "512"]
    rows = []
    for spec in (made["folder"], made["file"]):
        code, out, err = cli(capsys, *args, "--controlnet", spec)
        assert code == 0, err
        rows.append([r["breakdown"]["controlnet_bytes"] for r in json.loads(out)["presets"]])
    assert rows[0] == rows[1] and all(rows[0])


@pytest.mark.parametrize("kind,zero_refiner,read_as", [
    ("control_layers", False, "control_layers"),  # Union 2.0 without the refiner's keys
    ("control_layers", True, "control_layers"),  # Union 2.0 carrying its unused refiner as zeros (diffusers' 2.0)
    ("control_noise_refiner", False, "control_noise_refiner"),  # Union 2.1
])
def test_zimage_union_2_files_are_read_as_diffusers_reads_them(kind, zero_refiner, read_as, tmp_path):
    """The refiner kind from the header (and, for a 2.0 file with a zero refiner, one tensor's values), the layer
    places spread over the base transformer's layers; loaded, the folder's weights."""
    from diffusers import ZImageTransformer2DModel

    net = zimage_variant(kind)
    folder = tmp_path / "folder"
    net.save_pretrained(folder, safe_serialization=True)
    extra = {}
    if zero_refiner:  # what 2.1's refiner holds, zeroed: diffusers' infer_diffusers_model_type calls that 2.0
        extra = {k: torch.zeros_like(v) for k, v in zimage_variant("control_noise_refiner").state_dict().items()
                 if k.startswith("control_noise_refiner.")}
    file = save_file(net, tmp_path / "Z-Image-Turbo-Fun-Controlnet-Union-2.x.safetensors", extra)
    config = models.config_of(models.resolve_controlnet(file))
    assert config["add_control_noise_refiner"] == read_as and config["control_in_dim"] == 33
    root = tmp_path / "model"
    build_tiny_zimage().save_pretrained(root, safe_serialization=True)
    base = dict(ZImageTransformer2DModel.load_config(str(root), subfolder="transformer"))
    a = models.load_controlnet(models.resolve_controlnet(file), base, "float32")
    assert list(a.config.control_layers_places) == [0, 1] and a.config.add_control_noise_refiner == read_as
    assert all(torch.equal(a.state_dict()[k], v) for k, v in net.state_dict().items())


def test_a_sana_controlnet_in_its_original_layout_is_refused_in_one_sentence(tmp_path):
    """Efficient-Large-Model's original SANA ControlNet checkpoints (`controlnet.N` blocks beside the base's, a .pth)
    are not read by diffusers' loaders: one sentence naming what to give instead."""
    path = tmp_path / "Sana_600M_1024px_ControlNet_HED.pth"
    torch.save({"state_dict": {"controlnet.0.copied_block.attn.qkv.weight": torch.zeros(8, 8),
                               "controlnet.0.after_proj.weight": torch.zeros(8, 8),
                               "x_embedder.proj.weight": torch.zeros(8, 4, 1, 1)}}, path)
    with pytest.raises(ModelLoadError, match="original layout .* give the diffusers. layout of it") as caught:
        models.config_of(models.resolve_controlnet(str(path)))
    assert len(str(caught.value).splitlines()) == 1


def test_a_diffsynth_blockwise_qwen_image_controlnet_is_refused_in_one_sentence(tmp_path, capsys):
    """DiffSynth's Qwen-Image Blockwise ControlNet (as ComfyUI's model_patches/ holds it): diffusers has no class for
    it; one sentence naming what to give instead."""
    from safetensors.torch import save_file as save

    path = tmp_path / "qwen_image_canny_diffsynth_controlnet.safetensors"
    save({"img_in.weight": torch.zeros(8, 4), "controlnet_blocks.0.x_rms.weight": torch.zeros(8),
          "controlnet_blocks.0.input_proj.weight": torch.zeros(8, 8)}, str(path))
    with pytest.raises(ModelLoadError, match="DiffSynth's Qwen-Image Blockwise ControlNet .* give a diffusers") as caught:
        models.config_of(models.resolve_controlnet(str(path)))
    assert len(str(caught.value).splitlines()) == 1
    code, _out, err = cli(capsys, "plan", "--model", "qwen-image", "--controlnet", str(path))
    errors = [line for line in err.splitlines() if line.startswith("error:")]  # (diffusers logs a config note first)
    assert code == 2 and len(errors) == 1 and "DiffSynth" in errors[0], err
