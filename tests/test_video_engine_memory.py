"""The video engine on the memory layer (issue 33): int8, a VRAM budget, the out-of-memory ladder in the denoise and in
the decode, and Wan 2.2 A14B's two experts never both on the device.

On this CPU the GPU presets run as they do in tests/test_budget.py: float16 becomes float32, the offload hooks run
with the CPU as both devices, and an out-of-memory is simulated by a hook raising torch.OutOfMemoryError (each test
says where). The experts' residency record (engines/video/experts.py) says where the engine placed each expert; the
moves it made are recorded through the Session's ops_factory.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from tiny_video import plain_frames, plain_pipeline, save, saved_frames

from lowvram_gen.engines.sd import apply as apply_mod
from lowvram_gen.errors import OutOfMemoryEverywhere
from lowvram_gen.request import GenerationRequest
from lowvram_gen.session import Session

TOLERANCE = 2
SEED = 7
OOM = "CUDA out of memory. Tried to allocate 2.00 GiB (simulated)"


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("tiny-video-memory")
    made = {}

    def folder(kind: str) -> str:
        if kind not in made:
            made[kind] = str(save(kind, root / kind))
        return made[kind]

    return folder


def video_request(folder: str, outdir, **kw) -> GenerationRequest:
    base = dict(prompt="a heron", model=folder, frames=9, width=64, height=64, steps=2, seed=SEED, cfg_scale=4.0,
                outdir=str(outdir), save_frames=True)
    return GenerationRequest(**{**base, **kw})


def plain(folder: str, **kw):
    call = dict(prompt="a heron", negative_prompt="", num_frames=9, width=64, height=64, num_inference_steps=2,
                guidance_scale=4.0, **kw)
    return plain_frames(plain_pipeline(folder), SEED, **call)


def budget_preset(tmp_path, transformer, share: float = 0.5):
    """A budget preset file keeping `share` of the transformer's block bytes resident (float32: this CPU's dtype)."""
    from lowvram_gen.models.blocks import blocks_of

    resident = int(sum(b for _, b in blocks_of(transformer)) * share)
    path = tmp_path / "budget-half.toml"
    path.write_text(f'''description = "budget, half the blocks resident"
rank = 2
device = "gpu"
max_pixels = 1048576
max_batch = 1
upscaler = "lanczos"

[memory]
dtype = "float32"
offload = "budget"
vae_tiling = true
resident_bytes = {resident}
''')
    return str(path)


def tiny_transformer(folder):
    from diffusers import WanTransformer3DModel

    return WanTransformer3DModel.from_pretrained(folder, subfolder="transformer")


# -- int8 and a budget ----------------------------------------------------------------------------------------------

def test_int8_runs_with_the_transformer_in_8_bits(folders, tmp_path):
    folder = folders("wan21-wide")
    session = Session()
    full = saved_frames(session.generate(video_request(folder, tmp_path)).frames).astype(int)
    result = session.generate(video_request(folder, tmp_path, quantize="int8"))
    transformer = session.model.pipe.transformer
    assert any(t.dtype in (torch.int8, torch.uint8) for t in transformer.state_dict().values())
    quantized = saved_frames(result.frames).astype(int)
    assert quantized.shape == full.shape and quantized.std() > 1
    assert np.abs(quantized - full).mean() < 40  # close to float32, not the same


def test_int8_quantizes_both_experts(folders, tmp_path):
    session = Session()
    from lowvram_gen.models.quantize import targets

    session.generate(video_request(folders("wan22-a14b-wide"), tmp_path, quantize="int8"))
    assert {"transformer", "transformer_2"} <= set(targets(session.model.pipe))  # quantize's own targets, both
    for name in ("transformer", "transformer_2"):
        module = getattr(session.model.pipe, name)
        assert any(t.dtype in (torch.int8, torch.uint8) for t in module.state_dict().values()), name


def test_a_vram_budget_streams_half_the_blocks_and_gives_the_frames_of_plain_diffusers(folders, tmp_path):
    folder = folders("wan21")
    session = Session(preset=budget_preset(tmp_path, tiny_transformer(folder)))
    result = session.generate(video_request(folder, tmp_path))
    assert session.runner.residency is not None and session.runner.residency.streamed  # a real split ran
    assert result.preset == "budget-half"
    assert np.abs(saved_frames(result.frames).astype(int) - plain(folder).astype(int)).max() <= TOLERANCE


# -- the ladder -----------------------------------------------------------------------------------------------------

def test_out_of_memory_in_the_denoise_steps_down_without_reloading(folders, tmp_path):
    """Simulated: the transformer runs out of memory in every step at highvram (no offload); the job finishes at
    medvram on the same weights (the same parameter objects), with plain diffusers' frames."""
    folder = folders("wan21")
    session = Session(preset="highvram")
    session.generate(video_request(folder, tmp_path, steps=1))
    transformer = session.model.pipe.transformer
    params = [id(p) for p in transformer.parameters()]

    def oom(*_):
        if session.runner.applied.offload == "none":
            raise torch.OutOfMemoryError(OOM)

    handle = transformer.register_forward_pre_hook(oom)
    try:
        result = session.generate(video_request(folder, tmp_path))
    finally:
        handle.remove()
    assert result.preset == "medvram"
    assert [(a["preset"], a["stage"], a["outcome"]) for a in result.attempts] == [
        ("highvram", "denoise", "oom"), ("medvram", "denoise", "ok"), ("medvram", "decode", "ok")]
    assert session.model.pipe.transformer is transformer and [id(p) for p in transformer.parameters()] == params
    assert np.abs(saved_frames(result.frames).astype(int) - plain(folder).astype(int)).max() <= TOLERANCE


