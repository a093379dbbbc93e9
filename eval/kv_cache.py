"""KV-cache helpers: keep an arbitrary subset of cached positions (the accepted path), crop, masks.

Both the target and the drafter use transformers' ``DynamicCache``; after verification only the
prefix and the accepted tree nodes are kept, by index, so no prefix is ever recomputed.
"""

from __future__ import annotations

import torch


def new_cache(config=None):
    """An empty ``DynamicCache`` (``config`` lets transformers size per-layer types)."""
    from transformers import DynamicCache

    return DynamicCache(config=config) if config is not None else DynamicCache()


def cache_length(cache) -> int:
    return int(cache.get_seq_length()) if cache is not None else 0


def keep_positions(cache, index: torch.Tensor) -> None:
    """Keep only the cached positions ``index`` (1D, ascending), in place, for every layer."""
    for layer in cache.layers:
        keys = getattr(layer, "keys", None)
        if keys is None or keys.numel() == 0:
            continue
        idx = index.to(keys.device)
        layer.keys = keys.index_select(-2, idx)
        layer.values = layer.values.index_select(-2, idx)


def crop(cache, length: int) -> None:
    """Keep the first ``length`` cached positions."""
    current = cache_length(cache)
    if length < current:
        keep_positions(cache, torch.arange(length))


def prefix_tree_mask(prefix_len: int, tree_mask: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """A 4D additive mask (1, 1, n, prefix_len + n): every row sees the prefix, then ``tree_mask``.

    ``tree_mask`` is an (n, n) bool matrix, True = attend. Additive float masks (0 / dtype min) work
    with every attention implementation of transformers 5.x.
    """
    n = tree_mask.shape[0]
    allowed = torch.cat([torch.ones(n, prefix_len, dtype=torch.bool, device=tree_mask.device), tree_mask], 1)
    mask = torch.zeros(allowed.shape, dtype=dtype, device=tree_mask.device)
    mask.masked_fill_(~allowed, torch.finfo(dtype).min)
    return mask[None, None]


def causal_tree(n: int, device=None) -> torch.Tensor:
    """(n, n) lower-triangular bool mask (a chain is a tree where each node's parent is the previous)."""
    return torch.ones(n, n, dtype=torch.bool, device=device).tril()


def keep_tail(cache, start: int, index: torch.Tensor) -> None:
    """Keep positions [0, start) and then ``index`` (absolute, ascending, all >= start), in place.

    Only the tail is copied: the prefix is never touched or recomputed.
    """
    n = int(index.shape[0])
    for layer in cache.layers:
        keys = getattr(layer, "keys", None)
        if keys is None or keys.numel() == 0:
            continue
        idx = index.to(keys.device)
        if n:
            layer.keys[..., start:start + n, :] = keys.index_select(-2, idx)
            layer.values[..., start:start + n, :] = layer.values.index_select(-2, idx)
        layer.keys = layer.keys[..., :start + n, :]
        layer.values = layer.values[..., :start + n, :]
