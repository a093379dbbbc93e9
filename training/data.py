"""Batches sized in tokens, sharded over ranks, with a resumable position.

The micro-batch plan of an epoch depends only on (seed, epoch, row lengths, tokens per batch):
rows are shuffled, sorted by length inside windows of 256 (less padding), packed greedily so
``rows x longest row <= tokens_per_batch``, and the batches are shuffled again. The tail is
dropped so every rank gets the same number of micro-batches per optimizer step (rank r takes
batches r, r + W, ...). Resuming at optimizer step s skips exactly s x grad_accum micro-batches.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import numpy as np
import torch

from training.step import Batch


def plan_batches(lengths: Sequence[int], tokens_per_batch: int, seed: int, epoch: int,
                 window: int = 256) -> list[list[int]]:
    """Row indices of every micro-batch of one epoch (all ranks together)."""
    rng = np.random.default_rng([seed, epoch])
    order = rng.permutation(len(lengths))
    batches: list[list[int]] = []
    for start in range(0, len(order), window):
        chunk = sorted(order[start:start + window].tolist(), key=lambda i: lengths[i])
        current: list[int] = []
        longest = 0
        for idx in chunk:
            if current and max(longest, lengths[idx]) * (len(current) + 1) > tokens_per_batch:
                batches.append(current)
                current, longest = [], 0
            current.append(idx)
            longest = max(longest, lengths[idx])
        if current:
            batches.append(current)
    perm = rng.permutation(len(batches))
    return [batches[i] for i in perm]


def collate(rows: list[dict], features: list[torch.Tensor] | None = None, pad_id: int = 0) -> Batch:
    """Right-pad rows (input ids with ``pad_id``, loss mask with 0, features with 0)."""
    width = max(len(r["input_ids"]) for r in rows)
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    feats = None
    if features is not None:
        feats = torch.zeros(len(rows), width, features[0].shape[-1], dtype=features[0].dtype)
    for i, row in enumerate(rows):
        n = len(row["input_ids"])
        ids[i, :n] = torch.as_tensor(row["input_ids"])
        mask[i, :n] = torch.as_tensor(row["loss_mask"])
        if feats is not None:
            feats[i, :n] = features[i]
    return Batch(ids, mask, int(sum(len(r["input_ids"]) for r in rows)), feats)


class TrainStream:
    """This rank's micro-batches, epoch after epoch, starting at a given optimizer step."""

    def __init__(self, dataset, *, tokens_per_batch: int, seed: int, rank: int, world: int, grad_accum: int,
                 feature_store=None, pad_id: int = 0):
        self.dataset = dataset
        self.lengths = [len(x) for x in dataset["input_ids"]]
        self.tokens_per_batch, self.seed = tokens_per_batch, seed
        self.rank, self.world, self.grad_accum = rank, world, grad_accum
        self.store, self.pad_id = feature_store, pad_id
        per_step = world * grad_accum
        self.steps_per_epoch = len(plan_batches(self.lengths, tokens_per_batch, seed, 0)) // per_step
        if self.steps_per_epoch == 0:
            raise ValueError(f"the training data ({len(self.lengths)} rows) is too small for {world} rank(s) x "
                             f"{grad_accum} accumulation steps at {tokens_per_batch} tokens per batch")

    def _epoch_batches(self, epoch: int) -> list[list[int]]:
        batches = plan_batches(self.lengths, self.tokens_per_batch, self.seed, epoch)
        usable = self.steps_per_epoch * self.world * self.grad_accum
        return batches[:usable][self.rank::self.world]

    def micro_batches(self, start_step: int) -> Iterator[Batch]:
        """Micro-batches from optimizer step ``start_step`` on (forever; the caller stops)."""
        epoch, step_in_epoch = divmod(start_step, self.steps_per_epoch)
        skip = step_in_epoch * self.grad_accum
        while True:
            for indices in self._epoch_batches(epoch)[skip:]:
                yield self._load(indices)
            epoch, skip = epoch + 1, 0

    def _load(self, indices: list[int]) -> Batch:
        rows = [self.dataset[int(i)] for i in indices]
        feats = None
        if self.store is not None:
            feats = [self.store.get(r["id"], r["input_ids"]) for r in rows]
        return collate(rows, feats, self.pad_id)


def eval_batches(dataset, *, tokens_per_batch: int, rank: int, world: int, limit: int | None = None,
                 feature_store=None, pad_id: int = 0) -> Iterator[Batch]:
    """This rank's share of the held-out rows (row i goes to rank i mod W), batched by tokens."""
    n = len(dataset) if limit is None else min(limit, len(dataset))
    mine = list(range(rank, n, world))
    lengths = [len(dataset[i]["input_ids"]) for i in mine]
    order = sorted(range(len(mine)), key=lambda k: lengths[k])
    current: list[int] = []
    for k in order:
        if current and lengths[k] * (len(current) + 1) > tokens_per_batch:
            yield _eval_load(dataset, current, feature_store, pad_id)
            current = []
        current.append(mine[k])
    if current:
        yield _eval_load(dataset, current, feature_store, pad_id)


def _eval_load(dataset, indices: list[int], store, pad_id: int) -> Batch:
    rows = [dataset[i] for i in indices]
    feats = [store.get(r["id"], r["input_ids"]) for r in rows] if store is not None else None
    return collate(rows, feats, pad_id)
