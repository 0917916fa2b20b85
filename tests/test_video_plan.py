"""The memory planner counts video (issue 33): the tiny Wan/LTX folders profile (3-D patch sizes, the VAEs' own
compression), a clip's tokens are what the transformer really sees, the estimate grows with the frames, Wan 2.2
A14B's two experts are one on the GPU and both in RAM with one swap, text encoders reloaded per job are offered,
a clip that fits no rung is refused naming frames or a size that would fit (never made shorter on its own), and the
published configs' real shapes fit the cards the issue names."""

from __future__ import annotations

from dataclasses import replace
from types import SimpleNamespace

import pytest

from lowvram_gen import families
from lowvram_gen.families.record import FolderFacts
from lowvram_gen.models.profile import profile_from_folder
from lowvram_gen.planning import estimate, host, video, video_fit
from lowvram_gen.planning.shapes import model_shapes, shape_lines
from lowvram_gen.request import GenerationRequest
from lowvram_gen.session import Session
from lowvram_gen.settings import MemorySettings

from tiny_video import save

GiB = 2**30


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("video_plan")
    return {k: save(k, root / k) for k in ("wan21", "wan21-i2v", "wan22-ti2v", "wan22-a14b", "ltx")}


@pytest.fixture(scope="module")
def session():
    return Session()


def _facts(folder):
    import json

    index = json.loads((folder / "model_index.json").read_text())
    record = families.by_pipeline(index["_class_name"])
    return record, record.video_facts(FolderFacts(name=folder.name, model_index=index,
                                                   transformer=json.loads((folder / "transformer" / "config.json")
                                                                          .read_text())))


def _clip(frames, width, height, **kw):
    return SimpleNamespace(frames=frames, width=width, height=height, init_image=kw.get("init_image"),
                           cfg_scale=kw.get("cfg_scale", 5.0), allow_upscale=kw.get("allow_upscale", False))


def _row(result):
    return next(e for e in result.estimates if e.name == result.preset.name)


# ------------------------------------------------------------------------------------------------ profiles


@pytest.mark.parametrize("kind, patch, spatial, temporal", [
    ("wan21", 2, 8, 4), ("wan21-i2v", 2, 8, 4), ("wan22-ti2v", 2, 16, 4), ("wan22-a14b", 2, 8, 4), ("ltx", 1, 4, 4)])
def test_tiny_folders_profile_with_their_patch_and_compression(folders, kind, patch, spatial, temporal):
    """Wan's (1, 2, 2) patch is read as 2 (the int() of a list once crashed here); each VAE's spatial and temporal
    compression is its config's (Wan 2.2's 16x from scale_factor_spatial, tiny LTX's 4x from its scaling stages)."""
    p = profile_from_folder(folders[kind])
    assert (p.transformer_patch, p.vae_scale_factor, p.vae_temporal) == (patch, spatial, temporal)
    assert p.vae_video == ("whole" if kind == "ltx" else "causal")
    assert ("image_encoder" in p.params) == (kind == "wan21-i2v")
    assert p.experts == (2 if kind == "wan22-a14b" else 1)


@pytest.mark.parametrize("kind", ["wan21", "wan22-ti2v", "ltx"])
def test_tokens_are_what_the_transformer_sees(folders, kind):
    """The planner's tokens for 9 frames at 32x32 equal the sequence the first transformer block gets in a real tiny
    pipeline call (a forward pre-hook records it)."""
    import torch
    from diffusers import DiffusionPipeline

    folder = folders[kind]
    pipe = DiffusionPipeline.from_pretrained(folder, dtype=torch.float32)
    blocks = getattr(pipe.transformer, "blocks", None) or pipe.transformer.transformer_blocks
    seen = []
    handle = blocks[0].register_forward_pre_hook(lambda m, args, kwargs: seen.append(
        (args[0] if args else kwargs["hidden_states"]).shape[1]), with_kwargs=True)
    try:
        pipe(prompt="a cat", num_frames=9, height=32, width=32, num_inference_steps=2, guidance_scale=1.0,
             output_type="latent", generator=torch.Generator().manual_seed(0))
    finally:
        handle.remove()
    _, facts = _facts(folder)
    _, job = video.planned(profile_from_folder(folder), facts, _clip(9, 32, 32))
    assert seen and set(seen) == {job.tokens}
    assert job.latent_frames == 3  # (9 - 1) / 4 + 1


