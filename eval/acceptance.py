"""Acceptance rules behind one interface: ``greedy``, ``sps``, ``tas``, ``cactus``, ``cactus-exact``.

q = target distribution, p = draft distribution, both warped identically (``eval.warp.Warp``);
exact definitions in DESIGN.md section 6. All arithmetic is float64 over the whole vocabulary
(vectorised; the only Python loops run over tree levels and siblings).

Tree walk (sequential rules). At the current node, the candidates are its children, tried in
order. A *sampled* candidate x ~ p_i (chains at T > 0) is accepted with probability
min(1, r(x) / p_i(x)) and on rejection r <- normalize(max(r - p_i, 0)); a *deterministic*
candidate (EAGLE-2 top-k nodes, p_i = one-hot) is accepted with probability r(x) and on rejection
r(x) <- 0, renormalised. r starts at q (``sps``) or at h (``cactus``: the Cactus target for the first
candidate only, then the lossless residual rule for the remaining siblings, so the token emitted at
a node is distributed exactly as h). If every candidate is rejected the correction token is drawn
from r; after the last accepted node without children the bonus token is drawn from q.
This is SpecInfer's multi-round rule: exactly lossless for ``sps`` whatever the number of siblings.

Duplicate sibling tokens (merged trees): deterministic siblings with the same token form ONE
candidate, tried once at its first position; when it is accepted the walk continues in the union of
the duplicates' subtrees (their children are again grouped by token). The union is the trie of the
two trees, so the rule above applies unchanged and stays exactly lossless; at T = 0 this finds the
longest matching path. The kept KV path uses the first node of each accepted group (its KV equals
its duplicates' up to rounding: same tokens, same positions). Sampled duplicates are tried separately.

``tas`` accepts every node with q_parent(n) > min(eps, alpha * exp(-H(q_parent))), takes the longest
accepted path (first in sibling order on ties) and then samples from q there. ``greedy`` accepts iff
n = argmax q (raw logits), which equals ``sps`` at temperature 0.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from eval.proposer import DraftTree
from eval.warp import Warp, entropy

RULES = ("greedy", "sps", "tas", "cactus", "cactus-exact")


# ----------------------------------------------------------------------------- Cactus h(n)

def binary_kl(g: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """KL(h || q) when h moves mass to one token: g ln(g/q) + (1-g) ln((1-g)/(1-q)) (= KL over V)."""
    g, q = torch.as_tensor(g, dtype=torch.float64), torch.as_tensor(q, dtype=torch.float64)
    return torch.special.xlogy(g, g) - torch.special.xlogy(g, q) + torch.special.xlogy(1 - g, 1 - g) \
        - torch.special.xlogy(1 - g, 1 - q)


def cactus_gamma_closed(qn: torch.Tensor, delta: float) -> torch.Tensor:
    """The paper's closed form h(n) = min(q + sqrt(2 delta q (1 - q)), 1)."""
    qn = torch.as_tensor(qn, dtype=torch.float64)
    return torch.clamp(qn + torch.sqrt(2.0 * delta * qn * (1.0 - qn)).clamp(min=0), max=1.0)


def cactus_gamma_exact(qn: torch.Tensor, delta: float, iters: int = 64) -> torch.Tensor:
    """max gamma in [q, 1] with binary KL(gamma || q) <= delta, by vectorised bisection.

    Returns the lower bracket, so the constraint always holds; 64 halvings reach float64 resolution.
    """
    qn = torch.as_tensor(qn, dtype=torch.float64)
    if delta <= 0:
        return qn.clone()
    lo, hi = qn.clone(), torch.ones_like(qn)
    for _ in range(iters):
        mid = 0.5 * (lo + hi)
        ok = binary_kl(mid, qn) <= delta
        lo, hi = torch.where(ok, mid, lo), torch.where(ok, hi, mid)
    full = -torch.log(qn.clamp(min=1e-300)) <= delta  # KL(1 || q) = -ln q
    return torch.where(full, torch.ones_like(qn), torch.where(qn > 0, lo, torch.zeros_like(qn)))


def cactus_target(q: torch.Tensor, token: int, gamma: torch.Tensor | float) -> torch.Tensor:
    """h with h(n) = gamma and the other tokens scaled by (1 - gamma) / (1 - q(n))."""
    qn = q[token]
    gamma = torch.as_tensor(gamma, dtype=q.dtype)
    if float(qn) >= 1.0:
        return q.clone()
    h = q * ((1.0 - gamma) / (1.0 - qn))
    h[token] = gamma
    return h


# ----------------------------------------------------------------------------- one level

def accept_prob(r: torch.Tensor, token: int, p: torch.Tensor | None) -> float:
    """min(1, r(x) / p(x)); deterministic candidates (p None) have p(x) = 1."""
    rx = float(r[token])
    if p is None:
        return min(1.0, max(rx, 0.0))
    px = float(p[token])
    return 1.0 if px <= 0.0 or rx >= px else rx / px


