"""Single-file checkpoints: safe loading, clear refusals, and a faithful conversion (docs/FAULTS.md 1-4, 6, 7).

The tiny pipelines are written back into the original (A1111 / LDM) layout by tests/ldm_layout.py and
loaded through `load_single_file`, exactly as a user's Civitai file would be. CPU only, offline.
"""

from __future__ import annotations

import os
import random
import pickle
import shutil
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

torch = pytest.importorskip("torch")
pytest.importorskip("diffusers")
import safetensors.torch  # noqa: E402

import ldm_layout  # noqa: E402
from lowvram_gen.errors import ModelLoadError, UnsafeCheckpoint  # noqa: E402
from lowvram_gen.models.checkpoint import (  # noqa: E402
    check_finite,
    checkpoint_keys,
    detect_pipeline_class,
    load_single_file,
)
from lowvram_gen.models.safe_files import check_safetensors, load_pickle_weights_only  # noqa: E402

SD_REPO = "stable-diffusion-v1-5/stable-diffusion-v1-5"
SDXL_REPO = "stabilityai/stable-diffusion-xl-base-1.0"


# ---------------------------------------------------------------------------------------- fixtures


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    """Own home for the tiny models, an empty HF cache, offline: nothing here may touch the hub.
    Module-scoped so that other test files never see these settings."""
    import huggingface_hub.constants as hf_constants

    root = tmp_path_factory.mktemp("ckpt-env")
    cache = root / "hf" / "hub"
    cache.mkdir(parents=True)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("LOWVRAM_GEN_HOME", str(root / "home"))
        mp.setenv("HF_HOME", str(root / "hf"))
        mp.setenv("HF_HUB_CACHE", str(cache))
        mp.setenv("HF_HUB_OFFLINE", "1")
        mp.setattr(hf_constants, "HF_HUB_CACHE", str(cache))  # read at import time by huggingface_hub
        mp.setattr(hf_constants, "HF_HUB_OFFLINE", True)
        yield {"root": root, "cache": cache}


@pytest.fixture(scope="module")
def tiny(env):
    from lowvram_gen.models.tiny import ensure_tiny

    return {"sd": ensure_tiny("tiny"), "sdxl": ensure_tiny("tiny-sdxl")}


def _folder_pipe(folder):
    from diffusers import DiffusionPipeline

    return DiffusionPipeline.from_pretrained(str(folder), dtype=torch.float32, local_files_only=True)


@pytest.fixture(scope="module")
def files(env, tiny):
    """The tiny pipelines as original-layout .safetensors and .ckpt files."""
    out = {}
    for name in ("sd", "sdxl"):
        pipe = _folder_pipe(tiny[name])
        state = ldm_layout.pipeline_to_ldm(pipe)
        st = env["root"] / f"tiny-{name}.safetensors"
        safetensors.torch.save_file(state, str(st))
        out[name] = st
        out[f"{name}_state"] = state
    ckpt = env["root"] / "tiny-sd.ckpt"  # A1111 / Lightning shape: the weights under "state_dict"
    torch.save({"state_dict": out["sd_state"], "global_step": 470000, "epoch": 3}, ckpt)
    out["sd_ckpt"] = ckpt
    return out