# ------------------------------------------------------------------------------------------------ the estimate


def test_estimate_grows_with_frames(folders, session):
    """More frames: more tokens, more activations, a larger decode, a larger peak, a longer step."""
    rows = []
    for frames in (9, 33, 81):
        req = GenerationRequest(model=str(folders["wan21"]), prompt="a", width=256, height=256, frames=frames)
        result = session.plan(req, session.device(vram="8GiB", ram="32GiB"))
        row = next(e for e in result.estimates if e.name == "highvram")
        rows.append((result.video.tokens, row.breakdown["unet_bytes"], row.breakdown["vae_bytes"],
                     row.estimate_bytes, row.est_seconds_per_step))
    for a, b in zip(rows, rows[1:]):
        assert all(y > x for x, y in zip(a, b)), rows
    assert rows[0][0] == 3 * 16 * 16  # 9 frames -> 3 latent frames of (256 / 8 / 2)^2 tokens


def test_wan_cfg_is_two_forwards_not_a_doubled_batch(folders):
    """Wan's CFG: the activations of one clip, the compute (and the streamed weights) of two forwards; LTX doubles
    the batch."""
    profile = profile_from_folder(folders["wan21"])
    _, facts = _facts(folders["wan21"])
    clip, job = video.planned(profile, facts, _clip(33, 256, 256, cfg_scale=5.0))
    assert job.forwards == 2
    group = MemorySettings(dtype="bfloat16", offload="group")
    with_cfg = estimate.estimate(clip, 256, 256, 1, group, cfg=True)
    without = estimate.estimate(clip, 256, 256, 1, group, cfg=False)
    assert with_cfg.unet_bytes == without.unet_bytes
    assert with_cfg.streamed_bytes_per_step == 2 * without.streamed_bytes_per_step
    ltx = profile_from_folder(folders["ltx"])
    lclip, ljob = video.planned(ltx, _facts(folders["ltx"])[1], _clip(33, 256, 256, cfg_scale=3.0))
    assert ljob.forwards == 1
    assert estimate.estimate(lclip, 256, 256, 1, group, cfg=True).unet_bytes > \
        estimate.estimate(lclip, 256, 256, 1, group, cfg=False).unet_bytes


def test_tiled_decode_is_smaller_for_a_large_clip(real):
    """The plan's tiled rung: the real Wan 2.1 VAE's decode in 256 px tiles needs less than whole frames at 1280x720
    (and both hold the decoded clip, which grows with the frames)."""
    profile = real["wan21-t2v-1.3b"][0]
    record = families.by_name("wan21-t2v-1.3b")
    clip, _ = video.planned(profile, record.video, _clip(81, 1280, 720))
    whole = estimate.vae_activation_bytes(clip, 1280, 720, 1, 2)
    tiled = estimate.vae_activation_bytes(clip, 1280, 720, 1, 2, tiling=True)
    assert tiled < whole / 2
    longer, _ = video.planned(profile, record.video, _clip(161, 1280, 720))
    assert estimate.vae_activation_bytes(longer, 1280, 720, 1, 2, tiling=True) > tiled


