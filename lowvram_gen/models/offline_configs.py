"""The configs and tokenizers a single-file checkpoint needs, with no network and no Hugging Face cache (issue 29
item 10), as A1111, Forge and ComfyUI load such a file.

diffusers' `from_single_file` takes the weights from the file but the architecture (each component's config.json),
the scheduler and the tokenizers from a diffusers folder. models/checkpoint.py looks for that folder in `--config`,
then in the HF cache; when neither has it, this module makes one from what lowvram-gen ships:

* lowvram_gen/configs/<base>/: the real configs of each base model (SD 1.5, SD 2.1, SDXL base, SD3 medium,
  FLUX.1-dev), and lowvram_gen/configs/variants/<variant>/: the files where a variant differs from its base (SD 2.x
  eps, the SDXL refiner, SD3.5 medium and large, FLUX.1 schnell). Which variant fits a file is the family record's
  `SingleFile.offline_variant`, from the file's keys (families/keys.py).
* For the UNet families the sizes the file's shapes show (channels, blocks, layers, widths, vocabulary) are read
  from it, as ComfyUI's model detection does, so a fine-tune of another size (or a tiny test file) gets configs
  that fit it; for a real SD 1.5 / 2.1 / SDXL file they are the shipped values unchanged. What shapes cannot show
  (attention heads, norm groups) stays the shipped value where it divides the widths.
* CLIP's tokenizer (every CLIP and OpenCLIP encoder of these models uses OpenAI's BPE) is built from
  configs/clip/bpe_simple_vocab_16e6.txt.gz (MIT, from open_clip's wheel; configs/clip/README.md): vocab.json and
  merges.txt, 49408 tokens. SD 2.x's and the OpenCLIP-G tokenizers pad with "!" (id 0), the others with
  <|endoftext|>.
* T5's tokenizer (SD3's third encoder, FLUX.1's second) is not shipped: no package gives it legitimately. SD3
  without T5 weights in the file loads without T5 (text_encoder_3=None, as diffusers allows); otherwise the user's
  copy in LOWVRAM_GEN_HOME/tokenizers/t5/ is used, and without one the error says which files to put there.

The folder is made once per fitted content under LOWVRAM_GEN_HOME/configs/offline/ (written to a temporary folder
and renamed into place) and reused; the package itself is never written to.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import logging
import math
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

from lowvram_gen import safe_json
from lowvram_gen.errors import ModelLoadError
from lowvram_gen.families.keys import (CLIP_SD, CLIP_XL, OPENCLIP_SD2, OPENCLIP_XL, OPENCLIP_XL_REFINER, T5_XXL, UNET,
                                       VAE_PREFIXES, sdxl_refiner_file)

log = logging.getLogger(__name__)
CONFIGS = Path(__file__).resolve().parents[1] / "configs"
BPE_FILE = CONFIGS / "clip" / "bpe_simple_vocab_16e6.txt.gz"
VERSION = 1  # bump when what is written changes, so older folders are not reused
CLIP_VOCAB = 49408  # 256 bytes, the same with </w>, 48894 merges, <|startoftext|> and <|endoftext|>
T5_FILES = ("spiece.model", "tokenizer.json")  # either makes a T5 tokenizer

# variant -> (base folder, folder of the files that differ, or None)
VARIANTS = {
    "sd15": ("sd15", None), "sd2-v": ("sd21", None), "sd2-eps": ("sd21", "variants/sd2-eps"),
    "sdxl": ("sdxl", None), "sdxl-refiner": ("sdxl", "variants/sdxl-refiner"),
    "sd3": ("sd3", None), "sd35-medium": ("sd3", "variants/sd35-medium"), "sd35-large": ("sd3", "variants/sd35-large"),
    "flux-dev": ("flux", None), "flux-schnell": ("flux", "variants/flux-schnell"),
}
# where a UNet family's file keeps each text encoder (the first present prefix), for the fit
_TEXT_PREFIXES = {"text_encoder": (CLIP_SD, OPENCLIP_SD2, CLIP_XL),
                  "text_encoder_2": (OPENCLIP_XL, OPENCLIP_XL_REFINER)}


@dataclass(frozen=True)
class OfflineConfigs:
    folder: Path
    variant: str
    absent: tuple[str, ...] = ()  # components to pass as None (SD3's T5 when the file has none)


def ships(family) -> bool:
    return family.single_file is not None and family.single_file.offline_variant is not None


def tensor_reader(path: Path, state: dict | None):
    """A reader of one tensor's values: from the pickle already loaded, else from a .safetensors; None otherwise."""
    if state is not None:
        return state.__getitem__
    if path.suffix.lower() != ".safetensors":
        return None

    def read(key):
        from safetensors import safe_open

        with safe_open(str(path), framework="pt") as f:
            return f.get_tensor(key)
    return read


