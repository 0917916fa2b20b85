"""The planner's caches change no plan: two plans held here as the planner made them before it cached anything
(commit 59cd2be), in the numbers `plan --json` prints. SDXL on 4 GiB is a budget split, bisected and sized again
under every rung of its ladder (residency.split's cached trees and splits, the per-plan estimates); HiDream at 512 px
on 12 GiB (rendered at 1024 px) is the largest budget ladder of an int8 plan. test_plan_families' nearest-card tests
hold sentences of the search (planning/planner.shared_estimates).
benchmarks/plan_speed.py compares a wider set (every family at 2 to 12 GiB, ControlNets, capped sizes) in the same way.
"""

from __future__ import annotations

import json

import pytest

from lowvram_gen.cli.main import main


def _plan(capsys, *args: str) -> dict:
    assert main(["plan", *args, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def _numbers(result: dict) -> tuple:
    """The pick, its ladder, the chosen row's bytes, and sums over every row (any row's estimate or host peak
    changing changes them)."""
    rows = result["presets"]
    chosen = next(r for r in rows if r["name"] == result["preset"])
    return (result["preset"], result["ladder"], chosen["estimate_bytes"], chosen["streamed_bytes_per_step"],
            chosen["breakdown"].get("resident_bytes"), chosen["host_peak_bytes"], len(rows),
            sum(r["estimate_bytes"] for r in rows), sum(r["host_peak_bytes"] for r in rows), result["nearest"])


@pytest.mark.parametrize("args, expected", [
    (("--model", "sdxl", "--vram", "4GiB", "--ram", "16GiB"),
     ("budget@2.7GiB", ["budget@2.7GiB", "budget@2.0GiB", "budget@1.3GiB", "budget@922MiB", "novram"],
      3756995960, 2181947520, 2890739200, 8056926686, 20, 85501483787, 131352567524, "")),
    (("--model", "hidream", "--vram", "12", "--ram", "32", "--width", "512", "--height", "512"),
     ("budget+int8+unpinned+te-reload@9.6GiB",
      ["budget+int8+unpinned+te-reload@9.6GiB", "budget+int8+unpinned+te-reload@7.3GiB",
       "budget+int8+unpinned+te-reload@5.5GiB", "budget+int8+unpinned+te-reload@4.0GiB", "budget+int4@3.0GiB",
       "budget+int4@2.1GiB", "budget+int4@1.3GiB", "budget+int4+unpinned@721MiB", "budget+int4+unpinned@228MiB",
       "lowvram+int4+unpinned"],
      12347730566, 6957899988, 10320589426, 27745793751, 35, 514486917372, 1755594906919,
      # before the caches this said "does not fit at its full size ... fits on nothing up to a 80 GiB card": the
      # nearest-card check compared the rows (at the 1024x1024 HiDream renders) with the 512x512 asked, a bug fixed
      # since (nearest.plan_nearest passes the rendered size); the plan's numbers above are unchanged
      "")),
])
def test_the_plan_is_the_one_made_before_the_caches(capsys, monkeypatch, tmp_path, args, expected):
    monkeypatch.setenv("LOWVRAM_GEN_HOME", str(tmp_path))  # no remembered failures or measured step times
    assert _numbers(_plan(capsys, *args)) == expected
