"""Issue 32 item 5 through A1111's REST API: `refiner_checkpoint` (a listed checkpoint, by its title or name) and
`refiner_switch_at` run the refiner and the answer's infotext says so; an unlisted one is a 4xx naming it. Plain HTTP:
webuiapi 0.9.17's txt2img has no refiner arguments (its `txt2img` takes no extra keys)."""

from __future__ import annotations

import shutil

from api_helpers import _post, server  # noqa: F401
from tiny_refiner import save_tiny_refiner  # tests/tiny_refiner.py


def test_refiner_checkpoint_runs_the_refiner_and_an_unlisted_one_is_refused(server, monkeypatch, tmp_path):
    models = tmp_path / "models"
    save_tiny_refiner(models / "Stable-diffusion" / "tiny-refiner")
    monkeypatch.setenv("LOWVRAM_GEN_MODELS", str(models))
    body = {"prompt": "a lighthouse", "steps": 3, "width": 64, "height": 64, "seed": 5,
            "override_settings": {"sd_model_checkpoint": "tiny-sdxl"}, "refiner_checkpoint": "tiny-refiner",
            "refiner_switch_at": 0.5}
    answer = _post(server, "txt2img", body)
    assert answer.status_code == 200, answer.text
    info = answer.json()["info"]
    assert "Refiner switch at: 0.5" in info and "Refiner: tiny-refiner" in info
    refused = _post(server, "txt2img", dict(body, refiner_checkpoint=str(tmp_path)))
    assert 400 <= refused.status_code < 500 and "refiner_checkpoint" in refused.text
    shutil.rmtree(models)
