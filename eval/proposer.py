"""Draft trees and the proposer interface shared by the engine and the combination strategies.

Final API (agreed in ENGINE_API.md; this docstring is the reference):

``DraftTree``: the drafted nodes below the root. The root is the last committed token (already
emitted, not yet in the target's KV cache) and is *not* a node. Nodes are topologically ordered
(parent before child) and siblings appear in descending draft probability.

- ``tokens (N,)``, ``parents (N,)`` (-1 = child of the root), ``depths (N,)`` (1 = child of root)
- ``draft_probs (N,)``: the drafter's (temperature-1, unwarped) probability of the node's token given
  its parent; ``confidence (N,)``: product of draft_probs along the path (DESIGN.md section 7);
  ``entropy (N,)``: entropy (nats) of the unwarped drafter distribution the node was drawn from.
- ``draft_dists (N, V) | None``: the drafter's *warped* distribution p at the node's parent, for
  nodes that were *sampled* from p (chains at T > 0). ``None`` (or a row of NaN) marks deterministic
  nodes (EAGLE-2 top-k trees, greedy chains): acceptance rules then treat p(node) = 1.
- ``origin (N,)``: which drafter proposed the node (0 for a single drafter, 0/1 for merged trees,
  ``ORIGIN_SHARED`` (= -1) for trie nodes proposed by both).
- helpers: ``num_nodes``, ``DraftTree.chain(tokens, ...)``, ``DraftTree.empty()``,
  ``attention_mask()`` ((N, N) bool, node i sees its ancestors and itself), ``validate()``.

Duplicate sibling tokens (merged trees) are allowed; the verifier's rule is in ``eval/acceptance.py``
(deterministic siblings with equal tokens form one candidate whose subtrees are merged, exactly lossless).

``Proposer`` protocol (batch size 1):

- ``start(prompt_ids (1, L), target_features (1, L, h), first_token)`` after the target's prefill pass;
- ``propose(warp, generator) -> DraftTree``;
- ``advance(accepted_tokens (k,), accepted_features (k + 1, h), emitted_token)`` after verification.
  ``accepted_features`` has k + 1 rows: row 0 is the target feature at the *root* position (it
  predicted the first accepted token), row i the target feature at accepted node i. EAGLE drafters
  consume (embed(s_{t+1}), f_t) pairs, so these are exactly the features the accepted path needs;
- ``step_log: list[dict]`` per-step records, drained by the engine into the generation record;
- ``verify_budget: int``: nominal nodes per verification pass.

``DrafterSession`` (one EAGLE drafter + its KV cache) lives in ``eval/drafting.py``;
``SingleProposer(session, shape)`` and ``StandaloneLMProposer`` are below.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace
from typing import Protocol, runtime_checkable

import torch

from eval.kv_cache import cache_length, crop, new_cache
from eval.warp import Warp, draw_token

ORIGIN_SHARED = -1  # trie nodes proposed by more than one drafter


@dataclass
class DraftTree:
    tokens: torch.Tensor
    parents: torch.Tensor
    depths: torch.Tensor
    draft_probs: torch.Tensor
    confidence: torch.Tensor
    entropy: torch.Tensor
    draft_dists: torch.Tensor | None = None
    origin: torch.Tensor | None = None

    def __post_init__(self) -> None:
        if self.origin is None:
            self.origin = torch.zeros_like(self.tokens)

    @property
    def num_nodes(self) -> int:
        return int(self.tokens.shape[0])

    @property
    def max_depth(self) -> int:
        return int(self.depths.max()) if self.num_nodes else 0

    @classmethod
    def empty(cls, device=None) -> DraftTree:
        z = torch.zeros(0, dtype=torch.long, device=device)
        f = torch.zeros(0, dtype=torch.float64, device=device)
        return cls(z, z.clone(), z.clone(), f, f.clone(), f.clone())

    @classmethod
    def chain(cls, tokens, draft_probs=None, entropy=None, draft_dists=None, origin: int = 0) -> DraftTree:
        """A chain: node i's parent is node i - 1."""
        tokens = torch.as_tensor(tokens, dtype=torch.long).reshape(-1)
        n = tokens.shape[0]
        dev = tokens.device
        probs = (torch.ones(n, dtype=torch.float64, device=dev) if draft_probs is None
                 else torch.as_tensor(draft_probs, dtype=torch.float64, device=dev).reshape(-1))
        ent = (torch.zeros(n, dtype=torch.float64, device=dev) if entropy is None
               else torch.as_tensor(entropy, dtype=torch.float64, device=dev).reshape(-1))
        return cls(tokens, torch.arange(n, device=dev) - 1, torch.arange(1, n + 1, device=dev), probs,
                   probs.cumprod(0), ent, draft_dists, torch.full((n,), origin, dtype=torch.long, device=dev))

    def to(self, device) -> DraftTree:
        return replace(self, **{k: (v.to(device) if isinstance(v, torch.Tensor) else v)
                                for k, v in self.__dict__.items()})

    def validate(self, vocab_size: int | None = None) -> None:
        """Raise ValueError when the arrays are inconsistent (wrong shapes, order, depths)."""
        n = self.num_nodes
        for name in ("parents", "depths", "draft_probs", "confidence", "entropy", "origin"):
            if getattr(self, name).shape != (n,):
                raise ValueError(f"DraftTree.{name} has shape {tuple(getattr(self, name).shape)}, expected ({n},)")
        if self.draft_dists is not None and self.draft_dists.shape[0] != n:
            raise ValueError(f"DraftTree.draft_dists has {self.draft_dists.shape[0]} rows for {n} nodes")
        parents, depths = self.parents.tolist(), self.depths.tolist()
        for i, (p, d) in enumerate(zip(parents, depths)):
            if not -1 <= p < i:
                raise ValueError(f"node {i} has parent {p}: nodes must be topologically ordered")
            if d != (1 if p < 0 else depths[p] + 1):
                raise ValueError(f"node {i} has depth {d}, inconsistent with its parent {p}")
        if vocab_size is not None and n and (int(self.tokens.min()) < 0 or int(self.tokens.max()) >= vocab_size):
            raise ValueError(f"draft tokens outside the vocabulary [0, {vocab_size})")

    def attention_mask(self) -> torch.Tensor:
        """(N, N) bool: node i attends to node j iff j is i or an ancestor of i."""
        n = self.num_nodes
        mask = torch.eye(n, dtype=torch.bool)
        for i, p in enumerate(self.parents.tolist()):
            if p >= 0:
                mask[i] |= mask[p]
        return mask.to(self.tokens.device)

    def children(self) -> list[list[int]]:
        """children()[0] lists the root's children; children()[i + 1] those of node i."""
        out: list[list[int]] = [[] for _ in range(self.num_nodes + 1)]
        for i, p in enumerate(self.parents.tolist()):
            out[p + 1].append(i)
        return out


