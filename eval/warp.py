"""Temperature / top-k / top-p warping, applied identically to target (q) and draft (p) logits."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Warp:
    """Sampling settings. ``temperature == 0`` means greedy (one-hot argmax distributions).

    ``top_k = 0`` and ``top_p = 1.0`` disable the respective filters.
    """

    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0

    def __post_init__(self) -> None:
        if not (self.temperature >= 0.0) or self.temperature != self.temperature:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if self.top_k < 0:
            raise ValueError(f"top_k must be >= 0 (0 = off), got {self.top_k}")
        if not (0.0 < self.top_p <= 1.0):
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    def probs(self, logits: torch.Tensor) -> torch.Tensor:
        """Warped probabilities over the last dimension (float64 for exact acceptance arithmetic)."""
        logits = logits.to(torch.float64)
        if self.greedy:
            out = torch.zeros_like(logits)
            return out.scatter_(-1, logits.argmax(-1, keepdim=True), 1.0)
        scaled = logits / self.temperature
        if self.top_k and self.top_k < scaled.shape[-1]:
            kth = torch.topk(scaled, self.top_k, dim=-1).values[..., -1:]
            scaled = scaled.masked_fill(scaled < kth, float("-inf"))
        if self.top_p < 1.0:
            sorted_logits, order = torch.sort(scaled, dim=-1, descending=True)
            sorted_probs = sorted_logits.softmax(-1)
            # drop a token when the mass strictly before it already reaches top_p (keeps the first)
            before = sorted_probs.cumsum(-1) - sorted_probs
            drop_sorted = before >= self.top_p
            drop = torch.zeros_like(drop_sorted).scatter_(-1, order, drop_sorted)
            scaled = scaled.masked_fill(drop, float("-inf"))
        return scaled.softmax(-1)


def entropy(probs: torch.Tensor) -> torch.Tensor:
    """Shannon entropy (nats) over the last dimension; 0 log 0 = 0."""
    probs = probs.to(torch.float64)
    logs = torch.where(probs > 0, probs.log(), torch.zeros_like(probs))
    return -(probs * logs).sum(-1)


def draw_token(logits: torch.Tensor, warp: Warp, generator: torch.Generator
               ) -> tuple[int, float, float, torch.Tensor]:
    """One chain draft token: (token, raw probability, raw entropy, warped distribution p).

    Greedy warps take the argmax; otherwise the token is sampled from p (acceptance rules need p).
    """
    raw = logits.to(torch.float64).softmax(-1)
    p = warp.probs(logits)
    tok = int(p.argmax()) if warp.greedy else int(torch.multinomial(p.cpu(), 1, generator=generator))
    return tok, float(raw[tok]), float(entropy(raw)), p
