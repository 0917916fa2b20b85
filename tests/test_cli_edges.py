"""Rough edges a new user hit at the command line: each has a test here that failed before its fix
(a few guards beside them pin what the fix must not change: a free port, sizes the user gives).

In-process `main([...])` where that shows it; a subprocess where the point is what a shell sees (a
closed pipe, what got imported, the exit status). Nothing here starts gradio or loads a real model.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from lowvram_gen.cli.main import build_parser, main
from lowvram_gen.hardware.device import GiB, MiB

ROOT = Path(__file__).resolve().parent.parent


def cli_env(**extra) -> dict:
    """The environment of a `python -m lowvram_gen` child: offline, this worktree's code first."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(ROOT), **extra}
    return {k: v for k, v in env.items() if v is not None}


# ------------------------------------------------------------------------------- 1: --port


@pytest.fixture
def no_gradio(monkeypatch):
    """The error cases must end before the UI is built or served."""
    import lowvram_gen.server as launch_mod

    def must_not_start(*args, **kwargs):
        raise AssertionError("gradio was started")

    monkeypatch.setattr(launch_mod, "launch", must_not_start)


@pytest.mark.parametrize("argv", [["ui", "--port", "0"], ["ui", "--port", "65536"], ["ui", "--port", "http"],
                                  ["--port", "99999"], ["--port", "-1"]])
def test_a_port_outside_1_to_65535_is_a_clear_error(capsys, no_gradio, argv):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: invalid --port:") and "from 1 to 65535" in err


def test_a_busy_port_is_named_before_gradio_starts(capsys, no_gradio):
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as held:
        held.bind(("127.0.0.1", 0))
        held.listen(1)
        port = held.getsockname()[1]
        assert main(["--port", str(port)]) == 2
    err = capsys.readouterr().err
    assert f"invalid --port: {port}; in use on 127.0.0.1" in err and "1 to 65535" in err


def test_a_free_port_is_passed_to_the_ui(monkeypatch):
    import lowvram_gen.session as session_mod
    import lowvram_gen.server as launch_mod

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    seen = {}
    monkeypatch.setattr(session_mod, "Session", lambda **kw: None)
    monkeypatch.setattr(launch_mod, "launch", lambda *a, **kw: seen.update(kw))
    assert main(["ui", "--port", f" {port}", "--cpu"]) == 0
    assert seen["port"] == port


# ------------------------------------------------------------------------- 2: a closed stdout


@pytest.mark.parametrize("reader,unbuffered", [("head -1", "1"), ("head -n 0", None)])
def test_plan_into_a_pipe_closed_early_ends_quietly(reader, unbuffered):
    """`head -1` is the user's case (line-at-a-time writes race head's exit); `head -n 0` closes the
    pipe before the first write, so the broken pipe happens every time."""
    command = (f"set -o pipefail; {shlex.quote(sys.executable)} -m lowvram_gen plan --vram 4GiB --model sd15 "
               f"| {reader}")
    done = subprocess.run(["bash", "-c", command], cwd=ROOT, env=cli_env(PYTHONUNBUFFERED=unbuffered),
                          capture_output=True, text=True, timeout=120)
    assert done.stderr == ""  # no traceback, no "Exception ignored ... BrokenPipeError"
    if reader == "head -1":
        assert done.stdout.startswith("device:") and done.stdout.count("\n") == 1
        assert done.returncode in (0, 141)  # 0 when head read everything before it left
    else:
        assert done.stdout == "" and done.returncode == 141


# ------------------------------------------------------------------------- 3: sizes for people


