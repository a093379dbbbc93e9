"""Combination strategies for two specialist drafters (DESIGN.md section 7).

- ``RoutedProposer`` (``confidence`` / ``entropy`` / ``oracle``): every step both drafters draft
  from the same accepted context; the tree with the higher mean node confidence (product of draft
  probabilities along the path) or the lower mean node entropy is the only one verified (ties go to
  the first drafter); both drafters then advance with the accepted tokens. ``oracle`` always uses
  a drafter fixed per question (chosen from full single runs, by the caller). One tree per step.
- ``MergedProposer`` (``concat`` / ``trie`` / ``equal-budget``): both trees are verified in one
  pass under a shared root. ``concat`` keeps them as disjoint subtrees (TAPS: twice the budget);
  ``trie`` merges identical prefixes into one node (origin ``ORIGIN_SHARED``); ``equal-budget``
  gives each drafter half the node budget and merges them as a trie, so the merged tree never
  has more nodes than a single drafter's.

Routing sampled drafts (chains at T > 0): the choice is made on greedy probe chains of both drafters
and only then is the chosen drafter's chain sampled, so the choice depends on the context alone and
the verified draft is an unbiased sample of that drafter's p (the lossless rule stays exact).

Only deterministic nodes (EAGLE-2 top-k trees, greedy chains) are merged by the trie: nodes sampled
from a drafter's distribution (chains at T > 0) stay separate siblings, because a token proposed by
two independent samplers has no single draft probability the lossless rule could use.

Each step appends a record to ``step_log``: ``{"route": i, "scores": [a, b], "nodes": [na, nb]}`` for
routing (the oracle logs only its own tree's size), and
``{"nodes": [a, b], "merged": n}`` for merging (the grid derives a merged step's "route" from the
engine's per-node records: the origin of the deepest accepted node, -1 = shared, None = none).
"""

from __future__ import annotations

import math

import torch

from eval.proposer import ORIGIN_SHARED, DraftShape, DraftTree
from eval.warp import Warp

ROUTE_MODES = ("confidence", "entropy", "oracle")
MERGE_MODES = ("concat", "trie", "equal-budget")


def _draft(session, shape: DraftShape, warp: Warp, generator: torch.Generator) -> DraftTree:
    if shape.kind == "chain":
        return session.draft_chain(shape.k, warp, generator)
    if shape.kind == "tree":
        return session.draft_tree(shape, warp, generator)
    raise ValueError(f"combination strategies need a chain or tree draft shape, got {shape}")


def half_shape(shape: DraftShape) -> DraftShape:
    """The shape with half the node budget (each drafter's share in ``equal-budget``)."""
    half = shape.budget // 2
    if half < 1:
        raise ValueError(f"equal-budget needs a node budget of at least 2, {shape} has {shape.budget}")
    if shape.kind == "chain":
        return DraftShape(kind="chain", k=half)
    return DraftShape(kind="tree", total_tokens=half + 1, depth=shape.depth, top_k=shape.top_k)


def tree_score(tree: DraftTree, mode: str) -> float:
    """Higher is better: mean node confidence, or minus the mean node entropy."""
    if tree.num_nodes == 0:
        return -math.inf
    if mode == "confidence":
        return float(tree.confidence.double().mean())
    if mode == "entropy":
        return -float(tree.entropy.double().mean())
    raise ValueError(f"unknown routing score {mode!r}")


def _deterministic_rows(tree: DraftTree) -> torch.Tensor:
    """(N,) bool: True where the node was not sampled (no draft distribution row, or a NaN row)."""
    if tree.draft_dists is None:
        return torch.ones(tree.num_nodes, dtype=torch.bool)
    return torch.isnan(tree.draft_dists.reshape(tree.num_nodes, -1)[:, 0]).cpu()


