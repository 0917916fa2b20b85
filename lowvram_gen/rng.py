"""Where a job's random noise comes from (A1111's "Random number generator source", `--rng gpu|cpu|nv`), and the
NV source's generator itself: NVIDIA's Philox 4x32-10 counter-based generator with curand's Box-Muller, as torch's
CUDA `torch.randn(shape, generator=torch.Generator("cuda").manual_seed(seed))` draws float32 noise, computed with
numpy on any device, so a CPU or an AMD card reproduces an image made on an NVIDIA card.

Written from the published algorithm, not from anyone's code: Philox4x32-10 is Salmon, Moraes, Dror and Shaw,
"Parallel random numbers: as easy as 1, 2, 3" (SC'11), the round function and constants of Random123 (checked
against its known-answer vectors in tests/test_rng_nv.py). How torch uses it on CUDA (ATen's distribution kernels,
curand's device API): each thread `t` of the launch runs `curand_init(seed, t, offset)`, i.e. key = the seed's two
32-bit halves, counter = (offset / 4 as 64 bits, t as 64 bits); each call of `curand_normal4` takes one Philox
block (4 words, then the counter's low half goes up by one) and turns words (0, 1) and (2, 3) into two normals
each, curand's Box-Muller: u = w0 * 2^-32 + 2^-33, v = w1 * 2pi 2^-32 + pi 2^-32, r = sqrt(-2 ln u),
(r sin v, r cos v). Element `i` of a tensor of n elements is written by thread i mod T (T: the launch's threads)
from output (i // T) mod 4 of that thread's call (i // 4T); the generator's offset then goes up by 4 per call
each thread made. A1111's NV source (and `randn` here by default) is the launch with a thread per element, what a
card with enough multiprocessors runs (an SD 1.x latent of 4x64x64 fits every card; SDXL's 4x128x128 fits cards
with 43 or more multiprocessors at 1536 threads); `threads=` gives another launch's count (`cuda_threads`).

The noise is equal to the card's up to the card's float32 `sinf`/`logf` rounding (about 1e-6): the words and the
u, v are computed exactly as curand's float32 arithmetic does, the logarithm and sine in float64 of those.
Standard library and numpy only; nothing is imported until noise is drawn.
"""

from __future__ import annotations

from lowvram_gen.errors import InvalidRequest

GPU, CPU, NV = "gpu", "cpu", "nv"
SOURCES = (GPU, CPU, NV)
DEFAULT = GPU
# A1111's words (its `randn_source` option and the PNG's `RNG:` field); A1111 writes the field only when not GPU
WORDS = {GPU: "GPU", CPU: "CPU", NV: "NV"}

_M0, _M1 = 0xD2511F53, 0xCD9E8D57  # Philox4x32's multipliers
_W0, _W1 = 0x9E3779B9, 0xBB67AE85  # its Weyl key increments (golden ratio, sqrt(3) - 1)
_ROUNDS = 10
_BLOCK = 256  # ATen's threads per block for its random kernels
_PER_CALL = 4  # normals per curand_normal4 call (ATen's unroll for float)


def check_rng(value, field: str = "rng") -> str:
    """gpu/cpu/nv from ours or A1111's word (any case); an error naming the value and the three otherwise."""
    text = value.strip().lower() if isinstance(value, str) else value
    if text not in SOURCES:
        raise InvalidRequest(field, value, "one of gpu, cpu, nv (A1111's GPU, CPU, NV)")
    return text


def philox4x32(counter, key, rounds: int = _ROUNDS):
    """Philox4x32-R of counters (4, n) under keys (2, n) (numpy, any integer type holding 32-bit words): the four
    output words (4, n) as uint32."""
    import numpy as np

    c = [np.asarray(w, dtype=np.uint64) & 0xFFFFFFFF for w in counter]
    k0, k1 = (np.asarray(w, dtype=np.uint64) & 0xFFFFFFFF for w in key)
    for r in range(rounds):
        if r:  # the key is bumped between rounds, not before the first
            k0, k1 = (k0 + _W0) & 0xFFFFFFFF, (k1 + _W1) & 0xFFFFFFFF
        p0, p1 = c[0] * np.uint64(_M0), c[2] * np.uint64(_M1)  # 32 x 32 -> 64 bits: exact in uint64
        c = [(p1 >> np.uint64(32)) ^ c[1] ^ k0, p1 & 0xFFFFFFFF, (p0 >> np.uint64(32)) ^ c[3] ^ k1, p0 & 0xFFFFFFFF]
    return np.stack(c).astype(np.uint32)


