"""One training step and one evaluation batch: HASS/EAGLE passes of the drafter over a batch.

Alignment (DESIGN.md section 3): for tokens x_0..x_{L-1} with target features f_0..f_{L-1}, the
drafter input at position t is (embed(x_{t+1}), f_t) and it predicts f_{t+1}; its draft token is
compared with the target's distribution at t + 1 (the next token x_{t+2}). Position t is trained
when x_{t+1} is an assistant token (``loss_mask[t + 1] == 1``), and in pass j only when t >= j - 1.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from training.losses import LossWeights, aligned_inputs, alignment_mask, objective


@dataclass
class Batch:
    input_ids: torch.Tensor  # (B, L) right-padded
    loss_mask: torch.Tensor  # (B, L) 1 = assistant token (0 on padding)
    num_tokens: int = 0  # real (unpadded) tokens
    features: torch.Tensor | None = None  # (B, L, h) cached target features (offline), else None

    def to(self, device: torch.device) -> Batch:
        feats = None if self.features is None else self.features.to(device, non_blocking=True)
        return Batch(self.input_ids.to(device), self.loss_mask.to(device), self.num_tokens, feats)


class KVStack:
    """A minimal cache (transformers ``Cache.update`` interface) concatenating the key/values of
    successive HASS passes, so pass j attends to passes 1..j through :func:`alignment_mask`."""

    def __init__(self) -> None:
        self.key: torch.Tensor | None = None
        self.value: torch.Tensor | None = None

    def update(self, key, value, layer_idx=0, *args, **kwargs):
        if self.key is None:
            self.key, self.value = key, value
        else:
            self.key = torch.cat([self.key, key], dim=-2)
            self.value = torch.cat([self.value, value], dim=-2)
        return self.key, self.value

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return 0 if self.key is None else self.key.shape[-2]


def drafter_passes(drafter: Callable, embeds: torch.Tensor, features: torch.Tensor, passes: int,
                   noise: float = 0.0) -> list[torch.Tensor]:
    """Run ``passes`` context-aligned passes; returns each pass's predicted features (B, T, h).

    Pass 1 is plain EAGLE (input features plus U(-noise/2, noise/2) noise); pass j >= 2 uses the
    previous pass's detached predictions as inputs and attends to earlier passes' key/values.
    """
    batch, length = embeds.shape[:2]
    position_ids = torch.arange(length, device=embeds.device)[None].expand(batch, -1)
    inputs = features
    if noise > 0:
        inputs = features + (torch.rand_like(features, dtype=torch.float32) - 0.5).to(features.dtype) * noise
    cache = KVStack() if passes > 1 else None
    preds: list[torch.Tensor] = []
    for j in range(1, passes + 1):
        if j > 1:
            inputs = aligned_inputs(features, preds[-1])
        mask = None if cache is None else alignment_mask(length, j, embeds.device)[None, None].expand(
            batch, 1, -1, -1)
        preds.append(drafter(embeds, inputs, position_ids, attention_mask=mask, cache=cache))
    return preds


def shifted_views(target, batch: Batch) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(drafter input embeds, input features, target features, trained-position mask), length L - 1."""
    feats = batch.features
    if feats is None:
        feats = target.features(batch.input_ids)
    embeds = target.embed_tokens(batch.input_ids[:, 1:])
    feats = feats.to(embeds.dtype)
    mask = batch.loss_mask[:, 1:].bool()
    return embeds, feats[:, :-1], feats[:, 1:], mask


def _pass_mask(mask: torch.Tensor, j: int) -> torch.Tensor:
    out = mask.clone()
    out[:, : j - 1] = False
    return out


