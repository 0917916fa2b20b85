"""A denoiser's blocks: the units budget offload streams (`blocks_of`, in execution order, with their bytes),
the part outside them that always stays (`fixed_bytes`), and group offload's groups (`block_sizes`).

What a model is made of, counted on a loaded model or on one built on the meta device from its config (no
weights): the memory profile (models/profile.py) counts them from configs, engines/sd/apply.py on the loaded
model, and planning/residency.py splits them under a byte budget, so the plan and what runs agree.

Blocks. Each element of a top-level ModuleList/Sequential is a block (a transformer's
`transformer_blocks`, Flux's `single_transformer_blocks`). A block (or a top-level child such as the
UNet's `mid_block`) that holds ModuleLists itself, as diffusers' UNet blocks do (`resnets`,
`attentions`, `downsamplers`/`upsamplers`), is split into their elements, so the unit of streaming
is one ResNet or one attention transformer (SDXL's largest, a 10-layer transformer at 1280 channels,
is 0.6 GB in fp16 instead of a 1.3 GB down block). Execution order inside such a block:
`resnets[i]` then `attentions[i]` for each i (diffusers' down, mid and up blocks all run that way),
then the other lists (the samplers) in definition order. Everything that is in no block (conv_in/out,
the time and text embeddings, the output norm, parameters of the blocks' own) is the fixed part: it
is always resident and is not counted in `resident_bytes` (`fixed_bytes`).

Pieces. A transformer block (or any unit over PIECE elements) is cut into the modules its forward calls, down to
pieces of at most PIECE elements (`block_modules`, `blocks_of`: the coarsest units, which add up with the fixed part
to the whole model). How fine the units that stream must be depends on how much streams: two of them are in flight
beside the resident part, so a split that streams little wants small ones and one that streams much does not need
them (and pays a hook per unit). `piece_tree` therefore lists, below each of those pieces, the finer pieces it may
be cut into, down to FLOOR elements, in pre-order (a piece's finer pieces follow it, named below it), with two
annotations after a name: `[rows=N]` on a plain Linear that may be cut by output rows into sub-linears
(models/row_split.py; a quantized or hooked layer is not plain and stays whole), `[held]` on a child the block's
forward calls twice (CogView4's `ff`) and on every piece below it, which stay on the card from their first call until
the block's forward ends (`held_owner` names that block; `blocks_of` keeps the held child whole).
planning/residency.py cuts the tree where the bytes that stream ask for it (`residency.piece_limit`: one rule for the
plan and for what is applied).
"""

from __future__ import annotations

import ast
import collections
import functools
import inspect
import textwrap

# UNet blocks run resnets[i] then attentions[i]; the other lists of a block (samplers) run after them.
_INTERLEAVED = ("resnets", "attentions")
# The largest piece of a transformer block streamed as one unit (elements, 64 MiB in 16 bits): while one streams,
# the next is prefetched, so what a split streams beyond the bytes that cannot stay is about two pieces in flight and
# less than one left over by whole pieces (FLUX.1's 648 MiB double blocks cost 1.3 GiB in flight; pieces 0.2 GiB).
PIECE = 1 << 25
# The finest piece (elements, 1 MiB in 16 bits): a child smaller than this joins the fixed part where its parent is
# cut, since a hook on it would cost more than the bytes it saves; the tree stops above it.
FLOOR = PIECE // 64


def _is_list(module) -> bool:
    import torch

    return isinstance(module, (torch.nn.ModuleList, torch.nn.Sequential))


