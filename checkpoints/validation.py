"""Checked reading of drafter weights: every tensor present, right shape and dtype, nothing extra.

A safetensors file is a little-endian u64 header length, a JSON header mapping each tensor name to
``{"dtype", "shape", "data_offsets"}``, then the raw bytes. The header is parsed here before any
tensor is read, so a truncated or corrupt file fails with the file *and* the tensor named instead
of a bare deserialisation error.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path

import torch
from safetensors import safe_open

from training.drafter import DrafterConfig, EagleDrafter

# safetensors dtype codes -> torch dtypes (the ones a drafter may be stored in)
_ST_DTYPES = {"F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16, "F64": torch.float64}
_ST_ITEMSIZE = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "I16": 2, "I8": 1, "U8": 1,
                "BOOL": 1}
_MAX_HEADER = 100 * 1024 * 1024


class CheckpointError(ValueError):
    """A drafter checkpoint that cannot be used as it is (message names the file and tensor)."""


def expected_tensors(config: DrafterConfig) -> dict[str, tuple[int, ...]]:
    """Names and shapes of every tensor a drafter with this config stores (built on the meta device)."""
    with torch.device("meta"):
        model = EagleDrafter(config)
    return {name: tuple(t.shape) for name, t in model.state_dict().items()}


def read_header(path: str | Path) -> dict[str, dict]:
    """Parse and check a safetensors header: each tensor's bytes must lie inside the file."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path} is missing")
    size = path.stat().st_size
    with path.open("rb") as fh:
        raw = fh.read(8)
        if len(raw) < 8:
            raise CheckpointError(f"{path}: truncated safetensors file ({size} bytes, no header)")
        (header_len,) = struct.unpack("<Q", raw)
        if header_len > _MAX_HEADER or 8 + header_len > size:
            raise CheckpointError(f"{path}: corrupt or truncated safetensors header "
                                  f"(declares {header_len} header bytes, file has {size} bytes)")
        try:
            header = json.loads(fh.read(header_len))
        except (json.JSONDecodeError, UnicodeDecodeError) as err:
            raise CheckpointError(f"{path}: corrupt safetensors header (not valid JSON: {err})") from err
    if not isinstance(header, dict):
        raise CheckpointError(f"{path}: corrupt safetensors header (not a JSON object)")
    header.pop("__metadata__", None)
    data_size = size - 8 - header_len
    for name, info in sorted(header.items(), key=lambda kv: _offsets(path, kv)[1]):
        start, end = _offsets(path, (name, info))
        shape = info.get("shape", [])
        itemsize = _ST_ITEMSIZE.get(info.get("dtype"), 0)
        numel = 1
        for dim in shape:
            numel *= int(dim)
        if itemsize and end - start != numel * itemsize:
            raise CheckpointError(f"{path}: tensor {name!r} is corrupt (header says shape {shape} of "
                                  f"{info.get('dtype')}, but its byte range holds {end - start} bytes)")
        if end > data_size:
            raise CheckpointError(f"{path}: file is truncated inside tensor {name!r} (needs bytes up to "
                                  f"{end} of the data section, the file has {data_size})")
    return header


def _offsets(path: Path, item: tuple[str, dict]) -> tuple[int, int]:
    name, info = item
    try:
        start, end = (int(x) for x in info["data_offsets"])
    except (KeyError, TypeError, ValueError):
        raise CheckpointError(f"{path}: corrupt safetensors header entry for tensor {name!r}") from None
    if start < 0 or end < start:
        raise CheckpointError(f"{path}: corrupt byte range [{start}, {end}) for tensor {name!r}")
    return start, end


def check_tensor_names(names, expected: dict[str, tuple[int, ...]], source: str) -> None:
    """Missing and unexpected tensors are both errors (with the names listed)."""
    names = set(names)
    missing = sorted(set(expected) - names)
    extra = sorted(names - set(expected))
    if missing:
        raise CheckpointError(f"{source}: missing tensor(s) {missing} (the drafter config expects "
                              f"{len(expected)} tensors)")
    if extra:
        raise CheckpointError(f"{source}: unexpected tensor(s) {extra} not used by this drafter "
                              "architecture (wrong checkpoint, or a different config)")


def check_shapes_and_dtypes(shapes: dict[str, tuple[int, ...]], dtypes: dict[str, torch.dtype | None],
                            expected: dict[str, tuple[int, ...]], source: str) -> torch.dtype:
    """Each tensor has the expected shape; all share one floating dtype (returned)."""
    for name, shape in sorted(shapes.items()):
        if tuple(shape) != tuple(expected[name]):
            raise CheckpointError(f"{source}: tensor {name!r} has shape {tuple(shape)}, "
                                  f"expected {tuple(expected[name])} from the drafter config")
    for name, dtype in sorted(dtypes.items()):
        if dtype is None or not dtype.is_floating_point:
            raise CheckpointError(f"{source}: tensor {name!r} has dtype {dtype}, expected a floating "
                                  "dtype (float32, bfloat16 or float16)")
    found = sorted({str(d) for d in dtypes.values()})
    if len(found) > 1:
        raise CheckpointError(f"{source}: tensors are stored in mixed dtypes {found}; a drafter is "
                              "saved in one dtype")
    return next(iter(dtypes.values()))


def read_drafter_weights(path: str | Path, config: DrafterConfig) -> dict[str, torch.Tensor]:
    """Read ``model.safetensors`` checking names, shapes, dtypes and finiteness against the config."""
    path = Path(path)
    header = read_header(path)
    expected = expected_tensors(config)
    check_tensor_names(header, expected, str(path))
    shapes = {name: tuple(int(d) for d in info["shape"]) for name, info in header.items()}
    for name, info in sorted(header.items()):
        if info.get("dtype") not in _ST_DTYPES:
            raise CheckpointError(f"{path}: tensor {name!r} has dtype {info.get('dtype')}, expected a "
                                  "floating dtype (F32, BF16 or F16)")
    dtypes = {name: _ST_DTYPES[info["dtype"]] for name, info in header.items()}
    check_shapes_and_dtypes(shapes, dtypes, expected, str(path))
    state: dict[str, torch.Tensor] = {}
    try:
        handle = safe_open(str(path), framework="pt", device="cpu")
    except Exception as err:  # safetensors raises its own error type
        raise CheckpointError(f"{path}: cannot open safetensors file: {err}") from err
    with handle as fh:
        for name in sorted(header):
            try:
                tensor = fh.get_tensor(name)
            except Exception as err:
                raise CheckpointError(f"{path}: cannot read tensor {name!r}: {err}") from err
            if not torch.isfinite(tensor).all():
                raise CheckpointError(f"{path}: tensor {name!r} contains NaN or infinite values")
            state[name] = tensor
    return state


def validate_state_dict(state: dict[str, torch.Tensor], config: DrafterConfig, source: str) -> None:
    """The same checks for an in-memory state dict (used by import and averaging)."""
    expected = expected_tensors(config)
    check_tensor_names(state, expected, source)
    check_shapes_and_dtypes({k: tuple(v.shape) for k, v in state.items()},
                            {k: v.dtype for k, v in state.items()}, expected, source)
    for name, tensor in sorted(state.items()):
        if not torch.isfinite(tensor).all():
            raise CheckpointError(f"{source}: tensor {name!r} contains NaN or infinite values")