def merge_trees(trees: list[DraftTree], mode: str = "concat") -> DraftTree:
    """Merge draft trees under one root; tree i's nodes get origin i (or ``ORIGIN_SHARED``).

    ``concat``: disjoint subtrees. ``trie`` (and ``equal-budget``, whose halving is done by the
    proposer): a deterministic node whose parent and token equal an existing deterministic node's
    is merged into it. The result is ordered by depth, and deterministic siblings by descending draft
    probability (sampled siblings keep tree order: reordering by their sampled values would bias them).
    """
    if mode not in MERGE_MODES:
        raise ValueError(f"unknown merge mode {mode!r}; choose from {MERGE_MODES}")
    trie = mode != "concat"
    device = trees[0].tokens.device
    # merged nodes as (tree, index) of their first source; key -> merged index for the trie
    src: list[tuple[int, int]] = []
    parent: list[int] = []
    origin: list[int] = []
    index: dict[tuple[int, int], int] = {}
    det_key: dict[tuple[int, int], int] = {}
    dets = [_deterministic_rows(tree).tolist() for tree in trees]
    for t, tree in enumerate(trees):
        det = dets[t]
        toks, pars = tree.tokens.tolist(), tree.parents.tolist()
        for i in range(tree.num_nodes):
            mp = -1 if pars[i] < 0 else index[(t, pars[i])]
            key = (mp, toks[i])
            if trie and det[i] and key in det_key:
                j = det_key[key]
                if origin[j] != t:
                    origin[j] = ORIGIN_SHARED
                index[(t, i)] = j
                continue
            index[(t, i)] = len(src)
            if det[i]:
                det_key.setdefault(key, len(src))
            src.append((t, i))
            parent.append(mp)
            origin.append(t)
    n = len(src)
    prob = [float(trees[t].draft_probs[i]) for t, i in src]
    det_all = [dets[t][i] for t, i in src]
    children: list[list[int]] = [[] for _ in range(n + 1)]
    for j, p in enumerate(parent):
        children[p + 1].append(j)
    order: list[int] = []
    frontier = [-1]
    while frontier:  # breadth first: depth by depth, siblings by descending draft probability
        nxt = []
        for p in frontier:
            kids = children[p + 1]
            if all(det_all[j] for j in kids):  # sampled siblings keep their order (see module doc)
                kids = sorted(kids, key=lambda j: -prob[j])
            order.extend(kids)
            nxt.extend(kids)
        frontier = nxt
    new = {old: k for k, old in enumerate(order)}

    def gather(name: str) -> torch.Tensor:
        return torch.stack([getattr(trees[src[j][0]], name)[src[j][1]] for j in order]) if n else \
            getattr(trees[0], name)[:0]

    dists = None
    if any(tree.draft_dists is not None for tree in trees) and n:
        vocab = next(tr.draft_dists for tr in trees if tr.draft_dists is not None).shape[-1]
        rows = []
        for j in order:
            t, i = src[j]
            d = trees[t].draft_dists
            rows.append(d[i].to(torch.float64) if d is not None
                        else torch.full((vocab,), float("nan"), dtype=torch.float64, device=device))
        dists = torch.stack(rows)
    parents = torch.tensor([-1 if parent[j] < 0 else new[parent[j]] for j in order], dtype=torch.long)
    merged = DraftTree(tokens=gather("tokens"), parents=parents.to(device), depths=gather("depths"),
                       draft_probs=gather("draft_probs"), confidence=gather("confidence"),
                       entropy=gather("entropy"), draft_dists=dists,
                       origin=torch.tensor([origin[j] for j in order], dtype=torch.long, device=device))
    return merged


class _PairProposer:
    def __init__(self, sessions: list, shape: DraftShape):
        if len(sessions) != 2:
            raise ValueError(f"combination strategies take two drafters, got {len(sessions)}")
        self.sessions = list(sessions)
        self.shape = shape
        self.step_log: list[dict] = []

    def start(self, prompt_ids, target_features, first_token) -> None:
        for s in self._active():
            s.start(prompt_ids, target_features, first_token)

    def advance(self, accepted_tokens, accepted_features, emitted_token) -> None:
        for s in self._active():
            s.advance(accepted_tokens, accepted_features, emitted_token)

    def _active(self) -> list:
        return self.sessions


class RoutedProposer(_PairProposer):
    """Verify one drafter's tree per step, chosen by confidence, entropy, or a fixed oracle choice."""

    def __init__(self, sessions: list, shape: DraftShape, mode: str = "confidence", choice: int | None = None):
        super().__init__(sessions, shape)
        if mode not in ROUTE_MODES:
            raise ValueError(f"unknown routing mode {mode!r}; choose from {ROUTE_MODES}")
        if mode == "oracle" and choice not in (0, 1):
            raise ValueError("oracle routing needs choice=0 or 1 (the drafter that did better on this question)")
        self.mode, self.choice = mode, choice

    @property
    def verify_budget(self) -> int:
        return self.shape.budget

    def _active(self) -> list:
        return [self.sessions[self.choice]] if self.mode == "oracle" else self.sessions

    def propose(self, warp: Warp, generator: torch.Generator) -> DraftTree:
        if self.mode == "oracle":
            tree = _draft(self.sessions[self.choice], self.shape, warp, generator)
            self.step_log.append({"route": self.choice, "nodes": [tree.num_nodes]})
        else:
            sampled = self.shape.kind == "chain" and not warp.greedy
            # sampled drafts: route on greedy probes, so the choice never depends on the sampled
            # tokens (that would bias the verified draft away from p and break the lossless rule)
            probe_warp = Warp(0.0) if sampled else warp
            trees = [_draft(s, self.shape, probe_warp, generator) for s in self.sessions]
            scores = [tree_score(t, self.mode) for t in trees]
            pick = 0 if scores[0] >= scores[1] else 1
            tree = _draft(self.sessions[pick], self.shape, warp, generator) if sampled else trees[pick]
            self.step_log.append({"route": pick, "scores": [s if math.isfinite(s) else None for s in scores],
                                  "nodes": [t.num_nodes for t in trees]})
        tree.origin = torch.full_like(tree.tokens, self.step_log[-1]["route"])
        return tree


class MergedProposer(_PairProposer):
    """Verify both drafters' trees in one pass: disjoint (concat), as a trie, or at equal budget."""

    def __init__(self, sessions: list, shape: DraftShape, mode: str = "concat"):
        super().__init__(sessions, shape)
        if mode not in MERGE_MODES:
            raise ValueError(f"unknown merge mode {mode!r}; choose from {MERGE_MODES}")
        self.mode = mode
        self.part_shape = half_shape(shape) if mode == "equal-budget" else shape

    @property
    def verify_budget(self) -> int:
        return self.shape.budget if self.mode == "equal-budget" else 2 * self.shape.budget

    def propose(self, warp: Warp, generator: torch.Generator) -> DraftTree:
        trees = [_draft(s, self.part_shape, warp, generator) for s in self.sessions]
        tree = merge_trees(trees, self.mode)
        self.step_log.append({"nodes": [t.num_nodes for t in trees], "merged": tree.num_nodes})
        return tree
