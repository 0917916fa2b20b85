"""A 2026 family's transformer alone, as ComfyUI (`models/diffusion_models/*.safetensors`) and city96 (`.gguf`) publish
it, with the text encoders and VAE from a diffusers folder (`--components`), end to end on the tiny folders (issue 30
item 3); and the formats diffusers cannot read (ComfyUI's scaled fp8, a text encoder alone) refused in one sentence.

Z-Image's (fused `attention.qkv`, ComfyUI's `model.diffusion_model.` prefix), Flux.2 Klein's (BFL's) and SANA's
transformers are written in their original layouts by inverting diffusers' convert_*_to_diffusers, each checked by
running diffusers' converter back to every diffusers tensor. Qwen-Image's ComfyUI files use diffusers' own names (its
single-file mapping is the identity). Chroma's and Lumina 2's files are told by their keys only (diffusers' Lumina 2
converter splits at the real model's widths, so no tiny file of it converts). CPU, offline, 64x64, 2 steps.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import save_file

sys.path.insert(0, str(Path(__file__).parent))

from tiny_qwen import build_tiny_qwen_image  # noqa: E402
from tiny_transformers import cli, pixels  # noqa: E402
from tiny_zimage import build_tiny_zimage  # noqa: E402

from lowvram_gen import families  # noqa: E402
from lowvram_gen.families import keys  # noqa: E402

SMALL = ["--width", "64", "--height", "64", "--steps", "2", "--seed", "7", "--preset", "cpu", "--json"]
MAX_DIFF = 2  # of 255: "equal to running the folder itself"
COMFY = "model.diffusion_model."
# diffusers name part -> Z-Image's original one (the inverse of diffusers' Z_IMAGE_KEYS_RENAME_DICT)
_ZIMAGE_NAMES = {"all_x_embedder.2-1.": "x_embedder.", "all_final_layer.2-1.": "final_layer.",
                 ".attention.to_out.0.": ".attention.out.", ".attention.norm_k.": ".attention.k_norm.",
                 ".attention.norm_q.": ".attention.q_norm."}


def to_original_zimage(state: dict, prefix: str = COMFY) -> dict:
    """A diffusers ZImageTransformer2DModel state dict in Z-Image's original layout, as ComfyUI's
    diffusion_models/z_image_turbo_bf16.safetensors holds it: q, k, v fused into one `attention.qkv`."""
    src = {k: v.detach().clone().contiguous() for k, v in state.items()}
    out = {}
    for key in [k for k in src if k.endswith(".attention.to_q.weight")]:
        base = key.removesuffix(".to_q.weight")
        out[prefix + base + ".qkv.weight"] = torch.cat([src.pop(f"{base}.to_{p}.weight") for p in "qkv"])
    for key, value in src.items():
        for ours, theirs in _ZIMAGE_NAMES.items():
            key = key.replace(ours, theirs)
        out[prefix + key] = value
    return out


# diffusers name -> Black Forest Labs' Flux.2 one (the inverse of convert_flux2_transformer_checkpoint_to_diffusers)
_FLUX2_TOP = {"x_embedder.": "img_in.", "context_embedder.": "txt_in.", "proj_out.": "final_layer.linear.",
              "time_guidance_embed.timestep_embedder.linear_1.": "time_in.in_layer.",
              "time_guidance_embed.timestep_embedder.linear_2.": "time_in.out_layer.",
              "time_guidance_embed.guidance_embedder.linear_1.": "guidance_in.in_layer.",
              "time_guidance_embed.guidance_embedder.linear_2.": "guidance_in.out_layer.",
              "double_stream_modulation_img.linear.": "double_stream_modulation_img.lin.",
              "double_stream_modulation_txt.linear.": "double_stream_modulation_txt.lin.",
              "single_stream_modulation.linear.": "single_stream_modulation.lin."}
_FLUX2_DOUBLE = {"attn.norm_q.weight": "img_attn.norm.query_norm.scale",
                 "attn.norm_k.weight": "img_attn.norm.key_norm.scale",
                 "attn.norm_added_q.weight": "txt_attn.norm.query_norm.scale",
                 "attn.norm_added_k.weight": "txt_attn.norm.key_norm.scale", "attn.to_out.0.": "img_attn.proj.",
                 "attn.to_add_out.": "txt_attn.proj.", "ff.linear_in.": "img_mlp.0.", "ff.linear_out.": "img_mlp.2.",
                 "ff_context.linear_in.": "txt_mlp.0.", "ff_context.linear_out.": "txt_mlp.2."}
_FLUX2_SINGLE = {"attn.to_qkv_mlp_proj.": "linear1.", "attn.to_out.": "linear2.",
                 "attn.norm_q.weight": "norm.query_norm.scale", "attn.norm_k.weight": "norm.key_norm.scale"}


def to_original_flux2(state: dict) -> dict:
    """A diffusers Flux2Transformer2DModel state dict in BFL's Flux.2 layout (ComfyUI's diffusion_models/ files):
    q, k, v fused per stream, the final AdaLN's halves back in BFL's order (shift, scale)."""
    src = {k: v.detach().clone().contiguous() for k, v in state.items()}
    out = {}
    for key in [k for k in src if k.startswith("transformer_blocks.") and k.endswith(".attn.to_q.weight")]:
        block = key.split(".")[1]
        ours = f"transformer_blocks.{block}.attn."
        out[f"double_blocks.{block}.img_attn.qkv.weight"] = torch.cat([src.pop(ours + f"to_{p}.weight") for p in "qkv"])
        out[f"double_blocks.{block}.txt_attn.qkv.weight"] = torch.cat([src.pop(ours + f"add_{p}_proj.weight")
                                                                      for p in "qkv"])
    scale, shift = src.pop("norm_out.linear.weight").chunk(2, dim=0)
    out["final_layer.adaLN_modulation.1.weight"] = torch.cat([shift, scale])
    for key, value in src.items():
        kind, rest = key.split(".", 1)
        table, prefix = ({"transformer_blocks": (_FLUX2_DOUBLE, "double_blocks."),
                          "single_transformer_blocks": (_FLUX2_SINGLE, "single_blocks.")}.get(kind, (_FLUX2_TOP, "")))
        if prefix:
            block, rest = rest.split(".", 1)
            prefix, key = f"{prefix}{block}.", rest
        new = next((key.replace(a, b, 1) for a, b in table.items() if key.startswith(a)), None)
        assert new is not None, f"no BFL name for {kind}.{rest}"
        out[prefix + new] = value
    return out


def to_original_sana(state: dict) -> dict:
    """A diffusers SanaTransformer2DModel state dict in SANA's original layout (Efficient-Large-Model's .pth files,
    ComfyUI's): fused self-attention qkv and cross-attention kv, PixArt's embedder names; the two tensors diffusers
    drops (`pos_embed`, `y_embedder.y_embedding`) as stand-ins."""
    src = {k: v.detach().clone().contiguous() for k, v in state.items()}
    out = {"pos_embed": torch.zeros(1), "y_embedder.y_embedding": torch.zeros(1)}
    top = {"patch_embed.proj": "x_embedder.proj", "time_embed.emb.timestep_embedder.linear_1": "t_embedder.mlp.0",
           "time_embed.emb.timestep_embedder.linear_2": "t_embedder.mlp.2", "time_embed.linear": "t_block.1",
           "caption_projection.linear_1": "y_embedder.y_proj.fc1",
           "caption_projection.linear_2": "y_embedder.y_proj.fc2",
           "caption_norm": "attention_y_norm", "proj_out": "final_layer.linear"}
    block = {"attn1.to_out.0": "attn.proj", "attn2.to_q": "cross_attn.q_linear", "attn2.to_out.0": "cross_attn.proj",
             "ff.conv_inverted": "mlp.inverted_conv.conv", "ff.conv_depth": "mlp.depth_conv.conv",
             "ff.conv_point": "mlp.point_conv.conv"}
    out["final_layer.scale_shift_table"] = src.pop("scale_shift_table")
    for i in sorted({int(k.split(".")[1]) for k in src if k.startswith("transformer_blocks.")}):
        ours, theirs = f"transformer_blocks.{i}.", f"blocks.{i}."
        out[theirs + "scale_shift_table"] = src.pop(ours + "scale_shift_table")
        out[theirs + "attn.qkv.weight"] = torch.cat([src.pop(f"{ours}attn1.to_{p}.weight") for p in "qkv"])
        for part in ("weight", "bias"):
            kv = [src.pop(f"{ours}attn2.to_{p}.{part}") for p in "kv"]
            out[f"{theirs}cross_attn.kv_linear.{part}"] = torch.cat(kv)
        for a, b in block.items():
            for part in ("weight", "bias"):
                if f"{ours}{a}.{part}" in src:
                    out[f"{theirs}{b}.{part}"] = src.pop(f"{ours}{a}.{part}")
    for a, b in top.items():
        for part in ("weight", "bias"):
            if f"{a}.{part}" in src:
                out[f"{b}.{part}"] = src.pop(f"{a}.{part}")
    assert not src, f"no original name for {sorted(src)[:3]}"
    return out


@pytest.fixture(scope="module")
def zimage(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("tiny-z-image")
    build_tiny_zimage().save_pretrained(folder, safe_serialization=True)
    return folder


@pytest.fixture(scope="module")
def comfy(tmp_path_factory, zimage) -> Path:
    """A ComfyUI models/ folder with the tiny Z-Image transformer in diffusion_models/."""
    from diffusers import ZImageTransformer2DModel

    models = tmp_path_factory.mktemp("ComfyUI") / "models"
    (models / "diffusion_models").mkdir(parents=True)
    transformer = ZImageTransformer2DModel.from_pretrained(zimage, subfolder="transformer")
    path = models / "diffusion_models" / "z_image_tiny.safetensors"
    save_file(to_original_zimage(transformer.state_dict()), str(path))
    return models


def _run(capsys, tmp_path, outdir, *args) -> tuple[np.ndarray, dict]:
    code, out, err = cli(capsys, "generate", "a castle", *SMALL, "--outdir", str(tmp_path / outdir), *args)
    assert code == 0, err
    report = json.loads(out)
    return pixels(report["images"][0]), report


def _saved(folder: Path, pipe, to_original, convert) -> tuple[Path, dict]:
    """`pipe` saved as a diffusers folder, and its transformer in the original layout, which diffusers' converter
    `convert` takes back to every diffusers tensor."""
    pipe.save_pretrained(folder, safe_serialization=True)
    want = pipe.transformer.state_dict()
    original = to_original(want)
    back = convert(dict(original))
    assert set(back) == set(want) and all(torch.equal(back[k], want[k]) for k in want)
    return folder, original


def _one_sentence(err: str) -> str:
    """The CLI's error: one line, one sentence (no full stop but perhaps the last), no traceback."""
    line = err.strip().splitlines()[-1]
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    assert line.startswith("error: ") and ". " not in line.removesuffix("."), line
    return line