def box_muller(x, y):
    """curand's Box-Muller of two words each: (r sin v, r cos v), u and v in float32 as curand computes them."""
    import numpy as np

    inv = np.float32(2.0 ** -32)  # CURAND_2POW32_INV
    inv_2pi = np.float32(inv * np.float32(6.2831855))  # CURAND_2POW32_INV_2PI, a float32 product
    u = np.asarray(x, dtype=np.uint32).astype(np.float32) * inv + np.float32(inv / 2)
    v = np.asarray(y, dtype=np.uint32).astype(np.float32) * inv_2pi + np.float32(inv_2pi / 2)
    r = np.sqrt(-2.0 * np.log(u.astype(np.float64)))
    v = v.astype(np.float64)
    return (r * np.sin(v)).astype(np.float32), (r * np.cos(v)).astype(np.float32)


def cuda_threads(n: int, multiprocessors: int, threads_per_multiprocessor: int) -> int:
    """The threads torch's CUDA random kernels launch for n elements on a card (ATen's execution policy): blocks of
    256, as many as the elements need, at most as many as the card's multiprocessors hold at once."""
    blocks = min(-(-n // _BLOCK), multiprocessors * (threads_per_multiprocessor // _BLOCK))
    return max(blocks, 1) * _BLOCK


def calls(n: int, threads: int | None = None) -> int:
    """The curand_normal4 calls each thread makes for n elements (the generator's offset goes up by 4 per call)."""
    threads = threads or cuda_threads(n, 1 << 30, _BLOCK)
    return max(n - 1, 0) // (threads * _PER_CALL) + 1


def randn(seed: int, shape, offset: int = 0, threads: int | None = None):
    """float32 normals of `shape` (numpy) as torch's CUDA randn draws them from a generator seeded with `seed` whose
    Philox offset is `offset` (0 for a fresh one; it goes up by 4 * `calls` per draw). `threads`: the launch's
    threads (None: one per element, rounded up to a block: A1111's NV)."""
    import numpy as np

    n = 1
    for side in shape:
        n *= int(side)
    threads = threads or cuda_threads(n, 1 << 30, _BLOCK)
    index = np.arange(n, dtype=np.uint64)
    thread = index % np.uint64(threads)
    call = index // np.uint64(threads * _PER_CALL)
    which = (index // np.uint64(threads)) % np.uint64(_PER_CALL)
    base = offset // 4 + call  # curand_init's skipahead(offset) in blocks of four words, then one block a call
    counter = (base & 0xFFFFFFFF, base >> np.uint64(32), thread & 0xFFFFFFFF, thread >> np.uint64(32))
    key = (np.full(n, seed & 0xFFFFFFFF, dtype=np.uint64), np.full(n, (seed >> 32) & 0xFFFFFFFF, dtype=np.uint64))
    words = philox4x32(counter, key)
    first = box_muller(words[0], words[1])
    second = box_muller(words[2], words[3])
    out = np.choose(which.astype(np.int64), (first[0], first[1], second[0], second[1]))
    return out.astype(np.float32).reshape(tuple(int(s) for s in shape))


class Philox:
    """One seed's NV generator: each `randn` draws as the next torch CUDA randn from that seed's generator would."""

    def __init__(self, seed: int, threads: int | None = None):
        self.seed = int(seed)
        self.offset = 0  # torch's philox offset: 4 per curand_normal4 call each thread made
        self.threads = threads

    def randn(self, shape):
        n = 1
        for side in shape:
            n *= int(side)
        out = randn(self.seed, shape, self.offset, self.threads)
        self.offset += 4 * calls(n, self.threads)
        return out
