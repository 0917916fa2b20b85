"""docs/FAULTS.md 35 (issue 29, item 4): JSON from outside that is nested deeply (100000 `[`, 200 kB, valid JSON),
huge or holding NaN/Infinity. Before lowvram_gen/safe_json it was a RecursionError in every reader: state files
(every `generate` and `doctor` exit 1), batch manifests and `.jsonl` lines, safetensors headers, PNG metadata.
Each place keeps its own policy; none may recurse."""

from __future__ import annotations

import json
import logging
import struct

import pytest

from lowvram_gen import failures, safe_json
from lowvram_gen.cli.main import main
from lowvram_gen.errors import ModelLoadError
from lowvram_gen.planning import bus, speed
from test_batch import FakeSession, jobs_of, records, run, write

DEEP = "[" * 100000 + "]" * 100000  # the attack run's: valid JSON, 200 kB
SMALL = ["--width", "64", "--height", "64", "--steps", "1"]


# ------------------------------------------------------------------------------------------ the reader


@pytest.mark.parametrize("text, kind", [
    (DEEP, "too deep"),
    ('{"a": ' * 70 + "1" + "}" * 70, "too deep"),
    ("NaN", "not finite"),
    ('{"cfg_scale": Infinity}', "not finite"),
    ('[-Infinity]', "not finite"),
    ('{"seed": 1e400}', "not finite"),
    ("{not json", "invalid"),
    (b"\xff\xfe\x00", "invalid"),
])
def test_loads_refuses_with_one_error_saying_what_was_wrong(text, kind):
    with pytest.raises(safe_json.BadJson) as caught:
        safe_json.loads(text, what="the thing")
    assert caught.value.kind == kind
    assert str(caught.value).startswith("the thing: ")
    assert isinstance(caught.value, ValueError)  # callers' `except ValueError` still hold


def test_loads_refuses_a_text_larger_than_the_limit_before_parsing():
    with pytest.raises(safe_json.BadJson, match="more than the 10 allowed") as caught:
        safe_json.loads('"' + "x" * 20 + '"', max_bytes=10)
    assert caught.value.kind == "too large"


def test_brackets_inside_strings_do_not_count_and_ordinary_json_reads():
    text = json.dumps({"prompt": "[" * 1000 + '\\"{', "list": [[1, 2.5], {"a": None}]})
    assert safe_json.depth(text) == 3
    assert safe_json.loads(text)["list"] == [[1, 2.5], {"a": None}]
    assert safe_json.loads('[1e300, -0.0, 12345678901234567890]') == [1e300, -0.0, 12345678901234567890]
    with pytest.raises(safe_json.BadJson, match="nested 3 levels"):
        safe_json.loads("[[[]]]", max_depth=2)


def test_an_unterminated_string_full_of_escaped_quotes_is_scanned_in_linear_time():
    import time

    start = time.perf_counter()
    with pytest.raises(safe_json.BadJson):
        safe_json.loads('"\\"' * 200000)
    assert time.perf_counter() - start < 2


