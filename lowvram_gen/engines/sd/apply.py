"""Apply `MemorySettings` to a loaded diffusers pipeline, and re-apply others without reloading.

All calls go through `PipelineOps`, one small adapter over diffusers' own switches, so that tests
can record exactly which calls a plan makes (with a fake CUDA device) and the same code path runs
for real on the CPU. Settings that cannot run on this device are skipped and logged, never faked:

- float16 on a CPU: slow or unsupported kernels and no VRAM to save -> float32.
- xformers: CUDA only, and only when the package imports -> SDPA.
- offload on a CPU: runs (diffusers' hooks work with the CPU as both devices) but saves nothing.

Sequential offload is diffusers' leaf-level group offloading: its docs call it equivalent to
`enable_sequential_cpu_offload`, it can prefetch on a CUDA stream, it composes with fp8 layerwise
casting (accelerate's sequential hooks do not), and it runs on a CPU-only machine, so the whole
ladder is exercised here.

Budget offload (`offload = "budget"`) keeps the denoiser's blocks that `planning/residency.py`
chooses on the GPU and streams the others with diffusers' group offloading (see `budget_offload`).

A denoiser from a GGUF file keeps its quantized weights as stored: it is never cast (only its
unquantized tensors follow the dtype), given fp8 storage or quantized again (int8/int4), and it is reloaded only for precision its
file had (models/gguf_file.py). Offload moves it like any other model.

Precision is one-way: fp8 storage, int8/int4 quantization or a cast to half precision loses bits.
Going back up needs the weights from disk again; `needs_reload()` tells the caller, which reloads
only those components. Quantization is re-applied as a no-op; int8 -> int4 (or back) also reloads
the quantized components: sdnq refuses to quantize quantized layers, and int4 made from the int8
values would add the rounding of both to the weights. So does another dtype for a quantized
component: its scales and other tensors were made at the old one (and diffusers refuses to cast a
model quantized while loading). What is quantized, and to what, is read off the components
(`quantize.kinds`): a model quantized while loading (models/loading.py) counts like one quantized here.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field, replace

from lowvram_gen.hardware.device import GiB, DeviceInfo
from lowvram_gen.models.attached import attached
from lowvram_gen.models.blocks import fixed_bytes, piece_tree
from lowvram_gen.models.gguf_file import follow_dtype, gguf_bits
from lowvram_gen.networks.hooks import remove_offload_hooks
from lowvram_gen.planning import residency
from lowvram_gen.planning.sizes import vae_tile_size
from lowvram_gen.settings import MemorySettings

log = logging.getLogger(__name__)

_STATE = "_lowvram_state"  # attribute on the pipeline: what is applied now
# Bits of precision the weights keep; a request above what they went through needs a reload.
_PRECISION = {"float32": 32, "float16": 16, "bfloat16": 16, "float8": 8}
# offload = "budget" with resident_bytes = 0 (no plan sized it) on a GPU: device memory left beside the
# resident weights, on top of the device's reserve, for what a job needs besides them: the planner's
# estimate at the native sizes (SD 1.5 512 px, SDXL and Flux 1024 px, one image) puts the denoiser's
# activations at 0.14-0.47 GiB, the fixed overhead at 0.375 GiB and a decode in 512 px tiles at
# 0.5-1.0 GiB (the decode runs with the resident part moved off the device, engines/sd/stepdown.py, so
# this is generous: the planner, which sizes every budget preset it runs, counts it exactly); the two
# streamed blocks in flight are counted separately (residency.fit).
BUDGET_MARGIN = 2 * GiB


@dataclass
class Applied:
    requested: MemorySettings
    effective: MemorySettings
    skipped: list[str] = field(default_factory=list)
    calls: list[str] = field(default_factory=list)
    residency: residency.Residency | None = None  # offload = "budget": the split that runs


def denoiser_name(pipe) -> str:
    return "transformer" if getattr(pipe, "transformer", None) is not None else "unet"


def _modules(pipe):
    """The pipeline's models, and the job's ControlNets beside its denoiser (models/controlnet.attached: not
    diffusers components, so every setting below names them itself)."""
    import torch

    return {**{k: v for k, v in pipe.components.items() if isinstance(v, torch.nn.Module)}, **attached(pipe)}


def _stepped(pipe) -> list[tuple[str, object]]:
    """What runs at every step, with the prefix of its block names in a budget split: the denoiser (none) and each
    ControlNet (`controlnet0:` ..., as planning/controlnet.py names them). With two experts (Wan 2.2 A14B) the
    denoiser is the one running now (`running_expert`): the other is idle, off the device."""
    denoiser = running_expert(pipe) if experts(pipe) else denoiser_name(pipe)
    return [("", getattr(pipe, denoiser)), *((f"{slot}:", m) for slot, m in attached(pipe).items())]


EXPERTS = ("transformer", "transformer_2")  # Wan 2.2 A14B: high-noise expert, then low-noise expert
_RUNNING = "_lowvram_expert"  # the pipeline object's attribute naming the expert that runs now


def experts(pipe) -> tuple[str, ...]:
    """The pipeline's two denoising experts (`transformer` for the high-noise steps, `transformer_2` for the
    low-noise ones: Wan 2.2 A14B), or () where it has one denoiser. They run one after the other, never together: the
    idle one is kept off the device under every offload (engines/video/experts.py swaps them at the boundary)."""
    if getattr(pipe, "transformer", None) is None or getattr(pipe, "transformer_2", None) is None:
        return ()
    return EXPERTS


def running_expert(pipe) -> str:
    """The expert that runs now (the high-noise one until the switch); the one placed on the device."""
    return pipe.__dict__.get(_RUNNING, EXPERTS[0])


def set_running_expert(pipe, name: str) -> None:
    if name not in EXPERTS:
        raise ValueError(f"expert {name!r}: one of {', '.join(EXPERTS)}")
    pipe.__dict__[_RUNNING] = name


def idle_experts(pipe) -> list[str]:
    """The experts that do not run now (kept on the host)."""
    return [n for n in experts(pipe) if n != running_expert(pipe)]


def _own(prefix: str, names) -> list[str]:
    """The names of `names` that belong to the module with `prefix` (see _stepped), without it."""
    return [n[len(prefix):] for n in names if (n.startswith(prefix) if prefix else ":" not in n)]


class PipelineOps:
    """Every call a plan can make on a pipeline. Tests subclass it to record calls."""

    def __init__(self, pipe):
        self.pipe = pipe

    def reset(self) -> None:
        """Undo offload hooks, slicing, tiling and xformers; weights stay where and what they are."""
        pipe = self.pipe
        remove_offload_hooks(pipe)
        pipe.__dict__.pop("_lowvram_controlnet_hooks", None)
        if hasattr(pipe, "disable_attention_slicing"):  # diffusers' API on this class, not a family decision
            pipe.disable_attention_slicing()
        if getattr(pipe, _STATE, {}).get("attention") == "xformers":
            pipe.disable_xformers_memory_efficient_attention()
        vae = getattr(pipe, "vae", None)
        for method in ("disable_slicing", "disable_tiling"):
            if hasattr(vae, method):  # the VAE class's API (its tiling/slicing methods), not a family
                getattr(vae, method)()

    def cast(self, dtype: str, skip: tuple[str, ...] = ()) -> None:
        import torch

        target = getattr(torch, dtype)
        for name, module in _modules(self.pipe).items():
            if name in skip or getattr(module, "dtype", None) == target:
                continue
            if gguf_bits(module) is not None:
                follow_dtype(module, target)  # the quantized blocks stay as stored
            else:
                module.to(dtype=target)

    def vae_float32(self, latent_dtype: str) -> None:
        """The VAE in float32 while the rest computes in `latent_dtype` (A1111's --no-half-vae): whatever a pipeline
        hands it is cast to float32 on the way in, and the latents it encodes go back at `latent_dtype`, as the
        denoiser takes them (diffusers' img2img pipelines encode at the text encoder's dtype)."""
        import torch

        vae = self.pipe.vae
        # torch's own .to: diffusers' ModelMixin.to warns about its _keep_in_fp32_modules on every cast to float32,
        # which is where this one goes
        torch.nn.Module.to(vae, dtype=torch.float32)
        vae._lowvram_latent_dtype = getattr(torch, latent_dtype)
        if getattr(vae, "_lowvram_upcast_hooks", None):
            return
        hooks = [child.register_forward_pre_hook(_inputs_to_own_dtype) for child in vae.children()]
        last = getattr(vae, "quant_conv", None)
        last = getattr(vae, "encoder", None) if last is None else last
        if last is not None:  # what encode() makes its latent distribution from
            hooks.append(last.register_forward_hook(
                lambda module, args, out: out.to(vae._lowvram_latent_dtype) if torch.is_tensor(out) else out))
        vae._lowvram_upcast_hooks = hooks

    def upcast_attention(self, on: bool) -> None:
        """The denoiser's attention scores and softmax in float32 (A1111's --upcast-sampling): diffusers'
        `Attention.upcast_attention` / `upcast_softmax`, which the processors that compute the scores themselves
        (attention slicing, the classic one) honour; PyTorch's fused SDPA kernels accumulate in float32 already.
        Off puts back what the model's config said (SD 2.x's configs upcast)."""
        from diffusers.models.attention_processor import Attention

        for module in getattr(self.pipe, denoiser_name(self.pipe)).modules():
            if isinstance(module, Attention):
                saved = module.__dict__.setdefault("_lowvram_upcast_saved",
                                                   (module.upcast_attention, module.upcast_softmax))
                module.upcast_attention, module.upcast_softmax = (True, True) if on else saved

    def fp8_storage(self, compute_dtype: str) -> None:
        import torch

        module = getattr(self.pipe, denoiser_name(self.pipe))
        module.enable_layerwise_casting(storage_dtype=torch.float8_e4m3fn, compute_dtype=getattr(torch, compute_dtype))

    def half_storage(self, compute_dtype: str, names: tuple[str, ...] | None = None) -> None:
        """Every component keeps its 16-bit weights and computes in `compute_dtype` (settings.half_storage):
        diffusers' layerwise casting on each model (any torch module takes its hooks), with its hooks put
        back to the stored tensors after each forward (engines/sd/casting.py), then what it leaves
        out (norms, positional tensors: its skip patterns; a text encoder's embeddings) cast to the compute
        dtype, so that no layer meets a tensor of another dtype."""
        import torch
        from diffusers.hooks import apply_layerwise_casting
        from diffusers.hooks.layerwise_casting import DEFAULT_SKIP_MODULES_PATTERN

        from lowvram_gen.engines.sd.casting import keep_mapped

        compute = getattr(torch, compute_dtype)
        for name, module in _modules(self.pipe).items():
            if names is not None and name not in names:
                continue
            storage = next((p.dtype for p in module.parameters() if p.is_floating_point()), compute)
            if storage == compute:
                continue
            patterns = getattr(module, "_skip_layerwise_casting_patterns", None) or DEFAULT_SKIP_MODULES_PATTERN
            if not hasattr(module, "enable_layerwise_casting"):  # a diffusers ModelMixin or not: the module's API
                # a transformers text encoder reports its first parameter's dtype (the token embedding's), and
                # its pipeline casts the prompt embeddings to it: keep the embeddings in the compute dtype
                patterns = (*patterns, "embed")
            apply_layerwise_casting(module, storage_dtype=storage, compute_dtype=compute,
                                    skip_modules_pattern=patterns)
            keep_mapped(module)  # the stored tensors (the file's pages) stay; the upcast copies are dropped
            for sub in module.modules():
                registry = getattr(sub, "_diffusers_hook", None)
                if registry is not None and registry.get_hook("layerwise_casting") is not None:
                    continue
                for name, p in sub.named_parameters(recurse=False):
                    if p.is_floating_point():
                        p.data = p.data.to(compute)
                for name, b in sub.named_buffers(recurse=False):
                    if b.is_floating_point():
                        sub._buffers[name] = b.to(compute)

    def quantize(self, kind: str, names: list[str], device: str) -> None:
        """int8/int4 weights (sdnq) for the components `names`; quantized on `device` when it is CUDA."""
        from lowvram_gen.models.quantize import quantize_module

        for name in names:
            quantize_module(getattr(self.pipe, name), kind, device)

    def place(self, device: str) -> None:
        idle = idle_experts(self.pipe)  # two experts: the one not running stays on the host until the switch
        for name, module in _modules(self.pipe).items():
            module.to("cpu" if name in idle else device)

    def expert_to(self, name: str, device: str) -> None:
        """offload = "none": one expert, whole, to `device` (the swap at Wan 2.2 A14B's boundary)."""
        getattr(self.pipe, name).to(device)

    def model_offload(self, device: str) -> None:
        """diffusers' model offload; the job's ControlNets get a hook of their own, as diffusers' ControlNet
        pipelines give theirs: moved in when they first run and kept beside the UNet for the denoise, out again by
        `controlnets_off` when it is done (the VAE's hook moves only the UNet out)."""
        self.pipe.enable_model_cpu_offload(device=device)
        modules = attached(self.pipe)
        if modules:
            from accelerate import cpu_offload_with_hook

            self.pipe._lowvram_controlnet_hooks = [cpu_offload_with_hook(m, device)[1] for m in modules.values()]

    def controlnets_off(self) -> None:
        """Model offload: the job's ControlNets back to system RAM (the runner calls it when the denoiser is done);
        they come back at their next call. A no-op under the other offloads."""
        for hook in self.pipe.__dict__.get("_lowvram_controlnet_hooks", ()):
            hook.offload()

    def group_offload(self, device: str, leaf: bool, use_stream: bool, skip: tuple[str, ...] = (),
                      pinned: bool = True) -> None:
        """diffusers' group offloading, per component as `pipe.enable_group_offload` does it, except
        that text encoders always go leaf by leaf: block-level grouping only splits a model's
        top-level block lists, and a T5 encoder has none (its blocks sit inside `encoder`), so it
        would be moved whole: 9.5 GB for SD3's and Flux's T5-XXL. The text encoders run once per
        prompt, so streaming their layers costs about what moving them whole does. `pinned=False`: no pinned
        host copy of each group (diffusers' low_cpu_mem_usage; the `pin_memory` setting). Only the denoiser,
        streamed every step, is ever pinned: the text encoders and the VAE run once per job, and a pinned copy
        of them would hold their bytes twice in RAM for the whole session (T5-XXL: 9.5 GB) to speed up one pass."""
        import torch
        from diffusers.hooks import apply_group_offloading

        # the denoiser (both experts) and its ControlNets
        every_step = {denoiser_name(self.pipe), *experts(self.pipe), *attached(self.pipe)}
        for name, component in _modules(self.pipe).items():
            if name in skip:
                continue
            by_leaf = leaf or name.startswith("text_encoder")
            kwargs = dict(onload_device=torch.device(device), offload_device=torch.device("cpu"),
                          offload_type="leaf_level" if by_leaf else "block_level",
                          num_blocks_per_group=None if by_leaf else 1, use_stream=use_stream,
                          low_cpu_mem_usage=use_stream and not (pinned and name in every_step))
            if hasattr(component, "enable_group_offload"):  # a diffusers ModelMixin or not: the component's API
                component.enable_group_offload(**kwargs)
            else:
                apply_group_offloading(module=component, **kwargs)

    def budget_offload(self, device: str, streamed: tuple[str, ...], use_stream: bool, pinned: bool = True,
                       place: bool = True) -> None:
        """Partial residency of the denoiser: the blocks named in `streamed` are streamed in with diffusers'
        group offloading (one group per block, prefetched on a CUDA stream with `use_stream`), everything
        else of the denoiser (the resident blocks, embeddings, norms, conv_in/out) is moved to `device`.
        The other components are group-offloaded as `group_offload` does it (text encoders leaf by leaf).

        Every component goes through diffusers' group hooks: diffusers refuses model offload on a pipeline
        with group offloading (`_maybe_raise_error_if_group_offload_active`) and group offloading on modules
        that carry accelerate's offload hooks, so the two do not mix. The blocks are grouped by applying
        block-level group offloading to a throwaway container whose ModuleList holds them: diffusers makes
        one ModuleGroup per block (hooks on the blocks themselves, one stream for all). With a stream,
        diffusers prefetches only along an execution order traced by a hook on the module that runs, so
        that hook (and the empty group it needs) is put on the denoiser as diffusers does for leaf-level
        offloading with streams; without it, a group would onload on the side stream unsynchronised.
        `place` False: the resident part goes to the host instead (the runner brings it on at the denoiser's first
        forward, after the prompts are encoded: engines/sd/stepdown.Runner.place_resident)."""
        import torch
        from diffusers.hooks import apply_group_offloading

        from lowvram_gen.models.blocks import held_owner
        from lowvram_gen.models.held import hold

        _quiet_group_offload_moves()
        # the denoiser, and the job's ControlNets split the same way; an idle expert has the running one's blocks
        # (same class, same config): the same split, its resident part kept on the host until the switch
        stepped = [*_stepped(self.pipe), *(("", getattr(self.pipe, n)) for n in idle_experts(self.pipe))]
        self.group_offload(device, leaf=False, use_stream=use_stream,
                           skip=(denoiser_name(self.pipe), *experts(self.pipe), *attached(self.pipe)), pinned=pinned)
        if streamed and use_stream and not _can_prefetch():
            log.info("budget offload: this diffusers has no lazy-prefetch hook to reuse; streaming without a CUDA stream")
            use_stream = False
        for prefix, module in stepped:
            names = _own(prefix, streamed)
            owners = {n: held_owner(module, n) for n in names}  # called twice by a forward: held until it ends
            held = [n for n in names if owners[n] is not None]
            for n in held:
                hold(module.get_submodule(n), module.get_submodule(owners[n]), torch.device(device),
                     use_stream, low_cpu_mem_usage=use_stream and not pinned)
            units = [module.get_submodule(n) for n in names if n not in held]
            if not units:
                continue
            holder = torch.nn.Module()
            holder.blocks = torch.nn.ModuleList(units)  # only a container: the hooks go on the blocks
            apply_group_offloading(holder, onload_device=torch.device(device), offload_device=torch.device("cpu"),
                                   offload_type="block_level", num_blocks_per_group=1, use_stream=use_stream,
                                   low_cpu_mem_usage=use_stream and not pinned,
                                   exclude_kwargs=getattr(module, "_skip_keys", None))
            if use_stream:
                _prefetch_in_execution_order(module, units[0])
        self.resident_to(device if place else "cpu", streamed)

    def resident_to(self, device: str, streamed: tuple[str, ...]) -> None:
        """Budget offload: move the denoiser's resident part (its blocks not in `streamed`, and the fixed
        part) to `device`; the streamed blocks stay with their hooks. The runner parks it on the host
        while the VAE decodes or an upscaler runs, and brings it back before the next denoise."""
        import torch

        for prefix, module in _stepped(self.pipe):  # the denoiser's and its ControlNets' resident parts
            _place_outside(module, {id(module.get_submodule(n)) for n in _own(prefix, streamed)}, torch.device(device))
        for name in idle_experts(self.pipe):  # the expert not running: its resident part on the host, always
            module = getattr(self.pipe, name)
            _place_outside(module, {id(module.get_submodule(n)) for n in _own("", streamed)}, torch.device("cpu"))

    def free_bytes(self, device: str) -> int:
        """CUDA memory this pipeline's weights could use: free now, plus what torch's cache and the
        pipeline's own tensors hold there (they are moved or freed when the settings change)."""
        import torch

        dev = torch.device(device)
        free, _ = torch.cuda.mem_get_info(dev)
        cached = torch.cuda.memory_reserved(dev) - torch.cuda.memory_allocated(dev)
        held = sum(t.numel() * t.element_size() for m in _modules(self.pipe).values()
                   for t in [*m.parameters(), *m.buffers()] if t.device == dev)
        return int(free + cached + held)

    def attention_slicing(self) -> None:
        self.pipe.enable_attention_slicing("auto")

    def xformers(self) -> None:
        self.pipe.enable_xformers_memory_efficient_attention()

    def vae_slicing(self) -> None:
        self.pipe.vae.enable_slicing()

    def vae_tiling(self, tile_px: int) -> None:
        vae = self.pipe.vae
        vae.enable_tiling()
        if hasattr(vae, "tile_sample_min_size"):  # the VAE class (AutoencoderKL): tiles in pixels, and in latents
            factor = 2 ** (len(vae.config.block_out_channels) - 1)
            vae.tile_sample_min_size = tile_px
            vae.tile_latent_min_size = tile_px // factor


def _inputs_to_own_dtype(module, args):
    """A forward pre-hook: floating-point tensor arguments cast to the module's own dtype (a float32 VAE fed
    16-bit latents or images)."""
    import torch

    dtype = next((p.dtype for p in module.parameters() if p.is_floating_point()), None)
    if dtype is None:
        return None
    return tuple(a.to(dtype) if torch.is_tensor(a) and a.is_floating_point() and a.dtype != dtype else a
                 for a in args)


def load_dtype(settings: MemorySettings, half: str = "float16") -> str:
    """The dtype to load the weights at for `settings` (effective ones): the compute dtype, or with
    half_storage the checkpoint's own 16-bit dtype (`half`: bfloat16 for a bf16 checkpoint), so the
    weights stay memory-mapped from their files."""
    return half if settings.half_storage else settings.dtype


def effective_settings(settings: MemorySettings, device: DeviceInfo) -> tuple[MemorySettings, list[str]]:
    """What can run on this device, and why anything else was dropped."""
    skipped: list[str] = []
    effective = settings
    if device.kind == "cpu" and settings.dtype == "float16":
        effective = replace(effective, dtype="float32")
        skipped.append("dtype float16 -> float32: half precision is for GPUs (slow or unsupported on a CPU)")
    if settings.attention == "xformers" and not _xformers_usable(device):
        effective = replace(effective, attention="sdpa")
        skipped.append("xformers -> sdpa: xformers needs CUDA and the xformers package")
    return effective, skipped


def needs_reload(pipe, settings: MemorySettings) -> list[str]:
    """Components whose weights lost precision that `settings` wants back (reload them from disk)."""
    from lowvram_gen.models.quantize import kinds

    names = [n for n, kind in kinds(pipe).items()
             if kind != settings.quantize or str(getattr(pipe, n).dtype) != f"torch.{settings.dtype}"]
    state = getattr(pipe, _STATE, None)
    if not state:
        return sorted(names)
    want = _PRECISION[settings.dtype]
    keep_fp8 = state.get("fp8") and settings.fp8_storage
    names += [n for n, floor in state["floor"].items()
              if floor < min(want, _file_bits(pipe, n)) and not (keep_fp8 and n == denoiser_name(pipe))]
    if state.get("fp8") and not settings.fp8_storage:
        names.append(denoiser_name(pipe))
    if state.get("half") and not settings.half_storage:  # its casting hooks go with the reloaded modules
        names += list(state["floor"])
    return sorted(set(names))


def _file_bits(pipe, name: str) -> int:
    """The most precision a reload from disk can give `name` back: a GGUF denoiser's widest stored float."""
    bits = gguf_bits(getattr(pipe, name, None))
    return 32 if bits is None else bits


def forget_components(pipe, names: list[str]) -> None:
    """Called after the caller reloaded `names` from disk: their precision is whole again."""
    state = getattr(pipe, _STATE, None)
    if state:
        for name in names:
            state["floor"].pop(name, None)
            if name == denoiser_name(pipe):
                state["fp8"] = False
        if state.get("half") and not (set(state["floor"]) & set(_modules(pipe))):
            state["half"] = False


def component_swapped(pipe, name: str) -> bool:
    """Called after the caller put another model in `name`'s place (a job's VAE file, or the model's own VAE back,
    engines/sd/vae_swap.py): its precision is what its weights' dtype keeps, and under half storage the next apply
    gives it casting hooks of its own. False: it comes with casting hooks the pipeline no longer runs (reload it)."""
    state = getattr(pipe, _STATE, None)
    if not state:
        return True
    module = getattr(pipe, name)
    if _casting(module) and not state.get("half"):
        return False
    dtype = next((str(p.dtype).removeprefix("torch.") for p in module.parameters() if p.is_floating_point()), "")
    bits = _PRECISION.get(dtype, 32)
    if bits < 32:
        state["floor"][name] = bits
    else:  # whole, as a component read from disk (forget_components)
        state["floor"].pop(name, None)
    if state.get("half"):
        state["swapped"] = (*state.get("swapped", ()), name)
    return True


def apply_settings(pipe, settings: MemorySettings, device: DeviceInfo, ops: PipelineOps | None = None,
                   place_resident: bool = True) -> Applied:
    """Configure `pipe` for `settings` on `device`; safe to call again with other settings. `place_resident` False
    (the runner): a budget split's resident part is left on the host, for the runner to place when the denoiser runs.

    Raises RuntimeError if a component needs reloading first (see `needs_reload`).
    """
    ops = ops or PipelineOps(pipe)
    effective, skipped = effective_settings(settings.check(), device)
    pending = needs_reload(pipe, effective)
    if pending:
        raise RuntimeError(f"reload {pending} before applying {effective}: their weights lost precision")
    applied = Applied(requested=settings, effective=effective, skipped=skipped)
    calls = applied.calls
    state = getattr(pipe, _STATE, None) or {"floor": {}, "fp8": False, "attention": "sdpa"}

    ops.reset()
    calls.append("reset")
    denoiser = denoiser_name(pipe)
    gguf = gguf_bits(getattr(pipe, denoiser)) is not None
    if gguf:
        skipped.append(f"cast of the {denoiser}'s GGUF-quantized weights: they stay as stored and are "
                       f"dequantized per layer to {effective.dtype} (its other tensors follow {effective.dtype})")
        if effective.fp8_storage:
            effective = applied.effective = replace(effective, fp8_storage=False)
            skipped.append(f"fp8 storage: the {denoiser} holds GGUF-quantized weights, already stored in fewer bits")
    if effective.half_storage:
        if not state.get("half"):
            ops.half_storage(effective.dtype)
            calls.append(f"half_storage:{effective.dtype}")
            state["half"] = True
        else:  # a ControlNet put on (or reloaded) since, or another VAE (component_swapped): its own casting hooks
            swapped = {n: m for n, m in _modules(pipe).items() if n in state.get("swapped", ())}
            fresh = tuple(n for n, m in {**attached(pipe), **swapped}.items() if not _casting(m))
            if fresh:
                ops.half_storage(effective.dtype, fresh)
                calls.append(f"half_storage:{effective.dtype}:{','.join(fresh)}")
        for name in _modules(pipe):
            state["floor"][name] = min(state["floor"].get(name, 32), _PRECISION["float16"])
    else:
        vae32 = effective.vae_float32 and effective.dtype != "float32" and getattr(pipe, "vae", None) is not None
        ops.cast(effective.dtype, skip=((denoiser,) if state["fp8"] else ()) + (("vae",) if vae32 else ()))
        calls.append(f"cast:{effective.dtype}")
        if vae32:  # --no-half-vae / --upcast-sampling: the VAE in float32 beside the 16-bit rest
            ops.vae_float32(effective.dtype)
            calls.append("vae:float32")
        for name in _modules(pipe):
            if not (state["fp8"] and name == denoiser) and not (vae32 and name == "vae"):
                state["floor"][name] = min(state["floor"].get(name, 32), _PRECISION[effective.dtype])
    state.pop("swapped", None)
    if effective.upcast_attention or state.get("upcast"):
        ops.upcast_attention(effective.upcast_attention)
        calls.append(f"upcast_attention:{'on' if effective.upcast_attention else 'off'}")
        state["upcast"] = effective.upcast_attention
    if effective.fp8_storage and not state["fp8"]:
        ops.fp8_storage(effective.dtype)
        calls.append("fp8_storage")
        state["fp8"] = True
        state["floor"][denoiser] = _PRECISION["float8"]
    if effective.quantize != "none":
        from lowvram_gen.models.quantize import kinds, targets

        done = kinds(pipe)  # quantized while loading, or by an earlier apply (both of Wan 2.2 A14B's experts)
        todo = [n for n in targets(pipe) if done.get(n) != effective.quantize and not (gguf and n == denoiser)]
        if gguf:  # sdnq would quantize GGUF's packed uint8 blocks as if they were weights
            skipped.append(f"quantize {effective.quantize} of the {denoiser}: it holds GGUF-quantized weights "
                           "already (the text encoders are quantized)")
        if todo:  # none left when re-applied: already quantized
            ops.quantize(effective.quantize, todo, device.torch_device)
            calls.append(f"quantize:{effective.quantize}")

    target = device.torch_device
    if effective.offload == "none":
        ops.place(target)
        calls.append(f"place:{target}")
    elif effective.offload == "model":
        ops.model_offload(target)
        calls.append(f"model_offload:{target}")
    elif effective.offload == "budget":
        from lowvram_gen.models.row_split import cut_rows

        split = budget_split(pipe, effective, device, ops)
        # the layers the split cuts by rows, in place before the hooks go on (an idle expert's as the running one's)
        for prefix, module in [*_stepped(pipe), *(("", getattr(pipe, n)) for n in idle_experts(pipe))]:
            cut_rows(module, _own(prefix, split.resident + split.streamed))
        ops.budget_offload(target, split.streamed, use_stream=device.kind == "cuda", pinned=effective.pin_memory,
                           place=place_resident)
        calls.append(f"budget_offload:{split.resident_bytes}:{target}")
        applied.residency = split
    else:
        leaf = effective.offload == "sequential"
        ops.group_offload(target, leaf=leaf, use_stream=device.kind == "cuda", pinned=effective.pin_memory)
        calls.append(f"group_offload:{'leaf' if leaf else 'block'}:{target}")
    if device.kind == "cpu" and effective.offload != "none":
        skipped.append(f"offload {effective.offload} runs on the CPU but saves nothing there (no VRAM)")

    if effective.attention == "slicing":
        ops.attention_slicing()
        calls.append("attention_slicing")
    elif effective.attention == "xformers":
        ops.xformers()
        calls.append("xformers")
    state["attention"] = effective.attention
    if effective.vae_slicing:
        ops.vae_slicing()
        calls.append("vae_slicing")
    if effective.vae_tiling:
        tile = vae_tile_size(device)
        ops.vae_tiling(tile)
        calls.append(f"vae_tiling:{tile}")
    setattr(pipe, _STATE, state)
    for reason in skipped:
        log.info("memory settings: %s", reason)
    return applied


def prepare_encoders(pipe, names: list[str], settings: MemorySettings, device: DeviceInfo,
                     ops: PipelineOps | None = None) -> list[str]:
    """text_encoders = "reloaded": make the text encoders just read from disk (`names`) run as `settings` run
    them, without touching the rest of the pipeline (its hooks and placement stay): 16-bit storage's casting
    hooks, and on an accelerator the placement: whole on the device under offload none or model (model offload
    holds one model there at a time, and nothing else is there between calls), leaf by leaf under the streaming
    offloads, as `group_offload` streams text encoders. They were loaded at the load dtype (quantized while
    loading for int8/int4), so nothing is cast. Returns the calls made."""
    ops = ops or PipelineOps(pipe)
    effective, _ = effective_settings(settings, device)
    calls = []
    if effective.half_storage:
        ops.half_storage(effective.dtype, tuple(names))
        calls.append(f"half_storage:{effective.dtype}")
    if not device.is_accelerator:
        return calls
    target = device.torch_device
    if effective.offload in ("none", "model"):
        for name in names:
            getattr(pipe, name).to(target)
        calls.append(f"place:{target}")
    else:
        ops.group_offload(target, leaf=True, use_stream=device.kind == "cuda",
                          skip=tuple(n for n in _modules(pipe) if n not in names), pinned=effective.pin_memory)
        calls.append(f"group_offload:leaf:{target}")
    return calls


def budget_split(pipe, settings: MemorySettings, device: DeviceInfo, ops: PipelineOps) -> residency.Residency:
    """The denoiser's split for offload = "budget", from the weights as they are now (after the cast).

    `settings.resident_bytes` when a plan set it; otherwise (0) from the device: on CUDA the memory this
    pipeline could use (`ops.free_bytes`) less the reserve, `BUDGET_MARGIN` and the denoiser's fixed
    part, capped by the user's VRAM budget, with room for the two streamed blocks in flight
    (`residency.fit`); on MPS the same from the probed free memory; on a CPU every block stays (there is
    no device memory to save, and nothing is streamed)."""
    stepped = _stepped(pipe)  # the denoiser's blocks, then its ControlNets' (as planning/controlnet.py lists them)
    blocks = [(prefix + name, nbytes) for prefix, module in stepped for name, nbytes in piece_tree(module)]
    if settings.resident_bytes:
        return residency.split(blocks, settings.resident_bytes)
    if device.kind == "cpu":
        return residency.split(blocks, sum(b for _, b in blocks))
    free = ops.free_bytes(device.torch_device) if device.kind == "cuda" else device.free_bytes
    if device.budget_bytes is not None:
        free = min(free, device.budget_bytes)
    available = free - device.reserve_bytes - BUDGET_MARGIN - sum(fixed_bytes(m) for _, m in stepped)
    return residency.fit(blocks, available)


def _casting(module) -> bool:
    """Whether layerwise casting hooks are on `module`."""
    return any(getattr(m, "_diffusers_hook", None) is not None
               and m._diffusers_hook.get_hook("layerwise_casting") is not None for m in module.modules())


def _can_prefetch() -> bool:
    try:
        from diffusers.hooks.group_offloading import ModuleGroup, _apply_lazy_group_offloading_hook  # noqa: F401
    except ImportError:
        return False
    return True


def _prefetch_in_execution_order(module, first_block) -> None:
    """diffusers' lazy prefetching on `module`: its first forward traces the order in which the block
    groups run, then each group prefetches the next on the stream (and the module's own empty group the
    first). The same hook and empty group that diffusers puts on a model for leaf-level offloading with
    streams; the private names are checked by `_can_prefetch`."""
    from diffusers.hooks.group_offloading import ModuleGroup, _apply_lazy_group_offloading_hook

    config = first_block._diffusers_hook.get_hook("group_offloading").config
    root = ModuleGroup(modules=[], offload_device=config.offload_device, onload_device=config.onload_device,
                       offload_leader=module, onload_leader=module, non_blocking=False, stream=None,
                       record_stream=False, onload_self=True, group_id="lowvram_gen_budget_root")
    _apply_lazy_group_offloading_hook(module, root, config=config)


class _DropGroupMoveWarning(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return "is group offloaded and moving it" not in record.getMessage()


def _quiet_group_offload_moves() -> None:
    """Without a stream, a group hook offloads its block with `block.to("cpu")`, and diffusers' ModelMixin.to
    warns on every such call when the block is itself a model (a UNet's attention blocks are
    Transformer2DModels): once per streamed attention block per step, about a move the hook itself makes."""
    logger = logging.getLogger("diffusers.models.modeling_utils")
    if not any(isinstance(f, _DropGroupMoveWarning) for f in logger.filters):
        logger.addFilter(_DropGroupMoveWarning())


def _place_outside(module, streamed: set[int], device) -> None:
    """Move `module` to `device` except the submodules whose ids are in `streamed` (their hooks own them)."""
    if id(module) in streamed:
        return
    if not any(id(m) in streamed for m in module.modules()):
        module.to(device)
        return
    for child in module.children():
        _place_outside(child, streamed, device)
    for key, param in module._parameters.items():
        if param is not None:
            param.data = param.data.to(device)
    for key, buffer in module._buffers.items():
        if buffer is not None:
            module._buffers[key] = buffer.to(device)


def _xformers_usable(device: DeviceInfo) -> bool:
    if device.kind != "cuda":
        return False
    try:
        import xformers.ops  # noqa: F401
    except Exception:  # ImportError, or a build that does not match this torch
        return False
    return True