def residual(r: torch.Tensor, token: int, p: torch.Tensor | None) -> torch.Tensor:
    """normalize(max(r - p, 0)) with p = one-hot(x) for deterministic candidates.

    If no mass is left (only reachable through rounding: the rejection had probability ~0), r is
    returned unchanged so that every probability stays finite.
    """
    if p is None:
        out = r.clone()
        out[token] = 0.0
    else:
        out = (r - p.to(r)).clamp(min=0.0)
    total = float(out.sum())
    return out / total if total > 1e-300 else r


@dataclass
class Candidate:
    """One candidate at a tree level: its nodes (duplicates grouped) and its draft distribution."""

    token: int
    nodes: list[int]
    p: torch.Tensor | None


def level_candidates(tree: DraftTree, group: list[int], kids: list[list[int]]) -> list[Candidate]:
    """The children of all nodes in ``group`` (-1 = root) as candidates, duplicates grouped."""
    out: list[Candidate] = []
    by_token: dict[int, Candidate] = {}
    nodes = sorted(c for g in group for c in kids[g + 1])
    tokens = tree.tokens.tolist() if nodes else []
    for c in nodes:
        p = None
        if tree.draft_dists is not None and not bool(torch.isnan(tree.draft_dists[c, 0])):
            p = tree.draft_dists[c].to(torch.float64).cpu()
        tok = tokens[c]
        if p is None and tok in by_token:
            by_token[tok].nodes.append(c)
            continue
        cand = Candidate(tok, [c], p)
        if p is None:
            by_token[tok] = cand
        out.append(cand)
    return out


@dataclass
class WalkResult:
    """The outcome of one verification walk."""

    path: list[int]  # accepted node indices (first node of each accepted group), root to leaf
    next_token: int  # correction or bonus token
    accepted_nodes: list[int] = field(default_factory=list)  # every node of every accepted group
    tried_nodes: list[int] = field(default_factory=list)  # nodes whose acceptance was decided


class AcceptanceRule:
    """Base: sequential multi-candidate walk. Subclasses set the first candidate's target."""

    name = "sps"
    lossless = True

    def __init__(self, warp: Warp):
        self.warp = warp

    def target_probs(self, logits: torch.Tensor) -> torch.Tensor:
        return self.warp.probs(logits.detach().cpu())

    def candidate_target(self, r: torch.Tensor, cand: Candidate, index: int) -> torch.Tensor:
        """The distribution candidate ``index`` is judged against (r = q or the current residual)."""
        return r

    def level_outcome(self, q: torch.Tensor, cands: list[Candidate]) -> tuple[list[float], list[torch.Tensor]]:
        """Conditional accept probabilities a_i and the residual r_i before candidate i (+ the final one)."""
        probs, residuals = [], []
        r = q
        for i, c in enumerate(cands):
            r = self.candidate_target(r, c, i)
            residuals.append(r)
            probs.append(accept_prob(r, c.token, c.p))
            r = residual(r, c.token, c.p)
        residuals.append(r)
        return probs, residuals

    def walk(self, tree: DraftTree, logits: torch.Tensor, generator: torch.Generator) -> WalkResult:
        """``logits`` (N + 1, V): row 0 at the root, row i + 1 at node i."""
        kids = tree.children()
        group, res = [-1], WalkResult([], -1)
        while True:
            q = self.target_probs(logits[group[0] + 1])
            cands = level_candidates(tree, group, kids)
            if not cands:
                res.next_token = _sample(q, generator)
                return res
            r = q
            for i, c in enumerate(cands):
                r = self.candidate_target(r, c, i)
                res.tried_nodes.extend(c.nodes)
                if _uniform(generator) < accept_prob(r, c.token, c.p):
                    res.path.append(c.nodes[0])
                    res.accepted_nodes.extend(c.nodes)
                    group = c.nodes
                    break
                r = residual(r, c.token, c.p)
            else:
                res.next_token = _sample(r, generator)
                return res


class SpS(AcceptanceRule):
    name = "sps"


class Greedy(AcceptanceRule):
    """Accept iff the draft token is the target's argmax (temperature ignored)."""

    name = "greedy"

    def __init__(self, warp: Warp | None = None):
        super().__init__(Warp(0.0))


class Cactus(AcceptanceRule):
    """Cactus: the first candidate at each node is judged against h (closed form or exact)."""

    lossless = False

    def __init__(self, warp: Warp, delta: float = 1.0, exact: bool = False, siblings: str = "first"):
        super().__init__(warp)
        if not (delta >= 0 and math.isfinite(delta)):
            raise ValueError(f"cactus delta must be a finite number >= 0, got {delta}")
        if siblings not in ("first", "all"):
            raise ValueError(f"cactus siblings must be 'first' or 'all', got {siblings!r}")
        self.delta, self.exact, self.siblings = float(delta), exact, siblings
        self.name = "cactus-exact" if exact else "cactus"

    def gamma(self, qn: torch.Tensor) -> torch.Tensor:
        return (cactus_gamma_exact if self.exact else cactus_gamma_closed)(qn, self.delta)

    def candidate_target(self, r: torch.Tensor, cand: Candidate, index: int) -> torch.Tensor:
        """h for the first candidate; later siblings get the lossless residual rule (``siblings="first"``)
        or Cactus again on the residual (``"all"``, compounds the budget: measured in docs/engine.md)."""
        if self.delta == 0.0 or (index > 0 and self.siblings == "first"):
            return r
        return cactus_target(r, cand.token, self.gamma(r[cand.token]))


