"""The batch manifest: what is done, written so that a SIGKILL at any moment loses nothing.

Layout of an output folder (one per batch; `--outdir`):

    manifest.rank0.jsonl      one JSON record per finished job of process 0 (append-only)
    manifest.rank1.jsonl      ... of process 1 under `accelerate launch`
    00000-5-a-cat.png         images (one process), or rank0/, rank1/ ... (several processes)

Order of writes for a job: every image is written atomically (`outputs.save_png`: temp file,
fsync, link), then one record is appended with a single `write` on an O_APPEND descriptor and
fsync'ed. So after a kill:

* before the record: the job is not done and runs again. Its images already on disk carry the
  job's key in their metadata (`extra.batch_job`); at the next start a complete set is adopted (a
  record is written for it, nothing is generated twice) and an incomplete one is moved to
  `.incomplete/`, so no image stays in the results without a record;
* during the record: a torn last line is cut off at the next start (and its images adopted);
* stale ``.*.tmp`` files of `save_png` are removed at the next start.

A video job's clip is written the same way (video_out.py), then its JSON sidecar, which names the job: a clip
whose sidecar was written is adopted as a done job; a failed job's clip (with its sidecar and frames) goes to
`.incomplete/`.

Each process holds an exclusive lock (flock) on its own manifest while it runs, so the same batch
started twice on one folder stops with a clear message instead of doing everything twice.
"""

from __future__ import annotations

import json
import logging
import os
import re
import time
from collections import defaultdict
from pathlib import Path

from lowvram_gen import safe_json
from lowvram_gen.batch.files import BatchError, Job
from lowvram_gen.outputs import TEMP_NAME, read_png_metadata

log = logging.getLogger(__name__)
MANIFEST_GLOB = "manifest.rank*.jsonl"
ARCHIVE_GLOB = "manifest.rank*.jsonl.*"  # older manifests put aside by --restart
INCOMPLETE = ".incomplete"
VERSION = 1
SIDECAR_LIMIT = 4 * 2**20  # bytes: a clip's sidecar is a few kB (its frames' names, the request); larger is not one


def manifest_path(root: Path, rank: int) -> Path:
    return root / f"manifest.rank{rank}.jsonl"


def image_folder(root: Path, rank: int, world: int) -> Path:
    """Where a process saves: the folder itself with one process, `rankN/` with several, so two
    processes never write into the same folder (and never race for a file name)."""
    return root if world == 1 else root / f"rank{rank}"


def candidate_folders(root: Path) -> list[Path]:
    """Every folder a batch in `root` may have written images into, whatever its process count."""
    found = [root]
    if root.is_dir():
        found += sorted(p for p in root.iterdir() if p.is_dir() and re.fullmatch(r"rank\d+", p.name))
    return found


class Manifest:
    """This process's manifest: locked, repaired and opened for appending."""

    def __init__(self, root: Path, rank: int):
        self.root = root
        self.path = manifest_path(root, rank)
        root.mkdir(parents=True, exist_ok=True)
        self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_APPEND, 0o666)
        try:
            _lock(self.fd, self.path)
            self.repaired = _cut_torn_tail(self.fd)
        except BaseException:
            os.close(self.fd)
            raise

    def append(self, record: dict) -> None:
        data = (json.dumps(record, ensure_ascii=False, default=str) + "\n").encode("utf-8")
        view = memoryview(data)
        while view:  # one write in practice; a short write continues where it stopped
            view = view[os.write(self.fd, view):]
        os.fsync(self.fd)

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)  # releases the lock
            self.fd = -1


def _lock(fd: int, path: Path) -> None:
    try:
        import fcntl
    except ImportError:  # Windows: no advisory lock; running one batch twice is then up to the user
        return
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        raise BatchError(f"another batch is running on {path.parent} ({path.name} is locked); wait for it to "
                         f"finish, or choose another --outdir") from None


def _cut_torn_tail(fd: int) -> bool:
    """A record cut by a kill is dropped (its images are adopted by `sweep`); True if one was."""
    size = os.fstat(fd).st_size
    if size == 0:
        return False
    os.lseek(fd, max(0, size - 1), os.SEEK_SET)
    if os.read(fd, 1) == b"\n":
        return False
    keep, pos = 0, size
    while pos > 0:  # find the last newline, reading backwards in blocks
        step = min(65536, pos)
        pos -= step
        os.lseek(fd, pos, os.SEEK_SET)
        block = os.read(fd, step)
        i = block.rfind(b"\n")
        if i >= 0:
            keep = pos + i + 1
            break
    os.ftruncate(fd, keep)
    return True


