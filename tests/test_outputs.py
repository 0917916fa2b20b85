"""Output files: names from hostile prompts, never overwriting, atomic writes, A1111 metadata.

docs/FAULTS.md items 12-15. Failures of the file system (read-only, disk full, a crash mid-write) are
simulated by monkeypatching, because the tests run as root, where chmod does not stop writes.
"""

from __future__ import annotations

import ast
import errno
import json
import os
import re
import unicodedata
from datetime import date
from pathlib import Path

import pytest
from PIL import Image

from lowvram_gen import outputs
from lowvram_gen.errors import OutputError
from lowvram_gen.outputs import (
    a1111_parameters,
    default_outdir,
    next_image_path,
    parse_a1111_parameters,
    read_png_metadata,
    safe_slug,
    save_images,
    save_png,
)

FORBIDDEN = set('<>:"/\\|?*') | {chr(c) for c in range(32)} | {"\x7f"}
WINDOWS_RESERVED = {"CON", "PRN", "AUX", "NUL"} | {f"{d}{n}" for d in ("COM", "LPT") for n in "123456789¹²³"}
FIELDS = {"Steps": 20, "Sampler": "Euler a", "CFG scale": 7.0, "Seed": 1, "Size": "512x512", "Model": "tiny"}


def image(color=(200, 30, 60), size=(8, 8)) -> Image.Image:
    return Image.new("RGB", size, color)


def listing(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir())}


def assert_portable_name(name: str) -> None:
    """Valid on Linux, macOS and Windows, and within the 255-byte name limit."""
    encoded = name.encode("utf-8")  # raises on lone surrogates
    assert encoded.decode("utf-8") == name
    assert 0 < len(encoded) <= 255
    assert not FORBIDDEN & set(name), name
    assert name not in (".", "..") and not name.startswith(".")
    assert not name.endswith((".", " "))
    assert name.split(".")[0].upper() not in WINDOWS_RESERVED
    assert not any(unicodedata.category(c) in ("Cc", "Cf", "Cs", "Co", "Cn") for c in name)


HOSTILE = {
    "traversal": "../../etc/passwd",
    "absolute": "/abs/olute",
    "windows-drive": "C:\\x\\y",
    "unc": "\\\\server\\share\\..\\x",
    "nul-and-controls": "a\x00b\x01c\x1b[31md\r\ne\x7f",
    "dots-only": "...",
    "reserved": "CON",
    "reserved-ext": "nul.txt",
    "reserved-com": "com1",
    "reserved-superscript": "LPT\u00b9",
    "huge": "a lighthouse at dusk " * 500,  # ~10 kB
    "huge-one-word": "x" * 10_000,
    "cjk": "夕暮れの灯台、油絵" * 40,
    "emoji": "🔥 lighthouse 🌅 at dusk 👩‍👩‍👧",
    "emoji-only": "🔥🌅👩‍👩‍👧",
    "rtl": "מגדלור בשקיעה منارة عند الغسق",
    "bidi-override": "image\u202egnp.exe",
    "combining": "e\u0301" * 300 + " z\u0335\u0321a\u0336l\u0337g\u0338o" * 30,
    "punctuation": "!!! ??? ... ,,, ;;; ***",
    "empty": "",
    "lone-surrogate": "a\ud800b",
    "private-use": "\ue000\uf8ff",
    "fullwidth-slash": "a\uff0fb\uff3cc",
    "4-byte-cjk": "\U00020000" * 200,
}


@pytest.mark.parametrize("prompt", HOSTILE.values(), ids=HOSTILE.keys())
def test_names_from_hostile_prompts_stay_inside_and_are_portable(tmp_path, prompt):
    outdir = tmp_path / "out"
    path = next_image_path(outdir, seed=4294967295, prompt=prompt)
    assert path.parent == outdir
    assert path.resolve().parent == outdir.resolve()
    assert_portable_name(path.name)
    assert re.fullmatch(r"00000-4294967295-.+\.png", path.name)
    path.write_bytes(b"x")  # the file system accepts it
    assert [p.name for p in outdir.iterdir()] == [path.name]


