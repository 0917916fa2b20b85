"""One switch every loader shares: diffusers' and transformers' own loading bars off."""

from __future__ import annotations


def quiet_hub_bars() -> None:
    """diffusers/transformers draw loading bars per component; our CLI has its own progress output."""
    from diffusers.utils import logging as diffusers_logging
    from transformers.utils import logging as transformers_logging

    diffusers_logging.disable_progress_bar()
    transformers_logging.disable_progress_bar()
