"""Host (system RAM) peaks of a real-size job under a hard memory limit (issue 17).

Issue 17: a real-size SDXL job was killed by the kernel's OOM killer on a 12 GiB machine with nothing
printed, while plain diffusers in bfloat16 fit. This harness runs each cell -- (model, memory limit,
mode) -- in its own cgroup v1 memory cgroup with that limit, cold (page cache dropped first), and
records how it ended (ok / refused / killed / timeout / error), the child's peak RSS, the cgroup's
peak usage (which counts page cache too) and, when `plan` knows `--ram`, what the planner predicted
for the preset it picks.

    sudo python benchmarks/host_peaks.py [--models sd15,sdxl,flux] [--limits 8,12,16]
        [--modes default,int8,int4,diffusers-fp32,diffusers-bf16] [--timeout S] [--markdown]

Modes: `default` is our CLI with the planner's own pick, `int8`/`int4` add `--quantize`, and
`diffusers-fp32`/`diffusers-bf16` are plain `AutoPipelineForText2Image.from_pretrained` plus one 512 px
step in a worker of this script. The models are benchmarks/realsize.py's random-weight folders (built
on first use under $LOWVRAM_GEN_BENCH); `flux` is FLUX.1-dev in bf16 with its transformer cut to 2 + 4
blocks and the real T5-XXL, run at 256 px (SIZES) so that a CPU step stays short -- `plan` is asked for
the same size and the same folder, so its profile has the cut depth. Results merge into
docs/bench/host_peaks.json, one record per cell with the git commit it measured; `--markdown` prints the
table for docs/benchmarks.md (alone, it prints the stored results without running anything).

Each cell runs from a fresh wrapper process (this script with `--_cell`) that sits outside the cgroup
and puts only the child into it (a preexec_fn writing the child's pid into cgroup.procs), so the
wrapper's getrusage(RUSAGE_CHILDREN).ru_maxrss is the child's peak; /proc/PID/status is also polled
for VmHWM and the anonymous/file split. Needs root and the cgroup v1 memory controller.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this checkout's lowvram_gen, not an installed one
from peak_rss import run_worker, status  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "docs" / "bench" / "host_peaks.json"
CGROOT = Path("/sys/fs/cgroup/memory")
GiB = 1 << 30
MODELS = ("sd15", "sdxl", "flux", "z-image", "flux2-klein", "qwen-image", "chroma", "lumina2",
          "cogview4", "sana", "hidream", "flux2-dev")  # from z-image on: realsize_families.py
MODES = ("default", "int8", "int4", "diffusers-fp32", "diffusers-bf16")
PROMPT = "a red fox"
SIZE = 512
# Per-model image side: the cut Flux's CPU step at 512 px would take minutes of the 2 cores; 256 px keeps it
# short, and the plan is asked for the same size.
SIZES = {"flux": 256}


def size_of(model: str) -> int:
    return SIZES.get(model, SIZE)


def cell_key(model: str, limit_gib: int, mode: str, steps: int = 1) -> str:
    return f"{model}-{limit_gib}g-{mode}" + (f"-{steps}steps" if steps != 1 else "")


def preflight() -> str | None:
    """Why the harness cannot run here, or None."""
    if os.geteuid() != 0:
        return "needs root (it creates memory cgroups and drops the page cache)"
    if not (CGROOT / "memory.limit_in_bytes").is_file() or not (CGROOT / "cgroup.procs").is_file():
        return f"no cgroup v1 memory controller at {CGROOT} (cgroup v2-only hosts are not supported)"
    return None


def git_commit() -> str:
    try:
        out = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True, text=True, check=True)
        dirty = subprocess.run(["git", "-C", str(ROOT), "status", "--porcelain", "--", "lowvram_gen", "presets"],
                               capture_output=True, text=True).stdout.strip()
        return out.stdout.strip() + ("-dirty" if dirty else "")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


# --- the child commands -------------------------------------------------------------------------

def child_command(model_dir: str, mode: str, outdir: str, size: int = SIZE, steps: int = 1) -> list[str]:
    if mode.startswith("diffusers-"):
        return [sys.executable, str(Path(__file__).resolve()), "--_diffusers",
                json.dumps({"folder": model_dir, "dtype": mode.split("-", 1)[1], "size": size})]
    # `-m lowvram_gen` (the package's __main__): lowvram_gen/cli/main.py has no __main__ guard, so
    # `-m lowvram_gen.cli.main` imports it and exits 0 without doing anything.
    cmd = [sys.executable, "-m", "lowvram_gen", "generate", PROMPT, "--model", model_dir, "--width", str(size),
           "--height", str(size), "--steps", str(steps), "--json", "--outdir", outdir]
    if mode in ("int8", "int4"):
        cmd += ["--quantize", mode]
    return cmd


def diffusers_worker(job: dict) -> None:
    """Plain diffusers: load the folder in `dtype`, one step at `size` (512 px), print one JSON line."""
    import torch
    from diffusers import AutoPipelineForText2Image

    dtype = {"fp32": torch.float32, "bf16": torch.bfloat16}[job["dtype"]]
    t0 = time.perf_counter()
    pipe = AutoPipelineForText2Image.from_pretrained(job["folder"], torch_dtype=dtype)
    t1 = time.perf_counter()
    with torch.inference_mode():
        size = job.get("size", SIZE)
        pipe(PROMPT, width=size, height=size, num_inference_steps=1, generator=torch.Generator().manual_seed(0))
    print(json.dumps({"load_s": round(t1 - t0, 1), "run_s": round(time.perf_counter() - t1, 1)}), flush=True)


# --- one cell, in a fresh wrapper process --------------------------------------------------------

def _write(path: Path, value: str) -> bool:
    try:
        path.write_text(value)
        return True
    except OSError:
        return False


def _read_cg(cg: Path, name: str) -> str:
    try:
        return (cg / name).read_text()
    except OSError:
        return ""


def _cg_stat(cg: Path) -> dict[str, int]:
    out = {}
    for line in _read_cg(cg, "memory.stat").splitlines():
        key, _, value = line.partition(" ")
        if key in ("total_cache", "total_rss", "total_mapped_file"):
            out[key] = int(value)
    return out


def _read_bytes(pid: int) -> int:
    """Bytes the process has caused to be fetched from storage (/proc/PID/io read_bytes): the pages a job
    reads from disk, again and again when its weights' pages are dropped (the +disk rung)."""
    try:
        with open(f"/proc/{pid}/io") as f:
            for line in f:
                if line.startswith("read_bytes:"):
                    return int(line.split()[1])
    except (OSError, ValueError):
        pass
    return 0


