"""merge_trees and the routing score on hand-built trees (no models)."""

from __future__ import annotations

import math

import pytest
import torch

from eval.proposer import ORIGIN_SHARED, DraftShape, DraftTree
from eval.strategies import half_shape, merge_trees, tree_score


def make_tree(tokens, parents, probs, origin=0, dists=None) -> DraftTree:
    tokens = torch.tensor(tokens)
    parents = torch.tensor(parents)
    depths = torch.zeros_like(tokens)
    conf = torch.zeros(len(tokens), dtype=torch.float64)
    probs = torch.tensor(probs, dtype=torch.float64)
    for i, p in enumerate(parents.tolist()):
        depths[i] = 1 if p < 0 else depths[p] + 1
        conf[i] = probs[i] * (1 if p < 0 else conf[p])
    tree = DraftTree(tokens, parents, depths, probs, conf, torch.arange(len(tokens), dtype=torch.float64),
                     dists, torch.full_like(tokens, origin))
    tree.validate()
    return tree


def paths(tree: DraftTree) -> set[tuple]:
    out, toks = set(), tree.tokens.tolist()
    for i in range(tree.num_nodes):
        path, j = [], i
        while j >= 0:
            path.append(toks[j])
            j = int(tree.parents[j])
        out.add(tuple(reversed(path)))
    return out


A = make_tree([5, 7, 6, 8], [-1, -1, 0, 2], [0.6, 0.3, 0.5, 0.9])  # 5 -> 6 -> 8 ; 7
B = make_tree([5, 9, 6, 4], [-1, -1, 0, 0], [0.7, 0.2, 0.4, 0.3])  # 5 -> {6, 4} ; 9


def test_concat_keeps_disjoint_subtrees_and_sorts_siblings():
    m = merge_trees([A, B], "concat")
    m.validate()
    assert m.num_nodes == A.num_nodes + B.num_nodes
    assert sorted(m.origin.tolist()) == [0] * 4 + [1] * 4
    root_kids = [i for i in range(m.num_nodes) if int(m.parents[i]) == -1]
    probs = m.draft_probs[root_kids].tolist()
    assert probs == sorted(probs, reverse=True) and len(root_kids) == 4
    assert paths(m) == paths(A) | paths(B)
    assert (m.depths[1:] >= m.depths[:-1]).all()  # breadth-first order


def test_trie_merges_identical_prefixes_only():
    m = merge_trees([A, B], "trie")
    m.validate()
    assert paths(m) == paths(A) | paths(B)
    assert m.num_nodes == len(paths(A) | paths(B)) == 6
    toks = m.tokens.tolist()
    shared = {toks[i] for i in range(m.num_nodes) if int(m.origin[i]) == ORIGIN_SHARED}
    assert shared == {5, 6}  # the prefix 5 and 5 -> 6 came from both


def test_trie_of_a_tree_with_itself_is_the_tree():
    m = merge_trees([A, A], "trie")
    assert paths(m) == paths(A) and m.num_nodes == A.num_nodes
    assert (m.origin == ORIGIN_SHARED).all()


def test_sampled_nodes_are_never_merged_and_keep_order():
    dists = torch.full((2, 10), 0.1, dtype=torch.float64)
    a = make_tree([3, 4], [-1, 0], [0.2, 0.9], dists=dists)
    b = make_tree([3, 4], [-1, 0], [0.8, 0.9], dists=dists.clone())
    m = merge_trees([a, b], "trie")
    assert m.num_nodes == 4 and m.draft_dists is not None and m.draft_dists.shape == (4, 10)
    assert m.origin.tolist()[:2] == [0, 1]  # tree order, not sorted by the sampled tokens' probability
    mixed = merge_trees([a, A], "concat")  # a deterministic tree gets NaN rows
    assert torch.isnan(mixed.draft_dists[mixed.origin == 1]).all()
    assert not torch.isnan(mixed.draft_dists[mixed.origin == 0]).any()


def test_half_shape_never_exceeds_budget():
    for text in ("tree:60,5,10", "tree:8,3,4", "chain:4", "chain:5", "tree:3,2,2"):
        shape = DraftShape.parse(text)
        assert 2 * half_shape(shape).budget <= shape.budget
    with pytest.raises(ValueError, match="at least 2"):
        half_shape(DraftShape.parse("chain:1"))


def test_tree_score_and_bad_mode():
    assert tree_score(A, "confidence") == pytest.approx(float(A.confidence.mean()))
    assert tree_score(A, "entropy") == -1.5
    assert tree_score(DraftTree.empty(), "confidence") == -math.inf
    with pytest.raises(ValueError, match="unknown merge mode"):
        merge_trees([A, B], "union")
