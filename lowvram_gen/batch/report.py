"""The batch's processes (accelerate), its progress bar and its reports (stderr; `--json` on stdout)."""

from __future__ import annotations

import json
import os
import sys
import time
from datetime import timedelta
from pathlib import Path

from lowvram_gen.batch import manifest as bm
from lowvram_gen.hardware.device import set_alloc_conf
from lowvram_gen.errors import (BadOutput, Cancelled, ClipTooBigForCard, InvalidRequest, ModelLoadError, NotEnoughRam,
                                OutOfMemoryEverywhere, OutputError, PresetError, UnwritableFolder)

COLLECTIVE_TIMEOUT_DAYS = 30  # bounds a wait for the slowest process, not a job; a dead process ends the set anyway


class Processes:
    """This process's place in an `accelerate launch` set (one process without a launcher)."""

    def __init__(self, state):
        self.state = state
        self.rank = state.process_index
        self.world = state.num_processes
        self.is_main = state.is_main_process

    @classmethod
    def start(cls, session_kwargs: dict) -> "Processes":
        """PartialState on this process's device: `cuda:LOCAL_RANK` under a launcher on GPUs (the
        Session's probe picks the same index), the CPU with --cpu, `accelerate launch --cpu` or no GPU
        (gloo between processes). Updates `session_kwargs` when the launcher asked for the CPU."""
        set_alloc_conf()  # before anything initialises CUDA
        import torch
        from accelerate import PartialState

        asked_cpu = session_kwargs.get("device") == "cpu" or os.environ.get("ACCELERATE_USE_CPU", "").lower() in (
            "1", "true", "yes")
        has_gpu = torch.cuda.is_available()
        # A process that finishes its share early waits in the final gather for the slowest one, which
        # may take hours: the default collective timeout (30 min) would abort the whole set.
        state = PartialState(cpu=asked_cpu or not has_gpu, timeout=timedelta(days=COLLECTIVE_TIMEOUT_DAYS))
        if state.device.type == "cpu" and has_gpu:
            session_kwargs["device"] = "cpu"
        return cls(state)

    def barrier(self) -> None:
        if self.world > 1:
            self.state.wait_for_everyone()

    def gather(self, obj) -> list:
        if self.world == 1:
            return [obj]
        from accelerate.utils import gather_object

        return gather_object([obj])

    def split(self, items: list) -> list:
        """A contiguous share; every process computes `items` the same way, so no job is lost or doubled."""
        with self.state.split_between_processes(items) as part:
            return list(part)

    def close(self) -> None:
        """Every process reaches here before any tears its process group down: a process that destroyed its group
        and exited while another still read from it was seen to end the set with gloo's 'terminate called without
        an active exception' (the other's connection thread)."""
        if self.world > 1 and hasattr(self.state, "destroy_process_group"):
            self.state.wait_for_everyone()
            self.state.destroy_process_group()


class JobBar:
    """Jobs done, images per minute and ETA on stderr (the main process's bar shows its own share)."""

    def __init__(self, total: int, group: Processes, all_pending: int):
        from tqdm import tqdm

        self.images = 0
        self.start = time.perf_counter()
        self.show = group.is_main
        desc = "batch" if group.world == 1 else f"process 0 of {group.world} ({all_pending} jobs in all)"
        self.bar = tqdm(total=total, unit="job", desc=desc, file=sys.stderr, dynamic_ncols=True, smoothing=0.1,
                        disable=not self.show)

    def advance(self, images: int) -> None:
        self.images += images
        minutes = (time.perf_counter() - self.start) / 60
        self.bar.set_postfix_str(f"{self.images / minutes:.1f} img/min" if minutes > 0 else "", refresh=False)
        self.bar.update(1)

    def write(self, text: str, stream) -> None:
        if self.show:
            self.bar.write(text, file=stream)
        else:
            print(text, file=stream, flush=True)

    def close(self) -> None:
        self.bar.close()


