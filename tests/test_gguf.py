"""GGUF single files (ComfyUI-GGUF / city96 layout) as a --model: loading, generating, memory (budget
offload included), LoRAs, errors (docs/FAULTS.md 3, 4, 6, 7).

The tiny SD UNet is written as a GGUF file the way ComfyUI-GGUF's convert script writes real ones
(tests/gguf_files.py: LDM keys without `model.diffusion_model.`, 2-D weights block-quantized to Q8_0 or
Q4_0, convolutions in F16, 1-D tensors in F32) and loaded through the normal `--model x.gguf --config
<tiny folder>` route. CPU only, offline.
"""

from __future__ import annotations

import json
import random
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).parent))

torch = pytest.importorskip("torch")
gguf = pytest.importorskip("gguf")

import gguf_files  # noqa: E402
import procmaps  # noqa: E402
from lowvram_gen.cli.main import main  # noqa: E402
from lowvram_gen.engines.sd import apply as apply_mod  # noqa: E402
from lowvram_gen.errors import ModelLoadError  # noqa: E402
from lowvram_gen.hardware.device import probe  # noqa: E402
from lowvram_gen.models.checkpoint import load_single_file  # noqa: E402
from lowvram_gen.models.discover import model_choices  # noqa: E402
from lowvram_gen.models.loading import load  # noqa: E402
from lowvram_gen.models.resolve import resolve  # noqa: E402
from lowvram_gen.settings import MemorySettings  # noqa: E402

SD_REPO = "stable-diffusion-v1-5/stable-diffusion-v1-5"
Q = gguf.GGMLQuantizationType
SMALL = ["--width", "64", "--height", "64", "--steps", "2", "--seed", "5", "--cpu"]

# How far a quantized UNet may be from the fp32 one: the relative L2 error of one noise prediction.
# Q8_0 stores each block of 32 weights as int8 times one scale (absmax / 127): a weight's error is at
# most half a step, ~0.4% of its block's largest weight, and the errors of a layer's weights average
# out, so the output stays within about 1% (measured: ~0.13%). Q4_0 has 16 levels per block, a step of
# absmax / 8: about 16x coarser (measured: ~3%), so 10%. Both also carry the F16 convolution kernels.
REL_TOLERANCE = {"Q8_0": 0.01, "Q4_0": 0.10}


# ---------------------------------------------------------------------------------------- fixtures


@pytest.fixture(scope="module")
def reference(tiny_path):
    return load(resolve("tiny"), "float32").pipe


@pytest.fixture(scope="module")
def files(tmp_path_factory, reference):
    """The tiny UNet as GGUF files: Q8_0, Q4_0, and Q8_0 with its 1-D tensors in F16."""
    root = tmp_path_factory.mktemp("gguf")
    state = gguf_files.unet_state(reference.unet)
    out = {"dir": root}
    for name, qtype, vectors in (("Q8_0", Q.Q8_0, "F32"), ("Q4_0", Q.Q4_0, "F32"), ("Q8_0-f16", Q.Q8_0, "F16")):
        path = root / f"tiny-unet-{name}.gguf"
        out[f"{name}_types"] = gguf_files.write_gguf(path, state, qtype, vectors=vectors)
        out[name] = path
    return out


def _load(path, config) -> object:
    return load(resolve(str(path), str(config)), "float32").pipe


def _image(pipe):
    return pipe("a lighthouse", num_inference_steps=2, width=64, height=64, output_type="np",
                generator=torch.Generator().manual_seed(3)).images[0]


def _unet_output(unet):
    gen = torch.Generator().manual_seed(0)
    latents, text = torch.randn(1, 4, 8, 8, generator=gen), torch.randn(1, 77, 32, generator=gen)
    with torch.no_grad():
        return unet(latents, 10, text).sample


def _quantized(unet) -> dict:
    """name -> GGML type of every weight the UNet holds block-quantized."""
    from diffusers.quantizers.gguf.utils import GGUFParameter

    return {k: p.quant_type.name for k, p in unet.named_parameters() if isinstance(p, GGUFParameter)}


# ------------------------------------------------------------------------------ header and loading


@pytest.mark.skipif(not procmaps.HAS_MAPS, reason="reads Linux's /proc/self/maps")
def test_the_quantized_blocks_stay_in_the_files_pages_not_a_copy(files, tiny_path, reference):
    """Issue 17: diffusers' GGUF reader copied every tensor out of the file's map, so the whole file became
    anonymous memory the kernel cannot drop. The loaded UNet's blocks now point into the file's mapping;
    the model computes as before, and writing to a block never changes the file (copy-on-write)."""
    from diffusers.quantizers.gguf.utils import GGUFParameter

    path = files["Q8_0"]
    on_disk = path.read_bytes()
    unet = _load(path, tiny_path).unet
    ranges = procmaps.mapped_ranges(path)
    assert ranges, "the GGUF file is not mapped"
    blocks = [p for p in unet.parameters() if isinstance(p, GGUFParameter)]
    assert blocks
    inside = [procmaps.inside(p, ranges) for p in blocks]
    assert all(inside), f"{inside.count(False)} of {len(blocks)} quantized tensors were copied"
    assert torch.allclose(_unet_output(unet), _unet_output(reference.unet), atol=0.05, rtol=0)
    with torch.no_grad():
        blocks[0].data.zero_()
    assert path.read_bytes() == on_disk


