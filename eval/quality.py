"""Answer quality and drift from the target (DESIGN.md section 8).

- GSM8K / SVAMP: the last number in the output equals the reference's final number
  (GSM8K references end in ``#### <number>``; SVAMP references are the number itself).
- MATH-500: the last ``\\boxed{...}`` of the output (else the text after "answer is", else the
  last number) equals the reference's last ``\\boxed{...}`` after LaTeX normalisation, or both
  parse to the same number.
- Drift (relaxed rules): the target's mean log-likelihood of the generated tokens (temperature 1,
  no warping); the report compares it with plain decoding on the same prompts.
"""

from __future__ import annotations

import math
import re

import torch

_NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?|-?\.\d+")


def _to_float(text: str) -> float | None:
    text = text.replace(",", "").strip().rstrip(".")
    try:
        value = float(text)
    except ValueError:
        return None
    return value if math.isfinite(value) else None


def last_number(text: str) -> float | None:
    """The last number written in ``text`` (commas as thousands separators allowed)."""
    for match in reversed(_NUMBER.findall(text or "")):
        value = _to_float(match)
        if value is not None:
            return value
    return None


def reference_number(reference: str) -> float | None:
    """The final number of a GSM8K (``#### n``) or SVAMP (``n``) reference."""
    if reference is None:
        return None
    if "####" in reference:
        reference = reference.rsplit("####", 1)[1]
    return last_number(reference)


def number_match(output: str, reference: str, tol: float = 1e-6) -> bool:
    want, got = reference_number(reference), last_number(output)
    if want is None:
        raise ValueError(f"reference {reference!r} holds no number")
    return got is not None and abs(got - want) <= tol * max(1.0, abs(want))


def last_boxed(text: str) -> str | None:
    """Content of the last ``\\boxed{...}`` (or ``\\fbox{...}``), with nested braces."""
    text = text or ""
    start = max(text.rfind("\\boxed"), text.rfind("\\fbox"))
    if start < 0:
        return None
    brace = text.find("{", start)
    if brace < 0:
        rest = text[start + len("\\boxed"):].strip()
        return rest.split("$")[0].strip() or None
    depth = 0
    for i in range(brace, len(text)):
        if text[i] == "{":
            depth += 1
        elif text[i] == "}":
            depth -= 1
            if depth == 0:
                return text[brace + 1:i]
    return None


def _strip_text_macros(s: str) -> str:
    return re.sub(r"\\(?:text|textbf|mathrm|mbox)\{([^{}]*)\}", r"\1", s)


def normalize_math_answer(answer: str) -> str:
    """A canonical string for a MATH final answer (LaTeX spacing, \\left/\\right, dfrac, degrees...)."""
    s = answer.strip()
    s = _strip_text_macros(s)
    for old, new in (("\\left", ""), ("\\right", ""), ("\\!", ""), ("\\,", ""), ("\\;", ""), ("\\:", ""),
                     ("\\ ", ""), ("dfrac", "frac"), ("tfrac", "frac"), ("^\\circ", ""), ("^{\\circ}", ""),
                     ("\\%", ""), ("%", ""), ("\\$", ""), ("$", ""), ("\\displaystyle", "")):
        s = s.replace(old, new)
    s = re.sub(r"\s+", "", s)
    s = s.rstrip(".")
    if s.startswith(("x=", "y=", "k=", "n=")) and s.count("=") == 1:
        s = s.split("=", 1)[1]
    s = re.sub(r"\\frac(\d)(\d)", r"\\frac{\1}{\2}", s)
    s = re.sub(r"\\sqrt(\d)", r"\\sqrt{\1}", s)
    if re.fullmatch(r"-?\d+\.0+", s):
        s = s.split(".")[0]
    return s


def extract_math_answer(output: str) -> str | None:
    boxed = last_boxed(output)
    if boxed is not None:
        return boxed
    match = re.findall(r"answer is[:\s]*\$?([^\n$]+)", output or "")
    if match:
        return match[-1].strip()
    number = _NUMBER.findall(output or "")
    return number[-1] if number else None


def math_match(output: str, reference: str) -> bool:
    want = last_boxed(reference) if "\\boxed" in (reference or "") else reference
    if want is None:
        raise ValueError("MATH reference holds no final answer")
    got = extract_math_answer(output)
    if got is None:
        return False
    a, b = normalize_math_answer(got), normalize_math_answer(want)
    if a == b:
        return True
    fa, fb = _to_float(a), _to_float(b)
    return fa is not None and fb is not None and abs(fa - fb) <= 1e-6 * max(1.0, abs(fb))


def answer_correct(benchmark: str, output: str, reference: str | None) -> bool | None:
    """Exact-match quality for benchmarks with references; None where there is no reference."""
    if reference is None or benchmark == "mt_bench":
        return None
    if benchmark in ("gsm8k", "svamp"):
        return number_match(output, reference)
    if benchmark == "math_500":
        return math_match(output, reference)
    return None


@torch.no_grad()
def target_mean_logprob(model, prompt_ids: torch.Tensor, new_ids: torch.Tensor | list[int]) -> float | None:
    """The target's mean log-probability (temperature 1) of ``new_ids`` continuing ``prompt_ids``."""
    new = torch.as_tensor(new_ids, dtype=torch.long, device=prompt_ids.device).reshape(1, -1)
    if new.shape[1] == 0:
        return None
    ids = torch.cat([prompt_ids.reshape(1, -1), new], dim=1)
    n = new.shape[1]  # only the last n positions need the (vocabulary-wide) lm_head
    logits = model(input_ids=ids[:, :-1], use_cache=False, logits_to_keep=n).logits[:, -n:]
    logp = torch.log_softmax(logits.double(), dim=-1).gather(-1, new.unsqueeze(-1)).squeeze(-1)
    return float(logp.mean())