class Evil:
    """A pickle payload: unpickling it with plain pickle runs os.system."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


class EvilExec:
    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (exec, (f"open({str(self.marker)!r}, 'w').write('pwned')",))


def _evil_files(tmp_path, marker):
    """The same attack in the three pickle containers torch.load reads."""
    weights = {"model.diffusion_model.input_blocks.0.0.weight": torch.zeros(2)}
    zipped = tmp_path / "zip.ckpt"
    torch.save({"state_dict": {**weights, "x": Evil(marker)}}, zipped)
    legacy = tmp_path / "legacy.pt"
    torch.save({"state_dict": {**weights, "x": EvilExec(marker)}}, legacy, _use_new_zipfile_serialization=False)
    raw = tmp_path / "raw.pth"
    raw.write_bytes(pickle.dumps({"state_dict": Evil(marker)}, protocol=4))
    raw2 = tmp_path / "raw2.bin"
    raw2.write_bytes(pickle.dumps({"state_dict": EvilExec(marker)}, protocol=2))
    return [zipped, legacy, raw, raw2]


def _generate(pipe):
    out = pipe(
        "a lighthouse", num_inference_steps=2, height=64, width=64, output_type="np",
        generator=torch.Generator("cpu").manual_seed(1234),
    )
    return out.images


def _assert_same_weights(loaded, reference, names):
    for name in names:
        got, want = getattr(loaded, name).state_dict(), getattr(reference, name).state_dict()
        assert set(got) == set(want), f"{name}: keys differ: {sorted(set(got) ^ set(want))[:5]}"
        for key, value in want.items():
            assert got[key].dtype == value.dtype, f"{name}.{key}: dtype {got[key].dtype} != {value.dtype}"
            assert torch.equal(got[key], value), f"{name}.{key} differs"


# ------------------------------------------------------------------------------ faithful loading


def test_ldm_layout_uses_original_prefixes(files):
    keys = set(files["sd_state"])
    assert "model.diffusion_model.input_blocks.0.0.weight" in keys
    assert "model.diffusion_model.middle_block.1.proj_in.weight" in keys
    assert "first_stage_model.decoder.up.0.block.0.conv1.weight" in keys
    assert "first_stage_model.encoder.mid.attn_1.q.weight" in keys
    assert "cond_stage_model.transformer.text_model.embeddings.position_embedding.weight" in keys
    xl = set(files["sdxl_state"])
    assert "model.diffusion_model.label_emb.0.0.weight" in xl
    assert "conditioner.embedders.0.transformer.text_model.final_layer_norm.weight" in xl
    assert "conditioner.embedders.1.model.transformer.resblocks.1.attn.in_proj_weight" in xl
    assert "conditioner.embedders.1.model.text_projection" in xl


@pytest.mark.parametrize("name,names", [
    ("sd", ["unet", "vae", "text_encoder"]),
    ("sdxl", ["unet", "vae", "text_encoder", "text_encoder_2"]),
])
def test_single_file_loads_every_weight_and_same_pixels(files, tiny, name, names):
    pipe = load_single_file(files[name], config=str(tiny[name]), torch_dtype=torch.float32)
    reference = _folder_pipe(tiny[name])
    assert type(pipe).__name__ == type(reference).__name__
    _assert_same_weights(pipe, reference, names)
    check_finite(pipe)
    # Not bit-exact: identical weights at a different memory alignment (mmap'd file vs fresh tensor) take
    # another BLAS path, which moves SDXL's text projection by ~2e-7.
    import numpy as np

    np.testing.assert_allclose(_generate(pipe), _generate(reference), rtol=0, atol=1e-5)


@pytest.mark.parametrize("name,names", [
    ("sd", ["unet", "text_encoder"]),
    ("sd", ["vae"]),
    ("sdxl", ["text_encoder", "text_encoder_2", "unet"]),
    ("sd_ckpt", ["unet", "text_encoder"]),
])
def test_components_reload_from_a_single_file_without_building_a_pipeline(files, tiny, monkeypatch, name, names):
    """Issue 17: restoring precision after int8/fp8 built a whole second pipeline from the file to take one or
    two components from it. Each named component now comes from its own keys, and equals the folder's."""
    import diffusers

    from lowvram_gen.models.checkpoint import load_components

    def no_pipeline(*args, **kwargs):
        raise AssertionError("a whole pipeline was built")

    for cls in ("StableDiffusionPipeline", "StableDiffusionXLPipeline"):
        monkeypatch.setattr(getattr(diffusers, cls), "from_single_file", no_pipeline)
    base = name.split("_")[0]
    parts = load_components(files[name], str(tiny[base]), names, torch.float32,
                            lambda folder, component: pytest.fail("not a GGUF: nothing comes from the folder"))
    assert sorted(parts) == sorted(names)
    reference = _folder_pipe(tiny[base])
    for component in names:
        got, want = parts[component].state_dict(), getattr(reference, component).state_dict()
        assert got.keys() == want.keys(), component
        assert all(torch.equal(got[k], want[k]) for k in want), component


def test_reload_components_of_a_single_file_model_reads_only_those(files, tiny, monkeypatch):
    """The runner's reload (models/loading.reload_components) on a single-file model: the other components stay
    the same objects, and no pipeline is built."""
    import diffusers

    from lowvram_gen.models.loading import LoadedModel, reload_components
    from lowvram_gen.models.resolve import ModelSource

    pipe = load_single_file(files["sd"], config=str(tiny["sd"]), torch_dtype=torch.float32)
    model = LoadedModel(source=ModelSource(spec=str(files["sd"]), kind="single_file", path=files["sd"],
                                           config=str(tiny["sd"])), pipe=pipe, dtype="float32")
    before = dict(pipe.components)
    with torch.no_grad():
        pipe.unet.conv_in.weight.zero_()  # what lost precision
    monkeypatch.setattr(diffusers.StableDiffusionPipeline, "from_single_file",
                        lambda *a, **k: (_ for _ in ()).throw(AssertionError("a whole pipeline was built")))
    reload_components(model, ["unet"], "float32")
    for component, module in pipe.components.items():
        assert (module is before[component]) == (component != "unet"), component
    assert torch.equal(pipe.unet.conv_in.weight, _folder_pipe(tiny["sd"]).unet.conv_in.weight)


