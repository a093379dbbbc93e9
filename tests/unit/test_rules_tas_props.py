"""TAS against hand-computed decisions; property tests of every rule on extreme distributions."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from eval.acceptance import RULES, level_candidates, make_rule
from eval.proposer import DraftTree
from eval.warp import Warp


def _logits(probs: list[float]) -> torch.Tensor:
    p = torch.tensor(probs, dtype=torch.float64)
    return torch.where(p > 0, p.log(), torch.full_like(p, -math.inf))


def _tree(tokens, parents) -> DraftTree:
    n = len(tokens)
    depths = []
    for p in parents:
        depths.append(1 if p < 0 else depths[p] + 1)
    ones = torch.ones(n, dtype=torch.float64)
    return DraftTree(torch.tensor(tokens), torch.tensor(parents), torch.tensor(depths), ones, ones, ones * 0)


def test_tas_threshold_hand_computed():
    tas = make_rule("tas", Warp(1.0))
    # H = 1.1422 nats -> 0.3 * exp(-H) = 0.0957 -> threshold min(0.09, 0.0957) = 0.09
    assert tas.threshold(torch.tensor([0.5, 0.3, 0.15, 0.05], dtype=torch.float64)) == pytest.approx(0.09)
    # uniform over 10: H = ln 10 -> 0.3 / 10 = 0.03
    assert tas.threshold(torch.full((10,), 0.1, dtype=torch.float64)) == pytest.approx(0.03)
    # eps and alpha are configurable (Medusa's swapped function defaults would give 0.3 / 0.09 here)
    assert make_rule("tas", Warp(1.0), eps=0.3, alpha=0.09).threshold(
        torch.full((10,), 0.1, dtype=torch.float64)) == pytest.approx(0.009)


def test_tas_decisions_and_longest_path_hand_computed():
    q_root = [0.5, 0.3, 0.15, 0.05]  # accept tokens 0, 1, 2 (> 0.09); reject 3
    q_peak = [0.97, 0.01, 0.01, 0.01]  # threshold 0.09: only token 0
    q_flat = [0.25, 0.25, 0.25, 0.25]  # threshold min(0.09, 0.3/4) = 0.075: all
    # root children: 3 (rejected), 1, 0 ; node 1 (token 1) has child token 0 with q_peak -> accepted;
    # node 2 (token 0) has children token 2 (q_flat -> accepted) which has child token 1 (q_peak -> rejected)
    tree = _tree([3, 1, 0, 0, 2, 1], [-1, -1, -1, 1, 2, 4])
    # row 0 judges the root's children, row i + 1 judges node i's children
    rows = torch.stack([_logits(q_root), _logits(q_flat), _logits(q_peak), _logits(q_flat),
                        _logits(q_flat), _logits(q_peak), _logits(q_root)])
    res = make_rule("tas", Warp(1.0)).walk(tree, rows, torch.Generator().manual_seed(0))
    # both accepted paths have length 2: [1 -> 3] and [2 -> 4]; node 5 rejected (q_peak[1] = 0.01)
    assert res.path == [1, 3]  # the first in sibling order wins ties
    assert 0 not in res.accepted_nodes and 5 not in res.accepted_nodes
    # make node 5 acceptable: now [2 -> 4 -> 5] is the longest
    rows[5] = _logits(q_flat)
    res = make_rule("tas", Warp(1.0)).walk(tree, rows, torch.Generator().manual_seed(0))
    assert res.path == [2, 4, 5]
    assert 0 <= res.next_token < 4 and q_root[res.next_token] > 0  # sampled from q at node 5 (= q_root)


def test_greedy_picks_longest_matching_path_among_duplicates():
    """T = 0 on a merged tree: duplicates of the argmax token continue in the union of subtrees."""
    # the root argmax is 2; both nodes 0 and 1 carry token 2; only node 1's child matches next
    tree = _tree([2, 2, 0, 3, 1], [-1, -1, 0, 1, 3])
    rows = torch.zeros(6, 5, dtype=torch.float64)
    rows[0, 2] = 5.0
    rows[1, 3] = 5.0  # at node 0 (token 2) the target wants 3, which only node 1 proposes
    rows[2, 3] = 5.0
    rows[4, 1] = 5.0  # at node 3 (token 3) the target wants 1 = node 4
    rows[5, 4] = 5.0
    for name in ("greedy", "sps"):
        res = make_rule(name, Warp(0.0)).walk(tree, rows, torch.Generator().manual_seed(0))
        assert res.path == [0, 3, 4] and res.next_token == 4
        assert sorted(res.accepted_nodes) == [0, 1, 3, 4]


def test_level_candidates_group_deterministic_duplicates_only():
    tree = _tree([2, 2, 1], [-1, -1, -1])
    cands = level_candidates(tree, [-1], tree.children())
    assert [(c.token, c.nodes) for c in cands] == [(2, [0, 1]), (1, [2])]
    tree.draft_dists = torch.full((3, 4), 0.25, dtype=torch.float64)
    assert [(c.token, c.nodes) for c in level_candidates(tree, [-1], tree.children())] == \
        [(2, [0]), (2, [1]), (1, [2])]


def test_unknown_rule_and_bad_warp_fail_clearly():
    with pytest.raises(ValueError, match="unknown acceptance rule"):
        make_rule("spec", Warp(1.0))
    with pytest.raises(ValueError, match="temperature"):
        Warp(-1.0)
    with pytest.raises(ValueError, match="top_p"):
        Warp(1.0, top_p=0.0)
    with pytest.raises(ValueError, match="delta"):
        make_rule("cactus", Warp(1.0), delta=-0.1)


V = 6
special = st.sampled_from(["onehot", "uniform", "random", "zero_at_draft", "one_at_draft", "same"])


@st.composite
def scenarios(draw):
    kind_q, kind_p = draw(special), draw(special)
    temp = draw(st.sampled_from([0.0, 1e-6, 1e-3, 0.5, 1.0, 3.0]))
    top_k = draw(st.sampled_from([0, 1, 3]))
    top_p = draw(st.sampled_from([1.0, 0.9, 1e-3]))
    seed = draw(st.integers(0, 10_000))
    chain = draw(st.booleans())
    return kind_q, kind_p, temp, top_k, top_p, seed, chain


def _make(kind: str, draft: int, g: torch.Generator) -> torch.Tensor:
    x = torch.randn(V, generator=g, dtype=torch.float64) * 5
    if kind == "onehot":
        x = torch.full((V,), -math.inf, dtype=torch.float64)
        x[int(torch.randint(0, V, (1,), generator=g))] = 0.0
    elif kind == "uniform":
        x = torch.zeros(V, dtype=torch.float64)
    elif kind == "zero_at_draft":
        x[draft] = -math.inf
    elif kind == "one_at_draft":
        x = torch.full((V,), -math.inf, dtype=torch.float64)
        x[draft] = 0.0
    return x


@settings(max_examples=120, deadline=None)
@given(scenarios(), st.sampled_from(RULES))
def test_every_rule_is_finite_and_samples_valid_tokens(scenario, rule_name):
    kind_q, kind_p, temp, top_k, top_p, seed, chain = scenario
    g = torch.Generator().manual_seed(seed)
    warp = Warp(temp, top_k, top_p)
    rule = make_rule(rule_name, warp, delta=float(seed % 3))
    tokens = torch.randint(0, V, (3,), generator=g)
    if chain:
        p_logits = torch.stack([_make(kind_p, int(t), g) for t in tokens])
        if kind_p == "same":
            p_logits = torch.stack([_make("random", 0, g)] * 3)
        dists = warp.probs(p_logits)
        tokens = torch.multinomial(dists, 1, generator=g).flatten()
        tree = DraftTree.chain(tokens, draft_dists=dists)
    else:
        tree = _tree(tokens.tolist(), [-1, -1, 0])
    rows = torch.stack([_make(kind_q, int(tokens[min(i, 2)]), g) for i in range(tree.num_nodes + 1)])
    if kind_q == "same" and chain:
        rows[: tree.num_nodes] = p_logits
    for i in range(rows.shape[0]):
        q = rule.target_probs(rows[i])
        assert torch.isfinite(q).all() and float(q.sum()) == pytest.approx(1.0, abs=1e-9)
        cands = level_candidates(tree, [i - 1], tree.children())
        if cands and rule_name != "tas":
            probs, residuals = rule.level_outcome(q, cands)
            assert all(math.isfinite(a) and 0.0 <= a <= 1.0 for a in probs)
            assert all(torch.isfinite(r).all() and float(r.sum()) == pytest.approx(1.0, abs=1e-9)
                       for r in residuals)
    res = rule.walk(tree, rows, torch.Generator().manual_seed(seed))
    assert 0 <= res.next_token < V
    end = res.path[-1] + 1 if res.path else 0
    assert float(rule.target_probs(rows[end])[res.next_token]) > 0 or rule_name != "greedy"
    parents = tree.parents.tolist()
    for a, b in zip([-1] + res.path, res.path):
        assert parents[b] == a or tree.tokens[parents[b]] == tree.tokens[a]  # a path (up to duplicates)
