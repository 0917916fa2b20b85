"""The VQGAN-CLIP optimisation loop and its out-of-memory ladder.

One `VqganLoop` optimises one image. Each iteration: quantise z (straight-through), decode,
make all `cutn` cutouts, CLIP-encode them `cutn_chunk` at a time (each chunk's loss is
backpropagated to the cutouts at once, freeing its CLIP activations; the cutouts' accumulated
gradient then goes back through the augmentations and the decoder once), optimiser step.

Low-VRAM knobs come from the preset's [vqgan] section: cutout chunk size, CLIP under autocast,
gradient checkpointing in the VQGAN decoder, the CLIP text tower moved off the device once the
prompts are encoded. The VQGAN encoder is only on the device while it encodes an init image.

On out-of-memory in an iteration the loop leaves the except block, frees memory, restores the
random state of that iteration and steps to cheaper knobs (the next preset's, never more
expensive than the current ones; then smaller chunks), and redoes the same iteration from the
same z and optimiser state: nothing is started over. Lowering `cutn` changes the result, so it is
the very last step, and it is recorded.
"""

from __future__ import annotations

import functools
import logging
import math
import threading
import time
from dataclasses import dataclass, replace
from typing import Callable

import torch
import torch.nn.functional as F

from lowvram_gen.hardware.device import DeviceInfo
from lowvram_gen.errors import BadOutput, Cancelled
from lowvram_gen.ladder import Ladder
from lowvram_gen.presets import Preset
from lowvram_gen.engines.vqgan import parts

log = logging.getLogger(__name__)
MIN_CUTN = 1
ADVICE = ("Close other programs using the GPU, use a smaller size or fewer cutouts (--cutn), a smaller CLIP, "
          "or run with --cpu")


@dataclass(frozen=True)
class Knobs:
    cutn_chunk: int
    clip_autocast: bool
    gradient_checkpointing: bool
    clip_text_offload: bool

    @classmethod
    def of(cls, preset: Preset) -> "Knobs":
        v = preset.vqgan
        return cls(v.cutn_chunk, v.clip_autocast, v.gradient_checkpointing, v.clip_text_offload)

    def cheaper(self, other: "Knobs") -> "Knobs":
        """`other`'s knobs, but never more expensive than these (after an OOM nothing grows back)."""
        return Knobs(min(self.cutn_chunk, other.cutn_chunk), self.clip_autocast or other.clip_autocast,
                     self.gradient_checkpointing or other.gradient_checkpointing,
                     self.clip_text_offload or other.clip_text_offload)


class VqganOps:
    """Every placement and checkpointing switch goes through here, so tests can see what a preset does."""

    def __init__(self, device: str):
        self.device = device
        self.calls: list[tuple[str, object]] = []

    def place(self, name: str, modules, on_device: bool) -> None:
        where = self.device if on_device else "cpu"
        self.calls.append((name, where))
        for m in modules:
            m.to(where)

    def checkpointing(self, decoder, on: bool) -> None:
        self.calls.append(("decoder checkpointing", on))
        if hasattr(decoder, "gradient_checkpointing"):  # diffusers' Decoder: mid block and up blocks
            decoder.gradient_checkpointing = on
            decoder._gradient_checkpointing_func = functools.partial(_checkpoint, use_reentrant=False)


def _checkpoint(module, *args, use_reentrant=False):
    from torch.utils.checkpoint import checkpoint

    return checkpoint(module.__call__, *args, use_reentrant=use_reentrant)


@dataclass
class LoopState:
    """What survives an out-of-memory: the latent, the optimiser and how far they got."""

    z: torch.Tensor
    z_orig: torch.Tensor
    opt: torch.optim.Optimizer
    iteration: int = 0  # iterations completed
    losses: tuple[float, ...] = ()


