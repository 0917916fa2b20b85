"""offload = "budget" phase by phase: what the planner counts in each phase, and what its split streams beyond the
lower bound (the bytes that cannot be resident).

The runner places the resident part at the denoiser's first forward, after the prompts are encoded
(engines/sd/stepdown.Runner.place_resident; test_budget.py checks that order on real jobs), so the estimate counts the
text phase without it, and the room it kept for that phase goes to resident blocks. What a planned split streams
beyond the lower bound is then only what streaming itself needs: the two streamed blocks in flight (the running one
and the prefetched next) and less than one block left over by keeping whole blocks.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from lowvram_gen.hardware.device import simulated
from lowvram_gen.models.profile import profile_builtin
from lowvram_gen.planning import residency
from lowvram_gen.planning.estimate import estimate
from lowvram_gen.planning.planner import plan
from lowvram_gen.presets import load_presets
from lowvram_gen.settings import MemorySettings

MiB = 2**20
# every built-in transformer family with shipped configs (SD3 aside: no budget row in the benchmark either)
FAMILIES = ("flux", "flux-kontext", "chroma", "flux2-klein", "flux2-klein-9b", "flux2-dev", "z-image", "qwen-image",
            "lumina2", "sana", "hidream", "cogview4")


def budget(resident_bytes: int) -> MemorySettings:
    return MemorySettings(dtype="bfloat16", offload="budget", resident_bytes=resident_bytes)


def test_the_text_phase_of_a_budget_split_does_not_hold_its_resident_part():
    """Flux.2 Klein with prompts of 16384 tokens, so that encoding them is the peak: the estimate's total then
    does not grow with the resident bytes (it did when the resident part was counted in the text phase), and once
    the resident part outgrows the encoding the denoise is the peak."""
    profile = profile_builtin("flux2-klein")
    profile = replace(profile, text_tokens=tuple(16384 for _ in profile.text_hidden))
    blocks = sum(c for _, c in profile.residency_blocks) * 2
    rows = [estimate(profile, 1024, 1024, 1, budget(int(blocks * f) + 1)) for f in (0, 0.02, 0.05, 0.1, 0.15, 1)]
    text = [r for r in rows if r.peak_phase == "text"]
    assert len({r.resident_bytes for r in text}) >= 3  # the text phase is the peak at several splits
    assert len({r.total_bytes for r in text}) == 1  # ... and the same peak at each
    assert rows[-1].peak_phase == "unet" and rows[-1].total_bytes > text[0].total_bytes


@pytest.mark.parametrize("key", FAMILIES)
def test_a_planned_split_streams_beyond_the_lower_bound_only_the_blocks_in_flight_and_less_than_a_block(key):
    """The planner's pick for the family's 1024x1024 job on 6, 8 and 12 GiB cards (plan --vram, 512 MiB reserve),
    where it is a 16-bit budget split: streamed - lower bound <= the two blocks in flight + the largest streamed
    block (what whole blocks leave over). With the text phase counting the resident part, Lumina 2 on 6 GiB
    streamed 941 MiB over its 22 MiB lower bound (in flight 333, a block 167) and CogView4 on 8 GiB 1451 MiB
    (864 + 432). And issue 30's bar: at most 1.05 x the lower bound, since the streamed units are cut to a share of
    what streams (residency.piece_limit) and a layer larger than that by rows (Flux.2 Klein on 8 GiB streamed 1.148 x
    before, two pieces of a fused 162 MiB layer in flight against a 0.7 GiB bound; Lumina 2 on 6 GiB 1.164 x), a held
    piece too: CogView4's 256 MiB `ff`, on the card for its whole block beside the two in flight, kept it at 1.051 /
    1.071 x on 6 / 8 GiB until it was cut as the rest is, its parts spread over the blocks (at most 128 / 64 MiB of
    one block's held parts stream: 1.034 / 1.035 x)."""
    profile = profile_builtin(key)
    checked = 0
    for gib in (6, 8, 12):
        result = plan(simulated(f"{gib}GiB", reserve_bytes=512 * MiB), profile, 1024, 1024, 1, load_presets())
        memory = result.preset.memory
        if memory.offload != "budget" or memory.quantize != "none" or memory.fp8_storage:
            continue
        chosen = next(e for e in result.estimates if e.name == result.preset.name)
        split = residency.split([(n, c * 2) for n, c in profile.residency_blocks], memory.resident_bytes)
        assert chosen.streamed_bytes_per_step == split.streamed_bytes_per_step
        excess = chosen.streamed_bytes_per_step - chosen.lower_bound_bytes_per_step
        assert 0 <= excess <= split.in_flight_bytes + split.largest_streamed, (gib, excess / MiB)
        assert excess <= 0.05 * chosen.lower_bound_bytes_per_step, (gib, excess / MiB)
        checked += 1
    if key in ("flux", "qwen-image", "lumina2", "cogview4", "z-image"):  # these stream on one card at least
        assert checked


def _meta(key: str):
    import json

    import diffusers
    from accelerate import init_empty_weights

    from lowvram_gen.models.profile import CONFIGS

    cfg = json.loads((CONFIGS / key / "transformer" / "config.json").read_text())
    with init_empty_weights():
        return getattr(diffusers, cfg["_class_name"]).from_config(cfg)


@pytest.mark.parametrize("key", ["flux", "qwen-image", "hidream"])
def test_a_transformer_block_streams_as_pieces_the_forward_calls(key):
    """models/blocks.py: each block of a top-level list is streamed as pieces of at most PIECE elements where its
    layers allow (a larger piece is one layer, or a router's experts kept together), each one a module whose forward
    runs (never a ModuleList/ModuleDict, which has none); blocks and fixed part still add up to the whole model."""
    import torch

    from lowvram_gen.models import blocks as blocks_mod

    model = _meta(key)
    pieces = blocks_mod.block_modules(model)
    names = [n for n, _ in pieces]
    listed = sum(len(c) for c in model.children() if isinstance(c, torch.nn.ModuleList))
    assert len(set(names)) == len(names) and len(pieces) > 2 * listed
    for name, module in pieces:
        assert model.get_submodule(name) is module
        assert not isinstance(module, (torch.nn.ModuleList, torch.nn.ModuleDict)), name
        numel = sum(p.numel() for p in module.parameters())
        leaf = not any(sum(p.numel() for p in c.parameters()) for c in module.children())
        assert numel <= blocks_mod.PIECE or leaf or blocks_mod._routed(module), (name, numel)
    total = blocks_mod.module_bytes(model, 2)
    assert sum(b for _, b in blocks_mod.blocks_of(model, 2)) + blocks_mod.fixed_bytes(model, 2) == total
    assert blocks_mod.fixed_bytes(model, 2) < total // 50  # what stays whatever the budget: a few percent
    if key == "hidream":  # the mixture of experts of each block is one piece
        assert any(n.endswith(".ff_i") and blocks_mod._routed(m) for n, m in pieces)


def test_a_child_the_forward_calls_twice_is_a_held_piece():
    """models/blocks.py: a hook onloads a piece each time the forward calls it, while the plan counts it once. So a
    child called twice on one path (CogView4's `ff`, on the image then the text tokens) is held on the card from its
    first call until its block's forward ends (models/held.py; test_budget_pieces.py measures it): one of the
    coarsest units whole, and below it finer pieces (here its rows) that are held as well; one under FLOOR joins the
    fixed part; calls in the two arms of an `if` are one."""
    import torch

    from lowvram_gen.models import blocks as blocks_mod

    big = blocks_mod.PIECE // 1024 + 1  # a Linear of big x 1024 elements is over PIECE

    class TwiceBig(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.attn, self.ff = torch.nn.Linear(1024, big, bias=False), torch.nn.Linear(1024, big, bias=False)

        def forward(self, x, y):
            return self.ff(self.attn(x)), self.ff(y)

    class TwiceSmall(TwiceBig):
        def __init__(self):
            super().__init__()
            self.mod = torch.nn.Linear(1024, 256, bias=False)  # under FLOOR

        def forward(self, x, y):
            return self.attn(x) * self.mod(y) + self.ff(x) * self.mod(x)

    class EachArm(TwiceBig):
        def forward(self, x, y=None):
            if y is None:
                return self.ff(self.attn(x))
            else:
                return self.ff(self.attn(y))

    with torch.device("meta"):
        model = torch.nn.Module()
        model.blocks = torch.nn.ModuleList([TwiceBig(), TwiceSmall(), EachArm()])
    names = [name for name, _ in blocks_mod.blocks_of(model)]
    assert names == ["blocks.0.attn", "blocks.0.ff", "blocks.1.attn", "blocks.1.ff", "blocks.2.attn", "blocks.2.ff"]
    labels = [label for label, _ in blocks_mod.piece_tree(model)]
    assert labels == [f"blocks.0.attn[rows={big}]", f"blocks.0.ff[rows={big}][held]", f"blocks.1.attn[rows={big}]",
                      f"blocks.1.ff[rows={big}]", f"blocks.2.attn[rows={big}]", f"blocks.2.ff[rows={big}]"]
    assert blocks_mod.fixed_bytes(model, 2) == 1024 * 256 * 2  # TwiceSmall's `mod`, called twice, stays resident


def test_cogview4s_twice_called_ff_is_a_held_piece_and_the_rest_of_its_block_streams_in_pieces():
    """The real classes: CogView4's block calls its 256 MiB `ff` twice a forward (measured: 10.47 GiB a step moved
    against 7.60 planned at 6 GiB while it was split with a plain hook), so `ff` is held, and the rest of the block is
    cut as any other (it was kept whole before: 1.17-1.76x the lower bound); `ff` is one of `blocks_of`'s units and
    its layers, held too, may be cut by rows; FLUX.1's blocks call each child once."""
    from diffusers.models.transformers import transformer_cogview4, transformer_flux

    from lowvram_gen.models import blocks as blocks_mod

    cog = transformer_cogview4.CogView4TransformerBlock
    assert blocks_mod._called_twice(cog, frozenset({"ff", "attn1", "norm1", "norm2"})) == {"ff"}
    for cls in (transformer_flux.FluxTransformerBlock, transformer_flux.FluxSingleTransformerBlock):
        assert blocks_mod._called_twice(cls, frozenset({"ff", "ff_context", "attn", "norm1", "proj_mlp"})) == set()
    model = _meta("cogview4")
    labels = [label for label, _ in blocks_mod.piece_tree(model, 2)]
    layers = len(model.transformer_blocks)
    held = [label for label in labels if label.endswith("[held]")]
    assert held == [f"transformer_blocks.{i}.ff{part}[held]" for i in range(layers)
                    for part in ("", ".net.0", ".net.0.proj[rows=16384]", ".net.2[rows=4096]")]
    assert [n for n, _ in blocks_mod.blocks_of(model)].count("transformer_blocks.0.ff") == 1  # whole there
    assert {blocks_mod.held_owner(model, "transformer_blocks.3.ff.net.2")} == {"transformer_blocks.3"}
    assert "transformer_blocks.0.attn1.to_q[rows=4096]" in labels
