"""The README's main job on the real default target: 2 CPU ranks under the deepspeed launcher,
1% of the balanced mixture, 50 steps; the held-out EAL must rise by >= 0.05 (slow: minutes)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.conftest import REPO_ROOT


@pytest.mark.slow
@pytest.mark.e2e
def test_fifty_steps_on_two_cpu_ranks_raise_heldout_eal(tmp_path, data_dir):
    out = tmp_path / "run"
    env = {**os.environ, "TAPS_DATA_DIR": str(data_dir), "PYTHONPATH": str(REPO_ROOT)}
    cmd = [sys.executable, "-m", "deepspeed.launcher.runner", "--num_gpus", "2", "--master_port", "29617",
           "launch/train_drafter.py", "--mix", "balanced", "--scale", "0.01", "--max-steps", "50",
           "--output-dir", str(out)]
    proc = subprocess.run(cmd, cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=7200)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    metrics = json.loads((out / "metrics.json").read_text())
    before, after = metrics["untrained"]["eal"], metrics["last"]["eal"]
    print(f"held-out EAL untrained {before:.4f} -> trained {after:.4f}")
    assert after - before >= 0.05
    for name in ("config.json", "model.safetensors", "training_config.yaml", "manifest.json"):
        assert (out / name).is_file()