class VqganLoop:
    def __init__(self, vq, clip, request, seed: int, size: tuple[int, int], ladder: Ladder, device: DeviceInfo,
                 ops: VqganOps | None = None, on_step: Callable[[int, int], None] | None = None,
                 cancel: threading.Event | None = None, on_image: Callable[[object, int], None] | None = None,
                 previous: "VqganLoop | None" = None):
        """`ladder` is the job's (shared by its images); `previous`, the loop of the image before:
        this one starts with the knobs that image ended with (never more expensive ones)."""
        self.vq, self.clip, self.request, self.seed = vq, clip, request, seed
        self.width, self.height = size
        self.ladder, self.device = ladder, device
        self.ops = ops or VqganOps(device.torch_device)
        self.on_step, self.cancel, self.on_image = on_step, cancel, on_image
        self.on_start: Callable[[object], None] | None = None  # gets the image before the first iteration
        self.knobs = previous.knobs if previous else Knobs.of(ladder.preset)
        self.cutn = previous.cutn if previous else request.cutn
        self.cutter = parts.MakeCutouts(clip.image_size, request.augments, request.cut_pow)
        self.prompts: list[parts.Prompt] = []
        self.state: LoopState | None = None
        self.warnings: list[str] = []
        self.text_on_device = False
        self.float32_only = previous.float32_only if previous else False  # set after a NaN loss under autocast
        self.levels = len(vq.config.block_out_channels)
        self.toks = (max(1, self.width // 2 ** (self.levels - 1)), max(1, self.height // 2 ** (self.levels - 1)))
        self.mean = torch.tensor(clip.mean).view(1, 3, 1, 1)
        self.std = torch.tensor(clip.std).view(1, 3, 1, 1)

    # -- pieces -------------------------------------------------------------------------------
    @property
    def dev(self) -> str:
        return self.device.torch_device

    def _autocast(self):
        kind = self.device.kind
        dtype = torch.bfloat16 if kind == "cpu" else torch.float16
        return torch.autocast(kind if kind in ("cuda", "cpu", "mps") else "cpu", dtype=dtype,
                              enabled=self.knobs.clip_autocast)

    def synth(self, z: torch.Tensor) -> torch.Tensor:
        codebook = self.vq.quantize.embedding.weight
        z_q = parts.vector_quantize(z.movedim(1, 3), codebook).movedim(3, 1)
        out = self.vq.decode(z_q, force_not_quantize=True).sample
        return parts.clamp_with_grad(out.add(1).div(2), 0, 1)

    def encode_images(self, cutouts: torch.Tensor) -> torch.Tensor:
        model = self.clip.model
        x = (cutouts - self.mean.to(cutouts.device)) / self.std.to(cutouts.device)
        with self._autocast():
            pooled = model.vision_model(pixel_values=x).pooler_output
            return model.visual_projection(pooled).float()

    def _text_modules(self):
        return [self.clip.model.text_model, self.clip.model.text_projection]

    def _encode_text(self, text: str) -> torch.Tensor:
        tok, model = self.clip.tokenizer, self.clip.model
        limit = int(getattr(model.config.text_config, "max_position_embeddings", 77))
        used = len(tok(text).input_ids)
        if used > limit:
            self.warnings.append(f"the prompt {text[:40]!r} has {used} tokens; CLIP takes {limit}, the rest is ignored")
        ids = tok([text], padding="max_length", max_length=limit, truncation=True, return_tensors="pt")
        with self._autocast():
            out = model.text_model(input_ids=ids.input_ids.to(self.dev), attention_mask=ids.attention_mask.to(self.dev))
            return model.text_projection(out.pooler_output).float()

    def _encode_cutouts(self, image: torch.Tensor, cutn: int) -> torch.Tensor:
        cutouts = self.cutter(image, cutn)
        chunk = max(1, min(self.knobs.cutn_chunk, cutn))
        return torch.cat([self.encode_images(cutouts[i:i + chunk]) for i in range(0, cutn, chunk)])

    def _rng(self):
        cuda = torch.cuda.get_rng_state(self.device.index) if self.device.kind == "cuda" else None
        return torch.get_rng_state(), cuda

    def _set_rng(self, state) -> None:
        torch.set_rng_state(state[0])
        if state[1] is not None:
            torch.cuda.set_rng_state(state[1], self.device.index)

    # -- setup ----------------------------------------------------------------------------------
    def apply_knobs(self) -> None:
        self.ops.checkpointing(self.vq.decoder, self.knobs.gradient_checkpointing)
        if self.knobs.clip_text_offload and self.text_on_device:
            self.ops.place("clip text tower", self._text_modules(), False)
            self.text_on_device = False

    def setup(self) -> None:
        """Place the models, encode the prompts, make z and the optimiser (seeded: a retry is identical)."""
        torch.manual_seed(self.seed)
        vq, req = self.vq, self.request
        self.ops.place("vqgan decoder", [vq.decoder, vq.post_quant_conv, vq.quantize], True)
        self.ops.place("clip vision tower", [self.clip.model.vision_model, self.clip.model.visual_projection], True)
        self.apply_knobs()
        prompts = []
        with torch.no_grad():
            texts = req.text_prompts()
            if texts:
                self.ops.place("clip text tower", self._text_modules(), True)
                self.text_on_device = True
                for spec in texts:
                    prompts.append(parts.Prompt(self._encode_text(spec.text), spec.weight, spec.stop, spec.text))
                if self.knobs.clip_text_offload:
                    self.ops.place("clip text tower", self._text_modules(), False)
                    self.text_on_device = False
            side = (self.toks[0] * 2 ** (self.levels - 1), self.toks[1] * 2 ** (self.levels - 1))
            for spec in req.image_prompt_specs():
                from PIL import Image

                with Image.open(spec.text) as im:
                    img = parts.pil_to_tensor(im.convert("RGB").resize(side, Image.Resampling.LANCZOS)).to(self.dev)
                prompts.append(parts.Prompt(self._encode_cutouts(img, self.cutn), spec.weight, spec.stop, spec.text))
            z = self._initial_z(side)
        self.prompts = [p.to(self.dev) for p in prompts]
        z = z.detach().clone().requires_grad_(True)
        self.state = LoopState(z, z.detach().clone(), parts.make_optimizer(req.optimizer, [z], req.lr))
        codebook = vq.quantize.embedding.weight
        self.z_min = codebook.min(dim=0).values[None, :, None, None]
        self.z_max = codebook.max(dim=0).values[None, :, None, None]

    def _initial_z(self, side: tuple[int, int]) -> torch.Tensor:
        vq, req = self.vq, self.request
        image = None
        if req.init_image:
            from PIL import Image

            with Image.open(req.init_image) as im:
                image = im.convert("RGB").resize(side, Image.Resampling.LANCZOS)
        elif req.init_noise != "none":
            image = parts.noise_image(req.init_noise, *side, torch.Generator().manual_seed(self.seed))
        if image is not None:
            encoder = [vq.encoder, vq.quant_conv]
            self.ops.place("vqgan encoder", encoder, True)  # used once: never kept on the device
            try:
                h = vq.encode(parts.pil_to_tensor(image).to(self.dev) * 2 - 1).latents
                return vq.quantize(h)[0]
            finally:
                self.ops.place("vqgan encoder", encoder, False)
        codebook = vq.quantize.embedding.weight
        idx = torch.randint(codebook.shape[0], [self.toks[0] * self.toks[1]]).to(codebook.device)
        return codebook[idx].view(1, self.toks[1], self.toks[0], -1).permute(0, 3, 1, 2)

    # -- one iteration --------------------------------------------------------------------------
    def gradient(self) -> tuple[float, ...]:
        """Losses of this iteration; leaves their gradient in z.grad. Cutouts are made once, then
        encoded `cutn_chunk` at a time, so every chunk size gives the same gradient."""
        state, cutn = self.state, self.cutn
        z = state.z
        z.grad = None
        cutouts = self.cutter(self.synth(z), cutn)
        leaf = cutouts.detach().requires_grad_(True)
        chunk = max(1, min(self.knobs.cutn_chunk, cutn))
        totals = [0.0] * len(self.prompts)
        for start in range(0, cutn, chunk):
            embeds = self.encode_images(leaf[start:start + chunk])
            terms = [p.loss_sum(embeds) / cutn for p in self.prompts]
            torch.stack(terms).sum().backward()
            for i, t in enumerate(terms):
                totals[i] += float(t.detach())
            del embeds, terms
        outputs, grads = [cutouts], [leaf.grad]
        if self.request.init_weight:
            init_loss = F.mse_loss(z, state.z_orig) * self.request.init_weight / 2
            outputs.append(init_loss)
            grads.append(None)
            totals.append(float(init_loss.detach()))
        torch.autograd.backward(outputs, grads)
        return tuple(totals)

    @property
    def preset(self) -> Preset:
        return self.ladder.preset

    def _step_down(self) -> None:
        """The next preset's knobs (never more expensive than these), then smaller chunks, then fewer
        cutouts (which changes the result: said in the warnings)."""
        chunk = max(1, min(self.knobs.cutn_chunk, self.cutn))
        if self.ladder.step_preset():
            self.knobs = self.knobs.cheaper(Knobs.of(self.preset))
        elif chunk > 1:
            self.knobs = replace(self.knobs, cutn_chunk=math.ceil(chunk / 2))
        elif self.cutn > MIN_CUTN:
            old, self.cutn = self.cutn, max(MIN_CUTN, self.cutn // 2)
            self.warnings.append(f"out of memory at every preset: cutouts lowered from {old} to {self.cutn} "
                                 "(this changes the result)")
        else:
            raise self.ladder.exhausted(ADVICE)
        if self.float32_only:
            self.knobs = replace(self.knobs, clip_autocast=False)
        self.apply_knobs()
        self.ladder.went_down(f"{self.preset.name}, {self.cutn} cutouts in chunks of {min(self.knobs.cutn_chunk, self.cutn)}")

    def where(self, iteration: int = 0, first: int = 0) -> dict:
        k = self.knobs
        chunk = min(k.cutn_chunk, self.cutn)
        return dict(batch=chunk, width=self.width, height=self.height,
                    unit=f"{self.cutn} cutouts in chunks of {chunk}",
                    extra=dict(iteration=iteration, first_iteration=first, cutn=self.cutn,
                               clip_autocast=k.clip_autocast, gradient_checkpointing=k.gradient_checkpointing,
                               clip_text_offload=k.clip_text_offload))

    def _attempt(self, stage: str, outcome: str, started: float, detail: str = "", iteration: int = 0,
                 first: int = 0) -> None:
        self.ladder.record(stage, outcome, started, detail, **self.where(iteration, first))

    def _release(self) -> None:
        if self.device.is_accelerator:
            self.ops.place("all models", [self.vq, self.clip.model], False)
            self.text_on_device = False

    def _guarded(self, stage: str, fn, iteration: int = 0, first: int = 0, started: float | None = None):
        """(result, True), or (None, False) after an OOM that the ladder handled (state is untouched:
        the same iteration is redone from the same z, optimiser state and random state)."""
        rng = self._rng()

        def drop_partial() -> None:
            if self.state is not None:
                self.state.z.grad = None
            if stage == "setup":
                self._release()

        ok, result = self.ladder.attempt(stage, fn, lambda: self.where(iteration, first), started, drop_partial)
        if ok:
            return result, True
        self._set_rng(rng)
        if stage != "preview":
            self._step_down()
        return None, False

    # -- the run --------------------------------------------------------------------------------
    def run(self):
        """Optimise; returns the final image (PIL, at the generated size)."""
        started = time.perf_counter()
        while not self._guarded("setup", self.setup, started=started)[1]:
            started = time.perf_counter()
        state, total = self.state, self.request.iterations
        if self.on_start is not None and state.iteration == 0:  # the progress video's first frame
            image, ok = self._guarded("preview", self.current_image)
            if ok:
                self.on_start(image)
        started, first = time.perf_counter(), 1
        while state.iteration < total:
            if self.cancel is not None and self.cancel.is_set():
                raise Cancelled(f"cancelled at iteration {state.iteration} of {total}")
            rng = self._rng()
            losses, ok = self._guarded("iterate", self.gradient, state.iteration + 1, first, started)
            if not ok:
                started, first = time.perf_counter(), state.iteration + 1
                continue
            if not all(math.isfinite(x) for x in losses):
                state.z.grad = None
                if not self.knobs.clip_autocast:
                    raise BadOutput(f"the loss became NaN/Inf at iteration {state.iteration + 1} even in float32; "
                                    "the VQGAN or CLIP weights may be broken, or the learning rate too high")
                self._attempt("iterate", "nan", started, "NaN/Inf loss under autocast; redone in float32",
                              state.iteration + 1, first)
                self.knobs = replace(self.knobs, clip_autocast=False)  # as SD decodes NaN output again in float32
                self.float32_only = True
                self._set_rng(rng)
                started, first = time.perf_counter(), state.iteration + 1
                continue
            state.opt.step()
            with torch.no_grad():
                state.z.copy_(state.z.maximum(self.z_min).minimum(self.z_max))
            state.iteration += 1
            state.losses = losses
            if self.on_step is not None:
                self.on_step(state.iteration, total)
            every = self.request.save_every
            if every and state.iteration % every == 0 and state.iteration < total and self.on_image is not None:
                image, ok = self._guarded("preview", self.current_image, state.iteration, state.iteration)
                if ok:
                    self.on_image(image, state.iteration)
        self._attempt("iterate", "ok", started, f"iterations {first}-{total}", total, first)
        return self.current_image()

    def current_image(self):
        with torch.no_grad():
            return parts.tensor_to_pil(self.synth(self.state.z))

    def close(self) -> None:
        """Give the device back: weights return to the CPU (they stay loaded, in RAM)."""
        self._release()
        self.ops.checkpointing(self.vq.decoder, False)
