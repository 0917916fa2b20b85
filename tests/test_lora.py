"""LoRA: tags, files, hashes, and that weights act (0 = the base image exactly) under every preset."""

from __future__ import annotations

import hashlib

import numpy as np
import pytest
import torch

from lowvram_gen.engines.sd import apply as apply_mod
from lowvram_gen.hardware.device import probe
from lowvram_gen.errors import InvalidRequest, ModelLoadError, UnsafeCheckpoint
from lowvram_gen.models.loading import load, reload_components
from lowvram_gen.models.resolve import resolve
from lowvram_gen.networks import lora as lora_mod
from lowvram_gen.networks.hooks import has_offload_hooks
from lowvram_gen.networks.metadata import network_fields
from lowvram_gen.networks.tags import LoraRef, extract_lora_tags, parse_lora_flag
from lowvram_gen.presets import load_presets
from lowvram_gen.settings import MemorySettings

from lora_files import kohya_state, peft_state, save

CPU = probe("cpu")


@pytest.fixture()
def lora_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("LOWVRAM_GEN_MODELS", str(tmp_path / "models"))
    return tmp_path / "models" / "Lora"


@pytest.fixture(scope="module")
def shapes(tiny_path):
    """A pipeline only to read module shapes from when building files (never run)."""
    return load(resolve("tiny"), "float32").pipe


@pytest.fixture()
def files(lora_dir, shapes):
    return {
        "kohya": save(kohya_state(shapes, seed=0), lora_dir / "tiny_kohya.safetensors"),
        "peft": save(peft_state(shapes, seed=1), lora_dir / "sub" / "tiny_peft.safetensors"),
    }


@pytest.fixture()
def pipe(tiny_path):
    return load(resolve("tiny"), "float32").pipe


def image(pipe, prompt="a cat"):
    out = pipe(prompt, num_inference_steps=2, width=64, height=64, generator=torch.Generator().manual_seed(3),
               output_type="np")
    return out.images[0]


def base_checksum(pipe) -> float:
    """Sum over the UNet's own weights (not the LoRA layers), in float64."""
    total = 0.0
    for name, p in pipe.unet.named_parameters():
        if "lora_" not in name:
            total += p.detach().double().sum().item() * (1 + len(name.replace(".base_layer", "")) % 7)
    return total


# ----------------------------------------------------------------------------------------- tags

@pytest.mark.parametrize("prompt,clean,refs,warns", [
    ("a cat <lora:x:0.8>", "a cat", [LoraRef("x", 0.8)], 0),
    ("<lora:x>a cat", "a cat", [LoraRef("x", 1.0)], 0),
    ("a <lora:my lora-v2.1:-0.5>, sky", "a, sky", [LoraRef("my lora-v2.1", -0.5)], 0),
    ("a <lora:x:1><lora:y:.3> b", "a b", [LoraRef("x", 1.0), LoraRef("y", 0.3)], 0),
    ("a <LORA:x:2>", "a", [LoraRef("x", 2.0)], 0),
    ("a <lora:x:0.7:0.2>", "a", [LoraRef("x", 0.7)], 1),  # second positional (A1111: unet weight)
    ("a <lora:x:te=0.5>", "a", [LoraRef("x", 1.0)], 1),
    ("a <lora:x:0.6:dyn=8>", "a", [LoraRef("x", 0.6)], 1),
    ("a <lyco:x:0.4>", "a", [LoraRef("x", 0.4)], 1),
    ("a <hypernet:h:1>", "a", [], 1),
    ("no tags <here>", "no tags <here>", [], 0),
])
def test_extract_lora_tags(prompt, clean, refs, warns):
    text, got, warnings = extract_lora_tags(prompt)
    assert (text, got, len(warnings)) == (clean, refs, warns)


@pytest.mark.parametrize("bad", ["<lora:x:abc>", "<lora:x:1,5>", "<lora:x:nan>", "<lora::1>"])
def test_malformed_tags_name_the_value(bad):
    with pytest.raises(InvalidRequest) as err:
        extract_lora_tags("a " + bad)
    assert bad.split(":")[-1].rstrip(">") in str(err.value) or "<lora::1>" in str(err.value)


@pytest.mark.parametrize("flag,ref", [
    ("x", LoraRef("x")), ("x:0.8", LoraRef("x", 0.8)), ("dir/x.safetensors:0.5", LoraRef("dir/x.safetensors", 0.5)),
    ("C:\\loras\\x.safetensors", LoraRef("C:\\loras\\x.safetensors")),
])
def test_parse_lora_flag(flag, ref):
    assert parse_lora_flag(flag) == ref