@dataclass(frozen=True)
class DraftShape:
    """``chain:K`` or ``tree:TOTAL,DEPTH,TOPK`` (EAGLE-2: TOTAL - 1 nodes kept, DEPTH expansion rounds)."""

    kind: str = "tree"
    k: int = 4
    total_tokens: int = 60
    depth: int = 5
    top_k: int = 10

    def __post_init__(self) -> None:
        if self.kind not in ("chain", "tree", "none"):
            raise ValueError(f"draft shape kind must be chain, tree or none, got {self.kind!r}")
        if self.kind == "chain" and self.k < 1:
            raise ValueError("a chain needs k >= 1")
        if self.kind == "tree" and (self.total_tokens < 2 or self.depth < 0 or self.top_k < 1):
            raise ValueError("a tree needs total_tokens >= 2, depth >= 0, top_k >= 1")

    @classmethod
    def parse(cls, text: str) -> DraftShape:
        text = text.strip().lower()
        if text in ("none", "plain"):
            return cls(kind="none")
        m = re.fullmatch(r"chain:(\d+)", text)
        if m:
            return cls(kind="chain", k=int(m.group(1)))
        m = re.fullmatch(r"tree:(\d+),(\d+),(\d+)", text)
        if m:
            return cls(kind="tree", total_tokens=int(m.group(1)), depth=int(m.group(2)), top_k=int(m.group(3)))
        raise ValueError(f"bad draft shape {text!r}: use chain:K, tree:TOTAL,DEPTH,TOPK or none")

    def __str__(self) -> str:
        if self.kind == "chain":
            return f"chain:{self.k}"
        if self.kind == "tree":
            return f"tree:{self.total_tokens},{self.depth},{self.top_k}"
        return "none"

    @property
    def budget(self) -> int:
        return {"chain": self.k, "tree": self.total_tokens - 1, "none": 0}[self.kind]


