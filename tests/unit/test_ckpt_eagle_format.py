"""EAGLE-layout export: a schema written from the loaders' code, an independent forward, exact round trip.

The schema below was written from reading (search tool, code corpus):
- SafeAILab/EAGLE ``eagle/model/cnets1.py`` (``Model``: ``embed_tokens``, ``layers`` of
  ``LlamaDecoderLayer(config, index)`` without ``input_layernorm`` at index 0, ``fc`` Linear(2h, h,
  bias=bias); attention head_dim = hidden_size // num_attention_heads, q/k/v/o without bias unless
  ``qkv_bias``), ``eagle/model/configs.py`` (``EConfig``: rope_scaling None or a 2-field dict with
  type linear/dynamic and a float factor > 1) and ``eagle/model/ea_model.py`` (``bias`` read from
  config.json, default True; ``pytorch_model.bin`` then ``model.safetensors``).
- sgl-project/sglang ``python/sglang/srt/models/llama_eagle.py`` (``EntryClass =
  [LlamaForCausalLMEagle]``; ``fc`` always with bias; layer 0's input_layernorm deleted; keys get
  a ``model.`` prefix, ``lm_head`` skipped).
- vllm-project/vllm ``vllm/model_executor/models/llama_eagle.py`` (``fc`` bias=False; class
  ``"Eagle" + architectures[0]``).
"""

from __future__ import annotations

import json
import logging
import math

import pytest
import torch
from safetensors.torch import load_file
from transformers import LlamaConfig
from transformers.activations import ACT2FN

from checkpoints.drafter_io import load_drafter, save_drafter
from checkpoints.eagle_format import export_eagle, import_eagle
from checkpoints.validation import CheckpointError
from tests.conftest import make_tiny_target
from training.drafter import DrafterConfig, EagleDrafter
from training.target import FrozenTarget


def eagle_loader_schema(cfg: dict) -> tuple[dict, dict, set]:
    """(required key -> shape, optional key -> shape, forbidden keys) the loaders accept."""
    h, n = cfg["hidden_size"], cfg["num_attention_heads"]
    kv, inter, d = cfg["num_key_value_heads"], cfg["intermediate_size"], h // n
    required = {"fc.weight": (h, 2 * h),
                "layers.0.self_attn.q_proj.weight": (n * d, h),
                "layers.0.self_attn.k_proj.weight": (kv * d, h),
                "layers.0.self_attn.v_proj.weight": (kv * d, h),
                "layers.0.self_attn.o_proj.weight": (h, n * d),
                "layers.0.mlp.gate_proj.weight": (inter, h),
                "layers.0.mlp.up_proj.weight": (inter, h),
                "layers.0.mlp.down_proj.weight": (h, inter),
                "layers.0.post_attention_layernorm.weight": (h,)}
    if cfg.get("bias", True):
        required["fc.bias"] = (h,)
    optional = {"embed_tokens.weight": (cfg["vocab_size"], h)}
    forbidden = {"layers.0.input_layernorm.weight", "lm_head.weight"}
    return required, optional, forbidden