@pytest.mark.parametrize(
    "prompt, slug",
    [
        ("A Lighthouse at Dusk!", "a-lighthouse-at-dusk"),
        ("../../etc/passwd", "etc-passwd"),
        ("C:\\Windows\\system32", "c-windows-system32"),
        ("CON", "con_"),
        ("aux", "aux_"),
        ("Com9", "com9_"),
        ("lpt\u00b3", "lpt\u00b3_"),
        ("con.txt", "con-txt"),
        ("console", "console"),
        ("夕暮れの灯台", "夕暮れの灯台"),
        ("Café au lait", "café-au-lait"),
        ("Cafe\u0301", "café"),  # NFD in, NFC out
        ("מגדלור בשקיעה", "מגדלור-בשקיעה"),
        ("🔥 fire 🔥", "fire"),
        ("a\u202eb", "a-b"),
        ("don't stop", "dont-stop"),
        ("!!!???", "image"),
        ("", "image"),
        ("\x00\x01", "image"),
    ],
)
def test_safe_slug_examples(prompt, slug):
    assert safe_slug(prompt) == slug


@pytest.mark.parametrize("char", ["é", "灯", "\U00020000", "e\u0301\u0302"])
@pytest.mark.parametrize("max_bytes", [1, 2, 3, 7, 120, 121])
def test_safe_slug_truncates_on_character_boundaries(char, max_bytes):
    slug = safe_slug(char * 500, max_bytes)
    encoded = slug.encode("utf-8")
    assert len(encoded) <= max_bytes
    assert encoded.decode("utf-8") == slug
    if len(unicodedata.normalize("NFC", char).encode()) <= max_bytes:
        assert slug and set(slug) <= set(unicodedata.normalize("NFC", char))
    # nothing wasted: one more character would not have fitted
    assert len(encoded) > max_bytes - 4 or slug == "image"[:max_bytes]


def test_safe_slug_rejects_nonpositive_budget():
    with pytest.raises(ValueError):
        safe_slug("x", 0)


def test_default_outdir_is_dated():
    assert default_outdir("outputs", date(2024, 5, 1)) == Path("outputs/2024-05-01")
    assert default_outdir(today=date(2025, 12, 31)).name == "2025-12-31"
    assert default_outdir().name == date.today().isoformat()


def test_next_image_path_counts_past_the_highest_counter(tmp_path):
    assert next_image_path(tmp_path, 7, "x").name == "00000-7-x.png"
    for name in ["00003-1-a.png", "00010-2-b.jpg", "notes.txt", "2024-05-01.png", "123-x.png"]:
        (tmp_path / name).write_bytes(b"")
    assert next_image_path(tmp_path, 7, "x").name == "00011-7-x.png"
    (tmp_path / "99999-1-z.png").write_bytes(b"")
    assert next_image_path(tmp_path, 7, "x").name == "100000-7-x.png"
    (tmp_path / "100000-1-z.png").write_bytes(b"")
    assert next_image_path(tmp_path, 7, "x", ext=".webp").name == "100001-7-x.webp"


def test_next_image_path_creates_nested_outdir(tmp_path):
    path = next_image_path(tmp_path / "a" / "b", 1, "p")
    assert path.parent.is_dir()


@pytest.mark.parametrize("ext", ["", "png/../../x", "p.ng", "png\x00"])
def test_next_image_path_rejects_bad_extensions(tmp_path, ext):
    with pytest.raises(ValueError):
        next_image_path(tmp_path, 1, "p", ext=ext)


def test_next_image_path_unusable_outdir_is_an_output_error(tmp_path):
    (tmp_path / "afile").write_bytes(b"")
    with pytest.raises(OutputError, match="afile"):
        next_image_path(tmp_path / "afile" / "sub", 1, "p")


def test_same_prompt_and_seed_twice_gives_two_files(tmp_path):
    first = save_png(image((1, 2, 3)), next_image_path(tmp_path, 42, "a cat"), "p", {})
    before = first.read_bytes()
    second = save_png(image((4, 5, 6)), next_image_path(tmp_path, 42, "a cat"), "p", {})
    assert (first.name, second.name) == ("00000-42-a-cat.png", "00001-42-a-cat.png")
    assert first.read_bytes() == before
    assert Image.open(second).getpixel((0, 0)) == (4, 5, 6)


def test_name_taken_between_plan_and_save_is_not_overwritten(tmp_path):
    planned = next_image_path(tmp_path, 5, "race")
    planned.write_bytes(b"another process got here first")  # the race
    written = save_png(image(), planned, "p", {"i": 1})
    assert written != planned and written.parent == tmp_path
    assert written.name == "00001-5-race.png"
    assert planned.read_bytes() == b"another process got here first"
    assert read_png_metadata(written) == ("p", {"i": 1})
    assert not list(tmp_path.glob(".*"))


