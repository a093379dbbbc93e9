import pytest
import torch

from checkpoints.drafter_io import load_drafter, save_drafter
from tests.conftest import make_tiny_target
from training.drafter import DrafterConfig, EagleDrafter
from training.target import FrozenTarget


@pytest.mark.parametrize("family", ["llama", "qwen2", "qwen3", "mistral"])
def test_drafter_builds_for_each_family_and_round_trips(tmp_path, family):
    target = FrozenTarget(make_tiny_target(model_type=family), f"tiny-{family}")
    cfg = DrafterConfig.from_target(target.config, target.info(), seed=7)
    drafter = EagleDrafter.from_config(cfg)
    ids = torch.randint(0, 64, (2, 9))
    feats, logits = target(ids)
    assert feats.shape == (2, 9, 32) and logits.shape == (2, 9, 64)
    pos = torch.arange(9)[None].expand(2, -1)
    out = drafter(target.embed_tokens(ids), feats, pos)
    assert out.shape == feats.shape and torch.isfinite(out).all()
    save_drafter(drafter, tmp_path / "d")
    again = load_drafter(tmp_path / "d", target=target.info())
    torch.testing.assert_close(again(target.embed_tokens(ids), feats, pos), out, rtol=0, atol=0)
    # the same seed gives the same initialisation
    twin = EagleDrafter.from_config(DrafterConfig.from_target(target.config, target.info(), seed=7))
    assert torch.equal(twin.fc.weight, drafter.fc.weight)
