"""Real-size video folders with seeded random weights, for the GPU runs of issue 33 (and the host-memory ones).

`build(name, dest)` writes an ordinary diffusers folder for a shipped video config (lowvram_gen/configs/<name>:
`wan21-t2v-1.3b`, `wan22-ti2v-5b`, ...): the transformer(s) and the VAE at their real architectures in bfloat16
(as the published folders store them), the scheduler config as published, and the text encoder at its real width
but `text_layers` layers and the offline tokenizer's vocabulary (benchmarks/realsize.t5_tokenizer): the transformer
reads only the encoder's last hidden states (4096 wide for umT5-XXL), so the denoiser and decode move and compute
their real bytes while the folder stays small to build. The weights are random (realsize._component: normal, std
0.02), so the frames are noise.

    python benchmarks/realsize_video.py wan21-t2v-1.3b [DEST]    # -> DEST or $LOWVRAM_GEN_BENCH/<name>-realsize-bf16
"""

from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from realsize import CONFIGS, _component, t5_tokenizer  # noqa: E402

DENOISERS = ("transformer", "transformer_2")


def folder(name: str) -> Path:
    root = os.environ.get("LOWVRAM_GEN_BENCH") or Path.home() / ".cache" / "lowvram-gen" / "bench"
    return Path(root) / f"{name}-realsize-bf16"


def build(name: str, dest: Path | None = None, text_layers: int = 1, overrides: dict | None = None) -> Path:
    """The folder for the shipped config `name`, built if it is not there yet. `overrides`: {component: {key: value}}
    laid over a component's config (a test's fewer layers)."""
    src = CONFIGS / name
    if not (src / "model_index.json").exists():
        raise SystemExit(f"no shipped config {name!r} in {CONFIGS}")
    dest = Path(dest) if dest else folder(name)
    if (dest / "model_index.json").exists():
        return dest
    overrides = overrides or {}
    index = json.loads((src / "model_index.json").read_text())
    work = dest.with_name(dest.name + ".partial")
    shutil.rmtree(work, ignore_errors=True)
    for seed, component in enumerate((*DENOISERS, "vae")):
        entry = index.get(component)
        if not entry or entry[1] is None:
            continue
        config = {**json.loads((src / component / "config.json").read_text()), **overrides.get(component, {})}
        model = _component("diffusers", entry[1], config, seed, "bfloat16")
        model.save_pretrained(work / component, safe_serialization=True)
        del model
        print(f"built {name}/{component}", file=sys.stderr, flush=True)
    tokenizer = t5_tokenizer()
    tokenizer.save_pretrained(work / "tokenizer")
    te_class = index["text_encoder"][1]
    config = json.loads((src / "text_encoder" / "config.json").read_text())
    config.update(num_layers=text_layers, num_decoder_layers=text_layers, vocab_size=len(tokenizer),
                  **overrides.get("text_encoder", {}))
    encoder = _component("transformers", te_class, config, 9, "bfloat16")
    encoder.save_pretrained(work / "text_encoder", safe_serialization=True)
    del encoder
    for component, entry in index.items():  # the scheduler, and any other config-only component (processors)
        if isinstance(entry, list) and entry[1] and component not in (*DENOISERS, "vae", "text_encoder", "tokenizer"):
            shutil.copytree(src / component, work / component)
    index["tokenizer"] = ["transformers", type(tokenizer).__name__]
    (work / "model_index.json").write_text(json.dumps(index, indent=2))
    work.rename(dest)
    return dest


def main(argv: list[str] | None = None) -> None:
    import argparse

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("name", help="a shipped video config: wan21-t2v-1.3b, wan22-ti2v-5b, ...")
    parser.add_argument("dest", nargs="?", help="the folder to write (default: $LOWVRAM_GEN_BENCH/<name>-realsize-bf16)")
    parser.add_argument("--layers", type=int, default=0,
                        help="the transformer(s) cut to this many blocks (0: all; a CPU dry run)")
    args = parser.parse_args(argv)
    cut = {"num_layers": args.layers} if args.layers else {}
    print(build(args.name, Path(args.dest) if args.dest else None,
                overrides={"transformer": cut, "transformer_2": cut} if cut else None))


if __name__ == "__main__":
    main()
