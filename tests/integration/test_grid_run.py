"""The evaluation grid end to end on a tiny float64 target with the default target's tokenizer.

Covers: every strategy through launch/eval_drafters.py with the report and plots; a killed grid
resuming without redoing finished work; 1 vs 2 ranks (torchrun, gloo on CPU) giving identical results.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import eval.grid_runner as grid_runner
from tests.conftest import REPO_ROOT, make_tiny_target

sys.path.insert(0, str(REPO_ROOT / "launch"))
import eval_drafters  # noqa: E402

TIMING = ("wall_s", "prefill_s", "target_s", "draft_s")


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    old = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny models: thread start-up dominates on a loaded 2-core CPU
    yield
    torch.set_num_threads(old)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory, data_dir):
    """A tiny target (default tokenizer, vocab 49152, hidden 16) and two untrained drafters on disk."""
    from checkpoints.drafter_io import save_drafter
    from training.drafter import DrafterConfig, EagleDrafter
    from training.target import FrozenTarget, load_tokenizer

    root = tmp_path_factory.mktemp("tiny")
    tok = load_tokenizer()
    model = make_tiny_target(vocab_size=len(tok), hidden_size=16, layers=1, seed=0, dtype=torch.float64)
    model.config.eos_token_id = tok.eos_token_id
    model.save_pretrained(root / "target")
    tok.save_pretrained(root / "target")
    frozen = FrozenTarget(model, str(root / "target"))
    from checkpoints.token_counts import save_token_counts

    for name, seed in (("math", 1), ("chat", 2)):
        cfg = DrafterConfig.from_target(model.config, frozen.info(), seed=seed)
        save_drafter(EagleDrafter.from_config(cfg).to(torch.float64), root / name)
        counts = torch.randint(0, 1000, (len(tok),), generator=torch.Generator().manual_seed(seed))
        save_token_counts(counts, root / name)
    return root


def flags(tiny: Path, out: Path, **kw) -> list[str]:
    args = {"target": tiny / "target", "drafters": f"math={tiny / 'math'},chat={tiny / 'chat'}",
            "benchmarks": "gsm8k", "rules": "sps", "strategies": "single,route-confidence,merge-trie",
            "temperatures": "0,1", "limit": 3, "max-new-tokens": 4, "draft-shape": "tree:6,2,2",
            "dtype": "float64", "output-dir": out, **kw}
    return [x for k, v in args.items() for x in (f"--{k}", str(v))] + ["--no-progress"]


def comparable(out: Path) -> list[dict]:
    rows = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    for r in rows:
        for k in TIMING:
            r.pop(k)
        r["target_logprob"] = round(r["target_logprob"], 9)
    return rows


@pytest.fixture(scope="module")
def reference(tiny, tmp_path_factory):
    out = tmp_path_factory.mktemp("reference")
    assert eval_drafters.main(flags(tiny, out) + ["--no-report"]) == 0
    return out


def test_every_strategy_through_the_entry_point_with_report(tiny, tmp_path):
    out = tmp_path / "all"
    argv = flags(tiny, out, benchmarks="gsm8k,mt_bench", limit=1, rules="sps,cactus", deltas="0.5",
                 strategies="single,average,route-confidence,route-entropy,route-oracle,"
                            "merge-concat,merge-trie,merge-equal-budget", temperatures="0,1",
                 **{"draft-vocab": 2048})  # a restricted draft vocabulary changes costs, never outputs at T = 0
    assert eval_drafters.main(argv) == 0
    rows = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    need = {"benchmark", "question_id", "turn", "drafter", "rule", "delta", "temperature", "new_tokens",
            "verify_tokens", "verify_passes", "tau", "wall_s", "output_text", "strategy", "routing",
            "depth_accepted", "entropy_accepted", "correct", "target_logprob"}
    assert all(need <= set(r) for r in rows)
    strategies = {r["strategy"] for r in rows}
    assert strategies == {"plain", "single", "average", "route-confidence", "route-entropy", "route-oracle",
                          "merge-concat", "merge-trie", "merge-equal-budget"}
    # T = 0: one greedy cell stands for sps and cactus; T = 1: both rules ran
    assert {(r["rule"], r["delta"]) for r in rows if r["temperature"] == 0 and r["strategy"] != "plain"} \
        == {("greedy", None)}
    assert {(r["rule"], r["delta"]) for r in rows if r["temperature"] == 1 and r["strategy"] != "plain"} \
        == {("sps", None), ("cactus", 0.5)}
    assert {r["turn"] for r in rows if r["benchmark"] == "mt_bench"} == {0, 1}
    for r in rows:
        assert r["tau"] == pytest.approx(r["verify_tokens"] / r["verify_passes"])
        assert r["new_tokens"] == 4
        if r["strategy"].startswith(("route-", "merge-")):
            assert len(r["routing"]) == r["verify_passes"]
    assert all(r["oracle"] for r in rows if r["strategy"] == "route-oracle")
    plain = {(r["benchmark"], r["question_id"], r["turn"]): r["output_text"] for r in rows
             if r["strategy"] == "plain" and r["temperature"] == 0}
    greedy = [r for r in rows if r["temperature"] == 0 and r["strategy"] != "plain"]
    assert len(greedy) == 9 * 3 and all(r["output_text"] == plain[r["benchmark"], r["question_id"], r["turn"]]
                                        for r in greedy)  # float64: every strategy is exactly greedy
    report = (out / "report.md").read_text()
    for text in ("route-oracle (oracle)", "were run once, as `greedy`", "nodes/pass", "Routing accuracy",
                 "accepted vs rejected", "Per-depth acceptance", "speedup", "Greedy exactness"):
        assert text in report
    for png in ("tau_by_benchmark_T1_sps.png", "acceptance_by_depth.png", "tau_quality_vs_delta.png",
                "routing_over_steps.png"):
        assert (out / png).stat().st_size > 1000


def test_killed_grid_resumes_without_redoing_finished_work(tiny, tmp_path, reference, monkeypatch):
    out = tmp_path / "killed"
    real = grid_runner.run_question
    calls = []

    def dying(*args, **kw):  # fault injection: the process dies during the 8th prompt
        calls.append(args[1].cell_id)
        if len(calls) == 8:
            raise KeyboardInterrupt
        return real(*args, **kw)

    monkeypatch.setattr(grid_runner, "run_question", dying)
    with pytest.raises(KeyboardInterrupt):
        eval_drafters.main(flags(tiny, out) + ["--no-report"])
    done = {p.parent.name: p.stat().st_mtime_ns for p in (out / "cells").glob("*/done.json")}
    assert len(done) == 2  # 3 prompts per cell: cells 1-2 finished, cell 3 has 1 prompt stored
    calls.clear()
    monkeypatch.setattr(grid_runner, "run_question", lambda *a, **k: (calls.append(a[1].cell_id), real(*a, **k))[1])
    assert eval_drafters.main(flags(tiny, out) + ["--no-report"]) == 0
    total = len(comparable(reference))  # one record per prompt (GSM8K has one turn)
    assert len(calls) == total - 7  # only the lost prompt and the never-started ones ran again
    assert not set(calls) & set(done)
    assert {p.parent.name: p.stat().st_mtime_ns for p in (out / "cells").glob("*/done.json")
            if p.parent.name in done} == done
    assert comparable(out) == comparable(reference)
    calls.clear()
    assert eval_drafters.main(flags(tiny, out) + ["--no-report"]) == 0 and calls == []  # all done: a no-op


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_two_ranks_give_the_same_results_as_one(tiny, tmp_path, reference):
    out = tmp_path / "ranks"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO_ROOT)}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port",
           str(free_port()), str(REPO_ROOT / "launch" / "eval_drafters.py"), *flags(tiny, out), "--no-report"]
    proc = subprocess.run(cmd, cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    parts = {p.name for p in (out / "cells").glob("*/part.rank*.jsonl")}
    assert parts == {"part.rank0.jsonl", "part.rank1.jsonl"}  # both ranks generated
    assert comparable(out) == comparable(reference)
