"""`lowvram-gen batch FILE`: every prompt of a file, resumable, on one or several processes.

One Session per process (the model loads once); every job goes through the planner and the retry
ladder, so what one job learned about memory is where the next comparable job starts. Lines are
parsed by `batch_files`, progress is recorded by `batch_manifest`. Under `accelerate launch` each
process takes a contiguous share of the jobs still to do (`PartialState.split_between_processes`
over a list every process computes the same way), runs on its own device, writes its own manifest
and its own image folder. Nothing heavy is imported at module import time.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from lowvram_gen.batch import manifest as bm
from lowvram_gen.batch.files import MAX_REPEAT, BadLine, expand, read_entries
from lowvram_gen.batch.report import JobBar, Processes, dry_run_report, print_summary, report_lines, retry_or_fix
from lowvram_gen.errors import LowVramError
from lowvram_gen.paths import writable_folder
from lowvram_gen.prompting.styles import StylesFile
from lowvram_gen.request import MAX_SEED, GenerationRequest, as_int

log = logging.getLogger(__name__)

FORMATS_HELP = """\
prompt files:
  .txt    one prompt per line; blank lines and '#' comments are ignored; a line starting with
          '--' takes A1111 options: --prompt "a cat" --negative_prompt "blurry" --steps 30 --seed 5
          --width 768 --sampler_name "DPM++ 2M Karras" --batch_size 2 --n_iter 3 --cfg_scale 7
  .jsonl  one JSON object per line: {"prompt": "a cat", "steps": 30, "engine": "sd", "repeat": 2}
  .csv    a header row of field names (prompt,negative_prompt,seed,steps,...); empty cells = default
