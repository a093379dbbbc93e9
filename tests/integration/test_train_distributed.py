"""2-rank CPU training under the deepspeed launcher (gloo): it trains, checkpoints both ranks' state,
and its held-out figures equal a 1-rank evaluation of the same drafter (rank-count independent)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest
import torch

from tests.conftest import REPO_ROOT
from tests.integration.test_train_loop import synthetic_data, tiny_cfg, tiny_target
from training.trainer import Trainer

WORKER = textwrap.dedent("""
    import json, sys
    from pathlib import Path
    from tests.integration.test_train_loop import synthetic_data, tiny_cfg, tiny_target
    from training.trainer import Trainer
    out = Path([a for a in sys.argv[1:] if not a.startswith("--local_rank")][0])
    cfg = tiny_cfg(out, max_steps=3, save_every=3, eval_at_start=True, zero_stage=2)
    trainer = Trainer(cfg, target=tiny_target(), data=synthetic_data())
    metrics = trainer.run()
    if trainer.rank == 0:
        print("METRICS " + json.dumps(metrics), flush=True)
""")


def test_two_rank_deepspeed_training_on_cpu(tmp_path):
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT), "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, "-m", "deepspeed.launcher.runner", "--num_gpus", "2",
                           "--master_port", "29613", str(script), str(tmp_path)],
                          cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=280)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    line = next(x for x in proc.stdout.splitlines() if x.startswith("METRICS "))
    metrics = json.loads(line[len("METRICS "):])
    ckpt = tmp_path / "run" / "checkpoints" / "step-00000003"
    assert sorted(p.name for p in (ckpt / "rng").iterdir()) == ["rank-0.pt", "rank-1.pt"]
    assert len(list((ckpt / "ds").rglob("*optim_states.pt"))) == 2  # ZeRO-2: one optimizer shard per rank
    assert metrics["step"] == 3 and (tmp_path / "run" / "model.safetensors").is_file()
    # the same untrained drafter evaluated by one rank gives the same held-out figures
    single = Trainer(tiny_cfg(tmp_path / "one", max_steps=3), target=tiny_target(), data=synthetic_data())
    one = single.evaluate()
    two = metrics["untrained"]
    assert one["positions"] == two["positions"]
    for key in ("loss", "eal"):
        assert one[key] == pytest.approx(two[key], rel=1e-5)
    assert one["top1_per_depth"] == pytest.approx(two["top1_per_depth"])
    assert torch.isfinite(torch.tensor(metrics["last"]["loss"]))
