"""ComfyUI's and A1111/Forge's models/ folders read as they are (issue 30 item 3): `--models-dir` or
LOWVRAM_GEN_MODELS pointing at one, every lookup (the Model list and `--model NAME`, `--lora` / `<lora:>`, `--vae`,
`--controlnet`, embeddings, upscalers) finds the files under ComfyUI's folder names through networks/files.kind_dirs,
symlinked sub-folders followed, and nothing is copied: the files used are the user's own (same inode), and no model
file appears anywhere else. Tiny files, CPU, offline.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from safetensors.torch import save_file

sys.path.insert(0, str(Path(__file__).parent))

from lowvram_gen.cli.main import build_parser, folder_flags, main  # noqa: E402
from lowvram_gen.networks import files  # noqa: E402

SMALL = ["--width", "64", "--height", "64", "--steps", "2", "--seed", "5", "--cpu"]
MODEL_SUFFIXES = (".safetensors", ".gguf", ".ckpt", ".pt", ".pth", ".bin")


@pytest.fixture()
def no_flags(monkeypatch):
    for _, env in files.FOLDER_FLAGS.values():
        monkeypatch.delenv(env, raising=False)
    monkeypatch.delenv("LOWVRAM_GEN_MODELS", raising=False)


@pytest.fixture(scope="module")
def comfy(tmp_path_factory, tiny_path):
    """A ComfyUI install's models/ with tiny files: a diffusers folder linked into checkpoints/<sub>/, a LoRA in a
    folder on "another drive" linked into loras/, a VAE in vae/, a ControlNet in controlnet/, an embedding in
    embeddings/, an upscaler in upscale_models/."""
    from diffusers import UNet2DConditionModel

    from controlnet_files import build, save_safetensors
    from lora_files import kohya_state, save
    from lowvram_gen.models.loading import load
    from lowvram_gen.models.resolve import resolve

    root = tmp_path_factory.mktemp("ComfyUI")
    models = root / "models"
    for name in ("checkpoints/sd15", "diffusion_models", "unet", "diffusers", "text_encoders", "clip", "vae",
                 "controlnet", "embeddings", "upscale_models"):
        (models / name).mkdir(parents=True)
    (models / "checkpoints" / "sd15" / "mytiny").symlink_to(tiny_path, target_is_directory=True)
    drive = root / "other-drive" / "my-loras"
    drive.mkdir(parents=True)
    pipe = load(resolve("tiny"), "float32").pipe
    save(kohya_state(pipe), drive / "mine.safetensors")
    (models / "loras").symlink_to(drive.parent, target_is_directory=True)  # loras/ -> other-drive/ (my-loras/ in it)
    torch.manual_seed(3)
    vae = type(pipe.vae).from_config(pipe.vae.config)
    save_file({k: v.contiguous() for k, v in vae.state_dict().items()}, str(models / "vae" / "seeded.safetensors"))
    unet = UNet2DConditionModel.from_pretrained(tiny_path, subfolder="unet")
    save_safetensors(build(unet), models / "controlnet" / "mycn.safetensors")
    vec = torch.randn(2, 32, generator=torch.Generator().manual_seed(0)) * 2
    save_file({"emb_params": vec}, str(models / "embeddings" / "myemb.safetensors"))
    (models / "upscale_models" / "4x-Tiny.pth").write_bytes(b"listed, not loaded")
    return models


def _model_files(*roots: Path) -> dict[str, int]:
    """Every model file under `roots` (links not followed: a copy would be a real file) -> its inode."""
    out = {}
    for root in roots:
        for top, _, names in os.walk(root):
            for name in names:
                path = Path(top) / name
                if path.suffix.lower() in MODEL_SUFFIXES and not path.is_symlink():
                    out[str(path)] = path.stat().st_ino
    return out


def _pixels(path) -> np.ndarray:
    return np.asarray(Image.open(path).convert("RGB"))


# ------------------------------------------------------------------------------------------ the one place


def test_kind_dirs_adds_comfyuis_folder_names_where_they_exist(no_flags, comfy, tmp_path, monkeypatch):
    monkeypatch.setenv("LOWVRAM_GEN_MODELS", str(comfy))
    assert files.kind_dirs("Stable-diffusion") == [comfy / "Stable-diffusion", comfy / "checkpoints",
                                                   comfy / "diffusion_models", comfy / "unet", comfy / "diffusers"]
    assert files.kind_dirs("Lora") == [comfy / "Lora", comfy / "loras"]
    assert files.kind_dirs("VAE") == [comfy / "VAE", comfy / "vae"]
    assert files.kind_dirs("ControlNet") == [comfy / "ControlNet", comfy / "controlnet"]
    (comfy / "model_patches").mkdir()  # ComfyUI's folder for Z-Image's Fun ControlNets, looked in once it exists
    assert files.kind_dirs("ControlNet") == [comfy / "ControlNet", comfy / "controlnet", comfy / "model_patches"]
    assert files.kind_dirs("ESRGAN") == [comfy / "ESRGAN", comfy / "upscale_models"]
    assert files.kind_dirs("text_encoders") == [comfy / "text_encoders", comfy / "clip"]
    assert files.kind_dirs("embeddings") == [comfy / "embeddings"]
    # an A1111/Forge tree: its own names, and A1111's embeddings/ beside models/
    webui = tmp_path / "webui"
    for name in ("models/Stable-diffusion", "models/Lora", "models/VAE", "embeddings"):
        (webui / name).mkdir(parents=True)
    monkeypatch.setenv("LOWVRAM_GEN_MODELS", str(webui / "models"))
    assert files.kind_dirs("Lora") == [webui / "models" / "Lora"]
    assert files.kind_dirs("embeddings") == [webui / "models" / "embeddings", webui / "embeddings"]
    # a flag's folder still comes first
    monkeypatch.setenv("LOWVRAM_GEN_LORA_DIR", str(comfy / "loras"))
    assert files.kind_dirs("Lora")[0] == comfy / "loras"


def test_models_dir_is_the_models_root_for_the_command_and_wins_over_data_dir(no_flags, comfy, tmp_path):
    args = build_parser().parse_args(["generate", "x", "--models-dir", str(comfy), "--data-dir", str(tmp_path)])
    with folder_flags(args):
        assert files.models_root() == comfy.resolve()
        assert os.environ["LOWVRAM_GEN_HOME"] == str(tmp_path.resolve() / "lowvram-gen")
    assert "LOWVRAM_GEN_MODELS" not in os.environ
    assert main(["generate", "x", *SMALL, "--models-dir", str(tmp_path / "nowhere")]) == 2


def test_every_lookup_finds_comfyuis_files_through_links_and_nothing_is_copied(no_flags, comfy, monkeypatch):
    from lowvram_gen.a1111.upscaler_names import model_files
    from lowvram_gen.models import controlnet, vae
    from lowvram_gen.models.discover import model_choices
    from lowvram_gen.models.resolve import resolve
    from lowvram_gen.networks import embeddings, lora

    monkeypatch.setenv("LOWVRAM_GEN_MODELS", str(comfy))
    linked = comfy / "checkpoints" / "sd15" / "mytiny"
    listed = model_choices()
    assert str(linked) in listed and not [m for m in listed if "/loras/" in m or "/vae/" in m or "/controlnet/" in m]
    assert resolve("mytiny").path == linked.resolve()
    found = lora.find_lora("mine")
    original = comfy.parent / "other-drive" / "my-loras" / "mine.safetensors"
    assert found.stat().st_ino == original.stat().st_ino and found.resolve() == original.resolve()
    assert vae.find("seeded").stat().st_ino == (comfy / "vae" / "seeded.safetensors").stat().st_ino
    assert controlnet.available()["mycn"].stat().st_ino == (comfy / "controlnet" / "mycn.safetensors").stat().st_ino
    assert "myemb" in embeddings.available_embeddings()
    assert "4x-Tiny.pth" in model_files()


def test_a_comfyui_models_folder_generates_with_its_model_lora_and_vae_without_a_copy(no_flags, comfy, tmp_path,
                                                                                   capsys, isolated_home):
    before = _model_files(comfy.parent, isolated_home)

    def generate(prompt, outdir, *extra):
        code = main(["generate", prompt, *SMALL, "--models-dir", str(comfy), "--model", "mytiny", "--json",
                     "--outdir", str(tmp_path / outdir), *extra])
        captured = capsys.readouterr()
        assert code == 0, captured.err
        return json.loads(captured.out)["images"][0]

    plain = generate("a cat", "plain")
    with_all = generate("a cat <lora:mine:0.8> embedding:myemb", "all", "--vae", "seeded")
    assert "VAE: seeded.safetensors" in Image.open(with_all).text["parameters"]
    assert not np.array_equal(_pixels(plain), _pixels(with_all))
    argv = ["plan", "--models-dir", str(comfy), "--model", "mytiny", "--width", "64", "--height", "64",
            "--controlnet", "mycn", "--json"]
    assert main(argv) == 0
    assert json.loads(capsys.readouterr().out.splitlines()[-1])["controlnets"]
    # the user's files were read where they are: no model file was written anywhere (a copy would be a new inode)
    assert _model_files(comfy.parent, isolated_home) == before


def test_a_name_in_no_folder_lists_the_comfyui_folders_looked_in(no_flags, comfy, capsys):
    assert main(["generate", "x <lora:absent:1>", *SMALL, "--models-dir", str(comfy)]) == 2
    err = capsys.readouterr().err
    assert str((comfy / "loras").resolve()) in err and "there are: mine" in err