A line with video: true (or a frames field) makes a clip on a video model (Wan 2.1/2.2, LTX-Video), with
frames, fps, cfg_scale_2, init_image, save_frames and allow_upscale: {"prompt": "a boat", "video": true,
"model": "Wan2.1-T2V-1.3B", "frames": 33}; the manifest and the report name the clip.
A line's own values win over the options below. A bad line is reported with its number and skipped.
Finished jobs are recorded in OUTDIR/manifest.rankN.jsonl; running the same command again resumes.
"""


def add_batch_parser(sub, add_model, add_memory_flags, add_job_fields) -> None:
    p = sub.add_parser("batch", help="generate every prompt of a file (.txt, .jsonl, .csv), resumable",
                       description="Generate every prompt of a file. Loads the model once, skips bad lines, "
                                   "resumes after a crash, and splits the work over the processes of "
                                   "`accelerate launch`.",
                       epilog=FORMATS_HELP, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("file", help="prompt file: .txt, .jsonl or .csv")
    p.add_argument("--format", choices=("txt", "jsonl", "csv"), help="file format (default: from the extension)")
    g = p.add_argument_group("defaults for every job (a line's own values win)")
    add_job_fields(g, every_job=True)
    seeds = g.add_mutually_exclusive_group()
    seeds.add_argument("--seed", metavar="N", help="the seed of every job without its own (default -1: random)")
    seeds.add_argument("--seed-start", metavar="N",
                       help="jobs without their own seed get N, N+1, ... in file order (reproducible variations)")
    g.add_argument("--repeat", default="1", metavar="N", help="jobs per line, for variations (default 1)")
    add_model(p)
    o = p.add_argument_group("batch")
    o.add_argument("--outdir", metavar="DIR", help="output folder and its manifests (default outputs/batch-<file name>)")
    o.add_argument("--restart", action="store_true", help="ignore what the manifests say is done and start over "
                                                           "(old manifests are kept as manifest.rankN.jsonl.<time>)")
    o.add_argument("--dry-run", action="store_true", help="list the jobs and what is done; load no model")
    o.add_argument("--json", action="store_true", help="print one JSON summary to stdout at the end")
    add_memory_flags(p)


@dataclass
class Outcome:
    """What one process did; the main process adds them up."""

    rank: int = 0
    done: int = 0
    images: int = 0
    videos: list = field(default_factory=list)  # the clips it made: {line, job, video (relative to the folder)}
    seconds: float = 0.0
    failures: list = field(default_factory=list)
    recovered: int = 0
    temp_removed: int = 0
    moved_aside: list = field(default_factory=list)
    warnings: list = field(default_factory=list)
    manifest: str = ""


def run_batch_command(args, session_kwargs: dict) -> int:
    names = ("negative_prompt", "width", "height", "steps", "cfg_scale", "batch_size", "sampler", "schedule_type",
             "clip_skip", "subseed", "subseed_strength", "seed_resize_from", "seed", "model", "config", "vae", "rng",
             "ensd", "unipc_variant", "unipc_skip_type", "unipc_order", "unipc_lower_order_final", "tiling",
             "styles", "refiner", "refiner_switch_at", "filename_pattern")
    defaults = {n: getattr(args, n) for n in names if getattr(args, n, None) is not None}
    GenerationRequest.from_mapping(defaults)  # a bad --width is exit 2 before anything is read or loaded
    repeat = as_int("--repeat", args.repeat, 1, MAX_REPEAT)
    seed_start = as_int("--seed-start", args.seed_start, 0, MAX_SEED) if args.seed_start is not None else None
    file = Path(args.file)
    outdir = Path(args.outdir) if args.outdir else Path("outputs") / f"batch-{file.stem or 'prompts'}"
    return run_batch(file, outdir, defaults, session_kwargs, fmt=args.format, repeat=repeat, seed_start=seed_start,
                     restart=args.restart, as_json=args.json, dry_run=args.dry_run)


def run_batch(file: Path, outdir: Path, defaults: dict, session_kwargs: dict, *, fmt=None, repeat=1,
              seed_start=None, restart=False, as_json=False, dry_run=False, session=None) -> int:
    joblist = expand(read_entries(file, fmt), defaults, repeat, seed_start,
                     StylesFile(session_kwargs.get("styles_file")))
    root = outdir.expanduser().resolve()
    if dry_run:
        return dry_run_report(file, root, joblist, restart, as_json)

    writable_folder(root, "the batch's output folder (--outdir)")  # before any process or model starts
    group = Processes.start(session_kwargs)
    agree_on_jobs(joblist, group)
    started = time.perf_counter()
    if group.is_main:
        report_lines(file, joblist)
        if restart and root.is_dir():
            bm.archive_manifests(root)
    group.barrier()  # nobody opens a manifest before --restart has put the old ones aside

    manifest = bm.Manifest(root, group.rank)
    outcome = Outcome(rank=group.rank, manifest=str(manifest.path))
    try:
        records = bm.read_records(bm.current_manifests(root))
        archived = bm.read_records(sorted(root.glob(bm.ARCHIVE_GLOB)))
        referenced = bm.referenced_paths(root, records + archived)
        done, gone = bm.done_jobs(root, records)
        for key, missing in gone.items():
            print(f"batch: {file}: job {key} was done, but {', '.join(missing)} no longer exist(s); "
                  "generating it again", file=sys.stderr)
        jobs = {job.key: job for job in joblist.jobs}
        folder = bm.image_folder(root, group.rank, group.world)
        mine = [folder]
        if group.is_main:  # folders of an earlier run with another process count
            owned = {bm.image_folder(root, r, group.world) for r in range(group.world)}
            mine += [f for f in bm.candidate_folders(root) if f not in owned]
        adopted, outcome.temp_removed, outcome.moved_aside = bm.sweep(
            root, mine, referenced, {} if restart else jobs, done, rank=group.rank, file=file)
        for record in adopted:
            manifest.append(record)
        outcome.recovered = len(adopted)

        all_done = set().union(*group.gather(done))
        pending = [job for job in joblist.jobs if job.key not in all_done]
        share = group.split(pending)
        _run_jobs(share, group, manifest, root, folder, referenced, outcome, session_kwargs, session, file,
                  as_json, total=len(pending))
    finally:
        manifest.close()
    outcomes = group.gather(outcome)
    code = 0
    if group.is_main:
        code = print_summary(file, root, joblist, outcomes, len(joblist.jobs) - len(pending),
                             time.perf_counter() - started, group.world, as_json)
    group.close()
    return code


def agree_on_jobs(joblist, group) -> None:
    """Keep only the jobs every process has: the processes split one list, each computing it itself, and a line
    naming a LoRA that one machine's models folder lacks is invalid there only. Without this the shares would
    not line up, and jobs would be lost or made twice (docs/FAULTS.md 28). Such a line is reported as invalid
    everywhere, the machine that lacks the file having said which."""
    if group.world == 1:
        return
    everywhere = set.intersection(*group.gather({job.key for job in joblist.jobs}))
    missing = sorted({job.line for job in joblist.jobs if job.key not in everywhere})
    if not missing:
        return
    joblist.jobs = [job for job in joblist.jobs if job.key in everywhere]
    for line in missing:
        joblist.bad.append(BadLine(line, "invalid on another process of this launch (a LoRA or embedding missing "
                                         "from its models folder?); its report names the problem"))
    joblist.bad.sort(key=lambda bad: bad.line)


def _run_jobs(share, group, manifest, root, folder, referenced, outcome, session_kwargs, session, file, as_json,
              total) -> None:
    import dataclasses

    if not share:
        return
    if session is None:
        from lowvram_gen.session import Session

        session = Session(**session_kwargs)
    bar = JobBar(len(share), group, total)
    loop_start = time.perf_counter()
    try:
        for job in share:
            request = dataclasses.replace(job.request, outdir=str(folder))
            try:
                result = ENGINE_RUNNERS[job.engine](session, request)
            except LowVramError as exc:
                error, fix = str(exc), retry_or_fix(exc)
            except Exception as exc:  # noqa: BLE001 - one broken job must not end a night's batch
                error, fix = f"{type(exc).__name__}: {exc}", retry_or_fix(exc)
                log.info("job on line %d failed", job.line, exc_info=True)
            else:
                outputs = bm.outputs_of(result)
                record = bm.make_record(job, root, "ok", outputs, seeds=result.seeds, preset=result.preset,
                                        attempts=result.attempts, seconds=result.seconds, rank=group.rank, file=file,
                                        video=getattr(result, "video", None))
                manifest.append(record)  # only now is the job done
                referenced.update(os.path.normpath(p) for p in outputs)
                outcome.done += 1
                outcome.images += len(result.images)
                if getattr(result, "video", None):
                    outcome.videos.append({"line": job.line, "job": job.key, "video": record["video"]})
                outcome.warnings.extend(w for w in result.warnings if w not in outcome.warnings)
                if not as_json:
                    for path in result.images or [result.video]:
                        bar.write(path, sys.stdout)
                bar.advance(len(result.images))
                continue
            _, _, moved = bm.sweep(root, [folder], referenced, {job.key: job}, set(), only_job=job.key)
            manifest.append(bm.make_record(job, root, "failed", [], error=error, rank=group.rank, file=file,
                                           incomplete=moved))
            referenced.update(os.path.normpath(p) for p in moved)
            outcome.failures.append({"line": job.line, "job": job.key, "error": error, "rank": group.rank,
                                     "retry": fix is None, "fix": fix})
            bar.write(f"{file}:{job.line}: failed: {error}", sys.stderr)
            bar.advance(0)
    finally:
        bar.close()
        outcome.seconds = round(time.perf_counter() - loop_start, 3)


def _run_sd(session, request):
    return session.generate(request)


def _run_vqgan(session, request):

    return session.generate_vqgan(request)


# engine name -> runner(session, request) -> GenerationResult (VqganResult for 'vqgan', a subclass; a clip's for
# 'video': Session.generate runs a request with frames through the video engine)
ENGINE_RUNNERS = {"sd": _run_sd, "vqgan": _run_vqgan, "video": _run_sd}
