"""How often each token is trained on: ``token_counts.safetensors`` beside a drafter.

Training writes the counts of the assistant (loss-masked) tokens of its training data next to the
final drafter; evaluation ranks tokens by them to build a frequency-ranked draft vocabulary
(``eval/draft_vocab.py``). For a drafter without the file (an imported checkpoint, an older run)::

    python -m checkpoints.token_counts DRAFTER_DIR --mix math --scale 0.01 [--data-dir DIR]

counts the same prepared mixture (from the cache, or prepared now) and writes the file.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

import numpy as np
import torch

COUNTS_NAME = "token_counts.safetensors"


def count_trained_tokens(dataset, vocab_size: int, batch_rows: int = 4096) -> torch.Tensor:
    """int64 (vocab_size,): occurrences of each token id at loss-masked positions of ``dataset``
    (any mapping-style data set with ``input_ids`` and ``loss_mask`` columns)."""
    counts = np.zeros(vocab_size, dtype=np.int64)
    for start in range(0, len(dataset), batch_rows):
        rows = dataset[start:start + batch_rows]
        for ids, mask in zip(rows["input_ids"], rows["loss_mask"]):
            ids, mask = np.asarray(ids, dtype=np.int64), np.asarray(mask, dtype=bool)
            if ids.size and int(ids.max()) >= vocab_size:
                raise ValueError(f"token id {int(ids.max())} is outside the vocabulary of {vocab_size}")
            counts += np.bincount(ids[mask], minlength=vocab_size)
    return torch.from_numpy(counts)


def save_token_counts(counts: torch.Tensor, directory: str | os.PathLike) -> Path:
    """Write ``directory/token_counts.safetensors`` atomically."""
    from safetensors.torch import save_file

    path = Path(directory) / COUNTS_NAME
    tmp = path.with_name(f".{COUNTS_NAME}.tmp")
    save_file({"counts": counts.to(torch.int64).contiguous()}, str(tmp))
    os.replace(tmp, path)
    return path


def load_token_counts(directory: str | os.PathLike) -> torch.Tensor | None:
    """The counts stored beside a drafter, or None when it has none."""
    from safetensors.torch import load_file

    path = Path(directory) / COUNTS_NAME
    if not path.is_file():
        return None
    try:
        counts = load_file(str(path))["counts"]
    except Exception as err:  # noqa: BLE001 - any unreadable file gets the same clear message
        raise ValueError(f"{path}: unreadable token counts ({err}); delete it and count again with "
                         f"`python -m checkpoints.token_counts {directory} --mix MIX --scale S`") from err
    if counts.dim() != 1 or counts.dtype != torch.int64 or bool((counts < 0).any()):
        raise ValueError(f"{path}: 'counts' must be a 1-D int64 tensor of non-negative counts")
    return counts


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("drafter_dir")
    p.add_argument("--mix", required=True)
    p.add_argument("--scale", type=float, default=1.0)
    p.add_argument("--max-length", type=int, default=512)
    p.add_argument("--seed", type=int, default=42)
    p.add_argument("--target", default=None)
    p.add_argument("--data-dir", default=None)
    args = p.parse_args(argv)
    from data_recipes.prepare import prepare_mixture
    from training.drafter import DrafterConfig
    from training.target import DEFAULT_TARGET, load_tokenizer

    tokenizer = load_tokenizer(args.target)
    mixture = prepare_mixture(args.mix, tokenizer=tokenizer, scale=args.scale, seed=args.seed,
                              data_dir=args.data_dir, max_length=args.max_length,
                              target_name=args.target or DEFAULT_TARGET)
    vocab = int(DrafterConfig.load(args.drafter_dir).target["vocab_size"])
    counts = count_trained_tokens(mixture.train, vocab)
    path = save_token_counts(counts, args.drafter_dir)
    print(f"{path}: {int(counts.sum()):,} trained tokens, {int((counts > 0).sum()):,} distinct")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
