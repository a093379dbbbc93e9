"""Device check of the trainer on a GPU: bf16, ZeRO 0-3, resume, on tiny targets (and the default
target's throughput if it can be built there). Prints one line per check."""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("WANDB_MODE", "offline")

import torch  # noqa: E402

print("torch", torch.__version__, "cuda", torch.cuda.is_available(), flush=True)
import deepspeed  # noqa: E402

print("deepspeed", deepspeed.__version__, flush=True)
from tests.conftest import make_tiny_target  # noqa: E402
from tests.integration.test_train_loop import synthetic_data, tiny_cfg  # noqa: E402
from training.target import FrozenTarget  # noqa: E402
from training.trainer import Trainer  # noqa: E402


def tgt():
    return FrozenTarget(make_tiny_target(vocab_size=512, hidden_size=64).to(torch.bfloat16), "tiny")


root = Path(tempfile.mkdtemp())
for stage in (0, 1, 2, 3):
    try:
        t0 = time.time()
        cfg = tiny_cfg(root / f"z{stage}", max_steps=4, save_every=2, zero_stage=stage, eval_at_start=True)
        tr = Trainer(cfg, target=tgt(), data=synthetic_data(vocab=512))
        dtype = next(tr.engine.module.parameters()).dtype
        m = tr.run()
        cfg2 = tiny_cfg(root / f"z{stage}", max_steps=6, save_every=2, zero_stage=stage, resume="auto")
        tr2 = Trainer(cfg2, target=tgt(), data=synthetic_data(vocab=512))
        step0 = tr2.step
        m2 = tr2.run()
        print(f"CHECK zero{stage}: ok dtype={dtype} eal {m['untrained']['eal']:.3f}->{m['last']['eal']:.3f} "
              f"loss {m['last']['loss']:.3f}; resumed at {step0} -> {m2['step']} loss {m2['last']['loss']:.3f} "
              f"({time.time() - t0:.1f}s)", flush=True)
    except Exception:
        print(f"CHECK zero{stage}: FAILED", flush=True)
        traceback.print_exc()
print(json.dumps({"max_mem_gib": torch.cuda.max_memory_allocated() / 2**30 if torch.cuda.is_available() else 0}))