def absent_components(family, shapes, folder: Path | None = None) -> tuple[str, ...]:
    """The family's optional T5 (SD3's text_encoder_3 and tokenizer_3: `SingleFile.optional_t5`) when neither the file
    nor the config folder has its weights: diffusers runs SD3 without it (passed as None)."""
    optional = family.single_file.optional_t5 if family.single_file else ()
    if not optional or _has(shapes, T5_XXL):
        return ()
    if folder is not None and any(next((folder / optional[0]).glob(p), None) for p in ("*.safetensors", "*.bin")):
        return ()
    return tuple(optional)


def offline_configs(family, shapes: dict, path: Path, read=None) -> OfflineConfigs:
    """The config folder for `path` (a whole file of `family`, {key: shape}) made from the shipped configs."""
    from lowvram_gen.paths import home, writable_folder

    variant = family.single_file.offline_variant(shapes, read)
    base, overlay = VARIANTS[variant]
    files = _json_files(CONFIGS / base)
    if overlay:
        files.update(_json_files(CONFIGS / overlay))
    if family.denoiser == "unet":  # SD 1.x/2.x, SDXL: sizes from the shapes (ComfyUI's model detection)
        try:
            fit_to_shapes(files, shapes)
        except (KeyError, IndexError, ValueError, TypeError):  # an odd file: the architecture check names what differs
            pass
    index = files["model_index.json"]
    index["scheduler"] = ["diffusers", files["scheduler/scheduler_config.json"]["_class_name"]]  # a variant's own
    for name in ("safety_checker", "feature_extractor", "image_encoder"):  # never taken from a single file
        if name in index:
            index[name] = [None, None]
    if "requires_safety_checker" in index:
        index["requires_safety_checker"] = False
    absent = absent_components(family, shapes)
    tokenizers = {name: v[1] for name, v in index.items()
                  if isinstance(v, list) and v[1] in ("CLIPTokenizer", "T5TokenizerFast") and name not in absent}
    for name, cls in tokenizers.items():
        encoder = files.get(f"{name.replace('tokenizer', 'text_encoder')}/config.json", {})
        vocab = int(encoder.get("vocab_size", CLIP_VOCAB))
        if cls == "CLIPTokenizer" and vocab != CLIP_VOCAB:
            raise ModelLoadError(
                f"{path.name}: the text encoder for {name} has a {vocab}-token vocabulary, not CLIP's {CLIP_VOCAB}, so "
                "lowvram-gen's shipped tokenizer does not fit it; pass --config FOLDER with the diffusers folder the "
                "model came from")
    t5 = next((_t5_folder(family, path, name) for name, cls in tokenizers.items() if cls == "T5TokenizerFast"), None)
    t5_files = [(f.name, f.stat().st_size, f.stat().st_mtime_ns) for f in sorted(t5.iterdir())] if t5 else []
    digest = hashlib.sha256(json.dumps([VERSION, variant, files, sorted(tokenizers.items()), str(t5), t5_files],
                                       sort_keys=True).encode()).hexdigest()[:12]
    target = home() / "configs" / "offline" / f"{variant}-{digest}"
    if not (target / "model_index.json").is_file():
        writable_folder(target.parent, "the configs folder of LOWVRAM_GEN_HOME")
        tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=target.parent))
        try:
            for rel, data in files.items():
                (tmp / rel).parent.mkdir(parents=True, exist_ok=True)
                (tmp / rel).write_text(json.dumps(data, indent=2) + "\n")
            bpe = clip_bpe_files()
            for name, cls in tokenizers.items():
                if cls == "CLIPTokenizer":
                    # OpenCLIP's tokenizers (SD 2.x's, SDXL's and SD3's second) pad with "!": their shipped map says so
                    pad = files.get(f"{name}/special_tokens_map.json", {}).get("pad_token", "<|endoftext|>")
                    _write_clip_tokenizer(tmp / name, bpe, pad=pad)
                else:
                    shutil.copytree(t5, tmp / name)
            try:
                os.rename(tmp, target)
            except OSError:  # another process made it first
                if not (target / "model_index.json").is_file():
                    raise
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    log.info("%s: no --config and no configs in the Hugging Face cache: lowvram-gen's shipped %s configs (%s)",
             path.name, variant, target)
    return OfflineConfigs(target, variant, absent)


