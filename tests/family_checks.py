"""Test utility: the checks each issue-30 family's tiny folder goes through, shared by tests/test_family_flux2_dev.py,
test_family_hidream.py, test_family_cogview4.py and test_family_bria.py: the folder saved, plain diffusers' image, the
test job from the CLI, a refusal in one sentence, int8 on a wide folder, the VRAM budget, +te-reload picked and equal,
an inpaint pipeline's mask options (`inpaint_files`, `mask_options_act`: the Flux.2 Klein, Kontext and Qwen-Image-Edit
inpaint tests), and a REST API body's images (`b64`, `stored_images`) and inpaint request (`api_inpaint`). (The simulated out-of-memory is tests/ladder_checks.py.)"""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Callable

import numpy as np
from PIL import Image
from tiny_transformers import cli, pixels

from lowvram_gen.request import GenerationRequest
from lowvram_gen.session import Session

MAX_DIFF = 2  # of 255: "equal to plain diffusers"


def job(folder, tmp_path, **kw) -> GenerationRequest:
    """The families' test job (a castle, 64x64, 2 steps, seed 7) on `folder`, with `kw` on top."""
    base = dict(prompt="a castle", model=folder, width=64, height=64, steps=2, seed=7, outdir=str(tmp_path))
    return GenerationRequest(**{**base, **kw})


def saved(tmp_path_factory, name: str, pipe, class_name: str) -> str:
    """`pipe` saved as a diffusers folder in a fresh temporary directory, checked to be of `class_name`."""
    path = tmp_path_factory.mktemp(name)
    pipe.save_pretrained(path, safe_serialization=True)
    assert json.loads((path / "model_index.json").read_text())["_class_name"] == class_name
    return str(path)


def plain(folder: str, **kw) -> np.ndarray:
    """One image of plain diffusers' pipeline from the folder (its own class), as int RGB; `seed` seeds it."""
    import diffusers
    import torch

    pipe = diffusers.DiffusionPipeline.from_pretrained(folder)
    seed = kw.pop("seed")
    return np.asarray(pipe(**kw, generator=torch.Generator().manual_seed(seed)).images[0].convert("RGB"), dtype=int)


def cli_image(capsys, folder, tmp_path, *args) -> np.ndarray:
    """The test job from `lowvram-gen generate ... --json` with `args` on top: it exits 0, with no warning, at the
    first attempt's preset or a later one that finished; its image as int RGB."""
    code, out, err = cli(capsys, "generate", "a castle", "--model", folder, "--width", "64", "--height", "64",
                         "--steps", "2", "--seed", "7", "--preset", "cpu", "--outdir", str(tmp_path), "--json", *args)
    assert code == 0, err
    result = json.loads(out)
    assert result["warnings"] == [] and result["attempts"][-1]["outcome"] == "ok"
    return pixels(result["images"][0])


def refused(capsys, folder, tmp_path, args: list[str], said: str, side: int = 64) -> None:
    """The command `args` ({init} and {mask}: a plain image and a white mask) ends with exit code 2 and the one line
    `error: <said>`, no traceback."""
    init, mask = tmp_path / "init.png", tmp_path / "mask.png"
    Image.new("RGB", (side, side), (90, 120, 150)).save(init)
    Image.new("L", (side, side), 255).save(mask)
    args = [a.format(init=init, mask=mask) for a in args]
    code, _, err = cli(capsys, *args, "--model", folder, "--width", str(side), "--height", str(side), "--steps", "2",
                       "--preset", "cpu", "--outdir", str(tmp_path))
    assert code == 2 and "Traceback" not in err
    assert err.strip().splitlines() == ["error: " + said]


def inpaint_files(tmp_path, width: int = 64, height: int = 64, box: tuple[int, int, int, int] = (16, 16, 48, 48)):
    """(init image, white mask, box mask) files of an inpaint test: a seeded random init image of width x height, a
    mask that repaints all of it, and one that repaints `box` (x0, y0, x1, y1) only."""
    init, white, boxed = tmp_path / "init.png", tmp_path / "white.png", tmp_path / "box.png"
    Image.fromarray(np.random.default_rng(0).integers(0, 255, (height, width, 3), dtype=np.uint8)).save(init)
    Image.new("L", (width, height), 255).save(white)
    inside = np.zeros((height, width), np.uint8)
    inside[box[1]:box[3], box[0]:box[2]] = 255
    Image.fromarray(inside).save(boxed)
    return init, white, boxed


def inpainted(capsys, mask, common: list[str], *extra: str) -> np.ndarray:
    """The image of `lowvram-gen inpaint "a castle" --mask MASK` with `common` and `extra` (it exits 0), as int RGB."""
    code, out, err = cli(capsys, "inpaint", "a castle", "--mask", str(mask), *common, *extra)
    assert code == 0, (extra, err)
    return pixels(json.loads(out)["images"][0])


