"""What the console says while a job runs, as A1111's does: one line when a job of the web server starts, its steps on
a tqdm bar (`ProgressBar`, also the CLI's), one line when it ends, and one line for an ordinary user error (a refused
request, a job that failed with one of our errors).

A user error is shown to the user in the browser; the console gets its one line, not a traceback
(ui/messages.py raises such errors with gradio's `print_exception=False`). A bug (any other exception) still
prints gradio's traceback. Lines go to stderr, where the CLI prints its notes and errors; nothing is printed
on import.
"""

from __future__ import annotations

import sys
import time

PROMPT_CHARS = 60  # a prompt longer than this is shortened on the console


def say(line: str) -> None:
    print(f"lowvram-gen: {line}", file=sys.stderr, flush=True)


def shorten(text: str | None, limit: int = PROMPT_CHARS) -> str:
    """The prompt on one line, cut to `limit` characters (an ellipsis says it was cut)."""
    text = " ".join(str(text or "").split())
    return text if len(text) <= limit else text[:limit - 1] + "…"


def started(what: str, prompt: str, width, height, steps, seed, unit: str = "steps") -> float:
    """Say a job starts; the time it started, for `ended`."""
    shown = "random" if seed is None or seed == -1 else seed
    steps = "the model's default" if steps is None else steps  # a request without steps: its family's
    say(f"{what} started: {shorten(prompt)!r}, {width}x{height}, {steps} {unit}, seed {shown}")
    return time.monotonic()


def ended(what: str, since: float, how: str, files: list[str]) -> None:
    """Say a job ended: how (its summary's first line), how long it took and the files it wrote."""
    first = (how or "").strip().splitlines()[0] if (how or "").strip() else "done"
    where = ", ".join(str(f) for f in files) or "no files"
    say(f"{what} ended in {time.monotonic() - since:.1f} s: {first}; {len(files)} file(s): {where}")


def user_error(text: str) -> None:
    """An ordinary user error, on one line (the browser shows it whole)."""
    say("error: " + " ".join(str(text).split()))



class ProgressBar:
    """A tqdm bar on stderr that follows (step, total) callbacks across the chunks of a job."""

    def __init__(self, unit: str = "step"):
        self.unit = unit
        self.bar = None

    def update(self, step: int, total: int) -> None:
        """The first callback of a chunk (step 1 has just ended) starts a bar at that step: its rate is
        measured from there on, not 1 step over the microseconds since the bar was made."""
        from tqdm import tqdm

        if self.bar is None or step == 1:
            self.close()
            self.bar = tqdm(total=total, initial=step, unit=self.unit, file=sys.stderr, leave=False)
        elif step > self.bar.n:
            self.bar.update(step - self.bar.n)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None
