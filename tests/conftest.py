"""Shared fixtures: offline environment and tiny models built locally from configs."""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("WANDB_MODE", "offline")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from pathlib import Path  # noqa: E402

import pytest  # noqa: E402
import torch  # noqa: E402

REPO_ROOT = Path(__file__).resolve().parents[1]


def shared_data_dir() -> Path | None:
    env = os.environ.get("TAPS_DATA_DIR")
    path = Path(env) if env else REPO_ROOT.parent / "shared" / "data"
    return path if path.is_dir() else None


@pytest.fixture(autouse=True)
def _torch_threads(request):
    """Tiny models run faster on one thread (thread start-up dominates); e2e tests keep them all."""
    old = torch.get_num_threads()
    if "e2e" not in request.node.nodeid.split("/"):
        torch.set_num_threads(1)
    yield
    torch.set_num_threads(old)


@pytest.fixture(scope="session")
def data_dir() -> Path:
    path = shared_data_dir()
    if path is None:
        pytest.skip("the shared data directory is not available (set TAPS_DATA_DIR)")
    return path


def make_tiny_target(vocab_size: int = 64, hidden_size: int = 32, layers: int = 2, seed: int = 0,
                     dtype: torch.dtype = torch.float32, model_type: str = "llama"):
    """A tiny random causal LM of a given family, built from a config (no download)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    cfg = AutoConfig.for_model(
        model_type, vocab_size=vocab_size, hidden_size=hidden_size, intermediate_size=2 * hidden_size,
        num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2,
        head_dim=hidden_size // 4, max_position_embeddings=512, tie_word_embeddings=False,
        bos_token_id=0, eos_token_id=1, pad_token_id=1)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(cfg).to(dtype).eval()
    return model


@pytest.fixture
def tiny_target():
    return make_tiny_target()
