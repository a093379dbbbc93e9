"""Objectives against explicit hand computations (loops over positions, vocab and hidden dims)."""

from __future__ import annotations

import math

import torch

from tests.conftest import make_tiny_target
from training.drafter import DrafterConfig, EagleDrafter
from training.losses import (
    LossWeights,
    alignment_mask,
    conditional_rates,
    distribution_losses,
    expected_acceptance_length,
    feature_loss,
    objective,
)
from training.step import Batch, drafter_passes, eval_counts, summarize_counts
from training.target import FrozenTarget


def _smooth_l1(a: float, b: float) -> float:
    d = abs(a - b)
    return 0.5 * d * d if d < 1 else d - 0.5


def test_feature_loss_is_mean_over_hidden_then_positions():
    g = torch.Generator().manual_seed(0)
    pred, tgt = torch.randn(3, 4, generator=g) * 2, torch.randn(3, 4, generator=g)
    expected = sum(sum(_smooth_l1(pred[n, i].item(), tgt[n, i].item()) for i in range(4)) / 4
                   for n in range(3)) / 3
    assert math.isclose(feature_loss(pred, tgt).item(), expected, rel_tol=1e-6)


def test_soft_and_topk_ce_match_loops_and_chunking_is_exact():
    g = torch.Generator().manual_seed(1)
    n, h, v, k = 5, 3, 7, 3
    pred, tgt = torch.randn(n, h, generator=g), torch.randn(n, h, generator=g)
    w, b = torch.randn(v, h, generator=g), torch.randn(v, generator=g)
    soft_sum = topk_sum = 0.0
    for i in range(n):
        zq = [sum(w[c, d].item() * pred[i, d].item() for d in range(h)) + b[c].item() for c in range(v)]
        zp = [sum(w[c, d].item() * tgt[i, d].item() for d in range(h)) + b[c].item() for c in range(v)]
        lse_q = math.log(sum(math.exp(z) for z in zq))
        zp_max = max(zp)
        p = [math.exp(z - zp_max) for z in zp]
        p = [x / sum(p) for x in p]
        logq = [z - lse_q for z in zq]
        soft_sum += -sum(p[c] * logq[c] for c in range(v))
        top = sorted(range(v), key=lambda c: -p[c])[:k]
        topk_sum += -sum(p[c] * logq[c] for c in top)  # not renormalised
    for chunk in (1, 2, 100):
        soft, topk = distribution_losses(pred, tgt, w, b, k=k, chunk=chunk)
        assert math.isclose(soft.item(), soft_sum / n, rel_tol=1e-5)
        assert math.isclose(topk.item(), topk_sum / n, rel_tol=1e-5)
    # gradients through the checkpointed chunks equal the unchunked ones
    p1 = pred.clone().requires_grad_(True)
    p2 = pred.clone().requires_grad_(True)
    sum(distribution_losses(p1, tgt, w, b, k=k, chunk=2)).backward()
    sum(distribution_losses(p2, tgt, w, b, k=k, chunk=100)).backward()
    torch.testing.assert_close(p1.grad, p2.grad)
    # two passes sharing the target: each averaged over its own valid positions, then summed
    pred2 = torch.randn(n, h, generator=g)
    valid = torch.tensor([[1, 1, 1, 1, 1], [0, 1, 0, 1, 1]])
    soft2, topk2 = distribution_losses(torch.stack([pred, pred2]), tgt, w, b, valid=valid, k=k, chunk=2)
    s_a, t_a = distribution_losses(pred, tgt, w, b, k=k)
    s_b, t_b = distribution_losses(pred2[[1, 3, 4]], tgt[[1, 3, 4]], w, b, k=k)
    assert math.isclose(soft2.item(), (s_a + s_b).item(), rel_tol=1e-5)
    assert math.isclose(topk2.item(), (t_a + t_b).item(), rel_tol=1e-5)
    fl2 = feature_loss(torch.stack([pred, pred2]), tgt, valid)
    assert math.isclose(fl2.item(), (feature_loss(pred, tgt) + feature_loss(pred2[[1, 3, 4]], tgt[[1, 3, 4]])).item(),
                        rel_tol=1e-6)
    parts = objective(pred, tgt, w, b, LossWeights(topk=0.5, k=k))
    expected = feature_loss(pred, tgt) + 0.1 * soft_sum / n + 0.5 * topk_sum / n
    assert math.isclose(parts["loss"].item(), expected.item(), rel_tol=1e-5)


def test_alignment_mask_matches_its_definition():
    length = 6
    for j in (1, 2, 3):
        mask = alignment_mask(length, j)
        assert mask.shape == (length, j * length)
        for t in range(length):
            for k in range(1, j + 1):
                for s in range(length):
                    want = s <= t - j + 1 if k == 1 else s == t - j + k
                    assert bool(mask[t, (k - 1) * length + s]) == want


def test_context_aligned_passes_equal_explicit_recursive_drafting():
    """Pass j at position t equals a plain causal drafter run on a feature sequence where the j-1
    most recent positions hold the drafter's own earlier predictions (built by explicit loops)."""
    target = FrozenTarget(make_tiny_target(), "tiny")
    drafter = EagleDrafter.from_config(DrafterConfig.from_target(target.config, target.info(), seed=3))
    ids = torch.randint(0, 64, (1, 7), generator=torch.Generator().manual_seed(2))
    emb, feats = target.embed_tokens(ids), target.features(ids)
    with torch.no_grad():
        preds = drafter_passes(drafter, emb, feats, passes=3)
    memo: dict[tuple[int, int], torch.Tensor] = {}

    def pred(j: int, t: int) -> torch.Tensor:
        if (j, t) not in memo:
            seq = []
            for s in range(t + 1):
                if s <= t - j + 1 or s == 0:
                    seq.append(feats[0, s])
                else:
                    seq.append(pred(j - (t - s) - 1, s - 1))
            x = torch.stack(seq)[None]
            with torch.no_grad():
                out = drafter(emb[:, : t + 1], x, torch.arange(t + 1)[None])
            memo[(j, t)] = out[0, t]
        return memo[(j, t)]

    for j in (1, 2, 3):
        for t in range(7):
            torch.testing.assert_close(preds[j - 1][0, t], pred(j, t), rtol=1e-4, atol=1e-5)


def test_eal_from_cumulative_rates_and_eval_counts_by_hand():
    assert math.isclose(expected_acceptance_length([0.5, 0.25, 0.1]), 1.85)
    assert conditional_rates([0.5, 0.25, 0.1]) == [0.5, 0.5, 0.4]
    # a drafter that copies the target exactly: every depth agrees, EAL = 1 + depth
    target = FrozenTarget(make_tiny_target(), "tiny")
    ids = torch.randint(2, 64, (2, 8), generator=torch.Generator().manual_seed(5))
    mask = torch.ones_like(ids)
    mask[1, :3] = 0
    feats = target.features(ids)

    def oracle(embeds, inputs, position_ids, attention_mask=None, cache=None):
        return feats[:, 1:]

    counts = eval_counts(oracle, target, Batch(ids, mask, 16), depth=3, weights=LossWeights(), chunk=4)
    m = summarize_counts(counts, 3)
    # trained positions t (mask[t+1]=1): row 0 has 7, row 1 has positions 2..6 -> 5; total 12
    assert m["positions"] == 12
    # chains of j consecutive trained positions with t >= j-1: row0 7,6,5; row1 5,4,3
    assert counts[2 + 3 * 2: 2 + 3 * 3].tolist() == [12.0, 10.0, 8.0]
    assert m["acc_cumulative"] == [1.0, 1.0, 1.0] and math.isclose(m["eal"], 4.0)
