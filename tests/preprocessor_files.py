"""Test utility: the preprocessors' weight files with seeded random weights, as A1111's extension keeps them.

Each network is controlnet_aux's own model class (the one its detectors load), its tensors filled with seeded
random values and saved in half precision (the loaders read either) under the exact file name the loaders look
for: `annotator/downloads/<module folder>/<file>` of a webui folder, as A1111's sd-webui-controlnet downloads
them. Each network is built on the meta device and filled tensor by tensor: initialising MiDaS' DPT-Hybrid
(123 M weights) for real takes seconds. OpenPose's body and hand files drop their first key part, as the original
.pth files do (controlnet_aux's `util.transfer` puts it back).
"""

from __future__ import annotations

from pathlib import Path

A1111_DOWNLOADS = Path("extensions") / "sd-webui-controlnet" / "annotator" / "downloads"


def _filled(make, seed: int, scale: float = 0.05) -> dict:
    """The tensors of the network `make()` builds (on the meta device: no memory, no initialisation), filled from
    one seeded pool of random numbers, repeated (drawing 123 M normal numbers takes seconds; a repeated pool of 1 M
    is as good for a test and costs a copy)."""
    import warnings

    import torch

    with torch.device("meta"), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # timm: "Mapping deprecated model name vit_base_resnet50_384"
        net = make()
    pool = torch.randn(1 << 20, generator=torch.Generator().manual_seed(seed)) * scale
    twice, size = torch.cat([pool, pool]), pool.numel()
    out, start = {}, 0
    for key, value in net.state_dict().items():
        if not value.is_floating_point():
            out[key] = torch.zeros(value.shape, dtype=value.dtype)
            continue
        flat = torch.empty(value.numel(), dtype=torch.float16)
        for i in range(0, flat.numel(), size):  # chunk copies (float32 -> float16 on the way)
            piece = flat[i:i + size]
            piece.copy_(twice[start:start + piece.numel()])
        out[key] = flat.reshape(value.shape)
        start = (start + 7919) % size  # each tensor starts elsewhere in the pool
    return out


def midas(seed: int = 0) -> dict:
    import torch
    from controlnet_aux.midas.midas.dpt_depth import DPTDepthModel

    return _filled(lambda: DPTDepthModel(path=None, backbone="vitb_rn50_384", non_negative=True), seed)


def openpose(part: str, seed: int = 0) -> dict:
    from controlnet_aux.open_pose.face import FaceNet
    from controlnet_aux.open_pose.model import bodypose_model, handpose_model

    make = {"body": bodypose_model, "hand": handpose_model, "face": FaceNet}[part]
    # weights this small find no person in the test image: a random network finds hundreds of "joints", which
    # OpenPose's pairing (pure Python) takes many seconds over; the map is then the empty (black) pose canvas
    state = _filled(make, seed, scale=1e-4)
    if part == "face":
        return state  # FaceNet's file has the module's own keys
    return {key.split(".", 1)[1]: value for key, value in state.items()}


def lineart(seed: int = 0) -> dict:
    from controlnet_aux.lineart import Generator

    return _filled(lambda: Generator(3, 1, 3), seed, scale=0.2)


def lineart_anime(seed: int = 0) -> dict:
    import functools

    import torch.nn as nn
    from controlnet_aux.lineart_anime import UnetGenerator

    norm = functools.partial(nn.InstanceNorm2d, affine=False, track_running_stats=False)
    return _filled(lambda: UnetGenerator(3, 1, 8, 64, norm_layer=norm, use_dropout=False), seed)


FILES = {  # (A1111's module folder, file name): its weights
    ("midas", "dpt_hybrid-midas-501f0c75.pt"): midas,
    ("openpose", "body_pose_model.pth"): lambda: openpose("body", 1),
    ("openpose", "hand_pose_model.pth"): lambda: openpose("hand", 2),
    ("openpose", "facenet.pth"): lambda: openpose("face", 3),
    ("lineart", "sk_model.pth"): lambda: lineart(4),
    ("lineart", "sk_model2.pth"): lambda: lineart(5),
    ("lineart_anime", "netG.pth"): lambda: lineart_anime(6),
}


def write(webui: Path, only: tuple[str, ...] | None = None) -> Path:
    """The files (those of `only`'s module folders, or all) under `webui`'s A1111 annotator downloads; returns
    `webui/models` (the models folder to point $LOWVRAM_GEN_MODELS at)."""
    import torch

    for (folder, name), make in FILES.items():
        if only is not None and folder not in only:
            continue
        path = webui / A1111_DOWNLOADS / folder / name
        path.parent.mkdir(parents=True, exist_ok=True)
        torch.save(make(), path)
    (webui / "models").mkdir(parents=True, exist_ok=True)
    return webui / "models"
