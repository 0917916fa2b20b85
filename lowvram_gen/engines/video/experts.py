"""Wan 2.2 A14B's two experts, never both on the device (issue 33).

WanPipeline runs `transformer` (high noise) for the steps whose timestep is at or above its boundary, then
`transformer_2` (low noise) for the rest: one switch per clip. Under model offload diffusers' own hooks already hold one
at a time (its model_cpu_offload_seq "text_encoder->transformer->transformer_2->vae": each model's hook offloads the one
before it when it is called). Under the streaming offloads (group, sequential) each expert's blocks come and go with
its forward. Under "none" and "budget" apply.py places the running expert only (`apply.running_expert`, the first until
the switch) and the swap here moves the idle one off at the switch: a forward pre-hook on each expert, which does
nothing while the same expert runs again, so the weights move once at the boundary, never per step.

`Experts.record` is the residency record tests read: at each denoiser forward, the expert called and the experts on
the device as it ran.
"""

from __future__ import annotations

import logging

from lowvram_gen.engines.sd import apply as apply_mod

log = logging.getLogger(__name__)


class Experts:
    """The swap of one job (a context manager around its denoise passes); a no-op for a pipeline with one denoiser."""

    def __init__(self, runner):
        self.runner = runner
        self.pipe = runner.model.pipe
        self.names = apply_mod.experts(self.pipe)
        self.record: list[tuple[str, tuple[str, ...]]] = []  # (expert called, experts on the device as it ran)
        self.swaps: list[tuple[str, str]] = []  # (from, to), in order
        self._handles: list = []

    def __enter__(self) -> "Experts":
        for name in self.names:
            module = getattr(self.pipe, name)
            # prepend: before diffusers' offload hooks and the runner's placing hook, so they see the swap done
            self._handles.append(module.register_forward_pre_hook(
                lambda *_args, _name=name: self._before(_name), prepend=True))
            self._handles.append(module.register_forward_hook(lambda *_args, _name=name: self._after(_name)))
        return self

    def __exit__(self, *exc) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles = []

    @property
    def offload(self) -> str:
        applied = self.runner.applied
        if applied is None:
            return "none"
        return apply_mod.effective_settings(applied, self.runner.device)[0].offload

    def _before(self, name: str) -> None:
        running = apply_mod.running_expert(self.pipe)
        if name == running:
            return
        self.swaps.append((running, name))
        log.info("switching experts: %s off the device, %s on", running, name)
        ops = self.runner.ops_factory(self.pipe)
        offload = self.offload
        device = self.runner.device.torch_device
        import torch

        with torch.inference_mode(False):  # weights moved inside the call are not inference tensors (Runner._move)
            if offload == "none":
                ops.expert_to(running, "cpu")  # first off, so the two never share the device
                apply_mod.set_running_expert(self.pipe, name)
                ops.expert_to(name, device)
            elif offload == "budget" and self.runner.residency is not None:
                streamed = self.runner.residency.streamed
                ops.resident_to("cpu", streamed)  # the running expert's resident part off (the idle one's is there)
                apply_mod.set_running_expert(self.pipe, name)
                if self.runner.resident_on_device:
                    ops.resident_to(device, streamed)  # the new one's resident part on, the other's stays off
            else:  # model offload, group/sequential streaming: diffusers' hooks move them
                apply_mod.set_running_expert(self.pipe, name)

    def _after(self, name: str) -> None:
        self.record.append((name, self.on_device()))

    def on_device(self) -> tuple[str, ...]:
        """The experts whose weights are on the device now: on an accelerator, those with a parameter there (the
        streamed blocks of a budget split count while their hooks hold them); on a CPU, where the engine placed them
        (the running expert under "none", its resident part under "budget" while placed; none when streamed)."""
        device = self.runner.device
        if device.is_accelerator:
            return tuple(n for n in self.names
                         if any(p.device.type != "cpu" for p in getattr(self.pipe, n).parameters()))
        offload = self.offload
        placed = offload == "none" or (offload == "budget" and self.runner.resident_on_device)
        return (apply_mod.running_expert(self.pipe),) if placed else ()

    def reset(self) -> None:
        """Before a job: the high-noise expert runs first. Where the low-noise one was left placed by the last job, it
        goes off now and the first comes on (one move each, as at a switch)."""
        if self.names and apply_mod.running_expert(self.pipe) != self.names[0]:
            self._before(self.names[0])
            self.swaps.clear()
