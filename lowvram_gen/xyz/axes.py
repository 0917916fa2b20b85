"""The X/Y/Z plot's axes: A1111's names, in A1111's list order (its API's `script_args` give an axis by its index in
that list, which differs between txt2img and img2img), and ours that no other front end has: Preset, VRAM budget and
Quantize, after A1111's (where its extensions add theirs).

An axis is a record: its label, the kind of its values (whole numbers, numbers, text, orderings), how a value goes
into a cell (a field of the request replaced, or the cell's VRAM budget), the choices a dropdown offers, its cost
(A1111's: the costliest axis is run in the outer loop, so a model is loaded once per value) and whether it is built.
An A1111 axis that is not built here is refused in one sentence naming it and what is built. Standard library and
the request only: no model, no torch.
"""

from __future__ import annotations

import dataclasses
import random
from dataclasses import dataclass
from itertools import permutations
from pathlib import Path
from typing import Any, Callable

from lowvram_gen.a1111.fields import label
from lowvram_gen.errors import InvalidRequest
from lowvram_gen.request import MAX_SEED, GenerationRequest
from lowvram_gen.xyz.values import float_values, int_values, split_csv

INT, FLOAT, TEXT, ORDER = "int", "float", "text", "order"
BOTH, TXT2IMG, IMG2IMG = "both", "txt2img", "img2img"


@dataclass(frozen=True)
class Cell:
    """One cell's job: the request, and the VRAM budget it runs under (None: the session's own; 0: no cap)."""

    request: GenerationRequest
    vram_budget: int | None = None
    labels: tuple[str, ...] = ()  # the axis values that made it, as the legends say them (x, y, z)


Apply = Callable[[Cell, Any, list], Cell]


@dataclass(frozen=True)
class Axis:
    label: str
    kind: str = TEXT
    apply: Apply | None = None  # None: not built here (refused in one sentence)
    tab: str = BOTH  # the A1111 tab whose list has it: both, txt2img, img2img
    cost: float = 0.0
    choices: Callable[[], list[str]] | None = None
    with_label: bool = True  # the legend says "Label: value" (A1111's format_value_add_label), else the value alone
    ours: bool = False  # one of lowvram-gen's own axes (no A1111 anchor)

    @property
    def built(self) -> bool:
        return self.apply is not None

    def values(self, text: str) -> list:
        """The axis's values from its box's text (values.py's syntax), converted to its kind; Seed and Var. seed keep
        -1 here (the grid resolves each once)."""
        items = split_csv(text)
        if not items and self.label != "Nothing":
            raise InvalidRequest(f"{self.label} values", text, "give at least one value" + self._allowed())
        if self.kind == INT:
            return int_values(self.label, items)
        if self.kind == FLOAT:
            return float_values(self.label, items)
        if self.kind == ORDER:
            return [tuple(p) for p in permutations(items)]
        return items

    def _allowed(self) -> str:
        if self.choices is None:
            return ""
        try:
            shown = self.choices()
        except Exception:  # a listing that cannot be read (a missing folder) must not hide the first error
            return ""
        return f" (one of: {', '.join(shown[:20])}{', ...' if len(shown) > 20 else ''})" if shown else ""

    def legend(self, value: Any) -> str:
        """The legend of one value, as A1111 draws it."""
        if isinstance(value, float):
            value = round(value, 8)
            value = int(value) if value.is_integer() and self.kind == FLOAT else value
        if self.kind == ORDER:
            return ", ".join(value)
        if self.label == "Checkpoint name":
            return Path(str(value)).name
        if self.label == "Nothing":
            return ""
        return f"{self.label}: {value}" if self.with_label else str(value)


def field(name: str) -> Apply:
    def apply(cell: Cell, value, values) -> Cell:
        return dataclasses.replace(cell, request=dataclasses.replace(cell.request, **{name: value}))

    return apply


def _prompt_sr(cell: Cell, value: str, values: list) -> Cell:
    """A1111's Prompt S/R: the first value is searched in the prompt and the negative prompt, each value replaces it."""
    r, find = cell.request, values[0]
    if find not in r.prompt and find not in r.negative_prompt:
        raise InvalidRequest("Prompt S/R value", find, "the first value is what each value replaces: it must be in "
                                                       "the prompt or the negative prompt")
    return dataclasses.replace(cell, request=dataclasses.replace(
        r, prompt=r.prompt.replace(find, value), negative_prompt=r.negative_prompt.replace(find, value)))


