"""int8/int4 while loading (models/loading.py with sdnq's quantizer) and reloading single components from
their own files: the same weights and images as quantizing after the load, without the full-precision
model in RAM on the way. CPU only."""

from __future__ import annotations

import sys
import weakref
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("sdnq")

sys.path.insert(0, str(Path(__file__).parent))

import ldm_layout  # noqa: E402
import procmaps  # noqa: E402
from torch.utils._python_dispatch import TorchDispatchMode  # noqa: E402
from torch.utils._pytree import tree_flatten  # noqa: E402

from lowvram_gen.hardware.device import probe  # noqa: E402
from lowvram_gen.engines.sd import apply as apply_mod  # noqa: E402
from lowvram_gen.models.loading import load, reload_components  # noqa: E402
from lowvram_gen.models.quantize import kinds, quantize_module, targets  # noqa: E402
from lowvram_gen.models.resolve import resolve  # noqa: E402
from lowvram_gen.settings import MemorySettings  # noqa: E402


class LiveBytes(TorchDispatchMode):
    """Bytes of tensor storages alive, and their peak, while the mode is on: each op's output storage is
    counted when it first appears and taken off when it is freed (the idea of benchmarks/calibrate_memory.py
    `live_worker`). Every storage a load makes goes through an op (safetensors' tensors arrive by `set_`), so
    the file's tensors, the cast copies and the quantized weights are all counted."""

    def __init__(self):
        super().__init__()
        self.sizes: dict[int, int] = {}
        self.now = self.peak = 0

    def counted(self, func, ptr: int) -> bool:
        return True

    def _free(self, ptr: int, n: int) -> None:
        if self.sizes.pop(ptr, None) is not None:
            self.now -= n

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in tree_flatten(out)[0]:
            if isinstance(t, torch.Tensor) and t.device.type == "cpu":
                st = t.untyped_storage()
                ptr, n = st.data_ptr(), st.nbytes()
                if ptr and ptr not in self.sizes and self.counted(func, ptr):
                    self.sizes[ptr] = n
                    self.now += n
                    self.peak = max(self.peak, self.now)
                    weakref.finalize(st, self._free, ptr, n)
        return out


def _bytes(module) -> int:
    return sum(t.numel() * t.element_size() for t in [*module.parameters(), *module.buffers()])


def _fp16_copy(path, folder):
    """A tiny model saved in float16, as real checkpoints ship, to be loaded at float32 (what a CPU runs)."""
    from diffusers import DiffusionPipeline

    DiffusionPipeline.from_pretrained(path).to(torch.float16).save_pretrained(folder)
    from lowvram_gen.models.resolve import ModelSource

    return ModelSource(folder.name, "folder", folder)


@pytest.fixture(scope="module")
def fp16_sources(tiny_path, tiny_sdxl_path, tmp_path_factory):
    return {name: _fp16_copy(path, tmp_path_factory.mktemp(f"{name}-fp16"))
            for name, path in (("tiny", tiny_path), ("tiny-sdxl", tiny_sdxl_path))}


def _peak(load_it) -> tuple[int, object]:
    with LiveBytes() as mode:
        pipe = load_it()
    return mode.peak, pipe


def _post_load(source, kind):
    """The old way: the whole pipeline at full precision, then quantized in place."""
    pipe = load(source, "float32").pipe
    for name in targets(pipe):
        quantize_module(getattr(pipe, name), kind)
    return pipe


@pytest.mark.parametrize("name", ["tiny", "tiny-sdxl"])
def test_quantizing_while_loading_never_holds_the_full_precision_denoiser(fp16_sources, name):
    """Peak of live tensor bytes while loading float16 files at float32 with int8: below what the pipeline
    takes unquantized (the float32 denoiser beside the other components), which the old post-load way
    holds at its peak (the control: it shows the measure sees the difference)."""
    source = fp16_sources[name]
    old_peak, old = _peak(lambda: _post_load(source, "int8"))
    new_peak, new = _peak(lambda: load(source, "float32", "int8").pipe)
    full = load(source, "float32").pipe
    denoiser = "unet"
    others = sum(_bytes(getattr(new, n)) for n in ("text_encoder", "text_encoder_2", "vae") if getattr(new, n, None))
    unquantized = others + _bytes(getattr(full, denoiser))
    assert _bytes(new.unet) < 0.6 * _bytes(full.unet)  # the denoiser really is smaller quantized
    assert old_peak >= unquantized, (old_peak, unquantized)
    assert new_peak < unquantized, (new_peak, unquantized, old_peak)
    assert kinds(new) == kinds(old) == dict.fromkeys(targets(new), "int8")


