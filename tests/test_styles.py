"""A1111's saved styles (issue 32 item 2): styles.csv read as A1111 reads it, applied to the prompts once by the
Session (every front sets the request's `styles`), saved atomically with a backup, taken back out of a PNG's prompts,
and reached from the CLI (--style, --styles-file), batch lines, the API (`styles`, GET /prompt-styles, webuiapi).
The rules are A1111's modules/styles.py (its `{prompt}` placeholder, ", " between prompt and style, the order)."""

from __future__ import annotations

import json
import os

import pytest
import requests

from lowvram_gen.a1111.infotext import from_png
from lowvram_gen.batch.files import expand, parse_options, read_entries, request_hash
from lowvram_gen.batch.files import Entry
from lowvram_gen.errors import InvalidRequest
from lowvram_gen.outputs import read_png_metadata
from lowvram_gen.prompting import styles as st
from lowvram_gen.request import GenerationRequest
from lowvram_gen.session import Session

CSV = ('\ufeffname,prompt,negative_prompt\r\n'
       'Film,"{prompt}, film grain, 35mm",blurry\r\n'
       'Vivid,"vivid colors, sharp",\r\n'
       '# a comment row,ignored,\r\n'
       '\r\n'
       'Wrap,"masterpiece, {prompt}","lowres, {prompt}"\r\n')


@pytest.fixture()
def styles_csv(tmp_path):
    path = tmp_path / "styles.csv"
    path.write_text(CSV, encoding="utf-8", newline="")
    return path


def test_a1111s_file_is_read_bom_quotes_comments_and_empty_rows(styles_csv):
    book = st.read(styles_csv)
    assert book.names == ["Film", "Vivid", "Wrap"]  # the comment and the empty row skipped, the BOM not in a name
    assert book.styles["Film"] == st.Style("Film", "{prompt}, film grain, 35mm", "blurry")
    assert book.styles["Vivid"].negative_prompt == ""


def test_the_old_name_text_columns_and_a_missing_file(tmp_path):
    old = tmp_path / "old.csv"
    old.write_text("name,text\nInk,ink drawing\n", encoding="utf-8")
    assert st.read(old).styles == {"Ink": st.Style("Ink", "ink drawing", "")}
    assert st.read(tmp_path / "none.csv").styles == {}  # A1111's: no file, no styles


@pytest.mark.parametrize("text,line,says", [
    ("name,prompt,negative_prompt\nA,a, b,c,d\n", 2, "5 cells where the header has 3"),
    ("title,words\nA,a\n", 1, "the header is 'title,words'"),
    ('name,prompt,negative_prompt\nA,"open quote,x\n', 2, "not CSV"),
])
def test_a_malformed_file_is_one_error_naming_the_file_and_the_line(tmp_path, text, line, says):
    path = tmp_path / "styles.csv"
    path.write_text(text, encoding="utf-8")
    with pytest.raises(InvalidRequest) as exc:
        st.read(path)
    assert str(path) in str(exc.value) and f"line {line}: " in str(exc.value) and says in str(exc.value)


def test_placeholder_append_and_the_order_of_several_styles(styles_csv):
    book = st.read(styles_csv)
    assert book.expand("a cat", "ugly", ["Film"]) == ("a cat, film grain, 35mm", "ugly, blurry")
    assert book.expand("a cat", "", ["Vivid"]) == ("a cat, vivid colors, sharp", "")
    assert book.expand("", "", ["Vivid"]) == ("vivid colors, sharp", "")  # an empty prompt adds no ", "
    # in the order given, each style applied to the result of the one before (A1111's apply_styles_to_prompt)
    assert book.expand("a cat", "x", ["Vivid", "Wrap"]) == ("masterpiece, a cat, vivid colors, sharp", "lowres, x")
    assert book.expand("a cat", "x", ["Wrap", "Vivid"]) == ("masterpiece, a cat, vivid colors, sharp", "lowres, x")
    assert book.expand("a cat", "x", ["Wrap", "Film"]) == ("masterpiece, a cat, film grain, 35mm",
                                                           "lowres, x, blurry")
    assert book.expand("a cat", "x", ["Film", "Wrap"]) == ("masterpiece, a cat, film grain, 35mm",
                                                           "lowres, x, blurry")
    assert st.merge("{prompt} and {prompt}", "a") == "a and a"  # every placeholder


