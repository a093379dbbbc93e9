"""Saving and loading drafter directories (``config.json`` + ``model.safetensors``).

Minimal core used by training and evaluation; validation and export live beside it.
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from training.drafter import WEIGHTS_NAME, DrafterConfig, EagleDrafter
from training.target import TargetInfo

log = logging.getLogger(__name__)


def atomic_directory(final: str | Path):
    """Context manager yielding a temporary directory renamed to ``final`` on success."""
    return _AtomicDir(Path(final))


class _AtomicDir:
    def __init__(self, final: Path):
        self.final = final

    def __enter__(self) -> Path:
        self.final.parent.mkdir(parents=True, exist_ok=True)
        self.tmp = Path(tempfile.mkdtemp(prefix=f".{self.final.name}.tmp-", dir=self.final.parent))
        return self.tmp

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is not None:
            shutil.rmtree(self.tmp, ignore_errors=True)
            return
        if self.final.exists():
            old = self.final.with_name(f".{self.final.name}.old-{os.getpid()}")
            os.replace(self.final, old)
            os.replace(self.tmp, self.final)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(self.tmp, self.final)


def drafter_state_dict(drafter: EagleDrafter) -> dict[str, torch.Tensor]:
    """The drafter's own tensors (no target weights), contiguous and on CPU."""
    return {k: v.detach().to("cpu").contiguous() for k, v in drafter.state_dict().items()}


def write_drafter_files(drafter: EagleDrafter, directory: str | Path) -> None:
    """Write config.json and model.safetensors into an existing directory (not atomic)."""
    directory = Path(directory)
    drafter.config.save(directory)
    save_file(drafter_state_dict(drafter), str(directory / WEIGHTS_NAME), metadata={"format": "pt"})


def save_drafter(drafter: EagleDrafter, directory: str | Path) -> Path:
    """Save a drafter atomically: a killed save never leaves a directory that looks complete."""
    directory = Path(directory)
    with atomic_directory(directory) as tmp:
        write_drafter_files(drafter, tmp)
    return directory


def check_target_compatible(config: DrafterConfig, target: TargetInfo | None, source: str = "") -> None:
    """Shapes must match (error); a different name or fingerprint is only a warning."""
    if target is None:
        return
    rec = config.target
    where = f" ({source})" if source else ""
    for key in ("hidden_size", "vocab_size"):
        if int(rec[key]) != int(getattr(target, key)):
            raise ValueError(f"drafter{where} was trained for a target with {key}={rec[key]}, "
                             f"but the target {target.name_or_path!r} has {key}={getattr(target, key)}")
    if rec.get("fingerprint") and rec["fingerprint"] != target.fingerprint:
        log.warning("drafter%s was trained against target weights %s but the loaded target has %s "
                    "(same shapes, different weights)", where, rec["fingerprint"], target.fingerprint)
    elif rec.get("name_or_path") and rec["name_or_path"] != target.name_or_path:
        log.warning("drafter%s records target %r but is loaded with %r", where, rec["name_or_path"],
                    target.name_or_path)


def load_drafter(directory: str | Path, *, target: TargetInfo | None = None,
                 device: torch.device | str = "cpu", dtype: torch.dtype | None = None) -> EagleDrafter:
    """Load a drafter directory, checking it against the target it will be used with."""
    directory = Path(directory)
    config = DrafterConfig.load(directory)
    check_target_compatible(config, target, str(directory))
    drafter = EagleDrafter(config)
    path = directory / WEIGHTS_NAME
    if not path.is_file():
        raise FileNotFoundError(f"{path} is missing")
    state = load_file(str(path))
    drafter.load_state_dict(state, strict=True)
    drafter.to(device=device, dtype=dtype).eval()
    return drafter
