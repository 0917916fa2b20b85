"""Transformer files of Flux.2 dev, HiDream-I1 and FLUX.1 Kontext as their users have them (issue 30 item 3), end to
end on the tiny folders: each file written in its original layout (BFL's flux2-dev.safetensors; Comfy-Org's
hidream_i1_*.safetensors, diffusers' own names under ComfyUI's `model.diffusion_model.` prefix; a FLUX.1 Kontext file
in BFL's FLUX.1 layout), checked by diffusers' own converter back to every diffusers tensor, then run with the
components of a diffusers folder and compared with running that folder (max diff <= 2/255).

Flux.2 dev and Klein share the transformer class and diffusers' marker key: a dev file is told by its guidance
embedder (Klein 9B from 4B by its width), and a components folder of the other is refused naming both. A Kontext
file has FLUX.1's keys: the components folder's model_index.json (FluxKontextPipeline) decides, as ComfyUI's one
loader leaves it to the workflow. CPU, offline, 2 steps.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import save_file

sys.path.insert(0, str(Path(__file__).parent))

from test_transformer_files import COMFY, MAX_DIFF, SMALL, _one_sentence, _run, _saved, to_original_flux2  # noqa: E402
from tiny_transformers import cli  # noqa: E402

from lowvram_gen.models import transformer_file  # noqa: E402


@pytest.fixture(scope="module")
def flux2_dev(tmp_path_factory) -> tuple[Path, Path]:
    """A tiny Flux.2 dev folder and its transformer as BFL publishes flux2-dev.safetensors (no prefix)."""
    from diffusers.loaders.single_file_utils import convert_flux2_transformer_checkpoint_to_diffusers
    from tiny_flux2_dev import build_tiny_flux2_dev

    root = tmp_path_factory.mktemp("flux2-dev")
    folder, original = _saved(root / "tiny-flux2-dev", build_tiny_flux2_dev(), to_original_flux2,
                              convert_flux2_transformer_checkpoint_to_diffusers)
    assert "guidance_in.in_layer.weight" in original  # the guidance embedder Klein's files lack
    path = root / "flux2-dev.safetensors"
    save_file(original, str(path))
    return folder, path


@pytest.fixture(scope="module")
def klein(tmp_path_factory) -> tuple[Path, Path]:
    from diffusers.loaders.single_file_utils import convert_flux2_transformer_checkpoint_to_diffusers
    from tiny_flux2 import build_tiny_flux2_klein

    root = tmp_path_factory.mktemp("flux2-klein")
    folder, original = _saved(root / "tiny-flux2-klein", build_tiny_flux2_klein(), to_original_flux2,
                              convert_flux2_transformer_checkpoint_to_diffusers)
    path = root / "flux-2-klein-4b.safetensors"
    save_file(original, str(path))
    return folder, path


def test_flux2_dev_and_klein_files_are_told_apart_by_their_keys_and_widths():
    """dev: a guidance embedder (real: 6144 wide, 8 + 48 blocks); Klein 9B: 4096 wide, no guidance; Klein 4B: 3072."""
    from diffusers.loaders.single_file_utils import CHECKPOINT_KEY_NAMES as names

    def file(width: int, guidance: bool, prefix: str = "") -> dict:
        keys = {names["flux2"][1]: (6 * width, width), "img_in.weight": (width, 128)}
        keys.update({"guidance_in.in_layer.weight": (width, 256)} if guidance else {})
        return {prefix + k: v for k, v in keys.items()}

    for prefix in ("", COMFY):
        assert transformer_file.family_of(file(6144, True, prefix)).key == "flux2-dev"
        assert transformer_file.family_of(file(4096, False, prefix)).key == "flux2-klein-9b"
        assert transformer_file.family_of(file(3072, False, prefix)).key == "flux2-klein"
    assert transformer_file.family_of({names["hidream"]: (1,)}).key == "hidream"
    assert transformer_file.family_of({COMFY + names["hidream"]: (1,)}).key == "hidream"


def test_a_flux2_dev_file_in_bfls_layout_equals_the_folder(flux2_dev, tmp_path, capsys):
    folder, path = flux2_dev
    want, _ = _run(capsys, tmp_path, "folder", "--model", str(folder))
    got, report = _run(capsys, tmp_path, "file", "--model", str(path), "--components", str(folder))
    assert np.abs(got - want).max() <= MAX_DIFF


@pytest.mark.parametrize("which", ["dev file, Klein folder", "Klein file, dev folder"])
def test_a_flux2_file_with_the_other_flux2s_components_is_refused_naming_both(flux2_dev, klein, which, tmp_path,
                                                                              capsys):
    """Same transformer class, other models: refused in one sentence before any weight is read as the wrong one."""
    (folder, _), (_, path) = (klein, flux2_dev) if which.startswith("dev") else (flux2_dev, klein)
    code, _, err = cli(capsys, "generate", "x", *SMALL, "--outdir", str(tmp_path), "--model", str(path),
                       "--components", str(folder))
    line = _one_sentence(err)
    assert code == 2 and path.name in line and str(folder) in line
    assert ("Flux2KleinPipeline" in line) == which.startswith("dev")


def _keys_only(path: Path, shapes: dict) -> Path:
    """A .safetensors holding zeros of `shapes` (one element where the shape is (1,)): the keys that tell a file's
    family and variant apart, nothing a load could run (the refusals below come before any weight is read)."""
    save_file({k: torch.zeros(v, dtype=torch.bfloat16) for k, v in shapes.items()}, str(path))
    return path


def test_a_klein_9b_file_with_a_klein_4b_folder_is_refused_naming_both_variants(klein, tmp_path, capsys):
    """Klein 9B's file (4096 wide: its img_in) with a Klein 4B components folder: the same pipeline class and family
    group, so only the variant tells; refused in one sentence naming both, before diffusers' size mismatch."""
    from diffusers.loaders.single_file_utils import CHECKPOINT_KEY_NAMES as names

    from lowvram_gen.families.keys import KLEIN_9B_WIDTH

    path = _keys_only(tmp_path / "flux-2-klein-9b.safetensors",
                      {names["flux2"][1]: (1,), "img_in.weight": (KLEIN_9B_WIDTH, 1)})
    assert transformer_file.file_family(path).key == "flux2-klein-9b"
    code, _, err = cli(capsys, "generate", "x", *SMALL, "--outdir", str(tmp_path), "--model", str(path),
                       "--components", str(klein[0]))
    line = _one_sentence(err)
    assert code == 2 and path.name in line and str(klein[0]) in line
    assert "a Flux.2 Klein 9B transformer" in line and "holds a Flux.2 Klein 4B one" in line