# ------------------------------------------------------------------------------------ the file's layout


def test_the_original_layout_is_what_diffusers_converts_from(zimage, comfy):
    """diffusers' own converter takes the test file back to every diffusers key with its values, and diffusers' own
    detection reads it as Z-Image: the file is in the layout ComfyUI publishes, not diffusers'."""
    from diffusers import ZImageTransformer2DModel
    from diffusers.loaders.single_file_utils import (convert_z_image_transformer_checkpoint_to_diffusers,
                                                     infer_diffusers_model_type)
    from safetensors.torch import load_file

    want = ZImageTransformer2DModel.from_pretrained(zimage, subfolder="transformer").state_dict()
    original = load_file(str(comfy / "diffusion_models" / "z_image_tiny.safetensors"))
    assert not set(original) & set(want) and infer_diffusers_model_type(original) == "z-image-turbo"
    back = convert_z_image_transformer_checkpoint_to_diffusers(dict(original))
    assert set(back) == set(want)
    assert all(torch.equal(back[k], want[k]) for k in want)


def test_each_familys_transformer_alone_is_told_by_its_keys():
    """diffusers' marker keys (ComfyUI's prefix or none) name the family; Z-Image's layers are not Lumina 2's
    (they share the caption embedder); FLUX.1's transformer alone is read as theirs are, a whole FLUX.1 file (text
    encoders, VAE) stays FLUX.1's whole-file route."""
    from diffusers.loaders.single_file_utils import CHECKPOINT_KEY_NAMES as names

    from lowvram_gen.models import transformer_file

    cases = {"z-image": [*names["z-image-turbo"], *names["lumina2"]], "lumina2": names["lumina2"],
             "flux2-klein": names["flux2"], "chroma": names["chroma"], "sana": names["sana"],
             "qwen-image": [COMFY + k for k in keys.QWEN_IMAGE_KEYS]}
    for key, file_keys in cases.items():
        shapes = {k: (1,) for k in file_keys}
        assert transformer_file.family_of(shapes).key == key, key
    flux1 = {k: (1,) for k in names["flux"]}  # FLUX.1's transformer alone (BFL's flux1-dev.safetensors)
    assert transformer_file.family_of(flux1).key == "flux"
    whole = {**flux1, "text_encoders.t5xxl.transformer.shared.weight": (1,), "vae.decoder.conv_in.weight": (1,)}
    assert transformer_file.family_of(whole) is None and families.by_checkpoint(whole).key == "flux"
    assert transformer_file.family_of({"model.diffusion_model.input_blocks.0.0.weight": (1,)}) is None


