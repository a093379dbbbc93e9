"""Prepare a mixture: sources -> validated pools -> recipe rows -> tokens + loss masks -> cached Arrow data.

``prepare_mixture("balanced", tokenizer=tok, scale=0.1)`` returns a :class:`PreparedMixture` whose
``train``/``heldout`` are ``datasets.Dataset`` objects with columns ``input_ids``, ``loss_mask``, ``id``,
``source``, ``domain``. The result is saved with ``save_to_disk`` beside a ``manifest.json``, under a key of
recipe, scale, seed, tokenizer, template, max length and source locations, so a second call is a cache hit.
"""

from __future__ import annotations

import hashlib
import json
import logging
import platform
import time
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path

from filelock import FileLock

from data_recipes.encoding import RecordEncoder, content_hash, records_hash, rows_to_columns, tokenizer_info
from data_recipes.recipes import load_recipe_table, plan_draws, shuffle_order, walk_draw
from data_recipes.records import DataReport, Record, deduplicate
from data_recipes.resolve import SourceNotFoundError
from data_recipes.sources import LoadedSource, load_source, locate_source

log = logging.getLogger(__name__)

FORMAT_VERSION = 1
MANIFEST = "manifest.json"


@dataclass
class PreparedMixture:
    train: object  # datasets.Dataset
    heldout: object  # datasets.Dataset
    manifest: dict
    manifest_path: Path
    directory: Path
    cache_hit: bool = False


@dataclass
class DomainPool:
    domain: str
    records: list[Record]
    sources: list[LoadedSource] = field(default_factory=list)
    skipped: dict[str, list[str]] = field(default_factory=dict)