@pytest.mark.parametrize("flag", ["x:heavy", "", ":1"])
def test_parse_lora_flag_refuses_garbage(flag):
    with pytest.raises(InvalidRequest):
        parse_lora_flag(flag)


# ---------------------------------------------------------------------------------------- files

def test_find_by_stem_suffix_path_and_unknown_lists_what_exists(files, lora_dir):
    assert lora_mod.find_lora("tiny_kohya") == files["kohya"]
    assert lora_mod.find_lora("TINY_KOHYA") == files["kohya"]
    assert lora_mod.find_lora("tiny_peft.safetensors") == files["peft"]  # found in a sub-folder
    assert lora_mod.find_lora(str(files["peft"])) == files["peft"]
    assert set(lora_mod.available_loras()) == {"tiny_kohya", "tiny_peft"}
    with pytest.raises(InvalidRequest) as err:
        lora_mod.find_lora("tiny_nope")
    text = str(err.value)
    assert "tiny_nope" in text and "tiny_kohya" in text and "tiny_peft" in text and str(lora_dir) in text


def test_lora_hash_is_a1111_addnet_shorthash_and_fields_format(files, lora_dir, shapes):
    raw = files["kohya"].read_bytes()
    n = int.from_bytes(raw[:8], "little")
    expected = hashlib.sha256(raw[8 + n:]).hexdigest()[:12]  # computed here, independently
    assert lora_mod.lora_hash(files["kohya"]) == expected
    whole = hashlib.sha256(files["peft"].read_bytes()).hexdigest()
    assert lora_mod.lora_hash(files["peft"]) != whole[:12]  # header bytes are not part of it
    # kohya's trainer stores the same hash in the metadata; A1111 takes it from there
    tagged = save(kohya_state(shapes, seed=5), lora_dir / "tagged.safetensors", {"sshs_model_hash": "ab" * 32})
    assert lora_mod.lora_hash(tagged) == "ababababababab"[:12]
    pt = save(kohya_state(shapes, seed=6), lora_dir / "old.pt")
    assert lora_mod.lora_hash(pt) == hashlib.sha256(pt.read_bytes()).hexdigest()[:12]
    fields = network_fields([LoraRef("tiny_kohya", 0.8), LoraRef("tiny_peft.safetensors", 1)])
    assert fields == {"Lora hashes": f"tiny_kohya: {expected}, tiny_peft.safetensors: {lora_mod.lora_hash(files['peft'])}"}
    from lowvram_gen.outputs import a1111_parameters, parse_a1111_parameters

    text = a1111_parameters("p", "", {"Steps": 2, "Sampler": "Euler", **fields})
    assert f'Lora hashes: "tiny_kohya: {expected}, ' in text  # quoted as A1111 writes it
    assert parse_a1111_parameters(text)["Lora hashes"] == fields["Lora hashes"]


def test_unsafe_pickle_lora_is_refused(lora_dir, pipe):
    import os

    class Evil:
        def __reduce__(self):
            return (os.system, ("echo pwned",))

    lora_dir.mkdir(parents=True, exist_ok=True)
    torch.save({"lora_unet_x.lora_down.weight": torch.zeros(1), "evil": Evil()}, lora_dir / "evil.pt")
    with pytest.raises(UnsafeCheckpoint):
        lora_mod.activate_loras(pipe, [LoraRef("evil")])


# ---------------------------------------------------------------------------------- on the model

@pytest.mark.parametrize("layout", ["kohya", "peft"])
def test_weight_zero_is_the_base_image_and_weight_scales(layout, files, pipe):
    base = image(pipe)
    unet = pipe.unet
    checksum = base_checksum(pipe)
    out = {}
    for w in (0.0, 0.5, 1.0):
        assert lora_mod.activate_loras(pipe, [LoraRef(f"tiny_{layout}", w)]) == []
        out[w] = image(pipe)
    assert np.array_equal(out[0.0], base)
    d_half, d_one = np.abs(out[0.5] - base).mean(), np.abs(out[1.0] - base).mean()
    assert 0 < d_half < d_one
    # text encoder and UNet both took the LoRA
    assert set(lora_mod.injected(pipe, lora_mod.adapter_name(files[layout]))) == {"unet", "text_encoder"}
    lora_mod.activate_loras(pipe, [])  # the next job asks for none: switched off, not reloaded
    assert np.array_equal(image(pipe), base)
    assert pipe.unet is unet and base_checksum(pipe) == checksum
    lora_mod.activate_loras(pipe, [LoraRef(f"tiny_{layout}", 1.0)])  # and back on, nothing loaded again
    assert np.array_equal(image(pipe), out[1.0])