@runtime_checkable
class Proposer(Protocol):
    step_log: list[dict]
    verify_budget: int

    def start(self, prompt_ids: torch.Tensor, target_features: torch.Tensor, first_token: int) -> None: ...

    def propose(self, warp: Warp, generator: torch.Generator) -> DraftTree: ...

    def advance(self, accepted_tokens: torch.Tensor, accepted_features: torch.Tensor,
                emitted_token: int) -> None: ...


class NoProposer:
    """Proposes nothing: the engine then decodes plainly (one token per target pass, tau = 1)."""

    verify_budget = 0

    def __init__(self) -> None:
        self.step_log: list[dict] = []

    def start(self, prompt_ids, target_features, first_token) -> None:
        self._device = prompt_ids.device

    def propose(self, warp, generator) -> DraftTree:
        return DraftTree.empty(self._device)

    def advance(self, accepted_tokens, accepted_features, emitted_token) -> None:
        pass


@dataclass
class SingleProposer:
    """One ``DrafterSession`` drafting chains or EAGLE-2 trees of a fixed shape."""

    session: object
    shape: DraftShape = field(default_factory=DraftShape)
    step_log: list[dict] = field(default_factory=list)

    @property
    def verify_budget(self) -> int:
        return self.shape.budget

    def start(self, prompt_ids, target_features, first_token) -> None:
        self.session.start(prompt_ids, target_features, first_token)

    def propose(self, warp: Warp, generator: torch.Generator) -> DraftTree:
        if self.shape.kind == "chain":
            return self.session.draft_chain(self.shape.k, warp, generator)
        if self.shape.kind == "tree":
            return self.session.draft_tree(self.shape, warp, generator)
        return DraftTree.empty(self.session.device)

    def advance(self, accepted_tokens, accepted_features, emitted_token) -> None:
        self.session.advance(accepted_tokens, accepted_features, emitted_token)


class StandaloneLMProposer:
    """Chains from a small causal LM sharing the target's tokenizer (the Cactus paper's set-up).

    The LM keeps its own KV cache of the committed sequence; target features are not used.
    """

    def __init__(self, model, k: int = 4):
        self.model = model.eval()
        self.k = int(k)
        self.verify_budget = self.k
        self.step_log: list[dict] = []
        self.cache = None
        self._next_logits: torch.Tensor | None = None

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    @torch.no_grad()
    def _feed(self, ids: torch.Tensor) -> torch.Tensor:
        out = self.model(input_ids=ids.reshape(1, -1).to(self.device), cache=self.cache, use_cache=True)
        self.cache = out.cache if getattr(out, "cache", None) is not None else out.past_key_values
        return out.logits[0, -1]

    def start(self, prompt_ids, target_features, first_token) -> None:
        self.cache = new_cache(self.model.config)
        tokens = torch.cat([prompt_ids.reshape(-1), torch.tensor([first_token], device=prompt_ids.device)])
        self._next_logits = self._feed(tokens)

    @torch.no_grad()
    def propose(self, warp: Warp, generator: torch.Generator) -> DraftTree:
        committed = cache_length(self.cache)
        logits = self._next_logits
        toks, probs, ents, dists = [], [], [], []
        for i in range(self.k):
            tok, prob, ent, p = draw_token(logits, warp, generator)
            toks.append(tok)
            probs.append(prob)
            ents.append(ent)
            dists.append(p)
            if i + 1 < self.k:
                logits = self._feed(torch.tensor([tok]))
        crop(self.cache, committed)
        dev = self.device
        return DraftTree.chain(torch.tensor(toks, device=dev), probs, ents,
                               None if warp.greedy else torch.stack(dists))

    def advance(self, accepted_tokens, accepted_features, emitted_token) -> None:
        tokens = torch.cat([accepted_tokens.reshape(-1).to(self.device),
                            torch.tensor([emitted_token], device=self.device)])
        self._next_logits = self._feed(tokens)
