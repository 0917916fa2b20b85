"""A1111's SD VAE (issue 32 item 4, which issue 29's --vae-dir selects for): `--vae NAME|PATH`, the API's `sd_vae`
(override_settings and /options) and /sdapi/v1/sd-vae, the infotext's `VAE`/`VAE hash`, the plan's count, and the
UI's box (built and mapped at Python level; the tabs wire it).

The VAE files are made here: a seeded AutoencoderKL of the tiny model's VAE config, saved as A1111 keeps VAEs (the
LDM layout with and without `first_stage_model.`, as .safetensors and as a .pt pickle), in diffusers' layout, and as
a diffusers folder.
"""

from __future__ import annotations

import hashlib
import json
import shutil

import numpy as np
import pytest
import requests
import torch
from PIL import Image

from ldm_layout import vae_to_ldm  # tests/ldm_layout.py
from lowvram_gen.a1111.infotext import from_png
from lowvram_gen.cli.main import main
from lowvram_gen.errors import InvalidRequest, ModelLoadError
from lowvram_gen.models import vae as vae_files
from lowvram_gen.models.loading import load
from lowvram_gen.models.resolve import resolve
from lowvram_gen.outputs import parse_a1111_parameters
from lowvram_gen.request import GenerationRequest
from lowvram_gen.session import Session

SIDE = 64


def _seeded(config, seed: int = 7, **changes):
    from diffusers import AutoencoderKL

    torch.manual_seed(seed)
    vae = AutoencoderKL.from_config({**dict(config), **changes})
    with torch.no_grad():  # weights far from the tiny model's own: the image changes visibly
        for p in vae.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    return vae


@pytest.fixture(scope="module")
def disk(tmp_path_factory, tiny_path):
    """models/VAE with the same seeded VAE four ways (and another one), the VAE itself, and the tiny VAE's config."""
    from safetensors.torch import save_file

    root = tmp_path_factory.mktemp("vae")
    folder = root / "models" / "VAE"
    folder.mkdir(parents=True)
    config = load(resolve("tiny"), "float32").pipe.vae.config
    vae = _seeded(config)
    ldm = vae_to_ldm(vae)
    save_file(ldm, str(folder / "seeded.safetensors"))  # first_stage_model. prefix, as a checkpoint's
    bare = {k.removeprefix("first_stage_model."): v for k, v in ldm.items()}
    torch.save({"state_dict": {**bare, "loss.logvar": torch.zeros(())}}, folder / "seeded-pt.pt")  # A1111's .pt
    save_file({k: v.contiguous() for k, v in vae.state_dict().items()}, str(folder / "diffusers-layout.safetensors"))
    vae.save_pretrained(folder / "folder-vae", safe_serialization=True)
    other = _seeded(config, seed=8)
    save_file({k: v.contiguous() for k, v in other.state_dict().items()}, str(folder / "other.safetensors"))
    wide = _seeded(config, latent_channels=8)  # another latent space
    save_file({k: v.contiguous() for k, v in wide.state_dict().items()}, str(root / "wide.safetensors"))
    return {"root": root, "models": root / "models", "vae": vae, "config": config}


@pytest.fixture(autouse=True)
def models_folder(disk, monkeypatch):
    monkeypatch.setenv("LOWVRAM_GEN_MODELS", str(disk["models"]))


def pixels(path) -> np.ndarray:
    return np.asarray(Image.open(path).convert("RGB")).astype(int)


def _job(outdir, **more) -> GenerationRequest:
    return GenerationRequest(prompt="a red fox", width=SIDE, height=SIDE, steps=2, seed=11, outdir=str(outdir), **more)


def test_the_folder_lists_a1111s_names_and_every_layout_loads_the_same_weights(disk):
    names = list(vae_files.available())
    assert names == ["diffusers-layout.safetensors", "folder-vae", "other.safetensors", "seeded-pt.pt",
                     "seeded.safetensors"]
    want = disk["vae"].state_dict()
    for name in ("seeded.safetensors", "seeded-pt.pt", "diffusers-layout.safetensors", "folder-vae"):
        got = vae_files.load(vae_files.find(name), disk["config"]).state_dict()
        assert set(got) == set(want) and all(torch.equal(got[k], want[k]) for k in want), name
    assert vae_files.find("SEEDED") == vae_files.find("seeded.safetensors")  # its stem, any case
    with pytest.raises(ModelLoadError, match="does not fit this model's VAE"):
        vae_files.load(disk["root"] / "wide.safetensors", disk["config"])


