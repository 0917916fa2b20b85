"""How far the planner's step estimate is from the measured step, before and after it learns from jobs.

For each model (the embedded tiny one; with --realsize also the real-size SD 1.5 folder of
benchmarks/realsize.py, random weights, the real architecture): in a fresh LOWVRAM_GEN_HOME, the planner's
estimate of the chosen candidate's step with nothing measured ("assumed"), then three jobs, then the estimate
again ("learned"), then a fourth job whose measured step neither estimate saw. The figures go to
docs/bench/learned_timing.json (or --out) and docs/benchmarks.md quotes them.

    .venv/bin/python benchmarks/learned_timing.py [--realsize] [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))


def measure(model: str, width: int, steps: int, jobs: int = 3) -> dict:
    from lowvram_gen.planning import speed
    from lowvram_gen.request import GenerationRequest
    from lowvram_gen.session import Session

    session = Session(device="cpu", outdir=tempfile.mkdtemp(prefix="learned-timing-"))

    def request(seed: int = 0) -> GenerationRequest:
        return GenerationRequest(prompt="a red fox", model=model, width=width, height=width, steps=steps, seed=seed)

    def estimate() -> dict:
        plan = session.plan(request())
        row = next(e for e in plan.estimates if e.name == plan.preset.name)
        return {"candidate": row.name, "seconds_per_step": row.est_seconds_per_step, "timing": row.timing}

    def job(seed: int) -> float:
        result = session.generate(request(seed))
        return next(a["seconds_per_step"] for a in result.attempts if a.get("seconds_per_step"))

    speed.forget()
    assumed = estimate()
    measured = [job(seed) for seed in range(jobs)]
    learned = estimate()
    held_out = job(99)
    return {"model": model, "size": f"{width}x{width}", "steps": steps, "assumed": assumed, "measured": measured,
            "learned": learned, "held_out_seconds_per_step": held_out,
            "assumed_error": assumed["seconds_per_step"] / held_out - 1,
            "learned_error": learned["seconds_per_step"] / held_out - 1}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--realsize", action="store_true", help="also the real-size SD 1.5 folder (about 2 min)")
    parser.add_argument("--out", default=str(ROOT / "docs" / "bench" / "learned_timing.json"))
    args = parser.parse_args()
    os.environ["LOWVRAM_GEN_HOME"] = tempfile.mkdtemp(prefix="learned-timing-home-")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    runs = [measure("tiny", 64, 6)]
    if args.realsize:
        import realsize

        runs.append(measure(str(realsize.build("sd15")), 256, 4))
    for r in runs:
        print(f"{Path(r['model']).name} {r['size']}: assumed {r['assumed']['seconds_per_step']:.4g} s "
              f"({r['assumed_error']:+.0%}), after 3 jobs {r['learned']['seconds_per_step']:.4g} s "
              f"({r['learned_error']:+.0%}); a 4th job measured {r['held_out_seconds_per_step']:.4g} s")
    Path(args.out).write_text(json.dumps({"machine": platform.processor() or platform.machine(),
                                          "cpu_count": os.cpu_count(), "runs": runs}, indent=1) + "\n")
    print(f"written to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
