"""Preset files: the shipped ones load in ladder order; bad files are refused naming file, key and value."""

from __future__ import annotations

import pytest

from lowvram_gen.errors import PresetError
from lowvram_gen.presets import find_preset, gpu_ladder, load_preset_file, load_presets, presets_dir

GOOD = """
description = "mine"
rank = 1
device = "gpu"
max_pixels = 262144
max_batch = 2
[memory]
dtype = "float16"
offload = "model"
[vqgan]
cutn_chunk = 8
"""


def test_shipped_presets_load_in_ladder_order():
    presets = load_presets()
    assert [p.name for p in gpu_ladder(presets)] == ["highvram", "medvram", "budget", "lowvram", "novram"]
    assert presets["cpu"].device == "cpu" and presets["cpu"].memory.dtype == "float32"
    assert presets["novram"].memory.offload == "sequential" and presets["novram"].memory.fp8_storage
    # each rung down is never more expensive: caps and batches only shrink
    ladder = gpu_ladder(presets)
    assert all(a.max_pixels >= b.max_pixels and a.max_batch >= b.max_batch for a, b in zip(ladder, ladder[1:]))


def test_every_shipped_key_is_documented():
    doc = (presets_dir() / "README.md").read_text()
    for preset in load_presets().values():
        for key in preset.as_dict()["memory"]:
            assert f"`{key}`" in doc
        for key in preset.as_dict()["vqgan"]:
            assert f"`{key}`" in doc
        for key in ("rank", "device", "max_pixels", "max_batch", "upscaler", "description"):
            assert f"`{key}`" in doc


def test_user_preset_by_path(tmp_path):
    path = tmp_path / "mine.toml"
    path.write_text(GOOD)
    preset = find_preset(str(path))
    assert (preset.name, preset.memory.offload, preset.vqgan.cutn_chunk, preset.path) == ("mine", "model", 8, path)


@pytest.mark.parametrize("edit,words", [
    (("max_batch = 2", "max_batch = 2\nturbo = true"), ["unknown key turbo", "allowed: description"]),
    (('offload = "model"', 'offload = "model"\nslicing = 1'), ["memory.slicing", "1"]),
    (("max_batch = 2", 'max_batch = "two"'), ["max_batch", "'two'", "whole number"]),
    (("max_batch = 2", "max_batch = 2.5"), ["max_batch", "2.5"]),
    (('dtype = "float16"', 'dtype = "float64"'), ["dtype", "float64", "float32, float16, bfloat16"]),
    (('offload = "model"', 'offload = "disk"'), ["offload", "disk", "sequential"]),
    (('dtype = "float16"', 'dtype = "float32"\nfp8_storage = true'), ["fp8_storage", "float32"]),
    (('device = "gpu"', 'device = "cpu"'), ["offload", "device 'cpu'"]),
    (("max_pixels = 262144", "max_pixels = 10"), ["max_pixels", "10"]),
    (("rank = 1", "rank = -1"), ["rank", "-1"]),
    (("cutn_chunk = 8", "cutn_chunk = true"), ["vqgan.cutn_chunk", "True"]),
    (("rank = 1\n", ""), ["missing key rank"]),
])
def test_bad_presets_name_file_key_and_value(tmp_path, edit, words):
    path = tmp_path / "bad.toml"
    path.write_text(GOOD.replace(*edit))
    with pytest.raises(PresetError) as err:
        load_preset_file(path)
    message = str(err.value)
    assert str(path) in message
    for word in words:
        assert word in message


def test_broken_toml_and_unknown_names(tmp_path):
    path = tmp_path / "broken.toml"
    path.write_text("rank = \n")
    with pytest.raises(PresetError, match="not valid TOML"):
        load_preset_file(path)
    with pytest.raises(PresetError, match="unknown preset 'ultra'.*highvram"):
        find_preset("ultra")