def check_eagle_config(cfg: dict, engine: str) -> None:
    assert cfg["model_type"] == "llama" and cfg["num_hidden_layers"] == 1
    assert cfg["hidden_size"] % cfg["num_attention_heads"] == 0
    assert cfg.get("head_dim", cfg["hidden_size"] // cfg["num_attention_heads"]) == \
        cfg["hidden_size"] // cfg["num_attention_heads"]
    scaling = cfg.get("rope_scaling")
    assert scaling is None or (len(scaling) == 2 and scaling["type"] in ("linear", "dynamic")
                               and isinstance(scaling["factor"], float) and scaling["factor"] > 1)
    assert isinstance(cfg["bias"], bool) and cfg.get("pretraining_tp", 1) == 1
    assert cfg["hidden_act"] in ACT2FN and isinstance(cfg["rope_theta"], float)
    assert cfg["pad_token_id"] is None or 0 <= cfg["pad_token_id"] < cfg["vocab_size"]
    assert cfg.get("attention_bias", False) is False and cfg.get("mlp_bias", False) is False
    arch = cfg["architectures"][0]
    if engine == "sglang":
        assert arch == "LlamaForCausalLMEagle"
    elif engine == "vllm":
        assert "Eagle" + arch == "EagleLlamaForCausalLM" and cfg["bias"] is False
    LlamaConfig(**{k: v for k, v in cfg.items() if k != "taps"})  # transformers parses it


def check_eagle_weights(state: dict, cfg: dict) -> None:
    required, optional, forbidden = eagle_loader_schema(cfg)
    keys = set(state)
    assert set(required) <= keys, f"missing {set(required) - keys}"
    assert not keys & forbidden
    assert keys <= set(required) | set(optional), f"unexpected {keys - set(required) - set(optional)}"
    assert not any(k.startswith("model.") for k in keys)  # SGLang/vLLM add the prefix themselves
    for key, value in state.items():
        assert tuple(value.shape) == {**required, **optional}[key], key


def eagle_reference_forward(state: dict, cfg: dict, embeds, feats) -> torch.Tensor:
    """EAGLE-1's drafter computed from the exported tensors alone (cnets1.Model, causal, no cache)."""
    h, n, kv = cfg["hidden_size"], cfg["num_attention_heads"], cfg["num_key_value_heads"]
    d, (b, t, _) = h // n, embeds.shape
    x = torch.nn.functional.linear(torch.cat([embeds, feats], -1), state["fc.weight"], state.get("fc.bias"))
    inv_freq = 1.0 / (cfg["rope_theta"] ** (torch.arange(0, d, 2).float() / d))
    freqs = torch.outer(torch.arange(t).float(), inv_freq)
    cos, sin = torch.cat([freqs, freqs], -1).cos(), torch.cat([freqs, freqs], -1).sin()

    def rope(z):
        z1, z2 = z[..., : d // 2], z[..., d // 2:]
        return z * cos + torch.cat([-z2, z1], -1) * sin

    def proj(name, heads):
        return (x @ state[f"layers.0.self_attn.{name}_proj.weight"].T).view(b, t, heads, d).transpose(1, 2)

    q, k, v = rope(proj("q", n)), rope(proj("k", kv)), proj("v", kv)
    k, v = k.repeat_interleave(n // kv, 1), v.repeat_interleave(n // kv, 1)
    scores = q @ k.transpose(2, 3) / math.sqrt(d)
    scores = scores.masked_fill(torch.ones(t, t, dtype=torch.bool).triu(1), float("-inf"))
    attn = (scores.softmax(-1) @ v).transpose(1, 2).reshape(b, t, h)
    x = x + attn @ state["layers.0.self_attn.o_proj.weight"].T
    normed = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + cfg["rms_norm_eps"])
    normed = normed * state["layers.0.post_attention_layernorm.weight"]
    act = ACT2FN[cfg["hidden_act"]]
    mlp = (act(normed @ state["layers.0.mlp.gate_proj.weight"].T) * (normed @ state["layers.0.mlp.up_proj.weight"].T))
    return x + mlp @ state["layers.0.mlp.down_proj.weight"].T


@pytest.fixture(scope="module")
def target():
    return FrozenTarget(make_tiny_target(), "tiny-llama")


def _drafter(target, fc_bias=True, seed=2):
    cfg = DrafterConfig.from_target(target.config, target.info(), seed=seed)
    cfg.fc_bias = fc_bias
    drafter = EagleDrafter.from_config(cfg)
    with torch.no_grad():  # non-trivial norm weights and biases
        for p in drafter.parameters():
            p.add_(0.05 * torch.randn_like(p))
    return drafter.eval()


def _inputs(target, t=7):
    ids = torch.randint(0, 64, (2, t), generator=torch.Generator().manual_seed(0))
    feats, _ = target(ids)
    return ids, target.embed_tokens(ids).detach(), feats, torch.arange(t)[None].expand(2, -1)


@pytest.mark.parametrize("engine,fc_bias", [("sglang", True), ("sglang", False), ("eagle", True),
                                            ("vllm", False)])
def test_export_matches_loader_schema_and_reference_forward(tmp_path, target, engine, fc_bias):
    drafter = _drafter(target, fc_bias)
    out = export_eagle(drafter, tmp_path / "eagle", engine=engine, embed_tokens=target.embed_tokens.weight,
                       write_bin=True)
    cfg = json.loads((out / "config.json").read_text())
    check_eagle_config(cfg, engine)
    assert cfg["bias"] is (fc_bias or engine == "sglang") and cfg["vocab_size"] == 64
    assert cfg["torch_dtype"] == "float32"
    state = load_file(str(out / "model.safetensors"))
    check_eagle_weights(state, cfg)
    if engine == "sglang":  # SGLang's fc always has a bias: a bias-free drafter gets an exact zero one
        assert "fc.bias" in state and (fc_bias or not state["fc.bias"].any())
    pickled = torch.load(out / "pytorch_model.bin", weights_only=True)
    assert pickled.keys() == state.keys() and all(torch.equal(pickled[k], state[k]) for k in state)
    ids, embeds, feats, pos = _inputs(target)
    with torch.no_grad():
        ours = drafter(embeds, feats, pos)
        ref = eagle_reference_forward(state, cfg, state["embed_tokens.weight"][ids], feats)
    torch.testing.assert_close(ref, ours, rtol=1e-5, atol=1e-5)


def test_vllm_export_refuses_fc_bias_and_non_llama_layers(tmp_path, target):
    with pytest.raises(CheckpointError, match="vLLM.*without a bias"):
        export_eagle(_drafter(target, True), tmp_path / "v", engine="vllm")
    qwen3 = FrozenTarget(make_tiny_target(model_type="qwen3"), "tiny-qwen3")
    drafter = EagleDrafter.from_config(DrafterConfig.from_target(qwen3.config, qwen3.info()))
    with pytest.raises(CheckpointError, match="Llama decoder layer.*'qwen3'"):
        export_eagle(drafter, tmp_path / "q")
    assert not (tmp_path / "v").exists() and not (tmp_path / "q").exists()


@pytest.mark.parametrize("via", ["safetensors", "pickle"])
def test_round_trip_export_import_is_exact(tmp_path, target, via):
    drafter = _drafter(target)
    save_drafter(drafter, tmp_path / "taps")
    original = load_drafter(tmp_path / "taps", target=target.info())
    out = export_eagle(original, tmp_path / "eagle", write_bin=via == "pickle")
    with pytest.raises(CheckpointError, match="EAGLE-layout drafter.*--import-eagle"):
        load_drafter(out)
    if via == "pickle":
        (out / "model.safetensors").unlink()
    back = load_drafter(import_eagle(out, tmp_path / "back", target=target), target=target.info())
    _, embeds, feats, pos = _inputs(target, t=11)
    with torch.no_grad():
        a = target.lm_head(original(embeds, feats, pos))
        b = target.lm_head(back(embeds, feats, pos))
    assert torch.equal(a, b)
    assert back.config.init["imported_from"] == "eagle" and len(back.config.init["parent"]["sha256"]) == 64


def test_import_released_layout_with_embeddings_and_stale_buffers(tmp_path, target, caplog):
    """A HASS/EAGLE-1 style release: pickle only, embed_tokens inside, rotary buffer, no taps block."""
    drafter = _drafter(target)
    src = tmp_path / "release"
    src.mkdir()
    state = {k: v.to(torch.float16) for k, v in drafter.state_dict().items()}
    state["embed_tokens.weight"] = torch.zeros(64, 32, dtype=torch.float16)  # differs from the target's
    state["layers.0.self_attn.rotary_emb.inv_freq"] = torch.ones(4)
    torch.save(state, src / "pytorch_model.bin")
    cfg = {"architectures": ["LlamaForCausalLM"], "hidden_size": 32, "intermediate_size": 64,
           "num_attention_heads": 4, "num_key_value_heads": 2, "rms_norm_eps": 1e-6, "vocab_size": 64,
           "hidden_act": "silu", "max_position_embeddings": 512, "bias": True, "rope_theta": 10000.0}
    (src / "config.json").write_text(json.dumps(cfg))
    with caplog.at_level(logging.WARNING):
        back = load_drafter(import_eagle(src, tmp_path / "ours", target=target))
    assert "differs from the target's embedding" in caplog.text
    assert back.fc.weight.dtype == torch.float16 and torch.equal(back.fc.weight, state["fc.weight"])
    wider = FrozenTarget(make_tiny_target(hidden_size=48), "wide")
    with pytest.raises(CheckpointError, match="target mismatch.*hidden_size=32.*hidden_size=48"):
        import_eagle(src, tmp_path / "bad", target=wider)
    state["layers.0.mlp.extra.weight"] = torch.ones(3)
    torch.save(state, src / "pytorch_model.bin")
    with pytest.raises(CheckpointError, match=r"unexpected tensor\(s\) \['layers.0.mlp.extra.weight'\]"):
        import_eagle(src, tmp_path / "bad2", target=target)


def test_bf16_export_with_the_targets_embedding_imports_without_warning(tmp_path, target, caplog):
    drafter = _drafter(target).to(torch.bfloat16)
    out = export_eagle(drafter, tmp_path / "e", embed_tokens=target.embed_tokens.weight)
    assert load_file(str(out / "model.safetensors"))["embed_tokens.weight"].dtype == torch.bfloat16
    with caplog.at_level(logging.WARNING):
        back = load_drafter(import_eagle(out, tmp_path / "i", target=target))
    assert "differs" not in caplog.text and back.fc.weight.dtype == torch.bfloat16
    assert all(torch.equal(back.state_dict()[k], v) for k, v in drafter.state_dict().items())
