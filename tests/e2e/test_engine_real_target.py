"""On the real default target (fp32): greedy speculative decoding equals ``generate`` token for token,
and a two-turn conversation continues with the first turn's answer."""

from __future__ import annotations

import pytest
import torch

from eval.engine import build_engine, generate_turns
from training.drafter import DrafterConfig, EagleDrafter
from training.target import FrozenTarget, load_target


@pytest.fixture(scope="module")
def real():
    try:
        model, tok = load_target(dtype="float32", device="cpu")
    except (FileNotFoundError, RuntimeError) as err:
        pytest.skip(f"default target unavailable: {err}")
    frozen = FrozenTarget(model)
    drafter = EagleDrafter.from_config(DrafterConfig.from_target(model.config, frozen.info(), seed=0)).eval()
    return model, tok, drafter


def test_real_target_greedy_multi_turn(real):
    model, tok, drafter = real
    turns = ["What is 12 + 30? Answer briefly.", "Now double it."]
    eng = build_engine(model, drafter=drafter, shape="tree:6,2,3", rule="greedy", max_new_tokens=8,
                       eos_token_ids=[tok.eos_token_id])
    out = generate_turns(eng, tok, turns, torch.Generator().manual_seed(0))
    assert len(out) == 2 and all(rec.new_tokens for _, rec in out)
    # turn 1 equals plain generate on the same rendered prompt
    text = tok.apply_chat_template([{"role": "user", "content": turns[0]}], add_generation_prompt=True,
                                   tokenize=False)
    ids = torch.tensor([tok(text, add_special_tokens=False)["input_ids"]])
    ref = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=8, do_sample=False,
                         eos_token_id=tok.eos_token_id, pad_token_id=tok.eos_token_id)[0, ids.shape[1]:].tolist()
    assert out[0][1].new_tokens == ref
    # turn 2's prompt contains turn 1's answer: its prompt is longer than both user turns alone
    assert out[1][1].prompt_tokens > ids.shape[1] + len(ref)
