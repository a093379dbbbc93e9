"""The EAGLE-1/2 drafter: ``fc`` over concat(token embedding, target feature), one decoder layer.

DESIGN.md section 3. The decoder layer is the target's own family (Llama, Qwen2, Qwen3, Mistral,
...), so rotary embeddings and grouped-query attention are exactly the target's. The embedding
and ``lm_head`` are the target's, frozen, and are not part of this module (nor of its
checkpoint): callers embed tokens and project features with the target's own modules.
"""

from __future__ import annotations

import inspect
import json
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from training.target import TargetInfo

DRAFTER_ARCHITECTURE = "eagle"  # EAGLE-1/2 (also what HASS and TAPS train)
CONFIG_NAME = "config.json"
WEIGHTS_NAME = "model.safetensors"
_DROPPED_LAYER_KEYS = ("quantization_config", "architectures", "_name_or_path", "name_or_path",
                       "auto_map", "transformers_version", "torch_dtype", "dtype")


def family_classes(model_type: str) -> tuple[type[nn.Module], type[nn.Module]]:
    """The decoder-layer and rotary-embedding classes of a transformers model family."""
    from transformers.models.auto import modeling_auto
    from transformers.models.auto.modeling_auto import MODEL_MAPPING_NAMES

    if model_type not in MODEL_MAPPING_NAMES:
        raise ValueError(f"unknown target model family {model_type!r}")
    base_cls = modeling_auto.MODEL_MAPPING._load_attr_from_module(
        model_type, MODEL_MAPPING_NAMES[model_type])
    module = sys.modules[base_cls.__module__]
    prefix = MODEL_MAPPING_NAMES[model_type][: -len("Model")]
    layer_cls = getattr(module, f"{prefix}DecoderLayer", None)
    rotary_cls = getattr(module, f"{prefix}RotaryEmbedding", None)
    if layer_cls is None or rotary_cls is None:
        raise ValueError(f"target family {model_type!r} has no {prefix}DecoderLayer/{prefix}RotaryEmbedding: "
                         "EAGLE drafters support decoder-only families with rotary embeddings")
    return layer_cls, rotary_cls


@dataclass
class DrafterConfig:
    """The drafter's typed configuration; ``config.json`` in a drafter directory is exactly this."""

    layer: dict[str, Any]  # the target family's config, reduced to one decoder layer
    target: dict[str, Any]  # TargetInfo: name_or_path, model_type, hidden_size, vocab_size, fingerprint
    architecture: str = DRAFTER_ARCHITECTURE
    fc_bias: bool = True
    init: dict[str, Any] = field(default_factory=dict)  # {"seed": int} or {"parent": {...}}
    lineage: dict[str, Any] = field(default_factory=dict)  # merges: parents and weights
    training: dict[str, Any] = field(default_factory=dict)  # objective, recipe, steps (informational)
    taps_format_version: int = 1

    @classmethod
    def from_target(cls, target_config, info: TargetInfo, *, seed: int = 0) -> DrafterConfig:
        layer = {k: v for k, v in target_config.to_dict().items() if k not in _DROPPED_LAYER_KEYS}
        layer["num_hidden_layers"] = 1
        if isinstance(layer.get("layer_types"), list):
            layer["layer_types"] = layer["layer_types"][:1]
        layer["use_cache"] = True
        return cls(layer=layer, target=info.to_dict(), init={"seed": int(seed)})

    @property
    def hidden_size(self) -> int:
        return int(self.layer["hidden_size"])

    @property
    def vocab_size(self) -> int:
        return int(self.target["vocab_size"])

    def layer_config(self):
        from transformers import AutoConfig

        cfg = AutoConfig.for_model(**self.layer)
        cfg._attn_implementation = "sdpa"
        return cfg

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def save(self, directory: str | Path) -> Path:
        path = Path(directory) / CONFIG_NAME
        path.write_text(json.dumps(self.to_dict(), indent=2, sort_keys=True) + "\n")
        return path

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> DrafterConfig:
        known = set(cls.__dataclass_fields__)
        unknown = set(data) - known
        if unknown:
            raise ValueError(f"unknown drafter config keys {sorted(unknown)}")
        return cls(**data)

    @classmethod
    def load(cls, directory: str | Path) -> DrafterConfig:
        path = Path(directory) / CONFIG_NAME
        try:
            data = json.loads(path.read_text())
        except FileNotFoundError:
            raise FileNotFoundError(f"{path} is missing: not a taps drafter directory") from None
        except json.JSONDecodeError as err:
            raise ValueError(f"{path} is not valid JSON: {err}") from err
        if data.get("architecture") != DRAFTER_ARCHITECTURE:
            raise ValueError(f"{path}: unknown drafter architecture {data.get('architecture')!r} "
                             f"(this version knows {DRAFTER_ARCHITECTURE!r})")
        return cls.from_dict(data)


class EagleDrafter(nn.Module):
    """fc(concat(embed(x_{t+1}), f_t)) -> one target-family decoder layer -> f_hat_{t+1}."""

    def __init__(self, config: DrafterConfig):
        super().__init__()
        self.config = config
        layer_cfg = config.layer_config()
        hidden = layer_cfg.hidden_size
        layer_cls, rotary_cls = family_classes(layer_cfg.model_type)
        self.fc = nn.Linear(2 * hidden, hidden, bias=config.fc_bias)
        self.layers = nn.ModuleList([layer_cls(layer_cfg, layer_idx=0)])
        self.layers[0].input_layernorm = nn.Identity()  # EAGLE: the first layer has no input norm
        self.rotary_emb = rotary_cls(layer_cfg)
        # transformers >= 5.2x names the layer's cache keyword `cache`; earlier 5.x `past_key_values`
        params = inspect.signature(layer_cls.forward).parameters
        self._cache_kw = "cache" if "cache" in params else "past_key_values"

    @classmethod
    def from_config(cls, config: DrafterConfig, *, seed: int | None = None) -> EagleDrafter:
        """A freshly initialised drafter; the seed (recorded in the config) fixes the weights."""
        seed = int(config.init.get("seed", 0) if seed is None else seed)
        config.init = {**config.init, "seed": seed}
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            return cls(config)

    def forward(self, token_embeds: torch.Tensor, features: torch.Tensor, position_ids: torch.Tensor,
                attention_mask: torch.Tensor | None = None, cache=None) -> torch.Tensor:
        """Predict next features. ``attention_mask`` is None (causal, no cache) or a 4D mask
        (bool: True = attend, or additive float) of shape (B, 1, q_len, kv_len)."""
        hidden = self.fc(torch.cat([token_embeds, features.to(token_embeds.dtype)], dim=-1))
        position_embeddings = self.rotary_emb(hidden, position_ids)
        for layer in self.layers:
            hidden = layer(hidden, attention_mask=attention_mask, position_ids=position_ids,
                           use_cache=cache is not None, position_embeddings=position_embeddings,
                           **{self._cache_kw: cache})
        return hidden
