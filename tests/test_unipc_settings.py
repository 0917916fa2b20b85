"""Issue 31: A1111's uni_pc_* settings on every front: request fields, CLI flags, override_settings and
/sdapi/v1/options, batch lines (a job at the defaults keeps its hash), and the PNG labels A1111 gives them (written
where not the default, read back with no "not used" note)."""

from __future__ import annotations

import pytest

from lowvram_gen.a1111.api_body import map_body
from lowvram_gen.a1111.infotext import a1111_fields, request_fields
from lowvram_gen.api.state import ApiState
from lowvram_gen.errors import InvalidRequest
from lowvram_gen.outputs import a1111_parameters, parse_a1111_parameters, read_png_metadata
from lowvram_gen.request import GenerationRequest

from a1111_png import rerun_with_no_unused_note

SET = dict(unipc_variant="bh2", unipc_skip_type="logSNR", unipc_order=2, unipc_lower_order_final=False)
A1111 = {"uni_pc_variant": "bh2", "uni_pc_skip_type": "logSNR", "uni_pc_order": 2, "uni_pc_lower_order_final": False}


def test_defaults_are_a1111s_and_bad_values_are_refused_in_one_sentence():
    r = GenerationRequest().validated()
    assert (r.unipc_variant, r.unipc_skip_type, r.unipc_order, r.unipc_lower_order_final) == \
        ("bh1", "time_uniform", 3, True)
    assert GenerationRequest(unipc_skip_type="logsnr", unipc_order="2").validated().unipc_skip_type == "logSNR"
    assert GenerationRequest(unipc_variant=" vary_coeff").validated().unipc_variant == "vary_coeff"
    with pytest.raises(InvalidRequest, match=r"'bh3'.*bh1, bh2, vary_coeff"):
        GenerationRequest(unipc_variant="bh3").validated()
    with pytest.raises(InvalidRequest, match=r"'uniform'.*time_uniform, time_quadratic, logSNR"):
        GenerationRequest(unipc_skip_type="uniform").validated()
    with pytest.raises(InvalidRequest, match=r"0.*1 to 50"):
        GenerationRequest(unipc_order=0).validated()
    with pytest.raises(InvalidRequest, match="true or false"):
        GenerationRequest(unipc_lower_order_final="maybe").validated()


def _text(request):
    return a1111_parameters(request.prompt, "", a1111_fields(request, "UniPC", 5, "cpu", request.output_size()))


def test_the_png_labels_them_where_not_default_and_reads_them_back():
    default = _text(GenerationRequest(prompt="a", sampler="UniPC").validated())
    assert "UniPC" not in default.replace("Sampler: UniPC", "")
    text = _text(GenerationRequest(prompt="a", sampler="UniPC", **SET).validated())
    for label in ("UniPC variant: bh2", "UniPC skip type: logSNR", "UniPC order: 2", "UniPC lower order final: False"):
        assert label in text
    read = request_fields(parse_a1111_parameters(text))
    assert not read.ignored and not read.notes
    again = GenerationRequest(**read.fields).validated()
    assert {k: getattr(again, k) for k in SET} == SET


def test_an_a1111_png_with_them_reruns_with_them_and_no_unused_note(tmp_path, capsys):
    text = ("a fox\nSteps: 2, Sampler: UniPC, CFG scale: 7, Seed: 5, Size: 64x64, Model: tiny, UniPC variant: bh2, "
            "UniPC skip type: time_quadratic, UniPC order: 2, UniPC lower order final: False")
    out = rerun_with_no_unused_note(text, (64, 64), tmp_path, capsys)
    written, ours = read_png_metadata(out["images"][0])
    assert parse_a1111_parameters(written)["UniPC skip type"] == "time_quadratic"
    assert ours["request"]["unipc_order"] == 2 and ours["request"]["unipc_lower_order_final"] is False


def test_override_settings_and_options_set_them(tmp_path):
    def body(settings, unipc=None):
        return map_body({"prompt": "x", "override_settings": settings}, "txt2img", "tiny", 1, "out", lambda n: n,
                        unipc=unipc)

    assert body({}).request.unipc_order == 3
    mapped = body(A1111)
    assert {k: getattr(mapped.request, k) for k in SET} == SET and not mapped.warnings
    assert body({}, unipc={"unipc_order": 5}).request.unipc_order == 5  # the API's current one
    vary = body({"uni_pc_variant": "vary_coeff"})
    assert vary.request.unipc_variant == "vary_coeff" and not vary.warnings
    with pytest.raises(InvalidRequest, match="bh1, bh2, vary_coeff"):
        body({"uni_pc_variant": "bh3"})
    state = ApiState(model="tiny", outdir=str(tmp_path))
    assert state.options()["uni_pc_variant"] == "bh1" and state.options()["uni_pc_lower_order_final"] is True
    assert state.set_options(A1111) == []
    assert {k: state.options()[k] for k in A1111} == A1111
    assert state.current_unipc() == SET
    with pytest.raises(InvalidRequest, match="time_uniform"):
        state.set_options({"uni_pc_skip_type": "x"})


def test_cli_flags_set_them():
    from lowvram_gen.cli.main import _request_fields, build_parser

    args = build_parser().parse_args(["generate", "a", "--unipc-variant", "bh2", "--unipc-skip-type",
                                      "logSNR", "--unipc-order", "2", "--no-unipc-lower-order-final"])
    fields, _ = _request_fields(args)
    assert {k: fields[k] for k in SET} == {**SET, "unipc_order": "2"}


def test_a_batch_line_sets_them_and_a_default_job_keeps_its_hash(tmp_path):
    from lowvram_gen.batch.files import expand, read_entries

    path = tmp_path / "p.txt"
    path.write_text("--prompt a --sampler_name UniPC\n--prompt a --sampler_name UniPC --uni_pc_order 2 "
                    "--uni_pc_skip_type logSNR\n--prompt a --sampler_name UniPC --uni_pc_order 3\n")
    plain, changed, same = expand(read_entries(path), {"model": "tiny"}).jobs
    assert (changed.request.unipc_order, changed.request.unipc_skip_type) == (2, "logSNR")
    assert plain.request_hash == same.request_hash != changed.request_hash