# ------------------------------------------------------------------------------------- through the CLI


def test_a_comfyui_z_image_file_with_the_folders_components_equals_the_folder(zimage, comfy, tmp_path, capsys):
    from lowvram_gen.cli.main import build_parser, folder_flags
    from lowvram_gen.models.discover import model_choices

    want, _ = _run(capsys, tmp_path, "folder", "--model", str(zimage))
    got, report = _run(capsys, tmp_path, "file", "--models-dir", str(comfy), "--model", "z_image_tiny",
                       "--components", str(zimage))
    assert np.abs(got - want).max() <= MAX_DIFF
    with folder_flags(build_parser().parse_args(["ui", "--models-dir", str(comfy)])):
        assert str(comfy.resolve() / "diffusion_models" / "z_image_tiny.safetensors") in model_choices()


def test_without_components_a_diffusers_folder_of_the_family_among_the_models_gives_them(zimage, comfy, tmp_path,
                                                                                       capsys):
    """The UI's Model list has no --components: a Z-Image diffusers folder in checkpoints/ is where the file's text
    encoders and VAE come from (a Qwen-Image folder beside it is not taken)."""
    models = tmp_path / "models"
    (models / "diffusion_models").mkdir(parents=True)
    (models / "checkpoints").mkdir()
    (models / "diffusion_models" / "zi.safetensors").symlink_to(comfy / "diffusion_models" / "z_image_tiny.safetensors")
    build_tiny_qwen_image().save_pretrained(models / "checkpoints" / "a-qwen", safe_serialization=True)
    (models / "checkpoints" / "z-image-turbo").symlink_to(zimage, target_is_directory=True)
    want, _ = _run(capsys, tmp_path, "folder", "--model", str(zimage))
    got, _ = _run(capsys, tmp_path, "file", "--models-dir", str(models), "--model", "zi")
    assert np.abs(got - want).max() <= MAX_DIFF


