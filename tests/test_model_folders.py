"""A1111's model-folder launch flags (issue 29 item 15): --ckpt-dir, --lora-dir, --embeddings-dir, --controlnet-dir,
--vae-dir and --data-dir reach every lookup of their kind through networks/files.kind_dirs, on every command that
takes them, and a folder that is not there is refused naming the flag; and --autolaunch opens the browser."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest
import torch
from PIL import Image
from safetensors.torch import save_file

from lowvram_gen.cli.main import build_parser, folder_flags, main
from lowvram_gen.networks import files

SMALL = ["--width", "64", "--height", "64", "--steps", "2", "--seed", "5"]
FLAGS = ("--ckpt-dir", "--lora-dir", "--embeddings-dir", "--controlnet-dir", "--vae-dir", "--data-dir")


@pytest.fixture()
def no_models(tmp_path, monkeypatch):
    """An empty models root, and none of the folder flags' variables set."""
    monkeypatch.setenv("LOWVRAM_GEN_MODELS", str(tmp_path / "models"))
    for _, env in files.FOLDER_FLAGS.values():
        monkeypatch.delenv(env, raising=False)
    return tmp_path / "models"


def _generate(tmp_path, capsys, prompt: str, outdir: str, *extra) -> dict:
    assert main(["generate", prompt, *SMALL, "--cpu", "--outdir", str(tmp_path / outdir), "--json", *extra]) == 0
    return json.loads(capsys.readouterr().out)


def _pixels(path) -> np.ndarray:
    return np.asarray(Image.open(path).convert("RGB"))


# ------------------------------------------------------------------------------------------ the one place


def test_kind_dirs_puts_the_flags_folder_first_then_the_models_roots(no_models, tmp_path, monkeypatch):
    for kind in files.FOLDER_FLAGS:
        assert files.kind_dirs(kind) == [no_models / kind]
    monkeypatch.setenv("LOWVRAM_GEN_VAE_DIR", str(tmp_path / "vaes"))
    assert files.kind_dirs("VAE") == [tmp_path / "vaes", no_models / "VAE"]


@pytest.mark.parametrize("flag", FLAGS)
@pytest.mark.parametrize("command", [["generate", "x"], ["img2img", "x", "--init", "i.png"],
                                     ["inpaint", "x", "--init", "i.png", "--mask", "m.png"], ["batch", "p.txt"],
                                     ["ui"], ["plan"]])
def test_every_command_takes_the_folder_flags(no_models, tmp_path, flag, command):
    args = build_parser().parse_args([*command, flag, str(tmp_path)])
    with folder_flags(args):
        if flag == "--data-dir":
            assert files.models_root() == tmp_path / "models"
            assert os.environ["LOWVRAM_GEN_HOME"] == str(tmp_path / "lowvram-gen")
        else:
            kind = next(k for k, (f, _) in files.FOLDER_FLAGS.items() if f == flag)
            assert files.kind_dirs(kind)[0] == tmp_path
    assert files.models_root() == no_models  # put back after the command
    assert all(env not in os.environ for _, env in files.FOLDER_FLAGS.values())


@pytest.mark.parametrize("flag", FLAGS)
def test_a_flag_naming_a_missing_folder_is_refused_naming_the_flag_and_the_folder(tmp_path, capsys, flag):
    missing = tmp_path / "nowhere"
    assert main(["generate", "x", *SMALL, "--cpu", flag, str(missing)]) == 2
    err = capsys.readouterr().err
    assert f"invalid {flag}" in err and str(missing) in err and "no such folder" in err


def test_a_file_is_not_a_folder(tmp_path, capsys):
    a_file = tmp_path / "a.txt"
    a_file.write_text("x")
    assert main(["plan", "--lora-dir", str(a_file)]) == 2
    assert "is a file" in capsys.readouterr().err


# ------------------------------------------------------------------------------------- each kind's lookup


def test_a_checkpoint_by_name_in_ckpt_dir_generates_and_is_in_the_model_list(no_models, tmp_path, capsys, tiny_path):
    from lowvram_gen.models.discover import model_choices

    ckpts = tmp_path / "ckpts"
    ckpts.mkdir()
    (ckpts / "mytiny").symlink_to(tiny_path, target_is_directory=True)
    assert main(["generate", "x", *SMALL, "--cpu", "--model", "mytiny", "--outdir", str(tmp_path)]) == 2
    assert "model not found" in capsys.readouterr().err
    out = _generate(tmp_path, capsys, "x", "o", "--model", "mytiny", "--ckpt-dir", str(ckpts))
    assert len(out["images"]) == 1
    with folder_flags(build_parser().parse_args(["ui", "--ckpt-dir", str(ckpts)])):
        assert str(ckpts.resolve() / "mytiny") in model_choices()
    assert str(ckpts.resolve() / "mytiny") not in model_choices()


def _lora(folder):
    from lora_files import kohya_state, save
    from lowvram_gen.models.loading import load
    from lowvram_gen.models.resolve import resolve

    save(kohya_state(load(resolve("tiny"), "float32").pipe), folder / "mine.safetensors")


def _embedding(folder):
    folder.mkdir()
    vec = torch.randn(2, 32, generator=torch.Generator().manual_seed(0)) * 2
    save_file({"emb_params": vec}, str(folder / "mine.safetensors"))


@pytest.mark.parametrize("flag, prompt, make", [("--lora-dir", "a cat <lora:mine:0.8>", _lora),
                                                ("--embeddings-dir", "a cat embedding:mine", _embedding)])