def test_two_loras_at_once_and_switching_between_them(files, pipe):
    base = image(pipe)
    lora_mod.activate_loras(pipe, [LoraRef("tiny_kohya", 1.0)])
    only_k = image(pipe)
    lora_mod.activate_loras(pipe, [LoraRef("tiny_peft", 1.0)])
    only_p = image(pipe)
    lora_mod.activate_loras(pipe, [LoraRef("tiny_kohya", 1.0), LoraRef("tiny_peft", 1.0)])
    both = image(pipe)
    assert not np.array_equal(both, only_k) and not np.array_equal(both, only_p)
    lora_mod.activate_loras(pipe, [LoraRef("tiny_kohya", 1.0), LoraRef("tiny_peft", 0.0)])
    assert np.array_equal(image(pipe), only_k)
    lora_mod.activate_loras(pipe, [])
    assert np.array_equal(image(pipe), base)


def test_same_name_twice_adds_weights_with_a_warning(files, pipe):
    lora_mod.activate_loras(pipe, [LoraRef("tiny_kohya", 1.0)])
    one = image(pipe)
    warnings = lora_mod.activate_loras(pipe, [LoraRef("tiny_kohya", 0.5), LoraRef("tiny_kohya", 0.5)])
    assert len(warnings) == 1 and "more than once" in warnings[0]
    assert np.allclose(image(pipe), one, atol=1e-6)


def test_lora_for_another_architecture_is_a_clear_error(lora_dir, pipe, tiny_sdxl_path):
    xl = load(resolve("tiny-sdxl"), "float32").pipe
    path = save(peft_state(xl), lora_dir / "for_sdxl.safetensors")
    base = image(pipe)
    with pytest.raises(ModelLoadError) as err:
        lora_mod.activate_loras(pipe, [LoraRef("for_sdxl")])
    assert str(path) in str(err.value)
    assert not any(pipe.get_list_adapters().values())  # nothing half-loaded stays behind
    assert np.array_equal(image(pipe), base)


def test_partly_matching_lora_warns(lora_dir, shapes, pipe):
    state = kohya_state(shapes, text=False)
    state["lora_unet_no_such_block_proj.lora_down.weight"] = torch.zeros(4, 64)
    state["lora_unet_no_such_block_proj.lora_up.weight"] = torch.zeros(64, 4)
    save(state, lora_dir / "partial.safetensors")
    warnings = lora_mod.activate_loras(pipe, [LoraRef("partial")])
    assert len(warnings) == 1 and "1 of its" in warnings[0] and "match nothing" in warnings[0]


def test_pickle_lora_loads_like_its_safetensors_twin(lora_dir, shapes, pipe):
    state = kohya_state(shapes, seed=4)
    save(state, lora_dir / "twin.safetensors")
    save(state, lora_dir / "twin_pt.pt")
    lora_mod.activate_loras(pipe, [LoraRef("twin")])
    a = image(pipe)
    lora_mod.activate_loras(pipe, [LoraRef("twin_pt")])
    assert np.array_equal(image(pipe), a)


def test_component_reloaded_from_disk_gets_its_lora_again(files, tiny_path):
    model = load(resolve("tiny"), "float32")
    lora_mod.activate_loras(model.pipe, [LoraRef("tiny_kohya", 1.0)])
    with_lora = image(model.pipe)
    reload_components(model, ["unet"], "float32")  # what the runner does to restore precision
    lora_mod.activate_loras(model.pipe, [LoraRef("tiny_kohya", 1.0)])
    assert np.array_equal(image(model.pipe), with_lora)


# ------------------------------------------------------------------------------- under the presets

def _preset(name: str) -> MemorySettings:
    return load_presets()[name].memory


PRESETS = {
    "highvram": _preset("highvram"),  # on a CPU: float32, everything placed
    "medvram": _preset("medvram"),  # model offload (accelerate hooks)
    "lowvram": _preset("lowvram"),  # block-level group offload, VAE tiling
    "novram": _preset("novram"),  # fp8 layerwise storage + leaf-level group offload
    "fp8-bf16": MemorySettings(dtype="bfloat16", fp8_storage=True),  # fp8 with a half-precision compute dtype
}


