"""Render conversations with the tokenizer's own chat template and find the assistant-only loss mask.

The trained spans are found from the template itself, never from hard-coded separators: for every
assistant turn ``i`` the conversation up to (not including) turn ``i`` is rendered, then up to and
including it. Both renders must be prefixes of the full render (otherwise the template rewrites
earlier turns, and :class:`TemplateRewriteError` is raised). The text between them is
``header + content + footer``; the trained span is the assistant content plus the footer up to and
including its first special token (the end-of-turn token, e.g. ``<|im_end|>`` or ``<|eot_id|>``).
Character spans are mapped to tokens with the fast tokenizer's offsets, tokenising the full render once.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

_PROBE = "\u2063TAPS-PROBE\u2063"


class TemplateRewriteError(ValueError):
    """The chat template renders earlier turns differently once later turns are added."""


class MaskError(ValueError):
    """An assistant turn could not be located in the render."""


@dataclass
class Encoded:
    input_ids: list[int]
    loss_mask: list[int]
    text: str


def template_of(tokenizer) -> str:
    template = getattr(tokenizer, "chat_template", None)
    if isinstance(template, dict):
        template = template.get("default") or next(iter(template.values()))
    if not template:
        raise ValueError(f"tokenizer {getattr(tokenizer, 'name_or_path', '?')!r} has no chat template; "
                         "set tokenizer.chat_template (a Jinja string) before preparing data")
    return template


def template_id(tokenizer) -> str:
    """A short name + hash of the chat template (for manifests and cache keys)."""
    return "sha256:" + hashlib.sha256(template_of(tokenizer).encode()).hexdigest()[:16]


def _render(tokenizer, messages: list[dict]) -> str:
    return tokenizer.apply_chat_template(list(messages), tokenize=False, add_generation_prompt=False)


def _template_name(tokenizer) -> str:
    return f"the chat template of {getattr(tokenizer, 'name_or_path', '?')!r} ({template_id(tokenizer)})"


def assistant_char_spans(tokenizer, messages: list[dict], *, limit_chars: int | None = None
                         ) -> tuple[str, list[tuple[int, int, int]]]:
    """The full render and, per assistant turn, (content_start, content_end, footer_end) in characters.

    Turns starting after ``limit_chars`` (beyond any truncation) are not located.
    """
    full = _render(tokenizer, messages)
    spans = []
    for i, msg in enumerate(messages):
        if msg["role"] != "assistant":
            continue
        before = _render(tokenizer, messages[:i]) if i > 0 else ""
        if limit_chars is not None and len(before) > limit_chars:
            break
        upto = full if i == len(messages) - 1 else _render(tokenizer, messages[: i + 1])
        for label, part in (("before", before), ("through", upto)):
            if not full.startswith(part):
                raise TemplateRewriteError(
                    f"{_template_name(tokenizer)} rewrites earlier turns: the render {label} assistant turn "
                    f"{i} is not a prefix of the full conversation's render, so the assistant spans cannot "
                    "be found safely (reasoning templates that strip earlier thoughts do this). Use a "
                    "template that renders history unchanged, or train on single-turn data.")
        segment = upto[len(before):]
        start = _locate_content(tokenizer, messages, i, segment)
        content = msg["content"]
        seg_content = content if segment.startswith(content, start) else content.strip()
        spans.append((len(before) + start, len(before) + start + len(seg_content), len(upto)))
    return full, spans


def _locate_content(tokenizer, messages: list[dict], i: int, segment: str) -> int:
    content = messages[i]["content"]
    for text in dict.fromkeys((content, content.strip())):
        first = segment.find(text)
        if first < 0:
            continue
        if segment.find(text, first + 1) < 0:
            return first
        # Ambiguous (the content also occurs in the header/footer): find the header with a probe.
        probe = [*messages[:i], {"role": "assistant", "content": _PROBE}]
        rendered = _render(tokenizer, probe)
        before = _render(tokenizer, messages[:i]) if i > 0 else ""
        header = rendered.find(_PROBE, len(before)) - len(before)
        if header >= 0 and segment.startswith(text, header):
            return header
    raise MaskError(f"{_template_name(tokenizer)} does not render the content of assistant turn {i} verbatim "
                    "(it rewrites the message), so the trained span cannot be found")


def special_ids(tokenizer) -> set[int]:
    ids = set(getattr(tokenizer, "all_special_ids", []) or [])
    decoder = getattr(tokenizer, "added_tokens_decoder", {}) or {}
    ids.update(i for i, tok in decoder.items() if getattr(tok, "special", False))
    return ids


CHARS_PER_TOKEN_BOUND = 8


def _tokenise_many(tokenizer, texts: list[str], max_tokens: int | None) -> list[tuple[list[int], list]]:
    """Tokenise ``texts`` in one batch (with offsets); with ``max_tokens``, only as much as is needed.

    A long render is cut at ``max_tokens * 8`` characters first; when that piece still has comfortably
    more than ``max_tokens`` tokens, its first ``max_tokens`` tokens are those of the full text (the
    pre-tokeniser is local, so only tokens next to the cut can differ). Otherwise the full text is used.
    """
    cut = max_tokens * CHARS_PER_TOKEN_BOUND if max_tokens is not None else None
    pieces = [t[:cut] if cut is not None else t for t in texts]
    enc = tokenizer(pieces, add_special_tokens=False, return_offsets_mapping=True)
    out = []
    for text, piece, ids, offsets in zip(texts, pieces, enc["input_ids"], enc["offset_mapping"]):
        if len(piece) < len(text) and len(ids) < max_tokens + 16:
            full = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
            ids, offsets = full["input_ids"], full["offset_mapping"]
        if max_tokens is not None:
            ids, offsets = ids[:max_tokens], offsets[:max_tokens]
        out.append((list(ids), list(offsets)))
    return out


def _mask(ids: list[int], offsets: list, spans: list[tuple[int, int, int]], specials: set[int]) -> list[int]:
    mask = [0] * len(ids)
    t = 0
    for c_start, c_end, f_end in spans:
        while t < len(ids) and offsets[t][1] <= c_start:
            t += 1
        while t < len(ids) and offsets[t][0] < c_end:
            mask[t] = 1
            t += 1
        # footer: up to and including the first special token (end of turn), if the footer has one
        k = t
        while k < len(ids) and offsets[k][0] < f_end:
            if ids[k] in specials:
                for j in range(t, k + 1):
                    mask[j] = 1
                t = k + 1
                break
            k += 1
    return mask


def encode_conversations(tokenizer, conversations: list[list[dict]], *, specials: set[int] | None = None,
                         max_tokens: int | None = None) -> list[Encoded]:
    """Token ids of each rendered conversation and a mask of 1 on every assistant content + end-of-turn token.

    With ``max_tokens`` each result is truncated to that many tokens (and only about that much is
    tokenised). The conversations are tokenised as one batch.
    """
    limit = max_tokens * CHARS_PER_TOKEN_BOUND if max_tokens is not None else None
    rendered = [assistant_char_spans(tokenizer, messages, limit_chars=limit) for messages in conversations]
    specials = special_ids(tokenizer) if specials is None else specials
    tokens = _tokenise_many(tokenizer, [full for full, _ in rendered], max_tokens)
    return [Encoded(ids, _mask(ids, offsets, spans, specials), full)
            for (full, spans), (ids, offsets) in zip(rendered, tokens)]


def encode_conversation(tokenizer, messages: list[dict], *, specials: set[int] | None = None,
                        max_tokens: int | None = None) -> Encoded:
    """:func:`encode_conversations` for one conversation."""
    return encode_conversations(tokenizer, [messages], specials=specials, max_tokens=max_tokens)[0]


def mask_segments(input_ids: list[int], loss_mask: list[int]) -> list[tuple[int, list[int]]]:
    """Consecutive runs of (mask value, token ids)."""
    runs: list[tuple[int, list[int]]] = []
    for tok, m in zip(input_ids, loss_mask):
        if runs and runs[-1][0] == m:
            runs[-1][1].append(tok)
        else:
            runs.append((m, [tok]))
    return runs


def show_masked(tokenizer, input_ids: list[int], loss_mask: list[int], *, left: str = "\u27e6",
                right: str = "\u27e7") -> str:
    """The decoded sequence with trained spans wrapped in ``left``/``right`` markers."""
    parts = []
    for m, toks in mask_segments(input_ids, loss_mask):
        text = tokenizer.decode(toks, skip_special_tokens=False)
        parts.append(f"{left}{text}{right}" if m else text)
    return "".join(parts)
