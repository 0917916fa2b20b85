"""Issue 18's faults 1-5: damaged state files, manifests, read-only or misplaced folders, decompression bombs.
Each reproduces what failed (a traceback, or a job lost) and checks the clear sentence or the safe fallback."""

from __future__ import annotations

import json
import logging
import struct
import zlib
from pathlib import Path

import pytest

from lowvram_gen import failures
from lowvram_gen.cli.main import main
from lowvram_gen.hardware.device import probe
from lowvram_gen.errors import UnwritableFolder
from lowvram_gen.paths import writable_folder
from test_batch import FakeSession, records, run, write

SMALL = ["--width", "64", "--height", "64", "--steps", "1"]


# ------------------------------------------------------------------ 1. remembered failures with bad fields


@pytest.mark.parametrize("record", [
    {"model": "tiny", "work": 0},  # the issue's: no preset, no pixels
    {"model": "tiny", "preset": "highvram", "pixels": 1, "batch": 1, "work": "big"},
    {"model": "tiny", "preset": 5, "pixels": 1, "batch": 1, "work": 1},
    {"model": "tiny", "preset": "highvram", "batch": 1, "work": 1},  # no pixels: doctor and the System tab
])
def test_a_remembered_failure_with_missing_or_mistyped_fields_is_skipped_with_one_warning(record, caplog, capsys,
                                                                                         tmp_path, tiny_path):
    device = probe().name
    good = {"device": device, "model": "tiny", "preset": "medvram", "pixels": 4096, "batch": 1, "work": 4096}
    failures._path().write_text(json.dumps([{"device": device, **record}, good]), encoding="utf-8")
    with caplog.at_level(logging.WARNING, logger="lowvram_gen.records"):
        assert failures.load() == [good]
        assert failures.failed_presets(device, "tiny", 64 * 64, 1) == {"medvram"}
    assert len([r for r in caplog.records if "skipped 1 of 2 records" in r.message]) == 2  # one per read
    assert main(["generate", "a fox", "--model", "tiny", *SMALL, "--outdir", str(tmp_path), "--json"]) == 0
    assert main(["doctor", "--skip-bus"]) == 0
    assert "1 remembered" in capsys.readouterr().out
    from lowvram_gen.ui.tabs.system import failures_table

    assert len(failures_table()) <= 1  # the System tab's table (a CPU's records are not shown)


def test_a_damaged_cached_tiny_model_is_rebuilt_with_a_notice(caplog, tmp_path, monkeypatch):
    from lowvram_gen.models import tiny

    monkeypatch.setenv("LOWVRAM_GEN_HOME", str(tmp_path / "home"))
    folder = tiny.ensure_tiny("tiny")
    weights = next(folder.rglob("unet/*.safetensors"))
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])  # truncated, as by a full disk
    with caplog.at_level(logging.WARNING, logger="lowvram_gen.models.tiny"):
        again = tiny.ensure_tiny("tiny")
    assert "damaged" in caplog.text and "building it again" in caplog.text
    assert tiny._damage(again) == "" and again == folder
    assert main(["generate", "a fox", "--model", "tiny", *SMALL, "--outdir", str(tmp_path / "o")]) == 0


# ---------------------------------------------------------------------- 2. damaged manifest lines


@pytest.mark.parametrize("outputs", [5, [1, None], "00000-1-a.png"])
def test_a_manifest_record_with_bad_outputs_is_left_out_and_the_batch_starts(outputs, tmp_path, caplog):
    path = write(tmp_path, "p.txt", "a\nb\n")
    out = tmp_path / "out"
    assert run(path, out, FakeSession()) == 0
    manifest = out / "manifest.rank0.jsonl"
    first = json.loads(manifest.read_text().splitlines()[0])
    manifest.write_text(json.dumps({**first, "outputs": outputs}) + "\n" + manifest.read_text().split("\n", 1)[1])
    again = FakeSession()
    with caplog.at_level(logging.WARNING, logger="lowvram_gen.batch.manifest"):
        assert run(path, out, again) == 0
    assert "left out 1 damaged manifest record" in caplog.text
    assert [r.prompt for r in again.calls] in ([], ["a"])  # adopted from its images, or run again: never lost


def test_an_ok_record_whose_image_was_deleted_is_reported_and_made_again(tmp_path, capsys):
    path = write(tmp_path, "p.txt", "a\nb\n")
    out = tmp_path / "out"
    assert run(path, out, FakeSession()) == 0
    deleted = records(out)[0]["outputs"][0]
    (out / deleted).unlink()
    again = FakeSession()
    assert run(path, out, again) == 0
    assert [r.prompt for r in again.calls] == ["a"]  # b's image is there: not made twice
    assert f"{deleted} no longer exist" in capsys.readouterr().err


