"""Experiment tracking on rank 0: ``--report-to wandb|tensorboard|none``.

wandb runs offline when no API key is configured and never prompts (``WANDB_MODE=offline``,
``WANDB_SILENT``); tensorboard writes to ``<output-dir>/tensorboard``.
"""

from __future__ import annotations

import os
from pathlib import Path


class Reporter:
    def __init__(self, kind: str, out_dir: Path, name: str, config: dict, enabled: bool = True):
        self.kind = kind if enabled else "none"
        self._run = None
        self._writer = None
        if self.kind == "wandb":
            import wandb

            if not os.environ.get("WANDB_API_KEY") and os.environ.get("WANDB_MODE") != "disabled":
                os.environ["WANDB_MODE"] = "offline"
            os.environ.setdefault("WANDB_SILENT", "true")
            os.environ.setdefault("WANDB_CONSOLE", "off")
            self._run = wandb.init(project=os.environ.get("WANDB_PROJECT", "taps"), name=name, config=config,
                                   dir=str(out_dir), settings=wandb.Settings(silent=True))
        elif self.kind == "tensorboard":
            from torch.utils.tensorboard import SummaryWriter

            self._writer = SummaryWriter(log_dir=str(Path(out_dir) / "tensorboard"))

    def log(self, scalars: dict[str, float], step: int) -> None:
        flat = {k: float(v) for k, v in _flatten(scalars).items()}
        if self._run is not None:
            self._run.log(flat, step=step)
        if self._writer is not None:
            for key, value in flat.items():
                self._writer.add_scalar(key, value, step)

    def close(self) -> None:
        if self._run is not None:
            self._run.finish()
        if self._writer is not None:
            self._writer.close()


def _flatten(data: dict, prefix: str = "") -> dict[str, float]:
    out: dict[str, float] = {}
    for key, value in data.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            out.update(_flatten(value, name + "/"))
        elif isinstance(value, list | tuple):
            for i, v in enumerate(value, start=1):
                out[f"{name}/{i}"] = v
        elif isinstance(value, int | float):
            out[name] = value
    return out
