"""The evaluation grid: its specification, its cells, and the random stream of each generation.

A cell is one (strategy, drafter, benchmark, rule, delta, temperature) combination; every prompt
and turn of a cell gives one line of ``results.jsonl``. At temperature 0 every acceptance rule
reduces to greedy acceptance, so the rules collapse into one ``greedy`` cell that records which
requested (rule, delta) pairs it stands for (``covers``). ``route-oracle`` is derived from the
stored single runs of the two specialists (no generation), and ``plain`` is the plain-decoding
baseline (one cell per benchmark and temperature) used for speedups and drift.
"""

from __future__ import annotations

import hashlib
from dataclasses import asdict, dataclass, field
from typing import Any

RULES = ("sps", "tas", "cactus", "cactus-exact")
DELTA_RULES = ("cactus", "cactus-exact")
BENCHMARKS = ("gsm8k", "mt_bench", "math_500", "svamp")
STRATEGIES = ("single", "average", "route-confidence", "route-entropy", "route-oracle",
              "merge-concat", "merge-trie", "merge-equal-budget")
PAIR_STRATEGIES = STRATEGIES[1:]


@dataclass
class GridSpec:
    """Everything one ``launch/eval_drafters.py`` call asks for."""

    drafters: dict[str, str]
    benchmarks: list[str]
    rules: list[str] = field(default_factory=lambda: ["sps"])
    deltas: list[float] = field(default_factory=lambda: [1.0])
    strategies: list[str] = field(default_factory=lambda: ["single"])
    temperatures: list[float] = field(default_factory=lambda: [0.0])
    target: str | None = None
    top_p: float = 1.0
    top_k: int = 0
    limit: int | None = None
    max_new_tokens: int = 1024
    draft_shape: str | None = None
    draft_vocab: int | None = None  # propose from the N most-trained tokens only (eval/draft_vocab.py)
    dtype: str = "auto"
    output_dir: str = "results/default"
    pair: tuple[str, str] | None = None  # (math specialist, chat specialist)
    average_alpha: float = 0.5
    plain: bool = True
    seed: int = 0
    data_dir: str | None = None

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        if not self.drafters:
            raise ValueError("--drafters is empty: give DIR or name=DIR,...")
        for names, allowed, flag in ((self.benchmarks, BENCHMARKS, "--benchmarks"),
                                     (self.rules, RULES, "--rules"),
                                     (self.strategies, STRATEGIES, "--strategies")):
            if not names:
                raise ValueError(f"{flag} is empty")
            bad = [n for n in names if n not in allowed]
            if bad:
                raise ValueError(f"{flag}: unknown {bad}; choose from {list(allowed)}")
        if any(t < 0 for t in self.temperatures) or not self.temperatures:
            raise ValueError("--temperatures must be a non-empty list of values >= 0")
        if any(d < 0 for d in self.deltas):
            raise ValueError("--deltas must be >= 0")
        if not 0 < self.top_p <= 1:
            raise ValueError("--top-p must be in (0, 1]")
        if self.top_k < 0 or self.max_new_tokens <= 0:
            raise ValueError("--top-k must be >= 0 and --max-new-tokens > 0")
        if self.draft_vocab is not None and self.draft_vocab < 0:
            raise ValueError("--draft-vocab must be >= 0 (0 = the full vocabulary)")
        if self.limit is not None and self.limit <= 0:
            raise ValueError("--limit must be positive")
        if not 0 <= self.average_alpha <= 1:
            raise ValueError("--average-alpha must be in [0, 1]")
        if any(s in PAIR_STRATEGIES for s in self.strategies):
            self.pair = tuple(self.resolve_pair())

    def resolve_pair(self) -> tuple[str, str]:
        """The two specialists: ``--pair`` or drafters named math/chat, else the first two given."""
        if self.pair is not None:
            pair = tuple(self.pair)
        elif "math" in self.drafters and "chat" in self.drafters:
            pair = ("math", "chat")
        else:
            pair = tuple(list(self.drafters)[:2])
        if len(pair) != 2 or pair[0] == pair[1]:
            raise ValueError(f"combination strategies need two different drafters (got {list(self.drafters)}); "
                             "pass --drafters math=DIR,chat=DIR or --pair A,B")
        missing = [p for p in pair if p not in self.drafters]
        if missing:
            raise ValueError(f"--pair names {missing} that are not in --drafters {list(self.drafters)}")
        return pair  # type: ignore[return-value]

    def settings(self) -> dict[str, Any]:
        """What every cell shares; a store holding results from other settings is refused."""
        out = {"target": self.target, "top_p": self.top_p, "top_k": self.top_k, "limit": self.limit,
               "max_new_tokens": self.max_new_tokens, "draft_shape": self.draft_shape,
               "dtype": self.dtype, "seed": self.seed, "average_alpha": self.average_alpha}
        if self.draft_vocab:
            out["draft_vocab"] = self.draft_vocab
        return out

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["pair"] = list(self.pair) if self.pair else None
        return data