def _versions() -> dict:
    out = {"python": platform.python_version()}
    for dist in ("taps", "datasets", "transformers", "tokenizers", "numpy", "pyarrow", "torch"):
        try:
            out[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            out[dist] = None
    return out


def load_pools(domains: dict[str, list[str]], *, data_dir=None, source_paths: dict[str, str] | None = None,
               strict: bool = False) -> tuple[dict[str, DomainPool], DataReport]:
    """Load every declared source of the given domains; pool the resolvable ones per domain."""
    source_paths = source_paths or {}
    report = DataReport()
    pools = {}
    for domain, names in domains.items():
        pool = DomainPool(domain, [])
        seen: set[str] = set()
        for name in names:
            try:
                loaded = load_source(name, path=source_paths.get(name), data_dir=data_dir, strict=strict,
                                     domain=domain)
            except SourceNotFoundError as err:
                log.warning("domain %s: source %s is not available and is skipped:\n%s", domain, name, err)
                pool.skipped[name] = err.attempts
                continue
            before = len(loaded.records)
            loaded.records = deduplicate(loaded.records, loaded.report, seen=seen)
            if len(loaded.records) != before:
                log.info("domain %s: %d rows of %s duplicate earlier sources", domain, before - len(loaded.records), name)
            report.merge(loaded.report)
            pool.sources.append(loaded)
            pool.records.extend(loaded.records)
            log.info("domain %s: source %s gives %d usable rows (%s)", domain, name, len(loaded.records),
                     loaded.report.summary())
        if not pool.sources:
            tried = [f"{n}: {a}" for n, attempts in pool.skipped.items() for a in attempts]
            raise SourceNotFoundError(f"domain {domain} (sources {', '.join(names)})", tried)
        pools[domain] = pool
    return pools, report


def _cache_key(parts: dict) -> str:
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()


def default_directory(mix: str, scale: float, seed: int, key: str) -> Path:
    from training.target import cache_dir

    return cache_dir() / "data" / f"{mix}-scale{scale:g}-seed{seed}-{key[:12]}"


def _load_cached(directory: Path, key: str) -> PreparedMixture | None:
    path = directory / MANIFEST
    if not path.is_file():
        return None
    manifest = json.loads(path.read_text())
    if manifest.get("cache_key") != key:
        return None
    import datasets

    train = datasets.load_from_disk(str(directory / "train"))
    heldout = datasets.load_from_disk(str(directory / "heldout"))
    return PreparedMixture(train, heldout, manifest, path, directory, cache_hit=True)


def _counts(cols: dict[str, list]) -> dict:
    by_source: dict[str, int] = {}
    by_domain: dict[str, int] = {}
    for s, d in zip(cols["source"], cols["domain"]):
        by_source[s] = by_source.get(s, 0) + 1
        by_domain[d] = by_domain.get(d, 0) + 1
    return {"total": len(cols["id"]), "by_source": dict(sorted(by_source.items())),
            "by_domain": dict(sorted(by_domain.items())),
            "tokens": sum(len(x) for x in cols["input_ids"]),
            "trained_tokens": sum(sum(m) for m in cols["loss_mask"])}


def prepare_mixture(mix: str, *, tokenizer, scale: float = 1.0, seed: int = 42, data_dir=None,
                    max_length: int = 2048, out_dir=None, strict: bool = False, target_name: str | None = None,
                    source_paths: dict[str, str] | None = None, recipes_file=None, regenerate=None,
                    use_cache: bool = True, num_proc: int = 1) -> PreparedMixture:
    """Prepare (or load from cache) the tokenised train/held-out sets of a declared mixture.

    ``source_paths`` maps a source name to an explicit local file (highest resolution priority).
    ``regenerate`` is a :class:`data_recipes.regenerate.RegenerateConfig` to replace assistant turns with
    the target's own responses. ``num_proc`` worker processes tokenise (the result does not depend on it).
    Raises ShortfallError when a source has too few usable rows.
    """
    if max_length < 2:
        raise ValueError(f"max_length must be >= 2, got {max_length}")
    started = time.perf_counter()
    table = load_recipe_table(recipes_file)
    counts = table.recipe(mix)
    domains = {d: table.domains[d] for d in counts}
    tok_info = tokenizer_info(tokenizer)
    located = {n: locate_source(n, path=(source_paths or {}).get(n), data_dir=data_dir, domain=d)
               for d, names in domains.items() for n in names}
    key = _cache_key({"format": FORMAT_VERSION, "mix": mix, "counts": counts, "domains": domains,
                      "heldout_fraction": table.heldout_fraction, "largest": {d: table.largest_draw(d) for d in domains},
                      "scale": scale, "seed": seed, "max_length": max_length, "tokenizer": tok_info,
                      "sources": {n: loc[2] for n, loc in located.items()}, "strict": strict,
                      "regenerate": regenerate.key() if regenerate is not None else None})
    directory = Path(out_dir) if out_dir else default_directory(mix, scale, seed, key)
    directory.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(directory) + ".lock"):  # a concurrent preparation of the same directory waits, then hits
        if use_cache:
            cached = _load_cached(directory, key)
            if cached is not None:
                if target_name is not None and cached.manifest.get("target_name") != target_name:
                    cached.manifest["target_name"] = cached.manifest["target"] = target_name
                log.info("mixture %s: cache hit at %s (%.2fs)", mix, directory, time.perf_counter() - started)
                return cached
        pools, report = load_pools(domains, data_dir=data_dir, source_paths=source_paths, strict=strict)
        with RecordEncoder(tokenizer, max_length, num_proc=num_proc) as encoder:
            return _build(mix, table, counts, domains, pools, report, encoder, directory, key, tok_info, started,
                          scale=scale, seed=seed, max_length=max_length, regenerate=regenerate,
                          target_name=target_name)


