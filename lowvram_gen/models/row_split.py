"""A Linear cut by output rows into sub-linears, so budget offload can stream a layer larger than the piece a split
wants (Flux.2 Klein's fused 162 MiB projections against a bound of 0.7 GiB) in parts, each with its own hook.

planning/residency.py names the parts `<layer>.parts.<i>` (k parts of rows[i*r//k : (i+1)*r//k]); `cut_rows` puts
`RowSplitLinear`s in their layers' places on the loaded model before the hooks go on, and `join_rows` puts the plain
Linears back (networks/hooks.remove_offload_hooks calls it, so LoRA loading, casting and every other offload see the
model as it was). The forward concatenates the parts' outputs: the same rows of the same product (tested equal).
Only a plain float nn.Linear is cut (models/blocks._rows): a quantized layer, or one with casting hooks of its own,
stays whole. The parts are views of their rows (nothing is copied; the layer itself lets go of its weight), so once
the hooks have moved the streamed parts to their pinned copies and the resident ones to the device, the layer's host
storage goes as the whole layer's would; joining copies the parts back into one weight on the host.
"""

from __future__ import annotations

import re

import torch

_PART = re.compile(r"^(?P<layer>.+)\.parts\.(?P<i>\d+)$")


class RowSplitLinear(torch.nn.Module):
    """`linear` as `k` Linears over consecutive output rows; `forward` concatenates their outputs."""

    def __init__(self, linear: torch.nn.Linear, k: int):
        super().__init__()
        rows = linear.out_features
        self.in_features, self.out_features = linear.in_features, rows
        self.parts = torch.nn.ModuleList()
        # on the host first: a view of a layer on the device would keep all of its rows there (meta stays meta)
        host = "meta" if linear.weight.device.type == "meta" else "cpu"
        weight = linear.weight.detach().to(host)
        bias = None if linear.bias is None else linear.bias.detach().to(host)
        for i in range(k):
            a, b = rows * i // k, rows * (i + 1) // k
            part = torch.nn.Linear(linear.in_features, b - a, bias=bias is not None, device="meta")
            part.weight = torch.nn.Parameter(weight[a:b], requires_grad=False)  # a view: nothing copied
            if bias is not None:
                part.bias = torch.nn.Parameter(bias[a:b], requires_grad=False)
            self.parts.append(part)
        linear.weight = linear.bias = None  # its rows live in the parts now (join_rows puts them back)
        self.__dict__["whole"] = linear  # not a submodule: its tensors would count twice

    def forward(self, x):
        return torch.cat([part(x) for part in self.parts], dim=-1)

    def joined(self) -> torch.nn.Linear:
        """The plain Linear again, its weight (and bias) the parts' rows concatenated on the host."""
        linear = self.__dict__["whole"]
        linear.weight = torch.nn.Parameter(torch.cat([p.weight.detach().cpu() for p in self.parts]),
                                           requires_grad=False)
        if self.parts[0].bias is not None:
            linear.bias = torch.nn.Parameter(torch.cat([p.bias.detach().cpu() for p in self.parts]),
                                             requires_grad=False)
        return linear


def cut_rows(model, names) -> int:
    """Put a RowSplitLinear in the place of every Linear of `model` that `names` (a split's pieces) cut into parts;
    returns how many layers were cut. A layer already cut the same way stays as it is."""
    parts: dict[str, int] = {}
    for name in names:
        m = _PART.match(name)
        if m:
            parts[m["layer"]] = max(parts.get(m["layer"], 0), int(m["i"]) + 1)
    cut = 0
    for layer, k in parts.items():
        parent_name, _, child = layer.rpartition(".")
        parent = model.get_submodule(parent_name)
        module = getattr(parent, child)
        if isinstance(module, RowSplitLinear) and len(module.parts) == k:
            continue
        if isinstance(module, RowSplitLinear):
            module = module.joined()
        if type(module) is not torch.nn.Linear:
            raise ValueError(f"{layer} is a {type(module).__name__}, not a plain Linear to cut into {k} parts")
        setattr(parent, child, RowSplitLinear(module, k))
        cut += 1
    return cut


def join_rows(model) -> int:
    """Put every RowSplitLinear of `model` back as its plain Linear; returns how many."""
    found = [(name, m) for name, m in model.named_modules() if isinstance(m, RowSplitLinear)]
    for name, m in found:
        parent_name, _, child = name.rpartition(".")
        setattr(model.get_submodule(parent_name), child, m.joined())
    return len(found)
