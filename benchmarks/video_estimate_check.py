#!/usr/bin/env python
"""The planner's video estimate against the peaks measured on width-scaled folders (issue 33).

    python benchmarks/video_estimate_check.py               # the table: estimate vs measured, error %
    python benchmarks/video_estimate_check.py --fit         # fit fit.transformer_video / fit.vae_video where a
                                                            # variant's error is over 10 %, into calibration.json
    python benchmarks/video_estimate_check.py --markdown    # the table as docs/video-plan.md has it
    python benchmarks/video_estimate_check.py --profiles    # the video built-ins' profiles into calibration.json

Reads benchmarks/results/video_memory.json (benchmarks/video_memory.py writes it: one transformer forward, one VAE
decode, one text-encoder forward per point, CPU RSS above the weights). For each point the same folder is profiled as
the planner profiles any folder (models/profile.profile_from_folder on a copy of the shipped configs with the point's
width overrides), made a clip by planning/video.planned, and estimated by the planner's own functions:
planning/estimate.unet_activation_bytes (the transformer forward, `batch` clips), vae_activation_bytes (the decode,
tiled where the point is) and text_activation_bytes (the text encoder). No model is built and nothing is measured
here.

The fit: per variant ('wan', 'wan22', 'ltx'; a tiled decode apart where it has points), the least-squares ratio
measured / estimate-at-coefficient-1 over its points, written only where the variant's largest error at the stored
coefficient is over 10 %.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
from pathlib import Path
from types import SimpleNamespace

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from lowvram_gen import families  # noqa: E402
from lowvram_gen.families.record import FolderFacts  # noqa: E402
from lowvram_gen.models import profile as profiles  # noqa: E402
from lowvram_gen.planning import estimate, video  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results" / "video_memory.json"
LIMIT = 0.10  # the "within 10 %"
KINDS = {"transformer": "transformer_video", "vae": "vae_video"}


def scaled_folder(point: dict, dest: Path) -> Path:
    """A copy of the point's shipped config folder with its width overrides in the scaled component's config."""
    src = profiles.CONFIGS / point["folder"]
    folder = dest / point["id"]
    if folder.exists():
        shutil.rmtree(folder)
    shutil.copytree(src, folder)
    part = point.get("component") or point["kind"]
    if point.get("config"):
        cfg_file = folder / part / "config.json"
        cfg = json.loads(cfg_file.read_text())
        cfg.update(point["config"])
        cfg_file.write_text(json.dumps(cfg))
    return folder


def clip_profile(folder: Path, point: dict):
    """The folder's profile made a clip of the point's frames (planning/video.planned), and its Video facts."""
    profile = profiles.profile_from_folder(folder)
    index = json.loads((folder / "model_index.json").read_text())
    record = families.by_pipeline(str(index.get("_class_name") or ""))
    facts = record.video_facts(FolderFacts(name=folder.name, model_index=index,
                                           transformer=json.loads((folder / "transformer" / "config.json").read_text())))
    request = SimpleNamespace(frames=max(1, point["frames"]), width=point["width"] or 64,
                              height=point["height"] or 64, init_image=None, cfg_scale=1.0, allow_upscale=False)
    clip, job = video.planned(profile, facts, request)
    return clip, job


def estimated(point: dict, folder: Path, coefficient: float | None = None) -> tuple[int, str, dict]:
    """(the planner's estimate of the point's activations, the variant key, what it counted)."""
    clip, job = clip_profile(folder, point)
    kind, b = point["kind"], 2  # bfloat16, as measured
    key = video.variant(clip) + ("-tiled" if point.get("options", {}).get("tiling") and kind == "vae" else "")
    counted = {"latent_frames": job.latent_frames, "tokens": job.tokens}
    if kind == "transformer":
        if coefficient is not None:  # (the prompt embeddings' term alone: coefficient -1)
            if coefficient < 0:
                return (video.transformer_bytes(clip, point["width"], point["height"], point["batch"], b, 0.0, 1.0),
                        key, counted)
            return (video.transformer_bytes(clip, point["width"], point["height"], point["batch"], b, coefficient,
                                            0.0), key, counted)
        return estimate.unet_activation_bytes(clip, point["width"], point["height"], point["batch"], b), key, counted
    if kind == "vae":
        tiled = bool(point.get("options", {}).get("tiling"))
        if coefficient is not None:
            value = video.decode_bytes(clip, point["width"], point["height"], 1, b, estimate.vae_feature(clip),
                                       coefficient, tiled)
            return value, key, counted
        return estimate.vae_activation_bytes(clip, point["width"], point["height"], 1, b, tiling=tiled), key, counted
    return estimate.text_activation_bytes(clip, 1, b), "text", counted


def rows(points: list[dict], work: Path) -> list[dict]:
    out = []
    for point in points:
        measured = point.get("activation_bytes")
        if not measured or point.get("error"):
            continue
        folder = scaled_folder(point, work)
        est, key, counted = estimated(point, folder)
        # the estimate is fixed + coefficient x unit: the part the coefficient scales, and the rest (the clip, the
        # prompt's embeddings)
        fixed = estimated(point, folder, 0.0)[0] if point["kind"] in KINDS else 0
        unit = estimated(point, folder, 1.0)[0] - fixed if point["kind"] in KINDS else 0
        # a transformer's second term: the prompt embeddings (at 1 tensor), fitted beside the tokens' coefficient
        text = estimated(point, folder, -1.0)[0] if point["kind"] == "transformer" else 0
        out.append({"id": point["id"], "kind": point["kind"], "key": key, "measured": int(measured),
                    "estimate": int(est), "unit": int(unit), "fixed": int(fixed), "text": int(text),
                    "error": est / measured - 1,
                    **counted})
    return out


def fitted(table: list[dict]) -> dict[str, dict[str, float]]:
    """{fit kind: {variant: coefficient}} where a variant's largest error is over LIMIT."""
    out: dict[str, dict[str, float]] = {}
    for kind, fit_kind in KINDS.items():
        for key in sorted({r["key"] for r in table if r["kind"] == kind}):
            mine = [r for r in table if r["kind"] == kind and r["key"] == key and r["unit"]]
            if not mine or max(abs(r["error"]) for r in mine) <= LIMIT:
                continue
            if kind == "transformer":  # two terms: the tokens' coefficient and the prompt embeddings' (least squares)
                coef, text = _two_terms([(r["unit"], r["text"], r["measured"]) for r in mine])
                out.setdefault(fit_kind, {})[key] = round(coef, 4)
                out.setdefault("transformer_video_text", {})[key] = round(text, 4)
                continue
            coef = sum((r["measured"] - r["fixed"]) * r["unit"] for r in mine) / sum(r["unit"] ** 2 for r in mine)
            out.setdefault(fit_kind, {})[key] = round(coef, 4)
    return out


