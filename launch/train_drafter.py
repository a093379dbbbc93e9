"""Train an EAGLE/HASS drafter with DeepSpeed (docs/training.md).

    deepspeed --num_gpus 2 launch/train_drafter.py --mix balanced --scale 0.01 --max-steps 50
    torchrun --nproc_per_node 2 launch/train_drafter.py --config launch/configs/run.yaml
    python launch/train_drafter.py --mix math --max-steps 20       # one process
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from training.cli import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