@pytest.mark.parametrize("kind", ["int8", "int4"])
@pytest.mark.parametrize("spec", ["tiny", "tiny-sdxl"])
def test_weights_quantized_while_loading_equal_post_load_quantization(spec, kind):
    """Bit for bit, every tensor of every quantized component (same settings: convolutions, skip rules)."""
    source = resolve(spec)
    new = load(source, "float32", kind).pipe
    old = _post_load(source, kind)
    for name in targets(old):
        a, b = getattr(new, name).state_dict(), getattr(old, name).state_dict()
        assert a.keys() == b.keys(), name
        for key in a:
            assert a[key].dtype == b[key].dtype and torch.equal(a[key], b[key]), f"{name}.{key}"
    assert any(t.dtype in (torch.int8, torch.uint8) for t in new.unet.state_dict().values())


def test_a_model_quantized_at_load_counts_as_quantized_for_apply(tiny_path):
    """apply_settings does not quantize it again; another kind or none names it for a reload."""
    pipe = load(resolve("tiny"), "float32", "int8").pipe
    assert apply_mod.needs_reload(pipe, MemorySettings(dtype="float32", quantize="int8")) == []
    applied = apply_mod.apply_settings(pipe, MemorySettings(dtype="float32", quantize="int8"), probe("cpu"))
    assert not any(c.startswith("quantize") for c in applied.calls), applied.calls
    assert apply_mod.needs_reload(pipe, MemorySettings(dtype="float32")) == ["text_encoder", "unet"]
    assert apply_mod.needs_reload(pipe, MemorySettings(dtype="float32", quantize="int4")) == ["text_encoder", "unet"]
    with pytest.raises(RuntimeError, match="reload"):
        apply_mod.apply_settings(pipe, MemorySettings(dtype="float32"), probe("cpu"))


def test_reload_reads_only_the_named_component_from_its_own_files(tiny_path, monkeypatch):
    """int8 -> none: the UNet comes back at full precision from unet/ alone; the other components stay the
    same objects, no pipeline is built, and the weights equal the file's."""
    import diffusers
    import safetensors.torch

    model = load(resolve("tiny"), "float32", "int8")
    before = dict(model.pipe.components)
    opened = []
    real_load_file = safetensors.torch.load_file
    monkeypatch.setattr(safetensors.torch, "load_file", lambda f, *a, **k: opened.append(str(f)) or real_load_file(f, *a, **k))

    def no_pipeline(*args, **kwargs):
        raise AssertionError("reload built a whole pipeline")

    monkeypatch.setattr(diffusers.AutoPipelineForText2Image, "from_pretrained", no_pipeline)
    reload_components(model, ["unet"], "float32", "none")
    assert opened and all("/unet/" in f for f in opened), opened
    for name, component in model.pipe.components.items():
        assert (component is before[name]) == (name != "unet"), name
    assert kinds(model.pipe) == {"text_encoder": "int8"}
    monkeypatch.undo()
    state = safetensors.torch.load_file(tiny_path / "unet" / "diffusion_pytorch_model.safetensors")
    unet = model.pipe.unet.state_dict()
    assert unet.keys() == state.keys() and all(torch.equal(unet[k], state[k]) for k in state)
    assert apply_mod.needs_reload(model.pipe, MemorySettings(dtype="float32")) == ["text_encoder"]


def test_reload_quantizes_as_asked(tiny_path):
    """int8 -> int4: the reloaded UNet is int4, the same weights a fresh int4 load gives."""
    model = load(resolve("tiny"), "float32", "int8")
    reload_components(model, ["unet", "text_encoder"], "float32", "int4")
    assert kinds(model.pipe) == {"text_encoder": "int4", "unet": "int4"}
    fresh = load(resolve("tiny"), "float32", "int4").pipe
    a, b = model.pipe.unet.state_dict(), fresh.unet.state_dict()
    assert all(torch.equal(a[k], b[k]) for k in b)


