"""What a diffusers folder's model_index.json says, for the loaders of folders and of GGUF files."""

from __future__ import annotations

from pathlib import Path

from lowvram_gen import safe_json


def absent_components(folder) -> dict:
    """`{name: None}` for every component model_index.json lists as [null, null].

    A folder saved without a component (SD3 without its T5 encoder, `text_encoder_3=None`, as the
    diffusers docs suggest for small cards) names it null; diffusers skips it when loading but then
    refuses the pipeline unless the caller passes that None again, or the component is optional.
    """
    try:
        index = safe_json.load_file(Path(folder) / "model_index.json")
    except (OSError, ValueError):
        return {}  # diffusers reports the unreadable folder itself
    return {name: None for name, value in index.items()
            if not name.startswith("_") and isinstance(value, list) and value and all(v is None for v in value)}
