"""Row validation, drop reasons, strict mode, repairs and de-duplication."""

from __future__ import annotations

import pytest

from data_recipes.records import BadRowError, DataReport, Record, deduplicate, normalise_row


def _norm(messages, report=None, strict=False):
    report = report if report is not None else DataReport()
    return normalise_row(messages, row_id="r", source="s", domain="chat", where="f.jsonl:3",
                         report=report, strict=strict), report


U = {"role": "user", "content": "q"}
A = {"role": "assistant", "content": "a"}


@pytest.mark.parametrize("messages, reason", [
    ([U, U, A], "bad_role_order"),
    ([U, A, A], "bad_role_order"),
    ([U, {"role": "system", "content": "s"}, A], "bad_role_order"),
    ([U, {"role": "assistant", "content": "  "}], "empty_content"),
    ([U, {"role": "assistant", "content": 3}], "non_string_content"),
    ([U, {"role": "assistant", "content": None}], "non_string_content"),
    ([U], "no_assistant_turn"),
    ([{"role": "system", "content": "s"}], "no_assistant_turn"),
    ([U, {"role": "bing", "content": "a"}], "unknown_role"),
    ([U, {"content": "a"}], "unknown_role"),
    ([], "malformed_row"),
    ("not a list", "malformed_row"),
])
def test_bad_rows_are_dropped_and_counted(messages, reason):
    rec, report = _norm(messages)
    assert rec is None
    assert report.counts == {reason: 1}
    assert report.examples[reason][0].startswith("f.jsonl:3")


def test_strict_raises_with_location():
    with pytest.raises(BadRowError, match=r"f.jsonl:3.*bad_role_order"):
        _norm([U, U, A], strict=True)


def test_aliases_and_repairs_are_recorded():
    rec, report = _norm([{"from": "gpt", "value": "orphan"}, {"from": "human", "value": "q"},
                         {"from": "gpt", "value": "a"}, {"from": "human", "value": "unanswered"}])
    assert rec.messages == ({"role": "user", "content": "q"}, {"role": "assistant", "content": "a"})
    assert report.repaired == {"leading_assistant_removed": 1, "trailing_user_removed": 1}
    assert not report.counts


def test_system_then_alternation_is_valid():
    sys_msg = {"role": "system", "content": "be brief"}
    rec, report = _norm([sys_msg, U, A, U, A])
    assert [m["role"] for m in rec.messages] == ["system", "user", "assistant", "user", "assistant"]


def test_examples_are_capped_but_counts_are_not():
    report = DataReport()
    for _ in range(12):
        _norm([U, U, A], report)
    assert report.counts["bad_role_order"] == 12
    assert len(report.examples["bad_role_order"]) == 5


def test_deduplicate_normalises_case_and_whitespace():
    def rec(i, text):
        return Record(str(i), "s", "math", ({"role": "user", "content": "Q"}, {"role": "assistant", "content": text}))

    report = DataReport()
    kept = deduplicate([rec(0, "Hello  world"), rec(1, "hello world "), rec(2, "hello there")], report)
    assert [r.id for r in kept] == ["0", "2"]
    assert report.counts["duplicate"] == 1


def test_record_round_trip_and_domain_check():
    r = Record("x", "s", "math", (U, A))
    assert Record.from_dict(r.to_dict()) == r
    with pytest.raises(ValueError, match="domain"):
        Record("x", "s", "code", (U, A))
