"""What A1111's `/options` reads and sets: the API's model (`sd_model_checkpoint`), clip skip
(`CLIP_stop_at_last_layers`), VAE (`sd_vae`: Automatic, None or a name of /sdapi/v1/sd-vae), RNG source
(`randn_source`: GPU, CPU or NV), live previews (`show_progress_every_n_steps`, `live_previews_enable`: A1111's
defaults, every 10 steps) and `img2img_fix_steps` (img2img runs exactly its steps: img2img_steps.py), the defaults
of later API jobs. The web UI has its own Model box and preview setting;
they are not changed by these, nor are these by them.

Setting the model checks that it is one of /sd-models' (an unknown one is refused with A1111's error body);
it loads with the next job, where the planner picks the precision and weight storage it loads at (as every
job's model loads). The other settings are accepted and ignored, with a line in the log, as the README says.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass, field
from typing import Any

from lowvram_gen.a1111 import unipc_options
from lowvram_gen.errors import InvalidRequest
from lowvram_gen.request import MAX_CLIP_SKIP, MAX_SEED, MAX_STEPS, as_int
from lowvram_gen.rng import WORDS as RNG_WORDS
from lowvram_gen.rng import check_rng

from lowvram_gen.api import listings
from lowvram_gen.request import as_bool

log = logging.getLogger(__name__)
SETTINGS = ("sd_model_checkpoint", "CLIP_stop_at_last_layers", "show_progress_every_n_steps", "live_previews_enable",
            "sd_vae", "randn_source", "img2img_fix_steps", "eta_noise_seed_delta", "samples_filename_pattern",
            *(setting for setting, _ in unipc_options.SETTINGS.values()))


@dataclass
class ApiState:
    model: str  # the spec later API jobs use (--model until POST /options sets another)
    outdir: str
    models_folder: str | None = None
    clip_skip: int = 1
    preview_steps: int = 10  # show_progress_every_n_steps (0: none), A1111's default
    previews_on: bool = True  # live_previews_enable
    vae: str = "Automatic"  # sd_vae: later API jobs' VAE (models/vae.py)
    rng: str = "gpu"  # randn_source: later API jobs' noise source (rng.py)
    img2img_fix_steps: bool = False  # A1111's img2img_fix_steps: later img2img jobs run exactly their steps
    ensd: int = 0  # eta_noise_seed_delta: later API jobs' step noise seed delta (request.py)
    filename_pattern: str = ""  # samples_filename_pattern: later API jobs' file names (filename_pattern.py)
    # uni_pc_*: later API jobs' UniPC settings, by their request fields (a1111/unipc_options.py)
    unipc_variant: str = unipc_options.DEFAULTS["unipc_variant"]
    unipc_skip_type: str = unipc_options.DEFAULTS["unipc_skip_type"]
    unipc_order: int = unipc_options.DEFAULTS["unipc_order"]
    unipc_lower_order_final: bool = unipc_options.DEFAULTS["unipc_lower_order_final"]
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def find_model(self, name: str) -> str | None:
        return listings.find_model(name, self.model, self.models_folder)

    def current(self) -> tuple[str, int]:
        with self._lock:
            return self.model, self.clip_skip

    def current_vae(self) -> str:
        with self._lock:
            return self.vae

    def current_rng(self) -> str:
        with self._lock:
            return self.rng

    def current_ensd(self) -> int:
        with self._lock:
            return self.ensd

    def current_unipc(self) -> dict:
        with self._lock:
            return {name: getattr(self, name) for name in unipc_options.SETTINGS}

    def current_pattern(self) -> str:
        with self._lock:
            return self.filename_pattern

    def fix_steps(self) -> bool:
        with self._lock:
            return self.img2img_fix_steps

    def preview_every(self) -> int:
        """How often (steps) an API job makes a live preview for /progress: 0 for none."""
        with self._lock:
            return self.preview_steps if self.previews_on else 0

    def options(self) -> dict:
        """GET /options: the keys A1111 clients read."""
        model, clip_skip = self.current()
        return {
            "sd_model_checkpoint": listings.title_of(model), "sd_checkpoint_hash": None,
            "CLIP_stop_at_last_layers": clip_skip, "sd_vae": self.current_vae(),
            "randn_source": RNG_WORDS[self.current_rng()],
            "samples_save": True, "samples_format": "png", "outdir_samples": self.outdir,
            "outdir_txt2img_samples": self.outdir, "outdir_img2img_samples": self.outdir, "enable_pnginfo": True,
            "show_progress_every_n_steps": self.preview_steps, "live_previews_enable": self.previews_on,
            "sd_checkpoints_limit": 1, "img2img_fix_steps": self.fix_steps(),
            "eta_noise_seed_delta": self.current_ensd(), "samples_filename_pattern": self.current_pattern(),
            **{unipc_options.SETTINGS[name][0]: value for name, value in self.current_unipc().items()},
        }

    def set_options(self, body: Any, allowed: tuple = ()) -> list[str]:
        """POST /options: set the model, clip skip, VAE, RNG source and live previews (all checked before any changes; `allowed`:
        the folders of --api-allow-paths, where sd_vae may name a path); returns the keys ignored."""
        if not isinstance(body, dict):
            raise InvalidRequest("options", body, 'send a JSON object of settings, e.g. {"sd_model_checkpoint": "tiny"}')
        changes = {}
        if "sd_model_checkpoint" in body:
            value = body["sd_model_checkpoint"]
            spec = self.find_model(value) if isinstance(value, str) else None
            if spec is None:
                raise InvalidRequest("sd_model_checkpoint", value, "no such model: GET /sdapi/v1/sd-models lists "
                                                                   "their titles")
            changes["model"] = spec
        if "CLIP_stop_at_last_layers" in body:
            changes["clip_skip"] = as_int("CLIP_stop_at_last_layers", body["CLIP_stop_at_last_layers"], 1,
                                          MAX_CLIP_SKIP, " (1: off, A1111's meaning)")
        if "sd_vae" in body:  # the names /sdapi/v1/sd-vae lists, Automatic or None (api/names.py)
            from lowvram_gen.api.names import check_vae
            from lowvram_gen.request import check_vae as vae_text

            changes["vae"] = vae_text(check_vae(body["sd_vae"], "sd_vae", allowed))
        if "randn_source" in body:
            changes["rng"] = check_rng(body["randn_source"], "randn_source")
        if "eta_noise_seed_delta" in body:
            changes["ensd"] = as_int("eta_noise_seed_delta", body["eta_noise_seed_delta"], 0, MAX_SEED, " (0: off)")
        if "samples_filename_pattern" in body:
            from lowvram_gen.filename_pattern import check_pattern

            changes["filename_pattern"] = check_pattern(body["samples_filename_pattern"], "samples_filename_pattern")
        checks = {"unipc_variant": unipc_options.check_variant, "unipc_skip_type": unipc_options.check_skip_type,
                  "unipc_order": unipc_options.check_order,
                  "unipc_lower_order_final": lambda value: as_bool("uni_pc_lower_order_final", value)}
        for name, (setting, _) in unipc_options.SETTINGS.items():
            if setting in body:
                changes[name] = checks[name](body[setting])
        if "show_progress_every_n_steps" in body:
            changes["preview_steps"] = as_int("show_progress_every_n_steps", body["show_progress_every_n_steps"], 0,
                                              MAX_STEPS, " (0: no live previews)")
        if "live_previews_enable" in body:
            changes["previews_on"] = as_bool("live_previews_enable", body["live_previews_enable"])
        if "img2img_fix_steps" in body:
            changes["img2img_fix_steps"] = as_bool("img2img_fix_steps", body["img2img_fix_steps"])
        self.keep(changes)
        ignored = sorted(k for k in body if k not in SETTINGS)
        if ignored:
            log.warning("POST /sdapi/v1/options: not used (lowvram-gen has no such setting): %s", ", ".join(ignored))
        return ignored

    def keep(self, changes: dict) -> None:
        """Set `model`, `clip_skip`, `vae`, `rng`, `ensd`, `preview_steps`, `previews_on`, `img2img_fix_steps` for later
        jobs (POST /options, or override_settings not restored)."""
        with self._lock:
            for name, value in changes.items():
                setattr(self, name, value)
