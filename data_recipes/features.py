"""Offline target features: run the target once over a prepared mixture, store bf16 safetensors shards.

Layout of a cache directory (one per target; default ``$TAPS_CACHE_DIR/features/<target>-<fingerprint>``)::

    index.json                # {"target": TargetInfo, "dtype", "hidden_size", "rows": {key: {shard, length}}}
    shard-00000-<tag>.safetensors   # tensor name = row key, value = (length, hidden) features

A row's key is ``<row id>|<hash of its token ids>``, so mixtures that share rows (``balanced`` is a
subset of ``large`` with the same seed) share their cached features, and a row tokenised
differently (another template or max length) is never confused with it. Each shard is written
to a temporary name and renamed, then the index is rewritten atomically: a killed run resumes
where it stopped. Before starting, the needed disk space is printed and checked.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import uuid
from collections import OrderedDict
from collections.abc import Iterable, Sequence
from pathlib import Path

import torch
from filelock import FileLock
from safetensors import safe_open
from safetensors.torch import save_file

INDEX_NAME = "index.json"


def row_key(row_id: str, input_ids: Sequence[int]) -> str:
    digest = hashlib.sha1(torch.as_tensor(list(input_ids), dtype=torch.int64).numpy().tobytes()).hexdigest()
    return f"{row_id}|{digest[:16]}"


def default_feature_dir(info) -> Path:
    """The shared cache directory of a target (by name and weights fingerprint)."""
    from training.target import cache_dir

    name = Path(str(info.name_or_path)).name.replace("/", "--") or "target"
    return cache_dir() / "features" / f"{name}-{info.fingerprint}"


def _read_index(directory: Path) -> dict:
    path = directory / INDEX_NAME
    if not path.is_file():
        return {"rows": {}}
    return json.loads(path.read_text())


def _write_index(directory: Path, index: dict) -> None:
    tmp = directory / f".{INDEX_NAME}.tmp-{os.getpid()}"
    tmp.write_text(json.dumps(index))
    os.replace(tmp, directory / INDEX_NAME)


def _free_bytes(directory: Path) -> int:
    probe = directory
    while not probe.exists():
        probe = probe.parent
    return shutil.disk_usage(probe).free


def _load_splits(mixture_dir: Path) -> list:
    """The prepared mixture's splits as datasets (``train`` and ``heldout``)."""
    import datasets

    splits = []
    for name in ("train", "heldout"):
        path = mixture_dir / name
        if path.is_dir():
            splits.append(datasets.load_from_disk(str(path)))
    if not splits:
        raise FileNotFoundError(f"{mixture_dir} holds no prepared splits (train/, heldout/); "
                                "run launch/prepare_data.py first")
    return splits


def _resolve_target(target, mixture_dir: Path, dtype: str):
    from training.target import FrozenTarget, load_target

    if target is not None and not isinstance(target, str | os.PathLike):
        return target if isinstance(target, FrozenTarget) else FrozenTarget(target)
    name = target
    if name is None:
        manifest = mixture_dir / "manifest.json"
        if manifest.is_file():
            name = json.loads(manifest.read_text()).get("target_name")
    model, _ = load_target(name, dtype=dtype)
    return FrozenTarget(model, str(name or model.config.name_or_path))


