"""Frequency-ranked draft vocabularies: selection, the restricted head's logits and token mapping,
and exactness of decoding with a restricted head (T = 0 equals target greedy; at T > 0 the draft
distributions handed to the acceptance rule live on the full vocabulary with zero mass outside)."""

from __future__ import annotations

import pytest
import torch

from checkpoints.token_counts import load_token_counts, save_token_counts
from eval.acceptance import make_rule
from eval.draft_vocab import DraftHead, coverage, draft_head, select_vocab
from eval.drafting import DrafterSession
from eval.engine import SpeculativeEngine, build_engine
from eval.proposer import DraftShape, SingleProposer
from eval.warp import Warp
from tests.conftest import make_tiny_target
from training.drafter import DrafterConfig, EagleDrafter
from training.target import FrozenTarget

VOCAB = 64


@pytest.fixture(scope="module")
def tiny():
    model = make_tiny_target(vocab_size=VOCAB, hidden_size=16, layers=1, seed=4, dtype=torch.float64)
    frozen = FrozenTarget(model, "tiny64")
    drafter = EagleDrafter.from_config(DrafterConfig.from_target(model.config, frozen.info(), seed=6))
    return model, frozen, drafter.to(torch.float64).eval()


def test_select_vocab_ranks_by_count_breaks_ties_by_id_and_keeps_eos():
    counts = torch.tensor([5, 0, 9, 5, 1, 0], dtype=torch.int64)
    assert select_vocab(counts, 3).tolist() == [0, 2, 3]
    assert select_vocab(counts, 2, always=[5]).tolist() == [0, 2, 5]
    assert select_vocab(counts, 100).tolist() == list(range(6))
    assert coverage(counts, select_vocab(counts, 3)) == pytest.approx(19 / 20)
    with pytest.raises(ValueError, match="positive"):
        select_vocab(counts, 0)


def test_restricted_head_logits_ids_and_full_distribution(tiny):
    _, frozen, _ = tiny
    ids = torch.tensor([1, 7, 8, 30, 63])
    head = DraftHead(frozen.lm_head, ids)
    x = torch.randn(3, 16, dtype=torch.float64)
    full = DraftHead(frozen.lm_head).logits(x)
    assert torch.allclose(head.logits(x), full[:, ids], rtol=0, atol=1e-12) and head.size == 5
    assert head.token_ids(torch.tensor([0, 4])).tolist() == [1, 63] and head.token_id(2) == 8
    p = head.logits(x).softmax(-1)
    spread = head.full(p)
    assert spread.shape == (3, VOCAB) and torch.equal(spread[:, ids], p)
    assert float(spread.sum(-1).sub(1).abs().max()) < 1e-12 and float(spread[:, 2].abs().max()) == 0


def test_missing_or_mismatched_counts_are_clear_errors(tiny, tmp_path):
    _, frozen, _ = tiny
    with pytest.raises(ValueError, match="no token_counts.safetensors"):
        draft_head(frozen.lm_head, None, 8, name="runs/x")
    with pytest.raises(ValueError, match="cover 10 tokens"):
        draft_head(frozen.lm_head, torch.ones(10, dtype=torch.int64), 8)
    assert draft_head(frozen.lm_head, None, 0).ids is None  # 0 / None: the full vocabulary
    save_token_counts(torch.arange(VOCAB), tmp_path)
    assert torch.equal(load_token_counts(tmp_path), torch.arange(VOCAB))
    assert load_token_counts(tmp_path / "nothing") is None
    (tmp_path / "token_counts.safetensors").write_bytes(b"garbage")
    with pytest.raises(ValueError, match="unreadable token counts"):
        load_token_counts(tmp_path)


def reference(model, ids, n):
    out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=n, do_sample=False,
                         eos_token_id=None, pad_token_id=0)
    return out[0, ids.shape[1]:].tolist()


def recording(propose, seen: list):
    """Wrap a proposer's ``propose`` to keep the tokens of every draft tree."""
    def wrapped(*args, **kwargs):
        tree = propose(*args, **kwargs)
        seen.append(tree.tokens.tolist())
        return tree
    return wrapped


@pytest.mark.parametrize("shape", ["chain:3", "tree:10,3,3"])
def test_restricted_vocab_greedy_equals_target_and_drafts_inside_it(tiny, shape):
    model, frozen, drafter = tiny
    g = torch.Generator().manual_seed(1)
    counts = torch.randint(0, 100, (VOCAB,), generator=g)
    head = draft_head(frozen.lm_head, counts, 12)
    allowed = set(head.ids.tolist())
    for seed in range(4):
        ids = torch.randint(0, VOCAB, (1, 6), generator=torch.Generator().manual_seed(seed))
        session = DrafterSession(drafter, frozen, head)
        proposer = SingleProposer(session, DraftShape.parse(shape))
        seen: list[list[int]] = []
        proposer.propose = recording(proposer.propose, seen)
        eng = SpeculativeEngine(model, proposer, make_rule("sps", Warp(0.0)), max_new_tokens=16)
        rec = eng.generate(ids, torch.Generator().manual_seed(0))
        assert rec.new_tokens == reference(model, ids, 16)
        assert seen and all(set(t) <= allowed for t in seen)


def test_sampled_chain_distributions_live_on_the_full_vocabulary(tiny):
    model, frozen, drafter = tiny
    counts = torch.arange(VOCAB, dtype=torch.int64)
    head = draft_head(frozen.lm_head, counts, 10)
    session = DrafterSession(drafter, frozen, head)
    ids = torch.randint(0, VOCAB, (1, 5), generator=torch.Generator().manual_seed(0))
    feats = frozen.features(ids)
    session.start(ids, feats[0], int(frozen.lm_head(feats[0, -1]).argmax()))
    tree = session.draft_chain(3, Warp(1.0), torch.Generator().manual_seed(0))
    dists = tree.draft_dists
    assert dists.shape == (3, VOCAB)
    outside = torch.ones(VOCAB, dtype=torch.bool)
    outside[head.ids] = False
    assert float(dists[:, outside].abs().max()) == 0 and float(dists.sum(-1).sub(1).abs().max()) < 1e-12
    assert set(tree.tokens.tolist()) <= set(head.ids.tolist())


def test_build_engine_reads_the_drafters_counts(tiny, tmp_path):
    from checkpoints.drafter_io import save_drafter

    model, _, drafter = tiny
    save_drafter(drafter, tmp_path / "d")
    with pytest.raises(ValueError, match="no token_counts"):
        build_engine(model, drafter=tmp_path / "d", shape="chain:2", draft_vocab=8)
    save_token_counts(torch.arange(VOCAB), tmp_path / "d")
    eng = build_engine(model, drafter=tmp_path / "d", shape="chain:2", draft_vocab=8)
    assert eng.proposer.session.head.size >= 8
