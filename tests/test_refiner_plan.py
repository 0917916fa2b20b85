"""The refiner counted in every candidate of the plan (planning/refiner.RefinerLoad): its RAM in each row's RAM
column and in the RAM refusal, a refiner UNet larger than the base's in the VRAM estimate (tiny folders, simulated
--ram and --vram)."""

from __future__ import annotations

import dataclasses

import pytest

from tiny_refiner import save_tiny_refiner  # tests/tiny_refiner.py
from lowvram_gen import GenerationRequest
from lowvram_gen.hardware.device import simulated
from lowvram_gen.hardware.hostmem import HostMemory
from lowvram_gen.session import Session


@pytest.fixture(scope="module")
def refiner_path(tmp_path_factory):
    return save_tiny_refiner(tmp_path_factory.mktemp("tiny-refiner"))


def job(refiner_path, **kw) -> GenerationRequest:
    return GenerationRequest(**{**dict(prompt="x", model="tiny-sdxl", width=64, height=64, steps=4,
                                       refiner=refiner_path, refiner_switch_at=0.7), **kw})


def card(vram: str, ram: int | None = None):
    found = simulated(vram)
    return found if ram is None else dataclasses.replace(found, host=HostMemory(ram, ram, simulated=True))


def test_each_candidates_ram_holds_the_refiner_and_a_machine_without_room_for_it_is_refused(refiner_path, capsys):
    session = Session()
    alone = session.plan(job(refiner_path, refiner_switch_at=1), card("4", 1 << 40))
    both = session.plan(job(refiner_path), card("4", 1 << 40))
    ram = {r.name: r.host_peak_bytes for r in alone.estimates}
    held = {row.name: row.host["refiner_bytes"] for row in both.estimates}
    for row in both.estimates:  # the same candidates, each with the refiner's weights (and what comes back) on top
        assert row.host["refiner_bytes"] > 0
        assert row.host_peak_bytes == ram[row.name] + row.host["refiner_bytes"]
    assert held[both.preset.name] >= both.refiner.ram_bytes
    # an int8/int4 candidate quantizes the refiner as the base (engines/sd/refiner.load): less of it in RAM
    assert held["medvram+int8"] < held["medvram"] and held["medvram+int4"] < held["medvram+int8"]
    # a machine where the base alone fits at its cheapest but not with the refiner beside it
    least, least_both = min(ram.values()), min(r.host_peak_bytes for r in both.estimates)
    between = (least + least_both) // 2
    assert least < between < least_both
    assert not session.plan(job(refiner_path, refiner_switch_at=1), card("4", between)).refusal
    refused = session.plan(job(refiner_path), card("4", between)).refusal
    assert f"with its refiner {refiner_path}" in refused  # and what would fit: without it, or a smaller base file
    assert "would fit" in refused and ". " not in refused.rstrip(".")  # one sentence
    from lowvram_gen.cli.main import main

    assert main(["plan", "--model", "tiny-sdxl", "--width", "64", "--height", "64", "--vram", "4GB", "--ram",
                 f"{between / 2**20:.4f}MiB", "--refiner", refiner_path, "--refiner-switch-at", "0.7"]) == 0
    assert "would not run:" in capsys.readouterr().out


def test_a_refiner_unet_larger_than_the_bases_is_in_the_vram_estimate(refiner_path, monkeypatch):
    session = Session()
    own = Session._refiner_profile(job(refiner_path))
    base_unet = session.plan(job(refiner_path, refiner_switch_at=1), card("4")).refiner  # None: no refiner
    assert base_unet is None
    big = dataclasses.replace(own, params={**own.params, own.denoiser: own.params[own.denoiser] * 400})
    monkeypatch.setattr(Session, "_refiner_profile", staticmethod(lambda request: big))
    alone = session.plan(job(refiner_path, refiner_switch_at=1), card("4", 1 << 40))
    both = session.plan(job(refiner_path), card("4", 1 << 40))
    vram = {r.name: r.estimate_bytes for r in alone.estimates}
    none = [r for r in both.estimates if r.name == "highvram"]  # offload none: the UNet whole on the card
    assert none and none[0].breakdown["refiner_extra_bytes"] > 0
    assert none[0].estimate_bytes == vram["highvram"] + none[0].breakdown["refiner_extra_bytes"]
    assert both.refiner.extra_vram_bytes > 0
    streamed = [r for r in both.estimates if r.name.startswith(("lowvram", "novram"))]
    assert streamed and all(r.breakdown["refiner_extra_bytes"] == 0 for r in streamed)  # it streams as the base's
    # a card where the base's whole UNet fits but the refiner's does not: the planner picks another preset
    usable = (vram["highvram"] + none[0].estimate_bytes) // 2
    small = dataclasses.replace(card("4", 1 << 40), total_bytes=usable + card("4").reserve_bytes,
                                free_bytes=usable + card("4").reserve_bytes)
    assert session.plan(job(refiner_path, refiner_switch_at=1), small).preset.name == "highvram"
    assert session.plan(job(refiner_path), small).preset.name != "highvram"
