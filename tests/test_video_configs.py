"""The video models' shipped configs (lowvram_gen/configs/<name>, issue 33) build the published architectures.

Each component that has a config is built with its class from model_index.json on the meta device (no weights, no
memory) and its parameter count is checked against the published size (docs/video-configs.md says where each
number comes from). A wrong width, depth, FFN size or channel count moves the count well past the tolerance.
"""

from __future__ import annotations

import importlib
import json
from pathlib import Path

import pytest

CONFIGS = Path(__file__).resolve().parents[1] / "lowvram_gen" / "configs"

# published sizes in parameters, with the relative tolerance the published (rounded) figure allows
B, M = 1e9, 1e6
UMT5_XXL_ENCODER = (5.68 * B, 0.02)  # google/umt5-xxl's encoder (the Wan papers' "umT5", 5.7 B)
WAN_VAE_21 = (127 * M, 0.02)  # Wan 2.1 technical report: "127M" parameters
WAN_14B = (14.29 * B, 0.02)  # Wan 2.1 14B DiT (each Wan 2.2 A14B expert is one of these)
EXPECTED = {
    "wan21-t2v-1.3b": {"transformer": (1.42 * B, 0.02), "text_encoder": UMT5_XXL_ENCODER, "vae": WAN_VAE_21},
    "wan21-t2v-14b": {"transformer": WAN_14B, "text_encoder": UMT5_XXL_ENCODER, "vae": WAN_VAE_21},
    # the 14B DiT + each block's image key/value projections (40 x 2 x 5120^2 = 2.1 B) and the image embedder:
    # 16.4 B, the size the Hub lists for Wan2.1-I2V-14B; the image encoder is CLIP ViT-H/14's vision tower (631 M)
    "wan21-i2v-14b": {"transformer": (16.39 * B, 0.02), "text_encoder": UMT5_XXL_ENCODER,
                      "vae": WAN_VAE_21, "image_encoder": (631 * M, 0.02)},
    "wan22-ti2v-5b": {"transformer": (5.0 * B, 0.03), "text_encoder": UMT5_XXL_ENCODER, "vae": (705 * M, 0.05)},
    "wan22-t2v-a14b": {"transformer": WAN_14B, "transformer_2": WAN_14B, "text_encoder": UMT5_XXL_ENCODER,
                       "vae": WAN_VAE_21},
    "wan22-i2v-a14b": {"transformer": WAN_14B, "transformer_2": WAN_14B, "text_encoder": UMT5_XXL_ENCODER,
                       "vae": WAN_VAE_21},
    # LTX-Video 0.9.0: the 2B transformer (1.92 B counted), T5-v1.1-XXL's encoder (4.76 B), its VAE (~0.42 B)
    "ltx-video": {"transformer": (1.92 * B, 0.03), "text_encoder": (4.76 * B, 0.02), "vae": (419 * M, 0.05)},
}


def _index(name: str) -> dict:
    return json.loads((CONFIGS / name / "model_index.json").read_text())


def _count(library: str, class_name: str, config: dict) -> int:
    import torch

    cls = getattr(importlib.import_module(library), class_name)
    with torch.device("meta"):
        model = cls.from_config(config) if library == "diffusers" else cls(cls.config_class.from_dict(config))
    return sum(p.numel() for p in model.parameters())


def _components(name: str):
    for part, spec in _index(name).items():
        if part.startswith("_") or not isinstance(spec, list) or spec[0] is None:
            continue
        path = CONFIGS / name / part / "config.json"
        if path.is_file():
            yield part, spec, json.loads(path.read_text())


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_every_component_builds_at_its_published_size(name):
    counted = {part: _count(spec[0], spec[1], config) for part, spec, config in _components(name)}
    assert set(counted) == set(EXPECTED[name]), f"{name}: components with configs {sorted(counted)}"
    for part, n in counted.items():
        want, tol = EXPECTED[name][part]
        assert abs(n - want) <= tol * want, f"{name}/{part}: {n / 1e9:.3f} B parameters, published {want / 1e9:.3f} B"


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_index_names_loadable_classes_and_has_no_weights_or_tokenizers(name):
    import diffusers

    index = _index(name)
    assert getattr(diffusers, index["_class_name"]), index["_class_name"]
    files = [p for p in (CONFIGS / name).rglob("*") if p.is_file()]
    assert all(p.suffix == ".json" for p in files), [str(p) for p in files if p.suffix != ".json"]
    assert not (CONFIGS / name / "tokenizer").exists()
    for part, spec in index.items():
        if not part.startswith("_") and isinstance(spec, list) and spec[0] is not None:
            assert (CONFIGS / name / part).is_dir() or part == "tokenizer", f"{name}: no folder for {part}"


def test_wan22_pipeline_settings():
    """What the Wan 2.2 pipelines read from model_index.json: the expert boundary and TI2V's per-token timesteps."""
    assert _index("wan22-t2v-a14b")["boundary_ratio"] == 0.875
    assert _index("wan22-i2v-a14b")["boundary_ratio"] == 0.9
    ti2v = _index("wan22-ti2v-5b")
    assert ti2v["expand_timesteps"] is True and ti2v["transformer_2"] == [None, None]
    vae = json.loads((CONFIGS / "wan22-ti2v-5b" / "vae" / "config.json").read_text())
    assert (vae["z_dim"], vae["scale_factor_spatial"], vae["scale_factor_temporal"]) == (48, 16, 4)
    # Wan 2.2 I2V A14B has no CLIP image encoder (its image goes in as latents), Wan 2.1's I2V has one
    assert _index("wan22-i2v-a14b")["image_encoder"] == [None, None]
    assert _index("wan21-i2v-14b")["image_encoder"][1].startswith("CLIPVision")