def test_race_with_many_taken_names_skips_to_the_next_free_counter(tmp_path):
    planned = next_image_path(tmp_path, 5, "race")
    for n in range(3):
        (tmp_path / f"{n:05d}-5-race.png").write_bytes(b"taken")
    (tmp_path / "00007-9-other.png").write_bytes(b"taken")
    assert save_png(image(), planned, "p", {}).name == "00008-5-race.png"
    assert sum(p.read_bytes() == b"taken" for p in tmp_path.iterdir()) == 4


def test_taken_custom_name_gets_a_suffix(tmp_path):
    (tmp_path / "cover.png").write_bytes(b"mine")
    assert save_png(image(), tmp_path / "cover.png", "p", {}).name == "cover-1.png"
    assert save_png(image(), tmp_path / "cover.png", "p", {}).name == "cover-2.png"
    assert (tmp_path / "cover.png").read_bytes() == b"mine"


def test_temporary_file_is_hidden_in_the_same_folder(tmp_path, monkeypatch):
    seen = []
    real_link = os.link

    def spy(src, dst, *args, **kwargs):
        seen.append((Path(src), Path(dst)))
        return real_link(src, dst, *args, **kwargs)

    monkeypatch.setattr(os, "link", spy)
    written = save_png(image(), next_image_path(tmp_path, 1, "x"), "p", {})
    (src, dst), = seen
    assert src.parent == tmp_path and src.name.startswith(".") and src.name.endswith(".tmp")
    assert dst == written and not src.exists()


def test_filesystem_without_hard_links_still_never_overwrites(tmp_path, monkeypatch):
    def no_links(*args, **kwargs):
        raise OSError(errno.EPERM, "Operation not permitted")

    monkeypatch.setattr(os, "link", no_links)
    planned = next_image_path(tmp_path, 3, "fat32")
    planned.write_bytes(b"theirs")
    written = save_png(image(), planned, "p", {"k": "v"})
    assert written.name == "00001-3-fat32.png"
    assert planned.read_bytes() == b"theirs"
    assert read_png_metadata(written) == ("p", {"k": "v"})
    assert sorted(p.name for p in tmp_path.iterdir()) == [planned.name, written.name]


@pytest.fixture
def earlier(tmp_path):
    """An outdir with one image already saved; returns (outdir, snapshot of its files)."""
    save_png(image((9, 9, 9)), next_image_path(tmp_path, 1, "earlier"), "p", {})
    return tmp_path, listing(tmp_path)