def test_a_network_by_name_in_its_flags_folder_changes_the_image(no_models, tmp_path, capsys, tiny_path, flag, prompt,
                                                                 make):
    folder = tmp_path / "networks"
    make(folder)
    assert main(["generate", prompt, *SMALL, "--cpu", "--outdir", str(tmp_path)]) == 2
    assert "no .safetensors" in capsys.readouterr().err
    plain = _generate(tmp_path, capsys, "a cat", "a")
    used = _generate(tmp_path, capsys, prompt, "b", flag, str(folder))
    assert not np.array_equal(_pixels(plain["images"][0]), _pixels(used["images"][0]))


def test_a_controlnet_by_name_in_controlnet_dir_is_planned(no_models, tmp_path, capsys, tiny_path):
    from diffusers import UNet2DConditionModel

    from controlnet_files import build, save_safetensors

    cns = tmp_path / "cns"
    cns.mkdir()
    save_safetensors(build(UNet2DConditionModel.from_pretrained(tiny_path, subfolder="unet")), cns / "mycn.safetensors")
    argv = ["plan", "--model", "tiny", "--width", "64", "--height", "64", "--controlnet", "mycn", "--json"]
    assert main(argv) == 2
    assert main([*argv, "--controlnet-dir", str(cns)]) == 0
    assert json.loads(capsys.readouterr().out.splitlines()[-1])["controlnets"]


def test_the_vae_folder_is_looked_up_through_kind_dirs(no_models, tmp_path):
    vaes = tmp_path / "vaes"
    vaes.mkdir()
    with folder_flags(build_parser().parse_args(["generate", "x", "--vae-dir", str(vaes)])):
        assert files.kind_dirs("VAE") == [vaes.resolve(), no_models / "VAE"]


def test_data_dir_holds_the_models_and_the_outputs(no_models, tmp_path, capsys, tiny_path):
    data = tmp_path / "webui"
    (data / "models" / "Stable-diffusion").mkdir(parents=True)
    (data / "models" / "Stable-diffusion" / "mytiny").symlink_to(tiny_path, target_is_directory=True)
    assert main(["generate", "x", *SMALL, "--cpu", "--model", "mytiny", "--data-dir", str(data), "--json"]) == 0
    image = json.loads(capsys.readouterr().out)["images"][0]
    assert str(data.resolve() / "outputs") in image


# ------------------------------------------------------------------------------------------- --autolaunch


def test_autolaunch_reaches_launch_and_opens_the_browser_at_the_ui(monkeypatch):
    import webbrowser

    import lowvram_gen.server as server_mod
    import lowvram_gen.session as session_mod

    seen = {}
    monkeypatch.setattr(session_mod, "Session", lambda **kw: None)
    monkeypatch.setattr(server_mod, "check_port", lambda port, host: port)
    monkeypatch.setattr(server_mod, "launch", lambda *a, **kw: seen.update(kw))
    assert main(["ui", "--autolaunch", "--cpu"]) == 0
    assert seen["autolaunch"] is True
    assert main(["ui", "--cpu"]) == 0 and seen["autolaunch"] is False

    opened = []
    monkeypatch.setattr(webbrowser, "open", lambda url, *a, **k: opened.append(url) or True)
    server_mod.open_browser("http://0.0.0.0:7860/")
    server_mod.open_browser("http://127.0.0.1:7861/")
    assert opened == ["http://127.0.0.1:7860/", "http://127.0.0.1:7861/"]


def test_launch_opens_the_browser_once_the_ui_is_up(monkeypatch):
    import lowvram_gen.server as server_mod
    import lowvram_gen.ui.app as app_mod

    events = []

    class App:
        local_url = "http://127.0.0.1:7999/"

        def launch(self, **kw):
            events.append("up")

    monkeypatch.setattr(app_mod, "build_app", lambda *a, **k: App())
    monkeypatch.setattr(server_mod, "open_browser", lambda url: events.append(url))
    server_mod.launch(None, "out", "tiny", block=False, autolaunch=True)
    assert events == ["up", "http://127.0.0.1:7999/"]
    events.clear()
    server_mod.launch(None, "out", "tiny", block=False)
    assert events == ["up"]


def test_the_api_server_lists_the_flags_folders(no_models, tmp_path):
    """`ui --nowebui --lora-dir D --ckpt-dir C`: the API server runs inside the command, under its folder flags."""
    from urllib.request import urlopen

    from servers import Server

    loras, ckpts = tmp_path / "loras", tmp_path / "ckpts"
    loras.mkdir()
    ckpts.mkdir()
    save_file({"x": torch.zeros(1)}, str(loras / "add_detail.safetensors"))
    (ckpts / "dreamshaper_8.safetensors").write_bytes(b"not loaded by a listing")
    args = build_parser().parse_args(["ui", "--nowebui", "--lora-dir", str(loras), "--ckpt-dir", str(ckpts)])
    with folder_flags(args):
        server = Server(tmp_path, webui=False)
        try:
            listed = {route: json.load(urlopen(f"{server.api_url}/{route}", timeout=30))
                      for route in ("loras", "sd-models")}
        finally:
            server.close()
    assert [lora["name"] for lora in listed["loras"]] == ["add_detail"]
    assert "dreamshaper_8.safetensors" in [m["title"] for m in listed["sd-models"]]
