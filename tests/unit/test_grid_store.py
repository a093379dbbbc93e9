"""Grid cells, seeds, the resumable store and the report statistics (no models)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from eval import report_stats as st
from eval.grid import Cell, GridSpec, expand_cells, generation_seed, parse_drafters, shard
from eval.grid_store import GridStore, PartWriter, read_jsonl


def spec(**kw) -> GridSpec:
    base = dict(drafters={"math": "a", "chat": "b", "big": "c"}, benchmarks=["gsm8k", "mt_bench"],
                rules=["sps", "tas", "cactus"], deltas=[0.5, 1.0], temperatures=[0.0, 1.0],
                strategies=["single", "route-confidence", "route-oracle", "merge-trie"])
    base.update(kw)
    return GridSpec(**base)


def test_temperature_zero_collapses_rules_into_one_greedy_cell():
    cells = expand_cells(spec())
    t0 = [c for c in cells if c.temperature == 0 and c.strategy != "plain"]
    assert {c.rule for c in t0} == {"greedy"}
    assert t0[0].covers == ("sps", "tas", "cactus-d0.5", "cactus-d1")
    t1 = [c for c in cells if c.temperature == 1 and c.strategy == "single" and c.benchmark == "gsm8k"]
    assert len(t1) == 3 * 4  # 3 drafters x (sps, tas, cactus x 2 deltas)
    per_bench_t0 = [c for c in cells if c.temperature == 0 and c.benchmark == "gsm8k"]
    assert [c.strategy for c in per_bench_t0] == ["plain", "single", "single", "single", "route-confidence",
                                                  "merge-trie", "route-oracle"]
    assert len({c.cell_id for c in cells}) == len(cells)


def test_oracle_pulls_in_the_specialists_single_runs_and_pair_is_resolved():
    s = spec(strategies=["route-oracle"], drafters={"x": "a", "math": "b", "chat": "c"})
    assert s.pair == ("math", "chat")
    singles = {c.drafter for c in expand_cells(s) if c.strategy == "single"}
    assert singles == {"math", "chat"}
    assert spec(drafters={"p": "a", "q": "b"}).pair == ("p", "q")
    with pytest.raises(ValueError, match="two different drafters"):
        spec(drafters={"p": "a"})
    with pytest.raises(ValueError, match="not in --drafters"):
        spec(pair=("math", "zzz"))


def test_bad_flags_give_clear_errors():
    with pytest.raises(ValueError, match="--rules: unknown"):
        spec(rules=["fast"])
    with pytest.raises(ValueError, match="--strategies: unknown"):
        spec(strategies=["vote"])
    with pytest.raises(ValueError, match="top-p"):
        spec(top_p=0.0)
    assert parse_drafters("math=/x/m,chat=/y/c") == {"math": "/x/m", "chat": "/y/c"}
    assert parse_drafters("/runs/hass-math/") == {"hass-math": "/runs/hass-math/"}
    with pytest.raises(ValueError, match="twice"):
        parse_drafters("a=/x,a=/y")


def test_seeds_depend_only_on_cell_question_and_turn():
    c1 = Cell("single", "math", "gsm8k", "sps", None, 1.0)
    c2 = Cell("single", "chat", "gsm8k", "sps", None, 1.0)
    assert generation_seed(c1, 3, 0) == generation_seed(Cell(*c1.__dict__.values()), 3, 0)
    assert len({generation_seed(c, q, t) for c in (c1, c2) for q in (3, 4) for t in (0, 1)}) == 8
    items = list(range(7))
    assert sorted(shard(items, 0, 2) + shard(items, 1, 2)) == items


def test_part_writer_cuts_a_torn_line_and_store_merges_in_question_order(tmp_path):
    store = GridStore(tmp_path)
    cell = Cell("single", "math", "gsm8k", "sps", None, 1.0)
    w = store.open_part(cell, 1)
    w.append(7, [{"question_id": 7, "turn": 0}])
    with open(w.path, "a") as fh:
        fh.write('{"question_id": 9, "records": [{"tur')  # killed mid-write
    w = PartWriter(w.path)
    store.open_part(cell, 0).append(5, [{"question_id": 5, "turn": 0}, {"question_id": 5, "turn": 1}])
    w.append(9, [{"question_id": 9, "turn": 0}])
    assert len(read_jsonl(w.path)) == 2
    assert store.done_questions(cell) == {"5", "7", "9"}
    with pytest.raises(RuntimeError, match="missing prompts"):
        store.merge_parts(cell, [5, 7, 9, 11])
    records = store.merge_parts(cell, [9, 5, 7])
    assert [(r["question_id"], r["turn"]) for r in records] == [(9, 0), (5, 0), (5, 1), (7, 0)]
    assert not store.is_done(cell)
    store.write_cell(cell, records, {"tau": 1.0})
    assert store.is_done(cell) and store.done_cells()[0]["cell_id"] == cell.cell_id
    store.rebuild_results([cell.cell_id])
    assert len(store.load_results()) == 4


def test_store_refuses_other_settings(tmp_path):
    s = spec(output_dir=str(tmp_path))
    store = GridStore(tmp_path)
    store.check_settings(s.to_dict(), s.settings(), s.drafters)
    store.check_settings(s.to_dict(), s.settings(), s.drafters)  # same settings: fine
    other = spec(output_dir=str(tmp_path), max_new_tokens=16)
    with pytest.raises(ValueError, match="other settings"):
        store.check_settings(other.to_dict(), other.settings(), other.drafters)
    with pytest.raises(ValueError, match="other settings"):
        store.check_settings(s.to_dict(), s.settings(), {**s.drafters, "math": "elsewhere"})
    assert json.loads((tmp_path / "grid.json").read_text())["settings"]["max_new_tokens"] == 1024


def rec(q, vt, vp, wall=1.0, bench="gsm8k", turn=0, temp=1.0, **kw):
    return {"benchmark": bench, "question_id": q, "turn": turn, "temperature": temp, "verify_tokens": vt,
            "verify_passes": vp, "wall_s": wall, "new_tokens": vt + 1, **kw}


def test_pooled_tau_bootstrap_and_speedup():
    rs = [rec(0, 10, 5), rec(1, 3, 3), rec(1, 6, 2, turn=1), rec(2, 8, 4)]
    ci = st.pooled_tau(rs, n_boot=2000)
    assert ci.tau == pytest.approx(27 / 14) and ci.prompts == 3
    assert ci.low <= ci.tau <= ci.high and ci.low >= 1.0 and ci.high <= 3.0
    # the bootstrap resamples prompts (turns together): recompute one replicate by hand
    rng = np.random.default_rng(0)
    idx = rng.integers(0, 3, size=(2000, 3))
    tok, pas = np.array([10, 9, 8]), np.array([5, 5, 4])
    boots = tok[idx].sum(1) / pas[idx].sum(1)
    assert ci.low == pytest.approx(np.quantile(boots, 0.025))
    plain = [rec(0, 1, 1, wall=4.0), rec(1, 1, 1, wall=2.0), rec(9, 1, 1, wall=100.0)]
    assert st.speedup([rec(0, 10, 5, wall=1.0), rec(1, 3, 3, wall=2.0)], plain) == pytest.approx(2.0)
    assert st.speedup(rs, []) is None


def test_routing_depth_entropy_and_drift_statistics():
    rs = [rec(0, 4, 2, domain="math", routing=[0, 0, 1], depth_accepted=[2, 1], depth_reached=[4, 2],
              entropy_accepted={"sum": 1.0, "count": 2}, entropy_rejected={"sum": 9.0, "count": 3},
              target_logprob=-1.0),
          rec(1, 4, 2, domain="chat", routing=[1, 0], depth_accepted=[1], depth_reached=[2],
              entropy_accepted={"sum": 2.0, "count": 2}, entropy_rejected={"sum": 3.0, "count": 1},
              target_logprob=-2.0)]
    assert st.routing_accuracy(rs, ["m", "c"]) == pytest.approx(3 / 5)
    assert st.depth_acceptance(rs) == pytest.approx([3 / 6, 1 / 2])
    e = st.entropy_split(rs)
    assert e["accepted"] == pytest.approx(3 / 4) and e["rejected"] == pytest.approx(3.0)
    plain = [rec(0, 1, 1, target_logprob=-0.5), rec(1, 1, 1, target_logprob=-1.0)]
    assert st.drift(rs, plain) == pytest.approx(-0.75)
    assert st.routing_over_steps(rs) == pytest.approx([0.5, 1.0, 0.0])