def test_an_unknown_vae_is_a_clear_error_naming_it_and_the_files_there(disk, tmp_path, capsys):
    with pytest.raises(InvalidRequest) as err:
        vae_files.find("nosuch.safetensors")
    text = str(err.value)
    assert "invalid VAE: 'nosuch.safetensors'" in text
    assert "there are: diffusers-layout.safetensors, folder-vae, other.safetensors" in text
    assert str((disk["models"] / "VAE").resolve()) in text and "Automatic or None is the model's own" in text
    code = main(["generate", "a fox", "--vae", "nosuch", "--steps", "1", "--width", "64", "--height", "64",
                 "--outdir", str(tmp_path)])
    err_text = capsys.readouterr().err
    assert code == 2 and "invalid VAE: 'nosuch'" in err_text and "seeded.safetensors" in err_text
    assert not list(tmp_path.rglob("*.png"))


def test_generate_with_vae_decodes_with_it_as_a_pipeline_whose_vae_was_replaced_by_hand(disk, tmp_path, capsys):
    def generate(outdir, *extra):
        code = main(["generate", "a red fox", "--steps", "2", "--width", str(SIDE), "--height", str(SIDE),
                     "--seed", "11", "--outdir", str(tmp_path / outdir), "--json", *extra])
        assert code == 0
        return json.loads(capsys.readouterr().out)["images"][0]

    own = generate("own")
    swapped = generate("swapped", "--vae", "seeded.safetensors")
    assert np.abs(pixels(own) - pixels(swapped)).mean() > 1  # another VAE decoded it
    # by hand: the same job on a session whose pipeline's vae is the seeded one
    session = Session()
    session.generate(_job(tmp_path / "warm"))  # loads the model
    session.model.pipe.register_modules(vae=vae_files.load(vae_files.find("seeded.safetensors"), disk["config"]))
    session.runner.applied = None  # the preset goes on again, onto the new VAE
    by_hand = session.generate(_job(tmp_path / "hand")).images[0]
    assert np.array_equal(pixels(swapped), pixels(by_hand))
    text = Image.open(swapped).text["parameters"]
    digest = hashlib.sha256((disk["models"] / "VAE" / "seeded.safetensors").read_bytes()).hexdigest()[:10]
    assert f"VAE hash: {digest}, VAE: seeded.safetensors" in text and "VAE" not in Image.open(own).text["parameters"]
    # the infotext round trip: the PNG's VAE is read back, and --from-png makes the same image
    assert from_png(swapped).fields["vae"] == "seeded.safetensors"
    code = main(["generate", "--from-png", swapped, "--outdir", str(tmp_path / "again"), "--json"])
    again = json.loads(capsys.readouterr().out)["images"][0]
    assert code == 0 and np.array_equal(pixels(again), pixels(swapped))


def test_a_png_naming_a_vae_not_here_runs_with_the_models_own_and_says_so(disk, tmp_path, capsys):
    """A downloaded PNG names the uploader's VAE (`VAE: vae-ft-mse-840000-ema-pruned.safetensors`); A1111 falls back
    to the model's own when it lacks that file, and so does --from-png, with a warning (an explicit --vae refuses)."""
    mine = disk["models"] / "VAE" / "mine.safetensors"
    shutil.copyfile(disk["models"] / "VAE" / "seeded.safetensors", mine)
    try:
        code = main(["generate", "a red fox", "--steps", "1", "--width", str(SIDE), "--height", str(SIDE),
                     "--seed", "3", "--vae", "mine.safetensors", "--outdir", str(tmp_path / "first"), "--json"])
        assert code == 0
        made = json.loads(capsys.readouterr().out)["images"][0]
    finally:
        mine.unlink()
    code = main(["generate", "--from-png", made, "--outdir", str(tmp_path / "again"), "--json"])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    assert "the PNG's VAE 'mine.safetensors' is not in" in captured.err and "pass --vae" in captured.err
    again = json.loads(captured.out)["images"][0]
    assert "VAE:" not in Image.open(again).text["parameters"]