def _units(name: str, module) -> list[tuple[str, object]]:
    """`module` as streamable units: itself, or the elements of its ModuleLists in execution order. A
    unit that itself holds one block list (a UNet attention's `transformer_blocks`: SDXL's 10-layer
    transformers are 0.6 GB each in fp16) is split into those blocks, so two units in flight stay small
    and the budget is filled to within a block of ~60 MB; what sits around the list (norm, proj_in,
    proj_out) joins the always-resident fixed part."""
    lists = [(n, c) for n, c in module.named_children() if _is_list(c)]
    if not lists or _numel(*(c for _, c in lists)) * 2 < _numel(module):
        # no lists, or lists that are not the module's body: a transformer block whose small Sequentials (Qwen-Image's
        # img_mod / txt_mod modulation, a third of it) would leave its attention and MLPs in the fixed part
        return _pieces(name, module)
    by_name = dict(lists)
    out = []
    interleaved = [by_name[n] for n in _INTERLEAVED if n in by_name]
    for i in range(max((len(x) for x in interleaved), default=0)):
        for list_name in _INTERLEAVED:
            if list_name in by_name and i < len(by_name[list_name]):
                out.extend(_inner_blocks(f"{name}.{list_name}.{i}", by_name[list_name][i]))
    for list_name, child in lists:
        if list_name not in _INTERLEAVED:
            for i, m in enumerate(child):
                out.extend(_inner_blocks(f"{name}.{list_name}.{i}", m))
    return out


def _pieces(name: str, module) -> list[tuple[str, object]]:
    """A transformer block as streamable pieces of at most PIECE elements where its layers allow: the block whole
    when it is that small, else its children, each split the same way (a layer larger than PIECE, such as FLUX.1's
    56.6 M-element modulation, is one piece here; residency may cut it by rows). Pieces are modules the forward calls:
    a ModuleList/ModuleDict (which has no forward) is always split into its elements. Children of fewer than FLOOR
    elements (norms, the block's own parameters) join the fixed part, where a hook would cost more than the bytes it
    saves. A module holding a list of like modules (HiDream's mixture of experts) stays whole: the router may skip an
    expert in a step, and a skipped piece would not move what the plan counts (nor free what its prefetch brought). A
    child the forward calls twice is a piece of its own, held on the card until the block's forward ends (`_tree`;
    here whole, in `piece_tree` with the finer pieces it may be cut into), or in the fixed part when it is smaller
    than FLOOR."""
    return [(node.name, node.module) for node in _cut(_tree(name, module), PIECE)]


class _Node:
    """A piece and the finer pieces it may be cut into (`children`, none under FLOOR elements); `rows`: the output
    rows of a plain Linear that may be cut by rows; `held`: a child its parent's forward calls twice."""

    __slots__ = ("name", "module", "numel", "children", "rows", "held")

    def __init__(self, name, module, children=(), rows=0, held=False):
        self.name, self.module, self.numel = name, module, _numel(module)
        self.children, self.rows, self.held = list(children), rows, held


def _tree(name: str, module, held: bool = False) -> _Node:
    """`module` with the finer pieces it may be cut into: its children of FLOOR elements or more (a ModuleList's or
    ModuleDict's elements in its place), except where it is routed (`_routed`). Below a held piece every piece is held
    too: it is called as often as the piece is, and stays on the card with it until the same block's forward ends."""
    if _routed(module) or not any(True for _ in module.children()):
        return _Node(name, module, rows=_rows(module), held=held)
    twice = _called_twice(type(module), frozenset(n for n, _ in module.named_children()))
    children = []
    for child_name, child in module.named_children():
        path = f"{name}.{child_name}"
        if _numel(child) < FLOOR:
            continue  # the fixed part where this module is cut
        if isinstance(child, _NO_FORWARD()):
            children += [_tree(f"{path}.{i}", m, held=held) for i, m in child.named_children() if _numel(m) >= FLOOR]
        else:
            children.append(_tree(path, child, held=held or child_name in twice))
    return _Node(name, module, children, held=held)


def _rows(module) -> int:
    """Output rows of a plain float Linear over FLOOR elements, which models/row_split.py can cut; 0 otherwise (a
    quantized layer, one with hooks of its own such as layerwise casting, or a Linear subclass stays whole)."""
    import torch

    registry = getattr(module, "_diffusers_hook", None)
    if type(module) is not torch.nn.Linear or _numel(module) <= FLOOR or not module.weight.dtype.is_floating_point \
            or hasattr(module, "_hf_hook") or registry is not None and registry.get_hook("layerwise_casting"):
        return 0
    return int(module.out_features)


