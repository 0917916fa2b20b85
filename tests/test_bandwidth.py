"""Host-to-device bandwidth: measured by doctor (lowvram_gen/hardware/bandwidth.py), stored, used by the planner.

Without a GPU the measurement runs through the same functions with a copy whose time the test sets,
so the arithmetic (warm-up dropped, median, bytes / seconds) is checked exactly; a CUDA test measures
for real.
"""

from __future__ import annotations

import json
import math
from datetime import date

import pytest

from lowvram_gen.cli.doctor import _format_bus, measure_bus
from lowvram_gen.cli.main import main
from lowvram_gen.hardware import bandwidth
from lowvram_gen.hardware.device import MiB, fake
from lowvram_gen.models.profile import profile_builtin
from lowvram_gen.planning import bus
from lowvram_gen.planning.planner import ASSUMED_STEPS, plan
from lowvram_gen.planning.timing import BUS_BYTES_PER_S
from lowvram_gen.presets import load_presets


class Copies:
    """A timed copy that returns the given seconds in turn and records what it was asked to copy."""

    def __init__(self, *seconds: float):
        self.seconds, self.calls = list(seconds), []

    def __call__(self, host, device) -> float:
        self.calls.append((host.numel() * host.element_size(), str(device)))
        return self.seconds.pop(0)


def test_copy_rate_drops_the_warm_up_and_takes_the_median():
    import torch

    host = torch.ones(MiB, dtype=torch.uint8)
    copies = Copies(100.0, 0.004, 0.001, 9.0, 0.002, 0.003)  # warm-up, then 5 timed copies: median 0.003 s
    rate = bandwidth.copy_rate(host, "cpu", repeats=5, timed_copy=copies)
    assert rate == pytest.approx(MiB / 0.003)
    assert copies.calls == [(MiB, "cpu")] * 6 and copies.seconds == []


def test_measure_times_pinned_then_pageable_copies_of_the_asked_size():
    copies = Copies(1.0, 0.001, 0.001, 0.001, 1.0, 0.004, 0.002, 0.004)  # 3 pinned copies, then 3 pageable
    result = bandwidth.measure("cpu", nbytes=2 * MiB, repeats=3, timed_copy=copies)
    assert result.pinned_bytes_per_s == pytest.approx(2 * MiB / 0.001)
    assert result.pageable_bytes_per_s == pytest.approx(2 * MiB / 0.004)
    assert (result.copy_bytes, result.repeats) == (2 * MiB, 3) and len(copies.calls) == 8
    assert bandwidth.measure("cpu", MiB, 1, pageable=False, timed_copy=Copies(1, 1)).pageable_bytes_per_s is None


def test_measure_refuses_what_it_cannot_time():
    with pytest.raises(ValueError, match="'cpu'"):
        bandwidth.measure("cpu", MiB)  # no CUDA events to time a copy to the CPU with
    with pytest.raises(ValueError, match="repeats"):
        bandwidth.measure("cpu", MiB, repeats=0, timed_copy=Copies(1))
    with pytest.raises(RuntimeError, match="0.0 s"):
        bandwidth.measure("cpu", MiB, repeats=1, timed_copy=Copies(1.0, 0.0))


def test_no_stored_measurement_is_the_assumption():
    used = bus.for_device(fake(8).name)
    assert used == bus.ASSUMPTION and used.bytes_per_s == BUS_BYTES_PER_S and not used.warning
    assert used.source == "assumed PCIe 4.0 x16"


def test_a_stored_measurement_is_used_for_its_gpu_only_and_others_are_kept():
    bus.store("card A", 12e9, 6e9, date(2025, 6, 1))
    bus.store("card B", 30e9)
    bus.store("card A", 11e9, None, date(2025, 6, 2))  # measured again: replaces A's record only
    a, b = bus.for_device("card A"), bus.for_device("card B")
    assert (a.bytes_per_s, a.source, a.measured) == (11e9, "measured by doctor on 2025-06-02", True)
    assert b.bytes_per_s == 30e9 and b.source == f"measured by doctor on {date.today().isoformat()}"
    assert bus.for_device("card C") == bus.ASSUMPTION
    stored = json.loads(bus.path().read_text())
    assert stored["card A"]["device"] == "card A" and stored["card A"]["pinned"] is True
    with pytest.raises(ValueError, match="not plausible"):
        bus.store("card A", 0.0)


@pytest.mark.parametrize("content,why", [
    ("{not json", "not readable JSON"),
    ("[1, 2]", "not a bus measurement file"),
    ('{"card A": "fast"}', "not a bus measurement file"),
    ('{"card A": {"bus_bytes_per_s": "fast"}}', "no plausible bus_bytes_per_s for 'card A'"),
    ('{"card A": {"bus_bytes_per_s": -5}}', "no plausible"),
    ('{"card A": {"bus_bytes_per_s": NaN}}', "not readable JSON (not finite: NaN"),  # safe_json refuses NaN
    ('{"card A": {"bus_bytes_per_s": 1e30}}', "no plausible"),
    ('{"card A": {"date": "2025-06-01"}}', "no plausible"),
])
def test_a_corrupt_or_foreign_file_warns_and_falls_back_to_the_assumption(content, why):
    bus.path().parent.mkdir(parents=True, exist_ok=True)
    bus.path().write_text(content)
    used = bus.for_device("card A")
    assert used.bytes_per_s == BUS_BYTES_PER_S and not used.measured and used.source == bus.ASSUMED
    assert why in used.warning and "using the assumed PCIe 4.0 x16 bandwidth" in used.warning
    bus.store("card A", 12e9)  # measuring again replaces a file that is not ours
    assert bus.for_device("card A").bytes_per_s == 12e9


