"""VQGAN-CLIP: requests, models and the taming converter, the loop, its OOM ladder, front ends, planner.

Everything runs on the embedded tiny models (or tiny VQModels built here) at 64x64 with a handful of
cutouts and iterations. Out-of-memory is simulated by making a model call raise
`torch.OutOfMemoryError`, as a too-small card would.
"""

from __future__ import annotations

import json
import pickle
import re
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from PIL import Image

from lowvram_gen.planning import vqgan as memory_vqgan
from lowvram_gen.cli.main import main
from lowvram_gen.hardware.device import fake, probe
from lowvram_gen.ladder import Ladder
from lowvram_gen.engines.vqgan.request import VqganRequest, parse_prompts, split_prompt
from lowvram_gen.errors import Cancelled, InvalidRequest, ModelLoadError, OutOfMemoryEverywhere, UnsafeCheckpoint
from lowvram_gen.outputs import read_png_metadata
from lowvram_gen.presets import Preset, VqganKnobs, load_presets
from lowvram_gen.settings import MemorySettings

SMALL = dict(width=64, height=64, cutn=4, iterations=3, save_every=0, seed=1)


def preset(name: str, rank: int, **knobs) -> Preset:
    """A GPU preset with only VQGAN knobs (the loop reads nothing else); autocast off for exact sums."""
    return Preset(name=name, rank=rank, device="gpu", description="", memory=MemorySettings(), max_pixels=2**22,
                  max_batch=1, vqgan=VqganKnobs(**{"clip_autocast": False, **knobs}))


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """Tiny models gain nothing from a second thread, and on a shared 2-core machine an OpenMP
    barrier waiting for a descheduled thread turns each tiny op into milliseconds."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def session(tmp_path_factory):
    from lowvram_gen.session import Session

    return Session(device="cpu", outdir=str(tmp_path_factory.mktemp("vq-out")))


@pytest.fixture(scope="module")
def models(session):

    return session.vqgan_models(VqganRequest(prompt="x"))


def make_loop(models, ladder, **fields):
    from lowvram_gen.engines.vqgan.loop import VqganLoop

    request = VqganRequest(prompt="a red fox|blurry:-0.5", **{**SMALL, **fields}).validated()
    return VqganLoop(models.vq, models.clip, request, request.seed, (request.width, request.height),
                     Ladder(ladder, "cpu"), probe("cpu"))


# ------------------------------------------------------------------------------ requests


def test_prompt_syntax():
    assert parse_prompts("a red fox:1.5|blurry:-0.5:0.9|at 3:30 pm|ratio 16\\:9:2") == [
        split_prompt("a red fox:1.5"), split_prompt("blurry:-0.5:0.9"), split_prompt("at 3:30 pm"),
        split_prompt("ratio 16\\:9:2")]
    fox, blurry, clock, ratio = parse_prompts("a red fox:1.5|blurry:-0.5:0.9|at 3:30 pm|ratio 16\\:9:2")
    assert (fox.text, fox.weight, fox.stop) == ("a red fox", 1.5, float("-inf"))
    assert (blurry.text, blurry.weight, blurry.stop) == ("blurry", -0.5, 0.9)
    assert (clock.text, clock.weight) == ("at 3:30 pm", 1.0)  # "30 pm" is not a number: it is text
    assert (ratio.text, ratio.weight) == ("ratio 16:9", 2.0)


@pytest.mark.parametrize("fields,named", [
    ({"prompt": "a fox:0"}, "'a fox:0'"),
    ({"prompt": ":2"}, "':2'"),
    ({"prompt": "fox||cat"}, "'fox||cat'"),
    ({"prompt": "fox:1.5.2"}, "'1.5.2' is not a number"),
    ({"prompt": "fox:nan"}, "NaN"),
    ({"prompt": "fox:1:inf"}, "never"),
    ({"prompt": "fox:1000"}, "'1000'"),
    ({"prompt": ""}, "text prompt or an image prompt"),
    ({"width": 100}, "invalid width: 100"),
    ({"height": 0}, "invalid height: 0"),
    ({"width": "abc"}, "'abc'"),
    ({"width": 4112}, "4112"),
    ({"iterations": 0}, "invalid iterations: 0"),
    ({"iterations": 10_001}, "10001"),
    ({"lr": float("nan")}, "invalid learning rate: nan"),
    ({"lr": 0}, "above 0"),
    ({"cut_pow": -1}, "invalid cut power: -1"),
    ({"cutn": 257}, "invalid cutn: 257"),
    ({"optimizer": "Adamm"}, "'Adamm'; use one of Adam, AdamW, Adagrad, Adamax, RMSprop"),
    ({"augments": ("Xx",)}, "'Xx'"),
    ({"seed": 2**32}, "invalid seed"),
    ({"image_prompts": ("/nonexistent/cat.png",)}, "no such image file"),
    ({"init_image": "/nonexistent/start.png"}, "no such image file"),
    ({"init_noise": "static"}, "'static'"),
])
def test_bad_requests_are_refused_naming_the_value(fields, named):
    with pytest.raises(InvalidRequest) as err:
        VqganRequest(**{"prompt": "a fox", **fields}).validated()
    assert named in str(err.value)


@pytest.mark.parametrize("argv,named", [
    (["fox", "--size", "100", "64"], "multiple of 16"),
    (["fox:0"], "weight '0'"),
    (["fox", "--lr", "inf"], "learning rate"),
    (["fox", "--iterations", "0"], "iterations"),
    (["fox", "--optimizer", "LBFGS"], "optimizer"),
    (["fox", "--vqgan", "/nonexistent/vqgan.ckpt"], "not found"),
])
def test_cli_bad_input_exits_2_before_any_model_work(argv, named, capsys):
    assert main(["vqgan", *argv]) == 2
    assert named in capsys.readouterr().err


# ----------------------------------------------------------------- models: YAML and checkpoints


TAMING_YAML = """model:
  base_learning_rate: 4.5e-06
  target: {target}
  params:
    embed_dim: {embed}
    n_embed: {n_embed}
    ddconfig:
      double_z: false
      z_channels: {z}
      resolution: {res}
      in_channels: 3
      out_ch: 3
      ch: {ch}
      ch_mult: {mult}
      num_res_blocks: {nrb}
      attn_resolutions: {attn}
      dropout: 0.0
    lossconfig:
      target: {loss}
      params:
        disc_start: 0
