"""Frequency-ranked draft vocabulary: the drafter proposes from its V most-trained tokens only.

An EAGLE drafter on a small target spends most of each step in the target's lm_head (SmolLM2-135M:
576 x 49,152 = 28M weights against ~5M in the drafter layer). FR-Spec (Zhao et al., 2025) restricts
the *draft* head to the most frequent tokens; verification still uses the target's full head, and the
acceptance rules stay exact because they hold for any draft distribution p: p is simply zero outside
the kept tokens (``DraftHead.full`` puts it back on the full vocabulary for the residual q - p).
Tokens are ranked by ``token_counts.safetensors`` (written by training, ``checkpoints/token_counts.py``);
end-of-sequence tokens are always kept.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def select_vocab(counts: torch.Tensor, size: int, always: list[int] | tuple[int, ...] = ()) -> torch.Tensor:
    """Sorted ids of the ``size`` most frequent tokens (ties: lower id first) plus ``always``;
    ``counts`` may be integer counts or float frequencies."""
    if size <= 0:
        raise ValueError(f"draft vocabulary size must be positive, got {size}")
    size = min(size, counts.shape[0])
    order = torch.sort(counts, descending=True, stable=True).indices
    keep = set(order[:size].tolist()) | {int(t) for t in always if 0 <= int(t) < counts.shape[0]}
    return torch.tensor(sorted(keep), dtype=torch.long)


def coverage(counts: torch.Tensor, ids: torch.Tensor) -> float:
    """Share of the counted tokens that fall inside the vocabulary ``ids``."""
    total = int(counts.sum())
    return float(counts[ids].sum()) / total if total else 0.0


class DraftHead:
    """The head a drafter proposes with: the target's lm_head, whole or restricted to ``ids``."""

    def __init__(self, lm_head: torch.nn.Module, ids: torch.Tensor | None = None):
        weight, bias = lm_head.weight, getattr(lm_head, "bias", None)
        self.vocab_size = int(weight.shape[0])
        self.ids = None if ids is None else ids.to(weight.device)
        if self.ids is None:
            self.weight, self.bias = weight, bias
        else:
            self.weight = weight.detach()[self.ids].contiguous()
            self.bias = None if bias is None else bias.detach()[self.ids].contiguous()

    @property
    def size(self) -> int:
        return int(self.weight.shape[0])

    def logits(self, features: torch.Tensor) -> torch.Tensor:
        """float64 logits over the draft vocabulary (index space of ``ids`` when restricted)."""
        return F.linear(features.to(self.weight.dtype), self.weight, self.bias).to(torch.float64)

    def token_ids(self, index: torch.Tensor) -> torch.Tensor:
        """Draft-vocabulary indices -> token ids."""
        return index if self.ids is None else self.ids.to(index.device)[index]

    def token_id(self, index: int) -> int:
        return int(index) if self.ids is None else int(self.ids[int(index)])

    def full(self, probs: torch.Tensor) -> torch.Tensor:
        """A distribution over the draft vocabulary spread onto the full vocabulary (zeros elsewhere)."""
        if self.ids is None:
            return probs
        out = probs.new_zeros(*probs.shape[:-1], self.vocab_size)
        return out.index_copy_(-1, self.ids.to(probs.device), probs)


def draft_head(lm_head: torch.nn.Module, counts: torch.Tensor | None, size: int | None,
               always: list[int] | tuple[int, ...] = (), name: str = "drafter") -> DraftHead:
    """The full head (``size`` None or 0) or the ``size`` most frequent tokens of ``counts``."""
    if not size:
        return DraftHead(lm_head)
    if counts is None:
        raise ValueError(f"--draft-vocab {size}: {name} has no token_counts.safetensors (training writes it); "
                         f"create it with `python -m checkpoints.token_counts DRAFTER_DIR --mix MIX --scale S`")
    if counts.shape[0] != lm_head.weight.shape[0]:
        raise ValueError(f"{name}: token counts cover {counts.shape[0]} tokens but the target's vocabulary "
                         f"has {lm_head.weight.shape[0]}")
    return DraftHead(lm_head, select_vocab(counts, size, always))
