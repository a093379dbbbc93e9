"""The trainer on a tiny target built from a config: one step, kill-and-resume equality, NaN stop,
refusing another run's directory, and a damaged checkpoint on resume."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
import torch
from safetensors.torch import load_file

from tests.conftest import make_tiny_target
from training import checkpointing
from training.config import TrainConfig
from training.lifecycle import RunDirectoryError
from training.target import FrozenTarget
from training.trainer import Trainer, TrainingDiverged


def synthetic_data(rows: int = 24, heldout: int = 6, vocab: int = 64, seed: int = 0):
    """Rows with the prepared-mixture columns; a repeating pattern so a drafter can learn something."""
    import datasets

    g = torch.Generator().manual_seed(seed)

    def make(n, prefix):
        cols = {"input_ids": [], "loss_mask": [], "id": [], "source": [], "domain": []}
        for i in range(n):
            length = int(torch.randint(10, 24, (1,), generator=g))
            start = int(torch.randint(2, vocab, (1,), generator=g))
            ids = [(start + 3 * k) % (vocab - 2) + 2 for k in range(length)]
            cols["input_ids"].append(ids)
            cols["loss_mask"].append([0] * 4 + [1] * (length - 4))
            cols["id"].append(f"{prefix}-{i}")
            cols["source"].append("synthetic")
            cols["domain"].append("math" if i % 2 else "chat")
        return datasets.Dataset.from_dict(cols)

    return SimpleNamespace(train=make(rows, "t"), heldout=make(heldout, "h"), manifest={"recipe": "synthetic"})


def tiny_cfg(tmp_path, **kw) -> TrainConfig:
    base = dict(name="tiny", output_dir=str(tmp_path / "run"), tokens_per_batch=64, max_steps=4, lr=3e-3,
                eval_every=100, save_every=2, keep_last=3, zero_stage=2, eval_at_start=False, log_every=1)
    base.update(kw)
    return TrainConfig(**base)


def tiny_target():
    return FrozenTarget(make_tiny_target(), "tiny-llama")


def test_one_step_trains_and_writes_the_final_directory(tmp_path):
    cfg = tiny_cfg(tmp_path, max_steps=1, eval_at_start=True)
    trainer = Trainer(cfg, target=tiny_target(), data=synthetic_data())
    before = {k: v.clone() for k, v in trainer.engine.module.state_dict().items()}
    metrics = trainer.run()
    after = load_file(str(tmp_path / "run" / "model.safetensors"))
    assert set(after) == set(before) and not any(k.startswith(("embed", "lm_head")) for k in after)
    assert any(not torch.equal(after[k], before[k]) for k in after)
    out = tmp_path / "run"
    for name in ("config.json", "training_config.yaml", "manifest.json", "metrics.json"):
        assert (out / name).is_file(), name
    saved = json.loads((out / "metrics.json").read_text())
    assert saved["last"]["eal"] >= 1.0 and len(saved["last"]["top1_per_depth"]) == 3
    assert metrics["untrained"]["positions"] == saved["last"]["positions"] > 0
    assert json.loads((out / "config.json").read_text())["init"] == {"seed": 42}
    from checkpoints.token_counts import load_token_counts

    counts, train = load_token_counts(out), trainer.data.train
    assert int(counts.sum()) == sum(sum(m) for m in train["loss_mask"])  # every trained token, once
    assert counts[train[0]["input_ids"][-1]] > 0 and counts.shape[0] == trainer.target.info().vocab_size
    assert all(counts[t] == 0 for t in set(range(counts.shape[0])) - {i for r in train for i, m in
                                                                       zip(r["input_ids"], r["loss_mask"]) if m})


def _kill_after(monkeypatch, step: int):
    real = checkpointing.save_checkpoint

    def save_then_die(engine, out_dir, s, *args, **kwargs):
        path = real(engine, out_dir, s, *args, **kwargs)
        if s == step:
            raise KeyboardInterrupt("simulated kill")
        return path

    monkeypatch.setattr(checkpointing, "save_checkpoint", save_then_die)


def test_kill_and_resume_gives_the_same_weights_as_one_run(tmp_path, monkeypatch):
    data = synthetic_data()
    one_go = Trainer(tiny_cfg(tmp_path / "a", max_steps=6, grad_accum=2), target=tiny_target(), data=data)
    assert one_go.stream.steps_per_epoch < 6  # the resumed part crosses an epoch boundary
    one_go.run()
    _kill_after(monkeypatch, 4)
    with pytest.raises(KeyboardInterrupt):
        Trainer(tiny_cfg(tmp_path / "b", max_steps=6, grad_accum=2), target=tiny_target(), data=data).run()
    monkeypatch.undo()
    assert not (tmp_path / "b" / "run" / "model.safetensors").exists()
    resumed = Trainer(tiny_cfg(tmp_path / "b", max_steps=6, grad_accum=2, resume="auto"),
                      target=tiny_target(), data=data)
    assert resumed.step == 4
    resumed.run()
    a = load_file(str(tmp_path / "a" / "run" / "model.safetensors"))
    b = load_file(str(tmp_path / "b" / "run" / "model.safetensors"))
    for key in a:
        torch.testing.assert_close(a[key], b[key], rtol=0, atol=0)


def test_nan_loss_stops_and_keeps_the_last_good_checkpoint(tmp_path):
    data = synthetic_data()
    Trainer(tiny_cfg(tmp_path, max_steps=2), target=tiny_target(), data=data).run()
    poisoned = tiny_target()
    with torch.no_grad():
        poisoned.model.model.norm.weight.fill_(float("nan"))
    trainer = Trainer(tiny_cfg(tmp_path, max_steps=4, resume="auto"), target=poisoned, data=data)
    with pytest.raises(TrainingDiverged, match=r"NaN/inf.*step 3.*step-00000002"):
        trainer.run()
    assert [p.name for p in checkpointing.list_checkpoints(tmp_path / "run")] == ["step-00000002"]


def test_refuses_another_runs_directory_and_skips_a_damaged_checkpoint(tmp_path):
    data = synthetic_data()
    Trainer(tiny_cfg(tmp_path, max_steps=4), target=tiny_target(), data=data).run()
    with pytest.raises(RunDirectoryError, match="--resume auto.*--overwrite"):
        Trainer(tiny_cfg(tmp_path, max_steps=4), target=tiny_target(), data=data)
    newest = checkpointing.list_checkpoints(tmp_path / "run")[0]
    engine_file = next((newest / "ds").rglob("*model_states.pt"))
    engine_file.write_bytes(engine_file.read_bytes()[:100])  # truncated write
    resumed = Trainer(tiny_cfg(tmp_path, max_steps=4, resume="auto"), target=tiny_target(), data=data)
    assert resumed.step == 2