# ------------------------------------------------------------ 3, 4. read-only, missing or misplaced folders


class ReadOnly:
    """Simulates a read-only folder (as root, chmod does not stop writes): making a file in `folder` fails with
    EROFS, as on a read-only mount."""

    def __init__(self, monkeypatch, folder: Path):
        import tempfile

        real = tempfile.mkstemp
        self.folder = folder.resolve()

        def mkstemp(*args, dir=None, **kwargs):
            if dir is not None and Path(dir).resolve() == self.folder:
                raise OSError(30, "Read-only file system")
            return real(*args, dir=dir, **kwargs)

        monkeypatch.setattr(tempfile, "mkstemp", mkstemp)


def test_writable_folder_names_the_folder_and_the_reason(tmp_path, monkeypatch):
    a_file = tmp_path / "a-file"
    a_file.write_text("x")
    with pytest.raises(UnwritableFolder, match=r"the output folder .*a-file is a file, not a folder"):
        writable_folder(a_file, "the output folder")
    ReadOnly(monkeypatch, tmp_path / "ro")
    (tmp_path / "ro").mkdir()
    with pytest.raises(UnwritableFolder, match=r"is not writable: Read-only file system"):
        writable_folder(tmp_path / "ro", "the output folder")
    assert writable_folder(tmp_path / "new" / "deep", "x").is_dir()


def test_batch_into_a_read_only_folder_stops_with_exit_2_and_a_sentence(tmp_path, monkeypatch, capsys):
    path = write(tmp_path, "p.txt", "a\n")
    (tmp_path / "ro").mkdir()
    ReadOnly(monkeypatch, tmp_path / "ro")
    assert main(["batch", str(path), "--outdir", str(tmp_path / "ro"), *SMALL]) == 2
    err = capsys.readouterr().err
    assert "the batch's output folder (--outdir)" in err and "Read-only file system" in err
    assert "Traceback" not in err


@pytest.mark.parametrize("kind", ["file", "read-only"])
def test_generate_into_a_bad_outdir_stops_before_any_model_work(kind, tmp_path, monkeypatch, capsys):
    """Found after the whole job had run (exit 1, 'File exists'); now before the model loads."""
    from lowvram_gen.models import loading

    target = tmp_path / "target"
    if kind == "file":
        target.write_text("x")
    else:
        target.mkdir()
        ReadOnly(monkeypatch, target)

    def no_loading(*a, **k):
        raise AssertionError("the model was loaded")

    monkeypatch.setattr(loading, "load", no_loading)
    monkeypatch.setattr("lowvram_gen.session.load", no_loading)
    assert main(["generate", "a fox", "--model", "tiny", *SMALL, "--outdir", str(target)]) == 2
    err = capsys.readouterr().err
    assert "the output folder" in err and ("is a file, not a folder" in err or "Read-only" in err)
    assert "File exists" not in err