def _prompt_order(cell: Cell, value: tuple, values: list) -> Cell:
    """A1111's Prompt order: the values (each in the prompt) put back in this order where they were found."""
    prompt = cell.request.prompt
    missing = [v for v in value if v not in prompt]
    if missing:
        raise InvalidRequest("Prompt order value", missing[0], "each value must be in the prompt")
    found = sorted((prompt.find(v), v) for v in value)
    parts, rest = [], prompt
    for _, token in found:
        at = rest.find(token)
        parts.append(rest[:at])
        rest = rest[at + len(token):]
    text = "".join(part + value[i] for i, part in enumerate(parts)) + rest
    return dataclasses.replace(cell, request=dataclasses.replace(cell.request, prompt=text))


def _denoising(cell: Cell, value: float, values: list) -> Cell:
    """A1111's Denoising: img2img's strength; txt2img's is hires fix's (its denoising_strength is the second pass's)."""
    name = "strength" if cell.request.init_image else "hires_denoise"
    return field(name)(cell, value, values)


def _styles(cell: Cell, value: str, values: list) -> Cell:
    """A1111's Styles: the value's styles (comma-separated names) added to the request's; whether they exist is the
    session's styles file's to say (runner.check_styles, before the first cell)."""
    added = tuple(s.strip() for s in value.split(",") if s.strip())
    styles = tuple(cell.request.styles or ())
    return dataclasses.replace(cell, request=dataclasses.replace(
        cell.request, styles=styles + tuple(s for s in added if s not in styles)))


def _quantize(cell: Cell, value: str, values: list) -> Cell:
    """Ours: the weights' storage (none, int8, int4; auto: as the preset says)."""
    text = value.strip().lower()
    return field("quantize")(cell, None if text in ("auto", "") else text, values)


def _vram_budget(cell: Cell, value: str, values: list) -> Cell:
    """Ours: the VRAM budget the cell runs under (as --vram-budget: 4GB, 6GiB; none or 0: no cap)."""
    from lowvram_gen.hardware.bytesize import parse_size

    text = str(value).strip().lower()
    return dataclasses.replace(cell, vram_budget=0 if text in ("none", "0", "no cap", "") else
                               parse_size(value, "VRAM budget value"))


def _preset(cell: Cell, value: str, values: list) -> Cell:
    """Ours: start at this preset (auto: the planner decides), as --preset."""
    from lowvram_gen.presets import find_preset

    text = value.strip()
    if text.lower() in ("auto", ""):
        return field("preset")(cell, None, values)
    find_preset(text)  # a wrong name is named here, before any cell
    return field("preset")(cell, text, values)


def _sampler_names() -> list[str]:
    from lowvram_gen.samplers import SAMPLERS

    return list(SAMPLERS)


def _schedule_names() -> list[str]:
    from lowvram_gen.schedules import SCHEDULE_TYPES

    return [label for _, (label, _config) in SCHEDULE_TYPES.items()]


def _upscaler_names() -> list[str]:
    from lowvram_gen.a1111.upscaler_names import BUILTIN

    return list(BUILTIN)


def _preset_names() -> list[str]:
    from lowvram_gen.presets import load_presets

    return ["auto", *load_presets()]


def _vae_names() -> list[str]:
    from lowvram_gen.models import vae

    return ["Automatic", "None", *vae.available()]


def _checkpoint_names() -> list[str]:
    from lowvram_gen.models.discover import model_choices

    return list(model_choices())


def _style_names() -> list[str]:
    """The styles of A1111's place (styles.csv where the app runs; a session's --styles-file is checked per grid)."""
    from lowvram_gen.prompting.styles import StylesFile

    return StylesFile().book().names


def _nothing(cell: Cell, value, values) -> Cell:
    return cell


