"""Loading rejects broken drafter directories, each with its own clear message."""

from __future__ import annotations

import json
import logging
import os
import struct

import pytest
import torch
from safetensors.torch import load_file, save_file

from checkpoints.drafter_io import TargetMismatchError, load_drafter, save_drafter
from checkpoints.resolve import resolve_drafter
from checkpoints.validation import CheckpointError, read_header
from tests.conftest import make_tiny_target
from training.drafter import DrafterConfig, EagleDrafter
from training.target import FrozenTarget


@pytest.fixture(scope="module")
def target():
    return FrozenTarget(make_tiny_target(), "tiny-llama")


@pytest.fixture
def drafter_dir(tmp_path, target):
    drafter = EagleDrafter.from_config(DrafterConfig.from_target(target.config, target.info(), seed=1))
    return save_drafter(drafter, tmp_path / "drafter")


def _rewrite(directory, edit):
    path = directory / "model.safetensors"
    state = load_file(str(path))
    edit(state)
    save_file(state, str(path))
    return path


def test_valid_directory_loads_and_matches_target(drafter_dir, target):
    drafter = load_drafter(drafter_dir, target=target.info())
    assert not drafter.training and drafter.fc.weight.shape == (32, 64)
    umask = os.umask(0)
    os.umask(umask)  # the atomic save leaves the usual modes, not mkdtemp's 0700
    assert drafter_dir.stat().st_mode & 0o777 == 0o777 & ~umask
    assert (drafter_dir / "model.safetensors").stat().st_mode & 0o777 == 0o666 & ~umask


def test_truncated_file_names_file_and_tensor(drafter_dir):
    path = drafter_dir / "model.safetensors"
    data = path.read_bytes()
    header_len = struct.unpack("<Q", data[:8])[0]
    header = json.loads(data[8:8 + header_len])
    header.pop("__metadata__", None)
    last = max(header, key=lambda k: header[k]["data_offsets"][1])  # the tensor stored at the end
    path.write_bytes(data[:-10])
    with pytest.raises(CheckpointError) as err:
        load_drafter(drafter_dir)
    msg = str(err.value)
    assert str(path) in msg and "truncated" in msg and repr(last) in msg


def test_truncated_header_and_garbage_header(drafter_dir):
    path = drafter_dir / "model.safetensors"
    data = path.read_bytes()
    path.write_bytes(data[:5])
    with pytest.raises(CheckpointError, match="no header"):
        load_drafter(drafter_dir)
    header_len = struct.unpack("<Q", data[:8])[0]
    path.write_bytes(data[:8] + b"{" * header_len + data[8 + header_len:])
    with pytest.raises(CheckpointError, match="not valid JSON") as err:
        read_header(path)
    assert str(path) in str(err.value)


def test_missing_tensor(drafter_dir):
    path = _rewrite(drafter_dir, lambda s: s.pop("layers.0.mlp.down_proj.weight"))
    with pytest.raises(CheckpointError, match=r"missing tensor\(s\) \['layers.0.mlp.down_proj.weight'\]") as err:
        load_drafter(drafter_dir)
    assert str(path) in str(err.value)


def test_unexpected_tensor_left_over(drafter_dir):
    _rewrite(drafter_dir, lambda s: s.update({"layers.0.input_layernorm.weight": torch.ones(32)}))
    with pytest.raises(CheckpointError, match=r"unexpected tensor\(s\) \['layers.0.input_layernorm.weight'\]"):
        load_drafter(drafter_dir)


def test_wrong_shape(drafter_dir):
    _rewrite(drafter_dir, lambda s: s.update({"fc.weight": torch.zeros(32, 48)}))
    with pytest.raises(CheckpointError, match=r"'fc.weight' has shape \(32, 48\), expected \(32, 64\)"):
        load_drafter(drafter_dir)


def test_wrong_dtype_mixed_dtypes_and_nan(drafter_dir):
    _rewrite(drafter_dir, lambda s: s.update({"fc.bias": torch.zeros(32, dtype=torch.int32)}))
    with pytest.raises(CheckpointError, match="'fc.bias' has dtype I32, expected a floating dtype"):
        load_drafter(drafter_dir)
    _rewrite(drafter_dir, lambda s: s.update({"fc.bias": torch.zeros(32, dtype=torch.float16)}))
    with pytest.raises(CheckpointError, match="mixed dtypes"):
        load_drafter(drafter_dir)
    _rewrite(drafter_dir, lambda s: s.update({"fc.bias": torch.full((32,), float("nan"))}))
    with pytest.raises(CheckpointError, match="'fc.bias' contains NaN"):
        load_drafter(drafter_dir)


def test_mismatched_target_is_an_error_name_only_a_warning(drafter_dir, target, caplog):
    wider = FrozenTarget(make_tiny_target(hidden_size=48), "tiny-wide").info()
    with pytest.raises(TargetMismatchError, match="target mismatch.*hidden_size=32.*hidden_size=48"):
        load_drafter(drafter_dir, target=wider)
    bigger_vocab = FrozenTarget(make_tiny_target(vocab_size=80), "tiny-vocab").info()
    with pytest.raises(TargetMismatchError, match="vocab_size=64.*vocab_size=80"):
        load_drafter(drafter_dir, target=bigger_vocab)
    other_weights = FrozenTarget(make_tiny_target(seed=5), "tiny-other").info()
    with caplog.at_level(logging.WARNING):
        load_drafter(drafter_dir, target=other_weights)
    assert "different weights" in caplog.text


def test_unknown_architecture_and_unknown_keys(drafter_dir):
    cfg_path = drafter_dir / "config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg_path.write_text(json.dumps({**cfg, "architecture": "medusa"}))
    with pytest.raises(ValueError, match="unknown drafter architecture 'medusa'"):
        load_drafter(drafter_dir)
    cfg_path.write_text(json.dumps({**cfg, "surprise": 1}))
    with pytest.raises(ValueError, match=r"unknown drafter config keys \['surprise'\]"):
        load_drafter(drafter_dir)


def test_resolve_local_and_hub_specs(drafter_dir, tmp_path):
    assert resolve_drafter(drafter_dir) == drafter_dir
    with pytest.raises(FileNotFoundError, match="does not exist"):
        resolve_drafter(tmp_path / "nope")
    with pytest.raises(FileNotFoundError, match="neither an existing directory nor a Hub id"):
        resolve_drafter("not a hub id")
    with pytest.raises(FileNotFoundError, match="cannot fetch drafter 'someone/drafter@v2'.*local Hugging Face cache"):
        resolve_drafter("someone/drafter@v2", cache_dir=tmp_path / "hf-cache")


def test_hub_spec_resolves_from_the_local_hub_cache(drafter_dir, tmp_path):
    """A published drafter already in the Hugging Face cache (the offline layout huggingface_hub reads)."""
    import shutil

    repo = tmp_path / "hf-cache" / "models--someone--drafter"
    for ref, commit in (("main", "a" * 40), ("exp", "b" * 40)):
        shutil.copytree(drafter_dir, repo / "snapshots" / commit)
        (repo / "refs").mkdir(parents=True, exist_ok=True)
        (repo / "refs" / ref).write_text(commit)
    main = resolve_drafter("someone/drafter", cache_dir=tmp_path / "hf-cache")
    exp = resolve_drafter("someone/drafter@exp", cache_dir=tmp_path / "hf-cache")
    assert main.name == "a" * 40 and exp.name == "b" * 40
    assert load_drafter(exp).fc.weight.shape == (32, 64)
