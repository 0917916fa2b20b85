"""Test utility: turn a diffusers pipeline back into ONE original-layout (LDM / A1111) state dict.

This is the inverse of diffusers' single-file conversion (`diffusers/loaders/single_file_utils.py`:
`convert_ldm_unet_checkpoint`, `convert_ldm_vae_checkpoint`, `convert_ldm_clip_checkpoint`,
`convert_open_clip_checkpoint`), derived from those functions and generic over the number of blocks
and `layers_per_block`, so the tiny pipelines can be written as the kind of `.safetensors` / `.ckpt`
file that Civitai and A1111 users have, and loaded back through `from_single_file`.

Prefixes (as in real checkpoints):
  SD 1.x:  model.diffusion_model.  first_stage_model.  cond_stage_model.transformer.text_model.
  SDXL:    model.diffusion_model.  first_stage_model.  conditioner.embedders.0.transformer.text_model.
           conditioner.embedders.1.model.  (OpenCLIP layout: resblocks, fused in_proj, text_projection)
"""

from __future__ import annotations

UNET = "model.diffusion_model."
VAE = "first_stage_model."
CLIP_SD = "cond_stage_model.transformer."
CLIP_SDXL = "conditioner.embedders.0.transformer."
OPENCLIP_SDXL = "conditioner.embedders.1.model."

# diffusers name -> LDM name for the top-level UNet layers (inverse of DIFFUSERS_TO_LDM_MAPPING["unet"]).
_UNET_LAYERS = {
    "time_embedding.linear_1": "time_embed.0",
    "time_embedding.linear_2": "time_embed.2",
    "add_embedding.linear_1": "label_emb.0.0",  # SDXL's "text_time" addition embedding
    "add_embedding.linear_2": "label_emb.0.2",
    "conv_in": "input_blocks.0.0",
    "conv_norm_out": "out.0",
    "conv_out": "out.2",
}
# diffusers ResnetBlock2D names -> LDM ResBlock names (inverse of update_unet_resnet_ldm_to_diffusers).
_UNET_RESNET = {
    "norm1": "in_layers.0",
    "conv1": "in_layers.2",
    "norm2": "out_layers.0",
    "conv2": "out_layers.3",
    "time_emb_proj": "emb_layers.1",
    "conv_shortcut": "skip_connection",
}
_VAE_LAYERS = {  # inverse of DIFFUSERS_TO_LDM_MAPPING["vae"]
    "encoder.conv_norm_out": "encoder.norm_out",
    "decoder.conv_norm_out": "decoder.norm_out",
}
_VAE_ATTN = {"group_norm": "norm", "to_q": "q", "to_k": "k", "to_v": "v", "to_out.0": "proj_out"}


def _split(key: str, n: int) -> tuple[list[str], str]:
    parts = key.split(".")
    return parts[:n], ".".join(parts[n:])


def unet_to_ldm(unet) -> dict:
    """UNet2DConditionModel state dict -> `model.diffusion_model.*` keys."""
    lpb = unet.config.layers_per_block
    if not isinstance(lpb, int):
        raise NotImplementedError("per-block layers_per_block is not used by SD/SDXL checkpoints")
    out = {}
    for key, value in unet.state_dict().items():
        parts = key.split(".")
        new = None
        if parts[0] == "down_blocks":
            b, kind, j, rest = int(parts[1]), parts[2], int(parts[3]), ".".join(parts[4:])
            if kind == "resnets":
                new = f"input_blocks.{1 + b * (lpb + 1) + j}.0.{_resnet(rest)}"
            elif kind == "attentions":
                new = f"input_blocks.{1 + b * (lpb + 1) + j}.1.{rest}"
            elif kind == "downsamplers":  # conv.weight -> op.weight
                new = f"input_blocks.{1 + b * (lpb + 1) + lpb}.0.op.{rest.split('.', 1)[1]}"
        elif parts[0] == "mid_block":
            kind, j, rest = parts[1], int(parts[2]), ".".join(parts[3:])
            new = f"middle_block.{2 * j}.{_resnet(rest)}" if kind == "resnets" else f"middle_block.1.{rest}"
        elif parts[0] == "up_blocks":
            b, kind, j, rest = int(parts[1]), parts[2], int(parts[3]), ".".join(parts[4:])
            i = b * (lpb + 1) + j
            if kind == "resnets":
                new = f"output_blocks.{i}.0.{_resnet(rest)}"
            elif kind == "attentions":
                new = f"output_blocks.{i}.1.{rest}"
            elif kind == "upsamplers":
                # the upsampler sits after the block's last layer: .2 when that layer has attention, else .1
                has_attn = hasattr(unet.up_blocks[b], "attentions") and unet.up_blocks[b].attentions is not None
                i = b * (lpb + 1) + lpb
                new = f"output_blocks.{i}.{2 if has_attn else 1}.{rest}"
        else:
            prefix, _, leaf = key.rpartition(".")
            if prefix in _UNET_LAYERS:
                new = f"{_UNET_LAYERS[prefix]}.{leaf}"
        if new is None:
            raise KeyError(f"no LDM name for UNet key {key!r}")
        out[UNET + new] = value
    return out


def _resnet(rest: str) -> str:
    name, _, leaf = rest.rpartition(".")
    return f"{_UNET_RESNET.get(name, name)}.{leaf}"