@pytest.mark.parametrize("code", [errno.EROFS, errno.ENOSPC, errno.EACCES, errno.EDQUOT])
@pytest.mark.parametrize("where", ["link", "write", "fsync", "open"])
def test_os_errors_become_output_errors_and_leave_nothing_behind(earlier, monkeypatch, code, where):
    outdir, before = earlier

    def fail(*args, **kwargs):
        raise OSError(code, os.strerror(code))

    if where == "write":
        real_save = Image.Image.save

        def half_then_fail(self, fp, *args, **kwargs):
            real_save(self, fp, *args, **kwargs)
            fp.truncate(fp.tell() // 2)
            fail()

        monkeypatch.setattr(Image.Image, "save", half_then_fail)
    elif where == "open":
        real_open = os.open
        monkeypatch.setattr(
            os, "open", lambda p, *a, **k: fail() if str(p).endswith(".tmp") else real_open(p, *a, **k)
        )
    else:
        monkeypatch.setattr(os, where, fail)
    path = next_image_path(outdir, 2, "new")
    with pytest.raises(OutputError) as info:
        save_png(image(), path, "p", {})
    message = str(info.value)
    assert str(outdir) in message
    assert os.strerror(code) in message and errno.errorcode[code] in message
    assert isinstance(info.value.__cause__, OSError)
    assert listing(outdir) == before  # no temp file, no final file, earlier image intact


def test_crash_mid_write_leaves_no_file_under_a_final_name(earlier, monkeypatch):
    outdir, before = earlier

    def crash(self, fp, *args, **kwargs):
        fp.write(b"\x89PNG\r\n\x1a\n" + b"\0" * 100)  # a truncated PNG
        raise RuntimeError("encoder crashed")

    monkeypatch.setattr(Image.Image, "save", crash)
    path = next_image_path(outdir, 2, "new")
    with pytest.raises(RuntimeError, match="encoder crashed"):
        save_png(image(), path, "p", {})
    assert not path.exists()
    assert listing(outdir) == before


def test_killed_mid_write_leaves_only_a_hidden_temp_file(tmp_path, monkeypatch):
    """SIGKILL cannot be caught: simulate it by stopping before the temp file is cleaned up."""

    def killed(self, fp, *args, **kwargs):
        fp.write(b"\x89PNG\r\n\x1a\n")
        raise SystemExit  # stands in for the process dying here

    monkeypatch.setattr(Image.Image, "save", killed)
    monkeypatch.setattr(outputs, "_unlink_quietly", lambda path: None)
    path = next_image_path(tmp_path, 2, "new")
    with pytest.raises(SystemExit):
        save_png(image(), path, "p", {})
    names = [p.name for p in tmp_path.iterdir()]
    assert len(names) == 1 and names[0].startswith(".") and names[0].endswith(".tmp")
    assert next_image_path(tmp_path, 2, "new") == path  # the temp file does not use up a counter


ROUND_TRIP_PROMPTS = [
    ("a lighthouse at dusk", ""),
    ("line one\nline two, with commas\n\n\"quoted\" and 'single'", "blurry,\nlow quality"),
    ("夕暮れの灯台 🌅, Ölgemälde", "ぼやけた"),
    ("  leading and trailing spaces  ", " neg "),
    ("prompt: with colon\nSteps: 1, Sampler: x, Seed: 2", "Negative prompt: inside the negative"),
    ("", "only a negative"),
    ("", ""),
    ("a\ttab and \\backslash\\ and a NUL-free end", ""),
]


@pytest.mark.parametrize("prompt, negative", ROUND_TRIP_PROMPTS)
def test_a1111_text_round_trip(prompt, negative):
    fields = {
        **FIELDS,
        "CFG scale": 7.5,
        "Lora hashes": 'detail: 7c6bad76eb54, "x": 1',
        "Note": '"starts with a quote"',
        "Spaces": "  padded ",
        "Multi": "a\nb",
        "Empty": "",
        "Skipped": None,
    }
    text = a1111_parameters(prompt, negative, fields)
    parsed = parse_a1111_parameters(text)
    expected = {k: ("7.5" if k == "CFG scale" else str(v)) for k, v in fields.items() if v is not None}
    assert parsed == {"prompt": prompt, "negative_prompt": negative, **expected}


def test_a1111_text_looks_like_a1111():
    text = a1111_parameters("a cat", "dog", FIELDS)
    assert text == (
        "a cat\nNegative prompt: dog\n"
        "Steps: 20, Sampler: Euler a, CFG scale: 7, Seed: 1, Size: 512x512, Model: tiny"
    )
    assert a1111_parameters("a cat", "", FIELDS).splitlines()[1].startswith("Steps: 20,")
    quoted = a1111_parameters("p", "", {"A b": "x, y", "Cd": "k: v", "Ef": "1\n2", "Gh": 0.25})
    assert quoted == 'p\nA b: "x, y", Cd: "k: v", Ef: "1\\n2", Gh: 0.25'
    assert a1111_parameters("p", "", {"Unicode": "灯台, 🌅"}).endswith('Unicode: "灯台, 🌅"')


@pytest.mark.parametrize("key", ["Bad:key", "a,b", "x", " lead", "trail ", "new\nline", ""])
def test_a1111_parameters_rejects_unparseable_keys(key):
    with pytest.raises(ValueError):
        a1111_parameters("p", "", {key: 1})


def test_parse_real_a1111_text():
    text = (
        "masterpiece, best quality, 1girl, (cat ears:1.2), <lora:add_detail:0.5>\n"
        "looking at viewer\n"
        "Negative prompt: lowres, bad anatomy, (worst quality:1.4)\n"
        "Steps: 28, Sampler: DPM++ 2M Karras, CFG scale: 7, Seed: 3632571785, Size: 512x768, "
        "Model hash: 7f96a1a9ca, Model: anything-v5, Denoising strength: 0.5, Clip skip: 2, "
        'Hires upscale: 2, Hires upscaler: Latent, Lora hashes: "add_detail: 7c6bad76eb54", '
        "Version: v1.7.0\n"
    )
    parsed = parse_a1111_parameters(text)
    assert parsed["prompt"] == (
        "masterpiece, best quality, 1girl, (cat ears:1.2), <lora:add_detail:0.5>\nlooking at viewer"
    )
    assert parsed["negative_prompt"] == "lowres, bad anatomy, (worst quality:1.4)"
    assert parsed["Sampler"] == "DPM++ 2M Karras"
    assert parsed["Seed"] == "3632571785"
    assert parsed["Size"] == "512x768"
    assert parsed["Lora hashes"] == "add_detail: 7c6bad76eb54"
    assert parsed["Version"] == "v1.7.0"
    assert list(parsed)[2:5] == ["Steps", "Sampler", "CFG scale"]


def test_parse_text_without_a_fields_line_is_all_prompt():
    text = "a castle, (cat:1.2)\nstyle: anime"
    assert parse_a1111_parameters(text) == {"prompt": text, "negative_prompt": ""}


def test_png_metadata_round_trip(tmp_path):
    prompt = 'a "lighthouse",\nat dusk: 夕暮れ 🌅 Ölgemälde'
    negative = "blurry,\nぼやけた"
    fields = {**FIELDS, "Lowvram tier": "medvram, batch 1"}
    metadata = {"tier": "medvram", "attempts": [{"preset": "full", "outcome": "oom"}], "path": tmp_path}
    written = save_png(image((10, 20, 30)), next_image_path(tmp_path, 1, prompt),
                       a1111_parameters(prompt, negative, fields), metadata)
    parameters, ours = read_png_metadata(written)
    assert parameters == a1111_parameters(prompt, negative, fields)
    assert parse_a1111_parameters(parameters)["prompt"] == prompt
    assert parse_a1111_parameters(parameters)["negative_prompt"] == negative
    assert ours == {**metadata, "path": str(tmp_path)}
    with Image.open(written) as im:
        assert im.format == "PNG" and im.getpixel((3, 3)) == (10, 20, 30)


def test_latin1_parameters_use_a_plain_text_chunk(tmp_path):
    written = save_png(image(), tmp_path / "x.png", "café, Steps: 1", {"a": 1})
    data = written.read_bytes()
    assert b"tEXtparameters\0caf\xe9, Steps: 1" in data
    assert b"tEXtlowvram_gen\0" + json.dumps({"a": 1}).encode() in data


def test_read_png_metadata_of_foreign_or_damaged_images(tmp_path):
    plain = tmp_path / "plain.png"
    image().save(plain)
    assert read_png_metadata(plain) == (None, None)
    from PIL.PngImagePlugin import PngInfo

    info = PngInfo()
    info.add_text("parameters", "a\nSteps: 1, Sampler: x, Seed: 2")
    info.add_text("lowvram_gen", "{not json")
    damaged = tmp_path / "damaged.png"
    image().save(damaged, pnginfo=info)
    assert read_png_metadata(damaged) == ("a\nSteps: 1, Sampler: x, Seed: 2", None)


def test_save_images_names_each_image_with_its_seed(tmp_path):
    colors = [(1, 1, 1), (2, 2, 2), (3, 3, 3)]
    paths = save_images(
        [image(c) for c in colors], tmp_path, [5, 6, 7], "a batch",
        parameters_for=lambda i, seed: a1111_parameters("a batch", "", {**FIELDS, "Seed": seed}),
        metadata_for=lambda i, seed: {"index": i, "seed": seed},
    )
    assert [p.name for p in paths] == ["00000-5-a-batch.png", "00001-6-a-batch.png", "00002-7-a-batch.png"]
    for i, (path, color) in enumerate(zip(paths, colors)):
        parameters, ours = read_png_metadata(path)
        assert parse_a1111_parameters(parameters)["Seed"] == str(5 + i)
        assert ours == {"index": i, "seed": 5 + i}
        assert Image.open(path).getpixel((0, 0)) == color


def test_save_images_rejects_mismatched_seeds(tmp_path):
    with pytest.raises(ValueError, match="2 images but 1 seeds"):
        save_images([image(), image()], tmp_path, [1], "p", lambda i, s: "", lambda i, s: {})
    assert list(tmp_path.iterdir()) == []


def test_outputs_module_imports_only_stdlib_pillow_and_errors():
    """It must import fast: no torch, numpy or diffusers (the CLI imports it before any model)."""
    import sys

    tree = ast.parse(Path(outputs.__file__).read_text(encoding="utf-8"))
    roots = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            roots |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            roots.add(node.module.split(".")[0])
    third_party = roots - set(sys.stdlib_module_names) - {"__future__"}
    assert third_party == {"PIL", "lowvram_gen"}
    assert {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and
            n.module.startswith("lowvram_gen")} == {"lowvram_gen.errors", "lowvram_gen.safe_json"}  # safe_json: stdlib
