"""Command-line entry of the trainer (``launch/train_drafter.py`` is a thin wrapper over this)."""

from __future__ import annotations

import logging
import os
import sys
import warnings

from training.config import parse_config


def main(argv: list[str] | None = None) -> int:
    for key, value in {"HF_HUB_DISABLE_PROGRESS_BARS": "1", "TOKENIZERS_PARALLELISM": "false"}.items():
        os.environ.setdefault(key, value)
    # DeepSpeed's ZeRO calls a deprecated torch collective on every step; not actionable for users
    warnings.filterwarnings("ignore", message=".*all_gather_into_tensor.*is deprecated", category=FutureWarning)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    cfg = parse_config(argv)
    from training.trainer import Trainer, TrainingDiverged

    try:
        Trainer(cfg).run()
    except TrainingDiverged as err:
        print(f"ERROR: {err}", file=sys.stderr, flush=True)
        return 3
    return 0