def test_the_reader_is_base_layer_importing_only_the_standard_library_and_errors():
    import ast
    import sys
    from pathlib import Path

    tree = ast.parse(Path(safe_json.__file__).read_text(encoding="utf-8"))
    modules = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    modules |= {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    assert {m for m in modules if m.split(".")[0] not in sys.stdlib_module_names} == {"lowvram_gen.errors"}


# ---------------------------------------------------------------------------------- state files


@pytest.mark.parametrize("file", [failures._path, speed.path, bus.path])
def test_a_deeply_nested_state_file_is_ignored_with_a_warning_and_no_job_fails(file, tmp_path, tiny_path, caplog):
    file().write_text(DEEP, encoding="utf-8")
    with caplog.at_level(logging.WARNING):
        assert main(["generate", "a fox", "--model", "tiny", *SMALL, "--outdir", str(tmp_path), "--json"]) == 0
        assert main(["doctor", "--skip-bus"]) == 0
        assert main(["plan", "--model", "tiny", "--vram", "4GB"]) == 0
    warned = [r.message for r in caplog.records if "nested 100000 levels deep" in r.message]
    assert warned and all(str(file()) in w for w in warned)
    if file is not bus.path:  # bus.json keeps its own policy: the assumption, said in each plan's warnings
        assert len(warned) == 1 and "set aside as" in warned[0]  # one warning: the file is then set aside
        assert file().with_name(file().name + ".bad").read_text() == DEEP and not file().exists()


def test_state_records_with_nan_or_huge_numbers_are_refused_as_not_finite(caplog):
    speed.path().write_text('[{"measured_s": NaN}]', encoding="utf-8")
    with caplog.at_level(logging.WARNING, logger="lowvram_gen.records"):
        assert speed.load() == []
    assert "not finite" in caplog.text


# --------------------------------------------------------------------------- batch manifest and lines


def test_a_deeply_nested_manifest_line_is_left_out_and_the_batch_starts(tmp_path, caplog):
    path = write(tmp_path, "p.txt", "a\nb\n")
    out = tmp_path / "out"
    assert run(path, out, FakeSession()) == 0
    manifest = out / "manifest.rank0.jsonl"
    manifest.write_text(DEEP + "\n" + manifest.read_text())
    again = FakeSession()
    with caplog.at_level(logging.WARNING, logger="lowvram_gen.batch.manifest"):
        assert run(path, out, again) == 0
    assert "left out 1 damaged manifest record" in caplog.text and "line 1 of" in caplog.text
    assert again.calls == [] and len(records(out)) == 2  # the two jobs are still known as done


def test_a_deeply_nested_jsonl_line_fails_alone_naming_its_line(tmp_path):
    path = write(tmp_path, "p.jsonl", '{"prompt": "a cat"}\n' + DEEP + '\n{"prompt": "a dog", "cfg": NaN}\n'
                                      '{"prompt": "a fish"}\n')
    result = jobs_of(path)
    assert [(j.line, j.request.prompt) for j in result.jobs] == [(1, "a cat"), (4, "a fish")]
    bad = {b.line: b.error for b in result.bad}
    assert "nested 100000 levels deep" in bad[2] and "not finite" in bad[3]
    session = FakeSession()
    assert run(path, tmp_path / "out", session) != 0  # two lines failed: the batch says so, after running the rest
    assert [r.prompt for r in session.calls] == ["a cat", "a fish"]


# ------------------------------------------------------------------------------------- safetensors


def _safetensors_with_header(path, header: bytes):
    path.write_bytes(struct.pack("<Q", len(header)) + header)
    return path


def test_a_deeply_nested_safetensors_header_is_a_model_load_error_naming_the_file(tmp_path, capsys):
    from lowvram_gen.models.filedtype import header_dtypes
    from lowvram_gen.models.safe_files import safetensors_header

    file = _safetensors_with_header(tmp_path / "deep.safetensors", DEEP.encode())
    with pytest.raises(ModelLoadError, match="nested 100000 levels deep") as caught:
        safetensors_header(file)
    assert str(file) in str(caught.value)
    assert header_dtypes(file) == {}
    assert main(["generate", "a fox", "--model", str(file), *SMALL, "--outdir", str(tmp_path / "o")]) == 2
    assert str(file) in capsys.readouterr().err


# ------------------------------------------------------------------------------------ PNG metadata


def test_deeply_nested_png_metadata_is_ignored_with_a_warning_naming_the_file(tmp_path, caplog):
    from PIL import Image
    from PIL.PngImagePlugin import PngInfo

    from lowvram_gen.a1111.infotext import from_png
    from lowvram_gen.outputs import METADATA_KEY, PARAMETERS_KEY, read_png_metadata

    info = PngInfo()
    info.add_text(PARAMETERS_KEY, "a fox\nSteps: 3, Sampler: Euler, CFG scale: 5, Seed: 7, Size: 64x64")
    info.add_text(METADATA_KEY, DEEP)
    file = tmp_path / "downloaded.png"
    Image.new("RGB", (8, 8)).save(file, pnginfo=info)
    with caplog.at_level(logging.WARNING, logger="lowvram_gen.outputs"):
        text, ours = read_png_metadata(file)
        assert ours is None and text.startswith("a fox")
        assert from_png(file).fields["steps"] == 3
    assert "nested 100000 levels deep" in caplog.text and str(file) in caplog.text
    assert main(["generate", "--from-png", str(file), "--model", "tiny", "--steps", "1",
                 "--outdir", str(tmp_path / "o")]) == 0


# --------------------------------------------------------------------------------- model folder configs


@pytest.mark.parametrize("deep", ["model_index.json", "unet/config.json"])
def test_a_deeply_nested_config_of_a_model_folder_is_refused_naming_the_file(deep, tmp_path, capsys):
    folder = tmp_path / "model"
    (folder / "unet").mkdir(parents=True)
    (folder / "model_index.json").write_text(json.dumps(
        {"_class_name": "StableDiffusionPipeline", "unet": ["diffusers", "UNet2DConditionModel"]}))
    (folder / deep).write_text(DEEP)
    assert main(["plan", "--model", str(folder)]) == 2
    assert f"{folder / deep}: JSON nested" in capsys.readouterr().err
    assert main(["generate", "a fox", "--model", str(folder), *SMALL, "--outdir", str(tmp_path / "o")]) == 2
    assert f"{folder / deep}: JSON nested" in capsys.readouterr().err
