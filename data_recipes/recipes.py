"""The declared mixtures (``recipes.yaml``) and the row selection that makes them nest.

Selection, per domain pool (the de-duplicated union of the domain's resolvable sources):
1. permute the pool once with the seed (the permutation depends only on the seed and the domain);
2. the shared held-out set is the last ``h`` rows of that permutation, ``h`` = heldout_fraction x what
   the largest recipe draws from the pool (x scale);
3. a recipe drawing ``n`` rows trains on the first ``n - h`` rows of the permutation.
The train rows of all domains are then shuffled with the seed. So every recipe's train set is a prefix
of the same permutations: ``balanced`` is a subset of ``large``, row for row, and no recipe ever trains
on the held-out rows.
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import yaml

from data_recipes.records import DOMAINS

RECIPES_FILE = Path(__file__).with_name("recipes.yaml")


class ShortfallError(ValueError):
    """A recipe needs more rows than a source has; names the source, the shortfall and a fitting scale."""


@dataclass(frozen=True)
class RecipeTable:
    seed: int
    heldout_fraction: float
    domains: dict[str, list[str]]
    recipes: dict[str, dict[str, int]]
    path: str = ""

    def recipe(self, name: str) -> dict[str, int]:
        if name not in self.recipes:
            raise ValueError(f"unknown mixture {name!r}; declared in {self.path}: {sorted(self.recipes)}")
        return self.recipes[name]

    def largest_draw(self, domain: str) -> int:
        """What the largest recipe draws from ``domain`` at scale 1."""
        return max((r.get(domain, 0) for r in self.recipes.values()), default=0)


def load_recipe_table(path: str | Path | None = None) -> RecipeTable:
    """Read and check the recipe table (default: the packaged ``recipes.yaml``)."""
    path = Path(path) if path else RECIPES_FILE
    raw = yaml.safe_load(path.read_text())
    domains = {d: list(spec["sources"]) for d, spec in raw["domains"].items()}
    recipes = {name: {d: int(n) for d, n in counts.items()} for name, counts in raw["recipes"].items()}
    for d in domains:
        if d not in DOMAINS:
            raise ValueError(f"{path}: unknown domain {d!r} (use {DOMAINS})")
    for name, counts in recipes.items():
        for d, n in counts.items():
            if d not in domains or n <= 0:
                raise ValueError(f"{path}: recipe {name!r} draws {n} rows from undeclared domain {d!r}")
    frac = float(raw.get("heldout_fraction", 0.02))
    if not 0 <= frac < 1:
        raise ValueError(f"{path}: heldout_fraction must be in [0, 1), got {frac}")
    return RecipeTable(int(raw.get("seed", 42)), frac, domains, recipes, str(path))


@dataclass
class DomainDraw:
    domain: str
    pool_size: int
    draw: int
    train: int
    heldout: int
    permutation: list[int] = field(default_factory=list)
    train_index: list[int] = field(default_factory=list)
    heldout_index: list[int] = field(default_factory=list)
    unusable: list[int] = field(default_factory=list)


def scaled(count: int, scale: float) -> int:
    return int(round(count * scale))


def heldout_size(table: RecipeTable, domain: str, scale: float) -> int:
    largest = scaled(table.largest_draw(domain), scale)
    if largest == 0 or table.heldout_fraction == 0:
        return 0
    return max(1, int(round(table.heldout_fraction * largest)))


def domain_permutation(pool_size: int, seed: int, domain: str) -> np.ndarray:
    """The fixed permutation of a domain pool: depends only on the seed, the domain and the pool size."""
    rng = np.random.default_rng([seed, zlib.crc32(domain.encode())])
    return rng.permutation(pool_size)


def fitting_scale(counts: dict[str, int], pool_sizes: dict[str, int]) -> float:
    """The largest --scale (3 decimals, rounded down) at which every domain of the recipe fits."""
    best = min(pool_sizes[d] / n for d, n in counts.items())
    s = math.floor(best * 1000) / 1000
    while s > 0 and any(scaled(n, s) > pool_sizes[d] for d, n in counts.items()):
        s = round(s - 0.001, 3)
    return s


def plan_draws(table: RecipeTable, recipe: str, pool_sizes: dict[str, int], *, scale: float, seed: int,
               pool_sources: dict[str, list[str]] | None = None) -> dict[str, DomainDraw]:
    """Which pool rows (indices) a recipe trains on and holds out, per domain. Raises ShortfallError."""
    if scale <= 0:
        raise ValueError(f"--scale must be > 0, got {scale}")
    counts = table.recipe(recipe)
    problems = []
    for d, n in counts.items():
        need = scaled(n, scale)
        have = pool_sizes.get(d, 0)
        if need > have:
            names = ", ".join((pool_sources or {}).get(d, []) or [d])
            problems.append(f"domain {d!r} (source(s) {names}) has {have:,} usable rows but the recipe needs "
                            f"{need:,} (shortfall {need - have:,})")
    if problems:
        fit = fitting_scale(counts, pool_sizes)
        raise ShortfallError(f"mixture {recipe!r} at --scale {scale:g}: " + "; ".join(problems)
                             + f". Use --scale {fit:g} or less, or add data for that domain "
                               "(--source NAME=PATH, --data-dir, or network access to the Hub).")
    draws = {}
    for d, n in counts.items():
        need = scaled(n, scale)
        h = min(heldout_size(table, d, scale), need)
        perm = domain_permutation(pool_sizes[d], seed, d).tolist()
        draws[d] = DomainDraw(d, pool_sizes[d], need, need - h, h, perm)
    return draws


def walk_draw(draw: DomainDraw, usable: Callable[[list[int]], list[bool]] | None = None, *,
              chunk: int = 512, sources: str = "") -> DomainDraw:
    """Fill ``draw.train_index`` / ``heldout_index`` with the first usable rows of the permutation.

    Held-out rows are the last ``heldout`` usable rows (walking back from the end); train rows the first
    ``train`` usable rows from the start. ``usable(indices)`` decides per row (e.g. "an assistant token is
    left after truncation"); rows it rejects are skipped and recorded in ``draw.unusable``. Because every
    recipe walks the same permutation, a smaller recipe's rows are a prefix of a larger one's.
    """
    perm = draw.permutation
    check = usable or (lambda idx: [True] * len(idx))
    held: list[int] = []
    end = len(perm)
    while len(held) < draw.heldout and end > 0:
        size = min(chunk, draw.heldout - len(held) + 8)
        idx = perm[max(0, end - size): end][::-1]
        for i, ok in zip(idx, check(idx)):
            if len(held) == draw.heldout:
                break
            end -= 1
            (held if ok else draw.unusable).append(i)
    train: list[int] = []
    pos = 0
    while len(train) < draw.train and pos < end:
        size = min(chunk, draw.train - len(train) + 16)
        idx = perm[pos: min(end, pos + size)]
        for i, ok in zip(idx, check(idx)):
            if len(train) == draw.train:
                break
            pos += 1
            (train if ok else draw.unusable).append(i)
    if len(train) < draw.train or len(held) < draw.heldout:
        got = len(train) + len(held)
        raise ShortfallError(f"domain {draw.domain!r} (source(s) {sources or draw.domain}): only {got:,} of the "
                             f"{draw.pool_size:,} rows are usable after tokenisation/truncation but "
                             f"{draw.draw:,} are needed (shortfall {draw.draw - got:,}); use a smaller --scale "
                             "or a larger --max-length")
    draw.train_index, draw.heldout_index = train, held
    return draw


def shuffle_order(n: int, seed: int) -> list[int]:
    """The final shuffle of a recipe's train rows."""
    return np.random.default_rng([seed, 7]).permutation(n).tolist()
