"""A downloaded single-file checkpoint loads with no network and no Hugging Face cache (issue 29 item 10).

The tiny pipelines are written as original-layout files (tests/ldm_layout.py) with CLIP's real 49408-token
vocabulary, as every real SD file has, and loaded with the network blocked, HF_HUB_OFFLINE=1 and an empty HF cache:
the configs come from lowvram_gen/configs, fitted to the file's shapes, and CLIP's tokenizer is built from the shipped
BPE file. The variant a file needs (SD 2.x eps/v, SDXL base/refiner, SD3 / 3.5 medium / large, FLUX.1 dev/schnell)
is told from synthetic {key: shape} dicts: no big tensors.
"""

from __future__ import annotations

import json
import socket
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

torch = pytest.importorskip("torch")
pytest.importorskip("diffusers")
import safetensors.torch  # noqa: E402

import ldm_layout  # noqa: E402
from lowvram_gen import families  # noqa: E402
from lowvram_gen.errors import ModelLoadError  # noqa: E402
from lowvram_gen.families import keys  # noqa: E402
from lowvram_gen.models import offline_configs  # noqa: E402
from lowvram_gen.models.checkpoint import detect_family, load_single_file  # noqa: E402

U = keys.UNET


@pytest.fixture
def offline(tmp_path, monkeypatch):
    """No network at all, an empty HF cache, HF_HUB_OFFLINE, and a LOWVRAM_GEN_HOME of its own."""
    import huggingface_hub.constants as hf_constants

    cache = tmp_path / "hf" / "hub"
    cache.mkdir(parents=True)
    monkeypatch.setenv("LOWVRAM_GEN_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(hf_constants, "HF_HUB_CACHE", str(cache))
    monkeypatch.setattr(hf_constants, "HF_HUB_OFFLINE", True)

    def no_network(*args, **kwargs):
        raise OSError("network blocked by the test")

    monkeypatch.setattr(socket.socket, "connect", no_network)
    monkeypatch.setattr(socket, "getaddrinfo", no_network)
    monkeypatch.setattr(socket, "create_connection", no_network)
    yield {"home": tmp_path / "home", "cache": cache}
    assert not any(cache.iterdir()), "nothing may be written to the HF cache"


def _tiny_file(tmp_path: Path, name: str) -> Path:
    """The tiny pipeline `name` as one original-layout .safetensors, its text encoders with CLIP's vocabulary."""
    from lowvram_gen.models.tiny import build_tiny_sd, build_tiny_sdxl

    pipe = {"sd": build_tiny_sd, "sdxl": build_tiny_sdxl}[name]()
    for encoder in (pipe.text_encoder, getattr(pipe, "text_encoder_2", None)):
        if encoder is not None:
            encoder.resize_token_embeddings(offline_configs.CLIP_VOCAB)
    path = tmp_path / f"tiny-{name}.safetensors"
    safetensors.torch.save_file(ldm_layout.pipeline_to_ldm(pipe), str(path))
    return path


def test_sd1_single_file_generates_offline_through_the_cli(offline, tmp_path, capsys):
    from lowvram_gen.cli.main import main

    path = _tiny_file(tmp_path, "sd")
    code = main(["generate", "a lighthouse", "--model", str(path), "--width", "64", "--height", "64", "--steps", "2",
                 "--seed", "1", "--outdir", str(tmp_path / "out"), "--json"])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    result = json.loads(captured.out)
    from PIL import Image

    assert Image.open(result["images"][0]).size == (64, 64)
    made = list((offline["home"] / "configs" / "offline").iterdir())
    assert [p.name.split("-")[0] for p in made] == ["sd15"]
    tokenizer = made[0] / "tokenizer"
    assert json.loads((tokenizer / "special_tokens_map.json").read_text())["pad_token"] == "<|endoftext|>"


def test_sdxl_single_file_loads_and_generates_offline(offline, tmp_path):
    path = _tiny_file(tmp_path, "sdxl")
    pipe = load_single_file(path, config=None, torch_dtype=torch.float32)
    assert type(pipe).__name__ == "StableDiffusionXLPipeline"
    assert pipe.tokenizer.pad_token == "<|endoftext|>" and pipe.tokenizer_2.pad_token == "!"
    assert pipe.tokenizer_2.pad_token_id == 0 and len(pipe.tokenizer_2) == 49408
    image = pipe("a lighthouse", num_inference_steps=2, height=64, width=64, output_type="np",
                 generator=torch.Generator("cpu").manual_seed(1)).images[0]
    assert image.shape == (64, 64, 3)
    # the folder is made once and reused
    again = load_single_file(path, config=None, torch_dtype=torch.float32)
    assert len(list((offline["home"] / "configs" / "offline").iterdir())) == 1
    assert torch.equal(again.unet.conv_in.weight, pipe.unet.conv_in.weight)
    # and the components reloaded on their own (precision restored, text encoders reloaded) take the same folder
    from lowvram_gen.models.checkpoint import load_components

    parts = load_components(path, None, ["unet", "text_encoder_2"], torch.float32, from_folder=None)
    assert torch.equal(parts["text_encoder_2"].text_projection.weight, pipe.text_encoder_2.text_projection.weight)
    assert len(list((offline["home"] / "configs" / "offline").iterdir())) == 1


def test_sd2_single_file_loads_offline_as_eps_or_v(offline, tmp_path):
    """SD 2.x's layout (OpenCLIP-H at cond_stage_model.model.): eps without a marker, v with ComfyUI's v_pred key;
    its tokenizer pads with "!"."""
    from lowvram_gen.models.tiny import build_tiny_sd

    pipe = build_tiny_sd()
    pipe.text_encoder.resize_token_embeddings(offline_configs.CLIP_VOCAB)
    state = {**ldm_layout.unet_to_ldm(pipe.unet), **ldm_layout.vae_to_ldm(pipe.vae),
             **ldm_layout.openclip_to_ldm(pipe.text_encoder, keys.OPENCLIP_SD2)}
    state = {k: v.detach().clone().contiguous() for k, v in state.items()}
    path = tmp_path / "sd2.safetensors"
    safetensors.torch.save_file(state, str(path))
    eps = load_single_file(path, config=None, torch_dtype=torch.float32)
    assert (type(eps.scheduler).__name__, eps.scheduler.config.prediction_type) == ("PNDMScheduler", "epsilon")
    assert eps.tokenizer.pad_token == "!" and eps.tokenizer.pad_token_id == 0
    image = eps("a lighthouse", num_inference_steps=2, height=64, width=64, output_type="np",
                generator=torch.Generator("cpu").manual_seed(1)).images[0]
    assert image.shape == (64, 64, 3)
    safetensors.torch.save_file({**state, "v_pred": torch.tensor([])}, str(path))
    v = load_single_file(path, config=None, torch_dtype=torch.float32)
    assert (type(v.scheduler).__name__, v.scheduler.config.prediction_type) == ("DDIMScheduler", "v_prediction")
    assert v.unet.config.upcast_attention is True


def test_a_file_whose_vocabulary_is_not_clips_says_to_pass_config(offline, tmp_path):
    from lowvram_gen.models.tiny import build_tiny_sd

    path = tmp_path / "odd.safetensors"
    safetensors.torch.save_file(ldm_layout.pipeline_to_ldm(build_tiny_sd()), str(path))  # a 1000-token vocabulary
    with pytest.raises(ModelLoadError, match=r"1000-token vocabulary.*--config FOLDER"):
        load_single_file(path, config=None, torch_dtype=torch.float32)


# --------------------------------------------------------------------------------------- the fit to shapes


def _shipped(variant: str) -> dict:
    base, overlay = offline_configs.VARIANTS[variant]
    files = offline_configs._json_files(offline_configs.CONFIGS / base)
    return {**files, **(offline_configs._json_files(offline_configs.CONFIGS / overlay) if overlay else {})}


def _real_shapes(variant: str) -> dict:
    """The {key: shape} of a real-size file of a shipped variant, built on the meta device (no memory)."""
    import diffusers
    import transformers

    files = _shipped(variant)
    index = files["model_index.json"]

    def part(name):
        library, cls = index[name]
        config = files[f"{name}/config.json"]
        if library == "diffusers":
            return getattr(diffusers, cls).from_config(config)
        model_cls = getattr(transformers, cls)
        return model_cls(model_cls.config_class(**{k: v for k, v in config.items() if not k.startswith("_")}))

    with torch.device("meta"):
        names = [n for n in ("unet", "vae", "text_encoder", "text_encoder_2") if n in index and index[n][0]]
        pipe = type("Pipe", (), {n: part(n) for n in names})()
    state = {**ldm_layout.unet_to_ldm(pipe.unet), **ldm_layout.vae_to_ldm(pipe.vae)}
    base = offline_configs.VARIANTS[variant][0]
    if variant == "sdxl-refiner":
        state.update(ldm_layout.openclip_to_ldm(pipe.text_encoder_2, keys.OPENCLIP_XL_REFINER))
    elif base == "sdxl":
        state.update(ldm_layout.clip_to_ldm(pipe.text_encoder, ldm_layout.CLIP_SDXL))
        state.update(ldm_layout.openclip_to_ldm(pipe.text_encoder_2, ldm_layout.OPENCLIP_SDXL))
    elif base == "sd21":  # OpenCLIP-H in SD 2.x's layout, with the 24th layer diffusers leaves out
        state.update(ldm_layout.openclip_to_ldm(pipe.text_encoder, keys.OPENCLIP_SD2))
        state.update({k.replace(".resblocks.0.", ".resblocks.23."): v for k, v in state.items()
                      if k.startswith(keys.OPENCLIP_SD2 + "transformer.resblocks.0.")})
    else:
        state.update(ldm_layout.clip_to_ldm(pipe.text_encoder, ldm_layout.CLIP_SD))
    return {k: tuple(v.shape) for k, v in state.items()}


@pytest.mark.parametrize("variant", ["sd15", "sd2-v", "sd2-eps", "sdxl", "sdxl-refiner"])
def test_the_fit_of_a_real_size_file_is_the_shipped_configs(variant):
    shipped = _shipped(variant)
    fitted = json.loads(json.dumps(shipped))
    offline_configs.fit_to_shapes(fitted, _real_shapes(variant))
    names = ["unet/config.json", "vae/config.json", "text_encoder/config.json", "text_encoder_2/config.json"]
    if variant == "sdxl-refiner":
        names.remove("text_encoder/config.json")  # the refiner has no CLIP-L (the base's config stays unused)
    for name in names:
        if name in shipped:
            changed = {k: (shipped[name].get(k), v) for k, v in fitted[name].items() if shipped[name].get(k) != v}
            assert not changed, f"{variant} {name}: {changed}"


def test_the_sdxl_refiners_unet_is_the_size_of_the_released_one():
    """2.26 billion parameters (the "2.3B" the SDXL report gives): no attention at its first and last levels, four
    transformer blocks elsewhere, 64-wide heads (6, 12, 24)."""
    from diffusers import UNet2DConditionModel

    with torch.device("meta"):
        unet = UNet2DConditionModel.from_config(_shipped("sdxl-refiner")["unet/config.json"])
    assert round(sum(p.numel() for p in unet.parameters()) / 1e9, 2) == 2.26


# ------------------------------------------------------------------------------------- variants from keys


def _sd2(extra: dict | None = None) -> dict:
    return {keys.SD2_CROSS_ATTENTION: (320, 1024), U + "input_blocks.0.0.weight": (320, 4, 3, 3),
            keys.SD2_V_STATISTIC: (320,), keys.OPENCLIP_SD2 + "token_embedding.weight": (49408, 1024), **(extra or {})}


def test_sd2_v_or_eps():
    assert keys.sd_variant({U + "input_blocks.2.1.transformer_blocks.0.attn2.to_k.weight": (320, 768)}) == "sd15"
    assert keys.sd_variant(_sd2({"v_pred": ()})) == "sd2-v"  # ComfyUI's marker key
    wide, narrow = torch.linspace(-1, 1, 320), torch.full((320,), 0.01)
    assert keys.sd_variant(_sd2(), read=lambda k: wide) == "sd2-v"  # ComfyUI's and Forge's statistic
    assert keys.sd_variant(_sd2(), read=lambda k: narrow) == "sd2-eps"
    assert keys.sd_variant(_sd2()) == "sd2-eps"  # nothing to read: eps, as ComfyUI
    inpaint = _sd2({U + "input_blocks.0.0.weight": (320, 9, 3, 3)})
    assert keys.sd_variant(inpaint, read=lambda k: wide) == "sd2-eps"  # SD 2.x inpainting models are eps


def test_sd2_variant_folders_differ_where_they_should():
    v = offline_configs._json_files(offline_configs.CONFIGS / "sd21")
    eps = offline_configs._json_files(offline_configs.CONFIGS / "variants" / "sd2-eps")
    assert v["scheduler/scheduler_config.json"]["prediction_type"] == "v_prediction"
    assert v["unet/config.json"]["upcast_attention"] is True and v["unet/config.json"]["sample_size"] == 96
    assert eps["scheduler/scheduler_config.json"]["prediction_type"] == "epsilon"
    assert eps["unet/config.json"]["upcast_attention"] is False and eps["unet/config.json"]["sample_size"] == 64


def test_sdxl_base_or_refiner():
    common = {U + "input_blocks.1.0.in_layers.0.weight": (320,), U + "output_blocks.0.0.in_layers.0.weight": (1,),
              "first_stage_model.encoder.conv_in.weight": (128, 3, 3, 3)}
    base = {**common, keys.CLIP_XL + "text_model.embeddings.token_embedding.weight": (49408, 768),
            keys.OPENCLIP_XL + "token_embedding.weight": (49408, 1280)}
    refiner = {**common, keys.OPENCLIP_XL_REFINER + "token_embedding.weight": (49408, 1280)}
    assert keys.sdxl_variant(base) == "sdxl" and keys.sdxl_variant(refiner) == "sdxl-refiner"
    unet = offline_configs._json_files(offline_configs.CONFIGS / "variants" / "sdxl-refiner")["unet/config.json"]
    assert unet["cross_attention_dim"] == 1280 and unet["projection_class_embeddings_input_dim"] == 2560


def test_sd3_medium_sd35_medium_or_large():
    sd3 = {f"joint_blocks.{i}.x_block.attn.qkv.weight": (4608, 1536) for i in range(24)}
    medium = {**sd3, "joint_blocks.0.x_block.attn2.qkv.weight": (4608, 1536),
              "joint_blocks.0.x_block.attn.ln_q.weight": (64,)}
    large = {f"model.diffusion_model.joint_blocks.{i}.x_block.attn.ln_q.weight": (64,) for i in range(38)}
    assert [keys.sd3_variant(s) for s in (sd3, medium, large)] == ["sd3", "sd35-medium", "sd35-large"]
    configs = {v: offline_configs._json_files(offline_configs.CONFIGS / "variants" / v)["transformer/config.json"]
               for v in ("sd35-medium", "sd35-large")}
    assert configs["sd35-medium"]["dual_attention_layers"] == list(range(13))
    assert (configs["sd35-large"]["num_layers"], configs["sd35-large"]["caption_projection_dim"]) == (38, 2432)


def test_flux_dev_or_schnell():
    blocks = {"double_blocks.0.img_attn.norm.key_norm.scale": (128,)}
    assert keys.flux1_variant({**blocks, "guidance_in.in_layer.weight": (3072, 256)}) == "flux-dev"
    assert keys.flux1_variant({**blocks, "model.diffusion_model.guidance_in.in_layer.bias": (3072,)}) == "flux-dev"
    assert keys.flux1_variant(blocks) == "flux-schnell"
    schnell = offline_configs._json_files(offline_configs.CONFIGS / "variants" / "flux-schnell")
    assert schnell["transformer/config.json"]["guidance_embeds"] is False
    assert schnell["scheduler/scheduler_config.json"]["use_dynamic_shifting"] is False


def test_every_record_that_ships_configs_names_a_shipped_variant():
    for family in families.FAMILIES:
        if offline_configs.ships(family):
            assert family.single_file.offline_variant({}) in offline_configs.VARIANTS
    for base, overlay in offline_configs.VARIANTS.values():
        assert (offline_configs.CONFIGS / base / "model_index.json").is_file()
        assert overlay is None or (offline_configs.CONFIGS / overlay).is_dir()


# ------------------------------------------------------------------------------------------ tokenizers


def test_clip_tokenizer_built_from_the_shipped_bpe_gives_clips_ids(offline):
    from transformers import CLIPTokenizer

    folder = offline_configs.clip_bpe_files()
    target = offline["home"] / "tok"
    offline_configs._write_clip_tokenizer(target, folder, pad="<|endoftext|>")
    tok = CLIPTokenizer.from_pretrained(str(target))
    assert len(tok) == 49408 and (tok.bos_token_id, tok.eos_token_id, tok.pad_token_id) == (49406, 49407, 49407)
    # the ids CLIP's own tests (and those of other CLIP ports) hard-code
    assert tok("a photo of a cat").input_ids == [49406, 320, 1125, 539, 320, 2368, 49407]
    assert tok("a photo of a dog").input_ids == [49406, 320, 1125, 539, 320, 1929, 49407]
    assert tok("Hello, world!").input_ids == [49406, 3306, 267, 1002, 256, 49407]
    assert tok("don't stop 42 times").input_ids == [49406, 847, 713, 1691, 275, 273, 1661, 49407]
    offline_configs._write_clip_tokenizer(target, folder, pad="!")  # SD 2.x / OpenCLIP-G: "!" pads, id 0
    assert CLIPTokenizer.from_pretrained(str(target)).pad_token_id == 0


# ---------------------------------------------------------------------------------------------------- T5


def _sd3_shapes(t5: bool) -> dict:
    shapes = {"model.diffusion_model.joint_blocks.0.context_block.adaLN_modulation.1.bias": (9216,),
              "text_encoders.clip_l.transformer.text_model.embeddings.token_embedding.weight": (49408, 768)}
    if t5:
        shapes["text_encoders.t5xxl.transformer.shared.weight"] = (32128, 4096)
    return shapes


def test_missing_t5_tokenizer_names_the_files_to_give(offline, tmp_path):
    family = families.SD3
    with pytest.raises(ModelLoadError) as err:
        offline_configs.offline_configs(family, _sd3_shapes(t5=True), tmp_path / "sd3.safetensors")
    message = str(err.value)
    assert "spiece.model" in message and "tokenizer_3/" in message and "--config FOLDER" in message
    assert str(offline["home"] / "tokenizers" / "t5") in message
    flux = {"double_blocks.0.img_attn.norm.key_norm.scale": (128,), "guidance_in.in_layer.weight": (3072, 256)}
    with pytest.raises(ModelLoadError, match=r"tokenizer_2/ folder of black-forest-labs/FLUX\.1-dev.*spiece\.model"):
        offline_configs.offline_configs(families.FLUX1, flux, tmp_path / "flux.safetensors")


def test_sd3_without_t5_in_the_file_needs_no_t5(offline, tmp_path):
    made = offline_configs.offline_configs(families.SD3, _sd3_shapes(t5=False), tmp_path / "sd3.safetensors")
    assert made.variant == "sd3" and made.absent == ("text_encoder_3", "tokenizer_3")
    assert not (made.folder / "tokenizer_3").exists() and (made.folder / "tokenizer_2" / "vocab.json").is_file()
    assert json.loads((made.folder / "tokenizer_2" / "special_tokens_map.json").read_text())["pad_token"] == "!"
    # a user's T5 tokenizer folder is taken when the file has T5
    t5 = offline["home"] / "tokenizers" / "t5"
    t5.mkdir(parents=True)
    (t5 / "spiece.model").write_bytes(b"stand-in")
    made = offline_configs.offline_configs(families.SD3, _sd3_shapes(t5=True), tmp_path / "sd3.safetensors")
    assert made.absent == () and (made.folder / "tokenizer_3" / "spiece.model").read_bytes() == b"stand-in"


def test_an_sd3_file_without_t5_is_handed_to_diffusers_without_t5(offline, tmp_path, monkeypatch):
    """The whole route: an SD3 file with no T5 weights, no --config, no cache: diffusers gets the shipped SD3 folder
    and text_encoder_3=None, tokenizer_3=None (the pipeline's own loading is diffusers', stubbed here)."""
    import diffusers

    path = tmp_path / "sd3-no-t5.safetensors"
    safetensors.torch.save_file({k: torch.zeros(s) for k, s in _sd3_shapes(t5=False).items()}, str(path))
    seen = {}

    def from_single_file(file, **kwargs):
        seen.update(kwargs)
        return type("Pipe", (), {"components": {}})()

    monkeypatch.setattr(diffusers.StableDiffusion3Pipeline, "from_single_file", staticmethod(from_single_file))
    load_single_file(path, config=None, torch_dtype=torch.float32)
    assert seen["text_encoder_3"] is None and seen["tokenizer_3"] is None
    folder = Path(seen["config"])
    assert folder.name.startswith("sd3-") and (folder / "tokenizer_2" / "vocab.json").is_file()


def test_detect_family_still_refuses_the_refiner_as_a_model():
    with pytest.raises(ModelLoadError, match="refiner"):
        detect_family([U + "input_blocks.0.0.weight", U + "output_blocks.0.0.weight",
                       "first_stage_model.encoder.conv_in.weight", keys.OPENCLIP_XL_REFINER + "token_embedding.weight"])
