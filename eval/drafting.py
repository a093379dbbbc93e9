"""EAGLE drafting: a ``DrafterSession`` (one drafter + its KV cache) drafts chains and EAGLE-2 trees.

Sequence convention: the committed sequence is s_0 .. s_M, where s_M (the root) is emitted but not
yet in any KV cache. The drafter's cache holds positions 0 .. M-1 with inputs (embed(s_{t+1}), f_t),
f_t the target's feature at t, so its last output predicts the feature at M, whose logits propose
the root's children. A node at depth d is drafted at drafter position M + d - 1 with input
(embed(parent's token), feature the drafter predicted at the parent) (DESIGN.md sections 3 and 5).
"""

from __future__ import annotations

import torch

from eval.draft_vocab import DraftHead
from eval.kv_cache import cache_length, causal_tree, crop, new_cache, prefix_tree_mask
from eval.proposer import DraftShape, DraftTree
from eval.warp import Warp, draw_token, entropy


class DrafterSession:
    """One EAGLE drafter with its own KV cache and its last predicted feature.

    ``target`` is a ``FrozenTarget`` (or any object with ``embed_tokens`` and ``lm_head`` modules);
    ``head`` an optional ``DraftHead`` restricting proposals to a draft vocabulary (eval/draft_vocab.py).
    """

    def __init__(self, drafter, target, head: DraftHead | None = None):
        self.drafter = drafter.eval()
        self.embed = target.embed_tokens
        self.head = head if head is not None else DraftHead(target.lm_head)
        self.cache = None
        self.last_feature: torch.Tensor | None = None  # (h,) drafter prediction at the root position
        param = next(self.drafter.parameters())
        self.device, self.dtype = param.device, param.dtype

    @property
    def length(self) -> int:
        return cache_length(self.cache)

    @torch.no_grad()
    def _forward(self, tokens: torch.Tensor, features: torch.Tensor, positions: torch.Tensor,
                 tree_mask: torch.Tensor) -> torch.Tensor:
        """Append ``len(tokens)`` entries to the cache; ``tree_mask`` (n, n) is among the new entries."""
        dev = self.device
        embeds = self.embed(tokens.to(dev).reshape(1, -1)).to(self.dtype)
        mask = prefix_tree_mask(self.length, tree_mask.to(dev), self.dtype)
        out = self.drafter(embeds, features.to(dev, self.dtype).reshape(1, embeds.shape[1], -1),
                           positions.to(dev).reshape(1, -1), attention_mask=mask, cache=self.cache)
        return out[0]

    def _logits(self, features: torch.Tensor) -> torch.Tensor:
        return self.head.logits(features)

    @torch.no_grad()
    def start(self, prompt_ids: torch.Tensor, target_features: torch.Tensor, first_token: int) -> None:
        """Build the drafter's cache of the prompt from the target's prefill features."""
        ids = prompt_ids.reshape(-1).to(self.device)
        tokens = torch.cat([ids[1:], torch.tensor([int(first_token)], device=self.device)])
        n = tokens.shape[0]
        self.cache = new_cache()
        out = self._forward(tokens, target_features.reshape(n, -1), torch.arange(n), causal_tree(n))
        self.last_feature = out[-1]

    @torch.no_grad()
    def advance(self, accepted_tokens: torch.Tensor, accepted_features: torch.Tensor, emitted_token: int) -> None:
        """Extend the cache by the accepted path with the target's features (k + 1 rows)."""
        tokens = torch.cat([accepted_tokens.reshape(-1).to(self.device),
                            torch.tensor([int(emitted_token)], device=self.device)])
        n = tokens.shape[0]
        if accepted_features.shape[0] != n:
            raise ValueError(f"advance needs {n} feature rows (root + {n - 1} accepted), "
                             f"got {accepted_features.shape[0]}")
        start = self.length
        out = self._forward(tokens, accepted_features, start + torch.arange(n), causal_tree(n))
        self.last_feature = out[-1]

    @torch.no_grad()
    def draft_chain(self, k: int, warp: Warp, generator: torch.Generator) -> DraftTree:
        """k tokens one after another: argmax at T = 0, otherwise sampled from the warped p."""
        committed = self.length
        feature = self.last_feature
        toks, probs, ents, dists = [], [], [], []
        for i in range(k):
            index, prob, ent, p = draw_token(self._logits(feature), warp, generator)
            tok = self.head.token_id(index)
            toks.append(tok)
            probs.append(prob)
            ents.append(ent)
            dists.append(p)
            if i + 1 < k:
                feature = self._forward(torch.tensor([tok]), feature[None], torch.tensor([committed + i]),
                                        causal_tree(1))[0]
        crop(self.cache, committed)
        return DraftTree.chain(torch.tensor(toks, device=self.device), probs, ents,
                               None if warp.greedy else self.head.full(torch.stack(dists)))

    @torch.no_grad()
    def draft_tree(self, shape: DraftShape, warp: Warp | None = None,
                   generator: torch.Generator | None = None) -> DraftTree:
        """EAGLE-2 dynamic tree (DESIGN.md section 5); deterministic top-k, so ``warp`` is unused."""
        logp = self._logits(self.last_feature).log_softmax(-1)
        committed, k = self.length, min(shape.top_k, logp.shape[-1])
        top = logp.topk(k)
        top = (top.values.cpu(), self.head.token_ids(top.indices).cpu())
        tokens, parents, depths = [top[1]], [torch.full((k,), -1)], [torch.ones(k, dtype=torch.long)]
        scores, logps = [top[0]], [top[0]]
        ents = [entropy(logp.exp()).cpu().expand(k)]
        feats_in = self.last_feature[None].expand(k, -1)  # features paired with the frontier tokens
        frontier = torch.arange(k)  # global candidate indices
        n_cand = k
        slot_of: dict[int, int] = {}  # candidate -> drafter-cache slot (after the committed prefix)
        anc = torch.zeros(0, 0, dtype=torch.bool)  # (S, S): slot i attends slot j
        for _ in range(shape.depth):
            all_tok, all_par, all_depth, all_score = (torch.cat(tokens), torch.cat(parents),
                                                      torch.cat(depths), torch.cat(scores))
            n_slots, n_new = anc.shape[0], frontier.shape[0]
            prev = torch.zeros(n_new, n_slots, dtype=torch.bool)
            for j, c in enumerate(frontier.tolist()):
                p = int(all_par[c])
                if p >= 0:
                    prev[j] = anc[slot_of[p]]
                    prev[j, slot_of[p]] = True
                slot_of[c] = n_slots + j
            tree_mask = torch.cat([prev, torch.eye(n_new, dtype=torch.bool)], 1)
            anc = torch.cat([torch.cat([anc, torch.zeros(n_slots, n_new, dtype=torch.bool)], 1), tree_mask], 0)
            out = self._forward_tree(all_tok[frontier], feats_in, committed - 1 + all_depth[frontier],
                                     tree_mask, committed)
            child_logp = self._logits(out).log_softmax(-1)
            ctop = child_logp.topk(k, dim=-1)
            ctop = (ctop.values.cpu(), self.head.token_ids(ctop.indices).cpu())
            cand_scores = (all_score[frontier][:, None] + ctop[0]).reshape(-1)
            tokens.append(ctop[1].reshape(-1))
            parents.append(frontier.repeat_interleave(k))
            depths.append((all_depth[frontier] + 1).repeat_interleave(k))
            scores.append(cand_scores)
            logps.append(ctop[0].reshape(-1))
            ents.append(entropy(child_logp.exp()).cpu().repeat_interleave(k))
            best = cand_scores.topk(k).indices
            feats_in = out[(best // k).to(out.device)]
            frontier = n_cand + best
            n_cand += k * k
        crop(self.cache, committed)
        return _select(torch.cat(tokens), torch.cat(parents), torch.cat(depths), torch.cat(scores),
                       torch.cat(logps), torch.cat(ents), shape.total_tokens - 1, self.device)

    def _forward_tree(self, tokens, feats, positions, tree_mask, prefix: int) -> torch.Tensor:
        """Frontier forward: ``tree_mask`` rows cover the tree slots already cached plus the new ones."""
        dev = self.device
        n_new = tokens.shape[0]
        embeds = self.embed(tokens.to(dev).reshape(1, -1)).to(self.dtype)
        mask = prefix_tree_mask(prefix, tree_mask.to(dev), self.dtype)
        out = self.drafter(embeds, feats.to(dev, self.dtype).reshape(1, n_new, -1),
                           positions.to(dev).reshape(1, -1), attention_mask=mask, cache=self.cache)
        return out[0]


def _select(tokens, parents, depths, scores, logps, ents, keep: int, device) -> DraftTree:
    """Keep the ``keep`` best candidates by cumulative log-probability; order by depth, then score.

    A stable descending sort keeps a parent (created earlier, score >= child's) before its child on
    ties, so the kept set is closed under ancestors.
    """
    order = torch.sort(scores.cpu(), descending=True, stable=True).indices[:keep]
    kept = torch.zeros(scores.shape[0], dtype=torch.bool)
    kept[order] = True
    sel = order[torch.argsort(depths.cpu()[order], stable=True)]  # order is score-descending
    new_index = torch.full((scores.shape[0],), -1, dtype=torch.long)
    new_index[sel] = torch.arange(sel.shape[0])
    par = parents.cpu()[sel]
    if bool(((par >= 0) & ~kept[par.clamp(min=0)]).any()):
        raise AssertionError("EAGLE-2 selection dropped a parent of a kept node")
    new_par = torch.where(par >= 0, new_index[par.clamp(min=0)], par)
    probs = logps.cpu()[sel].exp().to(torch.float64)
    return DraftTree(tokens.cpu()[sel].to(device), new_par.to(device), depths.cpu()[sel].to(device),
                     probs.to(device), scores.cpu()[sel].exp().to(torch.float64).to(device),
                     ents.cpu()[sel].to(torch.float64).to(device))
