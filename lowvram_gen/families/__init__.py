"""One home for model families: a record per family (SD 1.x, SD 2.x, SDXL, SD3, FLUX.1, PixArt ...) holding
everything the code decides by family, and the lookups that find the record for a pipeline, a short name or a
file. Follows ComfyUI's comfy/supported_models.py: one record per family, a list of them at the bottom.

    record.py     what a record holds (`Family` and its parts: `Call`, `SingleFile`, `ControlNetFacts`)
    records.py    the records, and `FAMILIES`
    keys.py       what a single file's keys say (the records' predicates)
    registry.py   lookups (`by_pipeline`, `by_name`, `by_checkpoint` ...) and `register` / `registered`
    execution.py  `task_of(pipe)`: the record and the task of a loaded pipeline object (engines, preview, prompting)
    controlnet_shapes.py  SD3's and Flux's ControlNet configs from a file's tensor shapes (the records' readers)

It sits at the bottom beside models/: it imports nothing from planning/, engines/, the session or the front ends,
and no torch or diffusers at import time. Adding a family is adding a record (and its tests).
"""

from lowvram_gen.families.record import (DEFAULT_T5_TOKENS, GENERIC_KEY, Call, ControlNetFacts, Edit, Family, Guidance,
                                         SingleFile, Task, Video, spatial_patch, transformer_shape)
from lowvram_gen.families.records import FAMILIES, FLUX1, GENERIC, PIXART_ALPHA, PIXART_SIGMA, SD3, SD15, SD21, SDXL
from lowvram_gen.families.registry import (aliases, all_families, builtin_families, builtin_names, by_arch,
                                           by_checkpoint, by_controlnet_class, by_denoiser_class, by_gguf, by_key,
                                           by_name, by_pipeline, by_single_file_pipeline, by_unet_cross_attention,
                                           controlnet_kinds, family_name, find_pipeline, of_pipe, register,
                                           registered, unregister)

__all__ = [
    "DEFAULT_T5_TOKENS", "GENERIC_KEY", "Call", "ControlNetFacts", "Edit", "Family", "Guidance", "SingleFile", "Task", "Video",
    "spatial_patch", "transformer_shape", "FAMILIES", "FLUX1", "GENERIC", "PIXART_ALPHA", "PIXART_SIGMA", "SD3",
    "SD15", "SD21", "SDXL", "aliases", "all_families", "builtin_families", "builtin_names", "by_arch",
    "by_checkpoint", "by_controlnet_class", "by_denoiser_class", "by_gguf", "by_key", "by_name", "by_pipeline",
    "by_single_file_pipeline", "by_unet_cross_attention", "controlnet_kinds", "family_name", "find_pipeline",
    "of_pipe", "register", "registered", "unregister",
]