def test_a_klein_9b_gguf_with_a_klein_4b_folder_is_refused_as_its_safetensors_is(klein, tmp_path, capsys):
    """The same check on a city96-style GGUF (its logical shapes from the header, under the original names): a Klein
    9B GGUF with a Klein 4B folder is refused naming both variants before any weight is read; a 4B one is not."""
    import gguf
    from diffusers.loaders.single_file_utils import CHECKPOINT_KEY_NAMES as names

    import gguf_files  # tests/gguf_files.py
    from lowvram_gen.errors import ModelLoadError
    from lowvram_gen.families.keys import KLEIN_9B_WIDTH

    def written(name, width):
        path = tmp_path / name
        gguf_files.write_gguf(path, {names["flux2"][1]: torch.zeros(1), "img_in.weight": torch.zeros(width, 1)},
                              gguf.GGMLQuantizationType.F16, arch="flux")
        return path

    nine = written("flux-2-klein-9b-Q8_0.gguf", KLEIN_9B_WIDTH)
    four = written("flux-2-klein-4b-Q8_0.gguf", 3072)
    from lowvram_gen.models import gguf_file

    def shapes(path):  # what the GGUF loader reads and hands the check
        return gguf_file.checkpoint_shapes(gguf_file.read_header(path))

    family = transformer_file.families.by_key("flux2-klein-9b")
    with pytest.raises(ModelLoadError, match="is a Flux.2 Klein 9B transformer.*holds a Flux.2 Klein 4B one"):
        transformer_file.refuse_other_variant(klein[0], family, nine, shapes(nine))
    transformer_file.refuse_other_variant(klein[0], family, four, shapes(four))  # the folder's own variant
    code, _, err = cli(capsys, "generate", "x", *SMALL, "--outdir", str(tmp_path), "--model", str(nine),
                       "--components", str(klein[0]))
    line = _one_sentence(err)
    assert code == 2 and nine.name in line and "holds a Flux.2 Klein 4B one" in line


