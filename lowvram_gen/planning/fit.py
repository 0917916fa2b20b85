"""Fitting the estimator's coefficients to measured activation peaks, and reporting its error.

Used by benchmarks/calibrate_memory.py (which measures and then fits) and by the tests (which check the
stored fit against the stored measurements); the estimator itself (planning/estimate.py) only reads the fit from
configs/calibration.json, so none of this runs during a job.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import replace
from typing import Any

from lowvram_gen.models.profile import ModelProfile, calibration, profile_builtin
from lowvram_gen.planning import estimate as memory
from lowvram_gen.settings import MemorySettings

def _dtype(m: dict) -> str:
    return m.get("options", {}).get("dtype", "bfloat16")


def _point_profile(m: dict) -> ModelProfile:
    """The profile a measurement ran: its architecture's, without resolution bins where it ran at the size asked
    (SANA's points whose pipeline call turned binning off, options "call"; a VAE point, a bare decode)."""
    prof = profile_builtin(m["arch"])
    opts = m.get("options", {})
    if m["component"] == "vae" or opts.get("call", {}).get("use_resolution_binning") is False:
        prof = replace(prof, resolution_bins=())
    return prof


def _with_weight_copies(rows: list[dict], per_call: float) -> tuple[float, float]:
    """(copies of the pointwise convolution's weight, coefficient) for one architecture's points at several token
    counts: least squares on the relative error of copies x weight + coefficient x feature (the copy is held whatever
    the tokens, the working set grows with them). One token count: one copy, the coefficient the mean of the rest."""
    sums = [0.0] * 5  # a.a, a.b, b.b, a, b, with a = weight bytes / measured, b = feature / measured
    for m in rows:
        prof = _point_profile(m)
        y = m["activation_bytes"]
        a = prof.pointwise_conv * memory.DTYPE_BYTES[m.get("options", {}).get("dtype", "bfloat16")] / y
        b = _measured_feature(m, prof, per_call) / y
        for i, v in enumerate((a * a, a * b, b * b, a, b)):
            sums[i] += v
    aa, ab, bb, a1, b1 = sums
    det = aa * bb - ab * ab
    if abs(det) < 1e-9 * aa * bb:
        return 1.0, (b1 - ab) / bb  # sum of (1 - a) b / b.b: the coefficient of the rest, one copy held
    return (a1 * bb - b1 * ab) / det, (aa * b1 - ab * a1) / det


def _measured_feature(m: dict, profile: ModelProfile, per_call: float = 0.0) -> float:
    """The model's activation bytes for one measurement with coefficient 1 (no slicing term)."""
    b = memory.DTYPE_BYTES[m.get("options", {}).get("dtype", "bfloat16")]
    sf = profile.vae_scale_factor
    width, height = memory.rendered_size(profile, m["width"], m["height"])
    hw = math.ceil(height / sf) * math.ceil(width / sf)
    if m["component"] == "vae":
        elements = memory.vae_feature(profile) * hw
    else:
        elements = memory._denoiser_elements(profile, hw)[1]
    return elements * (m["batch"] + per_call) * b


def fit_coefficients(measurements: list[dict]) -> dict:
    """Coefficients that make the features match the measured activation peaks.

    per_call: from pairs of measurements that differ only in batch, the part of the peak that does
    not grow with the batch, in images (act = coef x feature x pixels x bytes x (batch + per_call)).
    Then per architecture and component: the mean of measured / modelled over the plain (SDPA,
    untiled) measurements; 'global' is the mean over architectures, used for other models. The
    slicing coefficient scales the score-matrix term to the measured peak with attention slicing.
    Points marked "check" (transformer depth, SD3.5-medium) are held out of the fit.
    """
    ok = [m for m in measurements if "activation_bytes" in m]
    plain = [m for m in ok if not any(m.get("options", {}).get(k) for k in ("attention", "tiling", "check"))]
    fit: dict[str, Any] = {}
    copies: dict[str, float] = {}
    wide = [m for m in plain if m["component"] == "vae" and _dtype(m) == "float32"]  # the VAE's float32 decodes
    for kind in ("unet", "vae", "transformer"):
        rows = [m for m in plain if m["component"] == kind and not (kind == "vae" and _dtype(m) == "float32")]
        ks = []
        for a, b in itertools.combinations(rows, 2):
            same = all(a[k] == b[k] for k in ("arch", "width", "height", "options"))
            if same and a["batch"] != b["batch"]:
                lo, hi = sorted((a, b), key=lambda m: m["batch"])
                per_image = (hi["activation_bytes"] - lo["activation_bytes"]) / (hi["batch"] - lo["batch"])
                ks.append(max(0.0, lo["activation_bytes"] / per_image - lo["batch"]))
        per_call = round(sum(ks) / len(ks), 4) if ks else 0.0
        ratios: dict[str, list[float]] = {}
        for m in rows:
            prof = _point_profile(m)
            ratios.setdefault(m["arch"], []).append(m["activation_bytes"] / _measured_feature(m, prof, per_call))
        table: dict[str, float] = {arch: round(sum(v) / len(v), 4) for arch, v in sorted(ratios.items())}
        if kind == "transformer":  # SANA's 1x1 convolutions: a copy of a weight beside the working set (estimate.py)
            for arch in table:
                own = [m for m in rows if m["arch"] == arch]
                if _point_profile(own[0]).pointwise_conv:
                    k, coef = _with_weight_copies(own, per_call)
                    copies[arch], table[arch] = round(k, 4), round(coef, 4)
        # 'global' (models no point measures) stays the mean over the bare-forward points (SD3, FLUX.1, the UNets): the
        # issue-30 families, measured through their pipelines ("pipeline"), get their own coefficients; moving the
        # global one with them would move every unmeasured folder's plan at once, which wants its own check
        own_fit = ("pipeline", "own_coefficient")  # measured for a family's own coefficient only
        bare = {m["arch"] for m in rows if not any(m.get("options", {}).get(k) for k in own_fit)}
        own = [v for arch, v in table.items() if arch in bare] or list(table.values())
        table["global"] = round(sum(own) / len(own), 4) if own else 1.0
        table["per_call"] = per_call
        fit[kind] = table
        if kind == "vae" and wide:  # float32 decodes: their own coefficients, the 16-bit per_call (estimate.py)
            ratios = {}
            for m in wide:
                ratios.setdefault(m["arch"], []).append(m["activation_bytes"]
                                                        / _measured_feature(m, _point_profile(m), per_call))
            wide_table = {arch: round(sum(v) / len(v), 4) for arch, v in sorted(ratios.items())}
            in_bare = [v for arch, v in wide_table.items() if arch in bare]
            if in_bare:  # the global one from the same architectures as the 16-bit global
                wide_table["global"] = round(sum(in_bare) / len(in_bare), 4)
            fit["vae_float32"] = wide_table
    if copies:
        fit["pointwise_conv"] = copies
    fit["slicing"] = 1.0
    for m in ok:
        if m.get("options", {}).get("attention") == "slicing" and m["component"] == "unet":
            prof = profile_builtin(m["arch"])
            coef = fit["unet"].get(m["arch"], fit["unet"]["global"])
            b = memory.DTYPE_BYTES[m.get("options", {}).get("dtype", "bfloat16")]
            sf = prof.vae_scale_factor
            hw = math.ceil(m["height"] / sf) * math.ceil(m["width"] / sf)
            working, scores = max(memory._sliced_attention_terms(prof, hw), key=lambda t: t[1])
            rest = m["activation_bytes"] - coef * working * hw * (m["batch"] + fit["unet"]["per_call"]) * b
            fit["slicing"] = round(max(0.0, rest) / (scores * memory._score_bytes(prof, b)), 4)
    return fit


def predicted_activation(m: dict) -> int:
    """What the estimator predicts for one calibration measurement ("estimate_as": 'custom' estimates
    it as an architecture that is not built in, i.e. with the global coefficient)."""
    opts = m.get("options", {})
    prof = _point_profile(m)
    if opts.get("estimate_as"):
        prof = replace(prof, arch=opts["estimate_as"])
    b = memory.DTYPE_BYTES[opts.get("dtype", "bfloat16")]
    if m["component"] in ("unet", "transformer"):
        return memory.unet_activation_bytes(prof, m["width"], m["height"], m["batch"], b,
                                            opts.get("attention", "sdpa"))
    return memory.vae_activation_bytes(prof, m["width"], m["height"], m["batch"], b,
                                       tiling=bool(opts.get("tiling")))


def calibration_report() -> list[dict]:
    """Measured vs estimated activation peak for every stored measurement, and published GPU totals."""
    rows = []
    for m in calibration().get("measurements", []):
        if "activation_bytes" not in m:
            continue
        est = predicted_activation(m)
        rows.append({"id": m["id"], "measured_mib": m["activation_bytes"] / memory.MiB,
                     "estimated_mib": est / memory.MiB,
                     "error_pct": 100.0 * (est - m["activation_bytes"]) / m["activation_bytes"]})
    return rows


def published_report() -> list[dict]:
    """Published GPU max_memory_allocated figures vs this estimator (without the fixed overhead)."""
    rows = []
    for pub in calibration().get("published", []):
        s = MemorySettings(**pub["settings"])
        prof = replace(profile_builtin(pub["arch"]), **pub.get("profile_overrides", {}))
        est = memory.estimate(prof, pub["width"], pub["height"], pub["batch"], s, pub.get("cfg", True))
        predicted = est.total_bytes - est.overhead_bytes  # max_memory_allocated has no overhead in it
        rows.append({"id": pub["id"], "published_gib": pub["max_memory_allocated_bytes"] / 1024**3,
                     "estimated_gib": predicted / 1024**3, "phase": est.peak_phase,
                     "error_pct": 100.0 * (predicted - pub["max_memory_allocated_bytes"]) / pub["max_memory_allocated_bytes"],
                     "source": pub["source"]})
    return rows