def test_a_comfyui_flux2_klein_file_equals_the_folder(tmp_path, capsys):
    """Flux.2 Klein's transformer in BFL's layout (what diffusers converts from: checked by its own converter), with
    ComfyUI's `model.diffusion_model.` prefix, which diffusers' Flux.2 converter does not strip."""
    from diffusers.loaders.single_file_utils import convert_flux2_transformer_checkpoint_to_diffusers

    from tiny_flux2 import build_tiny_flux2_klein

    folder, original = _saved(tmp_path / "tiny-flux2-klein", build_tiny_flux2_klein(), to_original_flux2,
                              convert_flux2_transformer_checkpoint_to_diffusers)
    path = tmp_path / "flux-2-klein-tiny.safetensors"
    save_file({COMFY + k: v for k, v in original.items()}, str(path))  # as ComfyUI's own nodes save it
    want, _ = _run(capsys, tmp_path, "folder", "--model", str(folder))
    got, _ = _run(capsys, tmp_path, "file", "--model", str(path), "--components", str(folder))
    assert np.abs(got - want).max() <= MAX_DIFF


def test_without_components_the_file_is_planned_as_its_familys_real_model(comfy):
    """`plan --model FILE` with no components folder: the family's shipped real-size configs, not SD 1.5's; and every
    command that takes --config takes it as --components."""
    from lowvram_gen.models.profile import profile_builtin, source_profile
    from lowvram_gen.models.resolve import resolve

    from lowvram_gen.cli.main import build_parser

    source = resolve(str(comfy / "diffusion_models" / "z_image_tiny.safetensors"))
    assert source_profile(source) == profile_builtin("z-image")
    for command in (["plan"], ["generate", "x"], ["img2img", "x", "--init", "i.png"]):
        assert build_parser().parse_args([*command, "--components", "F"]).config == "F"