def test_a_flux1_schnell_file_with_a_dev_folder_is_refused_and_a_dev_file_taken(tmp_path, capsys):
    """FLUX.1 schnell's transformer (no guidance embedder) with a FLUX.1 dev folder (guidance_embeds): refused naming
    both; a dev file's keys pass the same check (diffusers' FLUX.1 converter splits at the real width, so no tiny file
    converts: the check is asked alone there)."""
    from diffusers.loaders.single_file_utils import CHECKPOINT_KEY_NAMES as names
    from tiny_transformers import build_tiny_flux

    from lowvram_gen import families
    from lowvram_gen.errors import ModelLoadError

    folder = tmp_path / "tiny-flux-dev"
    build_tiny_flux().save_pretrained(folder, safe_serialization=True)
    schnell = _keys_only(tmp_path / "flux1-schnell.safetensors", {names["flux"][0]: (1,)})
    code, _, err = cli(capsys, "generate", "x", *SMALL, "--outdir", str(tmp_path), "--model", str(schnell),
                       "--components", str(folder))
    line = _one_sentence(err)
    assert code == 2 and schnell.name in line and str(folder) in line
    assert "a FLUX.1 schnell transformer" in line and "holds a FLUX.1 dev one" in line
    dev = _keys_only(tmp_path / "flux1-dev.safetensors", {names["flux"][0]: (1,), "guidance_in.in_layer.weight": (1,)})
    flux1 = families.by_pipeline("FluxPipeline")
    transformer_file.refuse_other_variant(folder, flux1, dev)  # the same variant: no refusal
    with pytest.raises(ModelLoadError, match="FLUX.1 schnell transformer"):
        transformer_file.refuse_other_variant(folder, flux1, schnell)


def test_without_components_a_flux2_dev_file_finds_a_dev_folder_not_a_klein_one(flux2_dev, klein, tmp_path, capsys):
    """The user's models hold both Flux.2 folders: the dev file takes the dev one (both are Flux2Transformer2DModel)."""
    models = tmp_path / "models"
    (models / "diffusion_models").mkdir(parents=True)
    (models / "checkpoints").mkdir()
    (models / "diffusion_models" / "flux2-dev.safetensors").symlink_to(flux2_dev[1])
    (models / "checkpoints" / "a-flux2-klein").symlink_to(klein[0], target_is_directory=True)
    (models / "checkpoints" / "b-flux2-dev").symlink_to(flux2_dev[0], target_is_directory=True)
    want, _ = _run(capsys, tmp_path, "folder", "--model", str(flux2_dev[0]))
    got, _ = _run(capsys, tmp_path, "file", "--models-dir", str(models), "--model", "flux2-dev")
    assert np.abs(got - want).max() <= MAX_DIFF


def test_a_flux2_dev_file_is_planned_as_flux2_dev_not_klein(flux2_dev):
    from lowvram_gen.models.profile import profile_builtin, source_profile
    from lowvram_gen.models.resolve import resolve

    assert source_profile(resolve(str(flux2_dev[1]))) == profile_builtin("flux2-dev")


def test_a_comfy_org_hidream_file_equals_the_folder(tmp_path, capsys):
    """Comfy-Org's hidream_i1_*.safetensors: diffusers' names under ComfyUI's prefix, which diffusers' HiDream
    converter strips."""
    from diffusers.loaders.single_file_utils import convert_hidream_transformer_to_diffusers, \
        infer_diffusers_model_type
    from tiny_hidream import build_tiny_hidream

    def comfy(state):
        return {COMFY + k: v.detach().clone().contiguous() for k, v in state.items()}

    folder, original = _saved(tmp_path / "tiny-hidream", build_tiny_hidream(), comfy,
                              convert_hidream_transformer_to_diffusers)
    assert infer_diffusers_model_type({k.removeprefix(COMFY): v for k, v in original.items()}) == "hidream"
    path = tmp_path / "hidream_i1_full_tiny.safetensors"
    save_file(original, str(path))
    side = ["--width", "128", "--height", "128"]  # the tiny model's native area (it renders every size at it)
    want, _ = _run(capsys, tmp_path, "folder", "--model", str(folder), *side)
    got, _ = _run(capsys, tmp_path, "file", "--model", str(path), "--components", str(folder), *side)
    assert np.abs(got - want).max() <= MAX_DIFF