def test_image_to_video_counts_the_image_encoder(folders):
    """Wan 2.1 I2V's CLIP vision model: in the VRAM of an unoffloaded job and moved in once under model offload."""
    profile = profile_from_folder(folders["wan21-i2v"])
    facts = _facts(folders["wan21-i2v"])[1]
    clip, job = video.planned(profile, facts, _clip(9, 64, 64, init_image="x.png"))
    assert job.image_encoder
    none = MemorySettings(dtype="bfloat16", offload="none")
    model = MemorySettings(dtype="bfloat16", offload="model")
    alone = replace(clip, params={k: v for k, v in clip.params.items() if k != "image_encoder"}, image_job=False)
    ie = clip.params["image_encoder"] * 2
    assert estimate.estimate(clip, 64, 64, 1, none).weights_bytes == estimate.estimate(alone, 64, 64, 1, none) \
        .weights_bytes + ie
    assert estimate.estimate(clip, 64, 64, 1, model).moved_bytes_per_job == \
        estimate.estimate(alone, 64, 64, 1, model).moved_bytes_per_job + ie


# ------------------------------------------------------------------------------------------------ A14B's experts


@pytest.mark.parametrize("offload", ["none", "model", "budget", "group"])
def test_a14b_one_expert_on_the_gpu_both_in_ram(folders, offload):
    """The VRAM estimate of the two-expert folder equals that of the same folder with one expert: never both on the
    device. The RAM holds both (the idle one beside the running one, quantized alike), and the switch moves the GPU
    part once (in and out) where an expert is placed whole or partly resident; nothing extra where both stream."""
    profile = profile_from_folder(folders["wan22-a14b"])
    clip, _ = video.planned(profile, _facts(folders["wan22-a14b"])[1], _clip(9, 64, 64))
    one = replace(clip, params={k: v for k, v in clip.params.items() if k != "transformer_2"})
    settings = MemorySettings(dtype="bfloat16", offload=offload, resident_bytes=1000 if offload == "budget" else 0)
    both_est, one_est = estimate.estimate(clip, 64, 64, 1, settings), estimate.estimate(one, 64, 64, 1, settings)
    assert both_est.total_bytes == one_est.total_bytes
    assert both_est.weights_bytes == one_est.weights_bytes
    expected_swap = {"none": 2 * clip.params["transformer"] * 2, "model": 2 * clip.params["transformer"] * 2,
                     "group": 0}.get(offload)
    if expected_swap is not None:
        assert both_est.expert_swap_bytes == expected_swap
    else:
        assert both_est.expert_swap_bytes > 0  # the resident part (and its fixed part), in and out
    assert both_est.moved_bytes_per_job == one_est.moved_bytes_per_job + both_est.expert_swap_bytes
    for q in ("none", "int8"):
        s = replace(settings, quantize=q)
        kept = host.kept_bytes(clip, s)
        assert kept["transformer_2"] == kept["transformer"]  # int8 quantizes both experts
        ram_two = host.host_estimate(clip, s, "cuda", 64, 64, 1, resident_bytes=settings.resident_bytes)
        ram_one = host.host_estimate(one, s, "cuda", 64, 64, 1, resident_bytes=settings.resident_bytes)
        assert ram_two.run_bytes >= ram_one.run_bytes + kept["transformer_2"]


def test_a14b_plan_reports_the_swap(folders, session):
    req = GenerationRequest(model=str(folders["wan22-a14b"]), prompt="a", width=64, height=64, frames=9,
                            preset="highvram")
    result = session.plan(req, session.device(vram="8GiB", ram="32GiB"))
    assert result.video.experts == 2
    assert result.video.swap_bytes == _row(result).breakdown["expert_swap_bytes"] > 0
    assert result.video.swap_seconds == pytest.approx(result.video.swap_bytes / result.bus.bytes_per_s)
    assert "swapped once" in result.video.line()


# ------------------------------------------------------------------------------------------------ real shapes


@pytest.fixture(scope="module")
def real(session):
    return {m: session.model_profile(m) for m in ("wan21-t2v-14b", "wan22-ti2v-5b", "wan21-t2v-1.3b",
                                                   "wan22-t2v-a14b")}


def _plan_real(session, real, model, frames, width, height, vram, ram, **kw):
    req = GenerationRequest(model=model, prompt="a", width=width, height=height, frames=frames, **kw)
    return session.plan(req, session.device(vram=vram, ram=ram), profile=real[model])


