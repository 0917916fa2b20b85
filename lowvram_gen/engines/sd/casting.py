"""Half storage that keeps the weights in their file's pages (settings.half_storage, issue 17).

diffusers' layerwise casting (`apply_layerwise_casting`) upcasts a layer before its forward and casts it
back after with `module.to(dtype=storage)`, which makes a *fresh* 16-bit copy. A component loaded at
the dtype its safetensors file stores uses the file's memory map as its weights, clean pages the kernel
can drop and read again; after the first step every layer held an anonymous copy instead, which the
kernel can only kill for (benchmarks/mapped_weights.py: real-size SDXL under cpu+half was OOM-killed at
8 GiB, and its CLI run held 9.0 GiB of anonymous memory for 6.4 GiB of weights).

`MappedCastingHook` keeps diffusers' hook (its walk over the layers, its skip patterns, its peft handling,
the name "layerwise_casting" that other code looks up) and changes what happens after the forward: the
tensors the layer had before it are put back, and the compute-dtype copies are dropped. The numbers are
those of diffusers' hook: the same cast, on the same weights.
"""

from __future__ import annotations

from diffusers.hooks.layerwise_casting import LayerwiseCastingHook


class MappedCastingHook(LayerwiseCastingHook):
    """Upcast a layer's stored tensors into temporaries for its forward; put the stored ones back after."""

    def pre_forward(self, module, *args, **kwargs):
        stored = []
        for owner, kind, name, tensor in _own_tensors(module):
            if tensor.is_floating_point() and tensor.dtype == self.storage_dtype:
                stored.append((owner, kind, name, tensor.data))
                cast = tensor.data.to(self.compute_dtype, non_blocking=self.non_blocking)
                if kind == "param":
                    tensor.data = cast
                else:
                    owner._buffers[name] = cast
        module._lowvram_stored = stored
        return args, kwargs

    def post_forward(self, module, output):
        for owner, kind, name, data in getattr(module, "_lowvram_stored", ()):
            if kind == "param":
                owner._parameters[name].data = data
            else:
                owner._buffers[name] = data
        module._lowvram_stored = []
        return output


def _own_tensors(module):
    for owner in module.modules():
        for name, p in owner._parameters.items():
            if p is not None:
                yield owner, "param", name, p
        for name, b in owner._buffers.items():
            if b is not None:
                yield owner, "buffer", name, b


def keep_mapped(module) -> int:
    """Switch every layerwise-casting hook diffusers put on `module`'s layers to `MappedCastingHook` (same
    state, other forward). Returns how many were switched."""
    switched = 0
    for sub in module.modules():
        registry = getattr(sub, "_diffusers_hook", None)
        hook = registry.get_hook("layerwise_casting") if registry is not None else None
        fn_ref = getattr(hook, "fn_ref", None)  # the methods the registry bound when it registered the hook
        if type(hook) is LayerwiseCastingHook and fn_ref is not None:
            hook.__class__ = MappedCastingHook
            fn_ref.pre_forward, fn_ref.post_forward = hook.pre_forward, hook.post_forward
            switched += 1
        # (a diffusers whose registry binds otherwise keeps its own hook: the same numbers, copies of the weights)
    return switched
