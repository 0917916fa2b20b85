"""The /sdapi/v1 routes plugins call at start (issue 32 item 8): memory, cmd-flags, the lists, the Extras upscale
routes and the routes not built, over real HTTP with webuiapi where it has a call, on the API alone with a login
(its auth comes before the body, as on every other route)."""

from __future__ import annotations

import base64
import io
import json
import socket
import time

import pytest
import requests
from PIL import Image, PngImagePlugin

from lowvram_gen.api import extras, system_routes
from servers import Server

USER, PASSWORD = "plugin", "s3cret-password"
AUTH = (USER, PASSWORD)


@pytest.fixture(scope="module")
def srv(tmp_path_factory):
    server = Server(tmp_path_factory.mktemp("plugin-routes"), api=True, webui=False, api_auth=f"{USER}:{PASSWORD}")
    yield server
    server.close()


@pytest.fixture()
def api(srv):
    return srv.client(USER, PASSWORD)


def _image(width: int = 64, height: int = 48, text: str | None = None) -> Image.Image:
    image = Image.new("RGB", (width, height))
    image.putdata([((x * 7) % 256, (y * 5) % 256, (x * y) % 256) for y in range(height) for x in range(width)])
    if text is None:
        return image
    buffer = io.BytesIO()
    meta = PngImagePlugin.PngInfo()
    meta.add_text("parameters", text)
    image.save(buffer, format="PNG", pnginfo=meta)
    return Image.open(io.BytesIO(buffer.getvalue()))


def _b64(image: Image.Image) -> str:
    buffer = io.BytesIO()
    meta = PngImagePlugin.PngInfo()
    for key, value in (getattr(image, "text", None) or {}).items():
        meta.add_text(key, value)
    image.save(buffer, format="PNG", pnginfo=meta)
    return base64.b64encode(buffer.getvalue()).decode("ascii")


def _px(image: Image.Image) -> bytes:
    return image.convert("RGB").tobytes()


def _post(srv, route: str, body, **kw) -> requests.Response:
    return requests.post(f"{srv.api_url}/{route}", json=body, auth=AUTH, timeout=120, **kw)


# -- memory, cmd-flags, the lists ---------------------------------------------------------------------------------

def test_memory_answers_a1111s_shape_from_our_figures(api, srv):
    answer = api.get_memory()
    assert set(answer["ram"]) == {"free", "used", "total"}
    assert answer["ram"]["free"] + answer["ram"]["used"] == answer["ram"]["total"] > 0
    assert answer["cuda"] == {"error": "unavailable"}  # this machine has no CUDA: A1111's own answer for it
    ours = answer["lowvram_gen"]
    assert ours["device"] == "cpu" and ours["process_bytes"] > 0 and ours["usable_vram_bytes"] is None


def test_memory_cuda_part_is_a1111s_from_torch_cuda():
    """A fake torch.cuda (no GPU here): the shape A1111 builds from mem_get_info and memory_stats."""

    class FakeCuda:
        @staticmethod
        def is_available():
            return True

        @staticmethod
        def mem_get_info():
            return 3 * 2**30, 8 * 2**30

        @staticmethod
        def memory_stats():
            return {"allocated_bytes.all.current": 5, "allocated_bytes.all.peak": 9, "reserved_bytes.all.current": 6,
                    "reserved_bytes.all.peak": 10, "active_bytes.all.current": 4, "active_bytes.all.peak": 8,
                    "inactive_split_bytes.all.current": 1, "inactive_split_bytes.all.peak": 2,
                    "num_alloc_retries": 3, "num_ooms": 1}

    assert system_routes.cuda(FakeCuda) == {
        "system": {"free": 3 * 2**30, "used": 5 * 2**30, "total": 8 * 2**30},
        "active": {"current": 4, "peak": 8}, "allocated": {"current": 5, "peak": 9},
        "reserved": {"current": 6, "peak": 10}, "inactive": {"current": 1, "peak": 2},
        "events": {"retries": 3, "oom": 1}}

    class Broken(FakeCuda):
        @staticmethod
        def mem_get_info():
            raise RuntimeError("CUDA error: device lost")

    assert system_routes.cuda(Broken) == {"error": "CUDA error: device lost"}


def test_cmd_flags_answers_a1111s_names_and_hides_passwords(api, srv):
    flags = api.get_cmd_flags()
    assert flags["api"] is True and flags["nowebui"] is True and flags["port"] == srv.port
    assert flags["listen"] is False and flags["medvram"] is False and flags["lowvram"] is False
    assert flags["ckpt"] == "tiny" and "vae_dir" in flags and "ckpt_dir" in flags and "lora_dir" in flags
    assert flags["api_auth"] == "<hidden>" and PASSWORD not in json.dumps(flags)
    assert flags["queue_size"] == 16 and flags["api_body_limit"] == 64  # ours beside A1111's


