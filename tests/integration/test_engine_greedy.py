"""At T = 0 the engine reproduces the target's greedy decoding token for token (float64 tiny models),
with EAGLE drafters (chains and EAGLE-2 trees), oracle drafts with long accepted runs, and plainly;
the KV caches then hold exactly the accepted path."""

from __future__ import annotations

import pytest
import torch

from eval.acceptance import make_rule
from eval.drafting import DrafterSession
from eval.engine import SpeculativeEngine
from eval.kv_cache import cache_length
from eval.proposer import DraftShape, NoProposer, SingleProposer
from eval.warp import Warp
from tests.conftest import make_tiny_target
from tests.integration.engine_helpers import OracleProposer, ScriptedProposer, one_thread  # noqa: F401
from training.drafter import DrafterConfig, EagleDrafter
from training.target import FrozenTarget

NEW = 24
pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def tiny():
    model = make_tiny_target(vocab_size=8, hidden_size=16, layers=2, seed=3, dtype=torch.float64)
    frozen = FrozenTarget(model, "tiny8")
    drafter = EagleDrafter.from_config(DrafterConfig.from_target(model.config, frozen.info(), seed=5))
    return model, frozen, drafter.to(torch.float64).eval()


def reference(model, ids, n=NEW):
    out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=n, do_sample=False,
                         eos_token_id=None, pad_token_id=0)
    return out[0, ids.shape[1]:].tolist()


def prompts(n, vocab, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(0, vocab, (1, int(torch.randint(3, 12, (1,), generator=g))), generator=g)
            for _ in range(n)]


@pytest.mark.parametrize("shape", ["none", "chain:1", "chain:4", "tree:8,2,3", "tree:60,5,10"])
def test_eagle_drafter_greedy_equals_target(tiny, shape):
    model, frozen, drafter = tiny
    accepted = 0
    for ids in prompts(4 if shape.startswith("tree:60") else 8, 8):
        session = DrafterSession(drafter, frozen)
        proposer = SingleProposer(session, DraftShape.parse(shape)) if shape != "none" else NoProposer()
        eng = SpeculativeEngine(model, proposer, make_rule("sps", Warp(0.0)), max_new_tokens=NEW)
        rec = eng.generate(ids, torch.Generator().manual_seed(0))
        assert rec.new_tokens == reference(model, ids)
        assert rec.verify_tokens == NEW - 1 and rec.verify_passes == len(rec.accepted_per_pass)
        accepted += sum(rec.accepted_per_pass)
        if shape == "none":
            assert rec.tau == 1.0
    if shape != "none":
        assert accepted > 0  # the walk did accept draft tokens (vocab 8 makes random drafts hit)


@pytest.mark.parametrize("tree", [False, True], ids=["chain", "tree"])
def test_oracle_drafts_long_accepts_and_exact_caches(tree):
    model = make_tiny_target(vocab_size=16, hidden_size=16, layers=2, seed=1, dtype=torch.float64)
    for i, ids in enumerate(prompts(5, 16, seed=1)):
        ref = reference(model, ids, 40)
        prop = OracleProposer(ref, ids.shape[1], 16, k=5, corrupt=0.15, seed=i, tree=tree)
        eng = SpeculativeEngine(model, prop, make_rule("greedy"), max_new_tokens=30)
        rec = eng.generate(ids)
        assert rec.new_tokens == ref[:30]
        assert max(rec.accepted_per_pass) >= 3 and rec.tau > 2.0
        # the target cache holds exactly prompt + committed tokens (the last token excluded) as a fresh prefill
        seq = torch.cat([ids[0], torch.tensor(rec.new_tokens[:-1])])[None]
        assert cache_length(eng.target.cache) == seq.shape[1]
        fresh = model(seq, use_cache=True).past_key_values
        for mine, ref in zip(eng.target.cache.layers, fresh.layers):
            torch.testing.assert_close(mine.keys, ref.keys, rtol=1e-10, atol=1e-10)
            torch.testing.assert_close(mine.values, ref.values, rtol=1e-10, atol=1e-10)


