"""Golden tests of the assistant-only loss mask for several chat templates (tests/golden/data_mask_templates.json)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from data_recipes.masks import (
    MaskError,
    TemplateRewriteError,
    encode_conversation,
    mask_segments,
    show_masked,
    template_id,
)

GOLDEN = json.loads((Path(__file__).resolve().parents[1] / "golden" / "data_mask_templates.json").read_text())
TEMPLATES = list(GOLDEN["templates"])
CASES = list(GOLDEN["cases"])


@pytest.fixture(scope="module")
def tokenizer():
    """The default target's tokenizer, with the special tokens of the other templates added."""
    from training.target import load_tokenizer

    tok = load_tokenizer()
    tok.add_tokens(GOLDEN["special_tokens"], special_tokens=True)
    own = tok.chat_template
    yield tok
    tok.chat_template = own


def _use(tok, name: str, own: str) -> None:
    tok.chat_template = GOLDEN["templates"][name] or own


@pytest.fixture(scope="module")
def own_template(tokenizer):
    return tokenizer.chat_template


def _trained_texts(tok, ids, mask) -> list[str]:
    return [tok.decode(toks, skip_special_tokens=False) for m, toks in mask_segments(ids, mask) if m]


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("name", TEMPLATES)
def test_mask_golden(tokenizer, own_template, name, case):
    _use(tokenizer, name, own_template)
    messages = GOLDEN["cases"][case]["messages"]
    enc = encode_conversation(tokenizer, messages)
    assert len(enc.input_ids) == len(enc.loss_mask)
    assert _trained_texts(tokenizer, enc.input_ids, enc.loss_mask) == GOLDEN["cases"][case]["expected"][name]
    # everything not trained is the rest of the render, in order: nothing lost or duplicated
    assert tokenizer.decode(enc.input_ids, skip_special_tokens=False) == enc.text
    untrained = "".join(tokenizer.decode(t, skip_special_tokens=False) for m, t in mask_segments(enc.input_ids, enc.loss_mask) if not m)
    assert "".join(_trained_texts(tokenizer, enc.input_ids, enc.loss_mask)) not in untrained
    for msg in messages:  # user and system text is never trained
        if msg["role"] != "assistant":
            assert all(msg["content"].strip() not in t for t in _trained_texts(tokenizer, enc.input_ids, enc.loss_mask))


def test_truncation_keeps_prefix_of_full_encoding(tokenizer, own_template):
    _use(tokenizer, "chatml_smollm2", own_template)
    messages = [{"role": "user", "content": "word " * 50}, {"role": "assistant", "content": "answer " * 400}]
    full = encode_conversation(tokenizer, messages)
    cut = encode_conversation(tokenizer, messages, max_tokens=120)
    assert cut.input_ids == full.input_ids[:120]
    assert cut.loss_mask == full.loss_mask[:120]


def test_rewriting_template_is_an_error(tokenizer, own_template):
    tokenizer.chat_template = GOLDEN["rewriting_template"]
    messages = [{"role": "user", "content": "q1"}, {"role": "assistant", "content": "<think>hmm</think>a1"},
                {"role": "user", "content": "q2"}, {"role": "assistant", "content": "a2"}]
    with pytest.raises(TemplateRewriteError, match="rewrites earlier turns") as err:
        encode_conversation(tokenizer, messages)
    assert template_id(tokenizer) in str(err.value)
    # a single-turn conversation is rendered consistently by the same template
    enc = encode_conversation(tokenizer, messages[:2])
    assert _trained_texts(tokenizer, enc.input_ids, enc.loss_mask) == ["<think>hmm</think>a1<|im_end|>"]
    _use(tokenizer, "chatml_smollm2", own_template)


def test_template_that_drops_content_is_an_error(tokenizer, own_template):
    tokenizer.chat_template = ("{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\n' + "
                               "(m['content'] if m['role'] != 'assistant' else 'REDACTED') + '<|im_end|>\n' }}{% endfor %}")
    with pytest.raises(MaskError, match="verbatim"):
        encode_conversation(tokenizer, [{"role": "user", "content": "q"}, {"role": "assistant", "content": "secret"}])
    _use(tokenizer, "chatml_smollm2", own_template)


def test_show_masked_marks_trained_spans(tokenizer, own_template):
    _use(tokenizer, "chatml_smollm2", own_template)
    enc = encode_conversation(tokenizer, [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Yo"}])
    shown = show_masked(tokenizer, enc.input_ids, enc.loss_mask)
    assert "\u27e6Yo<|im_end|>\u27e7" in shown
    assert shown.count("\u27e6") == 1


_WORD = st.text(alphabet="abcdefghijklmnopqrstuvwxyzABC0123456789.,?!", min_size=1, max_size=8)
_TEXT = st.lists(_WORD, min_size=1, max_size=12).map(" ".join)
_EOT = {"chatml_smollm2": "<|im_end|>", "llama3": "<|eot_id|>", "qwen2": "<|im_end|>"}


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(turns=st.lists(st.tuples(_TEXT, _TEXT), min_size=1, max_size=4), system=st.none() | _TEXT,
       name=st.sampled_from(sorted(_EOT)))
def test_mask_property_random_conversations(tokenizer, own_template, turns, system, name):
    """For any conversation, the trained tokens decode to exactly each assistant text + end-of-turn token."""
    _use(tokenizer, name, own_template)
    messages = [{"role": "system", "content": system}] if system else []
    for user, assistant in turns:
        messages += [{"role": "user", "content": user}, {"role": "assistant", "content": assistant}]
    enc = encode_conversation(tokenizer, messages)
    assert _trained_texts(tokenizer, enc.input_ids, enc.loss_mask) == [a + _EOT[name] for _, a in turns]