"""
ARCHS = {  # taming ddconfig of the test VQGANs: generic over levels, blocks and attention
    "f4": dict(ch=32, mult=[1, 1, 2], nrb=1, attn=[16], res=64, z=32, embed=8, n_embed=64),
    "f8": dict(ch=32, mult=[1, 2, 2, 2], nrb=2, attn=[8], res=64, z=16, embed=4, n_embed=32),
}


def write_yaml(path: Path, arch: str, target="taming.models.vqgan.VQModel",
               loss="taming.modules.losses.vqperceptual.VQLPIPSWithDiscriminator") -> Path:
    path.write_text(TAMING_YAML.format(target=target, loss=loss, **ARCHS[arch]))
    return path


@pytest.mark.parametrize("target,loss,error,message", [
    ("os.system", "taming.modules.losses.vqperceptual.DummyLoss", UnsafeCheckpoint, "'os.system'"),
    ("taming.models.vqgan.VQModel", "builtins.eval", UnsafeCheckpoint, "'builtins.eval'"),
    ("taming.models.vqgan.GumbelVQ", "taming.modules.losses.vqperceptual.DummyLoss", ModelLoadError, "Gumbel"),
])
def test_yaml_targets_outside_the_allowlist_are_refused_before_the_checkpoint_is_read(
        tmp_path, target, loss, error, message):
    from lowvram_gen.models.vqgan_models import load_vqgan, resolve_vqgan

    marker = tmp_path / "ran"

    class Evil:
        def __reduce__(self):
            return (Path.touch, (marker,))

    ckpt = tmp_path / "evil.ckpt"
    ckpt.write_bytes(pickle.dumps({"state_dict": Evil()}))
    write_yaml(tmp_path / "evil.yaml", "f4", target=target, loss=loss)
    with pytest.raises(error, match=re.escape(message)):
        load_vqgan(resolve_vqgan(str(ckpt)))
    assert not marker.exists()


def test_a_checkpoint_that_would_run_code_is_refused(tmp_path):
    from lowvram_gen.models.vqgan_models import load_vqgan, resolve_vqgan

    marker = tmp_path / "ran"

    class Evil:
        def __reduce__(self):
            return (Path.touch, (marker,))

    (tmp_path / "evil.ckpt").write_bytes(pickle.dumps({"state_dict": {"x": Evil()}}))
    write_yaml(tmp_path / "evil.yaml", "f4")
    with pytest.raises(UnsafeCheckpoint, match="nothing from this file was run"):
        load_vqgan(resolve_vqgan(str(tmp_path / "evil.ckpt")))
    assert not marker.exists()


def test_bad_yaml_and_missing_yaml_are_clear(tmp_path):
    from lowvram_gen.models.vqgan_models import load_vqgan, resolve_vqgan

    (tmp_path / "m.ckpt").write_bytes(b"x")
    with pytest.raises(ModelLoadError, match="needs its config"):
        resolve_vqgan(str(tmp_path / "m.ckpt"))
    (tmp_path / "m.yaml").write_text("model: [unclosed")
    with pytest.raises(ModelLoadError, match="not a valid YAML"):
        load_vqgan(resolve_vqgan(str(tmp_path / "m.ckpt")))


# Inverse of the converter, written from diffusers' VQModel names (generic over levels and blocks),
# so a diffusers model can be saved as the taming-transformers checkpoint users download.
_TO_TAMING_LAYER = {"conv_shortcut": "nin_shortcut", "group_norm": "norm", "to_q": "q", "to_k": "k", "to_v": "v",
                    "to_out.0": "proj_out"}


def taming_name(key: str, levels: int) -> str:
    key = key.replace(".conv_norm_out.", ".norm_out.")
    key = re.sub(r"\.mid_block\.resnets\.(\d)\.", lambda m: f".mid.block_{int(m[1]) + 1}.", key)
    key = key.replace(".mid_block.attentions.0.", ".mid.attn_1.")
    key = re.sub(r"encoder\.down_blocks\.(\d+)\.resnets\.", r"encoder.down.\1.block.", key)
    key = re.sub(r"encoder\.down_blocks\.(\d+)\.attentions\.", r"encoder.down.\1.attn.", key)
    key = re.sub(r"encoder\.down_blocks\.(\d+)\.downsamplers\.0\.", r"encoder.down.\1.downsample.", key)
    for new, old in (("resnets", "block"), ("attentions", "attn"), ("upsamplers.0", "upsample")):
        key = re.sub(rf"decoder\.up_blocks\.(\d+)\.{re.escape(new)}\.",
                     lambda m, old=old: f"decoder.up.{levels - 1 - int(m[1])}.{old}.", key)
    for new, old in _TO_TAMING_LAYER.items():
        key = key.replace(f".{new}.", f".{old}.")
    return key


def taming_checkpoint(tmp_path: Path, arch: str, seed: int = 0) -> tuple[Path, dict]:
    from diffusers import VQModel

    from lowvram_gen.models.vqgan_models import diffusers_config, read_taming_config

    yaml_path = write_yaml(tmp_path / f"vqgan_{arch}.yaml", arch)
    config = diffusers_config(read_taming_config(yaml_path))
    torch.manual_seed(seed)
    model = VQModel(**config)
    with torch.no_grad():
        for p in model.parameters():  # random, not diffusers' zero inits: every weight must matter
            p.normal_(0, 0.2)
    state = {}
    for key, tensor in model.state_dict().items():
        name = taming_name(key, len(config["block_out_channels"]))
        if ".attn" in name and tensor.ndim == 2:
            tensor = tensor[:, :, None, None]  # taming's attention projections are 1x1 convolutions
        state[name] = tensor.clone()
    state["loss.discriminator.main.0.weight"] = torch.zeros(2, 3, 4, 4)  # training-only weights are dropped
    ckpt = tmp_path / f"vqgan_{arch}.ckpt"
    torch.save({"state_dict": state, "global_step": 3, "epoch": 1}, ckpt)
    return ckpt, state


def taming_decode(sd: dict, ddconfig: dict, z_q: torch.Tensor) -> torch.Tensor:
    """taming-transformers' Decoder.forward, written out from its source (modules/diffusionmodules/model.py)."""

    def conv(x, p, pad=0):
        return F.conv2d(x, sd[p + ".weight"], sd[p + ".bias"], padding=pad)

    def norm(x, p):
        return F.group_norm(x, 32, sd[p + ".weight"], sd[p + ".bias"], eps=1e-6)

    def resnet(x, p):
        h = conv(F.silu(norm(x, p + ".norm1")), p + ".conv1", 1)
        h = conv(F.silu(norm(h, p + ".norm2")), p + ".conv2", 1)
        if p + ".nin_shortcut.weight" in sd:
            x = conv(x, p + ".nin_shortcut")
        return x + h

    def attn(x, p):
        h = norm(x, p + ".norm")
        q, k, v = conv(h, p + ".q"), conv(h, p + ".k"), conv(h, p + ".v")
        b, c, hh, ww = q.shape
        w = torch.bmm(q.reshape(b, c, hh * ww).permute(0, 2, 1), k.reshape(b, c, hh * ww)) * c**-0.5
        w = torch.softmax(w, dim=2)
        h = torch.bmm(v.reshape(b, c, hh * ww), w.permute(0, 2, 1)).reshape(b, c, hh, ww)
        return x + conv(h, p + ".proj_out")

    h = conv(conv(z_q, "post_quant_conv"), "decoder.conv_in", 1)
    h = resnet(attn(resnet(h, "decoder.mid.block_1"), "decoder.mid.attn_1"), "decoder.mid.block_2")
    levels = len(ddconfig["ch_mult"])
    for i in reversed(range(levels)):
        for j in range(ddconfig["num_res_blocks"] + 1):
            h = resnet(h, f"decoder.up.{i}.block.{j}")
            if f"decoder.up.{i}.attn.{j}.q.weight" in sd:
                h = attn(h, f"decoder.up.{i}.attn.{j}")
        if i != 0:
            h = conv(F.interpolate(h, scale_factor=2.0, mode="nearest"), f"decoder.up.{i}.upsample.conv", 1)
    return conv(F.silu(norm(h, "decoder.norm_out")), "decoder.conv_out", 1)