def mask_options_act(capsys, init, boxed, box: tuple[int, int, int, int], common: list[str]) -> None:
    """The box mask with our mask options (none, latent noise, only masked): each repaints inside the box (4 px in
    from its edge) and keeps the init image in its first 8 rows (above the box), as A1111 does."""
    x0, y0, x1, y1 = box
    for extra in ([], ["--masked-content", "latent-noise"], ["--inpaint-area", "masked"]):
        painted, original = inpainted(capsys, boxed, common, *extra), pixels(init)
        inner = (slice(y0 + 4, y1 - 4), slice(x0 + 4, x1 - 4))
        assert np.abs(painted[inner] - original[inner]).mean() > 10, extra  # repainted inside
        assert np.abs(painted[:8] - original[:8]).max() <= MAX_DIFF, extra  # the original outside, as A1111


def b64(path) -> str:
    """An image file as the REST API's bodies carry it (base64)."""
    import base64

    return base64.b64encode(open(path, "rb").read()).decode()


def stored_images(tmp_path) -> Callable:
    """`a1111.api_body.map_body`'s `init_image` reader for a test: each base64 image written to a file of its own."""
    import base64

    def stored(value, field=None) -> str:
        path = tmp_path / f"in-{len(list(tmp_path.glob('in-*')))}.png"
        path.write_bytes(base64.b64decode(value))
        return str(path)

    return stored


def api_inpaint(tmp_path, folder: str, init, mask, steps: int, seed: int) -> GenerationRequest:
    """The request of A1111's REST API img2img body with a mask (the inpaint tests' "a castle", 64x64, CFG 4, denoise
    0.5, no blur, the whole picture, original content) on `folder`: an inpaint, its images stored as files."""
    from lowvram_gen.a1111.api_body import map_body

    body = dict(prompt="a castle", seed=seed, steps=steps, width=64, height=64, cfg_scale=4, init_images=[b64(init)],
                mask=b64(mask), mask_blur=0, denoising_strength=0.5, inpaint_full_res=False, inpainting_fill=1,
                sampler_name="default")
    mapped = map_body(body, "img2img", folder, 1, str(tmp_path / "out"), lambda _: None,
                      init_image=stored_images(tmp_path))
    assert mapped.request.mask and mapped.request.init_image and not mapped.request.reference_images
    return mapped.request


def int8_quantizes_the_transformer(make_request: Callable[..., GenerationRequest]) -> None:
    """int8 (on a folder wide enough for sdnq) stores the transformer in 8 bits and stays close to float32."""
    import torch

    session = Session()
    full = pixels(session.generate(make_request(preset="cpu")).images[0])
    result = session.generate(make_request(preset="cpu", quantize="int8"))
    assert [a["outcome"] for a in result.attempts] == ["ok"]
    assert any(t.dtype in (torch.int8, torch.uint8) for t in session.model.pipe.transformer.state_dict().values())
    quantized = pixels(result.images[0])
    assert quantized.shape == full.shape and quantized.std() > 1
    assert np.abs(quantized - full).mean() < 40  # close to float32, not the same


def budget_equals_no_offload(folder: str, request: GenerationRequest) -> None:
    """The budget split (offload = "budget") gives the pixels of highvram (no offload)."""
    from lowvram_gen.engines.sd.stepdown import Runner
    from lowvram_gen.hardware.device import probe
    from lowvram_gen.models.loading import load
    from lowvram_gen.models.resolve import resolve
    from lowvram_gen.presets import find_preset

    runner = Runner(load(resolve(folder), "float32"), probe("cpu"))
    images = {}
    for name in ("highvram", "budget"):
        preset = find_preset(name)
        preset = replace(preset, memory=replace(preset.memory, dtype="float32"))
        done = []
        runner.run(request, [3], [preset], done.append)
        images[name] = np.asarray(done[0].images[0].convert("RGB"), dtype=int)
    assert runner.residency is not None  # the budget split is what ran
    assert np.abs(images["budget"] - images["highvram"]).max() <= 1


def te_reload_equal(make_request: Callable[..., GenerationRequest], tmp_path,
                    encoders: tuple[str, ...] = ("text_encoder",)) -> None:
    """+te-reload (text_encoders = 'reloaded' in the picked preset): a batch of two with the same pixels as with the
    encoders kept, and none of `encoders` on the pipeline while the denoiser runs."""
    from test_text_encoder_reload import _presets_with

    images, seen = {}, []
    for text_encoders in ("kept", "reloaded"):
        session = Session(device="cpu", preset="cpu", presets_dir=str(_presets_with(tmp_path, text_encoders)),
                          outdir=str(tmp_path / text_encoders))

        def watch(*_):  # in a step callback: the encoders the pipeline holds while the denoiser runs
            held = any(getattr(session.model.pipe, name) is not None for name in encoders)
            seen.append((text_encoders, held))

        result = session.generate(make_request(batch_size=2), on_step=watch)
        images[text_encoders] = [pixels(p) for p in result.images]
    assert len(images["reloaded"]) == 2
    assert all(np.abs(a - b).max() <= 1 for a, b in zip(images["kept"], images["reloaded"]))
    assert ("kept", True) in seen and ("reloaded", True) not in seen and ("reloaded", False) in seen
