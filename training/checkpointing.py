"""Resumable step checkpoints and the final drafter directory.

Layout of ``--output-dir``::

    config.json  model.safetensors        # the final drafter (no target weights; LoRA merged in)
    adapter/                              # with --lora-r: the standard peft adapter
    training_config.yaml  manifest.json  metrics.json
    checkpoints/step-00000050/            # resume state, the last K kept
        drafter/ (config.json, model.safetensors [, adapter/])   ds/ (DeepSpeed engine + ZeRO shards)
        rng/rank-<r>.pt  trainer_state.json  training_config.yaml  COMPLETE

A step checkpoint is written to ``.step-N.tmp`` by all ranks and renamed by rank 0 once complete;
``COMPLETE`` lists every file with its size, so a partial or damaged one is detected on resume.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import random
import shutil
import tempfile
from pathlib import Path

import numpy as np
import torch

from training import backend

log = logging.getLogger(__name__)
MARKER = "COMPLETE"


def checkpoints_dir(out_dir: Path) -> Path:
    return Path(out_dir) / "checkpoints"


def step_name(step: int) -> str:
    return f"step-{step:08d}"


def _rng_state() -> dict:
    state = {"torch": torch.get_rng_state(), "numpy": np.random.get_state(), "python": random.getstate()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state()
    return state


def _set_rng_state(state: dict) -> None:
    torch.set_rng_state(state["torch"])
    np.random.set_state(state["numpy"])
    random.setstate(state["python"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda"])


def _gathered(module: torch.nn.Module):
    """All parameters materialised on every rank (a no-op unless ZeRO-3 partitions them)."""
    params = list(module.parameters())
    if any(hasattr(p, "ds_id") for p in params):
        import deepspeed

        return deepspeed.zero.GatheredParameters(params, modifier_rank=None)
    return contextlib.nullcontext()


def export_drafter(module: torch.nn.Module, directory: Path, lora: bool) -> None:
    """Write the drafter (and the peft adapter) into ``directory``; call on ALL ranks."""
    from checkpoints.drafter_io import write_drafter_files

    with _gathered(module):
        if backend.rank() != 0:
            return
        directory.mkdir(parents=True, exist_ok=True)
        if lora:
            module.save_pretrained(str(directory / "adapter"), save_embedding_layers=False)
            import copy

            merged = copy.deepcopy(module).merge_and_unload()
            write_drafter_files(merged.float(), directory)
        else:
            write_drafter_files(module, directory)


def _listing(root: Path) -> dict[str, int]:
    return {str(p.relative_to(root)): p.stat().st_size for p in sorted(root.rglob("*"))
            if p.is_file() and p.name != MARKER}


def save_checkpoint(engine, out_dir: Path, step: int, state: dict, cfg, lora: bool, keep_last: int) -> Path:
    """All ranks: the engine state, this rank's RNG; rank 0 the rest, the marker, rename, pruning."""
    root = checkpoints_dir(out_dir)
    final = root / step_name(step)
    tmp = root / f".{step_name(step)}.tmp"
    if backend.rank() == 0:
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
    backend.barrier()
    engine.save_checkpoint(str(tmp), tag="ds", save_latest=False)
    (tmp / "rng").mkdir(exist_ok=True)
    torch.save(_rng_state(), tmp / "rng" / f"rank-{backend.rank()}.pt")
    export_drafter(engine.module, tmp / "drafter", lora)
    backend.barrier()
    if backend.rank() == 0:
        (tmp / "trainer_state.json").write_text(json.dumps(state, indent=2))
        cfg.save(tmp)
        (tmp / MARKER).write_text(json.dumps({"step": step, "files": _listing(tmp)}, indent=1))
        if final.exists():
            shutil.rmtree(final)
        os.replace(tmp, final)
        for old in list_checkpoints(out_dir)[keep_last:]:
            shutil.rmtree(old, ignore_errors=True)
    backend.barrier()
    return final


def list_checkpoints(out_dir: Path) -> list[Path]:
    """Step checkpoint directories, newest first (complete or not)."""
    root = checkpoints_dir(out_dir)
    if not root.is_dir():
        return []
    return sorted((p for p in root.glob("step-*") if p.is_dir()), reverse=True)


def check_complete(path: Path) -> str | None:
    """None when the checkpoint is complete and undamaged, else the reason it is not."""
    marker = path / MARKER
    if not marker.is_file():
        return "no COMPLETE marker (partial write)"
    try:
        files = json.loads(marker.read_text())["files"]
    except (ValueError, KeyError) as err:
        return f"unreadable marker ({err})"
    for name, size in files.items():
        f = path / name
        if not f.is_file():
            return f"missing {name}"
        if f.stat().st_size != size:
            return f"{name} has {f.stat().st_size} bytes, expected {size}"
    return None


def resume_candidates(out_dir: Path, explicit: str | None = None) -> list[Path]:
    """Complete checkpoints to try, newest first; damaged ones are skipped with a warning."""
    paths = [Path(explicit)] if explicit and explicit != "auto" else list_checkpoints(out_dir)
    good = []
    for path in paths:
        reason = check_complete(path)
        if reason is None:
            good.append(path)
        else:
            log.warning("skipping checkpoint %s: %s", path, reason)
            if backend.rank() == 0:
                print(f"WARNING: skipping damaged or partial checkpoint {path}: {reason}", flush=True)
    return good


def load_checkpoint(engine, path: Path) -> dict:
    """Restore engine (model, optimizer, scheduler), this rank's RNG; returns the trainer state."""
    load_path, _ = engine.load_checkpoint(str(path), tag="ds", load_optimizer_states=True,
                                          load_lr_scheduler_states=True)
    if load_path is None:
        raise RuntimeError(f"DeepSpeed could not load {path / 'ds'}")
    rng = path / "rng" / f"rank-{backend.rank()}.pt"
    if rng.is_file():
        _set_rng_state(torch.load(rng, weights_only=False))
    else:
        log.warning("%s has no RNG state for rank %d (different number of ranks)", path, backend.rank())
    return json.loads((path / "trainer_state.json").read_text())


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def write_final(out_dir: Path, step_dir: Path, extra: dict[str, str]) -> None:
    """Rank 0: copy the final drafter out of its step checkpoint into ``out_dir``, file by file
    (each through a temporary name), plus ``extra`` text files (manifest, metrics)."""
    out_dir = Path(out_dir)
    src = step_dir / "drafter"
    for item in sorted(src.iterdir()):
        target = out_dir / item.name
        if item.is_dir():
            tmp = Path(tempfile.mkdtemp(prefix=f".{item.name}.tmp-", dir=out_dir))
            shutil.rmtree(tmp)
            shutil.copytree(item, tmp)
            if target.exists():
                shutil.rmtree(target)
            os.replace(tmp, target)
        else:
            _atomic_copy(item, target)
    _atomic_copy(step_dir / "training_config.yaml", out_dir / "training_config.yaml")
    for name, text in extra.items():
        tmp = out_dir / f".{name}.tmp"
        tmp.write_text(text)
        os.replace(tmp, out_dir / name)


def _atomic_copy(src: Path, dst: Path) -> None:
    tmp = dst.with_name(f".{dst.name}.tmp")
    shutil.copyfile(src, tmp)
    os.replace(tmp, dst)