def test_drafter_cache_equals_fresh_start_after_generation(tiny):
    model, frozen, drafter = tiny
    ids = prompts(1, 8, seed=4)[0]
    session = DrafterSession(drafter, frozen)
    eng = SpeculativeEngine(model, SingleProposer(session, DraftShape.parse("tree:12,3,3")),
                            make_rule("greedy"), max_new_tokens=200)
    eng.max_new_tokens = 40
    rec = eng.generate(ids)
    # committed = prompt + all new tokens but the last (the last pass does not advance the drafter)
    passes_tokens = rec.new_tokens[:-(rec.accepted_per_pass[-1] + 1)]
    seq = torch.cat([ids[0], torch.tensor(passes_tokens[:-1])])[None]
    fresh = DrafterSession(drafter, frozen)
    features, _ = frozen(seq)
    fresh.start(seq, features, passes_tokens[-1])
    assert session.length == fresh.length == seq.shape[1]
    torch.testing.assert_close(session.cache.layers[0].keys, fresh.cache.layers[0].keys, rtol=1e-9, atol=1e-9)
    torch.testing.assert_close(session.last_feature, fresh.last_feature, rtol=1e-9, atol=1e-9)


def test_scripted_run_hand_counted_tau_and_depths(tiny):
    model = tiny[0]
    ids = torch.tensor([[1, 2, 3]])
    ref = reference(model, ids, 20)
    script = [2, 0, 3, 4]  # accepted per pass; chains of 4, so pass 4 accepts all and adds a bonus
    prop = ScriptedProposer(ref, prompt_len=3, script=script, k=4, vocab=8)
    eng = SpeculativeEngine(model, prop, make_rule("greedy"), max_new_tokens=1 + 3 + 1 + 4 + 5)
    rec = eng.generate(ids)
    assert rec.new_tokens == ref[:14]
    assert rec.verify_passes == 4 and rec.verify_tokens == 13 and rec.tau == 13 / 4
    assert rec.accepted_per_pass == [2, 0, 3, 4]
    assert rec.depth_proposed == [4, 4, 4, 4]
    assert rec.depth_reached == [4, 3, 3, 2]  # depth d tried when d - 1 tokens were accepted
    assert rec.depth_accepted == [3, 3, 2, 1]
    assert rec.draft_accepted == [True, True, False, False, False, False, False, False,
                                  True, True, True, False, True, True, True, True]
    assert rec.draft_depth == [1, 2, 3, 4] * 4
    assert rec.draft_entropy == [0.0, 1.0, 2.0, 3.0] * 4  # the proposer's entropies are carried through
    assert rec.stop_reason == "max_new_tokens"


def test_eos_and_max_new_tokens_stop(tiny):
    model = tiny[0]
    ids = torch.tensor([[4, 5, 6, 7]])
    ref = reference(model, ids, 40)
    eos = ref[5]
    first = ref.index(eos)
    eng = SpeculativeEngine(model, OracleProposer(ref, 4, 8, k=6, corrupt=0.0, seed=0), make_rule("greedy"),
                            max_new_tokens=30, eos_token_ids=[eos])
    rec = eng.generate(ids)
    assert rec.new_tokens == ref[: first + 1] and rec.stop_reason == "eos"
    eng = SpeculativeEngine(model, OracleProposer(ref, 4, 8, k=6, corrupt=0.0, seed=0), make_rule("greedy"),
                            max_new_tokens=9)
    rec = eng.generate(ids)
    assert rec.new_tokens == ref[:9] and rec.verify_tokens == 8 and rec.stop_reason == "max_new_tokens"


def test_bad_inputs_fail_clearly(tiny):
    model = tiny[0]
    with pytest.raises(ValueError, match="max_new_tokens"):
        SpeculativeEngine(model, None, make_rule("greedy"), max_new_tokens=0)
    eng = SpeculativeEngine(model, None, make_rule("greedy"), max_new_tokens=3)
    with pytest.raises(ValueError, match="shape"):
        eng.generate(torch.zeros(2, 3, dtype=torch.long))
    with pytest.raises(ValueError, match="draft shape"):
        DraftShape.parse("tree:60")
