"""The extra-network cards (issue 32 item 7, networks/previews.py and ui/cards.py): the cards of the LoRA, embedding and
checkpoint files in a models folder made in tmp_path, with the preview image A1111 keeps beside each file (its
order of names), the description and activation text, the search box's filter, the text a click puts in the prompt
or takes out, and that no client's name reaches a file other than a listed model's preview."""

from __future__ import annotations

import json

import pytest
from PIL import Image

from lowvram_gen.networks import previews


@pytest.fixture()
def models(tmp_path, monkeypatch):
    """A models root with two LoRAs, an embedding and a checkpoint, for the jobs' own scans."""
    for sub in ("Lora", "embeddings", "Stable-diffusion"):
        (tmp_path / sub).mkdir()
    (tmp_path / "Lora" / "film grain.safetensors").write_bytes(b"listed, not loaded")
    (tmp_path / "Lora" / "Pixel.safetensors").write_bytes(b"listed, not loaded")
    (tmp_path / "embeddings" / "EasyNegative.pt").write_bytes(b"listed, not loaded")
    (tmp_path / "Stable-diffusion" / "dream.safetensors").write_bytes(b"listed, not loaded")
    monkeypatch.setenv("LOWVRAM_GEN_MODELS", str(tmp_path))
    for name in ("LOWVRAM_GEN_LORA_DIR", "LOWVRAM_GEN_EMBEDDINGS_DIR", "LOWVRAM_GEN_CKPT_DIR"):
        monkeypatch.delenv(name, raising=False)
    return tmp_path


def _image(path, color=(200, 10, 10), size=(64, 48)):
    Image.new("RGB", size, color).save(path)
    return path


def test_a_card_per_file_with_the_preview_a1111_keeps_beside_it(models):
    preview = _image(models / "Lora" / "film grain.preview.png")
    _image(models / "embeddings" / "EasyNegative.webp")
    _image(models / "Stable-diffusion" / "dream.jpg")
    loras = previews.cards_of("lora")
    assert [c.name for c in loras] == ["film grain", "Pixel"]  # sorted ignoring case, as the picker
    assert loras[0].preview == preview and loras[1].preview is None
    assert previews.cards_of("embedding")[0].preview == models / "embeddings" / "EasyNegative.webp"
    checkpoint, = previews.cards_of("checkpoint")
    assert checkpoint.name == "dream" and checkpoint.preview == models / "Stable-diffusion" / "dream.jpg"
    assert checkpoint.value == str(models / "Stable-diffusion" / "dream.safetensors")  # the Model list's entry


def test_the_preview_names_in_a1111s_order(tmp_path):
    model = tmp_path / "x.safetensors"
    model.write_bytes(b"")
    assert previews.preview_of(model) is None
    for name in ("x.preview.webp", "x.jpg", "x.preview.png", "x.png"):  # each one found before the ones above it
        _image(tmp_path / name)
        assert previews.preview_of(model) == tmp_path / name
    folder = tmp_path / "pipe"  # a diffusers folder: its preview is beside it, named after it
    folder.mkdir()
    _image(tmp_path / "pipe.preview.jpeg")
    assert previews.preview_of(folder) == tmp_path / "pipe.preview.jpeg"


def test_description_and_activation_text_from_a1111s_files(models):
    (models / "Lora" / "Pixel.txt").write_text("eight-bit look\n")
    (models / "Lora" / "film grain.json").write_text(json.dumps(
        {"description": "grainy", "activation text": "film grain, 35mm", "preferred weight": 0.6}))
    grain, pixel = previews.cards_of("lora")
    assert (grain.description, grain.activation_text, grain.preferred_weight) == ("grainy", "film grain, 35mm", 0.6)
    assert pixel.description == "eight-bit look" and pixel.activation_text == ""
    (models / "Lora" / "Pixel.json").write_text("[" * 100 + "]" * 100)  # too deep: read as no metadata, card kept
    assert previews.cards_of("lora")[1].description == "eight-bit look"


def test_the_search_box_filters_by_every_word_ignoring_case(models):
    cards = previews.cards_of("lora")
    assert [c.name for c in previews.matching(cards, "GRAIN")] == ["film grain"]
    assert [c.name for c in previews.matching(cards, "film pix")] == []
    assert [c.name for c in previews.matching(cards, "  ")] == ["film grain", "Pixel"]
    (models / "Lora" / "Pixel.txt").write_text("retro games")
    assert [c.name for c in previews.matching(previews.cards_of("lora"), "retro")] == ["Pixel"]