def _png(tmp_path, sub, monkeypatch=None, post_load=False, extra=()):
    from lowvram_gen import session as session_mod
    from lowvram_gen.cli.main import main

    if post_load:  # the old way: load at full precision (as a single-file checkpoint does), apply quantizes
        real = session_mod.load
        monkeypatch.setattr(session_mod, "load", lambda source, dtype, *a, **k: real(source, dtype))
    out = tmp_path / sub
    code = main(["generate", "a fox", "--model", "tiny", "--quantize", "int8", "--width", "64", "--height", "64",
                 "--steps", "2", "--seed", "7", "--cpu", "--outdir", str(out), *extra])
    assert code == 0
    (png,) = out.rglob("*.png")
    return png


def test_the_image_is_the_one_post_load_quantization_makes(tmp_path, monkeypatch):
    from PIL import Image

    from lowvram_gen import session as session_mod

    calls = []
    real = session_mod.load
    monkeypatch.setattr(session_mod, "load", lambda *a, **k: calls.append(a) or real(*a, **k))
    new = _png(tmp_path, "while")
    assert calls and calls[0][2] == "int8"  # the session asked for int8 while loading
    monkeypatch.undo()
    old = _png(tmp_path, "post", monkeypatch, post_load=True)
    a, b = Image.open(new), Image.open(old)
    assert np.array_equal(np.asarray(a), np.asarray(b))
    assert "Quantize: int8" in a.info["parameters"] and "Quantize: int8" in b.info["parameters"]


# ------------------------------------------------------------------ single-file checkpoints (.safetensors)


class AnonymousLiveBytes(LiveBytes):
    """LiveBytes less the storages that are pages of `path`: safetensors maps a single file and its tensors are
    the file's pages as long as the pipeline is being built (every component's, not one at a time as in a
    folder). The kernel drops those under pressure (planning/host.py keeps them out of the must-fit peak), so
    what is compared here is the memory that must fit: casts, quantized weights, scratch."""

    def __init__(self, path):
        super().__init__()
        self.path, self.ranges, self.file_storages = path, [], set()

    def counted(self, func, ptr: int) -> bool:
        if func is torch.ops.aten.set_.source_Storage:  # how each of safetensors' storages first appears (measured)
            if not self._in_file(ptr):
                self.ranges = procmaps.mapped_ranges(self.path)  # the file mapped anew
            if self._in_file(ptr):
                self.file_storages.add(ptr)
        elif ptr not in self.file_storages and self._in_file(ptr):  # in a mapping seen before: unmapped since?
            self.ranges = procmaps.mapped_ranges(self.path)
        return not self._in_file(ptr)

    def _in_file(self, ptr: int) -> bool:
        return any(a <= ptr < b for a, b in self.ranges)


@pytest.fixture(scope="module")
def single_files(tiny_path, tiny_sdxl_path, tmp_path_factory):
    """The tiny pipelines as original-layout (A1111) float16 .safetensors files, as real checkpoints ship, and
    the SD one as a .ckpt; {name: ModelSource}."""
    import safetensors.torch
    from diffusers import DiffusionPipeline

    from lowvram_gen.models.resolve import ModelSource

    out, root = {}, tmp_path_factory.mktemp("single-files")
    for name, folder in (("tiny", tiny_path), ("tiny-sdxl", tiny_sdxl_path)):
        state = ldm_layout.pipeline_to_ldm(DiffusionPipeline.from_pretrained(folder).to(torch.float16))
        path = root / f"{name}.safetensors"
        safetensors.torch.save_file(state, str(path))
        out[name] = ModelSource(str(path), "single_file", path, str(folder))
        if name == "tiny":
            ckpt = root / "tiny.ckpt"
            torch.save({"state_dict": state}, ckpt)
            out["tiny-ckpt"] = ModelSource(str(ckpt), "single_file", ckpt, str(folder))
    return out


def _single_peak(source, load_it) -> tuple[int, object]:
    with AnonymousLiveBytes(source.path) as mode:
        pipe = load_it()
    return mode.peak, pipe


