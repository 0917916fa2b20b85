"""A1111's SD VAE (issue 32 item 4), what tests/test_vae_selector.py leaves: a VAE file is read weights-only (a `.pt`
or `.ckpt` whose pickle would run code is refused before any of it runs, a damaged `.safetensors` header too), the
`plan` command counts a VAE as `generate` does (`plan --vae`), and webuiapi lists and sets the VAE."""

from __future__ import annotations

import json
import os
import pickle

import pytest
import torch

from lowvram_gen.cli.main import main
from lowvram_gen.errors import ModelLoadError, UnsafeCheckpoint
from lowvram_gen.models import vae as vae_files


class Evil:
    """A pickle payload: unpickling it with plain pickle would create the marker file."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


@pytest.fixture()
def folder(tmp_path, monkeypatch):
    """models/VAE with a small safe VAE-sized file, two pickles that would run code, and a damaged safetensors."""
    from safetensors.torch import save_file

    vae_dir = tmp_path / "models" / "VAE"
    vae_dir.mkdir(parents=True)
    save_file({"decoder.conv_in.weight": torch.zeros(4, 4)}, str(vae_dir / "small.safetensors"))
    marker = tmp_path / "pwned"
    torch.save({"state_dict": {"decoder.conv_in.weight": torch.zeros(2), "x": Evil(marker)}}, vae_dir / "evil.pt")
    (vae_dir / "evil-raw.ckpt").write_bytes(pickle.dumps({"state_dict": Evil(marker)}, protocol=4))
    (vae_dir / "damaged.safetensors").write_bytes((2**40).to_bytes(8, "little") + b"{}")
    monkeypatch.setenv("LOWVRAM_GEN_MODELS", str(tmp_path / "models"))
    return {"dir": vae_dir, "marker": marker}


def test_a_vae_pickle_that_would_run_code_is_refused_before_it_runs(folder):
    assert {"evil.pt", "evil-raw.ckpt"} <= set(vae_files.available())  # listed as A1111 lists them
    for name in ("evil.pt", "evil-raw.ckpt"):
        with pytest.raises(UnsafeCheckpoint):
            vae_files.load(vae_files.find(name), {})
    assert not folder["marker"].exists()


def test_a_damaged_safetensors_vae_is_a_clear_error_not_a_crash(folder):
    with pytest.raises(ModelLoadError, match="damaged.safetensors"):
        vae_files.read_state(vae_files.find("damaged"))


def test_generate_with_an_unsafe_vae_stops_with_one_message(folder, tmp_path, capsys):
    code = main(["generate", "a fox", "--vae", "evil.pt", "--steps", "1", "--width", "64", "--height", "64",
                 "--outdir", str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert code != 0 and "evil.pt" in err and "Traceback" not in err
    assert not folder["marker"].exists() and not list((tmp_path / "out").rglob("*.png"))


def _plan(capsys, *extra) -> dict:
    code = main(["plan", "--model", "sd15", "--vram", "4GB", "--ram", "16GB", "--json", *extra])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    return json.loads(captured.out)


def test_plan_counts_the_vae_file_as_generate_does(folder, capsys):
    """`plan --vae`: the model's own VAE stays in RAM beside the file's (Session.profile_for's count), so no
    candidate's RAM peak shrinks, and medvram's (its weights kept in RAM between their turns on the card) grows by
    the own VAE's 16-bit copy; the VRAM estimates stay."""
    from lowvram_gen.models.profile import profile_builtin

    own, swapped = _plan(capsys), _plan(capsys, "--vae", "small.safetensors")
    assert swapped["vae"] == "small.safetensors" and own["vae"] is None
    vae_params = profile_builtin("sd15").params["vae"]
    for a, b in zip(own["presets"], swapped["presets"]):
        assert a["name"] == b["name"]
        assert b["host_peak_bytes"] >= a["host_peak_bytes"] and b["estimate_bytes"] == a["estimate_bytes"], a["name"]
    medvram = [(a, b) for a, b in zip(own["presets"], swapped["presets"]) if a["name"] == "medvram"]
    assert [b["host_peak_bytes"] - a["host_peak_bytes"] for a, b in medvram] == [2 * vae_params]
    assert main(["plan", "--model", "sd15", "--vram", "4GB", "--vae", "nosuch"]) == 2
    assert "invalid VAE: 'nosuch'" in capsys.readouterr().err


def test_webuiapi_lists_the_vaes_and_sets_sd_vae(folder, tmp_path):
    from servers import Server

    srv = Server(tmp_path, api=True, webui=False)
    try:
        api = srv.client()
        listed = [entry["model_name"] for entry in api.get_sd_vae()]
        assert listed == list(vae_files.available()) and "small.safetensors" in listed
        api.set_options({"sd_vae": "small.safetensors"})
        assert api.get_options()["sd_vae"] == "small.safetensors"
        api.set_options({"sd_vae": "Automatic"})
        assert api.get_options()["sd_vae"] == "Automatic"
    finally:
        srv.close()
