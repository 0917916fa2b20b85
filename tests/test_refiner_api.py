"""Issue 32 item 5 through A1111's REST API: `refiner_checkpoint` (a listed checkpoint, by its title or name) and
`refiner_switch_at` run the refiner and the answer's infotext says so; an unlisted one is a 4xx naming it. Over
plain HTTP, and through webuiapi's `custom_post` (webuiapi 0.9.17's `txt2img` has no refiner arguments)."""

from __future__ import annotations

import shutil

import pytest

from api_helpers import _post, api, server  # noqa: F401
from tiny_refiner import save_tiny_refiner  # tests/tiny_refiner.py


@pytest.fixture()
def body(monkeypatch, tmp_path):
    """A txt2img body on the tiny SDXL with the tiny refiner (a checkpoint of the models folder) from half way."""
    models = tmp_path / "models"
    save_tiny_refiner(models / "Stable-diffusion" / "tiny-refiner")
    monkeypatch.setenv("LOWVRAM_GEN_MODELS", str(models))
    yield {"prompt": "a lighthouse", "steps": 3, "width": 64, "height": 64, "seed": 5,
           "override_settings": {"sd_model_checkpoint": "tiny-sdxl"}, "refiner_checkpoint": "tiny-refiner",
           "refiner_switch_at": 0.5}
    shutil.rmtree(models)


def test_refiner_checkpoint_runs_the_refiner_and_an_unlisted_one_is_refused(server, body, tmp_path):
    answer = _post(server, "txt2img", body)
    assert answer.status_code == 200, answer.text
    info = answer.json()["info"]
    assert "Refiner switch at: 0.5" in info and "Refiner: tiny-refiner" in info
    refused = _post(server, "txt2img", dict(body, refiner_checkpoint=str(tmp_path)))
    assert 400 <= refused.status_code < 500 and "refiner_checkpoint" in refused.text


def test_webuiapi_runs_the_refiner_through_its_custom_post(server, api, body):
    """webuiapi's own `txt2img` has no refiner arguments; its `custom_post` sends A1111's body as a plugin does, and
    its result carries the refined image and the infotext's `Refiner:` labels."""
    result = api.custom_post("txt2img", body, baseurl=True)  # baseurl: under /sdapi/v1
    assert result.image.size == (64, 64)
    assert "Refiner: tiny-refiner" in result.info["infotexts"][0]
    assert result.info["infotexts"][0].count("Refiner switch at: 0.5") == 1
