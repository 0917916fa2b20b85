"""Measure the bytes that offload hooks move host-to-device, per forward of a module.

`count_onloads()` wraps the two kinds of offload hook the presets use while it is active:

- diffusers' group offloading (`ModuleGroup.onload_` / `offload_`): group, sequential and budget offload;
- accelerate's `CpuOffload` (`pre_forward` / `init_hook`): diffusers' `enable_model_cpu_offload`.

Each tensor a hook offloads is marked "off the device" and each one it onloads while so marked is
counted (its bytes) and marked "on". A tensor no hook has touched counts as where it is (on the
device unless it is on the CPU). This is what the hooks move, not a model of it, and it is the same on
a CPU, where onload and offload device are both "cpu" and `.to()` copies nothing (accelerate's hook
even returns early there): the hooks run and decide the same, and the meter follows their decisions.
On a GPU the same count is the host-to-device copy traffic. Enter it before the offload is applied
(applying offloads every hooked tensor first, which is how the meter learns what is off).
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field


@dataclass
class Meter:
    bytes: int = 0  # bytes onloaded so far (of `only`'s tensors when set)
    forwards: list[int] = field(default_factory=list)  # bytes onloaded during each watched forward
    _off: dict = field(default_factory=dict)  # tensor key -> True when a hook offloaded it
    _only: set | None = None  # ids of the watched module's submodules and tensors
    _handles: list = field(default_factory=list)  # forward hooks of `watch`, removed when the count ends

    def _watched(self, key) -> bool:
        return self._only is None or key[1] in self._only

    def _set(self, items, off: bool) -> None:
        seen = set()  # a group can list a tensor twice (a module's and a loose parameter): one copy moves
        for key, tensor in items:
            if id(tensor) in seen or not self._watched(key):
                continue
            seen.add(id(tensor))
            was_off = self._off.get(key, tensor.device.type == "cpu")
            if was_off and not off:
                self.bytes += tensor.numel() * tensor.element_size()
            self._off[key] = off

    def watch(self, module) -> "Meter":
        """Count only `module`'s tensors, and record the bytes onloaded during each of its forwards."""
        def members():  # again at each forward: budget offload may have cut layers into parts since (row_split.py)
            self._only = {id(m) for m in module.modules()} | {id(t) for t in [*module.parameters(), *module.buffers()]}

        def begin(*_):
            members()
            start.append(self.bytes)

        members()
        start = []
        self._handles += [module.register_forward_pre_hook(begin),
                          module.register_forward_hook(lambda *_: self.forwards.append(self.bytes - start.pop()))]
        return self


def _module_tensors(module):
    for sub in module.modules():
        for name, tensor in [*sub._parameters.items(), *sub._buffers.items()]:
            if tensor is not None:
                yield ("m", id(sub), name), tensor


def _group_tensors(group):
    for module in group.modules:
        yield from _module_tensors(module)
    for tensor in [*group.parameters, *group.buffers]:
        yield ("t", id(tensor), ""), tensor


@contextlib.contextmanager
def count_onloads():
    """Patch the offload hooks for the duration; yields a `Meter` (see the module doc)."""
    from accelerate.hooks import CpuOffload, UserCpuOffloadHook
    from diffusers.hooks.group_offloading import ModuleGroup

    meter = Meter()
    saved = (ModuleGroup.onload_, ModuleGroup.offload_, CpuOffload.pre_forward, CpuOffload.init_hook)
    onload, offload, pre_forward, init_hook = saved

    def group_onload(self):
        meter._set(list(_group_tensors(self)), off=False)
        return onload(self)

    def group_offload(self):
        meter._set(list(_group_tensors(self)), off=True)
        return offload(self)

    def model_pre_forward(self, module, *args, **kwargs):
        prev = self.prev_module_hook
        if isinstance(prev, UserCpuOffloadHook):  # the hook offloads the model that ran before, then onloads
            meter._set(list(_module_tensors(prev.model)), off=True)
        meter._set(list(_module_tensors(module)), off=False)
        return pre_forward(self, module, *args, **kwargs)

    def model_init_hook(self, module):
        meter._set(list(_module_tensors(module)), off=True)
        return init_hook(self, module)

    ModuleGroup.onload_, ModuleGroup.offload_ = group_onload, group_offload
    CpuOffload.pre_forward, CpuOffload.init_hook = model_pre_forward, model_init_hook
    try:
        yield meter
    finally:
        for handle in meter._handles:
            handle.remove()
        ModuleGroup.onload_, ModuleGroup.offload_, CpuOffload.pre_forward, CpuOffload.init_hook = saved
