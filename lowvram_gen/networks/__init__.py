"""LoRA and textual-inversion embeddings, used as A1111 users use them.

- `tags`: `<lora:name:weight>` in prompts and the `--lora name:weight` flag.
- `lora`: find LoRA files, load them once per pipeline as named PEFT adapters, re-weight or switch
  them off per job without touching the base weights.
- `embeddings`: textual-inversion files used by name (or `embedding:name`) in prompts.
- `metadata`: A1111's `Lora hashes` / `TI hashes` infotext fields.

Nothing here imports torch or diffusers at import time.
"""