@pytest.mark.parametrize("name", ["tiny", "tiny-sdxl"])
def test_a_single_file_quantizes_its_unet_while_it_loads(single_files, name):
    """Issue 17 for single files: the UNet comes from its own keys through `from_single_file` with sdnq's
    config, so the float32 UNet never exists beside the rest; the text encoders (built by diffusers from the
    file's keys) load at full precision, quantized later by apply. Control: the post-load way holds the whole
    float32 pipeline, and the same measure sees it."""
    source = single_files[name]
    old_peak, old = _single_peak(source, lambda: _post_load(source, "int8"))
    new_peak, new = _single_peak(source, lambda: load(source, "float32", "int8").pipe)
    full = load(source, "float32").pipe
    others = sum(_bytes(getattr(new, n)) for n in ("text_encoder", "text_encoder_2", "vae") if getattr(new, n, None))
    unquantized = others + _bytes(full.unet)
    assert _bytes(new.unet) < 0.6 * _bytes(full.unet)
    assert old_peak >= unquantized, (old_peak, unquantized)
    assert new_peak < unquantized, (new_peak, unquantized, old_peak)
    assert kinds(new) == {"unet": "int8"}  # the text encoders: full precision until apply quantizes them
    assert all(getattr(new, n).dtype == torch.float32 for n in targets(new) if n != "unet")
    applied = apply_mod.apply_settings(new, MemorySettings(dtype="float32", quantize="int8"), probe("cpu"))
    assert kinds(new) == kinds(old) == dict.fromkeys(targets(new), "int8") and "quantize:int8" in applied.calls


@pytest.mark.parametrize("kind", ["int8", "int4"])
@pytest.mark.parametrize("name", ["tiny", "tiny-sdxl", "tiny-ckpt"])
def test_a_single_files_unet_quantized_while_loading_equals_post_load_quantization(single_files, name, kind):
    """Bit for bit, every tensor of the UNet and (quantized after by apply) of the text encoders; a .ckpt's UNet
    comes from its weights-only tensors the same way."""
    source = single_files[name]
    new = load(source, "float32", kind).pipe
    assert kinds(new) == {"unet": kind}
    assert new.unet.config["quantization_config"]["quant_method"] == "sdnq"  # as from a folder: nothing of the loan
    apply_mod.apply_settings(new, MemorySettings(dtype="float32", quantize=kind), probe("cpu"))
    old = _post_load(source, kind)
    for component in targets(old):
        a, b = getattr(new, component).state_dict(), getattr(old, component).state_dict()
        assert a.keys() == b.keys(), component
        for key in a:
            assert a[key].dtype == b[key].dtype and torch.equal(a[key], b[key]), f"{component}.{key}"
    assert any(t.dtype in (torch.int8, torch.uint8) for t in new.unet.state_dict().values())


def test_a_single_file_reloads_its_unet_quantized_while_loading(single_files):
    """int8 -> int4 on a single file: the runner's reload reads the UNet from its keys at int4; apply has nothing
    left to quantize but the text encoders it still needs to."""
    model = load(single_files["tiny"], "float32", "int8")
    reload_components(model, ["unet"], "float32", "int4")
    assert kinds(model.pipe) == {"unet": "int4"}
    assert apply_mod.needs_reload(model.pipe, MemorySettings(dtype="float32", quantize="int4")) == []
    fresh = load(single_files["tiny"], "float32", "int4").pipe
    a, b = model.pipe.unet.state_dict(), fresh.unet.state_dict()
    assert all(torch.equal(a[k], b[k]) for k in b)


def test_a_single_files_image_is_the_one_post_load_quantization_makes(single_files, tmp_path, monkeypatch):
    """The CLI with --quantize int8 on a .safetensors checkpoint: the image equals the old way's (load whole, apply
    quantizes everything), pixel for pixel, and the session asked for int8 while loading."""
    from PIL import Image

    from lowvram_gen import session as session_mod

    source = single_files["tiny"]
    loaded = []
    real = session_mod.load

    def load_and_look(*a, **k):  # what the load itself quantized, before apply quantizes the rest
        model = real(*a, **k)
        loaded.append((a[0].kind, kinds(model.pipe)))
        return model

    monkeypatch.setattr(session_mod, "load", load_and_look)
    args = ["--model", str(source.path), "--config", source.config]
    new = _png(tmp_path, "while", extra=args)
    assert loaded == [("single_file", {"unet": "int8"})]
    monkeypatch.undo()
    old = _png(tmp_path, "post", monkeypatch, post_load=True, extra=args)
    a, b = Image.open(new), Image.open(old)
    assert np.array_equal(np.asarray(a), np.asarray(b))
    assert "Quantize: int8" in a.info["parameters"] and "Quantize: int8" in b.info["parameters"]