def _json_files(folder: Path) -> dict[str, dict]:
    return {p.relative_to(folder).as_posix(): safe_json.load_file(p) for p in sorted(folder.rglob("*.json"))}


def _has(shapes, *prefixes: str) -> bool:
    return any(k.startswith(prefixes) for k in shapes)


# --------------------------------------------------------------------------------------------------- T5


def _t5_folder(family, path: Path, name: str) -> Path:
    """The user's copy of T5 v1.1's tokenizer (LOWVRAM_GEN_HOME/tokenizers/t5/); else an error naming what to give."""
    from lowvram_gen.paths import home

    folder = home() / "tokenizers" / "t5"
    if any((folder / f).is_file() for f in T5_FILES):
        return folder
    raise ModelLoadError(
        f"{path.name} ({family.name}) needs T5's tokenizer ({name}), which lowvram-gen cannot ship and which is not in "
        f"the local Hugging Face cache. Fix: copy the {name}/ folder of {family.hub_id} (T5 v1.1's tokenizer, the "
        f"same as google/t5-v1_1-xxl's: spiece.model, tokenizer_config.json and special_tokens_map.json, or "
        f"tokenizer.json) into {folder}/, or pass --config FOLDER with a diffusers copy of the base model (its "
        "configs and tokenizers)")


# ------------------------------------------------------------------------------------------------- CLIP


def clip_bpe_files() -> Path:
    """vocab.json and merges.txt of CLIP's tokenizer, built once from the shipped BPE file into
    LOWVRAM_GEN_HOME/tokenizers/clip-bpe-16e6/ (as CLIP's own SimpleTokenizer builds its vocabulary)."""
    from lowvram_gen.paths import home, write_atomically

    folder = home() / "tokenizers" / "clip-bpe-16e6"
    if (folder / "vocab.json").is_file() and (folder / "merges.txt").is_file():
        return folder
    lines = gzip.decompress(BPE_FILE.read_bytes()).decode("utf-8").split("\n")
    merges = [tuple(line.split()) for line in lines[1:1 + CLIP_VOCAB - 2 * 256 - 2]]  # the file's first 48894
    from transformers.convert_slow_tokenizer import bytes_to_unicode  # OpenAI's byte -> printable table, in order

    chars = list(bytes_to_unicode().values())
    vocab = chars + [c + "</w>" for c in chars] + ["".join(m) for m in merges] + ["<|startoftext|>", "<|endoftext|>"]
    if len(vocab) != CLIP_VOCAB or len(set(vocab)) != CLIP_VOCAB:
        raise ModelLoadError(f"{BPE_FILE} is damaged: it gives {len(set(vocab))} distinct tokens, not {CLIP_VOCAB}")
    write_atomically(folder / "merges.txt", "#version: 0.2\n" + "".join(f"{a} {b}\n" for a, b in merges))
    write_atomically(folder / "vocab.json", json.dumps({t: i for i, t in enumerate(vocab)}, ensure_ascii=False))
    return folder


