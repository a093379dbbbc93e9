"""The EAGLE-1/HASS checkpoint layout: export for serving engines, and the one import path for pickles.

What the loaders expect (read from their source; see docs/checkpoints.md):

- EAGLE ``EaModel.from_pretrained`` (SafeAILab/EAGLE ``eagle/model/ea_model.py``): reads
  ``config.json`` with ``EConfig`` (a Llama config; ``bias`` = fc bias, default True; ``rope_scaling``
  None or ``{"type": "linear"|"dynamic", "factor": >1}``; head_dim = hidden_size / num_attention_heads),
  then ``pytorch_model.bin`` (falling back to ``model.safetensors`` in EAGLE-2/3 versions) into
  ``cnets.Model``: keys ``fc.weight``, ``fc.bias``, ``layers.0.self_attn.{q,k,v,o}_proj.weight``,
  ``layers.0.mlp.{gate,up,down}_proj.weight``, ``layers.0.post_attention_layernorm.weight`` and
  ``embed_tokens.weight`` (needed by the EAGLE-1 release, which loads with ``strict=True``; later
  versions take the embedding from the base model and load with ``strict=False``).
- SGLang ``LlamaForCausalLMEagle`` (``python/sglang/srt/models/llama_eagle.py``): the class is chosen by
  ``architectures``; ``fc`` always has a bias (a bias-free drafter is exported with a zero bias); layer 0 has no ``input_layernorm``; every key gets a
  ``model.`` prefix and q/k/v, gate/up are fused on load; ``lm_head`` keys are skipped; the
  embedding and head are replaced by the target's.
- vLLM ``EagleLlamaForCausalLM`` (``vllm/model_executor/models/llama_eagle.py``): the class is
  ``"Eagle" + architectures[0]`` (so ``LlamaForCausalLM``), ``fc`` has *no* bias (an ``fc.bias``
  key fails to load), ``embed_tokens`` is skipped when the target shares it.
"""

from __future__ import annotations

import hashlib
import json
import logging
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file

from checkpoints.drafter_io import atomic_directory, check_target_compatible, drafter_state_dict, save_drafter
from checkpoints.validation import CheckpointError, read_header, validate_state_dict
from training.drafter import CONFIG_NAME, WEIGHTS_NAME, DrafterConfig, EagleDrafter

log = logging.getLogger(__name__)

EAGLE_BIN_NAME = "pytorch_model.bin"
ENGINE_ARCHITECTURES = {"sglang": "LlamaForCausalLMEagle", "eagle": "LlamaForCausalLM",
                        "vllm": "LlamaForCausalLM"}
EXPORTABLE_FAMILIES = ("llama", "mistral")
_DROPPED_ON_IMPORT = ("rotary_emb.inv_freq", "lm_head.weight")
_DTYPE_NAMES = {torch.float32: "float32", torch.float16: "float16", torch.bfloat16: "bfloat16"}


