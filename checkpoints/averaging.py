"""Weight averaging of drafters (TAPS "average" strategy) and of LoRA adapters.

``average_drafters`` computes theta = sum_i w_i theta_i / sum_i w_i element-wise (in float64,
cast back to the parents' dtype). Parents must share the target and the architecture; a
different recorded initialisation is allowed but warned about (averaging is only meaningful
for parents fine-tuned from a common starting point).

For LoRA adapters the merged adapter must have delta W = sum_i w_i delta W_i. peft's
``add_weighted_adapter(combination_type="cat")`` concatenates the factors (A scaled by w_i and
the parent's scaling), so B_cat A_cat = sum_i w_i s_i B_i A_i exactly; ``"linear"`` averages A and
B separately, giving (sum w_i B_i)(sum w_i A_i), which is not the mean of the deltas.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from torch import nn

from checkpoints.drafter_io import drafter_state_dict, load_drafter, save_drafter
from checkpoints.validation import validate_state_dict
from training.drafter import WEIGHTS_NAME, DrafterConfig, EagleDrafter

log = logging.getLogger(__name__)


class MergeError(ValueError):
    """Parents that cannot be averaged (different targets, architectures or shapes)."""


def normalise_weights(weights: Sequence[float] | None, n: int) -> list[float]:
    """Finite, non-negative weights with a positive sum, rescaled to sum to one (None = uniform)."""
    if weights is None:
        return [1.0 / n] * n
    weights = [float(w) for w in weights]
    if len(weights) != n:
        raise MergeError(f"got {len(weights)} weights for {n} drafters")
    if any(not math.isfinite(w) or w < 0 for w in weights) or sum(weights) <= 0:
        raise MergeError(f"weights must be finite, non-negative and not all zero; got {weights}")
    total = math.fsum(weights)
    return [w / total for w in weights]


def _state_sha256(state: dict[str, torch.Tensor]) -> str:
    digest = hashlib.sha256()
    for name in sorted(state):
        digest.update(name.encode())
        digest.update(state[name].detach().to("cpu").contiguous().view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()


def _target_key(config: DrafterConfig) -> tuple:
    t = config.target
    return (int(t["hidden_size"]), int(t["vocab_size"]), t.get("fingerprint") or t.get("name_or_path"))


def _layer_key(config: DrafterConfig) -> dict[str, Any]:
    ignore = {"use_cache", "pad_token_id", "bos_token_id", "eos_token_id", "id2label", "label2id"}
    return json.loads(json.dumps({k: v for k, v in config.layer.items() if k not in ignore}))  # as saved


def check_mergeable(configs: Sequence[DrafterConfig], names: Sequence[str]) -> None:
    """Refuse mixed targets or architectures; warn on different recorded initialisations."""
    first = configs[0]
    for cfg, name in zip(configs[1:], names[1:]):
        if cfg.architecture != first.architecture or cfg.fc_bias != first.fc_bias:
            raise MergeError(f"cannot average drafters of different architectures: {names[0]} is "
                             f"{first.architecture!r} (fc_bias={first.fc_bias}), {name} is "
                             f"{cfg.architecture!r} (fc_bias={cfg.fc_bias})")
        if _target_key(cfg) != _target_key(first):
            raise MergeError(f"cannot average drafters trained for different targets: {names[0]} -> "
                             f"{first.target.get('name_or_path')!r} (fingerprint "
                             f"{first.target.get('fingerprint')}), {name} -> {cfg.target.get('name_or_path')!r} "
                             f"(fingerprint {cfg.target.get('fingerprint')})")
        a, b = _layer_key(first), _layer_key(cfg)
        if a != b:
            diff = sorted(k for k in set(a) | set(b) if a.get(k) != b.get(k))
            raise MergeError(f"cannot average drafters with different layer configurations "
                             f"({names[0]} vs {name} differ in {diff})")
    inits = [cfg.init or {} for cfg in configs]
    if any(not i for i in inits) or any(i != inits[0] for i in inits[1:]):
        log.warning("the parents do not share a recorded initialisation (%s); a weight average of "
                    "independently initialised drafters is usually poor", inits)


def _as_drafter(item: EagleDrafter | str | Path) -> tuple[EagleDrafter, str, str]:
    """(drafter, display name, sha256 of its weights)."""
    if isinstance(item, EagleDrafter):
        return item, "<in-memory drafter>", _state_sha256(drafter_state_dict(item))
    from checkpoints.eagle_format import file_sha256
    from checkpoints.resolve import resolve_drafter

    path = resolve_drafter(item)
    return load_drafter(path), str(item), file_sha256(path / WEIGHTS_NAME)


def average_drafters(paths_or_drafters: Sequence[EagleDrafter | str | Path],
                     weights: Sequence[float] | None = None, out: str | Path | None = None) -> EagleDrafter:
    """The weighted element-wise mean of drafters; saved atomically to ``out`` when given."""
    if len(paths_or_drafters) < 2:
        raise MergeError("averaging needs at least two drafters")
    loaded = [_as_drafter(p) for p in paths_or_drafters]
    drafters = [d for d, _, _ in loaded]
    names = [n for _, n, _ in loaded]
    w = normalise_weights(weights, len(drafters))
    configs = [d.config for d in drafters]
    check_mergeable(configs, names)
    states = [drafter_state_dict(d) for d in drafters]
    dtypes = {str(v.dtype) for s in states for v in s.values()}
    if len(dtypes) > 1:
        raise MergeError(f"parents are stored in different dtypes {sorted(dtypes)}; convert them first")
    merged: dict[str, torch.Tensor] = {}
    for name, ref in states[0].items():
        acc = torch.zeros(ref.shape, dtype=torch.float64)
        for wi, state in zip(w, states):
            acc += wi * state[name].to(torch.float64)
        merged[name] = acc.to(ref.dtype)
    config = DrafterConfig.from_dict(configs[0].to_dict())
    config.lineage = {"method": "weighted_average", "weights": w,
                      "parents": [{"name": n, "sha256": h, "init": c.init, "training": c.training}
                                  for (_, n, h), c in zip(loaded, configs)]}
    config.training = {"merged_from": names}
    if any(c.init != configs[0].init for c in configs[1:]):
        config.init = {"parents": [c.init for c in configs]}
    validate_state_dict(merged, config, "weighted average")
    child = EagleDrafter(config)
    child.load_state_dict(merged, strict=True)
    child.to(next(iter(merged.values())).dtype).eval()
    if out is not None:
        save_drafter(child, out)
    return child


# ----------------------------------------------------------------------------- LoRA adapters


def lora_delta(module: nn.Module, adapter: str) -> torch.Tensor:
    """Delta W of one peft LoRA layer for one adapter (scaling included)."""
    return module.get_delta_weight(adapter).detach()


def lora_layers(model: nn.Module) -> dict[str, nn.Module]:
    from peft.tuners.lora import LoraLayer

    return {name: m for name, m in model.named_modules() if isinstance(m, LoraLayer)}


def average_lora_adapters(model, adapters: Sequence[str], weights: Sequence[float] | None = None,
                          new_name: str = "average", *, combination_type: str = "cat",
                          check: bool = True) -> str:
    """Add ``new_name`` to a peft model: its delta is the weighted mean of the adapters' deltas.

    Uses ``add_weighted_adapter(combination_type="cat")``; with ``check`` every LoRA layer's
    merged delta is compared with sum_i w_i delta_i (float tolerance), raising if it differs.
    """
    if len(adapters) < 2:
        raise MergeError("averaging needs at least two adapters")
    missing = [a for a in adapters if a not in model.peft_config]
    if missing:
        raise MergeError(f"unknown adapter(s) {missing}; the model has {sorted(model.peft_config)}")
    w = normalise_weights(weights, len(adapters))
    model.add_weighted_adapter(list(adapters), w, new_name, combination_type=combination_type)
    if check:
        for name, layer in lora_layers(model).items():
            if new_name not in layer.lora_A:
                continue
            want = sum(wi * lora_delta(layer, a) for wi, a in zip(w, adapters) if a in layer.lora_A)
            got = lora_delta(layer, new_name)
            if not torch.allclose(got, want, rtol=1e-5, atol=1e-6 * float(want.abs().max()) + 1e-12):
                raise MergeError(f"merged LoRA delta of {name} differs from the weighted mean of the "
                                 f"parents' deltas (combination_type={combination_type!r})")
    return new_name


def merge_lora_into_base(model, adapter: str | None = None) -> nn.Module:
    """Fold an adapter into its base weights (W <- W + delta W) and return the plain base module."""
    if adapter is not None:
        model.set_adapter(adapter)
    return model.merge_and_unload(adapter_names=[adapter] if adapter else None)


def drafter_from_merged_lora(base: EagleDrafter, merged: nn.Module) -> EagleDrafter:
    """A plain drafter carrying the merged weights (config copied from the base)."""
    state = {k: v.detach().clone() for k, v in merged.state_dict().items()}
    validate_state_dict(state, base.config, "merged LoRA drafter")
    child = EagleDrafter(DrafterConfig.from_dict(base.config.to_dict()))
    child.load_state_dict(state, strict=True)
    return child



def is_lora_dir(path: str | Path) -> bool:
    return (Path(path) / "adapter_config.json").is_file()


def recorded_lora_base(adapter_dirs: Sequence[str | Path]) -> str | None:
    """The base drafter the adapters record (peft ``base_model_name_or_path``); refuses a mix."""
    bases = {json.loads((Path(d) / "adapter_config.json").read_text()).get("base_model_name_or_path")
             for d in adapter_dirs}
    if len(bases) > 1:
        raise MergeError(f"the adapters were trained on different bases {sorted(map(str, bases))}; "
                         "only adapters of one base drafter can be averaged")
    base = bases.pop()
    return base if base and Path(base).is_dir() else None


def average_lora_dirs(base: str | Path | None, adapter_dirs: Sequence[str | Path],
                      weights: Sequence[float] | None, out: str | Path, *,
                      merge_into_base: bool = False) -> Path:
    """Average peft adapter directories trained on the drafter ``base`` (cat combination).

    ``base=None`` takes the base the adapters record, when it is an existing directory. Writes the merged adapter (``adapter_config.json`` + ``adapter_model.safetensors``), or with
    ``merge_into_base`` a plain taps drafter directory whose weights are base + merged delta. A
    single adapter with ``merge_into_base`` is simply folded into its base.
    """
    import shutil

    from peft import PeftModel

    from checkpoints.drafter_io import atomic_directory
    from checkpoints.resolve import resolve_drafter

    recorded = recorded_lora_base(adapter_dirs)
    base = base or recorded
    if base is None:
        raise MergeError("the adapters do not record an existing base drafter directory: pass --base")
    base_drafter = load_drafter(resolve_drafter(base))
    names = [f"parent{i}" for i in range(len(adapter_dirs))]
    model = PeftModel.from_pretrained(load_drafter(resolve_drafter(base)), str(adapter_dirs[0]),
                                      adapter_name=names[0])
    for name, directory in zip(names[1:], adapter_dirs[1:]):
        model.load_adapter(str(directory), adapter_name=name)
    w = normalise_weights(weights, len(names))
    if len(names) > 1:
        merged_name = average_lora_adapters(model, names, w, "average")
    elif merge_into_base:
        merged_name = names[0]
    else:
        raise MergeError("averaging needs at least two adapters (or --merge-into-base for one)")
    lineage = {"method": "lora_cat_average" if len(names) > 1 else "lora_merge", "weights": w,
               "base": str(base), "parents": [str(d) for d in adapter_dirs]}
    if merge_into_base:
        child = drafter_from_merged_lora(base_drafter, merge_lora_into_base(model, merged_name))
        child.config.lineage = lineage
        return save_drafter(child, out)
    with atomic_directory(Path(out)) as tmp:
        model.save_pretrained(str(tmp / "_peft"), selected_adapters=[merged_name], save_embedding_layers=False)
        for item in (tmp / "_peft" / merged_name).iterdir():
            shutil.move(str(item), tmp / item.name)
        shutil.rmtree(tmp / "_peft")
        (tmp / "lineage.json").write_text(json.dumps(lineage, indent=2) + "\n")
    return Path(out)
