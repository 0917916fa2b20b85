"""The NV noise source (lowvram_gen/rng.py): Philox4x32-10 against Random123's known-answer vectors, the normals
against torch's CUDA randn as published for seeds 0 and 42 (copies and provenance of every value: docs/rng_nv_sources.md),
and, on a machine with a CUDA card, against the card itself."""

import numpy as np
import pytest

from lowvram_gen import rng


def _words(line: str):
    return [int(w, 16) for w in line.split()]


# docs/rng_nv_sources.md section 1: Random123's kat_vectors (DEShawResearch/fs123 core123/ut/ut_philox.cpp)
KAT_10 = [
    "00000000 00000000 00000000 00000000 00000000 00000000   6627e8d5 e169c58d bc57ac4c 9b00dbd8",
    "ffffffff ffffffff ffffffff ffffffff ffffffff ffffffff   408f276d 41c83b0e a20bc7c6 6d5451fd",
    "243f6a88 85a308d3 13198a2e 03707344 a4093822 299f31d0   d16cfe09 94fdcceb 5001e420 24126ea1",
]
KAT_7 = "00000000 00000000 00000000 00000000 00000000 00000000   5f6fb709 0d893f64 4f121f81 4f730a48"


@pytest.mark.parametrize("line", KAT_10)
def test_philox4x32_10_gives_random123s_known_answers(line):
    words = _words(line)
    out = rng.philox4x32([[w] for w in words[:4]], [[w] for w in words[4:6]])
    assert [int(w[0]) for w in out] == words[6:]


def test_philox_rounds_are_a_parameter():
    words = _words(KAT_7)
    out = rng.philox4x32([[w] for w in words[:4]], [[w] for w in words[4:6]], rounds=7)
    assert [int(w[0]) for w in out] == words[6:]


def test_philox_is_vectorised_over_counters():
    lines = [_words(line) for line in KAT_10]
    counters = [[line[i] for line in lines] for i in range(4)]
    keys = [[line[4 + i] for line in lines] for i in range(2)]
    out = rng.philox4x32(counters, keys)
    assert out.T.tolist() == [line[6:] for line in lines]


# docs/rng_nv_sources.md section 2: kapilsh/cuda-mode-lecture README.md, torch.manual_seed(0), three CUDA randn draws
SEED0_FIRST = np.array([
    [-0.9247, -0.4253, -2.6438, 0.1452, -0.1209, -0.5797, -0.6229, -0.3284],
    [-1.0745, -0.3631, -1.6711, 2.2655, 0.3117, -0.1842, 1.2866, 1.1820],
    [-0.1271, 1.2169, 1.4353, 1.0605, -0.4941, -1.4244, -0.7244, -1.2973],
    [0.0697, -0.0074, 1.8969, 0.6878, -0.0779, -0.8373, 1.3506, -0.2879],
    [-0.5965, -0.3283, -0.9086, -0.8059, -0.7407, -0.0504, 0.5435, 1.5150],
    [0.0141, 0.4532, 1.6349, 0.7124, -0.1806, 1.0252, -1.4622, -0.7554],
    [-0.1836, 0.3824, 0.3918, -0.0830, 0.8971, -1.1123, 0.1116, 0.4863],
    [-0.5499, -0.3231, -0.5469, 0.9049, 0.2837, 0.1210, 0.4730, -1.0823]])
SEED0_RELU = np.array([  # max(first + 0.5 * second + third, 0): the second (8, 8) and third (1, 8) draws
    [1.7098e+00, 0, 0, 0, 6.7049e-01, 0, 3.4424e-01, 1.1223e-02],
    [1.8750e+00, 0, 0, 2.2105e+00, 6.6808e-01, 0, 1.8445e+00, 1.9246e+00],
    [2.2614e+00, 1.3964e+00, 5.1802e-01, 2.0114e+00, 0, 0, 2.7715e-01, 0],
    [2.4750e+00, 0, 1.9079e+00, 5.4869e-01, 3.7923e-01, 0, 3.1791e+00, 6.6843e-01],
    [1.8234e+00, 0, 1.1147e-01, 0, 0, 0, 2.4250e+00, 3.2593e+00],
    [2.2903e+00, 0, 1.1721e+00, 6.9331e-01, 1.0583e+00, 6.7518e-01, 0, 2.6185e-01],
    [1.5804e+00, 0, 9.0740e-01, 1.6670e-01, 5.5230e-02, 0, 1.5325e+00, 3.5984e-01],
    [1.5554e+00, 0, 0, 9.4380e-01, 2.9795e-03, 7.4125e-02, 1.6286e+00, 0]])
# printed to 4 decimals (5 digits): half a unit of the last digit, plus the card's float32 sinf/logf rounding
PRINTED = 5e-5 + 2e-6