def test_header_names_types_and_stored_sizes(files):
    from lowvram_gen.models.gguf_file import read_header

    header = read_header(files["Q8_0"])
    written = files["Q8_0_types"]
    assert {k: header.types[k] for k in written} == {k: t.name for k, t in written.items()}
    assert {"Q8_0", "F16", "F32"} == set(header.types.values())
    reader = gguf.GGUFReader(str(files["Q8_0"]))  # independently: what the file stores
    assert header.tensor_bytes == sum(int(t.n_bytes) for t in reader.tensors)
    block, size = gguf.GGML_QUANT_SIZES[Q.Q8_0]
    assert header.quantized_bytes == header.quantized_params // block * size  # 34 bytes per 32 values
    assert header.float_bits == 32 and read_header(files["Q8_0-f16"]).float_bits == 16
    assert header.architecture == "sd1"


def test_the_header_is_read_once_per_file_version(files, tmp_path):
    """Each job's plan asks for the header (profile, architecture, stored sizes): the same file gives the
    same header without reading it again; a file replaced at that path is read anew."""
    from lowvram_gen.models.gguf_file import read_header

    path = tmp_path / "swap.gguf"
    shutil.copy(files["Q8_0"], path)
    first = read_header(path)
    assert read_header(path) is first
    shutil.copy(files["Q4_0"], path)
    again = read_header(path)
    assert again is not first and set(again.types.values()) == {"Q4_0", "F16", "F32"}


@pytest.mark.parametrize("keys,cls_name,arch", [
    (["input_blocks.0.0.weight", "output_blocks.0.0.in_layers.0.weight"], "StableDiffusionPipeline", "sd15"),
    (["model.diffusion_model.input_blocks.0.0.weight", "model.diffusion_model.output_blocks.0.0.in_layers.0.weight"],
     "StableDiffusionPipeline", "sd15"),  # some files keep the prefix
    (["input_blocks.0.0.weight", "output_blocks.0.0.in_layers.0.weight", "label_emb.0.0.weight"],
     "StableDiffusionXLPipeline", "sdxl"),
    (["double_blocks.0.img_attn.norm.key_norm.scale", "single_blocks.0.linear1.weight"], "FluxPipeline", "flux"),
    (["joint_blocks.0.context_block.adaLN_modulation.1.bias", "x_embedder.proj.weight"],
     "StableDiffusion3Pipeline", "sd3"),
])
def test_architecture_from_the_keys(tmp_path, keys, cls_name, arch):
    from lowvram_gen.models.gguf_file import builtin_arch, family_of, read_header

    path = tmp_path / "x.gguf"
    gguf_files.write_gguf(path, {k: torch.ones(4) for k in keys}, Q.Q8_0)
    assert family_of(read_header(path), path).single_file.pipeline == cls_name
    assert builtin_arch(path) == arch


@pytest.mark.parametrize("qtype", ["Q8_0", "Q4_0"])
def test_loads_with_config_keeping_the_weights_quantized(files, tiny_path, reference, qtype):
    pipe = _load(files[qtype], tiny_path)
    assert type(pipe).__name__ == "StableDiffusionPipeline"
    quantized = _quantized(pipe.unet)
    in_file = [k for k, t in files[f"{qtype}_types"].items() if t.name == qtype]
    assert len(quantized) == len(in_file) > 0 and set(quantized.values()) == {qtype}
    assert all(p.dtype == torch.uint8 for k, p in pipe.unet.named_parameters() if k in quantized)
    # everything else is the config folder's own weights
    for name in ("vae", "text_encoder"):
        for key, value in getattr(reference, name).state_dict().items():
            assert torch.equal(getattr(pipe, name).state_dict()[key], value), f"{name}.{key}"


@pytest.mark.parametrize("qtype", ["Q8_0", "Q4_0"])
def test_quantized_unet_is_close_to_the_fp32_one_not_equal(files, tiny_path, reference, qtype):
    pipe = _load(files[qtype], tiny_path)
    want, got = _unet_output(reference.unet), _unet_output(pipe.unet)
    rel = float((got - want).norm() / want.norm())
    assert 0 < rel < REL_TOLERANCE[qtype], rel  # 0 would mean the weights were not quantized at all
    image, ref_image = _image(pipe), _image(reference)
    assert np.isfinite(image).all() and image.shape == ref_image.shape
    # pixels in [0, 1]: the noise prediction's error, through two steps and the VAE, stays as small
    assert 0 < np.abs(image - ref_image).max() < 10 * REL_TOLERANCE[qtype]


def test_q4_is_further_from_fp32_than_q8(files, tiny_path, reference):
    want = _unet_output(reference.unet)
    errors = {q: float((_unet_output(_load(files[q], tiny_path).unet) - want).norm()) for q in ("Q8_0", "Q4_0")}
    assert errors["Q8_0"] < errors["Q4_0"]


