"""docs/FAULTS.md cases 3 and 4 for a 2026 family's transformer file (issue 30 item 3): an empty or truncated
`.safetensors` or `.gguf` (a download cut short) is refused in one sentence naming the file (exit 2 on the CLI), and a
model already loaded in the Session stays loaded and usable; a components folder of another family is refused naming
both, for every family whose transformer files are read. CPU, offline, tiny Z-Image files (ComfyUI's layout and a
city96 Q8_0 GGUF, as tests/test_transformer_files.py writes them).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).parent))

from test_transformer_files import SMALL, _one_sentence, comfy, to_original_zimage, zimage  # noqa: E402,F401
from tiny_transformers import cli  # noqa: E402

from lowvram_gen import families  # noqa: E402
from lowvram_gen.errors import ModelLoadError  # noqa: E402


def _cut(source: Path, target: Path, keep: float) -> Path:
    """`source`'s first `keep` of bytes at `target`: a download cut short (keep 0: an empty file)."""
    data = source.read_bytes()
    target.write_bytes(data[:int(len(data) * keep)])
    return target


@pytest.fixture(scope="module")
def whole(comfy) -> Path:
    return comfy / "diffusion_models" / "z_image_tiny.safetensors"


@pytest.fixture(scope="module")
def gguf_file(tmp_path_factory, zimage) -> Path:
    gguf = pytest.importorskip("gguf")
    import gguf_files
    from diffusers import ZImageTransformer2DModel

    state = ZImageTransformer2DModel.from_pretrained(zimage, subfolder="transformer").state_dict()
    path = tmp_path_factory.mktemp("gguf") / "z_image_tiny-Q8_0.gguf"
    gguf_files.write_gguf(path, to_original_zimage(state, prefix=""), gguf.GGMLQuantizationType.Q8_0, arch="lumina2")
    return path


@pytest.fixture
def sources(whole, gguf_file) -> dict[str, Path]:
    return {"safetensors": whole, "gguf": gguf_file}


CASES = [(kind, how) for kind in ("safetensors", "gguf") for how in ("empty", "truncated")]


def _broken(case, sources, tmp_path) -> Path:
    """The file a case names, ('safetensors' | 'gguf', 'empty' | 'truncated'): a truncated file keeps its whole
    header (its keys say Z-Image), its tensors cut."""
    kind, how = case
    return _cut(sources[kind], tmp_path / f"z_image_{how}.{kind}", 0 if how == "empty" else 0.6)


@pytest.mark.parametrize("case", CASES, ids=["-".join(c) for c in CASES])
def test_a_cut_transformer_file_is_one_sentence_naming_it_exit_2(case, sources, zimage, tmp_path, capsys):
    path = _broken(case, sources, tmp_path)
    code, _, err = cli(capsys, "generate", "x", *SMALL, "--outdir", str(tmp_path / "o"), "--model", str(path),
                       "--components", str(zimage))
    line = _one_sentence(err)
    assert code == 2 and path.name in line, line
    assert ("empty" in line or "0 bytes" in line) if case[1] == "empty" else ("truncated" in line or "cut" in line)


@pytest.mark.parametrize("case", CASES, ids=["-".join(c) for c in CASES])
def test_a_loaded_model_stays_usable_after_a_cut_transformer_file_is_refused(case, sources, zimage, tmp_path):
    """Through the Python API: the folder's model, loaded by a first job, is still the Session's after the broken
    file's job is refused, and the next job on it makes the same image without loading anything."""
    from lowvram_gen.request import GenerationRequest
    from lowvram_gen.session import Session

    session = Session()

    def job(model, config=None):
        return GenerationRequest(prompt="a castle", model=str(model), config=config, width=64, height=64, steps=2,
                                 seed=7, preset="cpu", outdir=str(tmp_path / "o"))

    first = session.generate(job(zimage))
    loaded = session.model
    path = _broken(case, sources, tmp_path)
    with pytest.raises(ModelLoadError) as caught:
        session.generate(job(path, str(zimage)))
    assert path.name in str(caught.value)
    assert session.model is loaded
    again = session.generate(job(zimage))
    assert session.model is loaded
    from PIL import Image

    def pixels(result):
        return np.asarray(Image.open(result.images[0]), dtype=np.int16)

    assert np.array_equal(pixels(again), pixels(first))


# ----------------------------------------------------------------------------- case 4: another family's folder


def _folder(root: Path, pipeline: str) -> Path:
    folder = root / pipeline
    folder.mkdir()
    (folder / "model_index.json").write_text(json.dumps({"_class_name": pipeline}))
    return folder


@pytest.mark.parametrize("family,theirs", [
    ("flux2-dev", "Flux2KleinPipeline"), ("flux2-klein", "Flux2Pipeline"), ("hidream", "FluxPipeline"),
    ("hidream", "ZImagePipeline"), ("z-image", "Lumina2Pipeline"), ("qwen-image", "ZImagePipeline"),
    ("chroma", "FluxPipeline"), ("sana", "PixArtSigmaPipeline"), ("lumina2", "ZImagePipeline")])
def test_every_familys_transformer_file_refuses_a_components_folder_of_another(family, theirs, tmp_path):
    from lowvram_gen.models.transformer_file import folder_pipeline

    record = families.by_name(family)
    assert record.single_file and record.single_file.gguf_match  # its transformer files are read
    with pytest.raises(ModelLoadError) as caught:
        folder_pipeline(_folder(tmp_path, theirs), record, Path("file.safetensors"))
    assert f"is a {record.name} transformer" in str(caught.value) and theirs in str(caught.value)


@pytest.mark.parametrize("family,theirs", [
    ("flux2-dev", "Flux2Pipeline"), ("flux2-klein", "Flux2KleinPipeline"), ("flux2-klein-9b", "Flux2KleinPipeline"),
    ("hidream", "HiDreamImagePipeline"), ("qwen-image", "QwenImageEditPlusPipeline")])
def test_a_components_folder_of_the_same_model_is_taken(family, theirs, tmp_path):
    from lowvram_gen.models.transformer_file import folder_pipeline

    assert folder_pipeline(_folder(tmp_path, theirs), families.by_name(family), Path("f.safetensors")) == theirs