# What to do about a failure that running the job again cannot fix, by the error's class (first match wins).
_FIXES = (
    (InvalidRequest, "fix the value the error names (a field of the line, or a LoRA or embedding file to add), "
                     "then run the same command again"),
    (ModelLoadError, "fix or replace the model or LoRA file the error names (or give the line another model), "
                     "then run the same command again"),
    (ClipTooBigForCard, "the clip does not fit the card at any memory step: make it shorter or smaller as the error's "
                        "'would fit' says (or allow upscaling), then run the same command again"),
    (NotEnoughRam, "the job does not fit the system RAM: free some (close other programs), or make the line's job "
                   "smaller as the error says, then run the same command again"),
    (UnwritableFolder, "make the folder the error names writable, then run the same command again"),
    (PresetError, "fix the preset file the error names, then run the same command again"),
    (BadOutput, "the model gave NaN or black images even in float32: give the line another model, sampler or seed"),
)
# Failures that the same job may get past next time: memory that others held, a stop, a full disk.
_TRANSIENT = (OutOfMemoryEverywhere, Cancelled, OutputError, OSError, KeyboardInterrupt)


def retry_or_fix(exc: BaseException) -> str | None:
    """None when running the job again may succeed (out of memory, cancelled or interrupted, an I/O error), else
    what to fix first: a retry of an invalid request, an unknown LoRA, a model that does not load or a job that
    does not fit the RAM fails the same way, and 'run it again' would only spend another night on it."""
    for cls, fix in _FIXES:
        if isinstance(exc, cls):
            return fix
    if isinstance(exc, _TRANSIENT) or "OutOfMemory" in type(exc).__name__:
        return None
    if type(exc).__module__.startswith("lowvram_gen"):
        return "fix what the error says, then run the same command again"
    return ("an unexpected error (a bug): run the same command again with -v to see its traceback, and report it "
            "with that")


def report_lines(file: Path, joblist) -> None:
    lines = len({job.line for job in joblist.jobs})
    print(f"{file}: {len(joblist.jobs)} job(s) from {lines} line(s)"
          + (f"; {len(joblist.bad)} line(s) skipped as invalid" if joblist.bad else ""), file=sys.stderr)
    for warning in joblist.warnings:
        print(f"{file}: warning: {warning}", file=sys.stderr)
    for bad in joblist.bad:
        print(f"{file}:{bad.line}: skipped: {bad.error}", file=sys.stderr)


def _duration(seconds: float) -> str:
    seconds = int(round(seconds))
    h, rest = divmod(seconds, 3600)
    m, s = divmod(rest, 60)
    return f"{h}h{m:02d}m{s:02d}s" if h else f"{m}m{s:02d}s" if m else f"{s}s"


