"""The Image Browser tab (A1111's old image-browser extension, Forge's built-in one): the output folder's images,
newest first, a page at a time (PER_PAGE images: a big folder never loads every image at once), a date-folder
picker, the selected image's parameters (the PNG's A1111 text, outputs.read_png_metadata), Send to txt2img, img2img,
Inpaint and Upscale (ui/sendto.py's sends, as a gallery's), and Delete, which MOVES the image to the folder's
`.trash/` (never deletes it), says where, and offers Undo.

Which files: lowvram_gen/output_browser.py. The browser names no file: the page's images are kept in this browser's
gr.State on the server, the selected one is one of them, and each is checked to be inside the output folder again
before it is read, sent or moved. The tab lists its folder when it is opened and on Refresh (not at page load).
"""

from pathlib import Path

import gradio as gr

from lowvram_gen import output_browser as ob
from lowvram_gen.errors import LowVramError
from lowvram_gen.outputs import read_png_metadata
from lowvram_gen.ui import messages, sendto
from lowvram_gen.ui.context import TabContext

SEND_TO = ("txt2img", "img2img", "inpaint", "upscale")


def parameters_of(root: Path, path) -> str:
    """The image's A1111 parameters text, or a line saying it has none."""
    try:
        text, _ = read_png_metadata(ob.inside(root, path))
    except (OSError, ValueError):
        return "(no generation parameters: not an image this browser can read)"
    return text or "(no generation parameters in this image)"


def build(ctx: TabContext) -> None:
    root = ob.browse_root(ctx.options.outdir)

    with gr.Tab("Image Browser", id="browser") as tab:
        with gr.Row():
            folder = gr.Dropdown([ob.ALL], value=ob.ALL, label="Folder", elem_id="browser-folder", scale=2)
            refresh = gr.Button("Refresh", size="sm", scale=0, min_width=80, elem_id="browser-refresh")
            previous = gr.Button("◀ Previous", size="sm", scale=0, min_width=100, elem_id="browser-previous")
            number = gr.Number(1, precision=0, minimum=1, label="Page", elem_id="browser-page", scale=0,
                               min_width=90)
            following = gr.Button("Next ▶", size="sm", scale=0, min_width=100, elem_id="browser-next")
            page_text = gr.Markdown(elem_id="browser-page-text")
        with gr.Row():
            with gr.Column(scale=3):
                gallery = gr.Gallery(show_label=False, columns=6, fit_columns=False, height=560, object_fit="contain",
                                     interactive=False, elem_id="browser-gallery")
            with gr.Column(scale=2):
                info = gr.Textbox(label="Image parameters", lines=8, interactive=False, elem_id="browser-info")
                with gr.Row():
                    sends = {t: gr.Button(f"Send to {sendto.LABELS[t]}", size="sm", elem_id=f"browser-to-{t}")
                             for t in SEND_TO}
                with gr.Row():
                    delete = gr.Button("Delete (to the trash)", size="sm", variant="stop", elem_id="browser-delete")
                    undo = gr.Button("Undo delete", size="sm", elem_id="browser-undo")
                status = gr.Markdown(elem_id="browser-status")
    shown = gr.State([])  # this page's images (absolute paths), in the gallery's order
    selected = gr.State(None)  # the selected image's path
    trashed = gr.State(None)  # where the last Delete put its image (Undo moves it back)

    def show(chosen, page, current=None, request: gr.Request = None):
        """The page's listing; the selected image stays selected while it is on the page (back from a Send to)."""
        try:
            choices = ob.folders(root)
            chosen = chosen if chosen in choices else ob.ALL
            listed = ob.page_of(root, chosen, page)
        except LowVramError as exc:
            raise messages.error(exc, request) from None
        items = [str(p) for p in listed.items]
        kept = current in items
        return ([(p, Path(p).name) for p in items], items, gr.Dropdown(choices=choices, value=chosen),
                listed.number, listed.text(), current if kept else None, gr.update() if kept else "")

    def pick(items, evt: gr.SelectData):
        index = evt.index if isinstance(evt.index, int) else -1
        if not 0 <= index < len(items or []):
            return None, ""
        return items[index], parameters_of(root, items[index])

    def move(move_file, path, missing: str, request):
        """`move_file(root, path)` (to the trash or back), its refusal a gr.Error."""
        if not path:
            raise messages.error(missing, request)
        try:
            return move_file(root, path)
        except LowVramError as exc:
            raise messages.error(exc, request) from None

    def remove(path, request: gr.Request = None):
        target = move(ob.to_trash, path, "select an image first", request)
        return (str(target.relative_to(root / ob.TRASH)),
                f"Moved {Path(path).name} to {target}: Undo delete (or moving it back) restores it.")

    def put_back(where, request: gr.Request = None):
        return None, f"Restored {move(ob.restore, where, 'nothing deleted to undo', request).name}."

    listing = [gallery, shown, folder, number, page_text, selected, info]
    # one listing at a time, in the order asked (a Delete's relisting after an earlier Next)
    hidden = {"api_visibility": "private", "show_progress": "hidden", "concurrency_id": "browser",
              "concurrency_limit": 1}
    for event in (tab.select, refresh.click, folder.input, number.submit):
        event(show, [folder, number, selected], listing, **hidden)
    previous.click(lambda f, n, s: show(f, (n or 1) - 1, s), [folder, number, selected], listing, **hidden)
    following.click(lambda f, n, s: show(f, (n or 1) + 1, s), [folder, number, selected], listing, **hidden)
    gallery.select(pick, [shown], [selected, info], **hidden)
    delete.click(remove, [selected], [trashed, status], **hidden).success(show, [folder, number], listing, **hidden)
    undo.click(put_back, [trashed], [trashed, status], **hidden).success(show, [folder, number], listing, **hidden)

    def source(path, _unused=None) -> tuple[str, bool]:
        if not path:
            raise messages.error("select an image first")
        try:
            return str(ob.inside(root, path)), False
        except LowVramError as exc:
            raise messages.error(exc) from None

    for target, button in sends.items():
        ctx.later(lambda target=target, button=button: sendto.wire_send(ctx, button, target, [selected], source))