def test_an_unknown_style_is_refused_naming_it_and_the_styles_there(styles_csv, tmp_path):
    with pytest.raises(InvalidRequest) as exc:
        st.read(styles_csv).expand("x", "", ["Film", "Noir"])
    assert str(exc.value) == (f"invalid style: 'Noir'; no such style in {styles_csv}; the styles there: Film, Vivid, "
                              "Wrap")
    with pytest.raises(InvalidRequest, match="that file does not exist"):
        st.read(tmp_path / "none.csv").check(["Film"])


def test_saving_keeps_the_other_rows_a_backup_and_replaces_by_name(styles_csv):
    before = styles_csv.read_bytes()
    book = st.save(styles_csv, st.Style("Noir", "{prompt}, black and white, \"noir\"", "color"))
    assert (styles_csv.parent / "styles.csv.bak").read_bytes() == before  # A1111's backup
    assert styles_csv.read_bytes().startswith(b"\xef\xbb\xbfname,prompt,negative_prompt\r\n")  # A1111's utf-8-sig
    again = st.read(styles_csv)
    assert again.names == ["Film", "Vivid", "Wrap", "Noir"] == book.names
    assert again.styles["Noir"].prompt == "{prompt}, black and white, \"noir\""  # quotes and commas survive
    st.save(styles_csv, st.Style("Film", "grainy", ""))
    assert st.read(styles_csv).styles["Film"] == st.Style("Film", "grainy", "")
    assert st.read(styles_csv).names == ["Film", "Vivid", "Wrap", "Noir"]  # replaced in place
    with pytest.raises(InvalidRequest, match="give the style a name"):
        st.save(styles_csv, st.Style("  ", "x"))


def test_a_save_that_fails_half_way_leaves_the_old_file_whole(styles_csv, monkeypatch):
    before = styles_csv.read_bytes()

    def crash(src, dst):  # simulates a crash between writing the temporary file and the rename
        raise OSError("simulated crash")

    monkeypatch.setattr(os, "replace", crash)
    with pytest.raises(OSError):
        st.save(styles_csv, st.Style("Noir", "noir"))
    assert styles_csv.read_bytes() == before
    assert [p.name for p in styles_csv.parent.iterdir() if p.name.endswith(".tmp")] == []


def test_a_malformed_file_is_not_written_over(tmp_path):
    path = tmp_path / "styles.csv"
    path.write_text("name,prompt\nA,a,b,c\n", encoding="utf-8")
    with pytest.raises(InvalidRequest, match="line 2"):
        st.save(path, st.Style("B", "b"))
    assert path.read_text(encoding="utf-8") == "name,prompt\nA,a,b,c\n"


def test_the_session_applies_the_styles_once_before_the_plan(styles_csv):
    session = Session(styles_file=str(styles_csv))
    request = GenerationRequest(prompt="a cat", negative_prompt="x", styles=["Film", "Vivid"], hires_scale=1.5,
                                hires_prompt="a dog").validated()
    assert request.styles == ("Film", "Vivid")
    done = session.with_styles(request)
    assert (done.prompt, done.negative_prompt) == ("a cat, film grain, 35mm, vivid colors, sharp", "x, blurry")
    assert done.hires_prompt == "a dog, film grain, 35mm, vivid colors, sharp"  # A1111 styles the hires prompt too
    assert done.hires_negative == ""  # "": the (styled) negative prompt
    assert done.styles == () and done.extra["styles"] == ["Film", "Vivid"]
    assert session.with_styles(done) == done  # applied once: a second pass changes nothing
    assert GenerationRequest(styles="Film, Vivid,").validated().styles == ("Film", "Vivid")  # a CSV cell's text