# A1111's axis_options, in its order (txt2img's list: those of BOTH and TXT2IMG; img2img's: BOTH and IMG2IMG)
A1111_AXES: tuple[Axis, ...] = (
    Axis("Nothing", TEXT, _nothing),
    Axis("Seed", INT, field("seed")),
    Axis("Var. seed", INT, field("subseed")),
    Axis("Var. strength", FLOAT, field("subseed_strength")),
    Axis("Steps", INT, field("steps")),
    Axis(label("hires_steps"), INT, field("hires_steps"), tab=TXT2IMG),
    Axis("CFG Scale", FLOAT, field("cfg_scale")),
    Axis("Image CFG Scale", FLOAT, tab=IMG2IMG),
    Axis("Prompt S/R", TEXT, _prompt_sr, with_label=False),
    Axis("Prompt order", ORDER, _prompt_order),
    Axis("Sampler", TEXT, field("sampler"), tab=TXT2IMG, with_label=False, choices=_sampler_names),
    Axis("Hires sampler", TEXT, field("hires_sampler"), tab=TXT2IMG, choices=_sampler_names),
    Axis("Sampler", TEXT, field("sampler"), tab=IMG2IMG, with_label=False, choices=_sampler_names),
    Axis("Checkpoint name", TEXT, field("model"), cost=1.0, choices=_checkpoint_names),
    Axis("Negative Guidance minimum sigma", FLOAT),
    Axis("Sigma Churn", FLOAT),
    Axis("Sigma min", FLOAT),
    Axis("Sigma max", FLOAT),
    Axis("Sigma noise", FLOAT),
    Axis("Schedule type", TEXT, field("schedule_type"), choices=_schedule_names),
    Axis("Schedule min sigma", FLOAT),
    Axis("Schedule max sigma", FLOAT),
    Axis("Schedule rho", FLOAT),
    Axis("Eta", FLOAT),
    Axis("Clip skip", INT, field("clip_skip")),
    Axis("Denoising", FLOAT, _denoising),
    Axis("Initial noise multiplier", FLOAT),
    Axis("Extra noise", FLOAT),
    Axis(label("hires_upscaler"), TEXT, field("hires_upscaler"), tab=TXT2IMG, choices=_upscaler_names),
    Axis("Cond. Image Mask Weight", FLOAT, tab=IMG2IMG),
    Axis("VAE", TEXT, field("vae"), cost=0.7, choices=_vae_names),
    Axis("Styles", TEXT, _styles, choices=_style_names),
    Axis("UniPC Order", INT, field("unipc_order"), cost=0.5),
    Axis("Face restore", TEXT),
    Axis("Token merging ratio", FLOAT),
    Axis("Token merging ratio high-res", FLOAT),
    Axis("Always discard next-to-last sigma", TEXT),
    Axis("SGM noise multiplier", TEXT),
    Axis("Refiner checkpoint", TEXT),
    Axis("Refiner switch at", FLOAT),
    Axis("RNG source", TEXT, field("rng"), choices=lambda: ["GPU", "CPU", "NV"]),
)

# ours: memory settings side by side (each cell labelled with its s/step and peak memory)
OUR_AXES: tuple[Axis, ...] = (
    Axis("Preset", TEXT, _preset, cost=0.6, choices=_preset_names, ours=True),
    Axis("VRAM budget", TEXT, _vram_budget, cost=0.6, ours=True),
    Axis("Quantize", TEXT, _quantize, cost=0.9, choices=lambda: ["auto", "none", "int8", "int4"], ours=True),
)

MEMORY_AXES = {a.label for a in OUR_AXES}


def axes_for(tab: str) -> list[Axis]:
    """The axes of a tab (txt2img or img2img) in A1111's order, ours after: what the API's index counts."""
    return [a for a in A1111_AXES if a.tab in (BOTH, tab)] + list(OUR_AXES)


def built_labels(tab: str) -> list[str]:
    return [a.label for a in axes_for(tab) if a.built]


def find_axis(name: Any, tab: str = TXT2IMG, which: str = "X") -> Axis:
    """An axis by its label (any case, spaces as they come) or by its index in the tab's list (A1111's API sends the
    index); an unknown one or one not built here is an error naming it and the axes that are."""
    listed = axes_for(tab)
    allowed = f"the {tab} axes are: " + ", ".join(built_labels(tab))
    if isinstance(name, bool):
        raise InvalidRequest(f"{which} type", name, allowed)
    if isinstance(name, int) or (isinstance(name, str) and name.strip().isdigit()):
        index = int(name)
        if not 0 <= index < len(listed):
            raise InvalidRequest(f"{which} type", name, f"an index from 0 to {len(listed) - 1}, or a name; " + allowed)
        axis = listed[index]
    else:
        key = " ".join(str(name).split()).lower()
        axis = next((a for a in listed if a.label.lower() == key), None)
        if axis is None:
            other = next((a for a in A1111_AXES if a.label.lower() == key), None)
            if other is not None:
                raise InvalidRequest(f"{which} type", name, f"A1111 has it on its {other.tab} tab only; " + allowed)
            raise InvalidRequest(f"{which} type", name, allowed)
    if not axis.built:
        raise InvalidRequest(f"{which} type", axis.label, "that A1111 axis is not built in lowvram-gen; " + allowed)
    return axis


def resolve_seeds(axis: Axis, values: list) -> list:
    """A1111's rule: a Seed or Var. seed value of -1 (or empty) is drawn once, here, so each of its cells shares it."""
    if axis.label not in ("Seed", "Var. seed"):
        return values
    return [random.SystemRandom().randrange(0, MAX_SEED + 1) if v in (None, "", -1) else v for v in values]