def _trace(trace: list, seconds: float, st: dict, err) -> None:
    """One row of a cell's memory timeline: where the anonymous memory goes through load, encode, steps and decode
    (what the peak alone does not say). A row is kept when anonymous or file memory moved by 16 MiB or the child
    printed a new stderr line (the pipeline's progress bars and warnings mark its phases)."""
    fd = err.fileno()  # pread: the child shares the file's offset, which a read would move
    size = os.fstat(fd).st_size
    tail = os.pread(fd, 4096, max(0, size - 4096)).decode("utf-8", "replace")
    lines = [ln for ln in tail.replace("\r", "\n").splitlines() if ln.strip()]
    row = [round(seconds, 1), st.get("RssAnon", 0) >> 20, st.get("RssFile", 0) >> 20, lines[-1][-80:] if lines else ""]
    last = trace[-1] if trace else None
    if last is None or abs(row[1] - last[1]) >= 16 or abs(row[2] - last[2]) >= 16 or row[3] != last[3]:
        trace.append(row)


def run_cell(job: dict) -> dict:
    """Create the cgroup, run the child in it, measure, remove the cgroup."""
    cg = CGROOT / f"lowvram-bench-{job['cell']}"
    if cg.exists():
        cg.rmdir()  # a leftover from an interrupted run (empty, or this fails loudly)
    cg.mkdir()
    limit = job["limit_gib"] * GiB
    rec: dict = {}
    try:
        if not _write(cg / "memory.limit_in_bytes", str(limit)):
            raise SystemExit(f"cannot set {cg}/memory.limit_in_bytes")
        rec["memsw_limited"] = _write(cg / "memory.memsw.limit_in_bytes", str(limit))
        # sync first: dirty pages (a folder just built) survive drop_caches and stay charged to the cgroup
        # that wrote them, so the child's file pages would not count here and its RSS would exceed the
        # cgroup's usage
        os.sync()
        rec["cache_dropped"] = _write(Path("/proc/sys/vm/drop_caches"), "3")
        procs = str(cg / "cgroup.procs")

        def enter_cgroup() -> None:  # in the child, before exec
            os.setsid()  # its own process group, so a timeout kills any grandchildren too
            with open(procs, "w") as f:
                f.write(str(os.getpid()))

        env = dict(os.environ, OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", str(os.cpu_count() or 1)),
                   PYTHONPATH=os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p))
        with tempfile.TemporaryDirectory(prefix="host-peaks-") as outdir, \
                tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
            t0 = time.monotonic()
            proc = subprocess.Popen(child_command(job["folder"], job["mode"], outdir, job.get("size", SIZE),
                                                  job.get("steps", 1)),
                                    cwd=str(ROOT), env=env,
                                    stdout=out, stderr=err, stdin=subprocess.DEVNULL, preexec_fn=enter_cgroup)
            hwm = anon = file_ = cache = read = 0
            timed_out = False
            trace: list = []  # --trace: [seconds, anon MiB, file MiB, the child's last stderr line] at each change
            while proc.poll() is None:
                st = status(("VmHWM", "VmRSS", "RssAnon", "RssFile"), proc.pid)
                if job.get("trace"):
                    _trace(trace, time.monotonic() - t0, st, err)
                read = max(read, _read_bytes(proc.pid))
                hwm = max(hwm, st.get("VmHWM", 0))
                anon = max(anon, st.get("RssAnon", 0))
                file_ = max(file_, st.get("RssFile", 0))
                cache = max(cache, _cg_stat(cg).get("total_cache", 0))
                if time.monotonic() - t0 > job["timeout"]:
                    timed_out = True
                    os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait()
                    break
                time.sleep(0.25)
            seconds = time.monotonic() - t0
            rc = proc.returncode
            out.seek(0)
            err.seek(0)
            stdout, stderr = out.read(), err.read()
        ru = resource.getrusage(resource.RUSAGE_CHILDREN)
        oom_kill = 0
        for line in _read_cg(cg, "memory.oom_control").splitlines():
            if line.startswith("oom_kill "):
                oom_kill = int(line.split()[1])
        killed = not timed_out and (rc == -signal.SIGKILL or oom_kill > 0)
        result = None
        for line in stdout.splitlines()[::-1]:
            if line.startswith("{"):
                try:
                    result = json.loads(line)
                    break
                except ValueError:
                    pass
        if timed_out:
            outcome = "timeout"
        elif killed:
            outcome = "killed"
        elif rc == 2 and stderr.strip():
            outcome = "refused"
        elif rc == 0 and result is not None:
            outcome = "ok"
        else:
            outcome = "error"
        rec.update(
            outcome=outcome, exit_code=rc, killed=killed, oom_kill=oom_kill, timed_out=timed_out,
            seconds=round(seconds, 1),
            peak_rss_bytes=ru.ru_maxrss * 1024,  # the child's (and any descendant's) VmHWM, from the kernel
            polled_vmhwm_bytes=hwm, polled_rss_anon_max_bytes=anon, polled_rss_file_max_bytes=file_,
            cgroup_max_usage_bytes=int(_read_cg(cg, "memory.max_usage_in_bytes") or 0),
            cgroup_failcnt=int(_read_cg(cg, "memory.failcnt") or 0),
            polled_cgroup_cache_max_bytes=cache,
            polled_read_bytes=read,  # bytes the child read from storage (/proc/PID/io), to the last poll
            stderr_tail=[ln for ln in stderr.splitlines() if ln.strip()][-6:],
        )
        if job.get("trace"):
            rec["trace"] = trace
        if result is not None:
            rec["child_result"] = {k: result[k] for k in ("preset", "load_s", "run_s", "seconds", "dtype", "quantize")
                                   if k in result}
    finally:
        for _ in range(50):  # the kernel frees a killed task's memory asynchronously
            try:
                cg.rmdir()
                break
            except OSError:
                time.sleep(0.2)
    return rec