def test_out_of_memory_in_the_decode_retries_it_tiled_with_the_same_latents(folders, tmp_path):
    """Simulated: the VAE decode runs out of memory untiled. The decode alone runs again, tiled, on the same latents:
    the transformer ran once per step (two forwards a step with CFG), and the frames are plain diffusers'."""
    folder = folders("wan21")
    session = Session(device="cpu")
    session.generate(video_request(folder, tmp_path, steps=1))
    pipe = session.model.pipe
    forwards, decoded = [], []
    handle = pipe.transformer.register_forward_pre_hook(lambda *_: forwards.append(1))
    decode = pipe.vae.decode

    def failing_decode(z, *args, **kwargs):
        decoded.append((z.data_ptr(), pipe.vae.use_tiling))
        if not pipe.vae.use_tiling:
            raise torch.OutOfMemoryError(OOM)
        return decode(z, *args, **kwargs)

    pipe.vae.decode = failing_decode
    try:
        result = session.generate(video_request(folder, tmp_path))
    finally:
        handle.remove()
        del pipe.vae.decode
    assert len(forwards) == 2 * 2  # 2 steps, cond and uncond: the denoise ran once
    assert [tiled for _, tiled in decoded] == [False, True]
    assert [(a["stage"], a["outcome"]) for a in result.attempts] == [
        ("denoise", "ok"), ("decode", "oom"), ("decode", "ok")]
    assert np.abs(saved_frames(result.frames).astype(int) - plain(folder).astype(int)).max() <= TOLERANCE


@pytest.fixture()
def oom_at_128(monkeypatch):
    """Simulated: any Wan transformer's forward on a 128-pixel-wide clip (16 latents) runs out of memory, at every
    preset (on the class: the int8 rung reads the transformer again from disk, quantized as it loads)."""
    from diffusers import WanTransformer3DModel

    forward = WanTransformer3DModel.forward

    def oom(self, hidden_states, *args, **kwargs):
        if hidden_states.shape[-1] == 128 // 8:
            raise torch.OutOfMemoryError(OOM)
        return forward(self, hidden_states, *args, **kwargs)

    monkeypatch.setattr(WanTransformer3DModel, "forward", oom)


def test_a_clip_is_never_made_smaller_without_leave(folders, tmp_path, oom_at_128):
    """Out of memory at 128x128 at every preset: without allow_upscale the job stops saying what was tried, and no
    clip is saved (no smaller one in silence)."""
    out = tmp_path / "refused"
    with pytest.raises(OutOfMemoryEverywhere, match="allow-upscale") as caught:
        Session(preset="highvram").generate(video_request(folders("wan21"), out, width=128, height=128))
    assert all(a.width == 128 for a in caught.value.attempts)
    assert not list(out.glob("*.mp4")) and not list(out.glob("*.webp"))


