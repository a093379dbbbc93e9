"""The resumable on-disk store of a grid run (``results/NAME/``).

Layout::

    grid.json                       the spec and shared settings (a rerun with other settings is refused)
    cells/<cell_id>/part.rank<R>.jsonl   one line per finished prompt (all its turns), appended and fsynced
    cells/<cell_id>/records.jsonl   the merged records of a finished cell (written atomically)
    cells/<cell_id>/done.json       the completion marker with the cell's summary (written last, atomically)
    results.jsonl                   one line per prompt and turn of every finished cell (rebuilt atomically)

A killed run loses at most the prompt in progress: prompts are appended whole, a torn last line is
cut off when the file is reopened, and a cell counts as finished only once ``done.json`` exists.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from eval.grid import Cell


def atomic_write_text(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def read_jsonl(path: Path) -> list[dict]:
    """Complete JSON lines of a file (a torn trailing line is ignored)."""
    if not path.is_file():
        return []
    rows = []
    for line in path.read_text().splitlines():
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return rows


class GridStore:
    def __init__(self, output_dir: str | os.PathLike):
        self.root = Path(output_dir)
        self.cells_dir = self.root / "cells"

    # -- run metadata ------------------------------------------------------------------------
    def check_settings(self, spec_dict: dict[str, Any], settings: dict[str, Any],
                       drafters: dict[str, str]) -> None:
        """Record the spec; refuse a store that holds results from different shared settings."""
        path = self.root / "grid.json"
        if path.is_file():
            old = json.loads(path.read_text())
            diff = {k: (old.get("settings", {}).get(k), v) for k, v in settings.items()
                    if old.get("settings", {}).get(k) != v}
            changed = {n: (old.get("drafter_dirs", {}).get(n), d) for n, d in drafters.items()
                       if n in old.get("drafter_dirs", {}) and old["drafter_dirs"][n] != d}
            if diff or changed:
                raise ValueError(f"{self.root} holds results from other settings "
                                 f"(old, new): {diff or changed}; use another --output-dir")
            drafters = {**old.get("drafter_dirs", {}), **drafters}
        atomic_write_text(path, json.dumps({"spec": spec_dict, "settings": settings,
                                            "drafter_dirs": drafters}, indent=2, default=str) + "\n")

    def metadata(self) -> dict[str, Any]:
        path = self.root / "grid.json"
        return json.loads(path.read_text()) if path.is_file() else {}

    # -- cells -------------------------------------------------------------------------------
    def cell_dir(self, cell: Cell | str) -> Path:
        return self.cells_dir / (cell if isinstance(cell, str) else cell.cell_id)

    def is_done(self, cell: Cell) -> bool:
        return (self.cell_dir(cell) / "done.json").is_file()

    def done_questions(self, cell: Cell) -> set[str]:
        """Question ids (as strings) with a complete stored prompt, from every rank's part file."""
        done = set()
        for part in sorted(self.cell_dir(cell).glob("part.rank*.jsonl")):
            done.update(str(row["question_id"]) for row in read_jsonl(part))
        return done

    def open_part(self, cell: Cell, rank: int) -> PartWriter:
        return PartWriter(self.cell_dir(cell) / f"part.rank{rank}.jsonl")

    def merge_parts(self, cell: Cell, question_ids: list) -> list[dict]:
        """The records of every rank's part file, in question order (every prompt must be there)."""
        by_q: dict[str, list[dict]] = {}
        for part in sorted(self.cell_dir(cell).glob("part.rank*.jsonl")):
            for row in read_jsonl(part):
                by_q.setdefault(str(row["question_id"]), row["records"])
        missing = [q for q in question_ids if str(q) not in by_q]
        if missing:
            raise RuntimeError(f"cell {cell.cell_id} is missing prompts {missing[:5]} (of {len(missing)})")
        return [rec for q in question_ids for rec in by_q[str(q)]]

    def write_cell(self, cell: Cell, records: list[dict], summary: dict[str, Any]) -> None:
        """Write the cell's records, then (last) its completion marker; both atomically."""
        d = self.cell_dir(cell)
        atomic_write_text(d / "records.jsonl", "".join(json.dumps(r) + "\n" for r in records))
        atomic_write_text(d / "done.json", json.dumps({**cell.describe(), **summary}, indent=2) + "\n")

    def cell_records(self, cell: Cell | str) -> list[dict]:
        return read_jsonl(self.cell_dir(cell) / "records.jsonl")

    def done_cells(self) -> list[dict]:
        if not self.cells_dir.is_dir():
            return []
        return [json.loads((d / "done.json").read_text()) for d in sorted(self.cells_dir.iterdir())
                if (d / "done.json").is_file()]

    def rebuild_results(self, order: Iterable[str] = ()) -> Path:
        """Rewrite results.jsonl from every finished cell (grid order first, then the rest)."""
        done = {c["cell_id"] for c in self.done_cells()}
        ids = [c for c in order if c in done]
        ids += sorted(done - set(ids))
        path = self.root / "results.jsonl"  # records.jsonl files are complete lines: concatenate as text
        atomic_write_text(path, "".join((self.cell_dir(c) / "records.jsonl").read_text() for c in ids))
        return path

    def load_results(self) -> list[dict]:
        return read_jsonl(self.root / "results.jsonl")


class PartWriter:
    """Appends one JSON line per finished prompt, durable before the next prompt starts."""

    def __init__(self, path: Path):
        self.path = path
        path.parent.mkdir(parents=True, exist_ok=True)
        if path.is_file():  # cut a torn last line left by a killed run
            data = path.read_bytes()
            if data and not data.endswith(b"\n"):
                keep = data.rfind(b"\n") + 1
                with open(path, "r+b") as fh:
                    fh.truncate(keep)

    def append(self, question_id: Any, records: list[dict]) -> None:
        line = json.dumps({"question_id": question_id, "records": records}) + "\n"
        with open(self.path, "a") as fh:
            fh.write(line)
            fh.flush()
            os.fsync(fh.fileno())
