"""A1111's Styles under the prompts of txt2img, img2img and Inpaint: a multi-select of the styles file's styles (the
session's: `--styles-file`, else styles.csv where lowvram-gen runs), 🖌 (A1111's "apply": the selected styles'
text written into the prompt boxes, the selection cleared, so nothing is applied twice), 🔄 (read the file
again) and 💾 "save as style" (the prompt boxes become a style of the name typed beside it; every tab's list is
refreshed).

The selection is a Generate input: the Session applies it to the prompts when the job runs (prompting/styles.py),
so the boxes keep the user's own text, and the PNG the expanded prompts, as A1111's. A style the list does not
know (a name an API client sends, or one removed from the file since) is refused by the job in one sentence.

(No `from __future__ import annotations`: gradio reads real annotations.)
"""

import logging

import gradio as gr

from lowvram_gen.errors import LowVramError
from lowvram_gen.ui import messages

log = logging.getLogger(__name__)


def _names(session) -> list[str]:
    """The styles' names; none (said on the console) when the file cannot be read, so the page still opens."""
    try:
        return session.style_book().names
    except LowVramError as exc:
        log.warning("no styles in the Styles lists: %s", exc)
        return []


def row(ctx, prefix: str, prompt, negative) -> gr.Dropdown:
    """The Styles row under a tab's prompts; returns the multi-select (the tab's `styles` control)."""
    session = ctx.session
    with gr.Row(equal_height=False):  # one row under the prompts: the page below moves down by one line only
        styles = gr.Dropdown(_names(session), value=[], multiselect=True, allow_custom_value=True, label="Styles",
                             elem_id=f"{prefix}styles", scale=4)
        apply = gr.Button("🖌 apply", size="sm", min_width=80, scale=0, elem_id=f"{prefix}styles-apply")
        refresh = gr.Button("🔄 reload", size="sm", min_width=80, scale=0, elem_id=f"{prefix}styles-refresh")
        name = gr.Textbox(label="Save the prompts as style", placeholder="style name", max_lines=1,
                          elem_id=f"{prefix}style-name", scale=2)
        save = gr.Button("💾 save", size="sm", min_width=80, scale=0, elem_id=f"{prefix}style-save")
    lists = ctx.style_lists
    lists.append(styles)

    def applied(text, negative_text, chosen, request: gr.Request = None):
        try:
            text, negative_text = session.style_book().expand(text or "", negative_text or "", chosen or [])
        except LowVramError as exc:
            raise messages.error(exc, request) from None
        return text, negative_text, []

    def refreshed():
        return gr.Dropdown(choices=_names(session))

    def saved(style_name, text, negative_text, request: gr.Request = None):
        try:
            book = session.save_style(style_name, text, negative_text)
        except LowVramError as exc:
            raise messages.error(exc, request) from None
        gr.Info(f"saved style {style_name.strip()!r} in {book.path}")
        return (gr.Textbox(value=""), *(gr.Dropdown(choices=book.names) for _ in lists))

    apply.click(applied, [prompt, negative, styles], [prompt, negative, styles], api_visibility="private",
                show_progress="hidden")
    refresh.click(refreshed, None, [styles], api_visibility="private", show_progress="hidden")
    # wired once every tab is built: a save refreshes every tab's list
    ctx.later(lambda: save.click(saved, [name, prompt, negative], [name, *lists], api_visibility="private",
                                 show_progress="hidden"))
    return styles
