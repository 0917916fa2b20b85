"""Changing a pipeline's modules while the memory presets' hooks are on it.

Measured with diffusers 0.42.1 / peft 0.21.2 on the tiny models (tests/test_lora.py):

- Model offload (accelerate hooks): `load_lora_weights` removes them itself and calls
  `enable_model_cpu_offload()` again *without a device*: on a machine without CUDA that raises, and
  on a CUDA machine it takes the default device, not the one the preset chose.
  `load_textual_inversion` does the same; neither knows about group offloading's hooks when it
  resizes the token embeddings.
- Group offload (block and leaf): `load_lora_weights` re-applies it itself and works.
- fp8 layerwise casting: peft creates each adapter in the dtype of the layer it wraps, which is
  float8 at rest, so the LoRA's weights are rounded to fp8 and its matmul fails on a CPU
  ("mul_cpu_reduced_float not implemented for Float8_e4m3fn").

So one rule for all presets: take the offload hooks off (`remove_offload_hooks`, which the engine's
`PipelineOps.reset` uses too), change the modules, and have the engine re-apply its current preset
(`reapply_memory`). Layers stored in fp8 are
lifted to their compute dtype while an adapter is created and put back afterwards; the round trip
float8 -> bfloat16/float16 -> float8 is exact, so the base weights do not change.
"""

from __future__ import annotations

import logging
from contextlib import contextmanager
from typing import Callable, Iterator

log = logging.getLogger(__name__)

# diffusers' hooks (HookRegistry names) that group offloading puts on a module; its casting hooks stay with the weights
GROUP_HOOKS = ("group_offloading", "layer_execution_tracker", "lazy_prefetch_group_offloading")


def _torch_modules(pipe) -> dict:
    import torch

    return {k: v for k, v in pipe.components.items() if isinstance(v, torch.nn.Module)}


def has_offload_hooks(pipe) -> bool:
    """Whether accelerate's or diffusers' offload hooks are on any component."""
    from diffusers.hooks.group_offloading import _is_group_offload_enabled

    for module in _torch_modules(pipe).values():
        if hasattr(module, "_hf_hook") or _is_group_offload_enabled(module):  # the module's hook state
            return True
    return False


def unhook(module) -> None:
    """Take the offload hooks off one module (accelerate's model offload, diffusers' group offloading); its
    layerwise-casting hooks stay with its weights' storage."""
    from diffusers.hooks import HookRegistry

    if hasattr(module, "_hf_hook"):  # this module's state: accelerate hooked it
        from accelerate.hooks import remove_hook_from_module

        remove_hook_from_module(module, recurse=True)
    from lowvram_gen.models.held import hook_names

    for sub in module.modules():
        registry = getattr(sub, "_diffusers_hook", None)
        if isinstance(registry, HookRegistry):
            for name in (*GROUP_HOOKS, *hook_names(sub)):  # budget's held pieces (models/held.py) too
                registry.remove_hook(name, recurse=False)


def remove_offload_hooks(pipe) -> None:
    """Every offload hook off the pipeline: its components' and the job's ControlNets' beside them
    (models/attached.py: not components, so diffusers' remove_all_hooks does not see them)."""
    from lowvram_gen.models.attached import attached

    from lowvram_gen.models.row_split import join_rows

    pipe.remove_all_hooks()  # accelerate hooks of model offload
    for module in {**_torch_modules(pipe), **attached(pipe)}.values():
        unhook(module)
        join_rows(module)  # budget's layers cut by rows whole again, as LoRA loading and the next apply expect


@contextmanager
def hooks_lifted(pipe, reapply_memory: Callable[[], object] | None) -> Iterator[None]:
    """Offload hooks off while the body changes modules, the preset re-applied after (also on error).

    Without `reapply_memory` the hooks stay and diffusers' own handling applies (fine for group
    offload; model offload is re-enabled on diffusers' default device, see the module docstring).
    """
    if reapply_memory is None or not has_offload_hooks(pipe):
        yield
        return
    remove_offload_hooks(pipe)
    try:
        yield
    finally:
        reapply_memory()


def _casting_hook(module):
    registry = getattr(module, "_diffusers_hook", None)
    return registry.get_hook("layerwise_casting") if registry is not None else None


@contextmanager
def fp8_lifted(component) -> Iterator[None]:
    """Layers stored in fp8 by layerwise casting are in their compute dtype inside the block."""
    lifted = []
    for module in component.modules():
        hook = _casting_hook(module)
        if hook is not None and hook.storage_dtype != hook.compute_dtype:
            module.to(dtype=hook.compute_dtype)
            lifted.append((module, hook.storage_dtype))
    try:
        yield
    finally:
        for module, storage in lifted:
            module.to(dtype=storage)
