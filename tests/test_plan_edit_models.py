"""`plan --model qwen-image-edit|qwen-image-edit-plus|kontext` plans the editing models at their real shapes, offline
(issue 30 item 2, editing models), from the configs the package ships (lowvram_gen/configs/<builtin>), and counts an
edit's reference images (`plan --image IMG`, repeatable) as the tokens their pipelines add beside the image's.

Every number the tests expect is worked out here from the shipped config files (transformer width, VAE scale, the
2x2 packing, the text encoders model_index.json names), not copied from the planner. They fail where the editing
models fall back to their base families' records (Kontext read as FLUX.1 counts no reference image; Qwen-Image-Edit
read as Qwen-Image offers `+te-reload`, which its Qwen2.5-VL prompt reading the images cannot do).
"""

from __future__ import annotations

import json

import pytest
from tiny_transformers import cli

from lowvram_gen import families
from lowvram_gen.models.profile import CONFIGS, profile_builtin

EDIT_MODELS = ("qwen-image-edit", "qwen-image-edit-plus", "flux-kontext")
SIDE = 1024  # the job size


def _json(name: str, component: str = "") -> dict:
    path = CONFIGS / name / component / "config.json" if component else CONFIGS / name / "model_index.json"
    return json.loads(path.read_text())


def _expected(name: str) -> dict:
    """The shapes at SIDE x SIDE from the shipped configs: the transformer's width (heads x head width), the VAE's
    scale (2 per block past the first; a Wan-style VAE 2 per temporal-downsample entry), one token per 2x2 latents
    (the transformer's `in_channels` is 4 x the latent channels: the pipeline packs them), the text encoders."""
    den, vae = _json(name, "transformer"), _json(name, "vae")
    latent = int(vae.get("z_dim") or vae["latent_channels"])
    scale = 2 ** len(vae["temperal_downsample"]) if "z_dim" in vae else 2 ** (len(vae["block_out_channels"]) - 1)
    edge = 2 if int(den["in_channels"]) == 4 * latent else int(den["patch_size"])
    encoders = sorted(k for k, v in _json(name).items() if k.startswith("text_encoder") and v[0])
    return {"width": int(den["num_attention_heads"]) * int(den["attention_head_dim"]), "class": den["_class_name"],
            "scale": scale, "edge": edge, "tokens": (SIDE // scale // edge) ** 2, "encoders": encoders}


def _plan(capsys, name: str, *images, vram: str = "8GiB", ram: str = "32GiB") -> dict:
    flags = [a for path in images for a in ("--image", str(path))]
    code, out, err = cli(capsys, "plan", "--model", name, "--vram", vram, "--ram", ram, "--width", str(SIDE),
                         "--height", str(SIDE), *flags, "--json")
    assert code == 0, err
    return json.loads(out)


def _estimate(result: dict, preset: str) -> int:
    return next(p for p in result["presets"] if p["name"] == preset)["estimate_bytes"]


@pytest.fixture(scope="module")
def square(tmp_path_factory):
    """A reference image of SIDE x SIDE pixels: every editing pipeline keeps it at about a megapixel."""
    from PIL import Image

    path = tmp_path_factory.mktemp("refs") / "ref.png"
    Image.new("RGB", (SIDE, SIDE), (120, 90, 60)).save(path)
    return path


@pytest.mark.parametrize("alias, key", [
    ("qwen-image-edit", "qwen-image-edit"), ("Qwen/Qwen-Image-Edit", "qwen-image-edit"),
    ("qwen-image-edit-plus", "qwen-image-edit-plus"), ("qwen-image-edit-2509", "qwen-image-edit-plus"),
    ("Qwen/Qwen-Image-Edit-2509", "qwen-image-edit-plus"),
    ("kontext", "flux-kontext"), ("flux-kontext", "flux-kontext"), ("FLUX.1-Kontext-dev", "flux-kontext"),
    ("black-forest-labs/FLUX.1-Kontext-dev", "flux-kontext"),
])
def test_the_aliases_name_the_editing_models(alias, key):
    record = families.by_name(alias)
    assert record is not None and record.key == key and record.builtin == key and record.edit is not None
    assert families.aliases()[alias.lower()] == key
    assert (CONFIGS / key / "model_index.json").is_file()
    # the shipped model_index names the editing pipeline, not its base family's
    assert _json(key)["_class_name"] == record.tasks["edit"]
    assert profile_builtin(alias).arch == key


@pytest.mark.parametrize("name", EDIT_MODELS)
def test_each_editing_model_plans_its_real_shapes_offline(capsys, name):
    want = _expected(name)
    result = _plan(capsys, name, vram="24GiB", ram="128GiB")
    shapes = result["shapes"]
    assert shapes["denoiser"] == "transformer" and shapes["denoiser_class"] == want["class"]
    assert shapes["width"] == want["width"] and shapes["patch"] == want["edge"]
    assert shapes["tokens"] == want["tokens"]
    assert shapes["vae"]["scale_factor"] == want["scale"]
    assert [e["name"] for e in shapes["text_encoders"]] == want["encoders"]
    index = _json(name)
    assert [e["class"] for e in shapes["text_encoders"]] == [index[e][1] for e in want["encoders"]]


@pytest.mark.parametrize("name", EDIT_MODELS)
def test_the_reference_images_are_counted(capsys, square, name):
    """One reference image adds (SIDE / scale / edge)^2 tokens beside the image's (each pipeline resizes it to about
    a megapixel): the profile the plan estimates by carries them, and a preset of fixed placement whose peak is the
    denoising (medvram: highvram's is the VAE decode beside every weight) is estimated bigger with it; with two
    (Edit-Plus takes up to 3) bigger again."""
    from lowvram_gen.engines.sd import edit
    from lowvram_gen.request import GenerationRequest

    want = _expected(name)
    record = families.by_name(name)
    request = GenerationRequest(model=name, width=SIDE, height=SIDE, reference_images=(str(square),))
    assert edit.planned(profile_builtin(name), record, request).reference_tokens == want["tokens"]

    plain, one = _plan(capsys, name), _plan(capsys, name, square)
    assert _estimate(one, "medvram") > _estimate(plain, "medvram")
    assert one["shapes"] == plain["shapes"]  # the job's own shapes are the same; the references come beside them
    if record.edit.max_images > 1:
        two = _plan(capsys, name, square, square)
        assert _estimate(two, "medvram") > _estimate(one, "medvram")


@pytest.mark.parametrize("name", ("qwen-image-edit", "qwen-image-edit-plus"))
def test_qwen_image_edit_is_planned_without_te_reload(capsys, name):
    """Its text encoder reads the reference images with the prompt (record text_encode_apart None): the plan must not
    offer `+te-reload`, as it would if the plan read the model as Qwen-Image by its transformer class."""
    assert families.by_name(name).text_encode_apart is None
    names = [p["name"] for p in _plan(capsys, name)["presets"]]
    assert names and not any("te-reload" in n for n in names)
    assert any("te-reload" in p["name"] for p in _plan(capsys, "kontext")["presets"])  # FLUX.1's encode_prompt


def test_a_missing_reference_image_is_refused_in_one_line(capsys, tmp_path):
    missing = tmp_path / "nope.png"
    code, out, err = cli(capsys, "plan", "--model", "kontext", "--vram", "8GiB", "--ram", "32GiB", "--image",
                         str(missing))
    assert code != 0 and "reference image" in err and "nope.png" in err and "Traceback" not in err


def test_plan_refuses_an_edit_the_model_cannot_run_as_generate_does(capsys, tmp_path):
    """More reference images than the family takes (Kontext: one), or any on a model that does not edit, are refused
    by `plan` in the sentence `generate` gives, instead of a plan for a job that would not run."""
    from PIL import Image

    ref = tmp_path / "ref.png"
    Image.new("RGB", (64, 64)).save(ref)
    code, _, err = cli(capsys, "plan", "--model", "kontext", "--vram", "8GiB", "--ram", "32GiB", "--image", str(ref),
                       "--image", str(ref))
    assert code == 2 and "FLUX.1 Kontext takes at most 1 reference image" in err and len(err.strip().splitlines()) == 1
    for model, name in (("sdxl", "SDXL"), ("qwen-image", "Qwen-Image")):  # Qwen-Image: Qwen-Image-Edit's transformer
        code, _, err = cli(capsys, "plan", "--model", model, "--vram", "8GiB", "--ram", "32GiB", "--image", str(ref))
        assert code == 2 and f"{name} has no edit pipeline in diffusers" in err and len(err.strip().splitlines()) == 1
