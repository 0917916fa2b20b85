"""city96-style GGUFs of Flux.2 Klein's, Qwen-Image's and HiDream-I1's transformers (issue 30 item 3: "a city96-style
GGUF of one new family runs"; Z-Image's is in tests/test_transformer_files.py), with the text encoders and VAE from the
family's diffusers folder: diffusers' own GGUF loader reads them (Klein's in BFL's layout through its Flux.2 converter,
which splits the fused q/k/v of the quantized blocks; Qwen-Image's and HiDream's in diffusers' own names). And a FLUX.1
GGUF without --config finds a FLUX.1 folder among the user's models.

Each is written Q8_0 (tests/gguf_files.py: 2-D weights block-quantized, 1-D F32) and F32: the Q8_0 file keeps its
weights quantized, each within Q8_0's error of the folder's once dequantized, and the CLI generates with it; the F32
file (lossless) generates equal to the folder (max diff <= 2/255). CPU, offline, 64x64, 2 steps.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).parent))

from test_transformer_files import MAX_DIFF, _run, to_original_flux2  # noqa: E402

gguf = pytest.importorskip("gguf")


def _klein():
    from tiny_flux2 import build_tiny_flux2_klein

    return build_tiny_flux2_klein(), to_original_flux2


def _hidream():
    from tiny_hidream import build_tiny_hidream

    return build_tiny_hidream(), lambda state: {k: v.detach().contiguous() for k, v in state.items()}


def _qwen():
    from tiny_qwen import build_tiny_qwen_image

    return build_tiny_qwen_image(), lambda state: {k: v.detach().contiguous() for k, v in state.items()}


@pytest.fixture(scope="module", params=["flux2-klein", "qwen-image", "hidream"])
def family(request, tmp_path_factory) -> tuple[str, Path, dict]:
    """(family key, its tiny folder, {'Q8_0' | 'F32': the GGUF of its transformer})."""
    import gguf_files

    pipe, original = {"flux2-klein": _klein, "qwen-image": _qwen, "hidream": _hidream}[request.param]()
    root = tmp_path_factory.mktemp(request.param)
    pipe.save_pretrained(root / "folder", safe_serialization=True)
    files = {}
    for name in ("Q8_0", "F32"):
        files[name] = root / f"{request.param}-tiny-{name}.gguf"
        gguf_files.write_gguf(files[name], original(pipe.transformer.state_dict()),
                              getattr(gguf.GGMLQuantizationType, name), arch=request.param.split("-")[0])
    return request.param, root / "folder", files


def test_the_q8_0_gguf_stays_quantized_and_each_weight_is_the_folders(family):
    from diffusers.quantizers.gguf.utils import GGUFParameter, dequantize_gguf_tensor

    from lowvram_gen import families
    from lowvram_gen.models import gguf_file
    from lowvram_gen.models.loading import load
    from lowvram_gen.models.resolve import resolve

    key, folder, files = family
    assert gguf_file.family_of(gguf_file.read_header(files["Q8_0"]), files["Q8_0"]) is families.by_name(key)
    want = load(resolve(str(folder)), "float32").pipe.transformer.state_dict()
    got = dict(load(resolve(str(files["Q8_0"]), str(folder)), "float32").pipe.transformer.named_parameters())
    quantized = {k: p for k, p in got.items() if isinstance(p, GGUFParameter) and p.quant_type.name == "Q8_0"}
    assert quantized and set(got) == set(want)
    if key == "flux2-klein":  # BFL's fused q/k/v, quantized, split by diffusers' converter
        assert any(".attn.to_q." in k for k in quantized) and any(".attn.add_k_proj." in k for k in quantized)
    for name, param in quantized.items():  # Q8_0: ~0.4% per weight (absmax / 127 / sqrt(3))
        values = dequantize_gguf_tensor(param).float()
        assert float((values - want[name]).norm() / want[name].norm()) < 0.01, name


def test_the_gguf_generates_and_the_lossless_one_equals_the_folder(family, tmp_path, capsys):
    key, folder, files = family
    want, _ = _run(capsys, tmp_path, "folder", "--model", str(folder))
    got, _ = _run(capsys, tmp_path, "f32", "--model", str(files["F32"]), "--components", str(folder))
    assert np.abs(got - want).max() <= MAX_DIFF
    _run(capsys, tmp_path, "q8", "--model", str(files["Q8_0"]), "--components", str(folder))


def test_a_flux1_gguf_without_config_takes_a_flux1_folder_among_the_models(tmp_path, capsys):
    """FLUX.1's and SD3's GGUFs search the user's models for their components as the 2026 families' files do: a
    city96 FLUX.1 GGUF in ComfyUI's unet/ with a FLUX.1 diffusers folder in checkpoints/ (and a Kontext one, earlier
    by name, which runs the same transformer class but is not FLUX.1's own) generates as with --config."""
    import gguf_files
    from gguf_flux import flux_to_bfl
    from tiny_edit import build_tiny_kontext
    from tiny_transformers import build_tiny_flux

    models = tmp_path / "models"
    (models / "unet").mkdir(parents=True)
    pipe = build_tiny_flux()
    pipe.save_pretrained(models / "checkpoints" / "b-flux1-dev", safe_serialization=True)
    build_tiny_kontext().save_pretrained(models / "checkpoints" / "a-kontext", safe_serialization=True)
    path = models / "unet" / "flux1-dev-Q8_0.gguf"
    gguf_files.write_gguf(path, flux_to_bfl(pipe.transformer.state_dict()), gguf.GGMLQuantizationType.Q8_0, arch="flux")
    want, _ = _run(capsys, tmp_path, "config", "--model", str(path), "--config", str(models / "checkpoints" /
                                                                                       "b-flux1-dev"))
    got, report = _run(capsys, tmp_path, "found", "--models-dir", str(models), "--model", "flux1-dev-Q8_0")
    assert np.array_equal(got, want)
