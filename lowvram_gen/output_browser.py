"""The image browser's files (A1111's old image-browser extension, Forge's built-in one): the images of the output
folder newest first, a page at a time, its date folders, and Delete that moves an image to a trash folder.

The folder browsed (`browse_root`) is the web UI's output folder; where that is A1111's default layout, a date folder
`outputs/<YYYY-MM-DD>` (the UI's default: today's), it is `outputs/` itself, whose date folders the picker lists.
Only files inside it are ever listed, read, moved or served: every path a client names is resolved (links and `..`
followed) and refused unless it lies inside that folder and outside its trash.

Delete never unlinks: it moves the image to `<root>/.trash/<its folder>/<its name>` (another name where that is taken),
so a misclick loses nothing; the image comes back by moving it back (`restore`). Listing a folder reads its entries'
dates only (os.scandir); no image is opened but the page's, so a big folder pages as fast as a small one.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

from lowvram_gen.errors import InvalidRequest

IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".webp")
TRASH = ".trash"
ALL = "All folders"  # the folder picker's choice of every folder at once
TOP = "."  # the root's own images
PER_PAGE = 24
MAX_PAGE_SIZE = 200
_DATE = re.compile(r"^\d{4}-\d{2}-\d{2}$")


def browse_root(outdir: str | Path) -> Path:
    """The folder the browser shows: `outdir`, or its parent `outputs/` where `outdir` is a date folder of A1111's
    default layout (`outputs/<YYYY-MM-DD>`), so the other days' folders are there too."""
    folder = Path(outdir).expanduser().resolve()
    if _DATE.match(folder.name) and folder.parent.name == "outputs":
        return folder.parent
    return folder


def _images_in(folder: Path) -> list[tuple[float, str, Path]]:
    found = []
    try:
        with os.scandir(folder) as entries:
            for entry in entries:
                if entry.name.startswith(".") or not entry.name.lower().endswith(IMAGE_SUFFIXES):
                    continue  # hidden: our temporary files (.x.tmp) and the trash
                try:
                    if entry.is_file(follow_symlinks=False):  # a link could point anywhere: not listed
                        found.append((entry.stat().st_mtime, entry.name, Path(entry.path)))
                except OSError:  # removed while listed
                    continue
    except OSError:
        return []
    return found


def folders(root: Path) -> list[str]:
    """The picker's choices: ALL, then the sub-folders (dates sort newest first), then TOP where the root has
    images of its own."""
    try:
        subs = sorted((e.name for e in os.scandir(root) if e.is_dir() and not e.name.startswith(".")), reverse=True)
    except OSError:
        subs = []
    return [ALL, *subs, *([TOP] if _images_in(root) else [])]


def folder_path(root: Path, folder: str | None) -> Path | None:
    """The folder a picker choice names (None: ALL), refused unless it is the root or one of its sub-folders."""
    if not folder or folder == ALL:
        return None
    path = (root / folder).resolve()
    if path != root.resolve() and (path.parent != root.resolve() or path.name.startswith(".")):
        raise InvalidRequest("image browser folder", folder, "allowed: a folder of the output folder")
    return path


def images(root: Path, folder: str | None = ALL) -> list[Path]:
    """The images of `folder` (ALL: the root's and each sub-folder's, not the trash's), newest first."""
    chosen = folder_path(root, folder)
    if chosen is not None:
        found = _images_in(chosen)
    else:
        found = _images_in(root)
        for sub in folders(root):
            if sub not in (ALL, TOP):
                found += _images_in(root / sub)
    return [path for _, _, path in sorted(found, key=lambda t: (t[0], t[1]), reverse=True)]


@dataclass
class Page:
    items: list[Path]
    number: int  # 1-based, within 1..pages
    pages: int
    total: int

    def text(self) -> str:
        if not self.total:
            return "No images here yet."
        return f"Page {self.number} of {self.pages} ({self.total} images, newest first)"


def page_of(root: Path, folder: str | None, number, per_page: int = PER_PAGE) -> Page:
    """Page `number` (1-based; past the end: the last page) of `folder`'s images."""
    if not 1 <= per_page <= MAX_PAGE_SIZE:
        raise InvalidRequest("images per page", per_page, f"allowed: 1 to {MAX_PAGE_SIZE}")
    everything = images(root, folder)
    pages = max(1, -(-len(everything) // per_page))
    try:
        number = min(max(1, int(number or 1)), pages)
    except (TypeError, ValueError):
        number = 1
    start = (number - 1) * per_page
    return Page(everything[start:start + per_page], number, pages, len(everything))


def inside(root: Path, path: str | Path) -> Path:
    """`path` resolved, refused unless it is an image file inside `root` and outside its trash."""
    root = root.resolve()
    resolved = (root / path).resolve()  # an absolute `path` stays itself
    trash = root / TRASH
    if (root not in resolved.parents or trash == resolved or trash in resolved.parents
            or resolved.suffix.lower() not in IMAGE_SUFFIXES or not resolved.is_file()):
        raise InvalidRequest("image", str(path), "allowed: an image of the output folder")
    return resolved


def _free(path: Path) -> Path:
    """`path`, or `name (2).png`, `name (3).png` ... where it is taken."""
    n, candidate = 2, path
    while candidate.exists():
        candidate = path.with_name(f"{path.stem} ({n}){path.suffix}")
        n += 1
    return candidate


def to_trash(root: Path, path: str | Path) -> Path:
    """Move the image at `path` (inside `root`) to `root/.trash/<its folder>/`; returns where it went. Never
    overwrites (another name where one is taken) and never deletes."""
    source = inside(root, path)
    target = _free(root.resolve() / TRASH / source.relative_to(root.resolve()))
    target.parent.mkdir(parents=True, exist_ok=True)
    os.rename(source, target)  # same file system: the trash is inside the root
    return target


def restore(root: Path, trashed: str | Path) -> Path:
    """Move an image of the trash back where it was (another name where one is taken there now); the undo of
    `to_trash`."""
    root = root.resolve()
    trash = root / TRASH
    source = (trash / trashed).resolve()
    if trash not in source.parents or not source.is_file():
        raise InvalidRequest("trashed image", str(trashed), "allowed: an image of the output folder's trash")
    target = _free(root / source.relative_to(trash))
    target.parent.mkdir(parents=True, exist_ok=True)
    os.rename(source, target)
    return target


__all__ = ["ALL", "PER_PAGE", "Page", "TOP", "TRASH", "browse_root", "folders", "images", "inside", "page_of",
           "restore", "to_trash"]
