"""Precision the user asked for (issue 29 item 14): a named preset runs as its file says, and A1111's --no-half,
--no-half-vae, --upcast-sampling and --precision reach the plan, the loaded pipeline's dtypes and what the job says
ran, on every command that runs jobs."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
from PIL import Image

from lowvram_gen.cli.main import _session_kwargs, build_parser, main
from lowvram_gen.errors import PresetError
from lowvram_gen.hardware import device as device_mod
from lowvram_gen.hardware.hostmem import simulated_host
from lowvram_gen.models import profile as profiles
from lowvram_gen.outputs import parse_a1111_parameters, read_png_metadata
from lowvram_gen.planning.estimate import estimate
from lowvram_gen.planning.planner import plan
from lowvram_gen.presets import find_preset, load_presets
from lowvram_gen.request import GenerationRequest
from lowvram_gen.session import Session
from lowvram_gen.settings import Precision

SMALL = ["--width", "64", "--height", "64", "--steps", "2", "--seed", "3"]


@pytest.fixture()
def bf16_cpu(monkeypatch):
    """A CPU with bfloat16 instructions, where the planner's automatic pick is cpu+bf16."""
    monkeypatch.setenv("LOWVRAM_GEN_CPU_BF16", "1")


def _cpu(ram: str, bf16: bool = True):
    return replace(device_mod.probe("cpu"), host=simulated_host(ram), bf16=bf16)


def _preset_field(png) -> str:
    """The preset the PNG's A1111 text says made it."""
    return parse_a1111_parameters(read_png_metadata(png)[0])["Lowvram preset"]


def _plan_json(capsys, *argv) -> dict:
    assert main(["plan", "--model", "tiny", "--width", "64", "--height", "64", "--json", *argv]) == 0
    return json.loads(capsys.readouterr().out)


# ----------------------------------------------------------------------------------- a named preset, as named


def test_a_named_cpu_preset_runs_float32_where_the_automatic_pick_is_bf16(bf16_cpu, capsys):
    assert _plan_json(capsys)["preset"] == "cpu+bf16"  # the planner's own pick on this CPU
    for named in (["--cpu"], ["--preset", "cpu"]):
        data = _plan_json(capsys, *named)
        assert data["preset"] == "cpu" and not any("bf16" in p["name"] for p in data["presets"])
        assert data["reason"].startswith("forced by the user: cpu")


def test_a_named_cpu_preset_computes_in_float32_and_stores_its_weights_as_the_ram_allows():
    sdxl = profiles.profile_builtin("sdxl")
    assert plan(_cpu("64GiB"), sdxl, 512, 512, 1, load_presets()).preset.name == "cpu+bf16"
    roomy = plan(_cpu("64GiB"), sdxl, 512, 512, 1, load_presets(), forced=find_preset("cpu"))
    assert roomy.preset.name == "cpu" and roomy.preset.memory.dtype == "float32"
    assert not any("bf16" in e.name for e in roomy.estimates)
    tight = plan(_cpu("12GiB"), sdxl, 512, 512, 1, load_presets(), forced=find_preset("cpu"))
    assert tight.preset.name == "cpu+half" and tight.preset.memory.dtype == "float32"