def test_scheduler_configs_load():
    import diffusers

    for name in EXPECTED:
        spec = _index(name)["scheduler"]
        config = json.loads((CONFIGS / name / "scheduler" / "scheduler_config.json").read_text())
        scheduler = getattr(diffusers, spec[1]).from_config(config)
        # LTX's scheduler shifts by the token count (use_dynamic_shifting): the pipeline passes mu
        scheduler.set_timesteps(4, **({"mu": 1.0} if scheduler.config.get("use_dynamic_shifting") else {}))
        assert len(scheduler.timesteps) == 4, name


# ------------------------------------------------------------------------------------------------ the measurements
def _harness():
    import sys

    sys.path.insert(0, str(CONFIGS.parents[1] / "benchmarks"))
    import video_memory

    return video_memory


@pytest.mark.parametrize("arch", ["wan21-1.3b", "wan21-14b", "wan22-5b", "ltx"])
def test_width_scaled_configs_keep_depth_and_head_width(arch):
    """benchmarks/video_memory.py's width-scaled transformers and text encoders: fewer heads, the same head width and
    depth, and the widths that are multiples of the heads scaled with them (so the real model is 1/scale as wide)."""
    vm = _harness()
    for part in ("transformer", "text_encoder"):
        real, scaled = vm.real_config(arch, part), vm.scaled_config(arch, part)
        scale = vm.width_scale(arch, part)
        assert 0 < scale < 1
        if part == "transformer":
            assert scaled["num_layers"] == real["num_layers"]
            assert scaled["attention_head_dim"] == real["attention_head_dim"]
            assert scaled["num_attention_heads"] == round(real["num_attention_heads"] * scale)
            if "ffn_dim" in real:
                assert abs(scaled["ffn_dim"] - real["ffn_dim"] * scale) <= 1
        else:
            assert (scaled["num_layers"], scaled["d_kv"], scaled["vocab_size"]) == (
                real["num_layers"], real["d_kv"], real["vocab_size"])
            assert scaled["d_model"] == scaled["num_heads"] * real["d_kv"]
            assert abs(scaled["d_ff"] - real["d_ff"] * scale) <= 1


def test_latent_shapes_and_tokens_follow_the_pipelines():
    vm = _harness()
    # Wan 2.1: (F-1)/4+1 latent frames at 8x, patches of 2x2: 81 frames at 832x480 -> 21 x 60 x 104, 32760 tokens
    assert vm.latent_shape("wan21-14b", 81, 832, 480) == (21, 60, 104)
    assert vm.video_tokens("wan21-14b", 81, 832, 480) == 21 * 30 * 52
    # Wan 2.2 TI2V: 16x; 121 frames at 1280x704 -> 31 x 44 x 80
    assert vm.latent_shape("wan22-5b", 121, 1280, 704) == (31, 44, 80)
    # LTX: (F-1)/8+1 at 32x, patch 1
    assert vm.video_tokens("ltx", 121, 768, 512) == 16 * 16 * 24


def test_stored_measurements_cover_every_point_with_their_inputs():
    vm = _harness()
    data = json.loads(vm.RESULTS.read_text())
    assert data["commands"] and all(c.startswith("python benchmarks/video_memory.py") for c in data["commands"])
    stored = {p["id"]: p for p in data["points"]}
    assert set(stored) == {p["id"] for p in vm.POINTS}
    for pid, p in stored.items():
        assert "error" not in p, pid
        for key in ("arch", "width_scale", "frames", "width", "height", "batch", "config", "activation_bytes",
                    "weights_rss_bytes"):
            assert key in p, (pid, key)
        assert p["activation_bytes"] > 0 and p["weights_rss_bytes"] > 0, pid
        if p["kind"] == "transformer":
            assert p["video_tokens"] == vm.video_tokens(p["arch"], p["frames"], p["width"], p["height"])
            assert p["text_tokens"] == vm.TEXT_TOKENS[vm.family(p["arch"])]


def test_written_scaled_folder_is_what_was_measured(tmp_path):
    """--write-scaled gives the planner the folder the points measured: its transformer and text encoder counted on
    the meta device have the parameter counts the workers built (stored with each point)."""
    vm = _harness()
    stored = {(p["arch"], p["kind"]): p["params"] for p in json.loads(vm.RESULTS.read_text())["points"]}
    for arch in vm.ARCHS:
        dest = vm.write_scaled_folder(arch, tmp_path / arch)
        index = json.loads((dest / "model_index.json").read_text())
        for part in ("transformer", "text_encoder"):
            if (arch, part) not in stored:
                continue
            config = json.loads((dest / part / "config.json").read_text())
            n = _count(index[part][0], index[part][1], config)
            assert n == stored[(arch, part)], (arch, part, n)
        assert not any(p.suffix != ".json" for p in dest.rglob("*") if p.is_file())