# --- the plan's prediction -----------------------------------------------------------------------

def plan_supports_ram() -> bool:
    out = subprocess.run([sys.executable, "-m", "lowvram_gen", "plan", "--help"], cwd=str(ROOT),
                         capture_output=True, text=True)
    return "--ram" in out.stdout


def plan_host_peak(folder: str, limit_gib: int, mode: str, size: int = SIZE, env: dict | None = None) -> dict:
    """`plan --ram` for the cell: the chosen preset's host_peak_bytes (the same quantize and size as the run;
    `env`: what the run was told of the CPU, LOWVRAM_GEN_CPU_BF16)."""
    cmd = [sys.executable, "-m", "lowvram_gen", "plan", "--model", folder, "--width", str(size), "--height",
           str(size), "--ram", f"{limit_gib}GiB", "--json"]
    if mode in ("int8", "int4"):
        cmd += ["--quantize", mode]  # only if plan has it; otherwise the pick of the default mode
    proc = subprocess.run(cmd, cwd=str(ROOT), capture_output=True, text=True, timeout=600,
                          env={**os.environ, **(env or {})})
    if proc.returncode != 0 and "--quantize" in cmd and "unrecognized arguments" in proc.stderr:
        return plan_host_peak(folder, limit_gib, "default", size, env) | {"plan_quantize_ignored": True}
    try:
        plan = json.loads(proc.stdout)
    except ValueError:
        return {"plan_error": f"rc {proc.returncode}: {proc.stderr.strip()[-300:]}"}
    row = next((p for p in plan.get("presets", []) if p.get("name") == plan.get("preset")), None)
    if row is None:
        return {"plan_preset": plan.get("preset"), "plan_error": "no presets[] row for the chosen preset"}
    host = row.get("host") or {}
    from lowvram_gen.models.profile import profile_from_folder  # noqa: PLC0415 (this checkout's, as `plan` ran it)

    return {"plan_preset": row["name"], "plan_host_peak_bytes": row.get("host_peak_bytes"),
            "plan_rss_peak_bytes": host.get("rss_peak_bytes"), "plan_fits_host": row.get("fits_host"),
            "plan_mapped_bytes": host.get("mapped_bytes", 0), "plan_paged_bytes": host.get("paged_bytes", 0),
            # what the planner read of the folder: tests replan the cell from it (the folder is not kept)
            "plan_profile": profile_from_folder(folder).as_dict()}