def test_allow_upscale_makes_a_smaller_clip_and_says_so(folders, tmp_path, oom_at_128):
    result = Session(preset="highvram").generate(video_request(folders("wan21"), tmp_path, width=128, height=128,
                                                               allow_upscale=True))
    assert result.upscaled and (result.width, result.height) == (128, 128)
    assert (result.generated_width, result.generated_height) == (80, 80)  # half the pixels, in multiples of 16
    assert any("upscaled" in w and "allow-upscale" in w for w in result.warnings)
    assert saved_frames(result.frames).shape == (9, 128, 128, 3)


# -- Wan 2.2 A14B's two experts -------------------------------------------------------------------------------------

class Moves(apply_mod.PipelineOps):
    """The experts' moves, as PipelineOps makes them."""

    log: list = []

    def expert_to(self, name, device):
        Moves.log.append(("expert", name, device))
        super().expert_to(name, device)

    def resident_to(self, device, streamed):
        Moves.log.append(("resident", apply_mod.running_expert(self.pipe), device))
        super().resident_to(device, streamed)


@pytest.fixture()
def moves():
    Moves.log = []
    return Moves.log


def test_the_experts_swap_once_under_no_offload(folders, tmp_path, moves):
    folder = folders("wan22-a14b")
    session = Session(preset="highvram", ops_factory=Moves)
    result = session.generate(video_request(folder, tmp_path))
    experts = session.runner.experts
    assert experts.swaps == [("transformer", "transformer_2")]  # once, at the boundary
    assert [name for name, _ in experts.record] == ["transformer"] * 2 + ["transformer_2"] * 2  # 2 steps, CFG
    assert all(on == (name,) for name, on in experts.record)  # only the running one on the device
    assert [m for m in moves if m[0] == "expert"] == [("expert", "transformer", "cpu"),
                                                       ("expert", "transformer_2", "cpu")]  # the first off, then on
    assert np.abs(saved_frames(result.frames).astype(int)
                  - plain(folder, guidance_scale_2=3.0).astype(int)).max() <= TOLERANCE
    # the next job starts with the high-noise expert again: the low-noise one goes off first
    moves.clear()
    session.generate(video_request(folder, tmp_path))
    assert [m[1:] for m in moves if m[0] == "expert"][:2] == [("transformer_2", "cpu"), ("transformer", "cpu")]
    assert session.runner.experts.swaps == [("transformer", "transformer_2")]


def test_the_experts_are_never_both_on_the_device_under_a_budget(folders, tmp_path, moves):
    """Half the blocks resident: the running expert's resident part is on the device while it runs, the other's is
    not; at the switch the first's goes off before the second's comes on."""
    folder = folders("wan22-a14b")
    session = Session(preset=budget_preset(tmp_path, tiny_transformer(folder)), ops_factory=Moves)
    result = session.generate(video_request(folder, tmp_path))
    experts = session.runner.experts
    assert session.runner.residency.streamed
    assert experts.swaps == [("transformer", "transformer_2")]
    assert experts.record and all(on == (name,) for name, on in experts.record)
    # (the CPU is the device: the order of the moves is what shows) applied with the resident part on the host; the
    # first expert's placed at its first forward; off at the switch, then the second's on; off before the decode
    assert [m[1] for m in moves if m[0] == "resident"] == [
        "transformer", "transformer", "transformer", "transformer_2", "transformer_2"]
    assert np.abs(saved_frames(result.frames).astype(int)
                  - plain(folder, guidance_scale_2=3.0).astype(int)).max() <= TOLERANCE


# -- text encoders read per job (+te-reload) ------------------------------------------------------------------------

@pytest.mark.parametrize("kind, extra", [("wan21", {}), ("ltx", {"frame_rate": 24}),
                                         ("wan22-a14b", {"guidance_scale_2": 3.0})])
def test_text_encoders_reloaded_per_job_give_the_frames_of_plain_diffusers(kind, extra, folders, tmp_path):
    """text_encoders = "reloaded": the prompts encoded apart from the call (Wan's embeddings; LTX's with their
    attention masks), the encoder gone while the transformer runs; the frames are plain diffusers'."""
    folder = folders(kind)
    preset = tmp_path / "te-reload.toml"
    preset.write_text('description = "te reload"\nrank = 1\ndevice = "gpu"\nmax_pixels = 1048576\nmax_batch = 1\n'
                      'upscaler = "lanczos"\n\n[memory]\ndtype = "float32"\noffload = "none"\n'
                      'text_encoders = "reloaded"\n')
    session = Session(preset=str(preset))
    held = []

    def watch(*_):
        held.append(session.model.pipe.text_encoder is not None)

    session.generate(video_request(folder, tmp_path))  # loaded without its encoder
    handle = session.model.pipe.transformer.register_forward_pre_hook(watch)
    try:
        result = session.generate(video_request(folder, tmp_path))
    finally:
        handle.remove()
    assert held and not any(held)  # no text encoder beside the transformer
    assert np.abs(saved_frames(result.frames).astype(int) - plain(folder, **extra).astype(int)).max() <= TOLERANCE


