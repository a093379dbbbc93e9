"""Rules through the engine: delta = 0 Cactus == SpS under the same random stream; greedy-like rules
at T = 0; plain decoding at T > 0 samples from the warped target."""

from __future__ import annotations

import pytest
import torch

from eval.acceptance import make_rule
from eval.drafting import DrafterSession
from eval.engine import SpeculativeEngine, build_engine
from eval.proposer import DraftShape, SingleProposer
from eval.warp import Warp
from tests.conftest import make_tiny_target
from tests.integration.engine_helpers import one_thread  # noqa: F401
from training.drafter import DrafterConfig, EagleDrafter
from training.target import FrozenTarget

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def tiny():
    model = make_tiny_target(vocab_size=8, hidden_size=16, layers=1, seed=2, dtype=torch.float64)
    with torch.no_grad():
        model.lm_head.weight.mul_(4.0)
    frozen = FrozenTarget(model, "tiny8")
    drafter = EagleDrafter.from_config(DrafterConfig.from_target(model.config, frozen.info(), seed=4))
    return model, frozen, drafter.to(torch.float64).eval()


def run(tiny, shape, rule, warp, seed, delta=0.0, n=20):
    model, frozen, drafter = tiny
    prop = SingleProposer(DrafterSession(drafter, frozen), DraftShape.parse(shape))
    eng = SpeculativeEngine(model, prop, make_rule(rule, warp, delta=delta), max_new_tokens=n, warp=warp)
    return eng.generate(torch.tensor([[3, 1, 4, 1, 5]]), torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("shape", ["chain:3", "tree:8,2,3"])
@pytest.mark.parametrize("name", ["cactus", "cactus-exact"])
def test_cactus_delta_zero_equals_sps_through_the_engine(tiny, shape, name):
    warp = Warp(1.0, top_p=0.95)
    for seed in range(4):
        a, b = run(tiny, shape, "sps", warp, seed), run(tiny, shape, name, warp, seed)
        assert a.new_tokens == b.new_tokens and a.accepted_per_pass == b.accepted_per_pass
    # and delta > 0 does change outcomes (more acceptance) for at least one seed
    diff = [run(tiny, shape, "sps", warp, s).new_tokens != run(tiny, shape, name, warp, s, delta=1.0).new_tokens
            for s in range(4)]
    assert any(diff)


@pytest.mark.parametrize("rule", ["sps", "tas", "cactus", "cactus-exact"])
def test_every_rule_is_greedy_at_temperature_zero(tiny, rule):
    base = run(tiny, "tree:8,2,3", "greedy", Warp(0.0), 0, delta=1.0)
    other = run(tiny, "tree:8,2,3", rule, Warp(0.0), 1, delta=1.0)
    assert base.new_tokens == other.new_tokens


def test_build_engine_plain_and_speculative(tiny, tmp_path):
    from checkpoints.drafter_io import save_drafter

    model, frozen, drafter = tiny
    save_drafter(drafter, tmp_path / "d")
    ids = torch.tensor([[3, 1, 4]])
    plain = build_engine(model, shape="none", max_new_tokens=12).generate(ids)
    spec = build_engine(model, drafter=tmp_path / "d", shape="chain:3", rule="greedy", max_new_tokens=12)
    rec = spec.generate(ids)
    assert rec.new_tokens == plain.new_tokens and plain.tau == 1.0
    assert spec.proposer.verify_budget == 3


def test_standalone_lm_proposer_chains(tiny):
    """The Cactus set-up: a small causal LM with the same vocabulary drafts chains."""
    from eval.proposer import StandaloneLMProposer

    model = tiny[0]
    small = make_tiny_target(vocab_size=8, hidden_size=16, layers=1, seed=9, dtype=torch.float64)
    ids = torch.tensor([[3, 1, 4, 1, 5]])
    ref = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=15, do_sample=False,
                         eos_token_id=None, pad_token_id=0)[0, 5:].tolist()
    eng = build_engine(model, standalone_lm=small, shape="chain:3", rule="greedy", max_new_tokens=15)
    rec = eng.generate(ids)
    assert rec.new_tokens == ref and sum(rec.accepted_per_pass) > 0
    # at T > 0 the chain carries the LM's warped p; the standalone cache tracks the committed sequence
    prop = StandaloneLMProposer(small, k=3)
    eng = SpeculativeEngine(model, prop, make_rule("sps", Warp(1.0)), max_new_tokens=15, warp=Warp(1.0))
    rec = eng.generate(ids, torch.Generator().manual_seed(0))
    assert len(rec.new_tokens) == 15
    last = rec.verify_tokens - sum(a + 1 for a in rec.accepted_per_pass[:-1])  # kept by the last pass
    assert prop.cache.get_seq_length() == ids.shape[1] + len(rec.new_tokens) - last  # up to its root