def print_summary(file: Path, root: Path, joblist, outcomes: list, already: int, seconds: float, world: int,
                  as_json: bool) -> int:
    done = sum(o.done for o in outcomes)
    images = sum(o.images for o in outcomes)
    failures = sorted((f for o in outcomes for f in o.failures), key=lambda f: (f["line"], f["job"]))
    work_seconds = max((o.seconds for o in outcomes), default=0.0)
    per_minute = round(images / (work_seconds / 60), 2) if work_seconds > 0 else 0.0
    warnings = list(dict.fromkeys(w for o in outcomes for w in o.warnings))
    videos = sorted((v for o in outcomes for v in getattr(o, "videos", ())), key=lambda v: (v["line"], v["job"]))
    summary = {
        "file": str(file), "outdir": str(root), "processes": world, "jobs": len(joblist.jobs),
        "already_done": already, "done": done, "failed": len(failures), "invalid": len(joblist.bad),
        "images": images, "videos": videos, "seconds": round(seconds, 3), "images_per_minute": per_minute,
        "recovered": sum(o.recovered for o in outcomes), "temp_files_removed": sum(o.temp_removed for o in outcomes),
        "moved_to_incomplete": [p for o in outcomes for p in o.moved_aside],
        "failures": failures, "invalid_lines": [{"line": b.line, "error": b.error} for b in joblist.bad],
        "warnings": warnings, "manifests": sorted(o.manifest for o in outcomes),
    }
    code = 0 if not failures and not joblist.bad else 1
    summary["ok"] = code == 0
    err = sys.stderr
    for w in warnings:
        print(f"warning: {w}", file=err)
    print(f"batch {file}: {len(joblist.jobs)} job(s): {done} done now, {already} already done, {len(failures)} failed"
          + (f"; {len(joblist.bad)} invalid line(s) skipped" if joblist.bad else "")
          + f"; {images} image(s)" + (f" and {len(videos)} clip(s)" if videos else "")
          + f" in {_duration(seconds)} ({per_minute:g} images/min)"
          + (f" on {world} processes" if world > 1 else ""), file=err)
    for v in videos:
        print(f"  clip {file}:{v['line']}: {v['video']}", file=err)
    if summary["recovered"]:
        print(f"recovered {summary['recovered']} job(s) whose images were saved just before a crash", file=err)
    if summary["moved_to_incomplete"]:
        print(f"moved {len(summary['moved_to_incomplete'])} image(s) of unfinished jobs to .incomplete/", file=err)
    for f in failures:
        print(f"  failed {file}:{f['line']}: {f['error']}", file=err)
    for b in joblist.bad:
        print(f"  skipped {file}:{b.line}: {b.error}", file=err)
    retry = [f for f in failures if not f.get("fix")]
    if retry:
        lines = ", ".join(str(n) for n in dict.fromkeys(f["line"] for f in retry))
        print(f"run the same command again to retry the failed jobs (finished ones are skipped): line(s) {lines} "
              "may succeed then", file=err)
    for line, fix in dict.fromkeys((f["line"], f["fix"]) for f in failures if f.get("fix")):
        print(f"  line {line} will fail again as it is: {fix}", file=err)  # a retry alone would fail the same way
    if joblist.bad:  # running again as it is would skip the same lines again
        print(f"fix the invalid line(s) of {file} listed above, then run the same command again "
              "(finished jobs are skipped)", file=err)
    print(f"{'images, clips' if videos else 'images'} and manifests in {root}", file=err)
    if as_json:
        print(json.dumps(summary))
    return code


def dry_run_report(file: Path, root: Path, joblist, restart: bool, as_json: bool) -> int:
    records = [] if restart else bm.read_records(bm.current_manifests(root))
    done = {r["job"] for r in records if r.get("status") == "ok"}
    rows = [{"line": j.line, "repeat": j.repeat, "job": j.key, "engine": j.engine, "seed": j.request.seed,
             "batch_size": j.request.batch_size, "prompt": j.request.prompt, "done": j.key in done,
             "frames": getattr(j.request, "frames", None)}  # a video job's (0: the model's own count); else None
            for j in joblist.jobs]
    to_do = sum(not r["done"] for r in rows)
    if as_json:
        print(json.dumps({"file": str(file), "outdir": str(root), "jobs": rows, "to_do": to_do,
                          "already_done": len(rows) - to_do, "warnings": joblist.warnings,
                          "invalid_lines": [{"line": b.line, "error": b.error} for b in joblist.bad]}))
    else:
        report_lines(file, joblist)
        for r in rows:
            seed = "random" if r["seed"] < 0 else r["seed"]
            count = r["frames"] or "the model's"
            clip = "" if r["frames"] is None else f"clip of {count} frames: "
            print(f"{'done ' if r['done'] else 'to do'}  line {r['line']:<5} seed {seed!s:<10} "
                  f"{clip}{r['prompt'][:70]}")
        print(f"{to_do} job(s) to do, {len(rows) - to_do} already done; output folder {root}", file=sys.stderr)
    return 0 if not joblist.bad else 1