# --- driver --------------------------------------------------------------------------------------

def load_results() -> dict:
    if RESULTS.is_file():
        return json.loads(RESULTS.read_text())
    return {"about": "host_peaks.py: host RAM peaks of one 512 px, 1-step job under a cgroup v1 memory limit "
                     "(issue 17); models are benchmarks/realsize.py's random-weight fp16 folders",
            "cells": {}}


def save_results(data: dict, keys: list[str] | None = None) -> None:
    """Write `data`; with `keys`, only those cells over what the file holds now (another run may have added
    cells since this one loaded it)."""
    from lowvram_gen.paths import write_atomically  # noqa: PLC0415 (the project's atomic writer)

    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    if keys is not None:
        data = {**load_results(), "cells": {**load_results()["cells"], **{k: data["cells"][k] for k in keys}}}
    data["cells"] = dict(sorted(data["cells"].items()))
    write_atomically(RESULTS, json.dumps(data, indent=1) + "\n")


def order(cells: list[tuple[str, int, str]]) -> list[tuple[str, int, str]]:
    """Cheap first: the small model, then the tight limits; within one, the float32 runs (at a tight limit
    they die early in the load), then the quantizing ones (minutes of quantizing on a CPU), plain diffusers
    in bfloat16 last (CPU bfloat16 kernels are slow: an SD 1.5 step takes minutes, an SDXL step may hit
    --timeout, which still leaves the peak of the load)."""
    mode_rank = {"diffusers-fp32": 0, "default": 1, "int8": 2, "int4": 3, "diffusers-bf16": 4}
    return sorted(cells, key=lambda c: (MODELS.index(c[0]), c[1], mode_rank.get(c[2], 9)))


