"""One reader of model_index.json for a folder's family (families/spec.py): Session.plan's record, the sampling
defaults' and the web UI sliders' are the same function's answer, for a local folder, a hub id in the HF cache
and a pipeline no record claims. Only small JSON files are written; nothing loads.
"""

from __future__ import annotations

import json

from lowvram_gen import families
from lowvram_gen.families import sampling, spec
from lowvram_gen.ui import family_defaults


def folder(tmp_path, class_name: str):
    root = tmp_path / "Z-Image-Turbo"
    (root / "transformer").mkdir(parents=True)
    (root / "model_index.json").write_text(json.dumps({"_class_name": class_name}))
    (root / "transformer" / "config.json").write_text("{}")
    return root


def test_plan_and_sampling_read_one_record(tmp_path):
    root = folder(tmp_path, "ZImagePipeline")
    facts = sampling.folder_facts(str(root), root)
    record = spec.record_of_spec(str(root))
    assert record is families.by_key("z-image") and spec.record_of_index(facts.model_index) is record
    assert family_defaults.sampling_of(str(root)) == record.default_sampling(facts)
    assert not hasattr(sampling, "record_of")  # no second reader left behind


def test_a_pipeline_no_record_claims_is_none_for_both(tmp_path):
    """The Session then asks the denoiser's class (its profile), as plan does; the UI shows GENERIC's defaults."""
    root = folder(tmp_path, "SomeCommunityPipeline")
    assert spec.record_of_spec(str(root)) is None
    assert spec.record_of_index(sampling.folder_facts(str(root), root).model_index) is None
    assert family_defaults.sampling_of(str(root)) == families.GENERIC.default_sampling()


def test_index_folder_finds_a_hub_id_in_the_cache_only(tmp_path, monkeypatch):
    root = folder(tmp_path, "ZImagePipeline")
    import huggingface_hub

    monkeypatch.setattr(huggingface_hub, "try_to_load_from_cache",
                        lambda repo, name: str(root / name) if repo == "Tongyi-MAI/Z-Image-Turbo" else None)
    assert spec.index_folder("Tongyi-MAI/Z-Image-Turbo") == root
    assert spec.record_of_spec("Tongyi-MAI/Z-Image-Turbo") is families.by_key("z-image")
    assert spec.index_folder("someone/not-downloaded") is None
    assert spec.index_folder(str(tmp_path / "missing" / "file.safetensors")) is None  # a path, not a hub id
    assert family_defaults.sampling_of("Tongyi-MAI/Z-Image-Turbo").steps == 9