def test_a_measured_bus_changes_the_step_time_of_streamed_candidates_only():
    device, profile = fake(4), profile_builtin("sdxl")
    before = plan(device, profile, 1024, 1024, 1, load_presets())
    bus.store(device.name, 5e9, when=date(2025, 6, 1))
    after = plan(device, profile, 1024, 1024, 1, load_presets())
    assert before.as_dict()["bus"] == {"bytes_per_s": BUS_BYTES_PER_S, "source": "assumed PCIe 4.0 x16",
                                       "measured": False}
    assert after.as_dict()["bus"] == {"bytes_per_s": 5e9, "source": "measured by doctor on 2025-06-01",
                                      "measured": True}
    old = {r.name: r for r in before.estimates}
    streamed = [r for r in after.estimates if r.streamed_bytes_per_step > 0]
    assert streamed and "highvram" in old
    for row in after.estimates:
        moved = row.streamed_bytes_per_step + row.breakdown["moved_bytes_per_job"] / ASSUMED_STEPS
        expected = old[row.name].est_seconds_per_step + moved * (1 / 5e9 - 1 / BUS_BYTES_PER_S)
        assert row.est_seconds_per_step == pytest.approx(expected), row.name
    assert after.estimates[0].est_seconds_per_step == old[after.estimates[0].name].est_seconds_per_step  # highvram


def test_plan_cli_says_which_bandwidth_it_used(capsys):
    args = ["plan", "--vram", "4GB", "--model", "sdxl"]
    assert main(args + ["--json"]) == 0
    assert json.loads(capsys.readouterr().out)["bus"]["source"] == "assumed PCIe 4.0 x16"
    bus.store("simulated 4GB card", 12e9, when=date(2025, 6, 1))
    assert main(args) == 0
    assert "bus: 12.0 GB/s host-to-device (measured by doctor on 2025-06-01)" in capsys.readouterr().out
    bus.path().write_text("{not json")
    assert main(args + ["--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["bus"]["bytes_per_s"] == BUS_BYTES_PER_S and not out["bus"]["measured"]
    assert any("not readable JSON" in w for w in out["warnings"])


def test_doctor_on_this_machine_says_the_bus_is_not_measured(capsys):
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA: doctor measures (test_doctor_measures_the_bus_for_real)")
    assert main(["doctor"]) == 0
    out = capsys.readouterr().out
    assert "bus:         not measured: no CUDA device" in out
    assert "the planner uses 25.0 GB/s (assumed PCIe 4.0 x16)" in out
    assert main(["doctor", "--json", "--skip-bus"]) == 0
    info = json.loads(capsys.readouterr().out)["bus"]
    assert info["note"] == "not measured: --skip-bus" and info["measured"] is None
    assert not bus.path().exists()


def test_doctor_stores_what_it_measured_on_a_cuda_device_and_the_planner_uses_it():
    """doctor's CUDA branch with a copy timed by the test: 32 MiB copies (a quarter of 128 MiB usable)."""
    device = fake(0.125, reserve_bytes=0)
    seconds = 32 * MiB / 12e9
    info = measure_bus(device, timed_copy=Copies(*[seconds] * 12))
    assert info["measured"]["pinned_bytes_per_s"] == pytest.approx(12e9)
    assert info["measured"]["copy_bytes"] == 32 * MiB and info["stored_in"] == str(bus.path())
    assert info["planner"]["measured"] and info["planner"]["bytes_per_s"] == pytest.approx(12e9)
    assert plan(device, profile_builtin("sd15"), 512, 512, 1, load_presets()).bus.bytes_per_s == pytest.approx(12e9)
    text = _format_bus(info)
    assert text.startswith("12.0 GB/s pinned, 12.0 GB/s pageable host-to-device (32 MiB copies, median of 5)")
    assert "the planner uses 12.0 GB/s (measured by doctor on" in text


def test_doctor_reports_a_failed_or_impossible_measurement_and_stores_nothing():
    def out_of_memory(host, device):
        raise RuntimeError("CUDA out of memory")

    failed = measure_bus(fake(0.125, reserve_bytes=0), timed_copy=out_of_memory)
    assert failed["note"] == "not measured: CUDA out of memory" and failed["measured"] is None
    small = measure_bus(fake(0.1, reserve_bytes=0), timed_copy=Copies())
    assert small["note"].startswith("not measured:") and "too little" in small["note"]
    assert not bus.path().exists() and failed["planner"]["source"] == bus.ASSUMED


@pytest.mark.cuda
def test_doctor_measures_the_bus_for_real(capsys):
    import torch

    result = bandwidth.measure("cuda", 64 * MiB, repeats=3)
    for rate in (result.pinned_bytes_per_s, result.pageable_bytes_per_s):
        assert 1e9 <= rate <= 100e9 and math.isfinite(rate)
    assert main(["doctor"]) == 0
    assert "pinned" in capsys.readouterr().out
    used = bus.for_device(torch.cuda.get_device_name(torch.cuda.current_device()))
    assert used.measured and 1e9 <= used.bytes_per_s <= 100e9