def file_sha256(path: str | Path) -> str:
    digest = hashlib.sha256()
    with Path(path).open("rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _rope(layer: dict[str, Any]) -> tuple[float, dict | None]:
    """(rope_theta, legacy rope_scaling) from a transformers 4.x or 5.x layer config."""
    params = dict(layer.get("rope_parameters") or {})
    theta = float(params.pop("rope_theta", layer.get("rope_theta", 10000.0)))
    kind = params.pop("rope_type", None) or params.pop("type", None) or "default"
    if kind == "default":
        return theta, None
    return theta, {"type": kind, **params}


def eagle_config(config: DrafterConfig, *, engine: str = "sglang",
                 dtype: torch.dtype = torch.float16) -> dict[str, Any]:
    """The ``config.json`` of the EAGLE layout (a one-layer Llama config plus the ``bias`` flag)."""
    if engine not in ENGINE_ARCHITECTURES:
        raise ValueError(f"unknown engine {engine!r}; choose one of {sorted(ENGINE_ARCHITECTURES)}")
    layer = config.layer
    family = layer.get("model_type")
    if family not in EXPORTABLE_FAMILIES:
        raise CheckpointError(f"the EAGLE layout is a Llama decoder layer; this drafter's layer is "
                              f"{family!r} (exportable: {EXPORTABLE_FAMILIES}). Serve it with taps instead.")
    hidden, heads = int(layer["hidden_size"]), int(layer["num_attention_heads"])
    head_dim = int(layer.get("head_dim") or hidden // heads)
    if head_dim * heads != hidden:
        raise CheckpointError(f"EAGLE loaders derive head_dim = hidden_size / num_attention_heads = "
                              f"{hidden / heads}, but this drafter uses head_dim={head_dim}")
    if layer.get("attention_bias") or layer.get("mlp_bias"):
        raise CheckpointError("EAGLE loaders build bias-free attention/MLP projections; this drafter has "
                              "attention_bias or mlp_bias set")
    if family == "mistral" and layer.get("sliding_window") not in (None, 0):
        log.warning("the drafter's layer uses a sliding window of %s; EAGLE loaders use full attention",
                    layer.get("sliding_window"))
    theta, scaling = _rope(layer)
    if scaling is not None and scaling.get("type") not in ("linear", "dynamic"):
        log.warning("rope scaling %r: EAGLE's EConfig accepts only linear/dynamic scaling (SGLang/vLLM "
                    "read it through transformers)", scaling.get("type"))
    if engine == "vllm" and config.fc_bias:
        raise CheckpointError("vLLM's EagleLlamaForCausalLM builds fc without a bias, so this drafter "
                              "(fc_bias=True) cannot load there; train with fc_bias=False for vLLM, or "
                              "export for sglang/eagle")
    return {
        "architectures": [ENGINE_ARCHITECTURES[engine]],
        "model_type": "llama",
        "hidden_size": hidden,
        "intermediate_size": int(layer["intermediate_size"]),
        "num_hidden_layers": 1,
        "num_attention_heads": heads,
        "num_key_value_heads": int(layer.get("num_key_value_heads") or heads),
        "head_dim": head_dim,
        "hidden_act": layer.get("hidden_act", "silu"),
        "max_position_embeddings": int(layer.get("max_position_embeddings", 2048)),
        "rms_norm_eps": float(layer.get("rms_norm_eps", 1e-6)),
        "initializer_range": float(layer.get("initializer_range", 0.02)),
        "rope_theta": theta,
        "rope_scaling": scaling,
        "vocab_size": config.vocab_size,
        "pad_token_id": layer.get("pad_token_id"),
        "bos_token_id": layer.get("bos_token_id"),
        "eos_token_id": layer.get("eos_token_id"),
        "tie_word_embeddings": False,
        "pretraining_tp": 1,
        "use_cache": True,
        "attention_bias": False,
        "mlp_bias": False,
        "bias": bool(config.fc_bias),
        "torch_dtype": _DTYPE_NAMES.get(dtype, str(dtype).replace("torch.", "")),
        "taps": {"format": "eagle", "engine": engine, "drafter_config": config.to_dict()},
    }


def export_eagle(drafter: EagleDrafter | str | Path, out_dir: str | Path, *, engine: str = "sglang",
                 dtype: torch.dtype | None = None, embed_tokens: torch.Tensor | None = None,
                 write_bin: bool = False) -> Path:
    """Write the EAGLE layout (``config.json`` + ``model.safetensors`` [+ ``pytorch_model.bin``]).

    ``embed_tokens`` (the target's input embedding, ``(vocab, hidden)``) is stored as
    ``embed_tokens.weight`` for loaders that need it (the EAGLE-1 release); without it the engines
    take the target's embedding.
    """
    if not isinstance(drafter, EagleDrafter):
        from checkpoints.drafter_io import load_drafter

        drafter = load_drafter(drafter)
    state = drafter_state_dict(drafter)
    dtype = dtype or next(iter(state.values())).dtype
    config = eagle_config(drafter.config, engine=engine, dtype=dtype)
    state = {k: v.to(dtype).contiguous() for k, v in state.items()}
    if engine == "sglang" and "fc.bias" not in state:
        # SGLang's fc always has a bias and does not check that every weight was loaded: write the
        # exact zero bias rather than leave its freshly initialised one in place
        state["fc.bias"] = torch.zeros(drafter.config.hidden_size, dtype=dtype)
        config["bias"] = True
    if embed_tokens is not None:
        want = (drafter.config.vocab_size, drafter.config.hidden_size)
        if tuple(embed_tokens.shape) != want:
            raise CheckpointError(f"embed_tokens has shape {tuple(embed_tokens.shape)}, expected {want}")
        state["embed_tokens.weight"] = embed_tokens.detach().to("cpu", dtype).contiguous()
    out_dir = Path(out_dir)
    with atomic_directory(out_dir) as tmp:
        (tmp / CONFIG_NAME).write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
        save_file(state, str(tmp / WEIGHTS_NAME), metadata={"format": "pt"})
        if write_bin:
            torch.save(state, tmp / EAGLE_BIN_NAME)
    return out_dir


def _load_eagle_state(src: Path) -> tuple[dict[str, torch.Tensor], Path]:
    safe = src / WEIGHTS_NAME
    if safe.is_file():
        from safetensors.torch import load_file

        read_header(safe)  # names the tensor when the file is truncated
        return load_file(str(safe)), safe
    pickle = src / EAGLE_BIN_NAME
    if not pickle.is_file():
        raise FileNotFoundError(f"{src} has neither {WEIGHTS_NAME} nor {EAGLE_BIN_NAME}")
    try:
        state = torch.load(pickle, map_location="cpu", weights_only=True)
    except Exception as err:
        raise CheckpointError(f"{pickle}: not a plain tensor state dict loadable with "
                              f"torch.load(weights_only=True): {err}") from err
    if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise CheckpointError(f"{pickle}: expected a dict of tensors")
    return state, pickle


def map_eagle_keys(state: dict[str, torch.Tensor]) -> tuple[dict[str, torch.Tensor], torch.Tensor | None]:
    """EAGLE/HASS keys -> taps keys; returns (drafter state, embed_tokens or None)."""
    if state and all(k.startswith("model.") for k in state if not k.startswith("lm_head")):
        state = {k.removeprefix("model."): v for k, v in state.items()}
    embed = state.get("embed_tokens.weight")
    mapped = {k: v for k, v in state.items()
              if k != "embed_tokens.weight" and not k.endswith(_DROPPED_ON_IMPORT)}
    return mapped, embed


def import_eagle(src_dir: str | Path, out_dir: str | Path, *, target) -> Path:
    """Convert a released EAGLE-1/2 or HASS drafter (or our EAGLE export) into a taps drafter directory.

    ``target`` is a ``training.target.FrozenTarget`` (or a ``--target`` name/path, loaded on CPU):
    its config fills the layer configuration and its info is recorded. Pickles are read only with
    ``torch.load(weights_only=True)``; no remote code is ever run.
    """
    from training.target import FrozenTarget, load_target

    if not isinstance(target, FrozenTarget):
        model, _ = load_target(target, dtype="float32", device="cpu")
        target = FrozenTarget(model, str(target))
    src = Path(src_dir)
    cfg_path = src / CONFIG_NAME
    try:
        ecfg = json.loads(cfg_path.read_text())
    except FileNotFoundError:
        raise FileNotFoundError(f"{cfg_path} is missing: not an EAGLE drafter directory") from None
    info = target.info()
    for key in ("hidden_size", "vocab_size"):
        if key in ecfg and int(ecfg[key]) != int(getattr(info, key)):
            raise CheckpointError(f"target mismatch: {cfg_path} has {key}={ecfg[key]} but the target "
                                  f"{info.name_or_path!r} has {key}={getattr(info, key)}")
    if ecfg.get("qkv_bias"):
        raise CheckpointError(f"{cfg_path}: qkv_bias drafters (EAGLE for Qwen2) are not supported")
    state, weights_path = _load_eagle_state(src)
    state, embed = map_eagle_keys(state)
    if embed is not None:
        if tuple(embed.shape) != (info.vocab_size, info.hidden_size):
            raise CheckpointError(f"target mismatch: {weights_path} embed_tokens.weight has shape "
                                  f"{tuple(embed.shape)}, the target's embedding is "
                                  f"{(info.vocab_size, info.hidden_size)}")
        if not torch.equal(embed, target.embed_tokens.weight.detach().cpu().to(embed.dtype)):
            log.warning("%s carries an embed_tokens.weight that differs from the target's embedding; "
                        "taps always uses the target's", weights_path)
    config = DrafterConfig.from_target(target.config, info, seed=0)
    layer = dict(config.layer)
    layer["model_type"] = "llama"  # EAGLE's drafter layer is a Llama layer whatever the target
    for key in ("intermediate_size", "num_attention_heads", "num_key_value_heads", "hidden_act",
                "rms_norm_eps", "max_position_embeddings"):
        if ecfg.get(key) is not None:
            layer[key] = ecfg[key]
    layer["head_dim"] = int(layer["hidden_size"]) // int(layer["num_attention_heads"])
    scaling = ecfg.get("rope_scaling")
    theta = float(ecfg.get("rope_theta", 10000.0))  # EAGLE's rotary default when the field is absent
    layer.pop("rope_theta", None)
    layer.pop("rope_scaling", None)
    layer["rope_parameters"] = ({"rope_type": "default", "rope_theta": theta} if not scaling else
                                {**{k: v for k, v in scaling.items() if k != "type"},
                                 "rope_type": scaling.get("rope_type") or scaling.get("type"),
                                 "rope_theta": theta})
    config.layer = layer
    config.fc_bias = "fc.bias" in state
    if "bias" in ecfg and bool(ecfg["bias"]) != config.fc_bias:
        log.warning("%s says bias=%s but the weights %s fc.bias; following the weights", cfg_path,
                    ecfg["bias"], "contain" if config.fc_bias else "lack")
    config.init = {"parent": {"path": str(weights_path), "sha256": file_sha256(weights_path)},
                   "imported_from": "eagle"}
    validate_state_dict(state, config, str(weights_path))
    check_target_compatible(config, info, str(src))
    drafter = EagleDrafter(config)
    drafter.load_state_dict(state, strict=True)
    drafter.to(next(iter(state.values())).dtype)
    return save_drafter(drafter, out_dir)


def verify_export(out_dir: str | Path, source: EagleDrafter) -> None:
    """Re-read an export and check the weights equal the source drafter's (used by the CLI)."""
    out_dir = Path(out_dir)
    ecfg = json.loads((out_dir / CONFIG_NAME).read_text())
    config = DrafterConfig.from_dict(ecfg["taps"]["drafter_config"])
    from safetensors.torch import load_file

    state = load_file(str(out_dir / WEIGHTS_NAME))
    state.pop("embed_tokens.weight", None)
    validate_state_dict(state, config, str(out_dir / WEIGHTS_NAME))
    for name, value in drafter_state_dict(source).items():
        if not torch.equal(state[name], value.to(state[name].dtype)):
            raise CheckpointError(f"{out_dir}: exported tensor {name!r} differs from the source")


__all__ = ["ENGINE_ARCHITECTURES", "eagle_config", "export_eagle", "import_eagle", "map_eagle_keys",
           "verify_export", "file_sha256"]
