"""The LoRA and embedding pickers of txt2img, img2img and Inpaint with the button that rescans their folders, and the
Refresh button beside the Model box that rescans the models (A1111's, beside its checkpoint box).

The buttons say "Refresh" in words: an emoji label (🔄) is an empty box on a machine without an emoji font.
Rescans run in the queue, so an error in one reaches the user (gradio shows nothing of an unqueued event's).

Picking a LoRA adds `<lora:NAME:1>` to the prompt, picking an embedding adds its name: what an A1111
user types (prompt syntax and lookup: lowvram_gen/networks/). The lists are the files in
`models/Lora` and `models/embeddings` (under ./models or $LOWVRAM_GEN_MODELS), as the jobs find them.
"""

from __future__ import annotations

import gradio as gr

from lowvram_gen.models.discover import model_choices
from lowvram_gen.networks.embeddings import available_embeddings
from lowvram_gen.networks import previews
from lowvram_gen.networks.lora import available_loras


def lora_choices() -> list[str]:
    return sorted(available_loras(), key=str.lower)


def embedding_choices() -> list[str]:
    return sorted(available_embeddings(), key=str.lower)


with_text = previews.appended  # `prompt` with `text` added at its end, a space between (as the cards add)


def refresh_button(elem_id: str) -> gr.Button:
    return gr.Button("Refresh", size="sm", scale=0, min_width=80, elem_id=elem_id)


def model_refresh(model: gr.Dropdown, models_folder, elem_id: str) -> None:
    """The Refresh button beside the Model box (call right after the box, in its row): the models found now."""
    refresh = refresh_button(elem_id)
    refresh.click(lambda: gr.Dropdown(choices=model_choices(models_folder)), None, [model],
                  api_visibility="private", show_progress="hidden")


def model_row(options, prefix: str, label: str = "Model") -> tuple[gr.Dropdown, gr.Dropdown]:
    """A row with the Model box, its Refresh and the Quantize choice (txt2img, img2img, Inpaint): (model, quantize),
    elem_ids `{prefix}model`, `{prefix}model-refresh`, `{prefix}quantize`."""
    from lowvram_gen.ui.widgets import AS_PRESET, Quantize

    with gr.Row():
        model = gr.Dropdown(model_choices(options.models_folder), value=options.model, allow_custom_value=True,
                            label=label, elem_id=f"{prefix}model")
        model_refresh(model, options.models_folder, f"{prefix}model-refresh")
        quantize = Quantize(AS_PRESET, f"{prefix}quantize")
    return model, quantize


def build(prompt: gr.Textbox, prefix: str) -> None:
    """A row with the two pickers and their Refresh; call inside the tab's layout."""
    with gr.Row():
        lora = gr.Dropdown(lora_choices(), value=None, label="Add a LoRA", elem_id=f"{prefix}lora-picker")
        embedding = gr.Dropdown(embedding_choices(), value=None, label="Add an embedding",
                                elem_id=f"{prefix}embedding-picker")
        refresh = refresh_button(f"{prefix}refresh")

    def add_lora(text, name):
        return (with_text(text, f"<lora:{name}:{previews.default_weight()}>") if name else gr.update()), None

    def add_embedding(text, name):
        return (with_text(text, name) if name else gr.update()), None

    def rescan():
        return gr.Dropdown(choices=lora_choices()), gr.Dropdown(choices=embedding_choices())

    # .input: the user's pick only, not the reset to None that follows it
    lora.input(add_lora, [prompt, lora], [prompt, lora], queue=False, api_visibility="private")
    embedding.input(add_embedding, [prompt, embedding], [prompt, embedding], queue=False, api_visibility="private")
    refresh.click(rescan, None, [lora, embedding], api_visibility="private", show_progress="hidden")
