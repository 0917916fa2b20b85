"""The extra-network cards of txt2img, img2img and Inpaint (A1111's and Forge's "Extra networks"), in an accordion
under the prompts: Lora, Textual Inversion and Checkpoints, a card each with the preview image A1111 keeps beside the
file (a grey "no preview" card without one), its name, a search box that filters the cards as you type, and Refresh
(the folders as they are now). A click on a card puts its tag in the prompt (`<lora:NAME:1>`, an embedding's name),
or takes it out where the prompt has it already, as A1111's click does; a checkpoint card sets the Model box. The
card's description and activation text (A1111's `NAME.txt` / `NAME.json`) show under the cards once clicked.

The lists and tags are networks/previews.py's, from the same folder scans as the jobs' and the LoRA/embedding
pickers' (ui/pickers.py). Previews go to the browser as small thumbnails made here from the files found beside the
listed models: the browser never names a file, it names a card by its place in this browser's list (a gr.State,
kept on the server), so no request reaches another file (FAULTS 34). At most MAX_SHOWN cards are sent at once; the
note says how many more the search box would narrow down.
"""

from __future__ import annotations

import threading

import gradio as gr
from PIL import Image, ImageDraw

from lowvram_gen.networks import previews

MAX_SHOWN = 120  # cards sent at once (each a thumbnail): more and the note says to search
THUMB = 192  # a thumbnail's longer side, in pixels
_CACHE_MAX = 512
_cache: dict[tuple[str, int, int], Image.Image] = {}  # (preview path, mtime_ns, size) -> thumbnail
_lock = threading.Lock()


def placeholder() -> Image.Image:
    """The card of a model without a preview: grey, "no preview" on it."""
    image = Image.new("RGB", (THUMB, THUMB), (72, 72, 80))
    ImageDraw.Draw(image).text((THUMB // 2, THUMB // 2), "no preview", fill=(200, 200, 200), anchor="mm")
    return image


def thumbnail(card: previews.Card) -> Image.Image:
    """A small copy of the card's preview (cached by file, mtime and size), or the placeholder for none or an image
    Pillow cannot read."""
    if card.preview is None:
        return placeholder()
    try:
        st = card.preview.stat()
        key = (str(card.preview), st.st_mtime_ns, st.st_size)
        with _lock:
            if key in _cache:
                return _cache[key]
        with Image.open(card.preview) as im:
            im.draft("RGB", (THUMB, THUMB))  # a JPEG decodes at a fraction of its size
            small = im.convert("RGB")
            small.thumbnail((THUMB, THUMB))
    except (OSError, ValueError, Image.DecompressionBombError):
        return placeholder()
    with _lock:
        if len(_cache) >= _CACHE_MAX:
            _cache.clear()
        _cache[key] = small
    return small


def shown_cards(kind: str, query: str, models_folder=None) -> tuple[list[previews.Card], str]:
    """(the cards to show for `kind` and the search `query`, the note under them)."""
    if kind not in previews.KINDS:
        kind = "lora"
    everything = previews.cards_of(kind, models_folder)
    found = previews.matching(everything, query)
    label = previews.KINDS[kind]
    if not everything:
        note = f"No {label} files found: put them in their models folder and press Refresh."
    elif not found:
        note = f"No {label} card matches {query.strip()!r}."
    elif len(found) > MAX_SHOWN:
        note = f"{MAX_SHOWN} of {len(found)} {label} cards shown: type in Search to narrow them."
    else:
        note = f"{len(found)} {label} card(s). Click one to add it to the prompt (again: take it out)."
    return found[:MAX_SHOWN], note


def card_text(card: previews.Card) -> str:
    """The note after a click: the card's name, description and activation text (Markdown, escaped)."""
    import html

    lines = [f"**{html.escape(card.name)}**" + (f": {html.escape(card.description)}" if card.description else "")]
    if card.activation_text:
        lines.append(f"Activation text: `{card.activation_text.replace('`', '')}`")
    return "\n\n".join(lines)


class Cards:
    """One tab's cards accordion: built under the prompts (`build`), wired once the Model box exists (`wire`)."""

    def __init__(self, prefix: str, models_folder=None):
        self.prefix, self.models_folder = prefix, models_folder

    def build(self) -> None:
        p = self.prefix
        with gr.Accordion("Extra networks (LoRA, embeddings, checkpoints)", open=False,
                          elem_id=f"{p}cards") as self.accordion:
            with gr.Row():
                self.kind = gr.Radio([(label, key) for key, label in previews.KINDS.items()], value="lora",
                                     show_label=False, container=False, elem_id=f"{p}cards-kind", scale=2)
                self.search = gr.Textbox(placeholder="Search", show_label=False, container=False,
                                         elem_id=f"{p}cards-search", scale=2)
                self.refresh = gr.Button("Refresh", size="sm", scale=0, min_width=80, elem_id=f"{p}cards-refresh")
            self.gallery = gr.Gallery(show_label=False, columns=6, fit_columns=False, height=300, allow_preview=False,
                                      object_fit="cover", interactive=False, format="png",
                                      elem_id=f"{p}cards-gallery")
            self.note = gr.Markdown(elem_id=f"{p}cards-note")
        self.shown = gr.State([])  # this browser's cards, in the gallery's order (server-side: never a client's path)

    def wire(self, prompt, model) -> None:
        folder = self.models_folder

        def show(kind, query):
            found, note = shown_cards(kind, query or "", folder)
            return [(thumbnail(c), c.name) for c in found], found, note

        def clicked(shown, text, evt: gr.SelectData):
            index = evt.index if isinstance(evt.index, int) else -1
            if not 0 <= index < len(shown or []):
                return gr.update(), gr.update(), gr.update(), gr.Gallery(selected_index=None)
            card = shown[index]
            if card.kind == "checkpoint":
                return gr.update(), previews.tag(card), card_text(card), gr.Gallery(selected_index=None)
            # selected_index back to None: a second click on the same card is a click again (it takes the tag out)
            return previews.toggled(text, card), gr.update(), card_text(card), gr.Gallery(selected_index=None)

        outputs = [self.gallery, self.shown, self.note]
        # one listing at a time, in the order asked (opening the accordion then picking Checkpoints at once must end
        # with the checkpoints shown)
        listing = {"api_visibility": "private", "show_progress": "hidden", "concurrency_id": f"{self.prefix}cards",
                   "concurrency_limit": 1}
        for event in (self.accordion.expand, self.kind.change, self.refresh.click):
            event(show, [self.kind, self.search], outputs, **listing)
        # change, not input: a pasted word filters too; always_last: typing fast runs one listing per pause
        self.search.change(show, [self.kind, self.search], outputs, trigger_mode="always_last", **listing)
        self.gallery.select(clicked, [self.shown, prompt], [prompt, model, self.note, self.gallery],
                            api_visibility="private", show_progress="hidden")