def test_ckpt_loads_weights_only_and_matches(files, tiny):
    state = load_pickle_weights_only(files["sd_ckpt"])  # {"state_dict": ...} unwrapped, extras dropped
    assert set(state) == set(files["sd_state"])
    assert "global_step" not in state
    assert checkpoint_keys(files["sd_ckpt"]) == list(state)
    pipe = load_single_file(str(files["sd_ckpt"]), config=str(tiny["sd"]), torch_dtype=torch.float32)
    _assert_same_weights(pipe, _folder_pipe(tiny["sd"]), ["unet", "vae", "text_encoder"])


def test_extras_found_in_real_checkpoints_are_tolerated(tmp_path, files, tiny):
    """EMA bookkeeping, schedule buffers and CLIP's position_ids sit in many A1111 / SD 1.5 files."""
    state = dict(files["sd_state"])
    state["cond_stage_model.transformer.text_model.embeddings.position_ids"] = torch.arange(77)[None]
    state["model_ema.decay"] = torch.tensor(0.9999)
    state["alphas_cumprod"] = torch.ones(1000)
    path = tmp_path / "a1111.safetensors"
    safetensors.torch.save_file(state, str(path))
    pipe = load_single_file(path, config=str(tiny["sd"]), torch_dtype=torch.float32)
    _assert_same_weights(pipe, _folder_pipe(tiny["sd"]), ["unet", "vae", "text_encoder"])


def test_missing_file_and_unknown_suffix(tmp_path, tiny):
    with pytest.raises(ModelLoadError, match="not found"):
        load_single_file(tmp_path / "nope.safetensors", config=str(tiny["sd"]), torch_dtype=torch.float32)
    odd = tmp_path / "model.onnx"
    odd.write_bytes(b"GGUF")
    with pytest.raises(ModelLoadError, match="unknown checkpoint type"):
        load_single_file(odd, config=str(tiny["sd"]), torch_dtype=torch.float32)


def test_official_sd_ckpt_with_lightning_callback_loads(tmp_path, files, tiny, monkeypatch):
    """The official SD 1.x .ckpt files name pytorch_lightning's ModelCheckpoint class in their
    bookkeeping; it resolves to an inert stand-in (as in A1111), and pytorch_lightning is never imported."""
    import types

    names = ["pytorch_lightning", "pytorch_lightning.callbacks", "pytorch_lightning.callbacks.model_checkpoint"]
    fake = type("ModelCheckpoint", (), {"__module__": names[-1]})
    for name in names:
        monkeypatch.setitem(sys.modules, name, types.ModuleType(name))
    sys.modules[names[-1]].ModelCheckpoint = fake
    path = tmp_path / "v1-5-pruned-emaonly.ckpt"
    torch.save({"state_dict": files["sd_state"], "global_step": 840000,
                "callbacks": {fake: {"best_model_path": "/x", "best_model_score": torch.tensor(0.1)}}}, path)
    for name in names:
        monkeypatch.delitem(sys.modules, name)
    assert set(load_pickle_weights_only(path)) == set(files["sd_state"])
    pipe = load_single_file(path, config=str(tiny["sd"]), torch_dtype=torch.float32)
    _assert_same_weights(pipe, _folder_pipe(tiny["sd"]), ["unet"])
    assert "pytorch_lightning" not in sys.modules


def test_check_safetensors_returns_keys(files):
    assert set(check_safetensors(files["sd"])) == set(files["sd_state"])
    assert set(checkpoint_keys(files["sdxl"])) == set(files["sdxl_state"])


def test_detect_pipeline_class(files):
    assert detect_pipeline_class(files["sd_state"]) == "StableDiffusionPipeline"
    assert detect_pipeline_class(files["sdxl_state"]) == "StableDiffusionXLPipeline"
    assert detect_pipeline_class(["model.diffusion_model.joint_blocks.0.context_block.adaLN_modulation.1.bias"]) \
        == "StableDiffusion3Pipeline"
    assert detect_pipeline_class(["double_blocks.0.img_attn.norm.key_norm.scale"]) == "FluxPipeline"