def _build(mix, table, counts, domains, pools, report, encoder, directory, key, tok_info, started, *,
           scale, seed, max_length, regenerate, target_name) -> PreparedMixture:
    sizes = {d: len(p.records) for d, p in pools.items()}
    pool_sources = {d: [s.name for s in p.sources] for d, p in pools.items()}
    draws = plan_draws(table, mix, sizes, scale=scale, seed=seed, pool_sources=pool_sources)
    train_recs: list[Record] = []
    train_enc: list[tuple[list[int], list[int]]] = []
    held_recs: list[Record] = []
    held_enc: list[tuple[list[int], list[int]]] = []
    no_assistant_after_truncation = 0
    for d, draw in draws.items():
        pool = pools[d].records
        cache: dict[int, tuple[list[int], list[int]] | None] = {}

        def usable(indices, pool=pool, cache=cache):
            todo = [i for i in indices if i not in cache]
            for i, enc in zip(todo, encoder.encode_many([pool[i] for i in todo])):
                cache[i] = enc
            return [cache[i] is not None for i in indices]

        walk_draw(draw, usable, sources=", ".join(pool_sources[d]))
        no_assistant_after_truncation += len(draw.unusable)
        train_recs += [pool[i] for i in draw.train_index]
        train_enc += [cache[i] for i in draw.train_index]
        held_recs += [pool[i] for i in draw.heldout_index]
        held_enc += [cache[i] for i in draw.heldout_index]
        log.info("domain %s: pool %d, train %d, held-out %d, skipped (no assistant token within %d tokens) %d",
                 d, draw.pool_size, draw.train, draw.heldout, max_length, len(draw.unusable))
    order = shuffle_order(len(train_recs), seed)
    train_recs = [train_recs[i] for i in order]
    train_enc = [train_enc[i] for i in order]

    regen_info = None
    if regenerate is not None:
        from data_recipes.regenerate import regenerate_records

        work = directory.parent / f".{directory.name}.regen"
        train_recs, held_recs, train_enc, held_enc, regen_info = regenerate_records(
            regenerate, train_recs, held_recs, encoder=encoder, work_dir=work, target_name=target_name)

    train_cols = rows_to_columns(train_recs, train_enc)
    held_cols = rows_to_columns(held_recs, held_enc)
    dropped = dict(report.to_dict()["dropped"])
    dropped["no_assistant_token_after_truncation"] = no_assistant_after_truncation
    manifest = {
        "recipe": mix, "recipe_counts": counts, "recipes_file": table.path, "scale": scale, "seed": seed,
        "max_length": max_length, "heldout_fraction": table.heldout_fraction,
        "domains": {d: {"declared_sources": domains[d], "used_sources": pool_sources[d],
                        "skipped_sources": pools[d].skipped, "pool_size": sizes[d], "draw": draws[d].draw,
                        "train": draws[d].train, "heldout": draws[d].heldout} for d in draws},
        "sources": {s.name: s.describe() for p in pools.values() for s in p.sources},
        "train": _counts(train_cols), "heldout": _counts(held_cols),
        "dropped": dropped, "dropped_examples": report.to_dict()["examples"],
        "repaired": report.to_dict()["repaired"], "truncated_rows": encoder.truncated,
        "train_hash": content_hash(train_cols), "heldout_hash": content_hash(held_cols),
        "train_records_hash": records_hash(train_recs),
        "tokenizer": tok_info, "target": target_name, "target_name": target_name, "regenerate": regen_info,
        "versions": _versions(), "cache_key": key, "format": FORMAT_VERSION,
    }
    train, heldout = _write(directory, train_cols, held_cols, manifest)
    log.info("mixture %s: prepared %d train / %d held-out rows in %.1fs -> %s", mix, len(train), len(heldout),
             time.perf_counter() - started, directory)
    return PreparedMixture(train, heldout, manifest, directory / MANIFEST, directory)


def _write(directory: Path, train_cols: dict, held_cols: dict, manifest: dict):
    import datasets

    from checkpoints.drafter_io import atomic_directory

    features = datasets.Features({
        "input_ids": datasets.Sequence(datasets.Value("int32")),
        "loss_mask": datasets.Sequence(datasets.Value("int8")),
        "id": datasets.Value("string"), "source": datasets.Value("string"), "domain": datasets.Value("string")})
    with atomic_directory(directory) as tmp:
        datasets.Dataset.from_dict(train_cols, features=features).save_to_disk(str(tmp / "train"))
        datasets.Dataset.from_dict(held_cols, features=features).save_to_disk(str(tmp / "heldout"))
        (tmp / MANIFEST).write_text(json.dumps(manifest, indent=2, ensure_ascii=False) + "\n")
    train = datasets.load_from_disk(str(directory / "train"))
    heldout = datasets.load_from_disk(str(directory / "heldout"))
    return train, heldout