def test_the_transformer_file_quantizes_int8_as_it_loads(zimage, comfy, tmp_path, capsys):
    pytest.importorskip("sdnq")
    from lowvram_gen.models.loading import load
    from lowvram_gen.models.quantize import kind_of
    from lowvram_gen.models.resolve import resolve

    model = load(resolve(str(comfy / "diffusion_models" / "z_image_tiny.safetensors"), str(zimage)), "float32",
                 quantize="int8")
    assert type(model.pipe).__name__ == "ZImagePipeline"
    assert kind_of(model.pipe.transformer) == "int8"  # quantized by the load itself (sdnq's config on the model)


def test_a_sana_file_in_its_original_layout_equals_the_folder(tmp_path, capsys):
    from diffusers.loaders.single_file_utils import convert_sana_transformer_to_diffusers

    from tiny_dit import build_tiny_sana

    folder, original = _saved(tmp_path / "tiny-sana", build_tiny_sana(), to_original_sana,
                              convert_sana_transformer_to_diffusers)
    path = tmp_path / "sana-tiny.safetensors"
    save_file(original, str(path))
    want, _ = _run(capsys, tmp_path, "folder", "--model", str(folder), "--negative", "blurry")
    got, _ = _run(capsys, tmp_path, "file", "--model", str(path), "--components", str(folder), "--negative", "blurry")
    assert np.abs(got - want).max() <= MAX_DIFF


def test_reloading_components_of_a_transformer_file_reads_each_from_its_own_place(zimage, comfy):
    """The memory layer's reload (after half precision or int8 cost bits): the transformer again from the file, the
    text encoder and VAE from the components folder, each equal to the first load's."""
    from lowvram_gen.models.loading import load, reload_components
    from lowvram_gen.models.resolve import resolve

    model = load(resolve(str(comfy / "diffusion_models" / "z_image_tiny.safetensors"), str(zimage)), "float32")
    first = {n: {k: v.clone() for k, v in getattr(model.pipe, n).state_dict().items()}
             for n in ("transformer", "text_encoder", "vae")}
    old = model.pipe.transformer
    reload_components(model, ["transformer", "text_encoder", "vae"], "float32")
    assert model.pipe.transformer is not old
    for name, state in first.items():
        again = getattr(model.pipe, name).state_dict()
        assert set(again) == set(state) and all(torch.equal(again[k], state[k]) for k in state), name


def test_a_comfyui_qwen_image_file_equals_the_folder(tmp_path, capsys):
    folder = tmp_path / "tiny-qwen-image"
    pipe = build_tiny_qwen_image()
    pipe.save_pretrained(folder, safe_serialization=True)
    path = tmp_path / "qwen_image_tiny.safetensors"
    save_file({k: v.contiguous() for k, v in pipe.transformer.state_dict().items()}, str(path))
    want, _ = _run(capsys, tmp_path, "folder", "--model", str(folder))
    got, _ = _run(capsys, tmp_path, "file", "--model", str(path), "--components", str(folder))
    assert np.abs(got - want).max() <= MAX_DIFF