@pytest.mark.parametrize("model, frames, width, height, vram, ram, tokens", [
    ("wan21-t2v-14b", 81, 832, 480, "8GiB", "32GiB", 32760),
    ("wan22-ti2v-5b", 121, 1280, 704, "8GiB", "32GiB", 27280),
    ("wan21-t2v-1.3b", 81, 832, 480, "4GiB", "32GiB", 32760),
])
def test_real_shapes_fit_the_cards_the_issue_names(session, real, model, frames, width, height, vram, ram, tokens):
    """The published configs: the pick runs the clip at its full size and frames on that card and RAM, lossless or
    int8 and from RAM (planning/nearest.status's 'fits')."""
    from lowvram_gen.planning.nearest import status

    result = _plan_real(session, real, model, frames, width, height, vram, ram)
    assert not result.refusal, result.refusal
    assert status(result, width, height) == "fits", (result.preset.name, result.reason)
    assert result.video.tokens == tokens
    row = _row(result)
    assert row.fits and row.fits_host and not row.capped


def test_te_reload_is_offered_for_a_video_model(session, real):
    """Wan 2.1 14B's umT5-XXL (5.7 B) does not fit 32 GiB beside the transformer: the text encoders read from disk
    for each job (+te-reload) are candidates with their own encode phase, and one fits the RAM only so."""
    result = _plan_real(session, real, "wan21-t2v-14b", 81, 832, 480, "8GiB", "32GiB")
    by_name = {e.name: e for e in result.estimates}
    reloads = [n for n in by_name if "+te-reload" in n]
    assert reloads
    pairs = [(by_name[n], by_name[n.replace("+te-reload", "")]) for n in reloads
             if n.replace("+te-reload", "") in by_name]
    assert all(r.host["encode_bytes"] > 0 for r, _ in pairs)  # the encoders' own phase is counted
    # at least one preset fits the RAM only with its encoders read per job
    assert any(r.fits_host and not k.fits_host for r, k in pairs)
    assert "+te-reload" in result.preset.name


def test_refusal_names_frames_and_a_size_that_fit(session, real):
    """Wan 2.1 14B at 832x480, 81 frames on a 4 GiB card: refused (never shortened), and the frames and the size the
    sentence names do fit when planned."""
    result = _plan_real(session, real, "wan21-t2v-14b", 81, 832, 480, "4GiB", "32GiB")
    assert "would fit:" in result.refusal and "81 frames" in result.refusal
    import re

    frames = re.search(r"would fit: (\d+) frames at 832x480", result.refusal)
    size = re.search(r"81 frames at (\d+)x(\d+)", result.refusal)
    assert frames and size, result.refusal
    n = int(frames.group(1))
    assert n < 81 and (n - 1) % 4 == 0
    assert video_fit.runs(_plan_real(session, real, "wan21-t2v-14b", n, 832, 480, "4GiB", "32GiB"), False)
    assert not video_fit.runs(_plan_real(session, real, "wan21-t2v-14b", n + 4, 832, 480, "4GiB", "32GiB"), False)
    w, h = int(size.group(1)), int(size.group(2))
    assert w % 16 == 0 and h % 16 == 0 and w < 832
    assert video_fit.runs(_plan_real(session, real, "wan21-t2v-14b", 81, w, h, "4GiB", "32GiB"), False)
    # no row was made smaller on its own
    assert all((e.width, e.height) == (832, 480) for e in result.estimates)


def test_a_lower_resolution_only_when_upscaling_is_allowed(session, real):
    """With allow_upscale the planner may pick a capped size (upscaled after) where the full size fits no rung."""
    plain = _plan_real(session, real, "wan21-t2v-14b", 81, 832, 480, "4GiB", "32GiB")
    allowed = _plan_real(session, real, "wan21-t2v-14b", 81, 832, 480, "4GiB", "32GiB", allow_upscale=True)
    assert plain.refusal and all(not e.capped for e in plain.estimates)
    assert any(e.capped for e in allowed.estimates)
    assert allowed.video.upscale_allowed