# ---------------------------------------------------------------------------- hostile / broken files


def test_malicious_payload_is_live(tmp_path):
    """Control: the payload used below really runs when unpickled the unsafe way."""
    marker = tmp_path / "control-marker"
    pickle.loads(pickle.dumps(EvilExec(marker)))
    assert marker.exists()


def test_malicious_pickle_is_refused_and_nothing_runs(tmp_path, tiny):
    marker = tmp_path / "PWNED"
    for path in _evil_files(tmp_path, marker):
        for load in (load_pickle_weights_only, checkpoint_keys,
                     lambda p: load_single_file(p, config=str(tiny["sd"]), torch_dtype=torch.float32)):
            with pytest.raises(UnsafeCheckpoint) as err:
                load(path)
            message = str(err.value)
            assert str(path) in message
            assert "system" in message or "exec" in message, message  # the global it tried to load
        assert not marker.exists(), f"{path.name} ran code"


def test_pickle_renamed_to_safetensors_is_never_unpickled(tmp_path, tiny, files):
    marker = tmp_path / "PWNED"
    evil = _evil_files(tmp_path, marker)
    renamed = [evil[0].rename(tmp_path / "evil.safetensors"), evil[2].rename(tmp_path / "evil-raw.safetensors")]
    clean = tmp_path / "clean.safetensors"
    shutil.copy(files["sd_ckpt"], clean)
    for path in [*renamed, clean]:
        for load in (check_safetensors, checkpoint_keys,
                     lambda p: load_single_file(p, config=str(tiny["sd"]), torch_dtype=torch.float32)):
            with pytest.raises(ModelLoadError, match="not a safetensors file") as err:
                load(path)
            assert not isinstance(err.value, UnsafeCheckpoint)
            assert "pickle" in str(err.value)
    assert not marker.exists()


