"""Reading weight files without running them: the safetensors header checked against the file (size, truncation,
a renamed pickle), and pickles (`.ckpt`/`.pt`/`.pth`/`.bin`) unpickled with torch's weights-only unpickler only.

docs/FAULTS.md 1, 2: a `.ckpt` is a pickle and a pickle can run code. Pickles are only ever opened with the
weights-only unpickler, and a file named `.safetensors` is never unpickled at all: its header is checked by hand
first, so a renamed pickle is refused before any loader sees it. Used by the single-file loader
(models/checkpoint.py), the memory profile, ControlNets, control-LoRAs, LoRAs and embeddings.
"""

from __future__ import annotations

import re
from pathlib import Path

from lowvram_gen import safe_json
from lowvram_gen.errors import ModelLoadError, UnsafeCheckpoint

_DTYPE_SIZES = {"F64": 8, "I64": 8, "U64": 8, "F32": 4, "I32": 4, "U32": 4, "F16": 2, "BF16": 2, "I16": 2,
                "U16": 2, "I8": 1, "U8": 1, "BOOL": 1, "F8_E4M3": 1, "F8_E5M2": 1, "F8_E8M0": 1}
_MAX_HEADER = 100_000_000  # the safetensors format's own limit


def safetensors_header(path) -> dict:
    """The JSON header of a safetensors file, checked against the file size; never unpickles."""
    p = Path(path)
    head = b""

    def bad(reason: str) -> ModelLoadError:
        # Magic bytes only explain a failure: a valid header length may start with the same bytes.
        if head.startswith(b"PK\x03\x04") or (head[:1] == b"\x80" and head[1:2] in (b"\x02", b"\x03", b"\x04", b"\x05")):
            reason = "it looks like a PyTorch/pickle checkpoint renamed to .safetensors; it was not unpickled"
        return ModelLoadError(f"{p} is not a safetensors file ({reason})")

    try:
        size = p.stat().st_size
        with open(p, "rb") as f:
            head = f.read(8)
            if size == 0:
                raise bad("the file is empty: 0 bytes")
            if size < 8:
                raise bad(f"only {size} bytes: truncated")
            n = int.from_bytes(head, "little")
            if n > min(size - 8, _MAX_HEADER):
                raise bad(f"header length {n} is larger than the {size}-byte file: truncated or another format")
            raw = f.read(n)
    except OSError as exc:
        raise ModelLoadError(f"cannot read {p}: {exc.strerror or exc}") from exc
    try:
        header = safe_json.loads(raw, max_bytes=_MAX_HEADER, what="its header")
    except safe_json.BadJson as exc:  # nested too deep is refused here, before json.loads could recurse
        raise bad("its header is not JSON" if exc.kind == "invalid" else f"its header is {exc.kind}: {exc.problem}") from None
    if not isinstance(header, dict):
        raise bad("its header is not a JSON object")
    head = b""  # a JSON header: from here on it is a (damaged) safetensors file, not a renamed pickle
    end = 0
    for key, info in header.items():
        if key == "__metadata__":
            continue
        try:
            start, stop = (int(x) for x in info["data_offsets"])
            shape = [int(d) for d in info["shape"]]
            dtype = str(info["dtype"])
        except (KeyError, TypeError, ValueError):
            raise bad(f"entry {key!r} has no valid dtype/shape/data_offsets") from None
        count = 1
        for d in shape:
            count *= d
        if dtype in _DTYPE_SIZES and stop - start != count * _DTYPE_SIZES[dtype]:
            raise bad(f"entry {key!r} has {stop - start} bytes for shape {shape} of {dtype}")
        end = max(end, stop)
    data = size - 8 - n
    if end > data:
        raise bad(f"truncated: the header promises {end} bytes of tensor data, the file holds {data}")
    if end < data:
        raise bad(f"{data - end} unexpected bytes after the tensor data")
    return header


def check_safetensors(path) -> list[str]:
    """Validate a safetensors header (8-byte little-endian length, JSON) without unpickling; its tensor keys."""
    return [k for k in safetensors_header(path) if k != "__metadata__"]


def _pickle_globals(path) -> list[str]:
    """Globals a pickle names (module.name), found by reading opcodes only: nothing is imported or run."""
    import pickletools
    import zipfile

    p, found = Path(path), []
    try:
        if zipfile.is_zipfile(p):
            with zipfile.ZipFile(p) as z:
                blobs = [z.read(n) for n in z.namelist() if n.endswith(".pkl")]
        else:
            blobs = [p.read_bytes()[:50_000_000]]
    except (OSError, zipfile.BadZipFile, RuntimeError):
        return found
    for blob in blobs:
        strings: list[str] = []
        names: list[str] = []
        try:
            for op, arg, _ in pickletools.genops(blob):
                if isinstance(arg, str):
                    strings.append(arg)
                if op.name in ("GLOBAL", "INST"):
                    names.append(arg.replace(" ", "."))
                elif op.name == "STACK_GLOBAL" and len(strings) >= 2:
                    names.append(f"{strings[-2]}.{strings[-1]}")
        except Exception:  # noqa: BLE001 - not a well-formed pickle: random bytes would yield random "globals"
            continue
        found += names
    return found


