"""The ControlNets a job uses, on the loaded pipeline: `controlnet0`, `controlnet1`, ... in unit order.

engines/sd/controlnet.py puts them there; they are not diffusers components, so what applies the memory
settings (engines/sd/apply.py), quantizes (models/quantize.py) and reloads (models/loading.py) names them by
these slots. No imports: every layer may read them.
"""

from __future__ import annotations

import re

SLOT = re.compile(r"controlnet(\d+)")


def attached(pipe) -> dict:
    """{slot: module} of the ControlNets on `pipe`, in unit order."""
    slots = {k: v for k, v in vars(pipe).items() if SLOT.fullmatch(k) and v is not None}
    return dict(sorted(slots.items(), key=lambda kv: int(SLOT.fullmatch(kv[0]).group(1))))