def read_records(paths) -> list[dict]:
    """The records of the manifests at `paths`; a line that is not one of ours (a torn line of a manifest another
    process is still writing, a hand-edited record with outputs that are not a list of paths) is left out, and
    said once."""
    records, damaged, first = [], 0, ""
    for path in paths:
        try:
            text = Path(path).read_text(encoding="utf-8", errors="replace")
        except OSError:
            continue
        for number, line in enumerate(text.splitlines(), 1):
            try:
                record = safe_json.loads(line, what=f"line {number} of {path}")
            except safe_json.BadJson as exc:
                if exc.kind == "invalid":
                    continue  # a torn line of a manifest that another process is still writing
                record = None  # nested too deep, too large, NaN: no torn line is that, it was written so
                first = first or str(exc)
            if _valid(record):
                records.append(record)
            elif line.strip():
                damaged += 1
    if damaged:
        log.warning("left out %d damaged manifest record(s) in %s (their jobs run again, unless their images "
                    "are found)%s", damaged, ", ".join(str(p) for p in paths), f"; {first}" if first else "")
    return records


def _valid(record) -> bool:
    if not isinstance(record, dict) or not isinstance(record.get("job"), str):
        return False
    lists = [record.get(k) for k in ("outputs", "incomplete") if record.get(k) is not None]
    return all(isinstance(v, list) and all(isinstance(p, str) for p in v) for v in lists)


def done_jobs(root: Path, records: list[dict]) -> tuple[set[str], dict[str, list[str]]]:
    """The jobs an ok record marks done whose images are all still there, and {job: its missing images} for
    those whose images were deleted since: those run again."""
    done, gone = set(), {}
    for record in records:
        if record.get("status") != "ok":
            continue
        missing = [rel for rel in record.get("outputs") or [] if not (root / rel).is_file()]
        if missing:
            gone[record["job"]] = missing
        else:
            done.add(record["job"])
    return done - set(gone), gone


def current_manifests(root: Path) -> list[Path]:
    return sorted(root.glob(MANIFEST_GLOB))


def archive_manifests(root: Path) -> list[Path]:
    """--restart: put every manifest aside (``manifest.rank0.jsonl.<time>``), keep the images."""
    stamp = time.strftime("%Y%m%d-%H%M%S")
    moved = []
    for path in current_manifests(root):
        fd = os.open(path, os.O_RDONLY)
        try:
            _lock(fd, path)  # never pull the manifest from under a batch that is still running
            target = path.with_name(f"{path.name}.{stamp}")
            n = 1
            while target.exists():
                target = path.with_name(f"{path.name}.{stamp}-{n}")
                n += 1
            os.replace(path, target)
        finally:
            os.close(fd)
        moved.append(target)
    return moved


def referenced_paths(root: Path, records: list[dict]) -> set[str]:
    refs = set()
    for record in records:
        for rel in record.get("outputs") or []:
            refs.add(os.path.normpath(os.path.join(root, rel)))
        for rel in record.get("incomplete") or []:
            refs.add(os.path.normpath(os.path.join(root, rel)))
    return refs


def sweep(root: Path, folders: list[Path], referenced: set[str], jobs: dict[str, Job], done: set[str],
          only_job: str | None = None, rank: int = 0, file=None) -> tuple[list[dict], int, list[str]]:
    """Tidy up after a kill in `folders` (each owned by this process): remove stale temp files,
    adopt complete unrecorded jobs, move incomplete ones to `.incomplete/`.

    Returns (records to append for adopted jobs, temp files removed, paths moved aside). Only
    images whose metadata names a job of this prompt file are touched; a user's own files are not.
    """
    removed = 0
    found: dict[str, list[tuple[Path, dict]]] = defaultdict(list)
    clips: dict[str, tuple[Path, list[Path], dict]] = {}  # a video job's key -> its clip, frames and meta
    for folder in folders:
        try:
            entries = list(os.scandir(folder))
        except OSError:
            continue
        for entry in entries:
            if not entry.is_file(follow_symlinks=False):
                continue
            if only_job is None and TEMP_NAME.match(entry.name):
                try:
                    os.unlink(entry.path)
                    removed += 1
                except OSError:
                    pass
                continue
            if entry.name.startswith("."):
                continue
            if entry.name.lower().endswith(".json"):  # a clip's sidecar (video_out.py): a video job's
                clip = _clip_of_sidecar(Path(entry.path), referenced)
                if clip is not None and clip[0] in jobs and (only_job is None or clip[0] == only_job):
                    clips[clip[0]] = clip[1:]
                continue
            if not entry.name.lower().endswith(".png"):
                continue
            if os.path.normpath(entry.path) in referenced:
                continue
            try:
                _, meta = read_png_metadata(entry.path)
            except Exception:  # noqa: BLE001 - an unreadable or foreign file is not ours to judge
                continue
            request = (meta or {}).get("request") or {}
            key = (request.get("extra") or {}).get("batch_job") if isinstance(request, dict) else None
            if key in jobs and (only_job is None or key == only_job):
                found[key].append((Path(entry.path), meta))
    adopted, moved = [], []
    for key, items in sorted(found.items()):
        job = jobs[key]
        seeds = [m.get("seed") for _, m in items]
        expected = getattr(job.request, "image_count", job.request.batch_size)  # SD: batch count x batch size
        complete = (only_job is None and key not in done and len(items) == expected
                    and len(set(seeds)) == len(seeds))
        if complete:
            items.sort(key=lambda item: item[0].name)
            last = items[-1][1]
            adopted.append(make_record(job, root, "ok", [p for p, _ in items], seeds=[m.get("seed") for _, m in items],
                                       preset=last.get("preset"), attempts=last.get("attempts") or [],
                                       rank=rank, file=file, adopted=True))
            done.add(key)
        else:
            for path, _ in items:
                moved.append(_move_aside(path))
    for key, (clip, frames, meta) in sorted(clips.items()):
        if only_job is None and key not in done:  # the clip and its sidecar were saved: the job is done
            adopted.append(make_record(jobs[key], root, "ok", [clip, *frames], seeds=[meta.get("seed")],
                                       preset=meta.get("preset"), attempts=meta.get("attempts") or [], rank=rank,
                                       file=file, adopted=True, video=clip))
            done.add(key)
        else:  # a failed job's clip, or a second clip of a done job: out of the results
            from lowvram_gen.video_out import frames_folder, sidecar_path

            moved += [_move_aside(path) for path in (clip, sidecar_path(clip), frames_folder(clip)) if path.exists()]
    for record in adopted:
        referenced.update(os.path.normpath(os.path.join(root, rel)) for rel in record["outputs"])
    return adopted, removed, moved