def _write_clip_tokenizer(folder: Path, bpe: Path, pad: str) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    for name in ("vocab.json", "merges.txt"):  # 1.5 MB a tokenizer: a hard link where the filesystem allows one
        (folder / name).unlink(missing_ok=True)
        try:
            os.link(bpe / name, folder / name)
        except OSError:
            shutil.copyfile(bpe / name, folder / name)
    special = {"bos_token": "<|startoftext|>", "eos_token": "<|endoftext|>", "unk_token": "<|endoftext|>",
               "pad_token": pad}
    (folder / "special_tokens_map.json").write_text(json.dumps(special, indent=2) + "\n")
    (folder / "tokenizer_config.json").write_text(json.dumps(
        {**special, "tokenizer_class": "CLIPTokenizer", "model_max_length": 77, "do_lower_case": True,
         "errors": "replace", "add_prefix_space": False}, indent=2) + "\n")


# ------------------------------------------------------------------------------------ sizes from shapes


def _count(shapes, prefix: str) -> int:
    """How many numbered children `prefix<N>.` the file has (the highest N plus one)."""
    found = [int(h) for h in (k[len(prefix):].split(".", 1)[0] for k in shapes if k.startswith(prefix)) if h.isdigit()]
    return max(found) + 1 if found else 0


def _heads(width: int, wanted: int) -> int:
    """The most attention heads, up to `wanted`, that divide `width` (at least 1)."""
    return next((h for h in range(max(1, int(wanted)), 0, -1) if width % h == 0), 1)


def _groups(channels: list[int], wanted: int) -> int:
    """The most norm groups, up to `wanted`, that divide every width."""
    return next((g for g in range(max(1, int(wanted)), 0, -1) if all(c % g == 0 for c in channels)), 1)


def fit_to_shapes(files: dict[str, dict], shapes) -> None:
    """Set in `files` (relative path -> config) the sizes an SD / SDXL file's shapes show, in place."""
    refiner = sdxl_refiner_file(shapes)
    pooled = 0
    for name, prefixes in _TEXT_PREFIXES.items():
        prefix = next((p for p in prefixes if _has(shapes, p)), None)
        if prefix is not None and f"{name}/config.json" in files:
            pooled = _fit_text_encoder(files[f"{name}/config.json"], shapes, prefix) or pooled
    vae = next((p for p in VAE_PREFIXES if _has(shapes, p + "encoder.")), VAE_PREFIXES[0])
    _fit_vae(files["vae/config.json"], shapes, vae)
    _fit_unet(files["unet/config.json"], shapes, pooled, 5 if refiner else 6)


def _fit_text_encoder(c: dict, s, prefix: str) -> int:
    """A CLIP text encoder's sizes, from the HF layout (`text_model.`) or OpenCLIP's; its projection width."""
    if _has(s, prefix + "text_model."):
        t = prefix + "text_model."
        vocab, hidden = s[t + "embeddings.token_embedding.weight"]
        positions = s[t + "embeddings.position_embedding.weight"][0]
        layers, inner = _count(s, t + "encoder.layers."), s[t + "encoder.layers.0.mlp.fc1.weight"][0]
        projection = 0
    else:
        vocab, hidden = s[prefix + "token_embedding.weight"]
        positions = s[prefix + "positional_embedding"][0]
        blocks = prefix + "transformer.resblocks."
        layers, inner = _count(s, blocks), s[blocks + "0.mlp.c_fc.weight"][0]
        if prefix == OPENCLIP_SD2 and layers == 24:  # diffusers drops SD 2.x's last layer (it uses the penultimate)
            layers = 23
        projection = s[prefix + "text_projection"][-1] if prefix + "text_projection" in s else 0
    c.update(vocab_size=vocab, hidden_size=hidden, max_position_embeddings=positions, num_hidden_layers=layers,
             intermediate_size=inner, num_attention_heads=_heads(hidden, c.get("num_attention_heads", 12)))
    if projection and "WithProjection" in str(c.get("architectures", "")):
        c["projection_dim"] = projection
        return projection
    return 0