def test_vae_dir_is_where_vae_names_are_found_first(disk, tmp_path, capsys):
    """--vae-dir (A1111's launch flag): a VAE file only there is found by name, listed first, and runs."""
    elsewhere = tmp_path / "my-vaes"
    elsewhere.mkdir()
    shutil.copyfile(disk["models"] / "VAE" / "seeded.safetensors", elsewhere / "only-here.safetensors")
    code = main(["generate", "a red fox", "--steps", "1", "--width", str(SIDE), "--height", str(SIDE),
                 "--vae-dir", str(elsewhere), "--vae", "only-here", "--outdir", str(tmp_path / "out"), "--json"])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    made = json.loads(captured.out)["images"][0]
    assert "VAE: only-here.safetensors" in Image.open(made).text["parameters"]
    # without the flag the name is unknown again (the flag lasts for its command only)
    assert main(["generate", "a red fox", "--steps", "1", "--width", str(SIDE), "--height", str(SIDE),
                 "--vae", "only-here", "--outdir", str(tmp_path / "out2")]) == 2
    assert "invalid VAE: 'only-here'" in capsys.readouterr().err


def test_switching_vaes_keeps_the_model_and_automatic_and_none_give_its_own_back(tmp_path):
    session = Session()
    own = session.generate(_job(tmp_path / "a")).images[0]
    model, unet, vae = session.model, session.model.pipe.unet, session.model.pipe.vae
    seeded = session.generate(_job(tmp_path / "b", vae="seeded.safetensors")).images[0]
    other = session.generate(_job(tmp_path / "c", vae="other")).images[0]
    assert session.model is model and session.model.pipe.unet is unet  # no reload: the vae component only
    assert session.model.pipe.vae is not vae and np.abs(pixels(seeded) - pixels(other)).mean() > 1
    for choice, folder in (("Automatic", "d"), ("None", "e"), ("automatic", "f")):
        back = session.generate(_job(tmp_path / folder, vae=choice)).images[0]
        assert np.array_equal(pixels(back), pixels(own)), choice
        assert session.model.pipe.vae is vae  # the model's own, kept, not read again
        session.generate(_job(tmp_path / f"{folder}2", vae="folder-vae"))


def test_the_plan_counts_the_vae_file_and_the_models_own_kept_beside_it(disk):
    from lowvram_gen.models.profile import profile_builtin, with_vae

    profile = profile_builtin("sd15")
    assert with_vae(profile, "Automatic") is profile and with_vae(profile, "None") is profile
    swapped = with_vae(profile, "seeded-pt.pt")
    assert swapped.params["vae_own"] == profile.params["vae"]
    assert swapped.file_bytes["vae"] == (disk["models"] / "VAE" / "seeded-pt.pt").stat().st_size
    with pytest.raises(InvalidRequest, match="nosuch"):
        with_vae(profile, "nosuch")
    from lowvram_gen.planning.host import kept_bytes
    from lowvram_gen.settings import MemorySettings

    settings = MemorySettings(dtype="float32")
    assert sum(kept_bytes(swapped, settings).values()) - sum(kept_bytes(profile, settings).values()) == \
        4 * profile.params["vae"]