@pytest.mark.parametrize("arch", ["f4", "f8"])
def test_taming_checkpoint_converts_and_decodes_codes_like_taming(tmp_path, arch, monkeypatch):
    from lowvram_gen.models import vqgan_models as vm

    ckpt, state = taming_checkpoint(tmp_path, arch)
    vq = vm.load_vqgan(vm.resolve_vqgan(str(ckpt)))  # the .yaml beside it is found
    params = vm.read_taming_config(ckpt.with_suffix(".yaml"))
    codes = torch.randint(0, params["n_embed"], (1, 4, 4), generator=torch.Generator().manual_seed(1))
    z_q = state["quantize.embedding.weight"][codes].permute(0, 3, 1, 2)
    with torch.no_grad():
        ours = vq.decode(z_q, force_not_quantize=True).sample
        theirs = taming_decode(state, params, z_q)
    assert ours.shape == theirs.shape == (1, 3, 4 * vq_factor(params), 4 * vq_factor(params))
    assert torch.allclose(ours, theirs, atol=1e-4, rtol=1e-4), (ours - theirs).abs().max()
    # the conversion is cached as safetensors with its config: the second load converts nothing
    cache = vm.converted_path(ckpt, ckpt.with_suffix(".yaml"))
    assert (cache / "diffusion_pytorch_model.safetensors").is_file() and (cache / "config.json").is_file()
    monkeypatch.setattr(vm, "convert_taming_state_dict", lambda *a, **k: pytest.fail("converted twice"))
    again = vm.load_vqgan(vm.resolve_vqgan(str(ckpt)))
    assert torch.equal(again.quantize.embedding.weight, vq.quantize.embedding.weight)