class _LightningCallbackStandIn:
    """Inert stand-in for the one non-tensor global in the official SD 1.x `.ckpt` files.

    Their pickles name `pytorch_lightning.callbacks.model_checkpoint.ModelCheckpoint` (the class, as a
    dict key of training bookkeeping), so plain weights-only loading refuses them (diffusers #8874).
    A1111's safe unpickler allows that name too; here it resolves to this empty class, nothing is imported.
    """


def weights_only_allowlist():
    import torch

    name = "pytorch_lightning.callbacks.model_checkpoint.ModelCheckpoint"
    return torch.serialization.safe_globals([(_LightningCallbackStandIn, name)])


def _is_weights_global(name: str) -> bool:
    return name.startswith("torch.") or name in ("collections.OrderedDict", "_codecs.encode")


def load_pickle_weights_only(path) -> dict:
    """A `.ckpt`/`.pt`/`.pth`/`.bin` state dict, unpickled with torch's weights-only allowlist only.

    A pickle that would import or call anything else is refused with UnsafeCheckpoint naming the global;
    torch's weights-only unpickler refuses it before any of it runs. A1111's {"state_dict": ...} is unwrapped.
    """
    import torch

    p = Path(path)
    obj = unpickle_weights_only(p)
    for _ in range(4):  # A1111 / Lightning checkpoints: {"state_dict": {...}, "global_step": ...}
        if isinstance(obj, dict) and isinstance(obj.get("state_dict"), dict):
            obj = obj["state_dict"]
    if not isinstance(obj, dict):
        raise ModelLoadError(f"{p} holds a {type(obj).__name__}, not a state dict of tensors")
    tensors = {k: v for k, v in obj.items() if isinstance(k, str) and isinstance(v, torch.Tensor)}
    if not tensors:
        raise ModelLoadError(f"{p} holds no tensors (keys: {', '.join(map(str, list(obj)[:5]))})")
    return tensors


def unpickle_weights_only(path):
    """The object a pickle file holds (nested dicts of tensors, strings, numbers), with the same
    weights-only safety and errors as `load_pickle_weights_only`. For files whose tensors are not
    top-level entries, e.g. A1111 textual-inversion embeddings (`{"string_to_param": {"*": tensor}}`)."""
    import pickle
    import warnings
    import zipfile

    import torch

    p = Path(path)
    try:
        size = p.stat().st_size
    except OSError as exc:
        raise ModelLoadError(f"cannot read {p}: {exc.strerror or exc}") from exc
    if size == 0:
        raise ModelLoadError(f"{p} is empty (0 bytes): a failed or unfinished download?")
    zipped = zipfile.is_zipfile(p)
    try:
        # mmap: tensors stay in the page cache instead of being copied (zip format only)
        with warnings.catch_warnings(), weights_only_allowlist():  # torch warns about pickle protocols
            warnings.simplefilter("ignore", UserWarning)
            obj = torch.load(p, map_location="cpu", weights_only=True, mmap=zipped)
    except pickle.UnpicklingError as exc:
        text = str(exc)
        named = re.findall(r"GLOBAL ([\w.]+)", text)
        suspicious = named or [g for g in _pickle_globals(p) if not _is_weights_global(g)]
        if suspicious:
            raise UnsafeCheckpoint(
                f"{p} was refused: its pickle would load {suspicious[0]}, which is not a tensor type "
                "(a pickle can run code; nothing from this file was run). Use a .safetensors version "
                "of this model, or convert the file only if you trust where it came from."
            ) from None
        raise ModelLoadError(f"{p} cannot be read as a weights-only PyTorch checkpoint: truncated or corrupt "
                             f"({last_line(text)})") from None
    except Exception as exc:  # noqa: BLE001 - on garbage bytes the unpickler raises anything (KeyError, IndexError...)
        hint = ""
        try:
            check_safetensors(p)
            hint = "; it is a safetensors file: rename it to .safetensors"
        except ModelLoadError:
            pass
        raise ModelLoadError(f"{p} is truncated or not a PyTorch checkpoint ({last_line(str(exc))}){hint}") from None
    return obj


def last_line(text: str) -> str:
    """The informative part of a torch / diffusers error, without torch's advice to load unsafely."""
    for marker in ("WeightsUnpickler error:", "Unsupported operand"):
        if marker in text:
            text = text[text.index(marker):].removeprefix("WeightsUnpickler error:")
            break
    lines = [ln.strip() for ln in text.strip().splitlines() if ln.strip()]
    first = lines[0] if lines else text.strip()
    return first.split(". ")[0][:160]