def test_out_of_memory_in_the_low_noise_expert_steps_down_and_starts_the_clip_again(folders, tmp_path, moves):
    """Simulated: the low-noise expert runs out of memory at highvram, after the switch. The clip starts again at the
    next rung from the high-noise expert, on the same weights, with plain diffusers' frames."""
    folder = folders("wan22-a14b")
    session = Session(preset="highvram", ops_factory=Moves)
    session.generate(video_request(folder, tmp_path, steps=1))
    pipe = session.model.pipe
    experts = (pipe.transformer, pipe.transformer_2)

    def oom(*_):
        if session.runner.applied.offload == "none":
            raise torch.OutOfMemoryError(OOM)

    handle = pipe.transformer_2.register_forward_pre_hook(oom)
    try:
        result = session.generate(video_request(folder, tmp_path))
    finally:
        handle.remove()
    below = result.preset  # the plan's next rung for two experts
    assert below != "highvram" and [(a["preset"], a["stage"], a["outcome"]) for a in result.attempts] == [
        ("highvram", "denoise", "oom"), (below, "denoise", "ok"), (below, "decode", "ok")]
    assert (pipe.transformer, pipe.transformer_2) == experts
    record = session.runner.experts.record
    assert [name for name, _ in record] == ["transformer"] * 2 + ["transformer"] * 2 + ["transformer_2"] * 2
    assert np.abs(saved_frames(result.frames).astype(int)
                  - plain(folder, guidance_scale_2=3.0).astype(int)).max() <= TOLERANCE


# -- a 16-bit VAE's overflow ----------------------------------------------------------------------------------------

def test_a_half_precision_decode_that_makes_nan_is_decoded_again_in_float32(folders, tmp_path, monkeypatch):
    """Simulated: the VAE in bfloat16 makes NaN (a 16-bit overflow, as a Wan VAE can). The same latents are decoded
    again in float32, the attempt says so, and the frames are plain diffusers' but for the weights' rounding."""
    from diffusers import AutoencoderKLWan

    folder = folders("wan21")
    decode = AutoencoderKLWan.decode
    seen = []

    def overflowing(self, z, *args, **kwargs):
        seen.append(z.dtype)
        out = decode(self, z, *args, **kwargs)
        if z.dtype != torch.float32:
            out[0].fill_(float("nan"))
        return out

    monkeypatch.setattr(AutoencoderKLWan, "decode", overflowing)
    session = Session(device="cpu")
    session.generate(video_request(folder, tmp_path, steps=1))
    session.model.pipe.vae.to(torch.bfloat16)
    seen.clear()
    result = session.generate(video_request(folder, tmp_path))
    assert [(a["stage"], a["outcome"]) for a in result.attempts] == [("denoise", "ok"), ("decode", "nan"),
                                                                      ("decode", "ok")]
    assert seen == [torch.bfloat16, torch.float32]  # the same latents, decoded again in float32
    assert session.model.pipe.vae.dtype == torch.bfloat16  # back to its dtype after
    # plain diffusers' frames but for the VAE weights' bfloat16 rounding
    assert np.abs(saved_frames(result.frames).astype(int) - plain(folder).astype(int)).mean() < 4


def test_nan_from_a_float32_decode_is_said_in_one_sentence(folders, tmp_path, monkeypatch):
    from diffusers import AutoencoderKLWan

    from lowvram_gen.errors import BadOutput

    decode = AutoencoderKLWan.decode

    def broken(self, z, *args, **kwargs):
        out = decode(self, z, *args, **kwargs)
        out[0].fill_(float("nan"))
        return out

    monkeypatch.setattr(AutoencoderKLWan, "decode", broken)
    with pytest.raises(BadOutput, match="NaN/Inf even when decoded in float32"):
        Session(device="cpu").generate(video_request(folders("wan21"), tmp_path))