def _cut(node: _Node, limit: int) -> list[_Node]:
    """The pieces of `node` of at most `limit` elements (a node with no finer pieces as it is); ModuleLists and
    ModuleDicts are never pieces (the tree holds none)."""
    if node.numel <= limit or not node.children or node.held:  # a held piece is one of `blocks_of`'s units whole
        return [node]
    return [piece for child in node.children for piece in _cut(child, limit)]


def _label(node: _Node) -> str:
    return node.name + (f"[rows={node.rows}]" if node.rows else "") + ("[held]" if node.held else "")


def _pre_order(node: _Node, bytes_per_element: int | None, out: list) -> list:
    out.append((_label(node), module_bytes(node.module, bytes_per_element)))
    for child in node.children:
        _pre_order(child, bytes_per_element, out)
    return out


def _routed(module) -> bool:
    """Whether `module` holds a list of two or more modules of one class with weights (experts a router picks)."""
    for child in module.children():
        if isinstance(child, _NO_FORWARD()) and len(child) > 1:
            members = list(child.values() if hasattr(child, "values") else child)
            if len({type(m) for m in members}) == 1 and _numel(members[0]) > 0:
                return True
    return False


@functools.cache
def _called_twice(cls, children: frozenset) -> frozenset:
    """The children that `cls.forward` calls twice on one path through it (CogView4's block runs its `ff` on the
    image tokens, then on the text tokens; Z-Image's its `adaLN_modulation` on the noisy and the clean tokens of an
    edit). A hook would onload such a piece twice a step while the plan counts it once, so `_tree` keeps a small
    one in the fixed part (always resident, no traffic) and marks a large one held (models/held.py). Calls in
    the two arms of an `if` are one path's alternatives (Lumina 2's blocks call `attention` in each arm), so they
    count once; a call in a loop counts as twice. Read from the forward's source; where there is none (a compiled
    class), nothing is taken as called twice."""
    try:
        source = textwrap.dedent(inspect.getsource(cls.forward))
    except (OSError, TypeError, AttributeError):
        return frozenset()
    calls = _self_calls(ast.parse(source).body[0].body)
    return frozenset(name for name, n in calls.items() if n > 1 and name in children)


def _self_calls(statements) -> collections.Counter:
    """The most times each `self.NAME(...)` is called on any one path through `statements` (see above)."""
    total = collections.Counter()
    for node in statements:
        if isinstance(node, ast.If):
            total += _calls_in(node.test) | (_self_calls(node.body) | _self_calls(node.orelse))
        elif isinstance(node, (ast.For, ast.AsyncFor, ast.While)):
            total += _calls_in(getattr(node, "iter", None) or node.test)
            total += collections.Counter({k: 2 for k in _self_calls(node.body)})
        elif isinstance(node, (ast.With, ast.AsyncWith, ast.Try)):
            total += _self_calls(node.body) + _self_calls(getattr(node, "orelse", []))
        else:
            total += _calls_in(node)
    return total


def _calls_in(node) -> collections.Counter:
    """The `self.NAME(...)` calls anywhere inside one statement or expression (a conditional expression's two
    arms both counted: the safe side)."""
    return collections.Counter(
        call.func.attr for call in ast.walk(node) if isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute)
        and isinstance(call.func.value, ast.Name) and call.func.value.id == "self")


def _NO_FORWARD() -> tuple:
    import torch

    return (torch.nn.ModuleList, torch.nn.ModuleDict)


def _numel(*modules) -> int:
    return sum(p.numel() for m in modules for p in m.parameters())


def _inner_blocks(name: str, module) -> list[tuple[str, object]]:
    """`module` whole, or the elements of its one block list when it has exactly one (see `_units`)."""
    lists = [(n, c) for n, c in module.named_children() if _is_list(c)]
    if len(lists) == 1 and len(lists[0][1]) > 1:
        list_name, child = lists[0]
        return [(f"{name}.{list_name}.{i}", m) for i, m in enumerate(child)]
    return [(name, module)]


