"""Test utility: a diffusers FLUX.1 transformer's weights in Black Forest Labs' original layout, the one
city96's FLUX.1 GGUF files use (`double_blocks.0.img_attn.qkv.weight`, `single_blocks.0.linear1.weight`,
`img_in.weight`, ...), so that tests/gguf_files.write_gguf can write a tiny city96-style Flux GGUF.

It is the inverse of diffusers' `convert_flux_transformer_checkpoint_to_diffusers`
(loaders/single_file_utils.py): a double block's q, k, v are fused into one `qkv` (image and text stream
each), a single block's q, k, v and MLP input into one `linear1`, and the final AdaLN's two halves are
swapped back (BFL stores shift then scale, diffusers scale then shift).
"""

from __future__ import annotations

# BFL name <- diffusers name, for the tensors that are only renamed (each with .weight and .bias)
_TOP = {
    "time_in.in_layer": "time_text_embed.timestep_embedder.linear_1",
    "time_in.out_layer": "time_text_embed.timestep_embedder.linear_2",
    "vector_in.in_layer": "time_text_embed.text_embedder.linear_1",
    "vector_in.out_layer": "time_text_embed.text_embedder.linear_2",
    "guidance_in.in_layer": "time_text_embed.guidance_embedder.linear_1",
    "guidance_in.out_layer": "time_text_embed.guidance_embedder.linear_2",
    "txt_in": "context_embedder",
    "img_in": "x_embedder",
    "final_layer.linear": "proj_out",
}
_DOUBLE = {
    "img_mod.lin": "norm1.linear", "txt_mod.lin": "norm1_context.linear",
    "img_mlp.0": "ff.net.0.proj", "img_mlp.2": "ff.net.2",
    "txt_mlp.0": "ff_context.net.0.proj", "txt_mlp.2": "ff_context.net.2",
    "img_attn.proj": "attn.to_out.0", "txt_attn.proj": "attn.to_add_out",
}
_DOUBLE_NORMS = {  # RMS norm scales: weight only
    "img_attn.norm.query_norm.scale": "attn.norm_q.weight", "img_attn.norm.key_norm.scale": "attn.norm_k.weight",
    "txt_attn.norm.query_norm.scale": "attn.norm_added_q.weight",
    "txt_attn.norm.key_norm.scale": "attn.norm_added_k.weight",
}
_DOUBLE_FUSED = {"img_attn.qkv": ("attn.to_q", "attn.to_k", "attn.to_v"),
                 "txt_attn.qkv": ("attn.add_q_proj", "attn.add_k_proj", "attn.add_v_proj")}
_SINGLE = {"modulation.lin": "norm.linear", "linear2": "proj_out"}
_SINGLE_NORMS = {"norm.query_norm.scale": "attn.norm_q.weight", "norm.key_norm.scale": "attn.norm_k.weight"}
_SINGLE_FUSED = {"linear1": ("attn.to_q", "attn.to_k", "attn.to_v", "proj_mlp")}


def flux_to_bfl(state: dict) -> dict:
    """A diffusers FluxTransformer2DModel state dict (name -> tensor) in BFL's layout, as city96's files
    hold it (no `model.diffusion_model.` prefix). Every diffusers tensor is used exactly once."""
    import torch

    src = {k: v.detach().clone().contiguous() for k, v in state.items()}
    out = {}

    def take(name):
        return src.pop(name)

    def renamed(table, bfl_prefix, diffusers_prefix):
        for bfl, ours in table.items():
            for part in ("weight", "bias"):
                if f"{diffusers_prefix}{ours}.{part}" in src:
                    out[f"{bfl_prefix}{bfl}.{part}"] = take(f"{diffusers_prefix}{ours}.{part}")

    def norms(table, bfl_prefix, diffusers_prefix):
        for bfl, ours in table.items():
            out[bfl_prefix + bfl] = take(diffusers_prefix + ours)

    def fused(table, bfl_prefix, diffusers_prefix):
        for bfl, parts in table.items():
            for part in ("weight", "bias"):
                out[f"{bfl_prefix}{bfl}.{part}"] = torch.cat([take(f"{diffusers_prefix}{p}.{part}") for p in parts])

    renamed(_TOP, "", "")
    for part in ("weight", "bias"):  # diffusers: scale, shift; BFL: shift, scale
        scale, shift = take(f"norm_out.linear.{part}").chunk(2, dim=0)
        out[f"final_layer.adaLN_modulation.1.{part}"] = torch.cat([shift, scale])
    doubles = sorted({int(k.split(".")[1]) for k in src if k.startswith("transformer_blocks.")})
    singles = sorted({int(k.split(".")[1]) for k in src if k.startswith("single_transformer_blocks.")})
    for i in doubles:
        bfl, ours = f"double_blocks.{i}.", f"transformer_blocks.{i}."
        renamed(_DOUBLE, bfl, ours)
        norms(_DOUBLE_NORMS, bfl, ours)
        fused(_DOUBLE_FUSED, bfl, ours)
    for i in singles:
        bfl, ours = f"single_blocks.{i}.", f"single_transformer_blocks.{i}."
        renamed(_SINGLE, bfl, ours)
        norms(_SINGLE_NORMS, bfl, ours)
        fused(_SINGLE_FUSED, bfl, ours)
    if src:
        raise AssertionError(f"diffusers keys with no BFL name: {sorted(src)[:5]}")
    return out
