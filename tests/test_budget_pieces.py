"""offload = "budget" cut as fine as what streams asks: the piece tree (models/blocks.piece_tree), the split that cuts
it (planning/residency.split, one rule: `piece_limit`), a Linear cut by output rows (models/row_split.py) and a piece
its block calls twice held until the block ends (models/held.py), each against what the hooks move."""

from __future__ import annotations

import pytest
import torch

from lowvram_gen.engines.sd import apply as apply_mod
from lowvram_gen.engines.sd.traffic import count_onloads
from lowvram_gen.models import blocks as blocks_mod
from lowvram_gen.models.row_split import RowSplitLinear, cut_rows, join_rows
from lowvram_gen.networks.hooks import remove_offload_hooks
from lowvram_gen.planning import residency

WIDTH = 1024  # a WIDTH x WIDTH Linear is 1 M elements, over FLOOR (512 K): a piece the tree may cut


@pytest.mark.parametrize("k", [1, 2, 3, 7])
def test_a_linear_cut_by_rows_computes_the_same_and_joins_back_to_the_same_layer(k):
    torch.manual_seed(0)
    linear = torch.nn.Linear(48, 301)  # 301 rows: parts of unequal rows
    weight, bias = linear.weight.detach().clone(), linear.bias.detach().clone()
    x = torch.randn(2, 5, 48)
    reference = linear(x)
    holder = torch.nn.Module()
    holder.layer = linear
    assert cut_rows(holder, [f"layer.parts.{i}" for i in range(k)]) == 1
    cut = holder.layer
    assert isinstance(cut, RowSplitLinear) and len(cut.parts) == k
    assert [p.out_features for p in cut.parts] == [301 * (i + 1) // k - 301 * i // k for i in range(k)]
    assert torch.equal(cut(x), reference)
    assert sum(p.numel() for p in holder.parameters()) == weight.numel() + bias.numel()  # no copy kept beside them
    assert join_rows(holder) == 1
    assert type(holder.layer) is torch.nn.Linear and holder.layer is linear
    assert torch.equal(holder.layer.weight, weight) and torch.equal(holder.layer.bias, bias)


def test_only_a_plain_float_linear_is_cut_by_rows():
    class Sub(torch.nn.Linear):
        pass

    holder = torch.nn.Module()
    holder.layer = Sub(8, 8)
    with pytest.raises(ValueError, match="layer is a Sub, not a plain Linear"):
        cut_rows(holder, ["layer.parts.0", "layer.parts.1"])
    assert blocks_mod._rows(torch.nn.Linear(WIDTH, WIDTH)) == WIDTH
    assert blocks_mod._rows(Sub(WIDTH, WIDTH)) == 0  # a quantized or patched layer class stays whole
    assert blocks_mod._rows(torch.nn.Linear(8, 8)) == 0  # under FLOOR: never cut


TREE = [("b.0", 1000), ("b.0.x[rows=100]", 600), ("b.0.y", 390),  # 10 bytes of b.0 are its own (norms)
        ("b.1", 1000), ("b.1.x[rows=100]", 600), ("b.1.y", 390),
        ("b.2", 500)]


def test_the_split_cuts_the_blocks_only_as_fine_as_the_bytes_that_stream_ask():
    assert residency.piece_limit(2000) == 40  # SHARE of what streams
    much = residency.split(TREE, 500)  # 2000 bytes would stream: units of at most 40 bytes where they can be cut
    assert much.resident_bytes + much.streamed_bytes_per_step == 2500
    uncut = {"b.0.y", "b.1.y", "b.2"}  # no finer pieces: whole whatever the limit
    assert all(b <= 40 or n in uncut for n, b in zip(much.streamed, much.streamed_sizes))
    # each x cut into parts of whole rows (6 bytes a row), none over 40 bytes, adding up to the layer
    parts = [(n, b) for n, b in zip(much.streamed + much.resident, much.streamed_sizes + (None,) * 99)
             if n.startswith("b.1.x.parts.")]
    assert len(parts) == 17 and sum(b for _, b in parts if b is not None) <= 600
    assert "b.0.y" in much.resident  # the largest first
    assert much.resident_bytes == 20 + 390 + 2 * 36  # the two blocks' own bytes stay with the resident part
    whole = residency.split(TREE, 0)  # everything streams
    assert whole.streamed_bytes_per_step == 2500 - 20 and whole.resident_bytes == 20
    little = residency.split(TREE, 2200)  # 300 bytes would stream: units of one 6-byte row, and what stays fills
    assert 300 <= little.streamed_bytes_per_step <= 306 and set(little.streamed_sizes) == {6}  # to within one
    every = residency.split(TREE, 2500)  # nothing streams: nothing is cut
    assert every.resident == ("b.0", "b.1", "b.2") and every.streamed == ()
    # a flat list is the plain first-fit decreasing
    assert residency.roots(TREE) == [("b.0", 1000), ("b.1", 1000), ("b.2", 500)]
    assert residency.split(residency.roots(TREE), 1000).resident == ("b.0",)
    # the plan of a quantized denoiser cuts nothing by rows (its layers are no plain Linears)
    assert not any(".parts." in n for n in residency.split(TREE, 500, rows=False).streamed)


# two blocks, each with a held piece (a child its block calls twice) cut into two held layers of 100 bytes
HELD_TREE = [("b.0.attn", 90), ("b.0.ff[held]", 200), ("b.0.ff.a[held]", 100), ("b.0.ff.b[held]", 100),
             ("b.1.attn", 90), ("b.1.ff[held]", 200), ("b.1.ff.a[held]", 100), ("b.1.ff.b[held]", 100)]


def test_a_held_piece_is_cut_and_what_streams_of_it_is_spread_over_the_blocks():
    """A held piece's finer pieces are held by the same block (on the card until its forward ends), so the split
    counts in flight the most held bytes of one block that stream, and keeps the first held unit of each block
    resident before the second of any: with room for two of the four, one layer of each ff streams (100 bytes held at
    once), not both of the second block's (200)."""
    spread = residency.split(HELD_TREE, 200)
    assert spread.resident == ("b.0.ff.a", "b.1.ff.a")
    assert set(spread.held) == {"b.0.ff.b", "b.1.ff.b"} and spread.largest_held == 100
    assert spread.in_flight_bytes == 2 * 90 + 100  # the two attns in flight, one held layer
    both = residency.split(HELD_TREE, 300)  # three stay: one block's second layer streams alone
    assert both.held == ("b.1.ff.b",) and both.largest_held == 100
    none = residency.split(HELD_TREE, 0)  # all stream: a block holds both its layers at once
    assert none.largest_held == 200
    whole = residency.split([("b.0.ff[held]", 200), ("b.1.ff[held]", 200)], 200)  # uncut: a whole ff streams
    assert whole.held == ("b.1.ff",) and whole.largest_held == 200


class Block(torch.nn.Module):
    """A block whose forward calls its `ff` twice, as CogView4's does (image tokens, then text tokens)."""

    def __init__(self):
        super().__init__()
        self.norm = torch.nn.LayerNorm(WIDTH)
        self.attn = torch.nn.Linear(WIDTH, WIDTH)
        self.ff = torch.nn.Linear(WIDTH, WIDTH)

    def forward(self, x, y):
        x = self.attn(self.norm(x))
        return self.ff(x), self.ff(y)


class Toy(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.proj_in = torch.nn.Linear(8, WIDTH)
        self.blocks = torch.nn.ModuleList(Block() for _ in range(3))

    def forward(self, x):
        x = self.proj_in(x)
        y = x * 0.5
        for block in self.blocks:
            x, y = block(x, y)
        return x + y


class ToyPipe:
    """What PipelineOps.budget_offload reads of a pipeline: its components, the denoiser among them."""

    def __init__(self, transformer):
        self.transformer = transformer
        self.components = {"transformer": transformer}

    def remove_all_hooks(self):  # diffusers' model-offload hooks: none here
        pass


def test_the_tree_holds_a_twice_called_child_and_cuts_a_large_linear_by_rows():
    tree = blocks_mod.piece_tree(Toy())
    labels = [n for n, _ in tree]
    assert labels[:3] == ["blocks.0", f"blocks.0.attn[rows={WIDTH}]", f"blocks.0.ff[rows={WIDTH}][held]"]
    assert blocks_mod.held_piece(Toy(), "blocks.1.ff") and not blocks_mod.held_piece(Toy(), "blocks.1.attn")
    # a row part of the held layer is held by the same block (the `parts` list has no forward: looked through)
    assert blocks_mod.held_owner(Toy(), "blocks.1.ff") == "blocks.1"
    model = Toy()
    cut_rows(model, ["blocks.1.ff.parts.0", "blocks.1.ff.parts.1", "blocks.1.attn.parts.0", "blocks.1.attn.parts.1"])
    assert blocks_mod.held_owner(model, "blocks.1.ff.parts.1") == "blocks.1"
    assert blocks_mod.held_owner(model, "blocks.1.attn.parts.1") is None
    assert [n for n, _ in blocks_mod.blocks_of(Toy())] == ["blocks.0", "blocks.1", "blocks.2"]


@pytest.mark.parametrize("share", [1.0, 0.3])  # every piece streams / some stay resident
def test_what_the_hooks_move_is_the_split_with_row_parts_and_held_pieces(share):
    """budget_offload on a toy denoiser: what the hooks onload during each forward is exactly the split's streamed
    bytes (the held `ff` once, though called twice), and the output is the unhooked model's."""
    torch.manual_seed(0)
    model = Toy().eval()
    x = torch.randn(2, 4, 8)
    with torch.inference_mode():
        reference = model(x)
    tree = blocks_mod.piece_tree(model)
    total = sum(b for _, b in residency.roots(tree))
    resident = int(total * (1 - share)) if share < 1 else 0
    split = residency.split(tree, resident)
    assert any(".parts." in n for n in split.streamed)  # the attn layers stream in row parts
    # the held ffs are cut by rows as the attn layers are, each part held until its block ends: some stream
    assert split.held and all(".ff.parts." in n for n in split.held)
    assert split.largest_held == max(sum(b for n, b in zip(split.streamed, split.streamed_sizes)
                                         if n.startswith(f"blocks.{i}.ff.")) for i in range(3))
    with count_onloads() as meter:
        meter.watch(model)
        cut_rows(model, [*split.resident, *split.streamed])
        apply_mod.PipelineOps(ToyPipe(model)).budget_offload("cpu", split.streamed, use_stream=False)
        with torch.inference_mode():
            out = [model(x) for _ in range(2)]
    assert meter.forwards == [split.streamed_bytes_per_step] * 2 and split.streamed_bytes_per_step > 0
    assert all(torch.allclose(o, reference, rtol=0, atol=1e-6) for o in out)
    remove_offload_hooks(ToyPipe(model))  # hooks off, every layer whole again
    assert not any(isinstance(m, RowSplitLinear) for m in model.modules())
    assert not any(getattr(m, "_diffusers_hook", None) and m._diffusers_hook.hooks for m in model.modules())
    with torch.inference_mode():
        assert torch.equal(model(x), reference)