def vae_to_ldm(vae) -> dict:
    """AutoencoderKL state dict -> `first_stage_model.*` keys (attention projections as 1x1 convs, as in LDM)."""
    n_up = len(vae.config.up_block_types)
    out = {}
    for key, value in vae.state_dict().items():
        parts = key.split(".")
        side, block = parts[0], parts[1] if len(parts) > 1 else ""
        new = key
        if block in ("down_blocks", "up_blocks"):
            i, kind, rest = int(parts[2]), parts[3], ".".join(parts[4:])
            if side == "decoder":
                i = n_up - 1 - i  # LDM numbers decoder levels from the lowest resolution up
            ldm_block = "down" if block == "down_blocks" else "up"
            if kind == "resnets":
                new = f"{side}.{ldm_block}.{i}.block.{rest.replace('conv_shortcut', 'nin_shortcut')}"
            else:  # downsamplers.0.conv.* / upsamplers.0.conv.*
                sampler = "downsample" if kind == "downsamplers" else "upsample"
                new = f"{side}.{ldm_block}.{i}.{sampler}.{rest.split('.', 1)[1]}"
        elif block == "mid_block":
            kind, j, rest = parts[2], int(parts[3]), ".".join(parts[4:])
            if kind == "resnets":
                new = f"{side}.mid.block_{j + 1}.{rest.replace('conv_shortcut', 'nin_shortcut')}"
            else:
                name, _, leaf = rest.rpartition(".")
                new = f"{side}.mid.attn_1.{_VAE_ATTN[name]}.{leaf}"
                if leaf == "weight" and value.ndim == 2:
                    value = value[:, :, None, None]  # LDM's q/k/v/proj_out are 1x1 Conv2d
        else:
            prefix, _, leaf = key.rpartition(".")
            if prefix in _VAE_LAYERS:
                new = f"{_VAE_LAYERS[prefix]}.{leaf}"
        out[VAE + new] = value.contiguous()
    return out


def clip_to_ldm(text_encoder, prefix: str) -> dict:
    """transformers CLIPTextModel -> `<prefix>text_model.*` (the HF layout A1111 checkpoints keep for CLIP-L).

    transformers >= 5.6 flattened CLIPTextModel (no `text_model.` level); checkpoints always have it.
    """
    out = {}
    for key, value in text_encoder.state_dict().items():
        if key == "text_projection.weight" or key.endswith("position_ids"):
            continue
        out[prefix + (key if key.startswith("text_model.") else "text_model." + key)] = value
    return out


def openclip_to_ldm(text_encoder, prefix: str = OPENCLIP_SDXL) -> dict:
    """CLIPTextModelWithProjection -> OpenCLIP layout (inverse of convert_open_clip_checkpoint)."""
    import torch

    sd = {k.removeprefix("text_model."): v for k, v in text_encoder.state_dict().items()}
    if "text_projection.weight" not in sd:  # SD 2.x's OpenCLIP-H as a CLIPTextModel: its file still has the projection
        width = sd["embeddings.token_embedding.weight"].shape[1]
        sd["text_projection.weight"] = torch.zeros(width, width, device=sd["embeddings.token_embedding.weight"].device)
    out = {
        prefix + "positional_embedding": sd.pop("embeddings.position_embedding.weight"),
        prefix + "token_embedding.weight": sd.pop("embeddings.token_embedding.weight"),
        prefix + "ln_final.weight": sd.pop("final_layer_norm.weight"),
        prefix + "ln_final.bias": sd.pop("final_layer_norm.bias"),
        # OpenCLIP multiplies x @ text_projection; diffusers transposes it back into a Linear weight
        prefix + "text_projection": sd.pop("text_projection.weight").T.contiguous(),
    }
    sd.pop("embeddings.position_ids", None)
    for layer in range(text_encoder.config.num_hidden_layers):
        src, dst = f"encoder.layers.{layer}.", f"{prefix}transformer.resblocks.{layer}."
        for leaf in ("weight", "bias"):
            out[f"{dst}attn.in_proj_{leaf}"] = torch.cat(
                [sd.pop(f"{src}self_attn.{p}_proj.{leaf}") for p in "qkv"]
            )
            out[f"{dst}attn.out_proj.{leaf}"] = sd.pop(f"{src}self_attn.out_proj.{leaf}")
            out[f"{dst}ln_1.{leaf}"] = sd.pop(f"{src}layer_norm1.{leaf}")
            out[f"{dst}ln_2.{leaf}"] = sd.pop(f"{src}layer_norm2.{leaf}")
            out[f"{dst}mlp.c_fc.{leaf}"] = sd.pop(f"{src}mlp.fc1.{leaf}")
            out[f"{dst}mlp.c_proj.{leaf}"] = sd.pop(f"{src}mlp.fc2.{leaf}")
    if sd:
        raise KeyError(f"no OpenCLIP name for {sorted(sd)[:5]}")
    return out


def pipeline_to_ldm(pipe) -> dict:
    """One original-layout state dict for an SD 1.x-shaped or SDXL-shaped diffusers pipeline."""
    out = {**unet_to_ldm(pipe.unet), **vae_to_ldm(pipe.vae)}
    if getattr(pipe, "text_encoder_2", None) is not None:  # SDXL
        out.update(clip_to_ldm(pipe.text_encoder, CLIP_SDXL))
        out.update(openclip_to_ldm(pipe.text_encoder_2, OPENCLIP_SDXL))
    else:
        out.update(clip_to_ldm(pipe.text_encoder, CLIP_SD))
    # safetensors refuses tensors that share memory; give every tensor its own storage
    return {k: v.detach().clone().contiguous() for k, v in out.items()}