def test_a_city96_z_image_gguf_runs_quantized_with_the_folders_components(zimage, comfy, tmp_path, capsys):
    """A Q8_0 GGUF of the transformer (city96's layout: original names, no prefix, 1-D tensors F32): the weights stay
    GGUF-quantized, the transformer's output is within Q8_0's error of the folder's, and the CLI generates with it."""
    gguf = pytest.importorskip("gguf")
    import gguf_files
    from diffusers import ZImageTransformer2DModel
    from diffusers.quantizers.gguf.utils import GGUFParameter

    from lowvram_gen.models.loading import load
    from lowvram_gen.models.resolve import resolve

    reference = ZImageTransformer2DModel.from_pretrained(zimage, subfolder="transformer")
    path = tmp_path / "z_image_tiny-Q8_0.gguf"
    types = gguf_files.write_gguf(path, to_original_zimage(reference.state_dict(), prefix=""),
                                  gguf.GGMLQuantizationType.Q8_0, arch="lumina2")
    assert "Q8_0" in {t.name for t in types.values()}
    pipe = load(resolve(str(path), str(zimage)), "float32").pipe
    quantized = [k for k, p in pipe.transformer.named_parameters() if isinstance(p, GGUFParameter)]
    assert any(".attention.to_q." in k for k in quantized)

    def output(transformer):
        gen = torch.Generator().manual_seed(0)
        x = [torch.randn(16, 1, 8, 8, generator=gen)]
        cap = [torch.randn(8, 16, generator=gen)]
        with torch.no_grad():
            return transformer(x, torch.tensor([0.5]), cap, return_dict=False)[0][0]

    want = output(reference)
    assert float((output(pipe.transformer) - want).norm() / want.norm()) < 0.02  # Q8_0: ~0.4% per weight
    _run(capsys, tmp_path, "gguf", "--model", str(path), "--components", str(zimage))


# ---------------------------------------------------------------------------------------------- refusals


def test_without_components_the_file_says_where_they_come_from(comfy):
    """(The loader's words: through the CLI the plan, made at the real model's size, may refuse first on a small
    machine.)"""
    from lowvram_gen.errors import ModelLoadError
    from lowvram_gen.models.loading import load
    from lowvram_gen.models.resolve import resolve

    with pytest.raises(ModelLoadError) as err:
        load(resolve(str(comfy / "diffusion_models" / "z_image_tiny.safetensors")), "float32")
    assert "--components FOLDER" in str(err.value) and "hf download Tongyi-MAI/Z-Image-Turbo" in str(err.value)


def test_a_components_folder_of_another_family_is_refused_naming_both(comfy, capsys, tmp_path):
    folder = tmp_path / "tiny-qwen-image"
    build_tiny_qwen_image().save_pretrained(folder, safe_serialization=True)
    code, _, err = cli(capsys, "generate", "x", *SMALL, "--outdir", str(tmp_path / "o"),
                       "--model", str(comfy / "diffusion_models" / "z_image_tiny.safetensors"), "--components",
                       str(folder))
    assert code != 0 and "Z-Image transformer" in err and "QwenImagePipeline" in err
    _one_sentence(err)


def _text_encoder_state(scaled: bool) -> dict:
    """A ComfyUI text_encoders/ file's keys: a Qwen-style language model, fp8 with ComfyUI's scales when `scaled`."""
    dtype = torch.float8_e4m3fn if scaled else torch.float16
    state = {"model.embed_tokens.weight": torch.zeros(8, 4, dtype=dtype),
             "model.layers.0.self_attn.q_proj.weight": torch.zeros(4, 4, dtype=dtype),
             "model.norm.weight": torch.ones(4)}
    if scaled:
        state.update({"scaled_fp8": torch.zeros(0, dtype=dtype),
                      "model.layers.0.self_attn.q_proj.scale_weight": torch.ones(1)})
    return state


@pytest.mark.parametrize("scaled", [True, False])
def test_a_comfyui_text_encoder_file_is_refused_in_one_sentence_saying_what_to_give(tmp_path, capsys, scaled):
    path = tmp_path / "text_encoders" / "qwen_3_4b_fp8_scaled.safetensors"
    path.parent.mkdir()
    save_file(_text_encoder_state(scaled), str(path))
    code, _, err = cli(capsys, "generate", "x", *SMALL, "--outdir", str(tmp_path), "--model", str(path))
    assert code != 0
    line = _one_sentence(err)
    assert path.name in line and "--components FOLDER" in line or "diffusers folder" in line
    assert ("scaled fp8" in line) == scaled and ("text encoder" in line)


def test_a_file_given_where_the_components_folder_goes_is_refused_in_one_sentence(comfy, tmp_path, capsys):
    te = tmp_path / "qwen_3_4b.safetensors"
    save_file(_text_encoder_state(False), str(te))
    code, _, err = cli(capsys, "generate", "x", *SMALL, "--outdir", str(tmp_path),
                       "--model", str(comfy / "diffusion_models" / "z_image_tiny.safetensors"), "--components", str(te))
    assert code != 0
    line = _one_sentence(err)
    assert "is a file" in line and "diffusers folder" in line
