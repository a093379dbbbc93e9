"""tau pooling (DESIGN.md section 8), per-depth acceptance, the bootstrap CI and record summaries."""

from __future__ import annotations

import math

import pytest

from eval.metrics import (
    GenerationRecord,
    bootstrap_ratio_ci,
    peer_taus,
    per_depth_acceptance,
    pooled_tau,
    record_summary,
    tau_ci,
)


def rec(tokens: int, passes: int) -> GenerationRecord:
    r = GenerationRecord(new_tokens=list(range(tokens + 1)), verify_passes=passes, verify_tokens=tokens)
    r.accepted_per_pass = [tokens // passes - 1] * passes
    return r


def test_pooled_tau_is_a_ratio_of_sums_not_a_mean_of_ratios():
    records = [rec(10, 2), rec(3, 3)]
    assert pooled_tau(records) == 13 / 5
    peers = peer_taus(records)
    assert peers["pooled"] == 13 / 5 and peers["mean_per_sample (SpecForge)"] == (5 + 1) / 2
    assert math.isnan(pooled_tau([]))


def test_add_pass_and_per_depth_acceptance():
    r = GenerationRecord()
    # pass 1: chain of 3, accepted 2 -> depths 1..3 tried, 1..2 accepted
    r.add_pass([1, 2, 3], {0, 1}, 2, {1, 2, 3}, [0.5, 1.0, 1.5], [0, 0, 0], emitted=3)
    # pass 2: tree with two depth-1 siblings and one depth-2 child, nothing accepted
    r.add_pass([1, 1, 2], set(), 0, {1}, [0.1, 0.2, 0.3], [0, 1, 1], emitted=1)
    assert (r.verify_passes, r.verify_tokens, r.tau) == (2, 4, 2.0)
    assert r.depth_proposed == [3, 2, 1] and r.depth_reached == [2, 1, 1] and r.depth_accepted == [1, 1, 0]
    assert per_depth_acceptance([r]) == [0.5, 1.0, 0.0]
    assert r.draft_accepted == [True, True, False, False, False, False]
    assert r.draft_origin == [0, 0, 0, 0, 1, 1]
    summary = record_summary(r)
    assert summary["entropy_accepted"]["count"] == 2 and summary["entropy_rejected"]["count"] == 4
    assert summary["entropy_accepted"]["hist"][1] == 1 and summary["entropy_accepted"]["hist"][2] == 1


def test_bootstrap_ci_brackets_the_point_and_is_reproducible():
    nums, dens = [10, 12, 30, 8, 9, 14], [4, 5, 9, 4, 3, 6]
    point, lo, hi = bootstrap_ratio_ci(nums, dens, n_boot=500, seed=1)
    assert point == pytest.approx(sum(nums) / sum(dens)) and lo <= point <= hi and lo < hi
    assert bootstrap_ratio_ci(nums, dens, n_boot=500, seed=1) == (point, lo, hi)
    assert tau_ci([rec(10, 2), rec(3, 3)], n_boot=100)[0] == 13 / 5
    with pytest.raises(ValueError, match="non-empty"):
        bootstrap_ratio_ci([], [])