def test_the_lists_answer_as_a1111_with_nothing_installed(api, srv):
    assert api.get_face_restorers() == [] and api.get_hypernetworks() == []
    assert api.get_realesrgan_models() == []
    for route in ("sd-modules", "extensions"):
        answer = requests.get(f"{srv.api_url}/{route}", auth=AUTH, timeout=30)
        assert answer.status_code == 200 and answer.json() == [], route


def test_realesrgan_models_lists_the_realesrgan_files_among_the_upscalers(tmp_path, monkeypatch):
    folder = tmp_path / "models" / "ESRGAN"
    folder.mkdir(parents=True)
    for name in ("RealESRGAN_x4plus.pth", "RealESRGAN_x2plus.pth", "4x-UltraSharp.pth", "realesr-general-x4v3.pth"):
        (folder / name).write_bytes(b"")
    monkeypatch.setenv("LOWVRAM_GEN_MODELS", str(tmp_path / "models"))
    listed = {entry["name"]: entry for entry in system_routes.realesrgan_models()}
    assert set(listed) == {"RealESRGAN_x4plus.pth", "RealESRGAN_x2plus.pth", "realesr-general-x4v3.pth"}
    assert listed["RealESRGAN_x4plus.pth"] == {"name": "RealESRGAN_x4plus.pth",
                                               "path": str(folder / "RealESRGAN_x4plus.pth"), "scale": 4}
    assert listed["RealESRGAN_x2plus.pth"]["scale"] == 2 and listed["realesr-general-x4v3.pth"]["scale"] == 4


def test_the_refresh_routes_answer_null_as_a1111s(srv):
    for route in ("refresh-embeddings", "refresh-checkpoints", "refresh-vae", "refresh-loras"):
        answer = _post(srv, route, None)
        assert answer.status_code == 200 and answer.json() is None, route


def test_unload_checkpoint_frees_the_model_and_reload_answers(srv):
    srv.session.model = object()  # as if a job had loaded one
    assert _post(srv, "unload-checkpoint", None).json() == {}
    assert srv.session.model is None
    assert _post(srv, "reload-checkpoint", None).json() == {}


# -- what is not built: a clear answer, never a 404 -----------------------------------------------------------------

def test_interrogate_is_501_naming_what_is_not_built_and_what_to_use(api):
    with pytest.raises(RuntimeError) as err:
        api.interrogate(_image())
    status, text = err.value.args
    body = json.loads(text)
    assert status == 501 and "interrogation" in body["detail"] and "png-info" in body["detail"]
    assert body["error"] == "HTTPException" and body["errors"].startswith("501: ")


@pytest.mark.parametrize("route", ["create/embedding", "create/hypernetwork", "train/embedding",
                                   "train/hypernetwork", "preprocess", "server-kill", "server-restart", "server-stop"])
def test_routes_not_built_answer_501_in_a1111s_error_body(srv, route):
    answer = _post(srv, route, {"name": "x"})
    assert answer.status_code == 501, route
    assert "not built" in answer.json()["detail"] or "Ctrl+C" in answer.json()["detail"]


# -- Extras: our upscalers with A1111's fields ----------------------------------------------------------------------

def test_extra_single_image_upscales_by_a1111s_rules_and_keeps_the_pngs_text(api):
    source = _image(64, 48, text="a fox\nSteps: 2, Seed: 7")
    result = api.extra_single_image(source, upscaler_1="Lanczos", upscaling_resize=2.5)
    assert result.image.size == (160, 120)  # 64x2.5, 48x2.5, each rounded down to a multiple of 8
    assert result.info == "<p>Postprocess upscale by: 2.5, Postprocess upscaler: Lanczos</p>"
    assert result.image.text["parameters"] == "a fox\nSteps: 2, Seed: 7"
    assert result.image.text["postprocessing"] == "Postprocess upscale by: 2.5, Postprocess upscaler: Lanczos"
    expected = source.convert("RGB").resize((160, 120), Image.Resampling.LANCZOS)
    assert _px(result.image) == _px(expected)


def test_upscale_to_a_size_with_crop_and_a_second_upscaler_blended(api):
    source = _image(64, 48)
    cropped = api.extra_single_image(source, resize_mode=1, upscaling_resize_w=100, upscaling_resize_h=100,
                                     upscaler_1="Nearest")
    assert cropped.image.size == (100, 100)
    assert cropped.info == ("<p>Postprocess upscale to: 100x100, Postprocess crop to: 100x100, "
                            "Postprocess upscaler: Nearest</p>")
    uncropped = api.extra_single_image(source, resize_mode=1, upscaling_resize_w=100, upscaling_resize_h=100,
                                       upscaling_crop=False, upscaler_1="Nearest")
    assert uncropped.image.size == (128, 96)  # by the larger ratio (100/48), rounded down to multiples of 8
    blended = api.extra_single_image(source, upscaler_1="Lanczos", upscaler_2="Nearest",
                                     extras_upscaler_2_visibility=0.5)
    want = Image.blend(source.resize((128, 96), Image.Resampling.LANCZOS),
                       source.resize((128, 96), Image.Resampling.NEAREST), 0.5)
    assert _px(blended.image) == _px(want)
    assert "Postprocess upscaler 2: Nearest" in blended.info


