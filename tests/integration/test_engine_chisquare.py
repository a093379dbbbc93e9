"""End to end at T > 0: the joint distribution of generated tokens 2 and 3 matches the target.

Token 1 comes from the prefill pass and cannot reveal a broken rule; tokens 2 and 3 come from
verification passes (accepted drafts, corrections, bonus tokens). A tiny float64 target with a
vocabulary of 8 and a deliberately poor (untrained, differently seeded) EAGLE drafter; the exact
target joint P(t2, t3) = sum_t1 q(t1) q(t2 | t1) q(t3 | t1, t2) comes from 64 batched forwards.
A fixed seed makes the outcome deterministic; a relaxed rule (Cactus, delta = 1) must be rejected
by the same test, which shows it has power.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch
from scipy import stats

from eval.acceptance import make_rule
from eval.drafting import DrafterSession
from eval.engine import SpeculativeEngine
from eval.proposer import DraftShape, SingleProposer
from eval.warp import Warp
from tests.conftest import make_tiny_target
from tests.integration.engine_helpers import one_thread  # noqa: F401
from training.drafter import DrafterConfig, EagleDrafter
from training.target import FrozenTarget

pytestmark = pytest.mark.usefixtures("one_thread")
V, RUNS, PROMPT = 8, 3000, [[1, 2, 3]]


@pytest.fixture(scope="module")
def models():
    model = make_tiny_target(vocab_size=V, hidden_size=16, layers=1, seed=11, dtype=torch.float64)
    with torch.no_grad():
        model.lm_head.weight.mul_(6.0)  # sharper, varied target distributions (random init is near uniform)
    frozen = FrozenTarget(model, "tiny-chi")
    drafter = EagleDrafter.from_config(DrafterConfig.from_target(model.config, frozen.info(), seed=99))
    return model, frozen, drafter.to(torch.float64).eval()


def exact_joint(model, warp: Warp) -> np.ndarray:
    """P(t2, t3) under the warped target, marginalising t1."""
    seqs = torch.tensor([PROMPT[0] + [a, b] for a, b in itertools.product(range(V), repeat=2)])
    with torch.no_grad():
        logits = model(seqs).logits
    q1 = warp.probs(logits[0, 2])  # after the prompt
    q2 = warp.probs(logits[:, 3]).reshape(V, V, V)[:, 0]  # [t1] -> dist of t2
    q3 = warp.probs(logits[:, 4]).reshape(V, V, V)  # [t1, t2] -> dist of t3
    joint = (q1[:, None, None] * q2[:, :, None] * q3).sum(0)
    return joint.numpy()


def sample_joint(models, shape: str, rule: str, warp: Warp, seed: int, runs: int = RUNS) -> np.ndarray:
    model, frozen, drafter = models
    counts = np.zeros((V, V))
    session = DrafterSession(drafter, frozen)
    eng = SpeculativeEngine(model, SingleProposer(session, DraftShape.parse(shape)),
                            make_rule(rule, warp, delta=1.0), max_new_tokens=3, warp=warp)
    gen = torch.Generator().manual_seed(seed)
    prompt = torch.tensor(PROMPT)
    for _ in range(runs):
        rec = eng.generate(prompt, gen)
        counts[rec.new_tokens[1], rec.new_tokens[2]] += 1
    return counts


def chi_square_p(counts: np.ndarray, probs: np.ndarray) -> float:
    """Pearson chi-square with cells of expected count < 5 pooled."""
    exp = probs.reshape(-1) * counts.sum()
    obs = counts.reshape(-1)
    small = exp < 5
    exp_c = np.append(exp[~small], exp[small].sum())
    obs_c = np.append(obs[~small], obs[small].sum())
    if exp_c[-1] == 0:
        exp_c, obs_c = exp_c[:-1], obs_c[:-1]
    return float(stats.chisquare(obs_c, exp_c * obs_c.sum() / exp_c.sum()).pvalue)


@pytest.mark.parametrize("warp", [Warp(1.0), Warp(0.8, top_k=6, top_p=0.95)], ids=str)
def test_design_detects_a_five_percent_tv_shift(models, warp):
    """Power at RUNS samples (noncentral chi-square, alpha 1e-3) against a TV = 0.05 shift taken from the
    four likeliest cells and put on one mid-probability cell, so a pass is meaningful. (A shift spread
    over half of all cells in proportion to p would need several times more runs.)"""
    probs = exact_joint(models[0], warp).reshape(-1)
    order = np.argsort(probs)[::-1]
    shifted = probs.copy()
    top = order[:4]
    shifted[top] -= 0.05 * probs[top] / probs[top].sum()
    shifted[order[int((probs > 0).sum()) // 2]] += 0.05
    nc = RUNS * float(((shifted - probs) ** 2 / np.where(probs > 0, probs, 1.0)).sum())
    df = int((probs * RUNS >= 5).sum())
    power = stats.ncx2.sf(stats.chi2.ppf(1 - 1e-3, df), df, nc)
    assert power > 0.9


CONFIGS = [("chain:2", Warp(1.0)), ("tree:6,2,2", Warp(1.0)), ("tree:5,1,3", Warp(0.8, top_k=6, top_p=0.95))]


@pytest.mark.parametrize(("shape", "warp"), CONFIGS, ids=[f"{c[0]}-T{c[1].temperature}" for c in CONFIGS])
def test_sps_tokens_two_and_three_match_the_target(models, shape, warp):
    counts = sample_joint(models, shape, "sps", warp, seed=1234)
    p = chi_square_p(counts, exact_joint(models[0], warp))
    assert p > 1e-3, f"chi-square p = {p:.2e}"


def test_relaxed_rule_is_rejected_by_the_same_test(models):
    counts = sample_joint(models, "chain:2", "cactus", Warp(1.0), seed=1234, runs=500)
    assert chi_square_p(counts, exact_joint(models[0], Warp(1.0))) < 1e-3
