"""The Image Browser's files (issue 32 item 7, lowvram_gen/output_browser.py and ui/tabs/browser.py): the output
folder's images newest first a page at a time, its date folders, the parameters of an image, Delete that moves the
image to the trash (never deletes it) and Undo, and the refusal of every path outside the output folder."""

from __future__ import annotations

import os

import pytest
from PIL import Image
from PIL.PngImagePlugin import PngInfo

from lowvram_gen import output_browser as ob
from lowvram_gen.errors import InvalidRequest


def _png(path, when: int, parameters: str | None = None):
    path.parent.mkdir(parents=True, exist_ok=True)
    info = PngInfo()
    if parameters:
        info.add_text("parameters", parameters)
    Image.new("RGB", (8, 8), (when % 256, 0, 0)).save(path, pnginfo=info)
    os.utime(path, (1_700_000_000 + when, 1_700_000_000 + when))
    return path


@pytest.fixture()
def outputs(tmp_path):
    """outputs/ with two date folders (A1111's layout), 5 images, a temporary file and a trash."""
    root = tmp_path / "outputs"
    _png(root / "2026-11-26" / "00000-1-old.png", 1)
    _png(root / "2026-11-26" / "00001-2-older-name.png", 2)
    for i in range(3):
        _png(root / "2026-11-27" / f"0000{i}-{i}-today.png", 10 + i, f"today {i}\nSteps: 2, Seed: {i}")
    (root / "2026-11-27" / ".00003-x.png.0123456789ab.tmp").write_bytes(b"a writer's temporary file")
    (root / "2026-11-27" / "notes.txt").write_text("not an image")
    return root


def test_the_default_layouts_root_is_outputs_and_another_folder_is_itself(outputs, tmp_path):
    assert ob.browse_root(outputs / "2026-11-27") == outputs.resolve()
    assert ob.browse_root(outputs) == outputs.resolve()
    assert ob.browse_root(tmp_path / "mine" / "2026-11-27") == (tmp_path / "mine" / "2026-11-27").resolve()
    from lowvram_gen.ui.app import allowed_paths

    assert allowed_paths(str(outputs / "2026-11-27")) == [str(outputs.resolve())]  # what the UI serves


def test_folders_newest_first_and_images_newest_first(outputs):
    assert ob.folders(outputs) == [ob.ALL, "2026-11-27", "2026-11-26"]
    names = [p.name for p in ob.images(outputs)]
    assert names == ["00002-2-today.png", "00001-1-today.png", "00000-0-today.png", "00001-2-older-name.png",
                     "00000-1-old.png"]  # no temporary file, no text file
    assert [p.name for p in ob.images(outputs, "2026-11-26")] == ["00001-2-older-name.png", "00000-1-old.png"]
    _png(outputs / "top.png", 50)
    assert ob.folders(outputs)[-1] == ob.TOP and [p.name for p in ob.images(outputs, ob.TOP)] == ["top.png"]


def test_pages(outputs):
    first = ob.page_of(outputs, ob.ALL, 1, per_page=2)
    assert ([p.name for p in first.items], first.number, first.pages, first.total) == (
        ["00002-2-today.png", "00001-1-today.png"], 1, 3, 5)
    assert first.text() == "Page 1 of 3 (5 images, newest first)"
    last = ob.page_of(outputs, ob.ALL, 9, per_page=2)  # past the end: the last page
    assert (last.number, [p.name for p in last.items]) == (3, ["00000-1-old.png"])
    assert ob.page_of(outputs, ob.ALL, "not a number", per_page=2).number == 1
    assert ob.page_of(outputs, ob.ALL, 0, per_page=2).number == 1
    empty = ob.page_of(outputs / "2026-11-27" / "none", ob.ALL, 1)
    assert (empty.items, empty.pages, empty.text()) == ([], 1, "No images here yet.")
    with pytest.raises(InvalidRequest, match="images per page"):
        ob.page_of(outputs, ob.ALL, 1, per_page=0)


def test_the_selected_images_parameters(outputs):
    from lowvram_gen.ui.tabs.browser import parameters_of

    today = outputs / "2026-11-27" / "00001-1-today.png"
    assert parameters_of(outputs, today) == "today 1\nSteps: 2, Seed: 1"
    assert parameters_of(outputs, outputs / "2026-11-26" / "00000-1-old.png") == \
        "(no generation parameters in this image)"


def test_delete_moves_to_the_trash_and_undo_moves_it_back(outputs):
    image = outputs / "2026-11-27" / "00001-1-today.png"
    data = image.read_bytes()
    moved = ob.to_trash(outputs, image)
    assert moved == outputs.resolve() / ".trash" / "2026-11-27" / "00001-1-today.png"
    assert not image.exists() and moved.read_bytes() == data  # moved, not deleted
    assert "00001-1-today.png" not in [p.name for p in ob.images(outputs)]  # the trash is not listed
    assert ob.TRASH not in ob.folders(outputs)
    _png(image, 99)  # a new image of the same name, then deleted too: the first one in the trash is kept
    second = ob.to_trash(outputs, image)
    assert second.name == "00001-1-today (2).png" and moved.read_bytes() == data
    back = ob.restore(outputs, moved.relative_to(outputs.resolve() / ob.TRASH))
    assert back == image.resolve() and back.read_bytes() == data and not moved.exists()


def test_paths_outside_the_output_folder_are_refused(outputs, tmp_path):
    outside = _png(tmp_path / "elsewhere" / "secret.png", 5)
    (outputs / "2026-11-27" / "link.png").symlink_to(outside)
    crafted = [outside, "../elsewhere/secret.png", outputs / ".." / "elsewhere" / "secret.png",
               outputs / "2026-11-27" / "link.png", outputs / "2026-11-27" / "notes.txt",
               outputs / "2026-11-27" / "missing.png", outputs, "/etc/passwd"]
    for path in crafted:
        with pytest.raises(InvalidRequest, match="an image of the output folder"):
            ob.inside(outputs, path)
        with pytest.raises(InvalidRequest):
            ob.to_trash(outputs, path)
    assert outside.is_file()
    assert "link.png" not in [p.name for p in ob.images(outputs)]  # a link could point anywhere: not listed
    trashed = ob.to_trash(outputs, outputs / "2026-11-26" / "00000-1-old.png")
    with pytest.raises(InvalidRequest, match="an image of the output folder"):  # the trash is not browsed
        ob.inside(outputs, trashed)
    for name in ("../../elsewhere/secret.png", str(outside)):
        with pytest.raises(InvalidRequest, match="trash"):
            ob.restore(outputs, name)
    for folder in ("..", "../elsewhere", ".trash", "/etc", "2026-11-27/../../elsewhere"):
        with pytest.raises(InvalidRequest, match="image browser folder"):
            ob.images(outputs, folder)
    from lowvram_gen.ui.tabs.browser import parameters_of

    assert parameters_of(outputs, outside).startswith("(no generation parameters")  # never read