def gib(v) -> str:
    return "" if v in (None, 0) else f"{v / GiB:.2f}"


# File pages of the interpreter and the libraries (torch, diffusers ...) in every run's RSS: measured 0.30 GiB
# before any weight is read (RssFile of the CLI process with torch imported); part of the planner's BASELINE
LIB_FILE_PAGES = int(0.30 * GiB)
WORKING_SET = 512 * 1024**2  # planning/host.py's PAGED_WORKING_SET, which a +disk plan adds in place of its weights


def markdown(data: dict, keys: list[str] | None = None) -> str:
    """Two comparisons per cell. What must fit: the anonymous peak (polled every 0.25 s) plus the
    libraries' file pages, against the plan's host_peak_bytes: the kernel cannot drop that memory, and it is
    what the planner compares with the RAM. Peak RSS (VmHWM) against the plan's rss_peak_bytes: RSS also
    counts the safetensors pages a load or a step touched, clean file pages the kernel drops before it kills,
    so where the cgroup's peak reached its limit the kernel trimmed them and the measured RSS is lower."""
    rows = ["| model | px | limit | mode | plan's pick | outcome | commit | anon + libs GiB | plan must-fit GiB | error % "
            "| peak RSS GiB | plan RSS GiB | error % | cgroup max GiB |",
            "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    cells = data["cells"]
    wanted = [k for k in (keys or cells) if k in cells and cells[k].get("steps", 1) == 1]
    wanted.sort(key=lambda k: (MODELS.index(cells[k]["model"]), cells[k]["limit_gib"], MODES.index(cells[k]["mode"])))

    def err(plan, measured, c):
        return f"{(plan - measured) / measured * 100:+.0f}" if plan and measured and c.get("outcome") == "ok" else ""

    def must_err(must, held, c):
        """What must fit against what was held. Weights kept as their files' pages are counted as must-fit by a
        plan that does not page them (a forward would read dropped pages back from disk), but are not anonymous:
        compare the peak RSS instead, marked. A +disk plan counts a working set of pages instead of them: compare
        without it, marked."""
        if c.get("plan_paged_bytes") and must:
            return err(must - WORKING_SET, held, c) + " (less the working set)" if held else ""
        if c.get("plan_mapped_bytes", 0) > 0.25 * (must or 1) and c.get("peak_rss_bytes"):
            return err(must, c["peak_rss_bytes"], c) + " (mapped: vs RSS)"
        return err(must, held, c)

    for k in wanted:
        c = cells[k]
        anon = c.get("polled_rss_anon_max_bytes")
        held = anon + LIB_FILE_PAGES if anon else None
        must, plan_rss, peak = c.get("plan_host_peak_bytes"), c.get("plan_rss_peak_bytes"), c.get("peak_rss_bytes")
        outcome = c.get("outcome", "?") + (f" (rc {c.get('exit_code')})" if c.get("outcome") == "error" else "")
        pick = c.get("plan_preset", "") if c["mode"] in ("default", "int8", "int4") else "(plain diffusers)"
        ran = (c.get("child_result") or {}).get("preset")
        if ran and pick and ran != pick and c["mode"] == "default":  # planned by a later planner: not comparable
            pick, must, plan_rss = f"{pick} (ran {ran})", None, None
        elif c.get("outcome") == "refused" and c.get("plan_fits_host"):  # refused by the planner of its commit
            pick, must, plan_rss = f"{pick} (refused then)", None, None
        rows.append(f"| {c['model']} | {c.get('size', SIZE)} | {c['limit_gib']} GiB | {c['mode']} | {pick} | "
                    f"{outcome} | "
                    f"{str(c.get('commit', ''))[:7]} | {gib(held)} | "
                    f"{gib(must)} | {must_err(must, held, c)} | {gib(peak)} | {gib(plan_rss)} | {err(plan_rss, peak, c)} | "
                    f"{gib(c.get('cgroup_max_usage_bytes'))} |")
    return "\n".join(rows)


def steps_markdown(data: dict) -> str:
    """The cells run with --steps N beside the 1-step cells of the same model, limit and mode: the job's
    seconds (the CLI's own figure, load included) and the bytes it read from storage, so that (N - 1) steps
    show what a step costs when its weights' pages do not all stay (the +disk rung rereads them)."""
    cells = data["cells"]
    multi = sorted((k for k, c in cells.items() if c.get("steps", 1) > 1),
                   key=lambda k: (MODELS.index(cells[k]["model"]), cells[k]["limit_gib"]))
    if not multi:
        return ""
    rows = ["| model | limit | plan's pick | steps | outcome | commit | job seconds | read from disk GB | "
            "per extra step: seconds, GB read |", "|---|---|---|---|---|---|---|---|---|"]
    for k in multi:
        c = cells[k]
        one = cells.get(cell_key(c["model"], c["limit_gib"], c["mode"]))
        for cell in ([one] if one else []) + [c]:
            secs = (cell.get("child_result") or {}).get("seconds")
            read = cell.get("polled_read_bytes")
            extra = ""
            if cell is c and one and secs and (one.get("child_result") or {}).get("seconds") and read \
                    and one.get("polled_read_bytes"):
                n = c["steps"] - 1
                extra = (f"{(secs - one['child_result']['seconds']) / n:.1f} s, "
                         f"{(read - one['polled_read_bytes']) / n / 1e9:.2f} GB")
            rows.append(f"| {cell['model']} | {cell['limit_gib']} GiB | {cell.get('plan_preset', '')} | "
                        f"{cell.get('steps', 1)} | {cell.get('outcome', '?')} | {str(cell.get('commit', ''))[:7]} | "
                        f"{secs if secs is not None else ''} | {'' if not read else f'{read / 1e9:.1f}'} | {extra} |")
    return "\n".join(rows)


def replan(data: dict) -> None:
    """The plan's figures of every stored cell again, with this checkout's planner (the measurements stay:
    the estimate changed, not what ran). A cell keyed "...@COMMIT" is a "before" record kept with the plan of
    the code that ran it (what that planner picked is its point), and is not replanned."""
    for key, c in data["cells"].items():
        if c["mode"] in ("default", "int8", "int4") and c.get("folder") and Path(c["folder"]).is_dir() \
                and "@" not in key:  # (a folder since deleted keeps the figures planned while it was there)
            c.update(plan_host_peak(c["folder"], c["limit_gib"], c["mode"], c.get("size", SIZE), c.get("env")))
            c["planned_at_commit"] = git_commit()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", default="sd15,sdxl")
    ap.add_argument("--limits", default="8,12,16", help="GiB, comma-separated")
    ap.add_argument("--modes", default=",".join(MODES))
    ap.add_argument("--timeout", type=int, default=1200, help="seconds per cell before it is killed (default 1200)")
    ap.add_argument("--steps", type=int, default=1,
                    help="denoising steps per job (default 1; more show what a step costs that rereads its weights)")
    ap.add_argument("--markdown", action="store_true", help="print the table (alone: of the stored results)")
    ap.add_argument("--replan", action="store_true",
                    help="recompute the plan's figures of the stored cells with this checkout (runs no job)")
    ap.add_argument("--trace", action="store_true",
                    help="keep each cell's memory timeline (anonymous / file MiB against the child's stderr)")
    ap.add_argument("--_cell", help=argparse.SUPPRESS)
    ap.add_argument("--_diffusers", help=argparse.SUPPRESS)
    args, rest = ap.parse_known_args(argv)
    if args._diffusers:
        diffusers_worker(json.loads(args._diffusers))
        return 0
    if args._cell:
        print(json.dumps({**json.loads(args._cell), **run_cell(json.loads(args._cell))}), flush=True)
        return 0
    if rest:
        ap.error(f"unrecognized arguments: {' '.join(rest)}")
    explicit = [a for a in (argv if argv is not None else sys.argv[1:]) if a.split("=")[0] in
                ("--models", "--limits", "--modes")]
    if args.replan:
        data = load_results()
        replan(data)
        save_results(data)
    if (args.markdown or args.replan) and not explicit:
        if args.markdown:
            print(markdown(load_results()))
            extra = steps_markdown(load_results())
            print(f"\n{extra}" if extra else "", end="")
        return 0
    models = [m for m in args.models.split(",") if m]
    modes = [m for m in args.modes.split(",") if m]
    bad = [m for m in models if m not in MODELS] + [m for m in modes if m not in MODES]
    if bad:
        ap.error(f"unknown model/mode: {', '.join(bad)}")
    limits = [int(x) for x in args.limits.split(",") if x]
    why = preflight()
    if why:
        print(f"host_peaks: skipped: {why}", file=sys.stderr)
        return 0
    import realsize
    import realsize_families

    folders = {m: str((realsize_families if m in realsize_families.KEYS else realsize).build(m)) for m in models}
    commit = git_commit()
    with_plan = plan_supports_ram()
    if not with_plan:
        print("host_peaks: `plan --help` has no --ram: no plan host peaks recorded", file=sys.stderr)
    data = load_results()
    done = []
    for model, limit_gib, mode in order([(m, lim, md) for m in models for lim in limits for md in modes]):
        key = cell_key(model, limit_gib, mode, args.steps)
        job = {"cell": key, "model": model, "limit_gib": limit_gib, "mode": mode, "folder": folders[model],
               "size": size_of(model), "timeout": args.timeout, "steps": args.steps, "trace": args.trace}
        print(f"host_peaks: {key} ...", file=sys.stderr, flush=True)
        rec = run_worker(__file__, "--_cell", job, timeout=args.timeout + 300)
        rec.pop("timeout", None)
        if "error" in rec:  # the wrapper itself failed (run_worker's record)
            rec["outcome"] = "error"
        rec.update(commit=commit, measured_at=time.strftime("%Y-%m-%dT%H:%M:%S%z"))
        if os.environ.get("LOWVRAM_GEN_CPU_BF16"):  # what the planner was told of this CPU (README)
            rec["env"] = {"LOWVRAM_GEN_CPU_BF16": os.environ["LOWVRAM_GEN_CPU_BF16"]}
        if with_plan:
            try:
                rec.update(plan_host_peak(folders[model], limit_gib, mode, size_of(model)))
            except (OSError, subprocess.SubprocessError) as exc:
                rec["plan_error"] = str(exc)
        data["cells"][key] = rec
        save_results(data, [key])
        done.append(key)
        print(f"host_peaks: {key}: {rec.get('outcome', rec.get('error'))}, peak RSS {gib(rec.get('peak_rss_bytes'))} GiB,"
              f" cgroup max {gib(rec.get('cgroup_max_usage_bytes'))} GiB, {rec.get('seconds')} s", file=sys.stderr,
              flush=True)
    if args.markdown:
        print(markdown(data, done))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
