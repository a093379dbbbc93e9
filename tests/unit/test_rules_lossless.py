"""Exact enumeration: the SpS walk's output distribution equals the target's (TV < 1e-9).

For every tree path u (a token sequence the tree can reach) and every token c, the probability
that the walk's output, continued by the target itself where the walk stops early, starts with
u + c must equal Q(u + c) = prod of q along u + c. This pins the whole emitted distribution on
everything the tree can influence. Chains at T > 0 are sampled from p, so their drafts are
enumerated too (weighted by p); deterministic trees are fixed.
"""

from __future__ import annotations

import itertools

import pytest
import torch

from eval.acceptance import make_rule, walk_distribution
from eval.proposer import DraftTree
from eval.warp import Warp

V = 5


class World:
    """Random target logits and draft distributions for every context (a token tuple)."""

    def __init__(self, seed: int, warp: Warp, scale: float = 2.0):
        self.seed, self.warp, self.scale = seed, warp, scale
        self._q: dict = {}
        self._p: dict = {}

    def _randn(self, ctx: tuple, salt: int) -> torch.Tensor:
        g = torch.Generator().manual_seed(hash((self.seed, salt, ctx)) % (2**62))
        return torch.randn(V, generator=g, dtype=torch.float64) * self.scale

    def logits(self, ctx: tuple) -> torch.Tensor:
        if ctx not in self._q:
            self._q[ctx] = self._randn(ctx, 1)
        return self._q[ctx]

    def q(self, ctx: tuple) -> torch.Tensor:
        return self.warp.probs(self.logits(ctx))

    def p(self, ctx: tuple, drafter: int = 0) -> torch.Tensor:
        key = (ctx, drafter)
        if key not in self._p:
            self._p[key] = self.warp.probs(self._randn(ctx, 2 + drafter))
        return self._p[key]


def paths(tree: DraftTree) -> list[tuple]:
    """Token paths of all nodes, indexed by node."""
    out: list[tuple] = []
    toks = tree.tokens.tolist()
    for i, p in enumerate(tree.parents.tolist()):
        out.append((out[p] if p >= 0 else ()) + (toks[i],))
    return out


def tree_logits(world: World, tree: DraftTree) -> torch.Tensor:
    return torch.stack([world.logits(())] + [world.logits(u) for u in paths(tree)])


def check_lossless(world: World, mixture: list[tuple[float, dict]], contexts: set[tuple]) -> float:
    """Max TV over contexts u of P_total(u + . | u-prefix reached) vs q(. | u) (both unconditional)."""
    worst = 0.0
    for u in contexts:
        q_u = 1.0
        for i in range(len(u)):
            q_u *= float(world.q(u[:i])[u[i]])
        expected = q_u * world.q(u)
        total = torch.zeros(V, dtype=torch.float64)
        for weight, dist in mixture:
            for s, prob in dist.items():
                for c in range(V):
                    full = u + (c,)
                    if s[:len(full)] == full:
                        total[c] += weight * prob
                    elif full[:len(s)] == s:  # the walk stopped early: the target continues
                        cont = 1.0
                        for i in range(len(s), len(full)):
                            cont *= float(world.q(full[:i])[full[i]])
                        total[c] += weight * prob * cont
        worst = max(worst, 0.5 * float((total - expected).abs().sum()))
    return worst


def all_contexts(max_len: int) -> set[tuple]:
    return {c for n in range(max_len + 1) for c in itertools.product(range(V), repeat=n)}


def sampled_chain(world: World, drafts: tuple, drafter: int = 0) -> DraftTree:
    dists = torch.stack([world.p(drafts[:i], drafter) for i in range(len(drafts))])
    return DraftTree.chain(torch.tensor(drafts), draft_dists=dists)


WARPS = [Warp(1.0), Warp(0.7, top_k=3), Warp(1.3, top_p=0.8)]


@pytest.mark.parametrize(("warp", "k"), [(WARPS[0], 1), (WARPS[0], 2), (WARPS[1], 3), (WARPS[2], 2)], ids=str)
def test_sps_chain_enumeration_is_lossless(warp, k):
    world = World(k, warp)
    rule = make_rule("sps", warp)
    mixture = []
    for drafts in itertools.product(range(V), repeat=k):
        weight = 1.0
        for i in range(k):
            weight *= float(world.p(drafts[:i])[drafts[i]])
        if weight == 0:
            continue
        tree = sampled_chain(world, drafts)
        mixture.append((weight, walk_distribution(rule, tree, tree_logits(world, tree))))
    assert sum(w for w, _ in mixture) == pytest.approx(1.0, abs=1e-12)
    assert check_lossless(world, mixture, all_contexts(k)) < 1e-9


