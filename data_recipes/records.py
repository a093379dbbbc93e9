"""The normalised conversation record, row validation, and de-duplication.

Every training source is parsed into :class:`Record` objects. Raw rows go through
:func:`normalise_row`, which maps role aliases (``human``/``gpt`` from ShareGPT), checks the row and
either returns a record or a drop reason. A :class:`DataReport` counts the dropped rows per reason and
keeps the file and row number of the first few of each, so a user can look at them.
"""

from __future__ import annotations

import hashlib
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

DOMAINS = ("math", "chat")
ROLES = ("system", "user", "assistant")
ROLE_ALIASES = {
    "system": "system",
    "user": "user", "human": "user",
    "assistant": "assistant", "gpt": "assistant", "chatgpt": "assistant", "model": "assistant",
}
DROP_REASONS = ("bad_role_order", "empty_content", "non_string_content", "no_assistant_turn",
                "unknown_role", "malformed_row", "duplicate")
EXAMPLES_PER_REASON = 5


class BadRowError(ValueError):
    """Raised for a bad row when validation is strict."""


@dataclass(frozen=True)
class Record:
    """One training conversation: ``messages`` is a list of ``{"role", "content"}`` dicts."""

    id: str
    source: str
    domain: str
    messages: tuple[dict, ...]

    def __post_init__(self) -> None:
        if self.domain not in DOMAINS:
            raise ValueError(f"domain must be one of {DOMAINS}, got {self.domain!r}")

    def to_dict(self) -> dict:
        return {"id": self.id, "source": self.source, "domain": self.domain,
                "messages": [dict(m) for m in self.messages]}

    @classmethod
    def from_dict(cls, row: dict) -> Record:
        return cls(str(row["id"]), row["source"], row["domain"],
                   tuple({"role": m["role"], "content": m["content"]} for m in row["messages"]))


@dataclass
class DataReport:
    """Counts of dropped rows per reason, with (file, row) locations of the first few."""

    counts: Counter = field(default_factory=Counter)
    examples: dict[str, list[str]] = field(default_factory=dict)
    kept: Counter = field(default_factory=Counter)
    repaired: Counter = field(default_factory=Counter)

    def drop(self, reason: str, where: str, detail: str = "") -> None:
        self.counts[reason] += 1
        shown = self.examples.setdefault(reason, [])
        if len(shown) < EXAMPLES_PER_REASON:
            shown.append(f"{where}: {detail}" if detail else where)

    def merge(self, other: DataReport) -> None:
        self.counts.update(other.counts)
        self.kept.update(other.kept)
        self.repaired.update(other.repaired)
        for reason, shown in other.examples.items():
            mine = self.examples.setdefault(reason, [])
            mine.extend(shown[: max(0, EXAMPLES_PER_REASON - len(mine))])

    def to_dict(self) -> dict:
        return {"dropped": {k: self.counts[k] for k in sorted(self.counts)},
                "examples": {k: list(v) for k, v in sorted(self.examples.items())},
                "kept": dict(sorted(self.kept.items())),
                "repaired": dict(sorted(self.repaired.items()))}

    def summary(self) -> str:
        if not self.counts:
            return "no rows dropped"
        return ", ".join(f"{k}={v}" for k, v in sorted(self.counts.items()))


def check_messages(messages: Any, repairs: list[str] | None = None) -> tuple[list[dict] | None, str, str]:
    """Normalise and check a message list. Returns (messages, "", "") or (None, reason, detail).

    Rules: roles are system/user/assistant (after aliases); an optional leading system message, then
    strictly alternating user/assistant starting with user; content is a non-empty string; at least one
    assistant turn. Two repairs are made and recorded in ``repairs`` (never silently): a leading
    assistant message (ShareGPT splits long conversations, so later parts start with the model; EAGLE's
    data code drops it the same way) and trailing user turns (nothing in them is trained).
    """
    if not isinstance(messages, (list, tuple)) or not messages:
        return None, "malformed_row", "no message list"
    out: list[dict] = []
    for i, msg in enumerate(messages):
        if not isinstance(msg, dict):
            return None, "malformed_row", f"message {i} is not an object"
        raw_role = msg.get("role", msg.get("from"))
        content = msg.get("content", msg.get("value"))
        role = ROLE_ALIASES.get(str(raw_role).strip().lower()) if raw_role is not None else None
        if role is None:
            return None, "unknown_role", f"message {i} has role {raw_role!r}"
        if not isinstance(content, str):
            return None, "non_string_content", f"message {i} content is {type(content).__name__}"
        if not content.strip():
            return None, "empty_content", f"message {i} ({role}) is empty"
        out.append({"role": role, "content": content})
    start = 1 if out[0]["role"] == "system" else 0
    if len(out) > start and out[start]["role"] == "assistant":
        del out[start]
        if repairs is not None:
            repairs.append("leading_assistant_removed")
    body = out[start:]
    for i, msg in enumerate(body):
        expected = "user" if i % 2 == 0 else "assistant"
        if msg["role"] != expected:
            return None, "bad_role_order", f"turn {i} is {msg['role']}, expected {expected}"
    while out and out[-1]["role"] == "user":
        out.pop()
        if repairs is not None:
            repairs.append("trailing_user_removed")
    if not any(m["role"] == "assistant" for m in out):
        return None, "no_assistant_turn", "no assistant message"
    return out, "", ""


def normalise_row(messages: Any, *, row_id: str, source: str, domain: str, where: str,
                  report: DataReport, strict: bool = False) -> Record | None:
    """Validate one raw row; drop and count it (or raise when ``strict``) when it is bad."""
    repairs: list[str] = []
    checked, reason, detail = check_messages(messages, repairs)
    if checked is None:
        if strict:
            raise BadRowError(f"{where}: bad row ({reason}): {detail}")
        report.drop(reason, where, detail)
        return None
    report.repaired.update(repairs)
    return Record(str(row_id), source, domain, tuple(checked))


def content_key(record: Record) -> str:
    """Hash of the normalised content (roles + case-folded, whitespace-collapsed text)."""
    digest = hashlib.sha1()
    for m in record.messages:
        digest.update(m["role"].encode())
        digest.update(b"\x00")
        digest.update(" ".join(m["content"].split()).casefold().encode())
        digest.update(b"\x01")
    return digest.hexdigest()


def deduplicate(records: list[Record], report: DataReport, *, seen: set[str] | None = None) -> list[Record]:
    """Keep the first of every group of records with the same normalised content; count the rest."""
    seen = set() if seen is None else seen
    kept = []
    for rec in records:
        key = content_key(rec)
        if key in seen:
            report.drop("duplicate", rec.id)
            continue
        seen.add(key)
        kept.append(rec)
    return kept
