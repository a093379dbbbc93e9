"""The whole pipeline on the real default target, at a tiny scale: prepare balanced data, train a
drafter for a few steps (one process, DeepSpeed engine on CPU), load the checkpoint into the
engine, decode a GSM8K question with tree drafting in fp32 (identical to plain greedy decoding),
and render the Hub dry-run model card from the checkpoint."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

from tests.conftest import REPO_ROOT


@pytest.mark.e2e
def test_train_checkpoint_decode_and_card_on_the_default_target(tmp_path, data_dir):
    out = tmp_path / "run"
    env = {**os.environ, "TAPS_DATA_DIR": str(data_dir), "PYTHONPATH": str(REPO_ROOT)}
    cmd = [sys.executable, "launch/train_drafter.py", "--mix", "balanced", "--scale", "0.003",
           "--max-steps", "3", "--eval-every", "3", "--save-every", "3", "--eval-rows", "4",
           "--max-length", "256", "--tokens-per-batch", "512", "--output-dir", str(out)]
    proc = subprocess.run(cmd, cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    for name in ("config.json", "model.safetensors", "training_config.yaml", "manifest.json", "metrics.json"):
        assert (out / name).is_file(), name
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["last"]["step"] == 3 and metrics["last"]["eal"] >= 1.0

    from data_recipes.benchmarks import load_benchmark
    from eval.engine import build_engine
    from training.target import load_target

    model, tokenizer = load_target(dtype="float32", device="cpu")
    question = load_benchmark("gsm8k", data_dir=data_dir, limit=1)[0]
    rendered = tokenizer.apply_chat_template([{"role": "user", "content": question.turns[0]}],
                                             add_generation_prompt=True, tokenize=False)
    ids = torch.tensor([tokenizer(rendered, add_special_tokens=False)["input_ids"]])
    eos = [tokenizer.eos_token_id]
    plain = build_engine(model, drafter=None, max_new_tokens=24, eos_token_ids=eos).generate(ids)
    spec = build_engine(model, drafter=out, shape="tree:10,3,3", rule="sps", max_new_tokens=24,
                        eos_token_ids=eos).generate(ids)
    assert spec.new_tokens == plain.new_tokens  # lossless at temperature 0, in fp32
    assert spec.verify_passes <= plain.verify_passes and spec.tau >= 1.0

    from checkpoints.hub import push_drafter

    plan = push_drafter(out, "ORG/taps-e2e", dry_run=True)
    assert "model.safetensors" in plan.files and "README.md" in plan.files
    assert "base_model:" in plan.card and "speculative-decoding" in plan.card and "balanced" in plan.card
