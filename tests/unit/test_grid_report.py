"""report.md from hand-made stored results: the tables hold the hand-computed numbers."""

from __future__ import annotations

import json

from eval.report import write_report


def row(strategy, drafter, q, vt, vp, wall, *, temp=0.0, rule="greedy", bench="gsm8k", **kw):
    return {"cell_id": f"{strategy}.{drafter}.{bench}.{rule}.T{temp:g}", "strategy": strategy, "drafter": drafter,
            "benchmark": bench, "rule": rule, "delta": None, "temperature": temp, "covers": ["sps", "tas"],
            "question_id": q, "turn": 0, "domain": "math", "verify_tokens": vt, "verify_passes": vp,
            "new_tokens": vt + 1, "wall_s": wall, "output_text": f"out {q}", "correct": q == 0,
            "target_logprob": -1.0, "verify_budget": 59, "tree_nodes": 59 * vp, **kw}


def test_report_tables_hold_hand_computed_values(tmp_path):
    rows = [row("plain", "-", 0, 10, 10, 8.0), row("plain", "-", 1, 20, 20, 16.0),
            row("single", "math", 0, 30, 10, 2.0, depth_accepted=[8, 4], depth_reached=[10, 8]),
            row("single", "math", 1, 30, 15, 6.0, depth_accepted=[10, 2], depth_reached=[15, 10],
                output_text="diverged"),
            row("route-oracle", "math+chat", 0, 30, 10, 2.0, routing=[0] * 10, oracle=True),
            row("route-oracle", "math+chat", 1, 30, 15, 6.0, routing=[1] * 15, oracle=True)]
    (tmp_path / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (tmp_path / "grid.json").write_text(json.dumps({"spec": {"pair": ["math", "chat"]}, "settings": {}}))
    text = write_report(tmp_path).read_text()
    # pooled tau = 60 / 25 = 2.40; speedup = (8 + 16) / (2 + 6) = 3.00x; budget 59 nodes per pass
    assert "| math | 2.40 [" in text and "| 2.40 | 3.00x |" in text
    assert "| route-oracle (oracle) | 2.40 [" in text and "| 3.00x | 59 | 59.0 |" in text
    assert "were run once, as `greedy`" in text and "sps, tas" in text
    # both questions have domain math: the oracle picked math on 10 of 25 steps
    assert "| route-oracle (oracle) | 0 | greedy | 40.0% |" in text
    # alpha_1 = 18 / 25 = 0.72, alpha_2 = 6 / 18 = 0.33; accuracy 1 of 2 prompts; drift 0
    assert "| math | gsm8k | 0 | 0.72 | 0.33 |" in text
    assert "acc 50%; drift +0.000" in text
    assert "Greedy exactness" in text and "single:math 1/2" in text  # question 1's text differs from plain's
    assert (tmp_path / "acceptance_by_depth.png").is_file() and (tmp_path / "routing_over_steps.png").is_file()