def test_a_named_preset_generates_as_named_and_what_ran_says_so(bf16_cpu, tmp_path, capsys):
    assert main(["generate", "x", *SMALL, "--cpu", "--outdir", str(tmp_path), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["preset"] == "cpu" and "cpu+bf16" not in out["summary"]
    assert _preset_field(out["images"][0]) == "cpu"


# ------------------------------------------------------------------------------------------ parsing the flags


@pytest.mark.parametrize("command", [["generate", "x"], ["img2img", "x", "--init", "i.png"],
                                     ["inpaint", "x", "--init", "i.png", "--mask", "m.png"], ["batch", "p.txt"],
                                     ["ui"], ["plan"]])
@pytest.mark.parametrize("flags, expected", [
    (["--no-half"], Precision(full=True)), (["--precision", "full"], Precision(full=True)),
    (["--precision", "autocast"], Precision()), (["--no-half-vae"], Precision(no_half_vae=True)),
    (["--upcast-sampling"], Precision(upcast_sampling=True)),
    (["--no-half-vae", "--upcast-sampling"], Precision(no_half_vae=True, upcast_sampling=True))])
def test_every_job_command_takes_the_precision_flags_to_its_session(command, flags, expected):
    args = build_parser().parse_args([*command, *flags])
    assert _session_kwargs(args)["precision"] == expected


def test_autocast_beside_no_half_is_refused_naming_both(capsys):
    assert main(["plan", "--model", "tiny", "--no-half", "--precision", "autocast"]) == 2
    err = capsys.readouterr().err
    assert "--precision autocast" in err and "--no-half" in err
    with pytest.raises(PresetError):
        Precision.from_flags(no_half=True, precision="autocast")


def test_no_half_wins_over_a_preset_that_names_float16_and_over_upcast_sampling():
    """As in A1111: --no-half makes every preset float32, a named one too (fp8 storage, 16-bit only, goes), and
    --upcast-sampling has no effect beside it."""
    session = Session(preset="novram", precision=Precision(full=True, upcast_sampling=True))
    forced = session.forced_preset()
    assert forced.name == "novram+no-half" and forced.memory.dtype == "float32" and not forced.memory.fp8_storage
    assert not forced.memory.upcast_attention
    assert all(p.memory.dtype == "float32" for p in session.presets().values())


# ------------------------------------------------------------------------------------------------ the plan


def test_no_half_counts_float32_weights_and_the_planner_picks_a_cheaper_offload(capsys):
    half = json.loads(_run(capsys, "plan", "--model", "sd15", "--vram", "4GB", "--ram", "64GB", "--json"))
    full = json.loads(_run(capsys, "plan", "--model", "sd15", "--vram", "4GB", "--ram", "64GB", "--json",
                           "--no-half"))
    assert half["preset"] == "highvram"
    assert full["preset"] != "highvram+no-half" and full["preset"].split("@")[0].endswith("+no-half")
    by = {p["name"]: p for p in full["presets"]}
    assert not by["highvram+no-half"]["fits"]
    own = {p["name"]: p for p in half["presets"]}
    assert by["highvram+no-half"]["estimate_bytes"] > own["highvram"]["estimate_bytes"] * 1.7  # weights at 4 bytes


def _run(capsys, *argv) -> str:
    assert main(list(argv)) == 0
    return capsys.readouterr().out


def test_no_half_vae_counts_the_vae_at_four_bytes():
    sd15 = profiles.profile_builtin("sd15")
    memory = find_preset("highvram").memory
    plain = estimate(sd15, 512, 512, 1, memory)
    vae32 = estimate(sd15, 512, 512, 1, replace(memory, vae_float32=True))
    assert vae32.total_bytes > plain.total_bytes and vae32.vae_bytes > plain.vae_bytes


def test_no_half_on_a_bf16_cpu_plans_float32(bf16_cpu, capsys):
    data = _plan_json(capsys, "--no-half")
    assert data["preset"] == "cpu" and not any("bf16" in p["name"] for p in data["presets"])


# ------------------------------------------------------------------------- the loaded pipeline and what ran


def _generate(session: Session, tmp_path, **extra):
    return session.generate(GenerationRequest(prompt="x", width=64, height=64, steps=2, seed=1,
                                              outdir=str(tmp_path), **extra))


def _dtypes(session: Session) -> dict:
    pipe = session.model.pipe
    return {name: str(getattr(pipe, name).dtype).replace("torch.", "") for name in ("unet", "vae", "text_encoder")}


@pytest.mark.parametrize("flags, preset, dtypes", [
    ([], "cpu+bf16", {"unet": "bfloat16", "vae": "bfloat16", "text_encoder": "bfloat16"}),
    (["--no-half"], "cpu", {"unet": "float32", "vae": "float32", "text_encoder": "float32"}),
    (["--precision", "full"], "cpu", {"unet": "float32", "vae": "float32", "text_encoder": "float32"}),
    (["--no-half-vae"], "cpu+bf16+no-half-vae", {"unet": "bfloat16", "vae": "float32", "text_encoder": "bfloat16"}),
    (["--upcast-sampling"], "cpu+bf16+upcast", {"unet": "bfloat16", "vae": "float32", "text_encoder": "bfloat16"}),
])
def test_the_flags_reach_the_pipelines_dtypes_and_what_ran(bf16_cpu, tmp_path, flags, preset, dtypes):
    session = Session(**_session_kwargs(build_parser().parse_args(["generate", "x", *flags])))
    result = _generate(session, tmp_path)
    assert _dtypes(session) == dtypes
    assert result.preset == preset and f"finished at {preset}" in result.summary
    assert _preset_field(result.images[0]) == preset
    again = _generate(session, tmp_path / "i2i", init_image=result.images[0], strength=0.5)  # the VAE encodes too
    assert again.preset == preset and Image.open(again.images[0]).size == (64, 64)


def test_upcast_sampling_upcasts_the_unets_attention(bf16_cpu, tmp_path):
    from diffusers.models.attention_processor import Attention

    session = Session(precision=Precision(upcast_sampling=True))
    _generate(session, tmp_path)
    attention = [m for m in session.model.pipe.unet.modules() if isinstance(m, Attention)]
    assert attention and all(m.upcast_attention and m.upcast_softmax for m in attention)


# ------------------------------------------------------------------------------------ ui and the API server


def test_ui_takes_the_precision_flags_to_the_session_the_ui_and_api_share(monkeypatch):
    import lowvram_gen.server as server_mod
    import lowvram_gen.session as session_mod

    made, launched = {}, {}
    monkeypatch.setattr(session_mod, "Session", lambda **kw: made.update(kw) or "session")
    monkeypatch.setattr(server_mod, "check_port", lambda port, host: port)
    monkeypatch.setattr(server_mod, "launch", lambda session, *a, **kw: launched.update(kw, session=session))
    assert main(["ui", "--api", "--no-half-vae", "--upcast-sampling", "--cpu"]) == 0
    assert made["precision"] == Precision(no_half_vae=True, upcast_sampling=True)
    assert launched["session"] == "session" and launched["api"]


def test_batch_and_doctor_run_with_the_precision_flags(bf16_cpu, tmp_path, capsys):
    prompts = tmp_path / "p.txt"
    prompts.write_text("a cat\n")
    assert main(["batch", str(prompts), *SMALL, "--no-half-vae", "--outdir", str(tmp_path / "o")]) == 0
    made = sorted((tmp_path / "o").rglob("*.png"))
    assert made and _preset_field(made[0]) == "cpu+bf16+no-half-vae"
    capsys.readouterr()
    assert main(["doctor", "--skip-bus", "--no-half", "--json"]) == 0
    assert set(json.loads(capsys.readouterr().out)["planner_picks"].values()) == {"cpu"}
