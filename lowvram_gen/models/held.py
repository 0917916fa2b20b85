"""Budget offload of a piece its block's forward calls twice (CogView4's `ff`, on the image tokens and then on the
text tokens): held on the card from its first call until its block's forward ends, so it moves once a step.

diffusers' group hook onloads a group at each call of its leader and offloads it after, which would move such a piece
twice a step while the plan counts it once (planning/residency.py counts it once, and in flight beside the two
streamed pieces while its block runs). `hold` gives the piece a ModuleGroup of its own with a hook that onloads it at
its first call only, and its block a hook that offloads it when the block's forward returns. The group's transfers
are diffusers' own (`ModuleGroup.onload_`/`offload_`: pinned host copies on a stream, which engines/sd/traffic.py
counts); it is no part of diffusers' prefetch chain, so its first call waits for its copy.
"""

from __future__ import annotations

HELD = "lowvram_gen_held"  # the hook names, which networks/hooks.unhook removes with diffusers' own
RELEASE = "lowvram_gen_held_release"


def hold(piece, block, onload_device, use_stream: bool, low_cpu_mem_usage: bool) -> None:
    """Stream `piece` (a submodule of `block`) as described above; it starts offloaded."""
    import torch
    from diffusers.hooks import HookRegistry, ModelHook
    from diffusers.hooks.group_offloading import ModuleGroup
    from accelerate.utils import send_to_device

    stream = torch.cuda.Stream() if use_stream else None
    group = ModuleGroup(modules=[piece], offload_device=torch.device("cpu"), onload_device=onload_device,
                        offload_leader=piece, onload_leader=piece, non_blocking=use_stream, stream=stream,
                        low_cpu_mem_usage=low_cpu_mem_usage, onload_self=True, group_id=f"lowvram_gen_held_{id(piece)}")
    state = {"on": True}

    class Held(ModelHook):
        def pre_forward(self, module, *args, **kwargs):
            if not state["on"]:
                group.onload_()
                if group.stream is not None:  # the copy ran on the side stream: wait for it before computing
                    group.stream.synchronize()
                state["on"] = True
            return (send_to_device(args, onload_device, non_blocking=group.non_blocking),
                    send_to_device(kwargs, onload_device, non_blocking=group.non_blocking))

    class Release(ModelHook):
        def post_forward(self, module, output):
            release()
            return output

    def release():
        if state["on"]:
            group.offload_()
            state["on"] = False

    release()
    HookRegistry.check_if_exists_or_initialize(piece).register_hook(Held(), HELD)
    registry = HookRegistry.check_if_exists_or_initialize(block)
    name = RELEASE
    while name in registry.hooks:  # one release hook for each held piece of the block
        name += "_"
    registry.register_hook(Release(), name)


def hook_names(module) -> list[str]:
    """The held-piece hook names registered on `module` (for removal)."""
    registry = getattr(module, "_diffusers_hook", None)
    return [n for n in getattr(registry, "hooks", {}) if n == HELD or n.startswith(RELEASE)]