# ----------------------------------------------------------------------------------------------- FLUX.1 Kontext


@pytest.fixture
def small_kontext(monkeypatch):
    """Kontext's call resizes the reference image to its preferred ~1024x1024 sizes: 64x64 here, for ours and
    diffusers' alike (as tests/test_family_edit.py)."""
    import diffusers.pipelines.flux.pipeline_flux_kontext as kontext

    monkeypatch.setattr(kontext, "PREFERRED_KONTEXT_RESOLUTIONS", [(64, 64)])


def test_a_kontext_file_is_kontext_where_its_components_folder_says_so(tmp_path, capsys, small_kontext):
    """A city96-style GGUF of FLUX.1 Kontext (BFL's FLUX.1 keys, as QuantStack's flux1-kontext-dev-*.gguf; stored F32
    here, so lossless) with a Kontext folder's components builds FluxKontextPipeline and edits equal to the folder;
    with a FLUX.1 folder the same file is FLUX.1's (nothing in its keys says Kontext)."""
    gguf = pytest.importorskip("gguf")
    import gguf_files
    from gguf_flux import flux_to_bfl
    from PIL import Image
    from tiny_edit import build_tiny_kontext
    from tiny_transformers import build_tiny_flux

    from lowvram_gen.models.loading import load
    from lowvram_gen.models.resolve import resolve

    kontext, flux = tmp_path / "tiny-kontext", tmp_path / "tiny-flux"
    pipe = build_tiny_kontext()
    pipe.save_pretrained(kontext, safe_serialization=True)
    build_tiny_flux().save_pretrained(flux, safe_serialization=True)
    path = tmp_path / "flux1-kontext-dev-F32.gguf"
    gguf_files.write_gguf(path, flux_to_bfl(pipe.transformer.state_dict()), gguf.GGMLQuantizationType.F32, arch="flux")
    assert type(load(resolve(str(path), str(flux)), "float32").pipe).__name__ == "FluxPipeline"
    ref = tmp_path / "ref.png"
    Image.fromarray(np.random.default_rng(0).integers(0, 255, (64, 64, 3), dtype=np.uint8)).save(ref)

    def edit(*model) -> np.ndarray:
        from tiny_transformers import pixels

        code, out, err = cli(capsys, "edit", "make it blue", "--image", str(ref), *model, "--steps", "2", "--seed", "7",
                             "--preset", "cpu", "--outdir", str(tmp_path / "out"), "--json")
        assert code == 0, err
        return pixels(__import__("json").loads(out)["images"][0])

    want = edit("--model", str(kontext))
    got = edit("--model", str(path), "--config", str(kontext))
    assert np.abs(got - want).max() <= MAX_DIFF


def test_a_whole_flux1_file_builds_the_kontext_pipeline_with_a_kontext_folder(tmp_path):
    """The .safetensors route asks the same question (diffusers' FLUX.1 converter splits at the real width, 3072, so
    no tiny FLUX.1 .safetensors converts: the choice is checked alone)."""
    from lowvram_gen import families
    from lowvram_gen.models.transformer_file import file_pipeline

    flux1 = families.by_pipeline("FluxPipeline")
    for name, want in (("FluxKontextPipeline", "FluxKontextPipeline"), ("FluxPipeline", "FluxPipeline"),
                       ("FluxFillPipeline", "FluxPipeline"), ("StableDiffusionPipeline", "FluxPipeline")):
        (tmp_path / name).mkdir()
        (tmp_path / name / "model_index.json").write_text('{"_class_name": "%s"}' % name)
        assert file_pipeline(tmp_path / name, flux1) == want, name


# ------------------------------------------------------------------------------------ SD3's transformer alone


