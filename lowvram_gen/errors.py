"""User-facing errors.

Every error here carries a message meant to be shown to a person as it is: it names the bad value
and says what is allowed or what to do. Front ends turn them into clean exits (CLI: exit code 2),
`gr.Error` messages (UI) or skipped-and-reported lines (batch). Anything that is not a
`LowVramError` is a bug and keeps its traceback.
"""

from __future__ import annotations


class LowVramError(Exception):
    """Base class: an expected failure with a message for the user."""

    exit_code = 1


class InvalidRequest(LowVramError, ValueError):
    """A request field is out of range or of the wrong type; raised before any model work."""

    exit_code = 2

    def __init__(self, field: str, value: object, allowed: str):
        self.field, self.value, self.allowed = field, value, allowed
        shown = repr(value)
        if len(shown) > 80:
            shown = shown[:77] + "..."
        super().__init__(f"invalid {field}: {shown}; {allowed}")


class ModelLoadError(LowVramError):
    """A model spec could not be resolved or loaded (missing file, offline hub id, bad layout)."""

    exit_code = 2


class UnsafeCheckpoint(ModelLoadError):
    """A pickle-based checkpoint that would run code (or import non-tensor objects) on load."""


class PresetError(LowVramError):
    """A preset file has an unknown key, a wrong type or an impossible combination."""

    exit_code = 2


class Cancelled(LowVramError):
    """The user cancelled a running job; images finished before the cancel are kept."""

    exit_code = 130

    def __init__(self, message: str = "cancelled by the user", images: list | None = None):
        super().__init__(message)
        self.images = images or []


class OutputError(LowVramError):
    """An image could not be written (read-only folder, disk full); earlier images are intact."""


class UnwritableFolder(OutputError):
    """A folder the app must write in (the output folder, LOWVRAM_GEN_HOME) is a file, read-only or not
    creatable: found before any model work, so it is bad input (exit 2)."""

    exit_code = 2


class BadOutput(LowVramError):
    """The model produced NaN/Inf or an all-black image even in float32."""


class NotEnoughRam(LowVramError):
    """The job's plan does not fit the machine's system RAM (or its cgroup's limit): refused before
    loading, since the kernel's OOM killer would end the process with nothing said."""

    exit_code = 2


class OutOfMemoryEverywhere(LowVramError):
    """Every step of the retry ladder ran out of memory. `attempts` lists what was tried."""

    def __init__(self, message: str, attempts: list | None = None):
        super().__init__(message)
        self.attempts = attempts or []


class ClipTooBigForCard(OutOfMemoryEverywhere):
    """A clip the plan refuses for the card before anything loads (no rung fits its frames at its size): trying again
    fails the same way; the message says what would fit (FAULTS 37: never a silently shorter or smaller clip)."""