class TAS(AcceptanceRule):
    """Typical acceptance (Medusa): deterministic threshold, longest accepted path."""

    name = "tas"
    lossless = False

    def __init__(self, warp: Warp, eps: float = 0.09, alpha: float = 0.3):
        super().__init__(warp)
        self.eps, self.alpha = float(eps), float(alpha)

    def threshold(self, q: torch.Tensor) -> float:
        return min(self.eps, self.alpha * math.exp(-float(entropy(q))))

    def walk(self, tree: DraftTree, logits: torch.Tensor, generator: torch.Generator) -> WalkResult:
        kids = tree.children()
        tried: list[int] = []

        def best(group: list[int]) -> tuple[list[list[int]], torch.Tensor]:
            q = self.target_probs(logits[group[0] + 1])
            cands = level_candidates(tree, group, kids)
            thr = self.threshold(q)
            best_path: list[list[int]] = []
            best_q = q
            for c in cands:
                tried.extend(c.nodes)
                if float(q[c.token]) > thr:
                    sub, sub_q = best(c.nodes)
                    if 1 + len(sub) > len(best_path):
                        best_path, best_q = [c.nodes] + sub, sub_q
            return best_path, best_q

        groups, q_end = best([-1])
        return WalkResult([g[0] for g in groups], _sample(q_end, generator),
                          [n for g in groups for n in g], tried)


def make_rule(name: str, warp: Warp | None = None, *, delta: float = 1.0, eps: float = 0.09, alpha: float = 0.3,
              cactus_siblings: str = "first") -> AcceptanceRule:
    """Build a rule by name (``RULES``); ``warp`` defaults to greedy (temperature 0)."""
    warp = warp if warp is not None else Warp(0.0)
    if name == "greedy":
        return Greedy(warp)
    if name == "sps":
        return SpS(warp)
    if name == "tas":
        return TAS(warp, eps=eps, alpha=alpha)
    if name in ("cactus", "cactus-exact"):
        return Cactus(warp, delta=delta, exact=name == "cactus-exact", siblings=cactus_siblings)
    raise ValueError(f"unknown acceptance rule {name!r}; choose from {', '.join(RULES)}")


def _uniform(generator: torch.Generator) -> float:
    return float(torch.rand((), generator=generator, dtype=torch.float64))


def _sample(dist: torch.Tensor, generator: torch.Generator) -> int:
    """One token from a (V,) distribution with an inverse-CDF draw (one uniform per token)."""
    u = _uniform(generator)
    cdf = dist.cumsum(0)
    idx = int(torch.searchsorted(cdf, torch.tensor([u * float(cdf[-1])], dtype=cdf.dtype), right=True))
    idx = min(idx, dist.shape[0] - 1)
    while float(dist[idx]) <= 0.0 and idx > 0:  # rounding can land on a zero-mass token at the end
        idx -= 1
    return idx


def walk_distribution(rule: AcceptanceRule, tree: DraftTree, logits: torch.Tensor
                      ) -> dict[tuple[int, ...], float]:
    """Exact distribution of the emitted token sequences of ``rule.walk`` (sequential rules only)."""
    kids = tree.children()
    out: dict[tuple[int, ...], float] = {}

    def rec(group: list[int], prefix: tuple[int, ...], mass: float) -> None:
        q = rule.target_probs(logits[group[0] + 1])
        cands = level_candidates(tree, group, kids)
        if not cands:
            for v in torch.nonzero(q > 0).flatten().tolist():
                out[prefix + (v,)] = out.get(prefix + (v,), 0.0) + mass * float(q[v])
            return
        probs, residuals = rule.level_outcome(q, cands)
        reach = mass
        for c, a in zip(cands, probs):
            if a > 0:
                rec(c.nodes, prefix + (c.token,), reach * a)
            reach *= 1.0 - a
        final = residuals[-1]
        for v in torch.nonzero(final > 0).flatten().tolist():
            out[prefix + (v,)] = out.get(prefix + (v,), 0.0) + reach * float(final[v])

    rec([-1], (), 1.0)
    return out


def node_distribution(rule: AcceptanceRule, q: torch.Tensor, tokens: Sequence[int]) -> torch.Tensor:
    """Exact distribution of the token emitted at a node whose deterministic children are ``tokens``."""
    cands = [Candidate(int(t), [i], None) for i, t in enumerate(tokens)]
    probs, residuals = rule.level_outcome(q, cands)
    out, reach = torch.zeros_like(q), 1.0
    for c, a in zip(cands, probs):
        out[c.token] += reach * a
        reach *= 1.0 - a
    return out + reach * residuals[-1]


def kl(a: torch.Tensor, b: torch.Tensor) -> float:
    """KL(a || b) in nats (0 log 0 = 0; inf where a > 0 = b)."""
    return float((torch.special.xlogy(a, a) - torch.special.xlogy(a, b)).sum())