@dataclass(frozen=True)
class Cell:
    strategy: str  # one of STRATEGIES, or "plain"
    drafter: str  # drafter name, "a+b" for pairs, "avg(a,b)" for averages, "-" for plain
    benchmark: str
    rule: str  # a requested rule, "greedy" at temperature 0, "plain" for the baseline
    delta: float | None
    temperature: float
    covers: tuple[str, ...] = ()  # at T = 0: the requested rule[/delta] cells this one stands for

    @property
    def cell_id(self) -> str:
        rule = self.rule if self.delta is None else f"{self.rule}-d{self.delta:g}"
        name = f"{self.strategy}.{self.drafter}.{self.benchmark}.{rule}.T{self.temperature:g}"
        return "".join(c if c.isalnum() or c in "._-+" else "_" for c in name)

    @property
    def derived(self) -> bool:
        return self.strategy == "route-oracle"

    def describe(self) -> dict[str, Any]:
        return {"cell_id": self.cell_id, "strategy": self.strategy, "drafter": self.drafter,
                "benchmark": self.benchmark, "rule": self.rule, "delta": self.delta,
                "temperature": self.temperature, "covers": list(self.covers)}


def rule_variants(spec: GridSpec, temperature: float) -> list[tuple[str, float | None, tuple[str, ...]]]:
    """(rule, delta, covers) for one temperature; T = 0 collapses every rule into greedy."""
    variants = [(r, d) for r in spec.rules for d in (spec.deltas if r in DELTA_RULES else [None])]
    if temperature == 0:
        covers = tuple(r if d is None else f"{r}-d{d:g}" for r, d in variants)
        return [("greedy", None, covers)]
    return [(r, d, ()) for r, d in variants]


def drafter_label(spec: GridSpec, strategy: str) -> list[str]:
    if strategy == "single":
        return list(spec.drafters)
    a, b = spec.pair or spec.resolve_pair()
    if strategy == "average":
        return [f"avg({a},{b},{spec.average_alpha:g})"]
    return [f"{a}+{b}"]


def expand_cells(spec: GridSpec) -> list[Cell]:
    """All cells of the grid in run order (the baseline and single runs before anything that uses them)."""
    cells: list[Cell] = []
    strategies = list(spec.strategies)
    singles_needed = set(spec.drafters) if "single" in strategies else set()
    if "route-oracle" in strategies:
        singles_needed |= set(spec.pair or ())
    ordered = [s for s in STRATEGIES if s in strategies and s not in ("single", "route-oracle")]
    for bench in spec.benchmarks:
        for temp in spec.temperatures:
            if spec.plain:
                cells.append(Cell("plain", "-", bench, "plain", None, temp))
            for rule, delta, covers in rule_variants(spec, temp):
                for name in spec.drafters:
                    if name in singles_needed:
                        cells.append(Cell("single", name, bench, rule, delta, temp, covers))
                for strategy in ordered:
                    for label in drafter_label(spec, strategy):
                        cells.append(Cell(strategy, label, bench, rule, delta, temp, covers))
                if "route-oracle" in strategies:
                    label = drafter_label(spec, "route-oracle")[0]
                    cells.append(Cell("route-oracle", label, bench, rule, delta, temp, covers))
    return cells


def generation_seed(cell: Cell, question_id: Any, turn: int, base_seed: int = 0) -> int:
    """The seed of one generation's random stream: a function of cell, question and turn only,
    so results do not depend on how prompts are sharded across ranks."""
    key = f"{base_seed}|{cell.cell_id}|{question_id}|{turn}".encode()
    return int.from_bytes(hashlib.sha256(key).digest()[:8], "little") & ((1 << 63) - 1)


def shard(items: list, rank: int, world_size: int) -> list:
    """This rank's share of the prompts (round robin, independent of what is already done)."""
    return items[rank::world_size]


def parse_drafters(text: str) -> dict[str, str]:
    """``DIR`` or ``name=DIR,name=DIR`` (an unnamed DIR is named after its last path component)."""
    out: dict[str, str] = {}
    for item in [t.strip() for t in text.split(",") if t.strip()]:
        name, _, path = item.rpartition("=") if "=" in item else ("", "", item)
        name = name.strip() or path.rstrip("/").split("/")[-1]
        if not name or not path:
            raise ValueError(f"bad --drafters entry {item!r}: use DIR or name=DIR")
        if name in out:
            raise ValueError(f"--drafters names {name!r} twice")
        if any(c in name for c in "+(),. /") or name == "-":
            raise ValueError(f"drafter name {name!r} may not contain + ( ) , . / or spaces")
        out[name] = path
    return out


def parse_list(text: str, kind=str) -> list:
    try:
        return [kind(t.strip()) for t in text.split(",") if t.strip()]
    except ValueError as err:
        raise ValueError(f"bad list {text!r}: {err}") from None