def _fit_vae(c: dict, s, p: str) -> None:
    levels = _count(s, p + "encoder.down.")
    channels = [s[f"{p}encoder.down.{i}.block.0.conv2.weight"][0] for i in range(levels)]
    c.update(block_out_channels=channels, layers_per_block=_count(s, p + "encoder.down.0.block."),
             in_channels=s[p + "encoder.conv_in.weight"][1], out_channels=s[p + "decoder.conv_out.weight"][0],
             latent_channels=s[p + "encoder.conv_out.weight"][0] // 2,
             down_block_types=["DownEncoderBlock2D"] * levels, up_block_types=["UpDecoderBlock2D"] * levels,
             norm_num_groups=_groups(channels, c.get("norm_num_groups", 32)))


def _fit_unet(c: dict, s, pooled: int, time_ids: int) -> None:
    """An LDM UNet's sizes: levels (a downsampler, `op`, ends each but the last), layers per level, widths, which
    levels attend and how deep, cross-attention width, linear or conv projections, SDXL's added conditioning."""
    u = UNET + "input_blocks."
    inputs = _count(s, u)
    downsamplers = sum(1 for i in range(1, inputs) if f"{u}{i}.0.op.weight" in s)
    levels = downsamplers + 1
    per_level = (inputs - 1 - downsamplers) // levels
    firsts = [1 + level * (per_level + 1) for level in range(levels)]
    channels = [s[f"{u}{i}.0.out_layers.3.weight"][0] for i in firsts]
    attends = [_has(s, f"{u}{i}.1.") for i in firsts]
    depth = [_count(s, f"{u}{i}.1.transformer_blocks.") or 1 for i in firsts]
    c.update(in_channels=s[u + "0.0.weight"][1], out_channels=s[UNET + "out.2.weight"][0], block_out_channels=channels,
             layers_per_block=per_level,
             down_block_types=["CrossAttnDownBlock2D" if a else "DownBlock2D" for a in attends],
             up_block_types=["CrossAttnUpBlock2D" if a else "UpBlock2D" for a in reversed(attends)],
             norm_num_groups=_groups(channels, c.get("norm_num_groups", 32)))
    # transformer blocks per attending level; diffusers gives the middle block the last entry's (or the int's)
    mid = _count(s, UNET + "middle_block.1.transformer_blocks.") or 1
    depths = [d for d, a in zip(depth, attends) if a] + [mid]
    if isinstance(c.get("transformer_layers_per_block", 1), int) and len(set(depths)) == 1:
        if depths[0] != c.get("transformer_layers_per_block", 1):
            c["transformer_layers_per_block"] = depths[0]
    else:
        c["transformer_layers_per_block"] = [d if a else 1 for d, a in zip(depth, attends)][:-1] + [
            depth[-1] if attends[-1] else mid]
    to_k = next((v for k, v in s.items() if k.startswith(UNET) and k.endswith("attn2.to_k.weight")), None)
    if to_k is not None:
        c["cross_attention_dim"] = to_k[-1]
    proj_in = next((v for k, v in s.items() if k.startswith(u) and k.endswith(".1.proj_in.weight")), None)
    if proj_in is not None and (len(proj_in) == 2) != bool(c.get("use_linear_projection", False)):
        c["use_linear_projection"] = len(proj_in) == 2
    heads = c.get("attention_head_dim", 8)
    if isinstance(heads, list):  # heads per level (SD 2.x, SDXL: 64-wide heads)
        c["attention_head_dim"] = ([_heads(ch, h) for ch, h in zip(channels, heads)] if len(heads) == levels
                                   else [_heads(ch, ch // 64) for ch in channels])
    else:
        c["attention_head_dim"] = _heads(math.gcd(*(ch for ch, a in zip(channels, attends) if a)), heads)
    label = s.get(UNET + "label_emb.0.0.weight")
    if label is not None:  # SDXL: time ids (6, the refiner's 5) x addition_time_embed_dim + the pooled text
        c["projection_class_embeddings_input_dim"] = label[1]
        if pooled and (label[1] - pooled) % time_ids == 0:
            c["addition_time_embed_dim"] = (label[1] - pooled) // time_ids