def _two_terms(rows: list[tuple[float, float, float]]) -> tuple[float, float]:
    """(a, b) minimising the squared relative error of a x u + b x t against m over (u, t, m); the text term b not
    below 0 (a negative intercept would undercount a short clip)."""
    w = [(u / m, t / m) for u, t, m in rows]  # relative: each point weighs alike
    suu, stt, sut = sum(u * u for u, _ in w), sum(t * t for _, t in w), sum(u * t for u, t in w)
    su, st = sum(u for u, _ in w), sum(t for _, t in w)
    det = suu * stt - sut * sut
    if det > 0:
        a, b = (su * stt - st * sut) / det, (st * suu - su * sut) / det
        if b >= 0:
            return a, b
    return su / suu, 0.0


def write_fit(fits: dict[str, dict[str, float]], results: str) -> None:
    """The fitted coefficients into calibration.json's `video_fit` (its own key: calibrate_memory.py rewrites `fit`)."""
    cal = json.loads(profiles.CALIBRATION_FILE.read_text())
    fit = cal.setdefault("video_fit", {})
    for kind, table in fits.items():
        fit[kind] = {**fit.get(kind, {}), **table}
    fit["source"] = f"benchmarks/video_estimate_check.py --fit on {Path(results).name}"
    _save(cal)


def write_profiles() -> None:
    """The video built-ins' profiles counted once into calibration.json's `profiles`, as calibrate_memory.py counts
    the image ones (the same function; its --fit-only recounts them all), so `plan --model wan21-t2v-14b` reads no
    config of a 14 B model on the meta device."""
    cal = json.loads(profiles.CALIBRATION_FILE.read_text())
    for record in families.builtin_families():
        if record.is_video and (profiles.CONFIGS / record.builtin).is_dir():
            cal["profiles"][record.builtin] = profiles._profile_for_dir(str(profiles.CONFIGS / record.builtin),
                                                                        arch=record.builtin).as_dict()
    _save(cal)


def _save(cal: dict) -> None:
    profiles.CALIBRATION_FILE.write_text(json.dumps(cal, indent=1) + "\n")
    profiles.reload_calibration()


def markdown(table: list[dict]) -> str:
    lines = ["| point | latent frames | tokens | measured | estimate | error |", "|---|---:|---:|---:|---:|---:|"]
    for r in table:
        frames = r["latent_frames"] if r["kind"] in KINDS else "-"
        lines.append(f"| {r['id']} | {frames} | {r['tokens'] if r['kind'] == 'transformer' else '-'} | "
                     f"{r['measured'] / 2**20:.1f} MiB | {r['estimate'] / 2**20:.1f} MiB | {r['error']:+.1%} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--results", default=str(RESULTS), help="the measured points (video_memory.json)")
    ap.add_argument("--fit", action="store_true", help="fit the coefficients over 10 %% off into calibration.json")
    ap.add_argument("--markdown", action="store_true", help="print the table as markdown")
    ap.add_argument("--profiles", action="store_true", help="count the video built-ins' profiles into calibration.json")
    args = ap.parse_args(argv)
    if args.profiles:
        write_profiles()
    points = json.loads(Path(args.results).read_text())["points"]
    with tempfile.TemporaryDirectory() as tmp:
        table = rows(points, Path(tmp))
        if args.fit:
            fits = fitted(table)
            if fits:
                write_fit(fits, args.results)
                print(f"fitted: {json.dumps(fits)}")
                table = rows(points, Path(tmp))
            else:
                print("every variant within 10 %: nothing fitted")
    if args.markdown:
        print(markdown(table))
    else:
        for r in table:
            print(f"{r['id']:45} {r['measured'] / 2**20:9.1f} MiB  est {r['estimate'] / 2**20:9.1f} MiB  "
                  f"{r['error']:+7.1%}")
    worst = max((abs(r["error"]) for r in table if r["kind"] in KINDS), default=0.0)
    print(f"largest error (transformer, VAE): {worst:.1%} over {sum(r['kind'] in KINDS for r in table)} points")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