@pytest.mark.parametrize("name", list(PRESETS))
def test_lora_under_each_preset(name, files, pipe):
    settings = PRESETS[name]
    plain = load(resolve("tiny"), "float32").pipe  # the same LoRA without any memory settings
    lora_mod.activate_loras(plain, [LoraRef("tiny_kohya", 1.0)])
    reference = image(plain)

    apply_mod.apply_settings(pipe, settings, CPU)
    hooked = has_offload_hooks(pipe)
    base = image(pipe)
    checksum = base_checksum(pipe)
    reapplied = []

    def reapply():
        reapplied.append(1)
        apply_mod.apply_settings(pipe, settings, CPU)

    lora_mod.activate_loras(pipe, [LoraRef("tiny_kohya", 1.0)], reapply_memory=reapply)
    assert len(reapplied) == (1 if hooked else 0)
    assert has_offload_hooks(pipe) == hooked  # the preset is on again
    with_lora = image(pipe)
    assert not np.array_equal(with_lora, base)
    if not settings.fp8_storage:
        assert np.abs(with_lora - reference).max() < 1e-4  # the LoRA acts as it does without hooks
    else:  # fp8 changes the base; the LoRA's own weights are not rounded to fp8
        m = pipe.unet.down_blocks[1].attentions[0].transformer_blocks[0].attn1.to_q
        assert m.base_layer.weight.dtype == torch.float8_e4m3fn
        assert m.lora_A[lora_mod.adapter_name(files["kohya"])].weight.dtype == getattr(torch, apply_mod.effective_settings(settings, CPU)[0].dtype)
    lora_mod.activate_loras(pipe, [LoraRef("tiny_kohya", 0.0)], reapply_memory=reapply)
    assert np.array_equal(image(pipe), base)
    lora_mod.activate_loras(pipe, [], reapply_memory=reapply)
    assert np.array_equal(image(pipe), base)
    assert base_checksum(pipe) == checksum  # fp8 round trip while loading was exact
    assert len(reapplied) == (1 if hooked else 0)  # re-weighting never touches the hooks


def test_lora_loaded_before_the_ladder_steps_down_to_fp8(files, pipe):
    """A job starts at a full-precision preset with the LoRA on, runs out of memory and steps down to
    novram: fp8 storage is applied to a UNet that already has adapters (diffusers skips peft layers)."""
    lora_mod.activate_loras(pipe, [LoraRef("tiny_kohya", 1.0)])
    apply_mod.apply_settings(pipe, PRESETS["novram"], CPU)
    stepped = image(pipe)
    fresh = load(resolve("tiny"), "float32").pipe
    apply_mod.apply_settings(fresh, PRESETS["novram"], CPU)

    def reapply():
        apply_mod.apply_settings(fresh, PRESETS["novram"], CPU)

    lora_mod.activate_loras(fresh, [LoraRef("tiny_kohya", 1.0)], reapply_memory=reapply)
    assert np.abs(image(fresh) - stepped).max() < 1e-4  # either order: the same image


def test_model_offload_without_reapply_is_what_diffusers_does(files, pipe):
    """Measured: without our hook handling, diffusers re-enables model offload on its default device,
    which on a machine without CUDA fails. This is why the engine passes `reapply_memory`."""
    apply_mod.apply_settings(pipe, PRESETS["medvram"], CPU)
    if torch.cuda.is_available():
        pytest.skip("on a CUDA machine diffusers' re-enable succeeds (on its default device)")
    with pytest.raises(ModelLoadError, match="requires accelerator"):
        lora_mod.activate_loras(pipe, [LoraRef("tiny_kohya", 1.0)])


# ------------------------------------------------------------------------------------------ SDXL

@pytest.mark.parametrize("layout", ["kohya", "peft"])
def test_sdxl_lora_reaches_both_text_encoders(layout, lora_dir, tiny_sdxl_path):
    xl = load(resolve("tiny-sdxl"), "float32").pipe
    state = kohya_state(xl, seed=7) if layout == "kohya" else peft_state(xl, seed=8)
    path = save(state, lora_dir / f"xl_{layout}.safetensors")
    base = image(xl)
    lora_mod.activate_loras(xl, [LoraRef(f"xl_{layout}", 1.0)])
    assert set(lora_mod.injected(xl, lora_mod.adapter_name(path))) == {"unet", "text_encoder", "text_encoder_2"}
    assert not np.array_equal(image(xl), base)
    lora_mod.activate_loras(xl, [LoraRef(f"xl_{layout}", 0.0)])
    assert np.array_equal(image(xl), base)