def vq_factor(params: dict) -> int:
    return 2 ** (len(params["ch_mult"]) - 1)


def test_a_checkpoint_of_another_architecture_names_missing_and_unexpected_keys(tmp_path):
    from lowvram_gen.models import vqgan_models as vm

    ckpt, _ = taming_checkpoint(tmp_path, "f4")
    write_yaml(ckpt.with_suffix(".yaml"), "f8")  # the f8 config beside an f4 checkpoint
    with pytest.raises(ModelLoadError, match=r"missing weight\(s\): .*decoder") as err:
        vm.load_vqgan(vm.resolve_vqgan(str(ckpt)))
    assert "does not match its config" in str(err.value)


# ------------------------------------------------------------------------------------ the loop


def test_chunked_cutouts_give_the_gradient_of_all_cutouts_at_once(models):
    loop = make_loop(models, [preset("p", 0, cutn_chunk=8)], cutn=8)
    loop.setup()
    grads = {}
    for chunk in (8, 3, 1):
        loop.knobs = loop.knobs.__class__(chunk, False, False, False)
        torch.manual_seed(123)  # the same cutouts and augmentations for every chunk size
        losses = loop.gradient()
        grads[chunk] = (loop.state.z.grad.clone(), losses)
    full, full_losses = grads[8]
    assert full.abs().sum() > 0
    for chunk in (3, 1):
        assert torch.allclose(grads[chunk][0], full, rtol=1e-4, atol=1e-6 * full.abs().max()), chunk
        assert grads[chunk][1] == pytest.approx(full_losses, rel=1e-5)


