"""Host memory of loading a diffusers folder with and without int8/int4 (issue 17): peak RSS and the bytes
of the weights that stay, each point in a fresh process (peak_rss.py's workers).

    python benchmarks/load_rss.py /work/bench/sd15-realsize-fp16             # float32, the four ways
    python benchmarks/load_rss.py FOLDER --dtype float16 --ways none while-int8

Ways: none (full precision), post-int8 (loaded at full precision, then quantized in place: the old way),
while-int8 / while-int4 (quantized layer by layer while loading: models/loading.load). Peak RSS counts
the safetensors files' pages the load touched (file-backed, RssFile: the kernel can drop them) as well as
the process's own memory (RssAnon); both are reported, at the peak's end state and in total.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from peak_rss import run_worker, status, worker_env  # noqa: E402

WAYS = ("none", "post-int8", "while-int8", "while-int4")


def _rss_parts() -> dict[str, int]:
    return status(("RssAnon", "RssFile"))


class AnonPeak:
    """The peak of RssAnon (the process's own memory, without the file pages the load touched, which the
    kernel may drop at any time and so make VmHWM vary run to run), sampled every 20 ms on a thread."""

    def __init__(self):
        import threading

        self.peak = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(0.02):
            self.peak = max(self.peak, _rss_parts()["RssAnon"])

    def stop(self) -> int:
        self._stop.set()
        self._thread.join()
        return max(self.peak, _rss_parts()["RssAnon"])


def worker(job: dict) -> dict:
    import resource

    import torch

    from lowvram_gen.models.loading import load
    from lowvram_gen.models.quantize import quantize_module, targets
    from lowvram_gen.models.resolve import ModelSource

    torch.set_num_threads(2)
    source = ModelSource(job["folder"], "folder", Path(job["folder"]))
    way = job["way"]
    base = status()["VmRSS"]
    base_anon = _rss_parts()["RssAnon"]
    sampler = AnonPeak()
    started = time.perf_counter()
    kind = way.split("-")[1] if "-" in way else "none"
    model = load(source, job["dtype"], kind if way.startswith("while") else "none")
    if way.startswith("post"):
        for name in targets(model.pipe):
            quantize_module(getattr(model.pipe, name), kind)
    seconds = time.perf_counter() - started
    anon_peak = sampler.stop()
    resident = {name: sum(t.numel() * t.element_size() for t in [*m.parameters(), *m.buffers()])
                for name, m in model.pipe.components.items() if isinstance(m, torch.nn.Module)}
    now = status()
    return {**job, "seconds": round(seconds, 1), "base_rss": base, "peak_rss": now["VmHWM"],
            "ru_maxrss": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024, "rss_after": now["VmRSS"],
            "base_anon": base_anon, "peak_anon": anon_peak,
            **{f"{k}_after": v for k, v in _rss_parts().items()}, "resident_bytes": resident,
            "resident_total": sum(resident.values()), "torch": torch.__version__}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("folder", nargs="?")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--ways", nargs="+", default=list(WAYS), choices=WAYS)
    ap.add_argument("--timeout", type=int, default=1800)
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        print(json.dumps(worker(json.loads(args.worker))), flush=True)
        return
    gib = 2 ** 30
    for way in args.ways:
        row = run_worker(__file__, "--worker", {"folder": args.folder, "dtype": args.dtype, "way": way},
                         args.timeout, env=worker_env(SDNQ_USE_TORCH_COMPILE="0"))
        print(json.dumps(row), flush=True)
        if "error" not in row:
            print(f"# {way:11s} peak RSS {row['peak_rss'] / gib:6.2f} GiB (start {row['base_rss'] / gib:.2f}), "
                  f"peak anon {row['peak_anon'] / gib:.2f} (start {row['base_anon'] / gib:.2f}), "
                  f"after: anon {row['RssAnon_after'] / gib:.2f} file {row['RssFile_after'] / gib:.2f}; "
                  f"weights resident {row['resident_total'] / gib:.2f} GiB "
                  + ", ".join(f"{k} {v / gib:.3f}" for k, v in row["resident_bytes"].items())
                  + f"; {row['seconds']} s", flush=True)


if __name__ == "__main__":
    main()
