"""A1111's UniPC settings (uni_pc_variant, uni_pc_skip_type, uni_pc_order, uni_pc_lower_order_final): their values,
defaults and checks, read by the request, the API's settings and the fronts. Standard library only.

bh1 and bh2 are diffusers' UniPC solver_type; A1111's third variant, vary_coeff (the paper's UniPC with varying
coefficients), is built in a1111/unipc_vary.py.
"""

from __future__ import annotations

from typing import Any

from lowvram_gen.errors import InvalidRequest

VARIANTS = ("bh1", "bh2", "vary_coeff")  # B(h) = h, B(h) = e^h - 1 (diffusers' solver_type), varying coefficients
SKIP_TYPES = ("time_uniform", "time_quadratic", "logSNR")
MAX_ORDER = 50  # A1111's slider
# request field -> (A1111's setting, its default)
SETTINGS = {"unipc_variant": ("uni_pc_variant", "bh1"), "unipc_skip_type": ("uni_pc_skip_type", "time_uniform"),
            "unipc_order": ("uni_pc_order", 3), "unipc_lower_order_final": ("uni_pc_lower_order_final", True)}
DEFAULTS = {name: default for name, (_, default) in SETTINGS.items()}


def check_variant(value: Any) -> str:
    text = str(value).strip()
    if text not in VARIANTS:
        raise InvalidRequest("UniPC variant", value, "one of bh1, bh2, vary_coeff (A1111's uni_pc_variant)")
    return text


def check_skip_type(value: Any) -> str:
    text = str(value).strip()
    match = {t.lower(): t for t in SKIP_TYPES}.get(text.lower())
    if match is None:
        raise InvalidRequest("UniPC skip type", value, "one of time_uniform, time_quadratic, logSNR")
    return match


def check_order(value: Any) -> int:
    try:
        number = int(str(value).strip())
    except ValueError:
        number = None
    if number is None or isinstance(value, bool) or not 1 <= number <= MAX_ORDER:
        raise InvalidRequest("UniPC order", value, f"a whole number from 1 to {MAX_ORDER} (A1111's uni_pc_order)")
    return number