def to_original_sd3(state: dict) -> dict:
    """A diffusers SD3Transformer2DModel state dict (no qk norms, no second attention: SD3 medium's kind) in
    Stability's MMDiT layout, as sd3_medium.safetensors holds it: q, k, v fused per stream, the last context block's
    and the final AdaLN's halves back in (shift, scale) order (the inverse of diffusers' converter)."""
    from diffusers.loaders.single_file_utils import swap_scale_shift

    src = {k: v.detach().clone().contiguous() for k, v in state.items()}
    out = {"pos_embed": src.pop("pos_embed.pos_embed")}
    top = {"pos_embed.proj": "x_embedder.proj", "time_text_embed.timestep_embedder.linear_1": "t_embedder.mlp.0",
           "time_text_embed.timestep_embedder.linear_2": "t_embedder.mlp.2", "context_embedder": "context_embedder",
           "time_text_embed.text_embedder.linear_1": "y_embedder.mlp.0",
           "time_text_embed.text_embedder.linear_2": "y_embedder.mlp.2", "proj_out": "final_layer.linear"}
    block = {"attn.to_out.0": "x_block.attn.proj", "attn.to_add_out": "context_block.attn.proj",
             "norm1.linear": "x_block.adaLN_modulation.1", "norm1_context.linear": "context_block.adaLN_modulation.1",
             "ff.net.0.proj": "x_block.mlp.fc1", "ff.net.2": "x_block.mlp.fc2",
             "ff_context.net.0.proj": "context_block.mlp.fc1", "ff_context.net.2": "context_block.mlp.fc2"}
    layers = sorted({int(k.split(".")[1]) for k in src if k.startswith("transformer_blocks.")})
    for part in ("weight", "bias"):
        out[f"final_layer.adaLN_modulation.1.{part}"] = swap_scale_shift(src.pop(f"norm_out.linear.{part}"), 0)
        for a, b in top.items():
            out[f"{b}.{part}"] = src.pop(f"{a}.{part}")
        for i in layers:
            ours, theirs = f"transformer_blocks.{i}.", f"joint_blocks.{i}."
            out[f"{theirs}x_block.attn.qkv.{part}"] = torch.cat([src.pop(f"{ours}attn.to_{p}.{part}") for p in "qkv"])
            out[f"{theirs}context_block.attn.qkv.{part}"] = torch.cat([src.pop(f"{ours}attn.add_{p}_proj.{part}")
                                                                      for p in "qkv"])
            for a, b in block.items():
                if f"{ours}{a}.{part}" in src:
                    value = src.pop(f"{ours}{a}.{part}")
                    last = i == layers[-1] and a == "norm1_context.linear"
                    out[f"{theirs}{b}.{part}"] = swap_scale_shift(value, 0) if last else value
    assert not src, f"no MMDiT name for {sorted(src)[:3]}"
    return out


def test_sd3s_transformer_alone_finds_an_sd3_folder_among_the_models(tmp_path, capsys):
    """SD3's transformer without its text encoders or VAE (sd3_medium.safetensors' kind, ComfyUI's diffusion_models/),
    no --components: the SD3 diffusers folder among the user's models gives them, as for the 2026 families' files;
    equal to running that folder. Its plan reads that folder."""
    from diffusers.loaders.single_file_utils import convert_sd3_transformer_checkpoint_to_diffusers
    from tiny_transformers import build_tiny_sd3

    from lowvram_gen.cli.main import build_parser, folder_flags
    from lowvram_gen.models.profile import profile_from_folder, source_profile
    from lowvram_gen.models.resolve import resolve

    models = tmp_path / "models"
    (models / "diffusion_models").mkdir(parents=True)
    folder, original = _saved(models / "checkpoints" / "tiny-sd3", build_tiny_sd3(), to_original_sd3,
                              convert_sd3_transformer_checkpoint_to_diffusers)
    path = models / "diffusion_models" / "sd3_medium_tiny.safetensors"
    save_file({COMFY + k: v for k, v in original.items()}, str(path))
    assert transformer_file.file_family(path).key == "sd3"
    want, _ = _run(capsys, tmp_path, "folder", "--model", str(folder))
    got, _ = _run(capsys, tmp_path, "file", "--models-dir", str(models), "--model", "sd3_medium_tiny")
    assert np.abs(got - want).max() <= MAX_DIFF
    with folder_flags(build_parser().parse_args(["ui", "--models-dir", str(models)])):
        assert source_profile(resolve(str(path))) == profile_from_folder(folder)