def test_the_api_lists_the_vaes_and_takes_sd_vae_in_override_settings_and_options(disk, tmp_path):
    from servers import Server

    srv = Server(tmp_path, api=True, webui=False)
    try:
        listed = requests.get(f"{srv.api_url}/sd-vae", timeout=30).json()
        assert {"model_name": "seeded.safetensors",
                "filename": str((disk["models"] / "VAE" / "seeded.safetensors").resolve())} in listed
        assert [e["model_name"] for e in listed] == list(vae_files.available())
        body = {"prompt": "a red fox", "seed": 11, "steps": 2, "width": SIDE, "height": SIDE}
        plain = requests.post(f"{srv.api_url}/txt2img", json=body, timeout=300).json()
        job = requests.post(f"{srv.api_url}/txt2img", json={**body, "override_settings": {"sd_vae": "seeded.safetensors"}},
                            timeout=300).json()
        info = json.loads(job["info"])
        assert info["sd_vae_name"] == "seeded.safetensors" and len(info["sd_vae_hash"]) == 10
        assert "VAE: seeded.safetensors" in info["infotexts"][0] and json.loads(plain["info"])["sd_vae_name"] is None
        assert job["images"][0] != plain["images"][0]
        # /options: later jobs' VAE
        assert requests.get(f"{srv.api_url}/options", timeout=30).json()["sd_vae"] == "Automatic"
        assert requests.post(f"{srv.api_url}/options", json={"sd_vae": "seeded.safetensors"}, timeout=30).ok
        assert requests.get(f"{srv.api_url}/options", timeout=30).json()["sd_vae"] == "seeded.safetensors"
        later = json.loads(requests.post(f"{srv.api_url}/txt2img", json=body, timeout=300).json()["info"])
        assert later["sd_vae_name"] == "seeded.safetensors"
        assert requests.post(f"{srv.api_url}/options", json={"sd_vae": "None"}, timeout=30).ok
        # an unknown name and a path: 422 naming the setting and the listing route, as other names are answered
        for value in ("nosuch.safetensors", str(disk["models"] / "VAE" / "seeded.safetensors"), "../VAE/seeded.pt"):
            answer = requests.post(f"{srv.api_url}/txt2img", json={**body, "override_settings": {"sd_vae": value}},
                                   timeout=60)
            assert answer.status_code == 422, value
            detail = answer.json()["detail"][0]
            assert detail["loc"] == ["body", "override_settings", "sd_vae"] and "GET /sdapi/v1/sd-vae" in detail["msg"]
            refused = requests.post(f"{srv.api_url}/options", json={"sd_vae": value}, timeout=30)
            assert refused.status_code == 422 and "GET /sdapi/v1/sd-vae" in refused.json()["detail"]
        assert requests.get(f"{srv.api_url}/options", timeout=30).json()["sd_vae"] == "None"
    finally:
        srv.close()


def test_the_ui_box_offers_automatic_none_and_the_files_and_maps_to_the_request():
    import gradio as gr

    from lowvram_gen.ui import vae_picker

    with gr.Blocks():
        box = vae_picker.build(None, prefix="i2i-")
    assert box.label == "SD VAE" and box.elem_id == "i2i-sd-vae" and box.value == "Automatic"
    offered = [c[0] if isinstance(c, tuple) else c for c in box.choices]
    assert offered == ["Automatic", "None", *vae_files.available()]
    assert vae_picker.request_field("seeded.safetensors") == {"vae": "seeded.safetensors"}
    assert vae_picker.request_field(None) == {"vae": "Automatic"} == vae_picker.request_field("")
    assert GenerationRequest(**vae_picker.request_field("None")).validated().vae == "None"
    assert GenerationRequest(vae=" automatic ").validated().vae == "Automatic"
    with pytest.raises(InvalidRequest, match="vae"):
        GenerationRequest(vae=3).validated()


from ui_helpers import _fill_job, _gallery_image, browser, needs_browser, page, server  # noqa: E402,F401


@needs_browser
def test_the_ui_sd_vae_box_decodes_every_sd_tab_with_the_chosen_vae(page, disk):
    """A1111's SD VAE quicksetting: the box above the tabs lists models/VAE (its Refresh rescans) and the next job
    decodes with the chosen file: its PNG says `VAE: name`."""
    page.click("#sd-vae-refresh")
    page.locator("#sd-vae input").first.click()
    page.get_by_role("option", name="seeded.safetensors").click()
    _fill_job(page, "a red fox", SIDE, SIDE, 1)
    page.click("#generate")
    _gallery_image(page)
    page.wait_for_function("() => document.querySelector('#info textarea').value.includes('VAE: seeded.safetensors')",
                           timeout=120_000)
