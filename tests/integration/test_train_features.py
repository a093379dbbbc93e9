"""Offline feature cache (shared rows, resumable, disk check), offline training, warm start and LoRA."""

from __future__ import annotations

import hashlib
import json

import pytest
import torch
from safetensors.torch import load_file

from data_recipes import features as feature_cache
from tests.integration.test_train_loop import synthetic_data, tiny_cfg, tiny_target
from training.trainer import Trainer


def _save_mixture(data, directory):
    data.train.save_to_disk(str(directory / "train"))
    data.heldout.save_to_disk(str(directory / "heldout"))
    return directory


def test_feature_cache_shares_rows_resumes_and_feeds_offline_training(tmp_path, capsys, monkeypatch):
    target, data = tiny_target(), synthetic_data()
    mix = _save_mixture(data, tmp_path / "mix")
    out = feature_cache.cache_features(mix, target=target, out_dir=tmp_path / "feats", shard_rows=10,
                                       progress=False)
    index = json.loads((out / "index.json").read_text())
    assert len(index["rows"]) == len(data.train) + len(data.heldout) and index["dtype"] == "bfloat16"
    assert len(list(out.glob("shard-*.safetensors"))) == 3  # 30 rows, 10 per shard
    store = feature_cache.FeatureStore(out, target_info=target.info())
    row = data.train[3]
    want = target.features(torch.tensor([row["input_ids"]]))[0].to(torch.bfloat16)
    assert torch.equal(store.get(row["id"], row["input_ids"]), want)
    # a second mixture sharing the rows computes only its new rows
    other = synthetic_data(rows=24, heldout=6, seed=0)
    other.train = other.train.select(range(12))
    extra = synthetic_data(rows=5, heldout=1, seed=9)
    extra_rows = [dict(r, id=f"x-{i}") for i, r in enumerate(extra.train)]
    capsys.readouterr()
    feature_cache.cache_features(mix, target=target, out_dir=out, rows=list(other.train) + extra_rows,
                                 progress=False)
    assert "5 to compute" in capsys.readouterr().out
    # not enough disk: refuse before computing anything (the disk query is the only thing faked)
    monkeypatch.setattr(feature_cache.shutil, "disk_usage", lambda p: type("U", (), {"free": 1000})())
    with pytest.raises(OSError, match="not enough disk"):
        feature_cache.cache_features(mix, target=target, out_dir=tmp_path / "feats2", progress=False)
    monkeypatch.undo()
    trainer = Trainer(tiny_cfg(tmp_path, max_steps=1, features="offline", feature_dir=str(out)),
                      target=target, data=data)
    assert trainer.run()["last"]["positions"] > 0


def test_warm_start_records_its_parent_and_lora_saves_a_peft_adapter(tmp_path):
    from peft import PeftModel

    from checkpoints.drafter_io import load_drafter

    data = synthetic_data()
    Trainer(tiny_cfg(tmp_path / "parent", max_steps=1), target=tiny_target(), data=data).run()
    parent = tmp_path / "parent" / "run"
    child_cfg = tiny_cfg(tmp_path / "child", max_steps=2, init_from=str(parent), lora_r=4, lr=1e-2)
    Trainer(child_cfg, target=tiny_target(), data=data).run()
    child = tmp_path / "child" / "run"
    init = json.loads((child / "config.json").read_text())["init"]
    sha = hashlib.sha256((parent / "model.safetensors").read_bytes()).hexdigest()
    assert init["parent"] == {"path": str(parent.resolve()), "sha256": sha}
    assert init["parent_init"] == {"seed": 42}
    assert (child / "adapter" / "adapter_config.json").is_file()
    assert (child / "adapter" / "adapter_model.safetensors").is_file()
    base = load_drafter(parent)
    merged = PeftModel.from_pretrained(base, str(child / "adapter")).merge_and_unload()
    saved = load_file(str(child / "model.safetensors"))
    for key, value in merged.state_dict().items():
        torch.testing.assert_close(saved[key], value, rtol=1e-6, atol=1e-6)
    assert any(not torch.equal(saved[k], v) for k, v in load_file(str(parent / "model.safetensors")).items())