# ------------------------------------------------------------------------------- the memory layer


@pytest.mark.parametrize("settings", [
    MemorySettings(dtype="float32", offload="model"),
    MemorySettings(dtype="float32", offload="sequential"),
    MemorySettings(dtype="float32", offload="group"),
], ids=["model-offload", "sequential-offload", "group-offload"])
def test_offload_runs_with_a_gguf_unet_and_gives_the_same_pixels(files, tiny_path, settings):
    """Pixel-equal: on the CPU the hooks move the same uint8 blocks from the CPU to the CPU and every
    layer dequantizes them with the same kernels (budget offload: the tests below)."""
    pipe = _load(files["Q8_0"], tiny_path)
    before = _quantized(pipe.unet)
    reference = _image(pipe)
    applied = apply_mod.apply_settings(pipe, settings, probe("cpu"))
    assert applied.effective.offload == settings.offload
    assert np.array_equal(_image(pipe), reference)
    assert _quantized(pipe.unet) == before  # offload moved them; they are still the file's blocks
    apply_mod.apply_settings(pipe, MemorySettings(dtype="float32"), probe("cpu"))


def test_dtype_changes_keep_the_quantized_blocks_and_skip_fp8(files, tiny_path):
    pipe = _load(files["Q8_0"], tiny_path)
    blocks = {k: p.detach().clone() for k, p in pipe.unet.named_parameters() if k in _quantized(pipe.unet)}
    applied = apply_mod.apply_settings(pipe, MemorySettings(dtype="bfloat16", fp8_storage=True), probe("cpu"))
    assert not applied.effective.fp8_storage
    text = " ".join(applied.skipped)
    assert "fp8 storage" in text and "GGUF" in text
    for key, value in pipe.unet.named_parameters():
        if key in blocks:
            assert value.dtype == torch.uint8 and torch.equal(value.detach(), blocks[key]), key
    assert pipe.unet.conv_in.weight.dtype == torch.bfloat16  # unquantized tensors follow the dtype
    assert pipe.text_encoder.dtype == torch.bfloat16
    assert np.isfinite(_image(pipe)).all()  # dequantized per layer to bfloat16


def test_int8_quantize_leaves_the_gguf_unet_alone(files, tiny_path):
    """quantize = int8 (sdnq) applies to the text encoders; the GGUF UNet keeps the file's blocks."""
    pytest.importorskip("sdnq")
    pipe = _load(files["Q8_0"], tiny_path)
    blocks = {k: p.detach().clone() for k, p in pipe.unet.named_parameters() if k in _quantized(pipe.unet)}
    applied = apply_mod.apply_settings(pipe, MemorySettings(dtype="float32", quantize="int8"), probe("cpu"))
    assert any("quantize int8 of the unet" in s for s in applied.skipped)
    for key, value in pipe.unet.named_parameters():
        if key in blocks:
            assert value.dtype == torch.uint8 and torch.equal(value.detach(), blocks[key]), key
    assert applied.calls.count("quantize:int8") == 1
    from lowvram_gen.models.quantize import kinds

    assert kinds(pipe) == {"text_encoder": "int8"}  # what was quantized (read off the components)
    assert np.isfinite(_image(pipe)).all()
    assert "unet" not in apply_mod.needs_reload(pipe, MemorySettings(dtype="float32"))


def test_reload_only_for_precision_the_file_had(files, tiny_path):
    """F32 1-D tensors in the file: bfloat16 lost bits a reload gives back. All-F16 tensors: the UNet
    never had float32 to restore, so only the other components are reloaded."""
    to_bf16, want = MemorySettings(dtype="bfloat16"), MemorySettings(dtype="float32")
    with_f32 = _load(files["Q8_0"], tiny_path)
    apply_mod.apply_settings(with_f32, to_bf16, probe("cpu"))
    assert "unet" in apply_mod.needs_reload(with_f32, want)
    only_f16 = _load(files["Q8_0-f16"], tiny_path)
    apply_mod.apply_settings(only_f16, to_bf16, probe("cpu"))
    stale = apply_mod.needs_reload(only_f16, want)
    assert "unet" not in stale and {"vae", "text_encoder"} <= set(stale)


def test_runner_reloads_a_gguf_unet_from_its_file(files, tiny_path, monkeypatch):
    """The UNet from the GGUF file, the rest from the config folder, each on its own: no second pipeline."""
    from lowvram_gen.engines.sd.stepdown import Runner
    from lowvram_gen.models import gguf_file

    model = load(resolve(str(files["Q8_0"]), str(tiny_path)), "float32")
    runner = Runner(model, probe("cpu"))
    monkeypatch.setattr(gguf_file, "load_pipeline", lambda *a, **k: pytest.fail("a whole pipeline was built"))
    runner.use(MemorySettings(dtype="bfloat16"))
    runner.use(MemorySettings(dtype="float32"))
    assert model.pipe.unet.conv_in.weight.dtype == torch.float32
    assert set(_quantized(model.pipe.unet).values()) == {"Q8_0"}
    assert np.isfinite(_image(model.pipe)).all()