def test_nv_noise_is_torch_cuda_randn_seed_0():
    assert np.abs(rng.randn(0, (8, 8)) - SEED0_FIRST).max() <= PRINTED


def test_nv_noise_continues_as_the_cuda_generator_does():
    """The second and third draws of one generator: its offset moves on by one Philox block per draw."""
    g = rng.Philox(0)
    first, second, third = g.randn((8, 8)), g.randn((8, 8)), g.randn((1, 8))
    assert np.abs(first - SEED0_FIRST).max() <= PRINTED
    assert np.abs(np.maximum(first + 0.5 * second + third, 0) - SEED0_RELU).max() <= 2 * PRINTED
    assert g.offset == 12


# docs/rng_nv_sources.md section 3: flashinfer's docstrings, torch.manual_seed(42), CUDA randn
SEED42_2x5 = np.array([[0.1940, 2.1614, -0.1721, 0.8491, -1.9244], [0.6530, -0.6494, -0.8175, 0.5280, -1.2753]])
SEED42_SECOND_NORMED = np.array([[4.4998, -3.4998], [-18.2893, 19.2893]])


def test_nv_noise_is_torch_cuda_randn_seed_42():
    assert np.abs(rng.randn(42, (2, 5)) - SEED42_2x5).max() <= PRINTED
    assert np.abs(rng.randn(42, (2, 2)) - SEED42_2x5.reshape(-1)[:4].reshape(2, 2)).max() <= PRINTED


def test_nv_second_draw_seed_42():
    g = rng.Philox(42)
    g.randn((2, 2))
    probs = g.randn((2, 2))
    normed = probs / probs.sum(-1, keepdims=True)
    # p / (p + q) with p + q small multiplies the float32 rounding by about (p / (p + q))^2, 370 here: relative
    assert np.abs(normed / SEED42_SECOND_NORMED - 1).max() <= 5e-5


def test_one_thread_per_element_each_element_depends_on_its_index_alone():
    """A1111's NV: noise of n elements is the first n of any longer draw (the layout of a big enough card)."""
    assert np.array_equal(rng.randn(7, (4, 8, 8)).reshape(-1), rng.randn(7, (4, 16, 16)).reshape(-1)[:256])


def test_a_smaller_launch_strides_the_elements_as_the_kernel_does():
    """With T threads, element i is output (i // T) % 4 of thread i % T's call i // 4T (cuda_threads)."""
    n, threads = 4096, 256
    small = rng.randn(3, (n,), threads=threads)
    g = rng.Philox(3)  # thread t's first block: the element-per-thread draw's elements t (sin) ...
    assert np.array_equal(small[:threads], g.randn((threads,)))
    assert not np.array_equal(small[threads:2 * threads], rng.randn(3, (n,))[threads:2 * threads])
    assert rng.calls(n, threads) == 4 and rng.calls(n) == 1
    assert rng.cuda_threads(16384, 132, 2048) == 16384 and rng.cuda_threads(65536, 28, 1536) == 28 * 6 * 256


def test_seeds_are_keys_of_64_bits():
    assert not np.array_equal(rng.randn(1, (16,)), rng.randn(1 + 2**32, (16,)))


def test_check_rng_names_the_value_and_the_choices():
    assert [rng.check_rng(v) for v in ("gpu", "CPU", " Nv ")] == ["gpu", "cpu", "nv"]
    with pytest.raises(Exception) as info:
        rng.check_rng("tpu")
    assert "'tpu'" in str(info.value) and "gpu, cpu, nv" in str(info.value)


@pytest.mark.cuda
@pytest.mark.parametrize("seed,shape", [(0, (8, 8)), (42, (2, 5)), (1234, (1, 4, 64, 64)), (2**32 - 1, (3, 7))])
def test_nv_noise_equals_the_card(seed, shape):
    """On a CUDA card: each of three draws in a row from one generator, against torch's own."""
    import torch

    g = torch.Generator("cuda").manual_seed(seed)
    ours = rng.Philox(seed)
    for _ in range(3):
        card = torch.randn(shape, generator=g, device="cuda").cpu().numpy()
        assert np.abs(ours.randn(shape) - card).max() <= 1e-4


@pytest.mark.cuda
def test_nv_noise_equals_the_card_when_the_launch_is_smaller_than_the_tensor():
    import torch

    props = torch.cuda.get_device_properties(0)
    n = 8 * props.multi_processor_count * props.max_threads_per_multi_processor + 5  # more than one round
    threads = rng.cuda_threads(n, props.multi_processor_count, props.max_threads_per_multi_processor)
    g = torch.Generator("cuda").manual_seed(5)
    card = torch.randn((n,), generator=g, device="cuda").cpu().numpy()
    assert np.abs(rng.randn(5, (n,), threads=threads) - card).max() <= 1e-4