def cache_features(mixture_dir: str | Path, *, target=None, dtype: str = "auto", out_dir: str | Path | None = None,
                   tokens_per_batch: int = 4096, shard_rows: int = 256, rows: Iterable[dict] | None = None,
                   progress: bool = True) -> Path:
    """Compute and store the target's features of every row of a prepared mixture; returns the cache dir.

    ``target``: a FrozenTarget / model, a name or path, or None (the mixture's target, else the
    default). Rows already in the cache (shared with another mixture, or an interrupted run) are
    skipped. Raises when the disk cannot hold the new features.
    """
    from tqdm.auto import tqdm

    mixture_dir = Path(mixture_dir)
    frozen = _resolve_target(target, mixture_dir, dtype)
    info = frozen.info()
    out = Path(out_dir) if out_dir else default_feature_dir(info)
    todo: dict[str, list[int]] = {}
    index = _read_index(out)
    source = rows if rows is not None else (r for split in _load_splits(mixture_dir) for r in split)
    for row in source:
        key = row_key(str(row["id"]), row["input_ids"])
        if key not in index["rows"]:
            todo[key] = list(row["input_ids"])
    hidden = int(info.hidden_size)
    need = sum(len(v) for v in todo.values()) * hidden * 2
    free = _free_bytes(out)
    print(f"feature cache {out}: {len(index['rows'])} rows cached, {len(todo)} to compute, "
          f"needs {need / 2**30:.2f} GiB (free {free / 2**30:.1f} GiB)", flush=True)
    if need * 1.05 + (64 << 20) > free:
        raise OSError(f"not enough disk for the feature cache at {out}: needs {need / 2**30:.2f} GiB, "
                      f"{free / 2**30:.2f} GiB free; pass --feature-dir on a larger disk")
    if not todo:
        return out
    out.mkdir(parents=True, exist_ok=True)
    device = next(frozen.model.parameters()).device
    keys = sorted(todo, key=lambda k: len(todo[k]))
    pending: dict[str, torch.Tensor] = {}
    bar = tqdm(total=len(keys), desc="caching features", unit="row", disable=not progress)
    i = 0
    while i < len(keys):
        j = i + 1
        room = shard_rows - len(pending)
        while j < len(keys) and j - i < room and len(todo[keys[j]]) * (j - i + 1) <= tokens_per_batch:
            j += 1
        batch = keys[i:j]
        width = max(len(todo[k]) for k in batch)
        ids = torch.zeros(len(batch), width, dtype=torch.long)
        for r, k in enumerate(batch):
            ids[r, : len(todo[k])] = torch.tensor(todo[k])
        feats = frozen.features(ids.to(device)).to("cpu", torch.bfloat16)
        for r, k in enumerate(batch):
            pending[k] = feats[r, : len(todo[k])].contiguous()
        bar.update(len(batch))
        i = j
        if len(pending) >= shard_rows or i == len(keys):
            _flush(out, pending, info)
            pending = {}
    bar.close()
    return out


def _flush(out: Path, pending: dict[str, torch.Tensor], info) -> None:
    name = f"shard-{uuid.uuid4().hex[:12]}.safetensors"
    tmp = out / f".{name}.tmp"
    save_file(pending, str(tmp), metadata={"format": "pt"})
    os.replace(tmp, out / name)
    with FileLock(str(out / ".index.lock")):
        index = _read_index(out)
        index.update({"target": info.to_dict(), "dtype": "bfloat16", "hidden_size": int(info.hidden_size)})
        for key, tensor in pending.items():
            index["rows"][key] = {"shard": name, "length": int(tensor.shape[0])}
        _write_index(out, index)


class FeatureStore:
    """Streams cached features row by row from the shards (a few shard handles kept open)."""

    def __init__(self, directory: str | Path, *, target_info=None, max_open: int = 8):
        self.directory = Path(directory)
        index = _read_index(self.directory)
        if not index["rows"]:
            raise FileNotFoundError(f"no cached features in {self.directory}; run "
                                    "launch/prepare_data.py --cache-features first")
        if target_info is not None and index.get("target", {}).get("fingerprint") != target_info.fingerprint:
            raise ValueError(f"features in {self.directory} were computed by another target "
                             f"({index.get('target')}) than {target_info.name_or_path!r}")
        self.rows = index["rows"]
        self._open: OrderedDict[str, object] = OrderedDict()
        self.max_open = max_open

    def get(self, row_id: str, input_ids: Sequence[int]) -> torch.Tensor:
        key = row_key(str(row_id), input_ids)
        entry = self.rows.get(key)
        if entry is None:
            raise KeyError(f"row {row_id!r} has no cached features in {self.directory}; "
                           "rerun launch/prepare_data.py --cache-features for this mixture")
        shard = entry["shard"]
        if shard not in self._open:
            if len(self._open) >= self.max_open:
                self._open.popitem(last=False)
            self._open[shard] = safe_open(str(self.directory / shard), framework="pt")
        self._open.move_to_end(shard)
        return self._open[shard].get_tensor(key)