# ----------------------------------------------------------------------------- budget offload


def _budget(resident_bytes: int) -> MemorySettings:
    return MemorySettings(dtype="float32", offload="budget", resident_bytes=resident_bytes)


def _image_steps(pipe, steps: int):
    return pipe("a lighthouse", num_inference_steps=steps, width=64, height=64, output_type="np",
                generator=torch.Generator().manual_seed(3)).images[0]


def test_blocks_of_a_gguf_unet_count_the_stored_bytes(files, tiny_path, reference):
    """The planner's and apply's unit of streaming, measured on the GGUF UNet: each block's bytes are
    its quantized weights as the file stores them (34 bytes per 32 values for Q8_0, 18 for Q4_0) plus
    its other tensors at float32, which is what group offloading moves."""
    from diffusers.quantizers.gguf.utils import GGUFParameter

    from lowvram_gen.models.blocks import blocks_of, fixed_bytes, module_bytes

    for qtype in ("Q8_0", "Q4_0"):
        unet = _load(files[qtype], tiny_path).unet
        block, size = gguf.GGML_QUANT_SIZES[getattr(Q, qtype)]
        blocks = blocks_of(unet)
        assert [n for n, _ in blocks] == [n for n, _ in blocks_of(reference.unet)]
        quantized_blocks = 0
        for name, nbytes in blocks:
            expect = 0
            for pname, ref_param in reference.unet.get_submodule(name).named_parameters():
                param = unet.get_submodule(name).get_parameter(pname)
                if isinstance(param, GGUFParameter):  # the reference's value count, as blocks of the file's type
                    expect += ref_param.numel() // block * size
                else:
                    expect += ref_param.numel() * 4
            quantized_blocks += nbytes < module_bytes(reference.unet.get_submodule(name))
            assert nbytes == expect, name
        assert quantized_blocks > len(blocks) // 2  # most blocks hold quantized weights
        assert sum(b for _, b in blocks) + fixed_bytes(unet) == module_bytes(unet)