def test_decoder_checkpointing_gives_the_same_gradient(models):
    loop = make_loop(models, [preset("p", 0, cutn_chunk=4)])
    loop.setup()
    out = []
    for on in (False, True):
        loop.knobs = loop.knobs.__class__(4, False, on, False)
        loop.apply_knobs()
        assert models.vq.decoder.gradient_checkpointing is on
        torch.manual_seed(5)
        loop.gradient()
        out.append(loop.state.z.grad.clone())
    loop.close()
    assert torch.allclose(out[0], out[1], rtol=1e-5, atol=1e-7)
    assert models.vq.decoder.gradient_checkpointing is False


def test_oom_mid_run_resumes_from_the_same_latent_at_the_same_iteration(models):
    ladder = [preset("big", 0, cutn_chunk=4), preset("small", 1, cutn_chunk=2, gradient_checkpointing=True,
                                                          clip_text_offload=True)]
    k, total = 3, 5
    loop = make_loop(models, ladder, iterations=total)
    steps, seen = [], {}

    def on_step(i, n):
        steps.append(i)

    def hook(_module, _args):
        state = loop.state
        if state is None or state.iteration != k - 1:
            return
        if loop.preset.name == "big":
            seen["at_oom"] = state.z.detach().clone()
            seen["adam_step"] = int(loop.state.opt.state[state.z]["step"])
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB (simulated)")
        seen.setdefault("at_retry", state.z.detach().clone())

    loop.on_step = on_step
    handle = models.clip.model.vision_model.register_forward_pre_hook(hook)
    try:
        loop.run()
    finally:
        handle.remove()
        loop.close()
    assert steps == list(range(1, total + 1))  # never started over, no iteration done twice or skipped
    assert torch.equal(seen["at_oom"], seen["at_retry"])  # the same z it had
    assert seen["adam_step"] == k - 1 and int(loop.state.opt.state[loop.state.z]["step"]) == total
    oom, ok = [a.as_dict() for a in loop.ladder.attempts]
    assert (oom["preset"], oom["stage"], oom["outcome"], oom["iteration"], oom["batch"]) == (
        "big", "iterate", "oom", k, 4)
    assert "out of memory" in oom["detail"]
    assert (ok["preset"], ok["outcome"], ok["first_iteration"], ok["iteration"], ok["batch"]) == (
        "small", "ok", k, total, 2)
    assert ok["gradient_checkpointing"] and ok["clip_text_offload"] and loop.cutn == 4  # cutn untouched

    # and the result is the one an uninterrupted run gives (chunks and checkpointing change no gradient)
    plain = make_loop(models, [preset("big", 0, cutn_chunk=4)], iterations=total)
    plain.run()
    plain.close()
    assert torch.allclose(plain.state.z, loop.state.z, atol=1e-4)


def test_cutn_is_lowered_only_as_the_last_step_and_recorded(models):
    loop = make_loop(models, [preset("only", 0, cutn_chunk=4)], cutn=8, iterations=2)
    real = loop.cutter.forward

    def cutter(image, cutn):
        if cutn > 2:
            raise RuntimeError("CUDA error: out of memory (simulated)")
        return real(image, cutn)

    loop.cutter.forward = cutter
    loop.run()
    loop.close()
    tried = [(a.outcome, a.batch, a.extra["cutn"]) for a in loop.ladder.attempts]
    # the chunk is halved first (the result does not change), then cutn (it does)
    assert tried == [("oom", 4, 8), ("oom", 2, 8), ("oom", 1, 8), ("oom", 1, 4), ("ok", 1, 2)]
    assert loop.cutn == 2 and any("lowered from 4 to 2" in w and "changes the result" in w for w in loop.warnings)


def test_nan_loss_under_autocast_is_redone_in_float32(models):
    loop = make_loop(models, [preset("half", 0, cutn_chunk=4, clip_autocast=True)], iterations=2)
    real = loop.encode_images
    loop.encode_images = lambda x: real(x) * float("nan") if loop.knobs.clip_autocast else real(x)
    steps = []
    loop.on_step = lambda i, n: steps.append(i)
    loop.run()
    loop.close()
    assert [(a.outcome, a.extra["iteration"], a.extra["clip_autocast"]) for a in loop.ladder.attempts] == [("nan", 1, True), ("ok", 2, False)]
    assert steps == [1, 2] and torch.isfinite(loop.state.z).all()


def test_oom_everywhere_is_one_clear_error_and_the_next_job_runs(session, tmp_path):

    request = VqganRequest(prompt="a fox", outdir=str(tmp_path), **SMALL)
    models = session.vqgan_models(request)

    def hook(_module, _args):
        raise torch.OutOfMemoryError("CUDA out of memory (simulated)")

    handle = models.clip.model.vision_model.register_forward_pre_hook(hook)
    try:
        with pytest.raises(OutOfMemoryEverywhere, match="every step of the ladder; tried: cpu") as err:
            session.generate_vqgan(request)
    finally:
        handle.remove()
    assert len(err.value.attempts) >= 3
    result = session.generate_vqgan(request)  # the session still works
    assert result.attempts[-1]["outcome"] == "ok" and len(result.images) == 1


