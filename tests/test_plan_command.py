"""`lowvram-gen plan` prints the plan `generate` runs (issue 28): both ask the Session, so the same flags, presets
folder and remembered failures give the same pick. `plan` built its own plan before, without --xformers, the
session's presets folder and the remembered failures.
"""

from __future__ import annotations

import dataclasses
import json
import shutil

import pytest

from lowvram_gen import failures
from lowvram_gen.cli import main as cli_main
from lowvram_gen.hardware.device import DEFAULT_RESERVE, simulated
from lowvram_gen.hardware.hostmem import simulated_host
from lowvram_gen.planning import planner
from lowvram_gen.presets import presets_dir
from lowvram_gen.request import GenerationRequest
from lowvram_gen.session import Session

CARD, RAM = "4GiB", "64GiB"


@pytest.fixture()
def picks(monkeypatch):
    """Every plan the planner makes in this test, wherever it is called from (the Session or the old plan command)."""
    made = []
    real = planner.plan

    def recording(*args, **kwargs):
        made.append(real(*args, **kwargs))
        return made[-1]

    monkeypatch.setattr(planner, "plan", recording)
    import lowvram_gen.session as session_mod

    monkeypatch.setattr(session_mod, "plan", recording, raising=False)
    return made


def test_plan_picks_what_generate_runs_with_xformers_a_presets_folder_and_a_remembered_failure(
        tmp_path, monkeypatch, capsys, picks):
    folder = tmp_path / "presets"
    shutil.copytree(presets_dir(), folder)
    (folder / "medvram.toml").unlink()  # this session's presets: no medvram, so the step below highvram is another
    session_kwargs = cli_main._session_kwargs

    def with_folder(args):  # the Session a front end makes with its own presets folder (Session(presets_dir=...))
        return {**session_kwargs(args), "presets_dir": str(folder)}

    monkeypatch.setattr(cli_main, "_session_kwargs", with_folder)
    device = dataclasses.replace(simulated(CARD, reserve_bytes=DEFAULT_RESERVE), host=simulated_host(RAM))
    failures.record(device.name, "tiny", "highvram", 64 * 64, 1, kind="cuda")  # highvram ran out of memory here

    # generate's pick: the Session's plan of the request on that card
    request = GenerationRequest(model="tiny", width=64, height=64)
    ran = Session(xformers=True, presets_dir=str(folder)).plan(request, device)
    assert ran.preset.name != "highvram" and ran.preset.memory.attention == "xformers"  # the failure, --xformers
    assert not any(p.name.startswith("medvram") for p in ran.ladder)  # the folder's presets
    picks.clear()

    # plan's pick, from the command line with the same flags
    assert cli_main.main(["plan", "--vram", CARD, "--ram", RAM, "--xformers", "--model", "tiny", "--width", "64",
                          "--height", "64", "--json"]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed["preset"] == ran.preset.name and printed["ladder"] == [p.name for p in ran.ladder]
    assert [p["name"] for p in printed["presets"]] == [e.name for e in ran.estimates]
    (planned,) = picks
    assert planned.preset.memory.attention == "xformers"
    assert planned.preset == ran.preset and planned.ladder == ran.ladder  # the same preset files, as flagged