def test_lowvram_gen_home_pointing_at_a_file_is_a_sentence_not_a_traceback(tmp_path, monkeypatch, capsys):
    home = tmp_path / "home-is-a-file"
    home.write_text("x")
    monkeypatch.setenv("LOWVRAM_GEN_HOME", str(home))
    assert main(["generate", "a fox", "--model", "tiny", *SMALL, "--outdir", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert "LOWVRAM_GEN_HOME" in err and "is a file, not a folder" in err and "Traceback" not in err


# ---------------------------------------------------------------------------- 5. decompression bombs


def bomb(path: Path) -> Path:
    """A 30000x30000 PNG of a few hundred bytes (only the first row's data), with A1111 parameters."""
    def chunk(kind, data):
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)

    side = 30000
    path.write_bytes(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", side, side, 8, 0, 0, 0, 0))
                     + chunk(b"tEXt", b"parameters\x00a fox\nSteps: 3, Seed: 1, Size: 64x64")
                     + chunk(b"IDAT", zlib.compress(b"\x00" * (side + 1), 9)) + chunk(b"IEND", b""))
    return path


@pytest.mark.parametrize("argv", [["upscale", "{bomb}"], ["img2img", "a fox", "--init", "{bomb}", *SMALL],
                                  ["generate", "--from-png", "{bomb}", *SMALL]])
def test_a_decompression_bomb_is_refused_with_exit_2_and_a_sentence(argv, tmp_path, capsys):
    path = bomb(tmp_path / "bomb.png")
    assert main([a.replace("{bomb}", str(path)) for a in argv] + ["--outdir", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert "decompression bomb" in err and "bomb.png" in err and "Traceback" not in err


def test_an_api_client_gets_our_sentence_for_a_bomb(tmp_path):
    from gradio_client import Client, handle_file
    from gradio_client.exceptions import AppError

    from servers import Server

    srv = Server(tmp_path)
    try:
        client = Client(srv.url, verbose=False)
        path = bomb(tmp_path / "bomb.png")
        for call in (dict(image=handle_file(str(path)), api_name="/upscale"),
                     dict(init_image=handle_file(str(path)), prompt="x", api_name="/img2img")):
            with pytest.raises(AppError) as err:
                client.predict(**call)
            assert "decompression bomb" in err.value.message
    finally:
        srv.close()


# ------------------------------------------------- issue 29, items 8 and 9: absurd learned figures and sizes


@pytest.mark.parametrize("field, value", [("measured_s", 1e300), ("flops", 1e300), ("transfer_s", 1e300),
                                          ("width", 10 ** 12)])
def test_an_absurd_learned_step_time_is_set_aside_with_one_warning(field, value, tmp_path, tiny_path, caplog,
                                                                   capsys):
    from lowvram_gen.planning import speed
    from lowvram_gen.request import GenerationRequest
    from lowvram_gen.session import Session

    Session(device="cpu", outdir=str(tmp_path)).generate(
        GenerationRequest(prompt="a fox", model="tiny", width=64, height=64, steps=2, seed=3))
    measured = json.loads(speed.path().read_text())
    speed.path().write_text(json.dumps([*measured, {**measured[0], field: value}]))
    with caplog.at_level(logging.WARNING, logger="lowvram_gen.planning.speed"):
        assert main(["plan", "--cpu", "--model", "tiny", "--width", "64", "--height", "64"]) == 0
    out = capsys.readouterr().out
    assert "inf" not in out.replace("info", "") and "measured (1)" in out  # the good record still speaks
    warned = [r.message for r in caplog.records if "set aside 1 of 2 records" in r.message]
    assert len(warned) == 1 and f"{field} " in warned[0]


@pytest.mark.parametrize("argv", [["plan", "--ram", "99999999999TB"], ["plan", "--vram", "2000TiB"],
                                  ["generate", "a fox", "--ram-budget", "99999999999TB"]])
def test_an_absurd_size_is_bad_input_naming_the_value_and_the_limit(argv, tiny_path, tmp_path, capsys):
    assert main([*argv, "--model", "tiny", *(["--outdir", str(tmp_path)] if argv[0] == "generate" else [])]) == 2
    err = capsys.readouterr().err
    assert argv[-1] in err and "at most 1 PiB" in err and "GiB of RAM usable" not in err


def test_parse_size_takes_up_to_one_pebibyte():
    from lowvram_gen.errors import InvalidRequest
    from lowvram_gen.hardware.bytesize import parse_size

    assert parse_size("1024TiB") == 1024**5 and parse_size(1024**5) == 1024**5
    for bad in ("1025TB", 1024**5 + 1, float("inf"), float("nan")):
        with pytest.raises(InvalidRequest, match="at most 1 PiB"):
            parse_size(bad, "--ram")


def _leftover(folder: Path, name: str, age_s: float) -> Path:
    import os
    import time

    path = folder / name
    path.write_bytes(b"\x89PNG half")
    os.utime(path, (time.time() - age_s,) * 2)
    return path


def test_a_killed_generates_temp_files_are_removed_by_the_next_run_in_that_folder(tmp_path, tiny_path):
    out = tmp_path / "out"
    out.mkdir()
    stale = _leftover(out, ".00000-1-a-fox.png.0123456789ab.tmp", 3600)  # a generate killed an hour ago
    live = _leftover(out, ".00000-2-a-fox.png.ba9876543210.tmp", 1)  # another process writing now
    foreign = [_leftover(out, name, 3600) for name in (".notes.tmp", "mine.tmp", ".x.png.0123456789ab.tmp.bak")]
    assert main(["generate", "a fox", "--model", "tiny", *SMALL, "--outdir", str(out)]) == 0
    assert not stale.exists() and live.exists() and all(p.exists() for p in foreign)


def test_write_atomically_removes_the_stale_temp_files_of_its_own_file_only(tmp_path):
    from lowvram_gen.paths import write_atomically

    stale = _leftover(tmp_path, ".timings.json.ab_cd123.tmp", 3600)
    live = _leftover(tmp_path, ".timings.json.zz_yy987.tmp", 1)
    other = _leftover(tmp_path, ".failures.json.ab_cd123.tmp", 3600)  # another file's: its own writes clean it
    write_atomically(tmp_path / "timings.json", "[]")
    assert not stale.exists() and live.exists() and other.exists()
    assert (tmp_path / "timings.json").read_text() == "[]"
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".timings")] == [live.name]
