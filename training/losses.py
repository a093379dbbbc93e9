"""Training objectives as pure functions (DESIGN.md section 4).

Shapes: ``N`` selected (loss-masked) positions, hidden size ``h``, vocabulary ``V``.

- EAGLE: ``1.0 * SmoothL1(f_hat, f)`` (mean over the hidden dimension, then over positions) plus
  ``0.1 * CE(p_target, q_draft)`` with soft targets over the full vocabulary.
- HASS: the above plus ``w_topk * TopK-CE`` (the target's top K = 10 tokens, not renormalised), and
  context alignment: pass ``j`` (1-based) of the drafter sees its own detached predictions at the
  ``j - 1`` most recent positions (:func:`alignment_mask`, :func:`aligned_inputs`).

The vocabulary-sized terms are computed in chunks of positions under activation checkpointing, so
memory is bounded by ``chunk x V`` instead of ``N x V`` (x passes) in both forward and backward.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint


@dataclass(frozen=True)
class LossWeights:
    feature: float = 1.0  # SmoothL1 on features
    prob: float = 0.1  # full-vocabulary soft cross-entropy
    topk: float = 0.0  # HASS Top-K distillation (0 = EAGLE)
    k: int = 10


def feature_loss(pred: torch.Tensor, target: torch.Tensor, valid: torch.Tensor | None = None) -> torch.Tensor:
    """SmoothL1 (beta 1) averaged over the hidden dimension, then over the valid positions.

    ``pred`` is (N, h) or (P, N, h) for P passes sharing ``target`` (N, h); ``valid`` (P, N) marks the
    positions each pass is trained on. Per-pass means are summed over passes.
    """
    pred, valid = _as_passes(pred, valid)
    per_pos = F.smooth_l1_loss(pred.float(), target.float().expand_as(pred), reduction="none").mean(-1)
    return ((per_pos * valid).sum(-1) / valid.sum(-1).clamp_min(1)).sum()


def _as_passes(pred: torch.Tensor, valid: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    if pred.dim() == 2:
        pred = pred[None]
    if valid is None:
        valid = torch.ones(pred.shape[:2], device=pred.device)
    return pred, valid.to(torch.float32)


def _ce_terms(pred: torch.Tensor, target: torch.Tensor, valid: torch.Tensor, weight: torch.Tensor,
              bias: torch.Tensor | None, k: int) -> torch.Tensor:
    """(2, P) sums over one chunk of positions: soft CE and top-k CE of each pass (target p shared)."""
    logq = F.log_softmax(F.linear(pred, weight, bias).float(), dim=-1)  # (P, n, V)
    with torch.no_grad():
        p = F.softmax(F.linear(target.to(weight.dtype), weight, bias).float(), dim=-1)  # (n, V)
    soft = -(torch.einsum("nv,pnv->pn", p, logq) * valid).sum(-1)
    if k > 0:
        top_p, top_idx = p.topk(min(k, p.shape[-1]), dim=-1)
        picked = logq.gather(-1, top_idx.expand(logq.shape[0], -1, -1))
        topk = -((top_p * picked).sum(-1) * valid).sum(-1)
    else:
        topk = torch.zeros_like(soft)
    return torch.stack([soft, topk])


def distribution_losses(pred: torch.Tensor, target: torch.Tensor, weight: torch.Tensor,
                        bias: torch.Tensor | None = None, *, valid: torch.Tensor | None = None, k: int = 10,
                        chunk: int = 1024) -> tuple[torch.Tensor, torch.Tensor]:
    """Soft CE ``-sum_v p(v) log q(v)`` and Top-K CE over the target's top ``k`` tokens (not renormalised).

    ``pred`` (N, h) or (P, N, h) drafter features of P passes, ``target`` (N, h) target features,
    ``weight``/``bias`` the target's ``lm_head``. Each pass is averaged over its valid positions and
    the passes are summed. Computed ``chunk`` positions at a time; the target's distribution is
    computed once per chunk for all passes.
    """
    pred, valid = _as_passes(pred, valid)
    n = pred.shape[1]
    total = pred.new_zeros(2, pred.shape[0], dtype=torch.float32)
    for start in range(0, n, chunk):
        args = (pred[:, start:start + chunk], target[start:start + chunk], valid[:, start:start + chunk],
                weight, bias, k)
        if torch.is_grad_enabled() and pred.requires_grad and n > chunk:  # one chunk: nothing to save
            total = total + checkpoint(_ce_terms, *args, use_reentrant=False)
        else:
            total = total + _ce_terms(*args)
    total = total / valid.sum(-1).clamp_min(1)
    return total[0].sum(), total[1].sum()


def objective(pred: torch.Tensor, target: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
              weights: LossWeights, *, valid: torch.Tensor | None = None, chunk: int = 1024
              ) -> dict[str, torch.Tensor]:
    """The weighted EAGLE/HASS loss (summed over passes) over N selected positions, with its parts."""
    fl = feature_loss(pred, target, valid)
    if weights.prob or weights.topk:
        soft, topk = distribution_losses(pred, target, weight, bias, valid=valid,
                                         k=weights.k if weights.topk else 0, chunk=chunk)
    else:
        soft = topk = fl * 0.0
    loss = weights.feature * fl + weights.prob * soft + weights.topk * topk
    return {"loss": loss, "feature": fl.detach(), "soft_ce": soft.detach(), "topk_ce": topk.detach()}


def alignment_mask(length: int, pass_index: int, device: torch.device | str | None = None) -> torch.Tensor:
    """Boolean (length, pass_index * length) attention mask of HASS pass ``pass_index`` (1-based).

    Keys are the concatenated key/values of passes 1..j (each ``length`` positions). Query ``t`` of
    pass ``j`` attends pass-1 keys at ``s <= t - j + 1`` (the target's features) and, for each
    pass ``k`` in 2..j, the single key at ``s = t - j + k`` (whose input is the drafter's own
    prediction from pass ``k - 1``), exactly the context of drafting at depth ``j``.
    """
    j = pass_index
    t = torch.arange(length, device=device)[:, None]
    s = torch.arange(length, device=device)[None, :]
    blocks = [s <= t - j + 1]
    blocks += [s == t - j + k for k in range(2, j + 1)]
    return torch.cat(blocks, dim=1)


def aligned_inputs(target_features: torch.Tensor, previous_pred: torch.Tensor) -> torch.Tensor:
    """Input features of a pass ``j >= 2``: at position ``s`` the previous pass's (detached)
    prediction made at ``s - 1`` (which predicts ``f_s``); position 0 keeps the target's feature."""
    shifted = previous_pred.detach().to(target_features.dtype)
    return torch.cat([target_features[:, :1], shifted[:, :-1]], dim=1)


def expected_acceptance_length(cumulative_rates: list[float]) -> float:
    """EAL = 1 + sum_k prod_{i<=k} acc_i, given CUMULATIVE rates prod_{i<=k} acc_i (no re-multiplying)."""
    return 1.0 + float(sum(cumulative_rates))


def conditional_rates(cumulative_rates: list[float]) -> list[float]:
    """acc_k = cum_k / cum_{k-1}: the top-1 agreement at depth k given the earlier depths were right."""
    out, prev = [], 1.0
    for c in cumulative_rates:
        out.append(c / prev if prev > 0 else 0.0)
        prev = c
    return out