def _damaged(tmp_path, source: Path, kind: str) -> Path:
    data = source.read_bytes()
    target = tmp_path / f"{kind}{source.suffix}"
    if kind.startswith("garbage"):  # seeded: random bytes make the unpickler fail in many different ways
        target.write_bytes(random.Random(int(kind.split("-")[1])).randbytes(4096))
        return target
    target.write_bytes({"empty": b"", "tiny": data[:5], "half": data[: len(data) // 2], "cut": data[:-100]}[kind])
    return target


@pytest.mark.parametrize("suffix", ["sd", "sd_ckpt"])
@pytest.mark.parametrize("kind", ["empty", "tiny", "half", "cut", *(f"garbage-{i}" for i in range(12))])
def test_empty_truncated_or_garbage_file_is_a_clear_error(tmp_path, files, tiny, suffix, kind):
    path = _damaged(tmp_path, Path(files[suffix]), kind)
    for load in (checkpoint_keys, lambda p: load_single_file(p, config=str(tiny["sd"]), torch_dtype=torch.float32)):
        with pytest.raises(ModelLoadError) as err:
            load(path)
        assert path.name in str(err.value)
        assert not isinstance(err.value, UnsafeCheckpoint)


def test_diffusers_layout_state_dict_is_refused_naming_keys(tmp_path, tiny):
    pipe = _folder_pipe(tiny["sd"])
    path = tmp_path / "unet.safetensors"
    safetensors.torch.save_file({k: v.contiguous() for k, v in pipe.unet.state_dict().items()}, str(path))
    with pytest.raises(ModelLoadError) as err:
        load_single_file(path, config=str(tiny["sd"]), torch_dtype=torch.float32)
    message = str(err.value)
    assert "conv_in" in message and "diffusers-layout" in message  # the keys it has
    assert "model.diffusion_model." in message and "first_stage_model." in message  # the keys expected


def test_random_keys_are_refused_naming_keys(tmp_path, tiny):
    path = tmp_path / "random.ckpt"
    torch.save({"foo.weight": torch.zeros(3), "bar.bias": torch.ones(2)}, path)
    with pytest.raises(ModelLoadError, match="foo.weight") as err:
        load_single_file(path, config=str(tiny["sd"]), torch_dtype=torch.float32)
    assert "model.diffusion_model." in str(err.value)


def test_config_of_another_architecture_is_refused(files, tiny):
    with pytest.raises(ModelLoadError, match="StableDiffusionXLPipeline"):
        load_single_file(files["sd"], config=str(tiny["sdxl"]), torch_dtype=torch.float32)
    with pytest.raises(ModelLoadError, match="text_encoder_2"):
        load_single_file(files["sdxl"], config=str(tiny["sd"]), torch_dtype=torch.float32)


def test_missing_and_misshapen_weights_are_named(tmp_path, files, tiny):
    state = dict(files["sd_state"])
    del state["model.diffusion_model.out.2.weight"]
    state["first_stage_model.decoder.conv_in.weight"] = torch.zeros(32, 4, 5, 5)
    path = tmp_path / "broken.safetensors"
    safetensors.torch.save_file(state, str(path))
    with pytest.raises(ModelLoadError) as err:
        load_single_file(path, config=str(tiny["sd"]), torch_dtype=torch.float32)
    message = str(err.value)
    assert "unet" in message and "missing" in message and "conv_out.weight" in message
    assert "vae" in message and "decoder.conv_in.weight" in message and "[32, 4, 5, 5]" in message


# ------------------------------------------------------------------------------- base configs


@pytest.mark.parametrize("name", ["sd", "sdxl"])
def test_no_config_and_empty_cache_tries_the_shipped_configs_and_says_how_to_fix(env, files, name):
    """Issue 29 item 10: with no --config and nothing in the HF cache the shipped configs are used (a file with CLIP's
    vocabulary loads: tests/test_single_file_offline.py); these tiny files' 1000-token text encoders do not fit CLIP's
    tokenizer, and the refusal says so and how to fix it."""
    assert not any(env["cache"].iterdir()), "the test HF cache must be empty"
    with pytest.raises(ModelLoadError) as err:
        load_single_file(files[name], config=None, torch_dtype=torch.float32)
    message = str(err.value)
    assert "1000-token vocabulary, not CLIP's 49408" in message and "--config FOLDER" in message


def test_hub_id_config_not_cached_names_the_repo(files):
    with pytest.raises(ModelLoadError, match="someone/some-model"):
        load_single_file(files["sd"], config="someone/some-model", torch_dtype=torch.float32)


def test_config_folder_that_is_not_a_pipeline(tmp_path, files):
    with pytest.raises(ModelLoadError, match="model_index.json"):
        load_single_file(files["sd"], config=str(tmp_path), torch_dtype=torch.float32)


def test_no_config_uses_the_default_repo_from_the_cache(env, files, tiny, tmp_path, monkeypatch):
    """config=None finds diffusers' default repo for the architecture in the HF cache, offline."""
    import huggingface_hub.constants as hf_constants

    cache = tmp_path / "hub"
    snapshot = cache / f"models--{SD_REPO.replace('/', '--')}" / "snapshots" / ("0" * 40)
    shutil.copytree(tiny["sd"], snapshot, ignore=shutil.ignore_patterns("*.safetensors"))  # configs only
    (snapshot.parents[1] / "refs").mkdir()
    (snapshot.parents[1] / "refs" / "main").write_text("0" * 40)
    monkeypatch.setattr(hf_constants, "HF_HUB_CACHE", str(cache))
    pipe = load_single_file(files["sd"], config=None, torch_dtype=torch.float32)
    _assert_same_weights(pipe, _folder_pipe(tiny["sd"]), ["unet", "vae", "text_encoder"])
    # and the same repo as a hub id
    pipe = load_single_file(files["sd"], config=SD_REPO, torch_dtype=torch.float32)
    assert type(pipe).__name__ == "StableDiffusionPipeline"


# ------------------------------------------------------------------------------------ NaN / Inf


def test_check_finite_names_component_and_parameter(tiny):
    pipe = _folder_pipe(tiny["sd"])
    check_finite(pipe)
    with torch.no_grad():
        pipe.vae.decoder.conv_out.weight[0, 0, 0, 0] = float("nan")
    with pytest.raises(ModelLoadError) as err:
        check_finite(pipe)
    assert "vae" in str(err.value) and "decoder.conv_out.weight" in str(err.value)


def test_inf_in_a_checkpoint_is_caught_after_loading(tmp_path, files, tiny):
    state = dict(files["sd_state"])
    weight = state["model.diffusion_model.out.2.weight"].clone()
    weight[0, 0, 0, 0] = float("inf")
    state["model.diffusion_model.out.2.weight"] = weight
    path = tmp_path / "inf.safetensors"
    safetensors.torch.save_file(state, str(path))
    pipe = load_single_file(path, config=str(tiny["sd"]), torch_dtype=torch.float32)
    with pytest.raises(ModelLoadError) as err:
        check_finite(pipe)
    assert "unet" in str(err.value) and "conv_out.weight" in str(err.value)