def test_the_file_is_read_again_when_it_changes(styles_csv):
    session = Session(styles_file=str(styles_csv))
    assert "Noir" not in session.style_book().names
    session.save_style("Noir", "noir", "")
    assert session.style_book().names[-1] == "Noir"
    styles_csv.write_text("name,prompt\nOnly,one\n", encoding="utf-8")  # another program's edit
    assert session.style_book().names == ["Only"]


def test_taking_styles_out_of_a_prompt_inverts_applying_them(styles_csv):
    book = st.read(styles_csv)
    for names in (["Film"], ["Vivid", "Film"], ["Film", "Vivid"], ["Wrap", "Film", "Vivid"]):
        prompt, negative = book.expand("a cat", "ugly", names)
        assert book.extract(prompt, negative) == (names, "a cat", "ugly")
    # Vivid then Wrap makes what Wrap then Vivid makes: either order found applies back to the same prompts
    found, prompt, negative = book.extract(*book.expand("a cat", "ugly", ["Vivid", "Wrap"]))
    assert sorted(found) == ["Vivid", "Wrap"] and book.expand(prompt, negative, found) == \
        book.expand("a cat", "ugly", ["Vivid", "Wrap"])
    assert book.extract("a cat", "ugly") == ([], "a cat", "ugly")
    # the style's text must end the prompt after ", " (or be all of it): "sharp" is not taken out of "unsharp"
    assert book.extract("a cat, vivid colors, sharp", "")[0] == ["Vivid"]
    assert book.extract("a catvivid colors, sharp", "")[0] == []
    assert book.extract("a cat, vivid colors, sharp", "blurry") == (["Vivid"], "a cat", "blurry")  # no negative text
    # Film needs its negative text in the negative prompt too, as A1111's extract_style_from_prompts asks
    assert book.extract("a cat, film grain, 35mm", "ugly")[0] == []


def test_generate_with_style_flags_and_the_png_round_trip(styles_csv, tmp_path, capsys):
    from lowvram_gen.cli.main import main

    out = tmp_path / "out"
    code = main(["generate", "a cat", "--style", "Film", "--style", "Vivid", "--negative", "ugly", "--steps", "1",
                 "--width", "64", "--height", "64", "--seed", "3", "--cpu", "--json", "--outdir", str(out),
                 "--styles-file", str(styles_csv)])
    assert code == 0
    image = json.loads(capsys.readouterr().out)["images"][0]
    text, ours = read_png_metadata(image)
    assert text.startswith("a cat, film grain, 35mm, vivid colors, sharp\nNegative prompt: ugly, blurry\n")
    assert "Styles" not in text  # A1111 writes the expanded prompts, not the styles' names
    assert ours["request"]["extra"]["styles"] == ["Film", "Vivid"]
    back = from_png(image, styles=st.read(styles_csv))  # PNG Info / --from-png: the styles taken back out
    assert (back.fields["prompt"], back.fields["negative_prompt"], back.fields["styles"]) == \
        ("a cat", "ugly", ("Film", "Vivid"))
    assert from_png(image).fields["prompt"] == "a cat, film grain, 35mm, vivid colors, sharp"  # without a file
    # the rerun applies them once: the same prompt, not doubled
    rerun = Session(styles_file=str(styles_csv)).with_styles(GenerationRequest(**back.fields).validated())
    assert rerun.prompt == "a cat, film grain, 35mm, vivid colors, sharp" and rerun.negative_prompt == "ugly, blurry"


def test_an_unknown_style_flag_is_exit_2_naming_it(styles_csv, capsys):
    from lowvram_gen.cli.main import main

    assert main(["generate", "x", "--style", "Noir", "--cpu", "--styles-file", str(styles_csv)]) == 2
    assert "invalid style: 'Noir'; no such style in" in capsys.readouterr().err