def test_init_image_image_prompt_and_text_offload_placements(models, tmp_path):
    from lowvram_gen.engines.vqgan.loop import VqganOps

    class Recording(VqganOps):  # what would move where on a GPU (nothing moves on this CPU)
        def place(self, name, modules, on_device):
            self.calls.append((name, on_device))

    picture = tmp_path / "init.png"
    Image.new("RGB", (50, 40), (200, 30, 30)).save(picture)
    loop = make_loop(models, [preset("p", 0, cutn_chunk=2, clip_text_offload=True)], init_image=str(picture),
                     image_prompts=(f"{picture}:0.5",), init_weight=0.5, iterations=1)
    loop.ops = Recording("cuda:0")
    loop.run()
    loop.close()
    placed = [c for c in loop.ops.calls if c[0] != "decoder checkpointing"]
    assert placed[:2] == [("vqgan decoder", True), ("clip vision tower", True)]
    # the text tower encodes the prompts once, then leaves; the encoder visits for the init image only
    assert [c for c in placed if c[0] == "clip text tower"] == [("clip text tower", True), ("clip text tower", False)]
    assert [c for c in placed if c[0] == "vqgan encoder"] == [("vqgan encoder", True), ("vqgan encoder", False)]
    assert len(loop.prompts) == 3 and loop.prompts[2].embed.shape[0] == 4  # one embedding per cutout
    assert len(loop.state.losses) == 4  # two texts, one image, the init weight


# --------------------------------------------------------------------------------- front ends


def test_cli_end_to_end_json_metadata_progress_and_video(tmp_path, capsys):
    out = tmp_path / "out"
    code = main(["vqgan", "a red fox:1|blurry:-1", "--size", "64", "64", "--iterations", "4", "--save-every", "2",
                 "--cutn", "4", "--seed", "7", "--optimizer", "adamw", "--outdir", str(out), "--json", "--video",
                 "--cpu"])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    result = json.loads(captured.out)
    for key in ("images", "seeds", "width", "height", "steps", "sampler", "model", "model_path", "seconds", "preset",
                "attempts", "summary", "generated_width", "generated_height", "upscaled", "device", "warnings",
                "iterations"):
        assert key in result, key
    assert (result["seeds"], result["width"], result["steps"], result["iterations"], result["sampler"]) == (
        [7], 64, 4, 4, "AdamW")
    assert result["preset"] == "cpu" and result["attempts"][-1]["outcome"] == "ok" and not result["upscaled"]
    assert any("random weights" in w for w in result["warnings"])
    [final] = result["images"]
    assert Path(final).parent == out and Image.open(final).size == (64, 64)
    params, meta = read_png_metadata(final)
    assert params.startswith("a red fox:1|blurry:-1\n")
    assert "Steps: 4, Sampler: AdamW, Seed: 7, Size: 64x64, Model: tiny, CLIP: tiny, Engine: VQGAN-CLIP" in params
    assert meta["engine"] == "vqgan" and meta["request"]["cutn"] == 4 and meta["attempts"][-1]["outcome"] == "ok"
    [progress] = result["progress_images"]  # iteration 2; iteration 4 is the final image
    assert Path(progress).parent == out / "progress" and progress.endswith("-it00002.png")
    assert read_png_metadata(progress)[1]["iteration"] == 2
    [video] = result["videos"]  # the test extra installs PyAV, so the progress video is an mp4
    assert video == str(Path(final).with_suffix(".mp4"))
    import av

    with av.open(video) as container:
        frames = [f.to_image() for f in container.decode(video=0)]
    assert frames[0].size == (64, 64) and len(frames) > 2  # iteration 2, the final image, then held


def test_capped_size_is_upscaled_and_same_seed_never_overwrites(session, tmp_path):

    request = VqganRequest(prompt="a fox", **{**SMALL, "width": 128, "height": 96}, outdir=str(tmp_path))
    capped = [preset("capped", 0, cutn_chunk=4, max_pixels=6144)]
    first = session.generate_vqgan(request, presets=capped)
    second = session.generate_vqgan(request, presets=capped)
    assert first.upscaled and (first.generated_width, first.generated_height) == (80, 64)
    assert "generated at 80x64, upscaled" in first.summary
    assert Image.open(first.images[0]).size == (128, 96) and first.images != second.images
    assert "Generated size: 80x64" in read_png_metadata(first.images[0])[0]
    a, b = (Image.open(p).tobytes() for p in (first.images[0], second.images[0]))
    assert a == b  # same seed, same image: the run is deterministic