def test_a_click_adds_the_tag_a1111_adds_and_a_second_click_takes_it_out(models):
    grain, pixel = previews.cards_of("lora")
    embedding, = previews.cards_of("embedding")
    checkpoint, = previews.cards_of("checkpoint")
    assert previews.tag(grain) == "<lora:film grain:1>"  # A1111's default multiplier, 1
    prompt = previews.toggled("a cat ", grain)
    assert prompt == "a cat <lora:film grain:1>"
    prompt = previews.toggled(prompt, embedding)
    assert prompt == "a cat <lora:film grain:1> EasyNegative"
    assert previews.toggled("", pixel) == "<lora:Pixel:1>"
    # a second click takes the tag out, at whatever weight the user set since
    assert previews.toggled("a cat <lora:film grain:0.4> EasyNegative", grain) == "a cat EasyNegative"
    assert previews.toggled("a cat EasyNegative", embedding) == "a cat"
    assert previews.toggled("EasyNegativeV2", embedding) == "EasyNegativeV2 EasyNegative"  # another word: added
    assert previews.tag(checkpoint) == checkpoint.value  # a checkpoint card sets the Model box


def test_a_loras_preferred_weight_and_activation_text_go_in_with_its_tag(models):
    (models / "Lora" / "film grain.json").write_text(json.dumps({"activation text": "grainy",
                                                                 "preferred weight": 0.75}))
    grain = previews.cards_of("lora")[0]
    assert previews.toggled("a cat", grain) == "a cat <lora:film grain:0.75> grainy"
    assert previews.toggled("a cat <lora:film grain:0.75> grainy", grain) == "a cat"


def test_the_picker_adds_the_same_tag_as_a_card(models):
    from lowvram_gen.ui import pickers

    grain = previews.cards_of("lora")[0]
    assert pickers.with_text("a cat", f"<lora:film grain:{previews.default_weight()}>") == \
        previews.toggled("a cat", grain)
    assert pickers.lora_choices() == [c.name for c in previews.cards_of("lora")]


def test_a_client_names_a_card_never_a_path(models, tmp_path_factory):
    outside = tmp_path_factory.mktemp("elsewhere")
    secret = _image(outside / "secret.png")
    assert previews.find_card("lora", "film grain").path == models / "Lora" / "film grain.safetensors"
    for name in (str(secret), "../../elsewhere/secret", str(outside / "secret"), "Pixel/../../x"):
        assert previews.find_card("lora", name) is None
    assert previews.find_card("/etc", "film grain") is None
    with pytest.raises(ValueError, match="extra-network kind '/etc'"):
        previews.cards_of("/etc")


def test_a_preview_is_only_a_file_beside_a_listed_model(models, tmp_path_factory):
    """A preview named like another file (a link out of the folder, a folder named .png) is not served as one."""
    outside = tmp_path_factory.mktemp("elsewhere")
    (models / "Lora" / "Pixel.png").mkdir()  # a folder, not an image file
    assert previews.cards_of("lora")[1].preview is None
    from lowvram_gen.ui import cards

    grain = previews.cards_of("lora")[0]
    assert cards.thumbnail(grain).size == (cards.THUMB, cards.THUMB)  # no preview: the placeholder
    (models / "Lora" / "film grain.png").write_bytes(b"not an image")
    assert cards.thumbnail(previews.cards_of("lora")[0]).size == (cards.THUMB, cards.THUMB)  # unreadable: same
    _image(outside / "big.png", size=(800, 400))
    (models / "Lora" / "film grain.png").unlink()
    (models / "Lora" / "film grain.png").symlink_to(outside / "big.png")
    small = cards.thumbnail(previews.cards_of("lora")[0])  # a link the user made beside the file: shown, small
    assert max(small.size) == cards.THUMB and small.size != (cards.THUMB, cards.THUMB)


def test_the_ui_shows_at_most_max_shown_cards_and_says_how_many_more(models, monkeypatch):
    from lowvram_gen.ui import cards

    monkeypatch.setattr(cards, "MAX_SHOWN", 1)
    shown, note = cards.shown_cards("lora", "")
    assert [c.name for c in shown] == ["film grain"] and "1 of 2 Lora cards shown" in note
    shown, note = cards.shown_cards("lora", "nothing like it")
    assert shown == [] and "No Lora card matches 'nothing like it'" in note
    shown, note = cards.shown_cards("embedding", "")
    assert [c.name for c in shown] == ["EasyNegative"]
    assert "Activation text" in cards.card_text(previews.Card("lora", "a<b", models, activation_text="x"))
    assert "a&lt;b" in cards.card_text(previews.Card("lora", "a<b", models))