def test_a14b_real_shape_one_expert_on_the_card(session, real):
    """Wan 2.2 A14B at 832x480: the pick's VRAM is below one expert at its storage (never two), its RAM holds both."""
    result = _plan_real(session, real, "wan22-t2v-a14b", 81, 832, 480, "8GiB", "64GiB")
    row = _row(result)
    expert = row.breakdown["denoiser_bytes"]
    assert row.estimate_bytes < 2 * expert
    assert row.host["weights_bytes"] >= 2 * expert - row.breakdown["resident_bytes"]


def test_plan_shows_the_frames_and_tokens_it_counted(session, real):
    result = _plan_real(session, real, "wan21-t2v-14b", 81, 832, 480, "8GiB", "32GiB")
    assert result.as_dict()["video"]["tokens"] == 32760
    shapes = model_shapes(real["wan21-t2v-14b"][0], 832, 480, video=result.video)
    assert shapes["video"]["latent_frames"] == 21 and shapes["tokens"] == 32760
    assert "video: 81 frames -> 21 latent frames, 32760 tokens per forward" in shape_lines(shapes)[1]


def test_a14b_pinned_copies_are_counted_for_both_experts(folders):
    """Pinned RAM is bounded by the plan: on CUDA with pinned streaming, each expert's streamed groups get a pinned
    copy (both are hooked), and the host peak counts them; unpinned, none."""
    profile = profile_from_folder(folders["wan22-a14b"])
    clip, _ = video.planned(profile, _facts(folders["wan22-a14b"])[1], _clip(9, 64, 64))
    s = MemorySettings(dtype="bfloat16", offload="group", pin_memory=True)
    kept = host.kept_bytes(clip, s)
    pinned = host.host_estimate(clip, s, "cuda", 64, 64, 1, pinned=True)
    unpinned = host.host_estimate(clip, replace(s, pin_memory=False), "cuda", 64, 64, 1, pinned=False)
    assert pinned.pinned_bytes == kept["transformer"] + kept["transformer_2"]
    assert unpinned.pinned_bytes == 0 and pinned.run_bytes == unpinned.run_bytes + pinned.pinned_bytes


def test_nearest_says_the_card_not_the_ram_for_a_clip_too_big_for_the_card(session, real):
    """planning/nearest.status of a clip refused for its VRAM (the RAM holds a candidate): not 'ram'."""
    from lowvram_gen.planning.nearest import status

    result = _plan_real(session, real, "wan21-t2v-14b", 81, 832, 480, "4GiB", "32GiB")
    assert result.refusal and status(result, 832, 480) == "capped"
    starved = _plan_real(session, real, "wan21-t2v-14b", 81, 832, 480, "8GiB", "8GiB")
    assert starved.refusal and status(starved, 832, 480) == "ram"
    assert "system RAM" in starved.refusal and ("would fit:" in starved.refusal or "no shorter" in starved.refusal)


def test_a_clip_that_ran_out_of_memory_starts_below_that_preset(folders, session, monkeypatch):
    """generate_video remembers a failed preset with the clip's frames as its size; the plan of a clip as long (or
    longer) at the same size skips that preset, a shorter one does not."""
    from lowvram_gen import failures

    rows = [{"device": "simulated 8GiB", "model": str(folders["wan21"]), "preset": "highvram", "work": 64 * 64 * 33}]
    monkeypatch.setattr(failures, "load", lambda: rows)
    device = session.device(vram="8GiB", ram="32GiB")
    rows[0]["device"] = device.name

    def plan(frames):
        req = GenerationRequest(model=str(folders["wan21"]), prompt="a", width=64, height=64, frames=frames)
        return next(e for e in session.plan(req, device).estimates if e.name == "highvram")

    assert plan(33).skipped_reason and plan(81).skipped_reason
    assert not plan(9).skipped_reason