def train_losses(drafter: Callable, target, batch: Batch, *, passes: int, weights: LossWeights,
                 noise: float, chunk: int) -> dict[str, torch.Tensor]:
    """The summed loss of all passes (the quantity to back-propagate) and its detached parts."""
    embeds, inputs, targets, mask = shifted_views(target, batch)
    preds = drafter_passes(drafter, embeds, inputs, passes, noise)
    weight, bias = target.lm_head.weight, getattr(target.lm_head, "bias", None)
    valid = torch.stack([_pass_mask(mask, j)[mask] for j in range(1, len(preds) + 1)])  # (P, N)
    stacked = torch.stack([pred[mask] for pred in preds])  # (P, N, h)
    total = objective(stacked, targets[mask], weight, bias, weights, valid=valid, chunk=chunk)
    total["positions"] = torch.tensor(float(mask.sum()))
    return total


@torch.no_grad()
def eval_counts(drafter: Callable, target, batch: Batch, *, depth: int, weights: LossWeights,
                chunk: int) -> torch.Tensor:
    """Sums for held-out metrics, reducible across ranks:
    [loss*n, n, A_1..A_d, P_1..P_d, N_1..N_d, C_1..C_d].

    A_j of P_j positions: pass j's top-1 equals the target's; N_j: chains of j consecutive trained
    positions; C_j: such chains where depths 1..j were all right (cumulative agreement C_j / N_j).
    """
    embeds, inputs, targets, mask = shifted_views(target, batch)
    preds = drafter_passes(drafter, embeds, inputs, depth, noise=0.0)
    weight, bias = target.lm_head.weight, getattr(target.lm_head, "bias", None)
    n = float(mask.sum())
    loss = objective(preds[0][mask], targets[mask], weight, bias, weights, chunk=chunk)["loss"]
    with torch.no_grad():
        tgt_top = _argmax_chunked(targets[mask], weight, bias, chunk)
    agree, pos, chain_n, chain_c = [], [], [], []
    valid_chain = torch.zeros_like(mask)
    right_chain = torch.zeros_like(mask)
    for j, pred in enumerate(preds, start=1):
        right = torch.zeros_like(mask)
        right[mask] = _argmax_chunked(pred[mask], weight, bias, chunk) == tgt_top
        if j == 1:
            valid_chain, right_chain = mask.clone(), right & mask
        else:
            valid_chain = _pass_mask(mask, j) & F.pad(valid_chain[:, :-1], (1, 0))
            right_chain = valid_chain & right & F.pad(right_chain[:, :-1], (1, 0))
        agree.append(float((right & _pass_mask(mask, j)).sum()))
        pos.append(float(_pass_mask(mask, j).sum()))
        chain_n.append(float(valid_chain.sum()))
        chain_c.append(float(right_chain.sum()))
    return torch.tensor([float(loss) * n, n, *agree, *pos, *chain_n, *chain_c], dtype=torch.float64)


def _argmax_chunked(feats: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                    chunk: int) -> torch.Tensor:
    out = [F.linear(feats[i:i + chunk].to(weight.dtype), weight, bias).argmax(-1)
           for i in range(0, feats.shape[0], chunk)]
    return torch.cat(out) if out else torch.zeros(0, dtype=torch.long, device=feats.device)


def summarize_counts(counts: torch.Tensor, depth: int) -> dict[str, float | list[float]]:
    """Held-out metrics from (rank-summed) :func:`eval_counts` sums: loss, top-1 per depth, EAL."""
    from training.losses import conditional_rates, expected_acceptance_length

    c = counts.tolist()
    n = max(c[1], 1.0)
    agree, pos = c[2:2 + depth], c[2 + depth:2 + 2 * depth]
    chain_n, chain_c = c[2 + 2 * depth:2 + 3 * depth], c[2 + 3 * depth:2 + 4 * depth]
    cumulative = [cc / nn if nn else 0.0 for cc, nn in zip(chain_c, chain_n)]
    return {
        "loss": c[0] / n,
        "positions": int(c[1]),
        "top1_per_depth": [a / pp if pp else 0.0 for a, pp in zip(agree, pos)],
        "acc_conditional": conditional_rates(cumulative),
        "acc_cumulative": cumulative,
        "eal": expected_acceptance_length(cumulative),
    }
