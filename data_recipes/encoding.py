"""Records -> token ids + loss masks (truncated), tokenizer fingerprints and content hashes."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable

import numpy as np

from data_recipes.masks import encode_conversations, special_ids, template_id
from data_recipes.records import Record

COLUMNS = ("input_ids", "loss_mask", "id", "source", "domain")


def _encode_batch(tokenizer, specials: set[int], max_length: int, conversations: list[list[dict]]
                  ) -> list[tuple[list[int], list[int], bool] | None]:
    """(ids, mask, was_truncated) per conversation, or None when no assistant token is left."""
    out: list[tuple[list[int], list[int], bool] | None] = []
    for enc in encode_conversations(tokenizer, conversations, specials=specials, max_tokens=max_length + 1):
        ids, mask = enc.input_ids[:max_length], enc.loss_mask[:max_length]
        out.append((ids, mask, len(enc.input_ids) > max_length) if any(mask) else None)
    return out


_WORKER: tuple | None = None


def _init_worker(tokenizer, specials, max_length) -> None:
    global _WORKER
    _WORKER = (tokenizer, specials, max_length)


def _worker_encode(conversations: list[list[dict]]):
    assert _WORKER is not None
    return _encode_batch(*_WORKER, conversations)


class RecordEncoder:
    """Encodes records with one tokenizer and a max length (optionally in ``num_proc`` worker processes)."""

    def __init__(self, tokenizer, max_length: int = 2048, num_proc: int = 1):
        if max_length < 2:
            raise ValueError(f"max_length must be >= 2, got {max_length}")
        if not getattr(tokenizer, "is_fast", False):
            raise ValueError(f"tokenizer {getattr(tokenizer, 'name_or_path', '?')!r} is not a fast (Rust) tokenizer; "
                             "loss masks need its character offsets (load it with use_fast=True)")
        self.tokenizer = tokenizer
        self.max_length = max_length
        self.specials = special_ids(tokenizer)
        self.truncated = 0
        self.num_proc = max(1, int(num_proc))
        self._pool = None

    def _workers(self):
        if self._pool is None:
            import multiprocessing as mp
            import os

            os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
            method = "fork" if "fork" in mp.get_all_start_methods() else "spawn"
            self._pool = mp.get_context(method).Pool(self.num_proc, _init_worker,
                                                     (self.tokenizer, self.specials, self.max_length))
        return self._pool

    def close(self) -> None:
        if self._pool is not None:
            self._pool.close()
            self._pool.join()
            self._pool = None

    def __enter__(self) -> RecordEncoder:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def encode(self, record: Record) -> tuple[list[int], list[int]] | None:
        """(input_ids, loss_mask) truncated to max_length, or None when no assistant token is left."""
        return self.encode_many([record])[0]

    def encode_many(self, records: list[Record]) -> list[tuple[list[int], list[int]] | None]:
        """:meth:`encode` for a batch (tokenised together, split over the worker processes if any)."""
        convs = [list(r.messages) for r in records]
        if self.num_proc > 1 and len(convs) >= 4 * self.num_proc:
            step = -(-len(convs) // (4 * self.num_proc))
            parts = self._workers().map(_worker_encode, [convs[i: i + step] for i in range(0, len(convs), step)])
            results = [r for part in parts for r in part]
        else:
            results = _encode_batch(self.tokenizer, self.specials, self.max_length, convs)
        out: list[tuple[list[int], list[int]] | None] = []
        for res in results:
            if res is None:
                out.append(None)
                continue
            ids, mask, truncated = res
            self.truncated += truncated
            out.append((ids, mask))
        return out


def rows_to_columns(records: Iterable[Record], encoded: Iterable[tuple[list[int], list[int]]]) -> dict[str, list]:
    cols: dict[str, list] = {c: [] for c in COLUMNS}
    for rec, (ids, mask) in zip(records, encoded):
        cols["input_ids"].append(ids)
        cols["loss_mask"].append(mask)
        cols["id"].append(rec.id)
        cols["source"].append(rec.source)
        cols["domain"].append(rec.domain)
    return cols


def content_hash(cols: dict[str, list]) -> str:
    """sha256 over every row's id, token ids and loss mask, in order."""
    digest = hashlib.sha256()
    for rid, ids, mask in zip(cols["id"], cols["input_ids"], cols["loss_mask"]):
        digest.update(rid.encode() + b"\x00")
        digest.update(np.asarray(ids, dtype=np.int64).tobytes())
        digest.update(np.asarray(mask, dtype=np.int8).tobytes())
    return "sha256:" + digest.hexdigest()


def records_hash(records: Iterable[Record]) -> str:
    digest = hashlib.sha256()
    for rec in records:
        digest.update(json.dumps(rec.to_dict(), sort_keys=True, ensure_ascii=False).encode())
    return "sha256:" + digest.hexdigest()


def tokenizer_info(tokenizer) -> dict:
    """Name, vocabulary fingerprint and chat-template hash of a tokenizer."""
    vocab = tokenizer.get_vocab()
    digest = hashlib.sha256(json.dumps(sorted(vocab.items()), ensure_ascii=False).encode())
    return {"name_or_path": str(getattr(tokenizer, "name_or_path", "")), "vocab_size": len(tokenizer),
            "fingerprint": "sha256:" + digest.hexdigest()[:16], "chat_template": template_id(tokenizer),
            "eos_token": tokenizer.eos_token}
