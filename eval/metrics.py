"""Per-generation records, tau exactly as DESIGN.md section 8, and a bootstrap CI helper.

tau = tokens emitted by verification passes / number of verification passes, pooled over all
prompts and turns. A pass emits its accepted draft tokens plus one bonus or correction token
(fewer only when EOS or ``max_new_tokens`` cuts the pass short: tokens that are not kept are not
counted). Each turn's prefill pass and the token sampled from it are excluded from both counts,
so ``verify_tokens == len(new_tokens) - 1`` whenever at least one token was generated.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, field

import numpy as np


@dataclass
class GenerationRecord:
    """Everything one generation (one prompt, one turn) measured."""

    prompt_tokens: int = 0
    new_tokens: list[int] = field(default_factory=list)  # including the prefill token
    verify_passes: int = 0
    verify_tokens: int = 0
    accepted_per_pass: list[int] = field(default_factory=list)  # accepted draft tokens per pass
    proposed_per_pass: list[int] = field(default_factory=list)  # draft nodes verified per pass
    depth_proposed: list[int] = field(default_factory=list)  # [d-1]: draft nodes at depth d
    depth_reached: list[int] = field(default_factory=list)  # [d-1]: passes that tried depth d
    depth_accepted: list[int] = field(default_factory=list)  # [d-1]: passes that accepted a depth-d token
    draft_accepted: list[bool] = field(default_factory=list)  # one entry per proposed draft node
    draft_depth: list[int] = field(default_factory=list)
    draft_entropy: list[float] = field(default_factory=list)
    draft_origin: list[int] = field(default_factory=list)
    wall_s: float = 0.0
    prefill_s: float = 0.0
    target_s: float = 0.0  # verification forwards (incl. lm_head rows used)
    draft_s: float = 0.0  # proposer: drafting and advancing
    stop_reason: str = ""  # "eos" | "max_new_tokens"
    step_log: list[dict] = field(default_factory=list)

    @property
    def tau(self) -> float:
        return self.verify_tokens / self.verify_passes if self.verify_passes else float("nan")

    @property
    def decode_s(self) -> float:
        return self.wall_s - self.prefill_s

    @property
    def overhead_share(self) -> float:
        """Share of decode time outside target and drafter forwards (acceptance, bookkeeping)."""
        d = self.decode_s
        return (d - self.target_s - self.draft_s) / d if d > 0 else float("nan")

    def add_pass(self, depths: Sequence[int], accepted_nodes: set[int], path_len: int, tried_depths: set[int],
                 entropies: Sequence[float], origins: Sequence[int], emitted: int) -> None:
        """Record one verification pass (``depths`` etc. indexed by draft node)."""
        self.verify_passes += 1
        self.verify_tokens += emitted
        self.accepted_per_pass.append(path_len)
        self.proposed_per_pass.append(len(depths))
        need = max([0, *depths, *tried_depths])
        for arr in (self.depth_proposed, self.depth_reached, self.depth_accepted):
            arr.extend([0] * (need - len(arr)))
        for i, d in enumerate(depths):
            self.depth_proposed[d - 1] += 1
            self.draft_accepted.append(i in accepted_nodes)
            self.draft_depth.append(int(d))
            self.draft_entropy.append(float(entropies[i]))
            self.draft_origin.append(int(origins[i]))
        for d in tried_depths:
            self.depth_reached[d - 1] += 1
        for d in range(1, path_len + 1):
            self.depth_accepted[d - 1] += 1

    def to_dict(self) -> dict:
        out = asdict(self)
        out["tau"] = self.tau
        return out


def pooled_tau(records: Sequence[GenerationRecord]) -> float:
    passes = sum(r.verify_passes for r in records)
    return sum(r.verify_tokens for r in records) / passes if passes else float("nan")


def per_depth_acceptance(records: Sequence[GenerationRecord]) -> list[float]:
    """alpha_d = passes that accepted a depth-d token / passes that tried one (pooled)."""
    depth = max((len(r.depth_reached) for r in records), default=0)
    out = []
    for d in range(depth):
        reached = sum(r.depth_reached[d] for r in records if d < len(r.depth_reached))
        acc = sum(r.depth_accepted[d] for r in records if d < len(r.depth_accepted))
        out.append(acc / reached if reached else float("nan"))
    return out


def peer_taus(records: Sequence[GenerationRecord]) -> dict[str, float]:
    """Labelled peer conventions (DESIGN.md section 8), shown beside the pooled tau, never instead."""
    per = [r.tau for r in records if r.verify_passes]
    return {
        "pooled": pooled_tau(records),
        "mean_per_sample (SpecForge)": float(np.mean(per)) if per else float("nan"),
        "hass (mean accepted per pass + 1)": float(np.mean([np.mean(r.accepted_per_pass) + 1
                                                             for r in records if r.accepted_per_pass]))
        if per else float("nan"),
    }


def bootstrap_ratio_ci(numerators: Sequence[float], denominators: Sequence[float], *, n_boot: int = 2000,
                       level: float = 0.95, seed: int = 0) -> tuple[float, float, float]:
    """Point estimate and percentile CI of sum(num) / sum(den), resampling units (prompts) with replacement."""
    num, den = np.asarray(numerators, dtype=float), np.asarray(denominators, dtype=float)
    if num.shape != den.shape or num.size == 0:
        raise ValueError("bootstrap needs equally long, non-empty numerator and denominator lists")
    point = num.sum() / den.sum()
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, num.size, size=(n_boot, num.size))
    stats = num[idx].sum(1) / np.maximum(den[idx].sum(1), 1e-300)
    lo, hi = np.quantile(stats, [(1 - level) / 2, 1 - (1 - level) / 2])
    return float(point), float(lo), float(hi)


def tau_ci(records: Sequence[GenerationRecord], **kw) -> tuple[float, float, float]:
    """Pooled tau with a bootstrap CI over records (pass one record per prompt, or merged turns)."""
    return bootstrap_ratio_ci([r.verify_tokens for r in records], [r.verify_passes for r in records], **kw)


ENTROPY_BIN_NATS = 0.5
ENTROPY_BINS = 24  # histogram of draft-token entropies (last bin open)


def entropy_summary(values: Sequence[float]) -> dict:
    hist = [0] * ENTROPY_BINS
    for v in values:
        hist[min(int(v / ENTROPY_BIN_NATS), ENTROPY_BINS - 1)] += 1
    return {"sum": float(sum(values)), "count": len(values), "hist": hist}


def record_summary(rec: GenerationRecord) -> dict:
    """The flat per-generation fields of a results line (``new_token_ids`` included)."""
    acc = [e for e, a in zip(rec.draft_entropy, rec.draft_accepted) if a]
    rej = [e for e, a in zip(rec.draft_entropy, rec.draft_accepted) if not a]
    return {
        "new_token_ids": list(rec.new_tokens), "new_tokens": len(rec.new_tokens),
        "verify_tokens": rec.verify_tokens, "verify_passes": rec.verify_passes, "tau": rec.tau,
        "wall_s": rec.wall_s, "prefill_s": rec.prefill_s, "target_s": rec.target_s, "draft_s": rec.draft_s,
        "accepted_per_pass": list(rec.accepted_per_pass), "depth_proposed": list(rec.depth_proposed),
        "depth_reached": list(rec.depth_reached), "depth_accepted": list(rec.depth_accepted),
        "entropy_accepted": entropy_summary(acc), "entropy_rejected": entropy_summary(rej),
        "stop_reason": rec.stop_reason, "step_log": list(rec.step_log),
    }