def _top_level(module) -> list[tuple[str, object]]:
    """Children in execution order: definition order, except that diffusers' UNets register `up_blocks`
    before `mid_block`, which runs between the down and the up blocks."""
    children = list(module.named_children())
    names = [n for n, _ in children]
    if "mid_block" in names and "up_blocks" in names and names.index("mid_block") > names.index("up_blocks"):
        mid = children.pop(names.index("mid_block"))
        children.insert(names.index("up_blocks"), mid)
    return children


def block_modules(module) -> list[tuple[str, object]]:
    """The streamable blocks of a denoiser as (name, submodule), in execution order (see the module doc)."""
    out = []
    for name, child in _top_level(module):
        if _is_list(child):
            for i, element in enumerate(child):
                out.extend(_units(f"{name}.{i}", element))
        elif any(_is_list(c) for c in child.children()):
            out.extend(_units(name, child))
    return out


def piece_tree(module, bytes_per_element: int | None = None) -> list[tuple[str, int]]:
    """[(label, bytes)]: each of `blocks_of`'s blocks followed by the finer pieces it may be cut into, in pre-order
    (see the module doc for the labels); planning/residency.py cuts it. A block that is not cut further is listed
    alone, so on a model with no piece over FLOOR elements (the tiny test models) this is `blocks_of`."""
    out = []
    for name, m in block_modules(module):
        _pre_order(_tree(name, m, held=held_owner(module, name) is not None), bytes_per_element, out)
    return out


def held_owner(model, name: str) -> str | None:
    """The name of the module whose forward calls the piece `name` of `model`, or a module above it, twice (CogView4's
    block, which calls its `ff` on the image and then the text tokens): budget offload holds the piece on the card from
    its first call until that forward ends (models/held.py). None where no forward above the piece calls it twice
    (a row part's `parts` list and any ModuleList in the path have no forward: looked through)."""
    child = name
    while "." in child:
        parent = child.rpartition(".")[0]
        owner = model.get_submodule(parent)
        if not isinstance(owner, _NO_FORWARD()) and child.rpartition(".")[2] in _called_twice(
                type(owner), frozenset(n for n, _ in owner.named_children())):
            return parent
        child = parent
    return None


def held_piece(model, name: str) -> bool:
    """Whether the piece `name` of `model` is held on the card until a forward above it ends (`held_owner`)."""
    return held_owner(model, name) is not None


def _tensor_bytes(tensors, bytes_per_element: int | None) -> int:
    total, seen = 0, set()
    for t in tensors:
        if id(t) in seen:
            continue
        seen.add(id(t))
        size = bytes_per_element if bytes_per_element and t.dtype.is_floating_point else t.element_size()
        total += t.numel() * size
    return total


def module_bytes(module, bytes_per_element: int | None = None) -> int:
    """Parameter and buffer bytes of `module` (`bytes_per_element`: count floating tensors at that size,
    e.g. 2 for a float16 plan of a model built in float32 on the meta device)."""
    return _tensor_bytes([*module.parameters(), *module.buffers()], bytes_per_element)


def blocks_of(module, bytes_per_element: int | None = None) -> list[tuple[str, int]]:
    """[(name, bytes)] of the denoiser's streamable blocks in execution order; works on a meta-device
    model (bytes from shapes and dtypes). Names are `module.get_submodule` paths."""
    return [(name, module_bytes(m, bytes_per_element)) for name, m in block_modules(module)]


def fixed_bytes(module, bytes_per_element: int | None = None) -> int:
    """Bytes of the denoiser outside every block: always resident under offload = "budget"."""
    return module_bytes(module, bytes_per_element) - sum(b for _, b in blocks_of(module, bytes_per_element))


def block_sizes(model) -> tuple[list[int], int, int]:
    """The parameter counts of a denoiser's (or ControlNet's) blocks, the units group offload and the budget stream:
    each block of its ModuleLists/Sequentials, the sum of those, and the model's whole count."""
    import torch

    blocks = [sum(p.numel() for p in block.parameters())
              for child in model.children() if isinstance(child, (torch.nn.ModuleList, torch.nn.Sequential))
              for block in child]
    return blocks, sum(blocks), sum(p.numel() for p in model.parameters())