def test_budget_offload_of_a_gguf_unet_gives_the_same_pixels_and_moves_the_split_bytes(files, tiny_path):
    """offload = "budget" on the GGUF UNet, some blocks resident and some streamed: pixel-equal to no
    offload (on the CPU the hooks move the same uint8 blocks from the CPU to the CPU, and each layer
    dequantizes them with the same kernels), and what the hooks onload during each UNet forward is
    exactly the split's `streamed_bytes_per_step`, at the blocks' stored (quantized) size."""
    from lowvram_gen.engines.sd.traffic import count_onloads
    from lowvram_gen.models.blocks import blocks_of
    from lowvram_gen.planning.residency import split

    pipe = _load(files["Q8_0"], tiny_path)
    before = _quantized(pipe.unet)
    reference = _image_steps(pipe, 3)
    blocks = blocks_of(pipe.unet)
    total = sum(b for _, b in blocks)
    for resident in (total // 2, total // 5):
        with count_onloads() as meter:
            meter.watch(pipe.unet)
            applied = apply_mod.apply_settings(pipe, _budget(resident), probe("cpu"))
            image = _image_steps(pipe, 3)
        expected = split(blocks, resident)
        assert applied.residency == expected and expected.resident and expected.streamed
        streamed_quantized = [k for k in before if k.startswith(tuple(n + "." for n in expected.streamed))]
        assert streamed_quantized  # GGUF blocks are among the streamed ones
        assert len(meter.forwards) >= 3 and meter.forwards == [expected.streamed_bytes_per_step] * len(meter.forwards)
        assert np.array_equal(image, reference)
        assert _quantized(pipe.unet) == before
    apply_mod.apply_settings(pipe, MemorySettings(dtype="float32"), probe("cpu"))
    assert np.array_equal(_image_steps(pipe, 3), reference)


@pytest.mark.parametrize("qtype", ["Q8_0", "Q4_0"])
def test_the_plans_streamed_bytes_for_a_gguf_unet_are_within_10_percent_of_what_runs(files, tiny_path, qtype):
    """The planner sees a GGUF UNet only through its header: the stored bytes of the whole denoiser, spread
    over its blocks at one storage ratio (1-D tensors in F32 and 2-D ones quantized are not told apart per
    block). What apply runs is the split of the real blocks; the plan's bytes a step stay within 10 % of it
    (the dequantize scratch of the largest layer is counted once, not spread over the blocks)."""
    from lowvram_gen.models.profile import source_profile
    from lowvram_gen.planning.estimate import estimate
    from lowvram_gen.models.blocks import blocks_of

    source = resolve(str(files[qtype]), str(tiny_path))
    profile = source_profile(source)
    pipe = load(source, "float32").pipe
    total = sum(b for _, b in blocks_of(pipe.unet))
    for resident in (total // 2, total // 4):
        settings = _budget(resident)
        planned = estimate(profile, 64, 64, 1, settings).streamed_bytes_per_step
        ran = apply_mod.apply_settings(pipe, settings, probe("cpu")).residency.streamed_bytes_per_step
        assert ran > 0 and abs(planned - ran) <= 0.1 * ran, (resident, planned, ran)


def test_resident_to_moves_the_gguf_blocks_of_the_resident_part(files, tiny_path):
    """The runner's move of the resident part around the VAE decode, onto "meta" where it shows: the
    resident GGUF weights go (still GGUFParameter, same type), the streamed blocks stay on the host."""
    from lowvram_gen.models.blocks import blocks_of

    pipe = _load(files["Q8_0"], tiny_path)
    before = _quantized(pipe.unet)
    applied = apply_mod.apply_settings(pipe, _budget(sum(b for _, b in blocks_of(pipe.unet)) // 2), probe("cpu"))
    streamed = applied.residency.streamed
    apply_mod.PipelineOps(pipe).resident_to("meta", streamed)
    inside = {f"{n}.{p}" for n in streamed for p, _ in pipe.unet.get_submodule(n).named_parameters()}
    devices = {name: param.device.type for name, param in pipe.unet.named_parameters()}
    assert {devices[n] for n in inside} == {"cpu"}
    assert {d for n, d in devices.items() if n not in inside} == {"meta"}
    moved = [k for k in before if k not in inside]
    assert moved and {devices[k] for k in moved} == {"meta"}
    assert _quantized(pipe.unet) == before  # moved as GGUFParameter, with their quant type


# ------------------------------------------------------------------------------------------- LoRA


@pytest.fixture()
def unet_lora(tmp_path, monkeypatch, reference):
    """A kohya LoRA on the UNet's attention layers only: whatever it changes, it changes in the UNet."""
    from lora_files import kohya_state, save

    root = tmp_path / "models"
    monkeypatch.setenv("LOWVRAM_GEN_MODELS", str(root))
    return save(kohya_state(reference, seed=0, text=False), root / "Lora" / "tiny_unet.safetensors")


def _blocks(unet) -> dict:
    from diffusers.quantizers.gguf.utils import GGUFParameter

    return {k.replace(".base_layer", ""): p.detach().clone() for k, p in unet.named_parameters()
            if isinstance(p, GGUFParameter)}  # under peft's name for a wrapped layer's own weight too


def test_lora_on_a_gguf_unet_acts_as_on_the_fp32_one_and_weight_0_is_the_plain_image(files, tiny_path, reference,
                                                                                    unet_lora):
    """diffusers 0.42 + peft wrap the GGUF layers (GGUFLinear) like any Linear: the base layer
    dequantizes its blocks, the adapter adds its own product. The LoRA moves the GGUF image as far as
    it moves the fp32 one (the two with the LoRA differ by the quantization error only), the file's
    blocks are untouched, and weight 0 or no LoRA gives back the plain GGUF image exactly."""
    from diffusers.quantizers.gguf.utils import GGUFLinear

    from lowvram_gen.networks import lora as lora_mod
    from lowvram_gen.networks.tags import LoraRef

    pipe = _load(files["Q8_0"], tiny_path)
    blocks = _blocks(pipe.unet)
    plain = _image(pipe)
    assert lora_mod.activate_loras(pipe, [LoraRef("tiny_unet", 1.0)]) == []
    name = lora_mod.adapter_name(unet_lora)
    assert set(lora_mod.injected(pipe, name)) == {"unet"}
    wrapped = [m for m in pipe.unet.modules() if hasattr(m, "base_layer") and name in getattr(m, "lora_A", {})]
    assert wrapped and any(isinstance(m.base_layer, GGUFLinear) for m in wrapped)
    with_lora = _image(pipe)

    fp32 = load(resolve("tiny"), "float32").pipe
    lora_mod.activate_loras(fp32, [LoraRef("tiny_unet", 1.0)])
    fp32_lora = _image(fp32)
    bound = 10 * REL_TOLERANCE["Q8_0"]  # the quantization error's bound on pixels (as for the plain UNet)
    assert np.abs(with_lora - plain).max() > bound  # the LoRA acted, by more than quantization moves pixels
    assert np.abs(with_lora - fp32_lora).max() < bound  # ... and acted as on the fp32 UNet
    got = _blocks(pipe.unet)
    assert got.keys() == blocks.keys() and all(torch.equal(got[k], v) for k, v in blocks.items())

    lora_mod.activate_loras(pipe, [LoraRef("tiny_unet", 0.0)])
    assert np.array_equal(_image(pipe), plain)
    lora_mod.activate_loras(pipe, [])
    assert np.array_equal(_image(pipe), plain)
    lora_mod.activate_loras(pipe, [LoraRef("tiny_unet", 1.0)])  # switched on again: nothing reloaded
    assert np.array_equal(_image(pipe), with_lora)


@pytest.mark.parametrize("settings", [
    MemorySettings(dtype="float32", offload="model"),
    MemorySettings(dtype="float32", offload="budget", resident_bytes=200_000),
], ids=["model-offload", "budget-offload"])
def test_lora_on_a_gguf_unet_under_offload_gives_the_unhooked_image(files, tiny_path, unet_lora, settings):
    """The engine's path: the LoRA is loaded with the preset's hooks lifted and the preset re-applied."""
    from lowvram_gen.networks import lora as lora_mod
    from lowvram_gen.networks.tags import LoraRef

    unhooked = _load(files["Q8_0"], tiny_path)
    lora_mod.activate_loras(unhooked, [LoraRef("tiny_unet", 1.0)])
    want = _image(unhooked)
    pipe = _load(files["Q8_0"], tiny_path)
    applied = apply_mod.apply_settings(pipe, settings, probe("cpu"))
    if settings.offload == "budget":
        assert applied.residency.streamed and applied.residency.resident
    plain = _image(pipe)
    lora_mod.activate_loras(pipe, [LoraRef("tiny_unet", 1.0)],
                            reapply_memory=lambda: apply_mod.apply_settings(pipe, settings, probe("cpu")))
    assert np.array_equal(_image(pipe), want)
    lora_mod.activate_loras(pipe, [LoraRef("tiny_unet", 0.0)])
    assert np.array_equal(_image(pipe), plain)


def test_cli_lora_with_a_gguf(files, tiny_path, unet_lora, tmp_path, capsys):
    def run(prompt, out):
        code = main(["generate", prompt, "--model", str(files["Q8_0"]), "--config", str(tiny_path), *SMALL,
                     "--outdir", str(tmp_path / out), "--json"])
        captured = capsys.readouterr()
        assert code == 0, captured.err
        return np.asarray(__import__("PIL.Image").Image.open(json.loads(captured.out)["images"][0]).convert("RGB"))

    assert not np.array_equal(run("a fox <lora:tiny_unet:1>", "a"), run("a fox", "b"))


# ----------------------------------------------------------------------------------- the estimate


def test_estimate_counts_the_stored_bytes(files, tiny_path):
    from dataclasses import replace

    from lowvram_gen.models.profile import source_profile
    from lowvram_gen.planning.estimate import estimate

    reader = gguf.GGUFReader(str(files["Q8_0"]))
    quantized = [t for t in reader.tensors if t.tensor_type == Q.Q8_0]
    profile = source_profile(resolve(str(files["Q8_0"]), str(tiny_path)))
    assert profile.denoiser_quantized_bytes == sum(int(t.n_bytes) for t in quantized)
    assert profile.denoiser_quantized == sum(int(t.n_elements) for t in quantized)
    settings = MemorySettings(dtype="float32")
    plain = replace(profile, denoiser_quantized=0, denoiser_quantized_bytes=0)
    saved = estimate(plain, 64, 64, 1, settings).weights_bytes - estimate(profile, 64, 64, 1, settings).weights_bytes
    # fp32 (4 bytes a value) down to what the file stores, less the one layer dequantized at a time
    largest = profile.largest_layer["unet"] * 4
    assert saved == profile.denoiser_quantized * 4 - profile.denoiser_quantized_bytes - largest > 0


def test_plan_cli_takes_a_gguf_with_and_without_config(files, tiny_path, capsys):
    def weights(argv):
        assert main(["plan", *argv, "--width", "64", "--height", "64", "--vram", "4GB", "--json"]) == 0
        out = json.loads(capsys.readouterr().out)
        return {e["name"]: e for e in out["presets"]}

    folder = weights(["--model", str(tiny_path)])
    gguf_plan = weights(["--model", str(files["Q8_0"]), "--config", str(tiny_path)])
    assert gguf_plan["highvram"]["estimate_bytes"] < folder["highvram"]["estimate_bytes"]
    weights(["--model", str(files["Q8_0"])])  # no --config: the architecture from the file's keys (SD 1.x)


# -------------------------------------------------------------------------- CLI, batch, UI picker


def test_cli_generate_with_a_gguf(files, tiny_path, tmp_path, capsys):
    code = main(["generate", "a lighthouse", "--model", str(files["Q8_0"]), "--config", str(tiny_path),
                 *SMALL, "--outdir", str(tmp_path), "--json"])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    result = json.loads(captured.out)
    assert result["model_path"] == str(files["Q8_0"]) and len(result["images"]) == 1
    assert Path(result["images"][0]).is_file()


def test_batch_script_with_a_gguf(files, tiny_path, tmp_path, capsys, batch_script):
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("a red fox\na castle\n")
    code = batch_script.run([str(prompts), "--model", str(files["Q4_0"]), "--config", str(tiny_path), *SMALL,
                       "--outdir", str(tmp_path / "out"), "--json"])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    summary = json.loads(captured.out)
    assert (summary["done"], summary["failed"]) == (2, 0)
    assert len(list((tmp_path / "out").rglob("*.png"))) == 2


def test_model_picker_lists_gguf_files_and_the_choice_generates(files, tiny_path, tmp_path):
    from lowvram_gen.request import GenerationRequest
    from lowvram_gen.session import Session

    models = tmp_path / "models"
    models.mkdir()
    shutil.copy(files["Q8_0"], models / "tiny-unet-Q8_0.gguf")
    (models / "notes.txt").write_text("not a model")
    choices = model_choices(models)
    picked = [c for c in choices if c.endswith(".gguf")]
    assert picked == [str(models / "tiny-unet-Q8_0.gguf")] and not any(c.endswith(".txt") for c in choices)
    result = Session(device="cpu", outdir=str(tmp_path / "out")).generate(GenerationRequest(
        prompt="a fox", model=picked[0], config=str(tiny_path), width=64, height=64, steps=2, seed=1))
    assert len(result.images) == 1 and Path(result.images[0]).is_file()


# ------------------------------------------------------------------------- the base model's folder


def _cache_with(tmp_path, tiny_path, monkeypatch, weights: bool) -> None:
    """An HF cache holding the tiny pipeline as SD 1.5's hub repo (with or without its weights)."""
    import huggingface_hub.constants as hf_constants

    cache = tmp_path / "hub"
    snapshot = cache / f"models--{SD_REPO.replace('/', '--')}" / "snapshots" / ("0" * 40)
    shutil.copytree(tiny_path, snapshot, ignore=None if weights else shutil.ignore_patterns("*.safetensors"))
    (snapshot.parents[1] / "refs").mkdir()
    (snapshot.parents[1] / "refs" / "main").write_text("0" * 40)
    monkeypatch.setattr(hf_constants, "HF_HUB_CACHE", str(cache))


def test_no_config_takes_the_base_model_from_the_cache(files, tiny_path, tmp_path, monkeypatch):
    _cache_with(tmp_path, tiny_path, monkeypatch, weights=True)
    pipe = load_single_file(files["Q8_0"], config=None, torch_dtype=torch.float32)
    assert set(_quantized(pipe.unet).values()) == {"Q8_0"}


def test_no_config_and_no_base_model_says_which_flag_to_pass(files, tmp_path, monkeypatch, capsys):
    import huggingface_hub.constants as hf_constants

    monkeypatch.setattr(hf_constants, "HF_HUB_CACHE", str(tmp_path / "empty-hub"))
    assert main(["generate", "a fox", "--model", str(files["Q8_0"]), *SMALL]) == 2
    err = capsys.readouterr().err
    assert "--config" in err and SD_REPO in err and f"hf download {SD_REPO}" in err
    assert "Traceback" not in err


def test_config_with_only_configs_names_what_is_missing(files, tiny_path, tmp_path, monkeypatch):
    """A configs-only download (enough for a full .safetensors) lacks the VAE and text encoder weights."""
    _cache_with(tmp_path, tiny_path, monkeypatch, weights=False)
    with pytest.raises(ModelLoadError) as err:
        load_single_file(files["Q8_0"], config=None, torch_dtype=torch.float32)
    assert files["Q8_0"].name in str(err.value)


# ------------------------------------------------------------------------------------- bad files


def _bad_file(tmp_path, files, kind: str) -> Path:
    path = tmp_path / f"{kind}.gguf"
    data = files["Q8_0"].read_bytes()
    if kind == "random":  # seeded random bytes with a .gguf name
        path.write_bytes(random.Random(7).randbytes(4096))
    elif kind == "half":  # a download cut in half
        path.write_bytes(data[: len(data) // 2])
    elif kind == "header-cut":  # cut inside the header
        path.write_bytes(data[:200])
    else:
        path.write_bytes(b"")
    return path


@pytest.mark.parametrize("kind,words", [("random", "not a GGUF file"), ("half", "truncated"),
                                        ("header-cut", "truncated"), ("empty", "empty")])
def test_corrupt_or_truncated_gguf_exits_2_with_a_sentence(files, tiny_path, tmp_path, capsys, kind, words):
    path = _bad_file(tmp_path, files, kind)
    with pytest.raises(ModelLoadError, match=words):
        load_single_file(path, config=str(tiny_path), torch_dtype=torch.float32)
    assert main(["generate", "a fox", "--model", str(path), "--config", str(tiny_path), *SMALL]) == 2
    err = capsys.readouterr().err
    assert path.name in err and words in err and "Traceback" not in err
    assert main(["plan", "--model", str(path), "--config", str(tiny_path)]) == 2


# ------------------------------------------------------------------ NaN/Inf inside quantized blocks


NAN_F16, INF_F16, NEG_INF_F16 = 0x7E00, 0x7C00, 0xFC00  # float16 bit patterns


@pytest.mark.parametrize("kind", ["Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K",
                                  "IQ4_NL", "IQ4_XS"])
def test_the_scale_fields_are_where_gguf_reads_them(kind):
    """The float16 fields of each block type, checked against gguf's own (numpy) dequantizer: random
    blocks with those fields finite decode to finite values whatever the other bytes hold, and a NaN/Inf
    in any one of them makes exactly that block decode to NaN/Inf; the check counts exactly those."""
    from lowvram_gen.models.gguf_file import F16_FIELDS, non_finite_blocks

    assert set(F16_FIELDS) == {t.name for t in _diffusers_block_types()}  # every type diffusers loads
    qtype = getattr(Q, kind)
    block, size = gguf.GGML_QUANT_SIZES[qtype]
    rng = np.random.default_rng(0)
    data = rng.integers(0, 256, (48, size), dtype=np.uint8)
    for offset in F16_FIELDS[kind]:
        scales = rng.uniform(-2, 2, 48).astype(np.float16)
        data[:, offset:offset + 2] = scales.view(np.uint8).reshape(48, 2)
    assert np.isfinite(gguf.quants.dequantize(data.reshape(-1), qtype)).all()
    assert non_finite_blocks(torch.from_numpy(data), kind) == 0
    broken = set()
    for i, offset in enumerate(F16_FIELDS[kind]):
        for j, bits in enumerate((NAN_F16, INF_F16, NEG_INF_F16)):
            b = 10 * i + 3 * j + 1
            data[b, offset:offset + 2] = np.array([bits], dtype="<u2").view(np.uint8)
            broken.add(b)
    with np.errstate(invalid="ignore"):  # NaN/Inf times the quants: what is tested
        values = gguf.quants.dequantize(data.reshape(-1), qtype).reshape(48, block)
    assert {int(b) for b in np.nonzero(~np.isfinite(values).all(axis=1))[0]} == broken
    assert non_finite_blocks(torch.from_numpy(data), kind) == len(broken)


def _diffusers_block_types():
    from diffusers.quantizers.gguf.utils import SUPPORTED_GGUF_QUANT_TYPES

    return [t for t in SUPPORTED_GGUF_QUANT_TYPES if t != Q.BF16]


def test_bf16_values_that_are_nan_or_inf_are_counted():
    from lowvram_gen.models.gguf_file import non_finite_blocks

    values = torch.linspace(-3, 3, 64).to(torch.bfloat16)
    values[[5, 9]] = torch.tensor([float("nan"), float("-inf")], dtype=torch.bfloat16)
    assert non_finite_blocks(values.view(torch.uint8).reshape(4, 32), "BF16") == 2
    assert non_finite_blocks(torch.ones(4, 16, dtype=torch.bfloat16).view(torch.uint8), "BF16") == 0


def _break_scale(source: Path, target: Path, qtype: str, bits: int) -> str:
    """A copy of `source` with the float16 scale of one block of one `qtype` tensor set to `bits`."""
    shutil.copy(source, target)
    tensor = next(t for t in gguf.GGUFReader(str(source)).tensors if t.tensor_type.name == qtype)
    _, size = gguf.GGML_QUANT_SIZES[tensor.tensor_type]
    with open(target, "r+b") as f:
        f.seek(tensor.data_offset + 3 * size)  # the fourth block; its scale is its first two bytes
        f.write(int(bits).to_bytes(2, "little"))
    return str(tensor.name)


@pytest.mark.parametrize("qtype,bits", [("Q8_0", NAN_F16), ("Q4_0", INF_F16)], ids=["Q8_0-nan", "Q4_0-inf"])
def test_a_gguf_with_a_nan_block_scale_is_refused_naming_file_and_tensor(files, tiny_path, tmp_path, capsys,
                                                                         qtype, bits):
    path = tmp_path / f"broken-{qtype}.gguf"
    tensor = _break_scale(files[qtype], path, qtype, bits)
    with pytest.raises(ModelLoadError) as err:
        load_single_file(path, config=str(tiny_path), torch_dtype=torch.float32)
    assert path.name in str(err.value) and repr(tensor) in str(err.value) and "1 block(s)" in str(err.value)
    assert main(["generate", "a fox", "--model", str(path), "--config", str(tiny_path), *SMALL]) == 2
    err = capsys.readouterr().err
    assert path.name in err and tensor in err and "NaN/Inf" in err and "Traceback" not in err
    load_single_file(files[qtype], config=str(tiny_path), torch_dtype=torch.float32)  # the intact file loads


def _other_gguf(tmp_path, reference, what: str) -> Path:
    import ldm_layout

    path = tmp_path / f"{what}.gguf"
    if what == "text-encoder":  # a CLIP text encoder in its transformers layout
        state = {k: v for k, v in reference.text_encoder.state_dict().items() if "position_ids" not in k}
        gguf_files.write_gguf(path, state, Q.Q8_0, arch="clip")
    elif what == "vae":  # the VAE in its LDM layout, as a VAE-only file has it
        state = {k.removeprefix(ldm_layout.VAE): v for k, v in ldm_layout.vae_to_ldm(reference.vae).items()}
        gguf_files.write_gguf(path, state, Q.Q8_0, arch="vae")
    else:  # an architecture nobody could detect
        gguf_files.write_gguf(path, {"foo.weight": torch.ones(64, 64), "bar.bias": torch.ones(64)}, Q.Q8_0,
                              arch="mystery")
    return path


@pytest.mark.parametrize("what,words", [("text-encoder", "text encoder"), ("vae", "VAE"),
                                        ("unknown", "foo.weight")])
def test_a_gguf_that_is_not_a_denoiser_is_refused(tmp_path, reference, tiny_path, capsys, what, words):
    path = _other_gguf(tmp_path, reference, what)
    assert main(["generate", "a fox", "--model", str(path), "--config", str(tiny_path), *SMALL]) == 2
    err = capsys.readouterr().err
    assert path.name in err and words in err and "not a UNet or transformer" in err
    assert "input_blocks" in err and "--config" in err  # what it takes instead
