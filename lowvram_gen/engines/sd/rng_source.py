"""The noise a pass draws, from its request's RNG source (lowvram_gen/rng.py, A1111's "Random number generator
source"): the generators the pipeline is given, and, for NV, the noise diffusers draws with them.

- gpu: one torch generator per image on the compute device (the CPU's for MPS, whose generators A1111 does not use
  either): the noise is the card's own torch.randn.
- cpu: the generators on the CPU: diffusers' `randn_tensor` draws there and moves the noise (A1111's CPU source, the
  same image on every machine).
- nv: the generators on the CPU too, but no noise is drawn from them: inside `drawing`, every `randn_tensor` the
  pipeline and its scheduler call (the initial latents, img2img's and hires fix's noise, the variation and seed-resize
  noise, the ancestral and SDE samplers' per-step noise) is the NV generator's for that torch generator's seed,
  continuing from one draw to the next as a CUDA generator does (rng.Philox), so a card of any make, or the CPU,
  draws what an NVIDIA card's torch.randn draws. Diffusers' per-image draws are kept: image i's noise is its own
  generator's, of shape (1, C, H, W), as with the other sources.

ENSD (A1111's eta noise seed delta, `seed_delta`): once a pass's first noise is drawn (before the scheduler's first
step), each image's generator is re-seeded with its seed + ENSD, as A1111's ImageRNG.first re-creates its
generators, so the step noise changes and the first noise does not; for NV the generator's Philox starts again from
the new seed.

The NV replacement is installed in the modules that call `randn_tensor` (the pipeline's and scheduler's classes'
modules, and diffusers' torch_utils) for the block's length, and answers NV noise to this thread only: another
thread's job on another GPU, with another source, gets diffusers' own function.
"""

from __future__ import annotations

import contextlib
import functools
import sys
import threading

from lowvram_gen.rng import GPU, NV, Philox

_local = threading.local()
_lock = threading.Lock()
_installed: dict = {}  # module -> [its randn_tensor before, how many blocks use it]
_original = []  # diffusers' randn_tensor, kept before the first install


def generator_device(device: str, source: str) -> str:
    """Where the images' torch generators live: the compute device for gpu (the CPU for MPS), else the CPU."""
    return device if source == GPU and not device.startswith("mps") else "cpu"


def generators(seeds: list[int], device: str, source: str = GPU) -> list:
    """One generator per image: image i depends on its seed alone, whatever the batch split."""
    import torch

    where = generator_device(device, source)
    return [torch.Generator(where).manual_seed(s) for s in seeds]


def _diffusers_randn():
    with _lock:
        if not _original:
            from diffusers.utils import torch_utils

            _original.append(torch_utils.randn_tensor)
        return _original[0]


def _reseed(generators: list, seeds: list[int], delta: int) -> None:
    """Each generator re-seeded with its seed + delta (NV: its Philox started again from the new seed)."""
    draws = getattr(_local, "draws", None)
    for generator, seed in zip(generators, seeds):
        generator.manual_seed(int(seed) + int(delta))
        if draws is not None:
            draws.forget(generator)


@contextlib.contextmanager
def seed_delta(scheduler, generators, seeds: list[int], delta: int):
    """While the block runs, the scheduler's first `step` first re-seeds `generators` (one per image, seeds[i]'s)
    with seed + `delta` (A1111's ENSD): the first noise, drawn before it, is the seed's; the step noise after it is
    seed + delta's. 0 changes nothing."""
    if not delta:
        yield
        return
    gens = list(generators) if isinstance(generators, (list, tuple)) else [generators]
    step = scheduler.step
    done = []

    @functools.wraps(step)  # its signature: the pipelines pass `generator` to a step that takes one
    def first_reseeds(*args, **kwargs):
        if not done:
            done.append(True)
            _reseed(gens, seeds, delta)
        return step(*args, **kwargs)

    own = vars(scheduler).get("step")
    scheduler.step = first_reseeds
    try:
        yield
    finally:
        if own is None:
            del scheduler.step
        else:
            scheduler.step = own


class _NvDraws:
    """NV noise per torch generator: its seed's Philox, moved on by each draw."""

    def __init__(self):
        self._states: dict[int, tuple] = {}  # id(generator) -> (generator, its Philox); the generator kept alive

    def forget(self, generator) -> None:
        """Start `generator`'s Philox again from its (new) seed at its next draw."""
        self._states.pop(id(generator), None)

    def draw(self, generator, shape):
        import torch

        state = self._states.get(id(generator))
        if state is None:
            state = self._states[id(generator)] = (generator, Philox(generator.initial_seed()))
        return torch.from_numpy(state[1].randn(tuple(int(s) for s in shape)))

    def __call__(self, shape, generator=None, device=None, dtype=None, layout=None, **kwargs):
        import torch

        if generator is None:  # nothing seeded it: diffusers' own, as with any source
            return _diffusers_randn()(shape, generator=None, device=device, dtype=dtype, layout=layout, **kwargs)
        if isinstance(generator, list) and len(generator) == 1:
            generator = generator[0]
        if isinstance(generator, list):  # per image, as diffusers draws them
            noise = torch.cat([self.draw(generator[i], (1, *shape[1:])) for i in range(shape[0])])
        else:
            noise = self.draw(generator, shape)
        return noise.to(device=device, dtype=dtype)


def randn_tensor(shape, generator=None, device=None, dtype=None, layout=None, **kwargs):
    """diffusers' `randn_tensor`, or the NV source's noise in a thread inside `drawing(NV, ...)`."""
    draws = getattr(_local, "draws", None)
    if draws is None:
        return _diffusers_randn()(shape, generator=generator, device=device, dtype=dtype, layout=layout, **kwargs)
    return draws(shape, generator=generator, device=device, dtype=dtype, layout=layout, **kwargs)


def _modules(objects) -> set:
    """The modules whose `randn_tensor` the objects' methods call: their classes' (and base classes') modules."""
    from diffusers.utils import torch_utils

    found = {torch_utils}
    for obj in objects:
        if obj is None:
            continue
        for cls in type(obj).__mro__:
            module = sys.modules.get(cls.__module__)
            if module is not None and hasattr(module, "randn_tensor"):
                found.add(module)
    return found


@contextlib.contextmanager
def drawing(source: str, *objects):
    """While the block runs, the noise `objects` (pipelines, schedulers) draw through diffusers' `randn_tensor` is
    the NV source's, in this thread, when `source` is nv; gpu and cpu change nothing here (their generators say where
    torch draws)."""
    if source != NV:
        yield
        return
    original = _diffusers_randn()
    modules = _modules(objects)
    with _lock:
        for module in modules:
            entry = _installed.setdefault(module, [getattr(module, "randn_tensor", original), 0])
            entry[1] += 1
            module.randn_tensor = randn_tensor
    before = getattr(_local, "draws", None)
    _local.draws = _NvDraws()
    try:
        yield
    finally:
        _local.draws = before
        with _lock:
            for module in modules:
                entry = _installed[module]
                entry[1] -= 1
                if not entry[1]:
                    module.randn_tensor = entry[0]
                    del _installed[module]
