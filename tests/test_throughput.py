"""doctor's compute measurement (lowvram_gen/hardware/throughput.py): half-precision matmul FLOP/s and the int8/int4
slowdown of a GPU, stored beside its bus and used by the planner. The CUDA timing needs a GPU; these tests run
the same code on the CPU with timers of their own."""

from __future__ import annotations

import pytest

from lowvram_gen.cli.doctor import _format_bus, measure_bus
from lowvram_gen.hardware import throughput
from lowvram_gen.hardware.device import MiB, fake
from lowvram_gen.models.profile import profile_builtin
from lowvram_gen.planning import bus, timing
from lowvram_gen.planning.planner import plan
from lowvram_gen.presets import load_presets

SMALL = dict(side=128, shape=(64, 32, 48))


class Scripted:
    """A timer that runs the function (so the real layers run) and reports scripted seconds in turn."""

    def __init__(self, *seconds):
        self.seconds, self.calls = list(seconds), 0

    def __call__(self, fn):
        fn()
        self.calls += 1
        return self.seconds.pop(0)


def test_matmul_flops_is_the_median_of_timed_runs_after_a_warm_up():
    timer = Scripted(9.0, 0.002, 0.001, 0.003)  # the warm-up (9 s) is not counted
    flops = throughput.matmul_flops("cpu", "float32", side=128, repeats=3, timed=timer)
    assert flops == pytest.approx(2 * 128 ** 3 / 0.002) and timer.calls == 4


def test_the_slowdown_is_the_quantized_layers_time_over_the_16_bit_ones():
    pytest.importorskip("sdnq")
    # warm-up + 3 for the 16-bit layer, then for int8 and int4
    timer = Scripted(1, 0.010, 0.010, 0.010, 1, 0.012, 0.013, 0.011, 1, 0.020, 0.019, 0.021)
    slow = throughput.quantized_slowdown("cpu", dtype="float32", shape=(64, 32, 48), repeats=3, timed=timer)
    assert slow == {"int8": pytest.approx(1.2), "int4": pytest.approx(2.0)}


def test_the_real_layers_run_and_give_plausible_figures_on_this_cpu():
    pytest.importorskip("sdnq")
    result = throughput.measure("cpu", repeats=2, timed=throughput.wall_timed, dtype="float32", **SMALL)
    assert result.half_flops_per_s > 1e6 and set(result.slowdown) == {"int8", "int4"}
    assert all(v > 0 for v in result.slowdown.values())


def test_without_a_timer_only_cuda_is_measured():
    with pytest.raises(ValueError, match="available CUDA device, not 'cpu'"):
        throughput.measure("cpu")


def test_doctor_stores_the_compute_beside_the_bus_and_the_planner_uses_it(monkeypatch):
    """doctor's CUDA branch, with the copies and the compute measurement simulated (no GPU here): the stored
    FLOP/s and slowdowns replace timing.py's assumptions in the plan of that card."""
    measured = throughput.Compute(40e12, {"int8": 1.5, "int4": 2.5}, "float16")
    monkeypatch.setattr(throughput, "measure", lambda device, timed=None: measured)
    device = fake(0.125, reserve_bytes=0)

    def copy(host, device):
        return 32 * MiB / 12e9

    info = measure_bus(device, timed_copy=copy)
    assert info["compute"] == measured.as_dict()
    used = bus.for_device(device.name)
    assert used.half_flops == 40e12 and used.slowdown == {"int8": 1.5, "int4": 2.5}
    assert "compute: 40.0 TFLOP/s float16 matmul" in _format_bus(info) and "int8 x1.50" in _format_bus(info)
    big = fake(24, name=device.name)
    rows = {e.name: e for e in plan(big, profile_builtin("sdxl"), 1024, 1024, 1, load_presets()).estimates}
    assumed = {e.name: e for e in plan(fake(24), profile_builtin("sdxl"), 1024, 1024, 1, load_presets()).estimates}
    # 4x the assumed 10 TFLOP/s: a resident step takes a quarter; int8 is 1.5x its 16-bit step, not 1.1x
    assert rows["highvram"].est_seconds_per_step == pytest.approx(assumed["highvram"].est_seconds_per_step / 4)
    assert rows["highvram+int8"].est_seconds_per_step == pytest.approx(rows["highvram"].est_seconds_per_step * 1.5)
    assert timing.SLOWDOWN["int8"] != 1.5


def test_implausible_stored_compute_falls_back_to_the_assumptions():
    bus.store("card", 12e9, half_flops_per_s=5.0, slowdown={"int8": True, "int4": 1e9, "fp8": 2.0})
    used = bus.for_device("card")
    assert used.measured and used.half_flops is None and used.slowdown is None


def test_a_failed_compute_measurement_still_stores_the_bus(monkeypatch):
    def broken(device, timed=None):
        raise RuntimeError("CUDA out of memory")

    monkeypatch.setattr(throughput, "measure", broken)
    info = measure_bus(fake(0.125, reserve_bytes=0), timed_copy=lambda host, device: 32 * MiB / 12e9)
    assert info["compute"] is None and info["measured"] is not None
    assert bus.for_device(fake(0.125, reserve_bytes=0).name).half_flops is None


@pytest.mark.cuda
def test_doctor_measures_the_compute_for_real():
    result = throughput.measure("cuda", repeats=3)
    assert 1e12 <= result.half_flops_per_s <= 5e15 and all(0.3 < v < 20 for v in result.slowdown.values())