def random_tree(seed: int, n: int, dup: bool) -> DraftTree:
    """A random deterministic tree; with ``dup`` siblings may repeat tokens (merged-tree concat)."""
    g = torch.Generator().manual_seed(seed)
    parents, tokens, depths = [], [], []
    for i in range(n):
        p = int(torch.randint(-1, i, (1,), generator=g)) if i else -1
        if p >= 0 and depths[p] >= 3:
            p = -1
        used = {tokens[j] for j in range(i) if parents[j] == p}
        choices = [t for t in range(V) if dup or t not in used] or list(range(V))
        tokens.append(choices[int(torch.randint(0, len(choices), (1,), generator=g))])
        parents.append(p)
        depths.append(1 if p < 0 else depths[p] + 1)
    ones = torch.ones(n, dtype=torch.float64)
    return DraftTree(torch.tensor(tokens), torch.tensor(parents), torch.tensor(depths), ones, ones, ones * 0)


@pytest.mark.parametrize("warp", WARPS, ids=str)
@pytest.mark.parametrize("dup", [False, True], ids=["distinct", "duplicates"])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_sps_tree_enumeration_is_lossless(warp, dup, seed):
    world = World(100 + seed, warp)
    tree = random_tree(seed, 14, dup)
    tree.validate(V)
    if dup:
        toks, par = tree.tokens.tolist(), tree.parents.tolist()
        assert any(par[i] == par[j] and toks[i] == toks[j] for i in range(len(toks)) for j in range(i)), \
            "this seed must produce duplicate siblings"
    dist = walk_distribution(make_rule("sps", warp), tree, tree_logits(world, tree))
    assert sum(dist.values()) == pytest.approx(1.0, abs=1e-12)
    contexts = {()} | set(paths(tree))
    assert check_lossless(world, [(1.0, dist)], contexts) < 1e-9


def test_merged_sampled_chains_with_duplicates_are_lossless():
    """Two drafters' sampled chains as sibling subtrees (merge-concat at T > 0): duplicates are
    tried separately with their own p (SpecInfer multi-round rule)."""
    warp = Warp(1.0)
    world = World(7, warp)
    rule = make_rule("sps", warp)
    mixture = []
    for a in itertools.product(range(V), repeat=2):
        for b in itertools.product(range(V), repeat=2):
            w = float(world.p(())[a[0]] * world.p(a[:1])[a[1]] * world.p((), 1)[b[0]] * world.p(b[:1], 1)[b[1]])
            ca, cb = sampled_chain(world, a, 0), sampled_chain(world, b, 1)
            tree = DraftTree(torch.cat([ca.tokens, cb.tokens]), torch.tensor([-1, 0, -1, 2]),
                             torch.tensor([1, 2, 1, 2]), torch.ones(4, dtype=torch.float64),
                             torch.ones(4, dtype=torch.float64), torch.zeros(4, dtype=torch.float64),
                             torch.cat([ca.draft_dists, cb.draft_dists]), torch.tensor([0, 0, 1, 1]))
            mixture.append((w, walk_distribution(rule, tree, tree_logits(world, tree))))
    assert check_lossless(world, mixture, all_contexts(2)) < 1e-9


def test_broken_rule_is_caught_by_the_enumeration():
    """The check can fail: sampling the correction from q instead of the residual is not lossless."""
    warp = Warp(1.0)
    world = World(3, warp)
    rule = make_rule("sps", warp)
    import eval.acceptance as acc

    original = acc.residual
    try:
        acc.residual = lambda r, token, p: r  # broken: no residual
        tree = random_tree(0, 8, False)
        dist = walk_distribution(rule, tree, tree_logits(world, tree))
    finally:
        acc.residual = original
    assert check_lossless(world, [(1.0, dist)], {()} | set(paths(tree))) > 1e-3


@pytest.mark.parametrize("name", ["cactus", "cactus-exact"])
def test_relaxed_rules_do_change_the_distribution(name):
    """Sanity of the harness: the relaxed rules are measurably not lossless on a random tree."""
    warp = Warp(1.0)
    world = World(11, warp, scale=1.0)
    tree = random_tree(4, 10, False)
    rule = make_rule(name, warp, delta=0.5)
    dist = walk_distribution(rule, tree, tree_logits(world, tree))
    assert sum(dist.values()) == pytest.approx(1.0, abs=1e-12)
    assert check_lossless(world, [(1.0, dist)], {()} | set(paths(tree))) > 1e-3