def test_plan_prints_sizes_for_people_and_the_card_as_typed(capsys):
    assert main(["plan", "--vram", "4GB", "--model", "sd15"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("device: simulated 4GB card; usable 3.5 GiB (free 4.0 GiB, reserve 512 MiB)")
    assert not re.search(r"\d{6,}", out), out  # no byte counts
    assert not re.search(r"\d\.\d{2,} ?GiB", out), out  # no 3.72529 GiB
    rows = [line for line in out.splitlines() if line[3:].split(" ")[0] in ("highvram", "medvram", "lowvram", "novram")]
    assert len(rows) == 4 and all(re.search(r" \d+(\.\d)? (GiB|MiB) ", row) for row in rows), rows
    assert "\nwould run: highvram (fastest candidate whose estimate fits the 3.5 GiB usable" in out


def test_plan_json_keeps_exact_bytes(capsys):
    assert main(["plan", "--vram", "4GB", "--reserve-vram", "512MB", "--model", "sd15", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    device = data["device"]
    exact = (device["total_bytes"], device["free_bytes"], device["usable_bytes"])
    assert exact == (4 * GiB, 4 * GiB, 4 * GiB - 512 * MiB)
    assert all(type(p["estimate_bytes"]) is int for p in data["presets"])


def test_a_size_of_bare_number_is_shown_in_gib(capsys):
    assert main(["plan", "--vram", "6", "--model", "sd15"]) == 0
    assert capsys.readouterr().out.startswith("device: simulated 6 GiB card; usable 5.5 GiB")


# ----------------------------------------------------------------- 4: the model's native size


@pytest.mark.parametrize("model,side", [("sd15", 512), ("sd21", 768), ("sdxl", 1024), ("sd3", 1024), ("flux", 1024),
                                        ("stabilityai/stable-diffusion-xl-base-1.0", 1024), ("sd-2.1", 768)])
def test_plan_defaults_to_the_models_native_size(capsys, model, side):
    assert main(["plan", "--vram", "24GiB", "--model", model, "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert (data["width"], data["height"]) == (side, side)


def test_plan_sizes_the_user_gives_still_win(capsys):
    assert main(["plan", "--vram", "24GiB", "--model", "sdxl", "--width", "832", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert (data["width"], data["height"]) == (832, 1024)
    assert main(["plan", "--vram", "24GiB", "--model", "sdxl", "--width", "1003"]) == 2  # checked before the profile


def test_plan_of_a_folder_of_no_known_architecture_stays_at_512(capsys, tiny_path):
    assert main(["plan", "--vram", "8GiB", "--model", str(tiny_path), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert (data["width"], data["height"]) == (512, 512)


# -------------------------------------------- 5, 6: generate takes plan's names; whole sentences


@pytest.mark.parametrize("alias,hub_id", [
    ("sd15", "stable-diffusion-v1-5/stable-diffusion-v1-5"), ("SD1.5", "stable-diffusion-v1-5/stable-diffusion-v1-5"),
    ("sd21", "stabilityai/stable-diffusion-2-1"), ("sdxl", "stabilityai/stable-diffusion-xl-base-1.0"),
    ("sd3", "stabilityai/stable-diffusion-3-medium-diffusers"), ("flux-dev", "black-forest-labs/FLUX.1-dev"),
])
def test_the_short_names_plan_takes_resolve_to_their_hub_ids(alias, hub_id):
    from lowvram_gen.errors import ModelLoadError
    from lowvram_gen.models.resolve import resolve

    with pytest.raises(ModelLoadError) as info:  # offline, and the test's HF cache is empty
        resolve(alias)
    message = str(info.value)
    assert f"could not get the model {hub_id!r} (--model {alias})" in message
    assert f"`hf download {hub_id}`" in message


def test_every_short_name_of_plan_has_a_hub_id():
    from lowvram_gen import families
    from lowvram_gen.models.resolve import alias_hub_id

    hub_ids = {f.builtin: f.hub_id for f in families.builtin_families()}
    assert all(hub_ids.values()) and set(hub_ids) == set(families.builtin_names())
    hub_ids_in_aliases = {name: key for name, key in families.aliases().items() if "/" in name}
    for key, hub_id in hub_ids.items():
        assert hub_ids_in_aliases[hub_id.lower()] == key  # plan knows the id generate loads
        assert alias_hub_id(key) == hub_id


def test_generate_with_a_short_name_offline_says_what_to_download(capsys):
    assert main(["generate", "a fox", "--model", "sd15", "--steps", "1", "--cpu"]) == 2
    err = capsys.readouterr().err
    assert "'stable-diffusion-v1-5/stable-diffusion-v1-5' (--model sd15)" in err
    assert "hf download stable-diffusion-v1-5/stable-diffusion-v1-5" in err


def _ends_in_a_whole_sentence(message: str) -> bool:
    return message.endswith(".") and message.count("(") == message.count(")") and message.count("`") % 2 == 0


def test_a_missing_hub_model_is_explained_in_whole_sentences():
    from lowvram_gen.errors import ModelLoadError
    from lowvram_gen.models.resolve import resolve

    with pytest.raises(ModelLoadError) as info:
        resolve("stabilityai/stable-diffusion-2-1")
    message = str(info.value)
    assert message.startswith("could not get the model 'stabilityai/stable-diffusion-2-1': it is not in the local "
                              "Hugging Face cache, and HF_HUB_OFFLINE is set. ")
    assert _ends_in_a_whole_sentence(message), message


def test_an_unknown_hub_failure_gives_its_first_whole_sentence(monkeypatch):
    import diffusers

    from lowvram_gen.errors import ModelLoadError
    from lowvram_gen.models.resolve import resolve

    def fail(repo_id):
        raise OSError("Cannot load model x/y: the folder (see https://hf.co/x/y. or the docs.) is odd. "
                      + "More detail follows. " * 30)

    monkeypatch.setattr(diffusers.DiffusionPipeline, "download", fail)
    with pytest.raises(ModelLoadError) as info:
        resolve("x/y")
    message = str(info.value)
    assert "'x/y': Cannot load model x/y: the folder (see https://hf.co/x/y. or the docs.) is odd. Download" in message
    assert "More detail" not in message and _ends_in_a_whole_sentence(message)


# ------------------------------------------------------------ 7: a wrong --preset fails at once


@pytest.mark.parametrize("argv", [["generate", "a fox", "--preset", "nope"],
                                  ["generate", "a fox", "--preset", "missing/mine.toml"],
                                  ["batch", "prompts.txt", "--preset", "nope"]])
def test_an_unknown_preset_fails_before_torch_is_imported(argv):
    code = ("import sys; from lowvram_gen.cli.main import main; code = main(sys.argv[1:]); "
            "print(code, 'torch' in sys.modules, 'diffusers' in sys.modules)")
    done = subprocess.run([sys.executable, "-c", code, *argv], cwd=ROOT, env=cli_env(), capture_output=True,
                          text=True, timeout=120)
    assert done.stdout.split() == ["2", "False", "False"], done.stderr
    if "nope" in argv:
        assert "unknown preset 'nope'; available: highvram, medvram, budget, lowvram, novram, cpu" in done.stderr
    else:
        assert "cannot read preset missing/mine.toml" in done.stderr


# ------------------------------------------------------------------- 9: --version, help everywhere


@pytest.mark.parametrize("argv", [["--version"], ["-v", "--version"]])
def test_version_prints_the_package_version_and_exits_0(capsys, argv):
    from importlib.metadata import version

    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    assert exit_info.value.code == 0
    assert capsys.readouterr().out.strip() == f"lowvram-gen {version('lowvram-gen')}"


def _options_without_help(parser: argparse.ArgumentParser, where: str):
    for action in parser._actions:
        if isinstance(action, argparse._HelpAction):
            continue
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from _options_without_help(sub, f"{where} {name}")
        elif not (action.help or "").strip() or action.help == argparse.SUPPRESS:
            yield f"{where} {'/'.join(action.option_strings) or action.dest}"


def test_every_option_and_argument_of_every_subcommand_has_help():
    assert list(_options_without_help(build_parser(), "lowvram-gen")) == []


def test_quantize_flag_reaches_the_png_and_from_png_keeps_it(tmp_path, capsys):
    """--quantize int8 is written as A1111's field `Quantize: int8`, and --from-png reruns it quantized."""
    from lowvram_gen.outputs import read_png_metadata

    args = ["generate", "a fox", "--width", "64", "--height", "64", "--steps", "1", "--seed", "5",
            "--outdir", str(tmp_path), "--json", "--cpu"]
    assert main([*args, "--quantize", "int8"]) == 0
    first = json.loads(capsys.readouterr().out)["images"][0]
    assert "Quantize: int8" in read_png_metadata(first)[0]
    assert main(["generate", "--from-png", first, "--outdir", str(tmp_path), "--json", "--cpu"]) == 0
    again = json.loads(capsys.readouterr().out)["images"][0]
    assert "Quantize: int8" in read_png_metadata(again)[0]
    assert main([*args, "--quantize", "int3"]) == 2
    err = capsys.readouterr().err
    assert "quantize" in err and "'int3'" in err and "int8" in err


def test_clip_skip_flag_reaches_the_png_and_bad_values_exit_2(tmp_path, capsys):
    """--clip-skip N (A1111's Clip skip, issue 19) is written as `Clip skip: N`; 0, 13 or text, and a clip skip deeper
    than the model's text encoder (the tiny one has 2 layers), exit 2 naming the value and what is allowed."""
    from lowvram_gen.outputs import parse_a1111_parameters, read_png_metadata

    args = ["generate", "a fox", "--width", "64", "--height", "64", "--steps", "1", "--seed", "5",
            "--outdir", str(tmp_path), "--json", "--cpu"]
    assert main([*args, "--clip-skip", "2"]) == 0
    made = json.loads(capsys.readouterr().out)["images"][0]
    text, ours = read_png_metadata(made)
    assert parse_a1111_parameters(text)["Clip skip"] == "2" and ours["request"]["clip_skip"] == 2
    for bad in ("0", "13", "two"):
        assert main([*args, "--clip-skip", bad]) == 2
        err = capsys.readouterr().err
        assert f"invalid clip skip: {bad if bad.isdigit() else repr(bad)};" in err and "from 1 to 12 (1: off" in err
    assert main([*args, "--clip-skip", "4"]) == 2
    assert "text encoder has 2 layers: use a clip skip from 1 to 3" in capsys.readouterr().err
