"""Answer matching for GSM8K / SVAMP / MATH-500 and the target log-likelihood used for drift."""

from __future__ import annotations

import pytest
import torch

from eval.quality import (
    answer_correct,
    last_boxed,
    last_number,
    math_match,
    normalize_math_answer,
    target_mean_logprob,
)
from tests.conftest import make_tiny_target

GSM_REF = "Janet sells 16 - 3 - 4 = <<16-3-4=9>>9 duck eggs a day.\nShe makes 9 * 2 = $<<9*2=18>>18.\n#### 18"


def test_final_number_match():
    assert last_number("so 3 + 4 = 7, then 1,250.50 dollars.") == pytest.approx(1250.5)
    assert last_number("no digits") is None
    assert answer_correct("gsm8k", "She makes $18 every day.", GSM_REF)
    assert not answer_correct("gsm8k", "18 eggs, so the answer is 19", GSM_REF)
    assert answer_correct("gsm8k", "The answer is 18.00", GSM_REF)
    assert answer_correct("svamp", "They flew away: 27", "27")
    assert answer_correct("svamp", "-3 is the change", "-3.0")
    assert answer_correct("mt_bench", "anything", None) is None
    with pytest.raises(ValueError, match="no number"):
        answer_correct("svamp", "5", "none")


def test_math_answer_normalisation():
    ref = "Therefore the polar coordinates are $\\boxed{\\left( 3, \\frac{\\pi}{2} \\right)}.$"
    assert last_boxed(ref) == "\\left( 3, \\frac{\\pi}{2} \\right)"
    assert math_match("So we get \\boxed{(3,\\dfrac{\\pi}{2})}", ref)
    assert not math_match("So we get \\boxed{(3,\\pi)}", ref)
    assert math_match("The answer is $\\frac12$", "\\boxed{\\frac{1}{2}}")
    assert math_match("\\boxed{90^\\circ}", "\\boxed{90}")
    assert math_match("\\boxed{x = 5.0}", "\\boxed{5}")
    assert math_match("\\boxed{\\text{(C)}}", "\\boxed{(C)}")
    assert normalize_math_answer("\\left[ 2, 5 \\right)") == "[2,5)"
    assert answer_correct("math_500", "no answer here", "\\boxed{4}") is False


def test_target_mean_logprob_matches_an_independent_computation():
    model = make_tiny_target(vocab_size=32, seed=1, dtype=torch.float64)
    prompt = torch.tensor([3, 5, 7, 9])
    new = [4, 4, 8]
    want = 0.0
    ids = prompt.tolist()
    for t in new:  # one full forward per token, no cache, no slicing shortcut
        with torch.no_grad():
            logits = model(input_ids=torch.tensor([ids])).logits[0, -1]
        want += float(torch.log_softmax(logits, -1)[t])
        ids.append(t)
    assert target_mean_logprob(model, prompt, new) == pytest.approx(want / 3, rel=1e-9)
    assert target_mean_logprob(model, prompt, []) is None
