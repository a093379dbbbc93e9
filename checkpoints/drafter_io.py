"""Saving and loading drafter directories (``config.json`` + ``model.safetensors``).

Core used by training and evaluation. Loading is checked (``checkpoints.validation``): known
architecture, every tensor present with the right shape and dtype, nothing left over, finite
values, and the target it is used with matches the one recorded. Only safetensors are read here;
released EAGLE/HASS pickles go through ``checkpoints.eagle_format.import_eagle``.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import tempfile
from pathlib import Path

import torch
from safetensors.torch import save_file

from checkpoints.validation import CheckpointError, read_drafter_weights
from training.drafter import WEIGHTS_NAME, DrafterConfig, EagleDrafter
from training.target import TargetInfo

log = logging.getLogger(__name__)


class TargetMismatchError(CheckpointError):
    """The drafter was trained for a target of different shape (hidden size or vocabulary)."""


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
        _default_permissions(self.tmp)
        if self.final.exists():
            old = self.final.with_name(f".{self.final.name}.old-{os.getpid()}")
            os.replace(self.final, old)
            os.replace(self.tmp, self.final)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(self.tmp, self.final)


def _default_permissions(root: Path) -> None:
    """mkdtemp makes 0700 directories (and some writers 0600 files): give the usual umask modes."""
    umask = os.umask(0)
    os.umask(umask)
    for path in [root, *root.rglob("*")]:
        if not path.is_symlink():
            os.chmod(path, (0o777 if path.is_dir() else 0o666) & ~umask)


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
            raise TargetMismatchError(
                f"target mismatch: drafter{where} was trained for a target with {key}={rec[key]} "
                f"({rec.get('name_or_path')!r}), but the target {target.name_or_path!r} has "
                f"{key}={getattr(target, key)}")
    if rec.get("fingerprint") and rec["fingerprint"] != target.fingerprint:
        log.warning("drafter%s was trained against target weights %s but the loaded target has %s "
                    "(same shapes, different weights)", where, rec["fingerprint"], target.fingerprint)
    elif rec.get("name_or_path") and rec["name_or_path"] != target.name_or_path:
        log.warning("drafter%s records target %r but is loaded with %r", where, rec["name_or_path"],
                    target.name_or_path)


def _refuse_eagle_layout(directory: Path) -> None:
    """An EAGLE-layout export (a Llama config) is not a taps drafter: say how to import it."""
    try:
        data = json.loads((directory / "config.json").read_text())
    except (OSError, ValueError):
        return  # DrafterConfig.load reports it
    if isinstance(data, dict) and "architecture" not in data and "model_type" in data:
        raise CheckpointError(f"{directory} holds an EAGLE-layout drafter (a {data['model_type']!r} config), "
                              "not a taps drafter: convert it with `python launch/export_drafter.py "
                              f"--import-eagle {directory} --target TARGET --out DIR`")


def load_drafter(directory: str | Path, *, target: TargetInfo | None = None,
                 device: torch.device | str = "cpu", dtype: torch.dtype | None = None) -> EagleDrafter:
    """Load a drafter directory, checking it against the target it will be used with.

    ``directory`` may also be a Hub id (``ORG/NAME`` or ``ORG/NAME@revision``), resolved through
    ``checkpoints.resolve.resolve_drafter``.
    """
    from checkpoints.resolve import resolve_drafter

    directory = resolve_drafter(directory)
    _refuse_eagle_layout(directory)
    config = DrafterConfig.load(directory)
    check_target_compatible(config, target, str(directory))
    state = read_drafter_weights(directory / WEIGHTS_NAME, config)
    stored = next(iter(state.values())).dtype
    drafter = EagleDrafter(config).to(stored)  # dtype=None keeps the stored dtype
    missing, unexpected = drafter.load_state_dict(state, strict=False)
    if missing or unexpected:  # read_drafter_weights already checked; this is a belt-and-braces guard
        raise CheckpointError(f"{directory / WEIGHTS_NAME}: missing {missing}, unexpected {unexpected}")
    drafter.to(device=device, dtype=dtype).eval()
    return drafter
