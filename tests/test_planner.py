"""The planner on simulated cards: the fastest preset whose estimate fits, never a faster one with less VRAM."""

from __future__ import annotations

import json

import pytest

from lowvram_gen import failures
from lowvram_gen.cli.main import main
from lowvram_gen.device import GiB, fake, probe
from lowvram_gen.planning.estimate import profile_builtin
from lowvram_gen.planning.planner import plan
from lowvram_gen.presets import find_preset, load_presets

CARDS = [2, 4, 6, 8, 12, 24]
JOBS = [("sd15", 512, 512), ("sd15", 768, 768), ("sdxl", 1024, 1024), ("sdxl", 768, 768)]
# transformer denoisers: SD3-medium (with T5-XXL, 15 GB of half-precision weights) and FLUX.1-dev (34 GB)
TRANSFORMER_JOBS = [("sd3", 1024, 1024), ("sd3", 512, 512), ("flux", 1024, 1024), ("flux", 768, 768)]
BIG_CARDS = [2, 4, 6, 8, 12, 16, 24, 48, 80]
RANK = {"highvram": 0, "medvram": 1, "lowvram": 2, "budget": 3, "novram": 4}


@pytest.mark.parametrize("arch,width,height,cards", [(*j, CARDS) for j in JOBS] + [(*j, BIG_CARDS) for j in TRANSFORMER_JOBS])
def test_less_vram_never_gives_a_faster_preset(arch, width, height, cards):
    presets, profile = load_presets(), profile_builtin(arch)
    picks = [plan(fake(gib), profile, width, height, 1, presets).preset.name for gib in cards]
    ranks = [RANK[p] for p in picks]
    assert ranks == sorted(ranks, reverse=True), dict(zip(cards, picks))
    assert picks[-1] == "highvram"  # the biggest card runs it at full speed (24 GB: SD; 80 GB: Flux with T5-XXL)
    assert RANK[picks[0]] >= RANK["lowvram"]  # a 2 GB card: block or leaf offload, nothing whole


@pytest.mark.parametrize("gib", BIG_CARDS)
@pytest.mark.parametrize("arch,width,height", JOBS + TRANSFORMER_JOBS)
def test_the_chosen_preset_fits_and_every_faster_one_does_not(gib, arch, width, height):
    device = fake(gib)
    result = plan(device, profile_builtin(arch), width, height, 1, load_presets())
    by_name = {e.name: e for e in result.estimates}
    chosen = by_name[result.preset.name]
    if chosen.fits:
        assert chosen.estimate_bytes <= device.usable_bytes
        for e in result.estimates[: RANK[result.preset.name]]:
            assert not e.fits and e.estimate_bytes > device.usable_bytes
    else:  # nothing fits: start at the cheapest, the ladder lowers the resolution if it must
        assert result.preset.name == "novram" and not any(e.fits for e in result.estimates)
    assert [p.name for p in result.ladder] == [n for n in RANK if RANK[n] >= RANK[result.preset.name]]


def test_known_cards():
    presets = load_presets()
    sd15, sdxl = profile_builtin("sd15"), profile_builtin("sdxl")
    assert plan(fake(2), sd15, 512, 512, 1, presets).preset.name in ("lowvram", "novram")
    assert plan(fake(8), sd15, 512, 512, 1, presets).preset.name == "highvram"
    assert plan(fake(4), sdxl, 1024, 1024, 1, presets).preset.name in ("lowvram", "novram")
    assert RANK[plan(fake(8), sdxl, 1024, 1024, 1, presets).preset.name] >= 1  # SDXL does not fit whole in 8 GB


def test_known_cards_transformers():
    presets = load_presets()
    sd3, flux = profile_builtin("sd3"), profile_builtin("flux")
    # 8 GB: T5-XXL alone is 9.5 GB in half precision. Model offload moves it whole; group offload
    # streams text encoders leaf by leaf (apply.PipelineOps.group_offload: block-level grouping would
    # move a T5EncoderModel whole, it has no top-level block list), so lowvram fits both
    for profile in (sd3, flux):
        chosen = plan(fake(8), profile, 1024, 1024, 1, presets).preset
        assert chosen.name == "lowvram" and chosen.memory.offload == "group"
    assert plan(fake(24), sd3, 1024, 1024, 1, presets).preset.name == "highvram"  # 15.4 GB of weights
    assert RANK[plan(fake(24), flux, 1024, 1024, 1, presets).preset.name] >= RANK["medvram"]  # 34 GB of weights
    assert plan(fake(80), flux, 1024, 1024, 1, presets).preset.name == "highvram"
    # Flux batches no CFG: the guidance scale changes nothing
    with_cfg = plan(fake(24), flux, 1024, 1024, 1, presets, cfg=True).estimates
    without = plan(fake(24), flux, 1024, 1024, 1, presets, cfg=False).estimates
    assert [e.estimate_bytes for e in with_cfg] == [e.estimate_bytes for e in without]