def _clip_of_sidecar(path: Path, referenced: set[str]) -> tuple[str, Path, list[Path], dict] | None:
    """(job key, clip, frames, meta) of a clip's JSON sidecar that names a batch job and whose clip is there and
    recorded by no manifest; None for any other JSON file (a user's own, one that cannot be read)."""
    try:
        if path.stat().st_size > SIDECAR_LIMIT:
            return None
        data = safe_json.loads(path.read_bytes(), what=str(path))
    except (OSError, safe_json.BadJson):
        return None
    if not isinstance(data, dict) or not isinstance(data.get("file"), str) or not isinstance(data.get("meta"), dict):
        return None
    meta = data["meta"]
    request = meta.get("request") if isinstance(meta.get("request"), dict) else {}
    key = (request.get("extra") or {}).get("batch_job") if isinstance(request.get("extra"), dict) else None
    clip = path.parent / Path(data["file"]).name
    if not isinstance(key, str) or not clip.is_file() or os.path.normpath(clip) in referenced:
        return None
    from lowvram_gen.video_out import frames_folder

    folder = frames_folder(clip)
    names = data.get("frames") if isinstance(data.get("frames"), list) else []
    frames = [folder / Path(name).name for name in names  # its own frames' folder only
              if isinstance(name, str) and Path(name).parent.name == folder.name
              and (folder / Path(name).name).is_file()]
    return key, clip, frames, meta


def _move_aside(path: Path) -> str:
    target_dir = path.parent / INCOMPLETE
    target_dir.mkdir(exist_ok=True)
    target = target_dir / path.name
    n = 1
    while target.exists():
        target = target_dir / f"{path.stem}-{n}{path.suffix}"
        n += 1
    os.replace(path, target)
    return str(target)


def outputs_of(result) -> list[str]:
    """The files a finished job made: its images, or its clip and the clip's frames (save_frames)."""
    video = getattr(result, "video", None)
    return [video, *(getattr(result, "frames", None) or [])] if video else list(result.images)


def make_record(job: Job, root: Path, status: str, outputs, *, seeds=None, preset=None, attempts=None,
                seconds=None, error=None, rank=0, file=None, adopted=False, incomplete=None, video=None) -> dict:
    record = {
        "v": VERSION, "job": job.key, "request_hash": job.request_hash, "line": job.line, "repeat": job.repeat,
        "engine": job.engine, "status": status, "prompt": job.request.prompt[:200],
        "seeds": list(seeds or []), "outputs": [os.path.relpath(p, root) for p in outputs],
        "preset": preset, "attempts": attempts or [], "seconds": seconds, "error": error, "rank": rank,
        "finished": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }
    if file is not None:
        record["file"] = str(file)
    if video:  # a video job: its clip (also the first of `outputs`, which are checked on resume)
        record["video"] = os.path.relpath(video, root)
    if adopted:
        record["adopted"] = True
    if incomplete:
        record["incomplete"] = [os.path.relpath(p, root) for p in incomplete]
    return record