def test_cancel_keeps_the_image_so_far(session, tmp_path):
    import threading

    cancel = threading.Event()
    request = VqganRequest(prompt="a fox", **{**SMALL, "iterations": 50}, outdir=str(tmp_path))
    with pytest.raises(Cancelled, match="cancelled at iteration 2 of 50; 1 image") as err:
        session.generate_vqgan(request, on_step=lambda i, n: cancel.set() if i == 2 else None, cancel=cancel)
    [kept] = err.value.images
    assert read_png_metadata(kept)[1]["iteration"] == 2


def test_batch_runs_vqgan_lines(session, tmp_path):
    from lowvram_gen.batch import manifest as bm
    from lowvram_gen.batch.command import run_batch

    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"prompt": "a fox", "engine": "vqgan", "iterations": 2, "cutn": 4, "seed": 3}\n'
                       '{"prompt": "a fox:0", "engine": "vqgan"}\n')
    out = tmp_path / "out"
    code = run_batch(prompts, out, {"width": "64", "height": "64", "steps": "1", "cfg_scale": "5"}, {"device": "cpu"},
                     session=session)
    assert code == 1  # line 2 is invalid (weight 0), line 1 ran
    [record] = bm.read_records(bm.current_manifests(out))
    assert (record["engine"], record["status"], record["seeds"], record["preset"]) == ("vqgan", "ok", [3], "cpu")
    assert read_png_metadata(out / record["outputs"][0])[1]["request"]["iterations"] == 2
    assert run_batch(prompts, out, {"width": "64", "height": "64"}, {"device": "cpu"}, session=session) == 1
    assert len(bm.read_records(bm.current_manifests(out))) == 1  # resumed: nothing made twice


def test_batch_fields_map_to_vqgan():
    request = VqganRequest.from_batch_fields({"prompt": "a fox", "negative_prompt": "blurry", "steps": "7",
                                              "cfg_scale": "7", "sampler": "Euler a", "model": "tiny",
                                              "width": "64", "height": "64"})
    assert (request.prompt, request.iterations) == ("a fox|blurry:-1", 7)
    with pytest.raises(InvalidRequest, match="'wings'"):
        VqganRequest.from_batch_fields({"prompt": "a fox", "wings": 2})


# ---------------------------------------------------------------------------------- planner


def test_estimates_follow_the_knobs_and_the_planner_picks_the_fastest_that_fits():
    p = memory_vqgan.profile_builtin()
    knobs = VqganKnobs(cutn_chunk=64, clip_autocast=False)
    base = memory_vqgan.estimate_vqgan(p, 512, 512, 64, knobs)
    chunked = memory_vqgan.estimate_vqgan(p, 512, 512, 64, VqganKnobs(cutn_chunk=8, clip_autocast=False))
    ckpt = memory_vqgan.estimate_vqgan(p, 512, 512, 64, VqganKnobs(cutn_chunk=64, clip_autocast=False,
                                                                    gradient_checkpointing=True))
    offload = memory_vqgan.estimate_vqgan(p, 512, 512, 64, VqganKnobs(cutn_chunk=64, clip_autocast=False,
                                                                       clip_text_offload=True))
    assert chunked.clip_bytes * 8 == pytest.approx(base.clip_bytes, rel=1e-6)
    assert ckpt.decoder_bytes < base.decoder_bytes and offload.weights_bytes < base.weights_bytes
    presets = load_presets()
    big = memory_vqgan.plan_vqgan(fake(24), p, 512, 512, 64, presets)
    small = memory_vqgan.plan_vqgan(fake(4), p, 512, 512, 64, presets)
    assert big.preset.name == "highvram" and [q.name for q in big.ladder][:2] == ["highvram", "medvram"]
    assert small.preset.rank > big.preset.rank and small.ladder[0] is small.preset
    assert memory_vqgan.plan_vqgan(probe("cpu"), p, 512, 512, 64, presets).preset.name == "cpu"