def test_budget_and_reserve_shrink_what_is_usable():
    presets, sdxl = load_presets(), profile_builtin("sdxl")
    roomy = plan(fake(24), sdxl, 1024, 1024, 1, presets)
    capped = plan(fake(24, budget_bytes=4 * GiB), sdxl, 1024, 1024, 1, presets)
    reserved = plan(fake(24, reserve_bytes=20 * GiB), sdxl, 1024, 1024, 1, presets)
    assert roomy.preset.name == "highvram"
    assert RANK[capped.preset.name] > RANK[roomy.preset.name] and RANK[reserved.preset.name] > RANK[roomy.preset.name]


def test_forced_and_remembered_and_cpu():
    presets, sd15 = load_presets(), profile_builtin("sd15")
    forced = plan(fake(24), sd15, 512, 512, 1, presets, forced=find_preset("lowvram"))
    assert forced.preset.name == "lowvram" and [p.name for p in forced.ladder] == ["lowvram", "budget", "novram"]
    skipped = plan(fake(24), sd15, 512, 512, 1, presets, failed={"highvram"})
    assert skipped.preset.name == "medvram"
    assert plan(probe("cpu"), sd15, 512, 512, 1, presets).preset.name == "cpu"


def test_a_remembered_failure_moves_the_next_comparable_job_down():
    failures.record(fake(8).name, "sdxl", "medvram", 1024 * 1024, 1)
    failed = failures.failed_presets(fake(8).name, "sdxl", 1024 * 1024, 1)
    result = plan(fake(8), profile_builtin("sdxl"), 1024, 1024, 1, load_presets(), failed=failed)
    assert RANK[result.preset.name] > RANK["medvram"]


def test_plan_cli_json(capsys):
    code = main(["plan", "--vram", "6GiB", "--model", "sdxl", "--width", "1024", "--height", "1024", "--json"])
    out = json.loads(capsys.readouterr().out)
    assert code == 0
    assert out["preset"] in RANK
    assert [p["name"] for p in out["presets"]] == list(RANK)
    assert all(isinstance(p["estimate_bytes"], int) and isinstance(p["fits"], bool) for p in out["presets"])
    chosen = next(p for p in out["presets"] if p["name"] == out["preset"])
    assert chosen["fits"] or out["preset"] == "novram"


@pytest.mark.parametrize("model", ["sd3", "flux"])
def test_plan_cli_json_transformers(capsys, model):
    code = main(["plan", "--vram", "8GiB", "--model", model, "--width", "1024", "--height", "1024", "--json"])
    out = json.loads(capsys.readouterr().out)
    assert code == 0 and out["model"] == model
    assert out["preset"] == "lowvram"
    chosen = next(p for p in out["presets"] if p["name"] == out["preset"])
    assert chosen["fits"] and chosen["estimate_bytes"] <= out["device"]["usable_bytes"]
    assert (chosen["width"], chosen["height"]) == (768, 768)  # lowvram's cap; upscaled after
    medvram = next(p for p in out["presets"] if p["name"] == "medvram")
    assert not medvram["fits"]  # model offload moves T5-XXL (9.5 GB) onto the card whole


def test_plan_cli_text_and_errors(capsys):
    assert main(["plan", "--vram", "4GiB", "--model", "sd15"]) == 0
    text = capsys.readouterr().out
    assert "would run:" in text and "highvram" in text and "novram" in text
    assert main(["plan", "--vram", "lots", "--model", "sd15"]) == 2
    assert "--vram" in capsys.readouterr().err
    assert main(["plan", "--model", "sd15", "--width", "1003"]) == 2


def test_estimates_use_the_vae_tile_apply_gives_this_card():
    """A 2 GiB card decodes in 256 px tiles (apply.vae_tile_size), a 16 GiB card in 1024 px ones: each
    plan must count the tiles that card will use, not diffusers' default 512 px ones."""
    from lowvram_gen.planning.sizes import vae_tile_size
    from lowvram_gen.planning.estimate import estimate

    presets, profile = load_presets(), profile_builtin("sd15")
    assert presets["lowvram"].memory.vae_tiling
    default = estimate(profile, 768, 768, 1, presets["lowvram"].memory).vae_bytes
    vae = {}
    for gib in (2, 16):
        lowvram = next(e for e in plan(fake(gib), profile, 768, 768, 1, presets).estimates if e.name == "lowvram")
        assert (lowvram.width, lowvram.height) == (768, 768)
        vae[vae_tile_size(fake(gib))] = lowvram.breakdown["vae_bytes"]
    assert vae[256] < default < vae[1024]  # a 768 px image is one 1024 px tile: decoded whole


def test_plan_takes_the_hub_ids_and_aliases_of_known_models_offline(capsys):
    for spec in ("sd3-medium", "black-forest-labs/FLUX.1-dev", "stabilityai/stable-diffusion-xl-base-1.0"):
        assert main(["plan", "--vram", "8GiB", "--model", spec, "--width", "1024", "--height", "1024", "--json"]) == 0
        data = json.loads(capsys.readouterr().out)
        assert data["model"] == spec and data["preset"] in RANK and len(data["presets"]) == 4
