"""What every loader shares to keep the libraries' own output off our terminal."""

from __future__ import annotations

import warnings
from contextlib import contextmanager
from typing import Iterator


def quiet_hub_bars() -> None:
    """diffusers/transformers draw loading bars per component; our CLI has its own progress output."""
    from diffusers.utils import logging as diffusers_logging
    from transformers.utils import logging as transformers_logging

    diffusers_logging.disable_progress_bar()
    transformers_logging.disable_progress_bar()


@contextmanager
def libraries_silenced(*warning_messages: str) -> Iterator[None]:
    """diffusers', transformers' and peft's logging off (errors included) and Python warnings that start with
    `warning_messages` ignored, for a call whose failure we turn into one sentence of our own.

    diffusers logs a failed adapter load at ERROR level with the whole exception before it re-raises it: for a
    LoRA made for another base model that is one 'size mismatch' line per layer (97 lines for a real SDXL LoRA
    on SD 1.5) above the message that says what is wrong. transformers 5 prints a 'LOAD REPORT' that calls every
    base weight MISSING. Whatever they would say comes back to the caller as the exception or is counted by it.
    """
    import logging

    from diffusers.utils import logging as dl
    from transformers.utils import logging as tl

    saved = dl.get_verbosity(), tl.get_verbosity(), logging.getLogger("peft").level
    dl.set_verbosity(logging.CRITICAL + 1)
    tl.set_verbosity(logging.CRITICAL + 1)
    logging.getLogger("peft").setLevel(logging.CRITICAL + 1)
    try:
        with warnings.catch_warnings():
            for message in warning_messages:
                warnings.filterwarnings("ignore", message=message)
            yield
    finally:
        dl.set_verbosity(saved[0])
        tl.set_verbosity(saved[1])
        logging.getLogger("peft").setLevel(saved[2])