def test_plan_cli_covers_vqgan(capsys):
    assert main(["plan", "--engine", "vqgan", "--vram", "6GiB", "--width", "512", "--height", "512", "--cutn", "64",
                 "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["engine"] == "vqgan" and data["model"] == "vqgan_imagenet_f16_16384" and data["clip"] == "ViT-B/32"
    assert [e["name"] for e in data["presets"]] == ["highvram", "medvram", "budget", "lowvram", "novram"]
    assert data["preset"] in ("medvram", "budget", "lowvram")
    assert main(["plan", "--engine", "vqgan", "--width", "100"]) == 2


def test_web_ui_tab_streams_previews_and_reports_what_ran(session, tmp_path):
    import socket

    from gradio_client import Client

    from lowvram_gen.server import launch

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    app = launch(session, str(tmp_path), "tiny", port=port, block=False)
    try:
        client = Client(f"http://127.0.0.1:{port}/", verbose=False)
        job = client.submit(prompts="a red fox|blurry:-1", width=64, height=64, iterations=4, save_every=2, cutn=4,
                            seed=5, init_noise="gradient", video=True, api_name="/vqgan")
        image, info, summary, video = job.result(timeout=300)
        updates = job.outputs()
        with pytest.raises(Exception, match="weight"):
            client.predict(prompts="a fox:0", api_name="/vqgan")
    finally:
        app.close()
    assert info.startswith("a red fox|blurry:-1") and "Steps: 4" in info and "Seed: 5" in info
    assert "finished at cpu" in summary and Image.open(image).size == (64, 64)
    assert "Init noise: gradient" in info  # the tab's init noise reached the job
    assert str(video).endswith(".mp4")  # the progress video, playable in the tab
    assert any("iteration 2 of 4" in str(u[2]) for u in updates)  # the live preview at save-every


def test_free_unloads_the_sd_model_the_vqgan_pair_and_the_upscalers(tmp_path):
    """Free VRAM (System tab) and Session.free() drop every model the Session owns: the Stable Diffusion
    pipeline, the VQGAN/CLIP pair and the loaded upscalers, so the next job loads them again."""
    import weakref

    from lowvram_gen.request import GenerationRequest
    from lowvram_gen.session import Session
    from lowvram_gen.upscale import upscalers

    own = Session(device="cpu", outdir=str(tmp_path))
    own.generate(GenerationRequest(prompt="a fox", width=64, height=64, steps=1, seed=1, outdir=str(tmp_path)))
    pair = own.vqgan_models(VqganRequest(prompt="x"))
    upscalers._MODELS["probe"] = object()
    gone = [weakref.ref(own.model), weakref.ref(pair)]
    del pair
    own.free()
    import gc

    gc.collect()
    assert own.model is None and own.runner is None and own.vqgan is None
    assert [ref() for ref in gone] == [None, None]  # nothing else holds them either
    assert "probe" not in upscalers._MODELS


def _video_frames(path):
    import av

    with av.open(path) as container:
        return [f.to_ndarray(format="rgb24") for f in container.decode(video=0)]


def test_video_of_a_run_shorter_than_save_every_is_made_from_its_start_and_end(tmp_path, capsys):
    """Issue 18: `--iterations 5 --video` (save-every 50) gave `videos: []` and said nothing."""
    from lowvram_gen.engines.vqgan import video as progress_video

    code = main(["vqgan", "a fox", "--size", "64", "64", "--iterations", "5", "--cutn", "4", "--seed", "3",
                 "--outdir", str(tmp_path), "--video", "--json", "--cpu"])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    result = json.loads(captured.out)
    assert result["progress_images"] == []  # --save-every is still 50: no progress PNG
    [video] = result["videos"]
    assert video == str(Path(result["images"][0]).with_suffix(".mp4"))
    frames = _video_frames(video)
    hold = round(progress_video.HOLD_LAST_S * progress_video.FPS)
    assert len(frames) == 2 + hold  # the start, the final image, then the final image held
    assert not np.array_equal(frames[0], frames[1])  # five iterations changed the image
    assert not any("no progress video" in w for w in result["warnings"])


def test_when_no_video_can_be_made_the_json_warnings_say_why(tmp_path, capsys, monkeypatch):
    from lowvram_gen.engines.vqgan import job as job_mod

    monkeypatch.setattr(job_mod._Saver, "frame", lambda self, image: None)  # as if the start could not be drawn
    code = main(["vqgan", "a fox", "--size", "64", "64", "--iterations", "2", "--cutn", "4", "--outdir",
                 str(tmp_path), "--video", "--json", "--cpu"])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    result = json.loads(captured.out)
    assert result["videos"] == []
    name = Path(result["images"][0]).name
    said = [w for w in result["warnings"] if w.startswith(f"no progress video for {name}: there is only 1 frame")]
    assert said and f"warning: {said[0]}" in captured.err
