"""Aggregations of stored grid records (``results.jsonl`` rows) for the report.

Everything here is a pure function of the records: pooled tau with a bootstrap confidence
interval over prompts (DESIGN.md section 8), speedup over plain decoding on the same prompts,
answer accuracy, drift of the target log-likelihood against plain decoding, routing accuracy,
per-depth acceptance and the entropy of accepted vs rejected draft tokens.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import numpy as np

Record = dict


def group(records: Iterable[Record], key: Callable[[Record], object]) -> dict[object, list[Record]]:
    out: dict[object, list[Record]] = defaultdict(list)
    for r in records:
        out[key(r)].append(r)
    return dict(out)


def rule_label(r: Record) -> str:
    if r.get("delta") is None:
        return str(r["rule"])
    return f"{r['rule']} (delta={r['delta']:g})"


def strategy_label(r: Record) -> str:
    """single runs by drafter name; pair strategies by name; the oracle labelled as such."""
    if r["strategy"] == "single":
        return f"single:{r['drafter']}"
    if r["strategy"] == "route-oracle":
        return "route-oracle (oracle)"
    return str(r["strategy"])


@dataclass
class TauCI:
    tau: float
    low: float
    high: float
    prompts: int

    def fmt(self) -> str:
        if self.prompts == 0 or np.isnan(self.tau):
            return "-"
        return f"{self.tau:.2f} [{self.low:.2f}, {self.high:.2f}]"


def pooled_tau(records: list[Record], n_boot: int = 1000, seed: int = 0, level: float = 0.95) -> TauCI:
    """Pooled tau = sum verify_tokens / sum verify_passes, CI by resampling prompts (all turns)."""
    per_q = group(records, lambda r: (r["benchmark"], str(r["question_id"])))
    if not per_q:
        return TauCI(float("nan"), float("nan"), float("nan"), 0)
    tokens = np.array([sum(r["verify_tokens"] for r in rs) for rs in per_q.values()], dtype=float)
    passes = np.array([sum(r["verify_passes"] for r in rs) for rs in per_q.values()], dtype=float)
    tau = tokens.sum() / passes.sum() if passes.sum() else float("nan")
    if len(tokens) < 2 or not passes.sum():
        return TauCI(tau, tau, tau, len(tokens))
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, len(tokens), size=(n_boot, len(tokens)))
    t, p = tokens[idx].sum(1), passes[idx].sum(1)
    boots = np.divide(t, p, out=np.full_like(t, np.nan), where=p > 0)
    lo, hi = np.nanquantile(boots, [(1 - level) / 2, (1 + level) / 2])
    return TauCI(float(tau), float(lo), float(hi), len(tokens))


def _key(r: Record) -> tuple:
    return (r["benchmark"], str(r["question_id"]), int(r["turn"]), float(r["temperature"]))


def speedup(records: list[Record], plain: list[Record]) -> float | None:
    """Plain-decoding wall time / speculative wall time over the prompts both have."""
    base = {_key(r): r["wall_s"] for r in plain}
    pairs = [(base[_key(r)], r["wall_s"]) for r in records if _key(r) in base]
    spec = sum(s for _, s in pairs)
    if not pairs or spec <= 0:
        return None
    return sum(b for b, _ in pairs) / spec


def tokens_per_s(records: list[Record]) -> float | None:
    wall = sum(r["wall_s"] for r in records)
    return sum(r["new_tokens"] for r in records) / wall if wall > 0 else None


def accuracy(records: list[Record]) -> float | None:
    """Share of prompts answered correctly (records without a reference are skipped)."""
    vals = [bool(r["correct"]) for r in records if r.get("correct") is not None]
    return sum(vals) / len(vals) if vals else None


def drift(records: list[Record], plain: list[Record]) -> float | None:
    """Mean over shared prompts of (target mean log-prob of these outputs - of plain decoding's)."""
    base = {_key(r): r.get("target_logprob") for r in plain}
    diffs = [r["target_logprob"] - base[_key(r)] for r in records
             if r.get("target_logprob") is not None and base.get(_key(r)) is not None]
    return float(np.mean(diffs)) if diffs else None


def mean_budget(records: list[Record]) -> tuple[float | None, float | None]:
    """(nominal nodes per pass, mean nodes actually verified per pass)."""
    nominal = [r["verify_budget"] for r in records if r.get("verify_budget") is not None]
    nodes = sum(r.get("tree_nodes", 0) for r in records)
    passes = sum(r["verify_passes"] for r in records)
    return (float(np.mean(nominal)) if nominal else None, nodes / passes if passes and nodes else None)


def routing_accuracy(records: list[Record], pair: list[str] | None) -> float | None:
    """Share of routing steps that pick the specialist of the prompt's domain (index 0 = math)."""
    hits = total = 0
    for r in records:
        want = 0 if r.get("domain") == "math" else 1
        for choice in r.get("routing") or []:
            hits += int(choice == want)
            total += 1
    return hits / total if total else None


def depth_acceptance(records: list[Record]) -> list[float]:
    """alpha_d = passes that accepted a depth-d token / passes that tried depth d (eval/metrics.py)."""
    acc: list[float] = []
    prop: list[float] = []
    for r in records:
        for i, (a, p) in enumerate(zip(r.get("depth_accepted") or [], r.get("depth_reached") or [])):
            if i >= len(acc):
                acc.append(0.0)
                prop.append(0.0)
            acc[i] += a
            prop[i] += p
    return [a / p if p else float("nan") for a, p in zip(acc, prop)]


def entropy_split(records: list[Record]) -> dict[str, float | None]:
    """Mean drafter entropy (nats) of accepted vs rejected draft tokens, with counts."""
    out: dict[str, float | None] = {}
    for kind in ("accepted", "rejected"):
        s = sum((r.get(f"entropy_{kind}") or {}).get("sum", 0.0) for r in records)
        n = sum((r.get(f"entropy_{kind}") or {}).get("count", 0) for r in records)
        out[kind] = s / n if n else None
        out[f"n_{kind}"] = n
    return out


def routing_over_steps(records: list[Record], max_steps: int = 64) -> list[float]:
    """Share of prompts routing to the math specialist (index 0) at each decoding step."""
    counts = np.zeros(max_steps)
    math = np.zeros(max_steps)
    for r in records:
        for s, choice in enumerate((r.get("routing") or [])[:max_steps]):
            counts[s] += 1
            math[s] += int(choice == 0)
    n = int(np.max(np.nonzero(counts)[0]) + 1) if counts.any() else 0
    return [float(m / c) for m, c in zip(math[:n], counts[:n])]


def identical_to_plain(records: list[Record], plain: list[Record]) -> tuple[int, int]:
    """(outputs equal to plain decoding's, outputs compared): at T = 0 every rule must give the
    target's greedy text (fp32); bf16 tree and sequential logits may differ (DESIGN.md section 11)."""
    base = {_key(r): r["output_text"] for r in plain}
    pairs = [(r["output_text"], base[_key(r)]) for r in records if _key(r) in base]
    return sum(a == b for a, b in pairs), len(pairs)