def test_upscaler_none_leaves_the_image_as_it_is(api):
    source = _image(64, 48)
    result = api.extra_single_image(source)  # A1111's defaults: upscaler_1 None
    assert result.image.size == (64, 48) and result.info == "<p></p>"
    assert _px(result.image) == _px(source)


def test_extra_batch_images_answers_every_image(api):
    result = api.extra_batch_images([_image(64, 48), _image(32, 32)], upscaler_1="Lanczos", upscaling_resize=2)
    assert [im.size for im in result.images] == [(128, 96), (64, 64)]
    assert result.info == "<p>Postprocess upscale by: 2, Postprocess upscaler: Lanczos</p>"


@pytest.mark.parametrize("name", ["NoSuchUpscaler", "/etc/passwd", "../ESRGAN/x.pth"])
def test_a_bad_upscaler_name_is_422_naming_the_field_and_the_listing_route(srv, name):
    answer = _post(srv, "extra-single-image", {"image": _b64(_image()), "upscaler_1": "Lanczos", "upscaler_2": name,
                                               "extras_upscaler_2_visibility": 0.3})
    assert answer.status_code == 422
    detail = answer.json()["detail"][0]
    assert detail["loc"] == ["body", "upscaler_2"] and "GET /sdapi/v1/upscalers" in detail["msg"]


def test_a_latent_upscaler_and_face_restoration_are_refused_in_one_sentence(srv):
    image = _b64(_image())
    latent = _post(srv, "extra-single-image", {"image": image, "upscaler_1": "Latent"})
    assert latent.status_code == 422 and "inside a hires pass" in latent.json()["detail"][0]["msg"]
    for field in ("gfpgan_visibility", "codeformer_visibility"):
        answer = _post(srv, "extra-single-image", {"image": image, "upscaler_1": "Lanczos", field: 0.5})
        detail = answer.json()["detail"][0]
        assert answer.status_code == 422 and detail["loc"] == ["body", field]
        assert "face restoration (GFPGAN, CodeFormer) is not built" in detail["msg"]


def test_extras_images_are_base64_only_and_capped(srv, tmp_path):
    path = tmp_path / "on-the-server.png"
    _image().save(path)
    for body, loc in (({"image": str(path), "upscaler_1": "Lanczos"}, ["body", "image"]),
                      ({"imageList": [{"data": str(path), "name": "a"}], "upscaler_1": "Lanczos"},
                       ["body", "imageList", 0, "data"]),
                      ({"imageList": [{"name": "a"}]}, ["body", "imageList", 0]),
                      ({"image": _b64(_image()), "upscaler_1": "Lanczos", "upscaling_resize": 9},
                       ["body", "upscaling_resize"])):
        route = "extra-batch-images" if "imageList" in body else "extra-single-image"
        answer = _post(srv, route, body)
        assert answer.status_code == 422 and answer.json()["detail"][0]["loc"] == loc, body
    wide = _post(srv, "extra-single-image", {"image": _b64(Image.new("RGB", (8200, 8))), "upscaler_1": "Lanczos"})
    assert wide.status_code == 422 and "at most 8192 px a side" in wide.json()["detail"][0]["msg"]
    big = _post(srv, "extra-single-image", {"image": _b64(_image(2048, 64)), "upscaler_1": "Lanczos",
                                            "upscaling_resize": 8})
    assert big.status_code == 422 and "16384x512" in big.json()["detail"][0]["msg"]


def test_extras_ask_for_the_login_before_the_body_is_read(srv):
    """FAULTS 33: 200 MB announced, a few bytes sent, no login: 401 at once."""
    started = time.monotonic()
    with socket.create_connection(("127.0.0.1", srv.port), timeout=10) as sock:
        sock.sendall(b"POST /sdapi/v1/extra-single-image HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     b"Content-Length: 209715200\r\n\r\n{\"image\": \"")
        answer = sock.recv(65536)
    assert answer.startswith(b"HTTP/1.1 401") and time.monotonic() - started < 5
    assert requests.get(f"{srv.api_url}/memory", timeout=30).status_code == 401
    assert requests.post(f"{srv.api_url}/interrogate", json={}, timeout=30).status_code == 401


def test_the_extras_rules_without_a_server():
    """api/extras.py's own: the infotext quotes a value as A1111's does, the HTML escapes it."""
    assert extras.infotext({"Postprocess upscaler": "4x, sharp"}) == 'Postprocess upscaler: "4x, sharp"'
    assert extras.html_info("a<b\nc") == "<p>a&lt;b<br>\nc</p>"
