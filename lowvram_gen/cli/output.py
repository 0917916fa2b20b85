"""What every generating command prints after its job: the result (paths or one JSON object); its progress on
stderr is the job's tqdm bar (jobs/console.py ProgressBar)."""

from __future__ import annotations

import json
import sys


def print_result(result, as_json: bool, paths: list[str], said: list[str] = ()) -> int:
    """Warnings and the summary to stderr; stdout gets one JSON object, or one path per line.

    `said`: what the command already said on stderr before the job ran (--from-png's notes: fields of the PNG
    not used, a model that is not here); not printed again, but first in the JSON's `warnings`, since a script
    reading `--json` does not read stderr."""
    for warning in result.warnings:
        print(f"warning: {warning}", file=sys.stderr)
    print(result.summary, file=sys.stderr)
    if as_json:
        data = result.as_json()
        data["warnings"] = [*said, *(w for w in data["warnings"] if w not in said)]
        print(json.dumps(data))
    else:
        for path in paths:
            print(path)
    return 0


def run_interruptible(run, unit: str, stopping: str):
    """`run(on_step, cancel)` with a progress bar of `unit`s and Ctrl-C as A1111's Interrupt: the first stops the job
    at its next step (`stopping` says what is kept), a second quits at once. A job that ends Cancelled prints the
    files it kept, one a line, before the error goes on. The handler is only set on the main thread."""
    import signal
    import threading

    from lowvram_gen.errors import Cancelled
    from lowvram_gen.jobs.console import ProgressBar

    cancel = threading.Event()
    bar = ProgressBar(unit)

    def on_interrupt(signum, frame):
        if cancel.is_set():
            raise KeyboardInterrupt
        cancel.set()
        print(f"\nstopping at the next {unit}{stopping} (Ctrl-C again to quit now)", file=sys.stderr)

    main_thread = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGINT, on_interrupt) if main_thread else None
    try:
        return run(bar.update, cancel)
    except Cancelled as exc:
        bar.close()
        for path in exc.images:
            print(path)
        raise
    finally:
        bar.close()
        if previous is not None:
            signal.signal(signal.SIGINT, previous)
