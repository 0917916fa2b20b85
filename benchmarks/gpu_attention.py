"""A masked attention that holds what a GPU's attention kernel holds, for the CPU calibration runs only.

Z-Image, Lumina 2, Chroma and SANA always hand SDPA an attention mask. On this CPU torch's
`F.scaled_dot_product_attention` then runs its math kernel, which materialises the whole score matrix (heads x
queries x keys): Z-Image's 512 px step peaked at 1979 MiB in 311 s that way. On CUDA the same call (a boolean or
additive mask, half precision, head dim <= 256) runs the memory-efficient kernel, which keeps one tile of scores
per block of queries and never the whole matrix, so that CPU number is not what a card holds.

`installed()` swaps `torch.nn.functional.scaled_dot_product_attention` (which diffusers' processors and
`attention_dispatch` look up at call time) for a wrapper that, for a masked call only:
- a boolean mask with every key allowed: the same call without the mask (the flash kernel, equal result);
- otherwise: the math kernel on `CHUNK` queries at a time into one output tensor, so the scores held are
  heads x CHUNK x keys (Z-Image at 768 px: 30 x 256 x 2816 x 4 bytes = 83 MiB at most, against the 2.8 GiB a
  whole matrix takes), the order of a memory-efficient kernel's tiles.
Unmasked calls go to SDPA unchanged. Never used by lowvram-gen itself (only benchmarks/calibrate_memory.py).
"""

from __future__ import annotations

import contextlib

CHUNK = 256


@contextlib.contextmanager
def installed(chunk: int = CHUNK):
    """Within the block, masked SDPA calls run as above; yields a dict counting the calls by kind, and the longest
    key sequence seen (image + text tokens of a joint attention: checks the tokens the estimate counts)."""
    import torch
    import torch.nn.functional as F

    original = F.scaled_dot_product_attention
    calls = {"unmasked": 0, "mask_all_true": 0, "chunked": 0, "longest_sequence": 0}

    def sdpa(query, key, value, attn_mask=None, *args, **kwargs):
        calls["longest_sequence"] = max(calls["longest_sequence"], int(key.shape[-2]))
        if attn_mask is None:
            calls["unmasked"] += 1
            return original(query, key, value, None, *args, **kwargs)
        if attn_mask.dtype == torch.bool and bool(attn_mask.all()):
            calls["mask_all_true"] += 1
            return original(query, key, value, None, *args, **kwargs)
        calls["chunked"] += 1
        n = query.shape[-2]
        per_query = attn_mask.dim() >= 2 and attn_mask.shape[-2] == n and n > 1
        out = None
        for start in range(0, n, chunk):
            mask = attn_mask[..., start:start + chunk, :] if per_query else attn_mask
            part = original(query[..., start:start + chunk, :], key, value, mask, *args, **kwargs)
            if out is None:
                out = part.new_empty(part.shape[:-2] + (n, part.shape[-1]))
            out[..., start:start + chunk, :] = part
            del part
        return out

    torch.nn.functional.scaled_dot_product_attention = sdpa
    try:
        yield calls
    finally:
        torch.nn.functional.scaled_dot_product_attention = original