def test_batch_lines_name_styles_and_lines_without_keep_their_hash(styles_csv, tmp_path):
    fields, warnings = parse_options('--prompt "a cat" --styles "Film, Vivid" --seed 5')
    assert warnings == [] and fields["styles"] == "Film, Vivid"
    jobs = expand([Entry(1, fields), Entry(2, {"prompt": "a cat", "seed": 5, "styles": "Noir"})], {},
                  styles=st.StylesFile(styles_csv))
    assert jobs.jobs[0].request.styles == ("Film", "Vivid") and jobs.jobs[0].request.prompt == "a cat"
    assert [b.line for b in jobs.bad] == [2] and "no such style" in jobs.bad[0].error
    assert request_hash("sd", GenerationRequest(prompt="a cat", seed=5).validated()) == "3888bfeb5c2d8f9b"  # as before
    assert jobs.jobs[0].request_hash != "3888bfeb5c2d8f9b"
    jsonl = tmp_path / "p.jsonl"
    jsonl.write_text('{"prompt": "a cat", "styles": ["Wrap"]}\n', encoding="utf-8")
    assert expand(read_entries(jsonl), {}).jobs[0].request.styles == ("Wrap",)


# -- the API ----------------------------------------------------------------------------------------------------------

webuiapi = pytest.importorskip("webuiapi", reason="the test extra's webuiapi is not installed: pip install -e .[test]")


@pytest.fixture(scope="module")
def styled_server(tmp_path_factory):
    from servers import Server

    folder = tmp_path_factory.mktemp("styles-api")
    (folder / "styles.csv").write_text(CSV, encoding="utf-8", newline="")
    srv = Server(folder, api=True, webui=False)
    srv.session.styles_file = st.StylesFile(folder / "styles.csv")
    yield srv
    srv.close()


def test_api_styles_and_prompt_styles_through_webuiapi(styled_server):
    api = styled_server.client()
    listed = api.get_prompt_styles()
    assert listed[0] == {"name": "Film", "prompt": "{prompt}, film grain, 35mm", "negative_prompt": "blurry"}
    assert [s["name"] for s in listed] == ["Film", "Vivid", "Wrap"]
    result = api.txt2img(prompt="a cat", negative_prompt="ugly", styles=["Film"], steps=1, width=64, height=64,
                         seed=4)
    assert result.info["infotexts"][0].startswith("a cat, film grain, 35mm\nNegative prompt: ugly, blurry\n")
    assert result.info["styles"] == ["Film"] and result.info["prompt"] == "a cat"  # A1111's: p.prompt, p.styles
    assert "not used" not in " ".join(result.info["warnings"])
    assert result.image.info["parameters"].startswith("a cat, film grain, 35mm\n")


def test_api_unknown_style_is_422_naming_it(styled_server):
    answer = requests.post(f"{styled_server.api_url}/txt2img", json={"prompt": "x", "styles": ["Noir"]}, timeout=60)
    assert answer.status_code == 422
    detail = answer.json()["detail"][0]
    assert detail["loc"] == ["body", "styles"] and "'Noir'" in detail["msg"] and "Film, Vivid, Wrap" in detail["msg"]


def test_api_png_info_takes_the_styles_out_as_a1111s_parser(styled_server, tmp_path):
    import base64

    api = styled_server.client()
    result = api.txt2img(prompt="a dog", negative_prompt="", styles=["Vivid", "Film"], steps=1, width=64, height=64)
    buffer = tmp_path / "made.png"
    result.image.save(buffer, pnginfo=_text_chunk(result.image.info["parameters"]))
    answer = requests.post(f"{styled_server.api_url}/png-info",
                           json={"image": base64.b64encode(buffer.read_bytes()).decode()}, timeout=60).json()
    assert answer["info"].startswith("a dog, vivid colors, sharp, film grain, 35mm\n")  # the text as written
    assert (answer["parameters"]["Prompt"], answer["parameters"]["Negative prompt"]) == ("a dog", "")
    assert answer["parameters"]["Styles array"] == ["Vivid", "Film"]


def _text_chunk(text: str):
    from PIL.PngImagePlugin import PngInfo

    info = PngInfo()
    info.add_text("parameters", text)
    return info
