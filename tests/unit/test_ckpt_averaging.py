"""Weight averaging: exactly the weighted mean, refusals, lineage; LoRA cat vs linear; merge into base."""

from __future__ import annotations

import copy
import json
import logging
import runpy

import pytest
import torch
from peft import LoraConfig, get_peft_model

from checkpoints.averaging import (
    MergeError,
    average_drafters,
    average_lora_adapters,
    average_lora_dirs,
    drafter_from_merged_lora,
    lora_delta,
    lora_layers,
    merge_lora_into_base,
)
from checkpoints.drafter_io import load_drafter, save_drafter
from tests.conftest import REPO_ROOT, make_tiny_target
from training.drafter import DrafterConfig, EagleDrafter
from training.target import FrozenTarget


@pytest.fixture(scope="module")
def target():
    return FrozenTarget(make_tiny_target(), "tiny-llama")


def _fine_tuned(target, seed: int, init_seed: int = 0, fc_bias: bool = True) -> EagleDrafter:
    """A drafter from a shared initialisation (init_seed), moved by seed-specific 'training'."""
    cfg = DrafterConfig.from_target(target.config, target.info(), seed=init_seed)
    cfg.fc_bias = fc_bias
    drafter = EagleDrafter.from_config(cfg)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in drafter.parameters():
            p.add_(0.1 * torch.randn(p.shape, generator=gen))
    return drafter


def test_average_is_exactly_the_elementwise_weighted_mean(tmp_path, target):
    a, b, c = (_fine_tuned(target, s) for s in (1, 2, 3))
    save_drafter(a, tmp_path / "a")
    save_drafter(b, tmp_path / "b")
    weights = [0.2, 0.5, 0.3]
    merged = average_drafters([tmp_path / "a", tmp_path / "b", c], weights, out=tmp_path / "avg")
    parents = [a.state_dict(), b.state_dict(), c.state_dict()]
    for name, value in merged.state_dict().items():
        expected = sum(w * p[name].double() for w, p in zip(weights, parents)).float()
        assert torch.equal(value, expected), name
    again = load_drafter(tmp_path / "avg", target=target.info())
    assert all(torch.equal(again.state_dict()[k], v) for k, v in merged.state_dict().items())
    lineage = json.loads((tmp_path / "avg" / "config.json").read_text())["lineage"]
    assert lineage["method"] == "weighted_average" and lineage["weights"] == pytest.approx(weights)
    assert [p["name"] for p in lineage["parents"]][:2] == [str(tmp_path / "a"), str(tmp_path / "b")]
    assert all(len(p["sha256"]) == 64 for p in lineage["parents"])


def test_weights_are_normalised_and_checked(target):
    a, b = _fine_tuned(target, 1), _fine_tuned(target, 2)
    half = average_drafters([a, b], [1.0, 1.0])
    assert torch.equal(half.fc.weight, ((a.fc.weight.double() + b.fc.weight.double()) * 0.5).float())
    with pytest.raises(MergeError, match="got 3 weights for 2 drafters"):
        average_drafters([a, b], [0.3, 0.3, 0.4])
    with pytest.raises(MergeError, match="non-negative"):
        average_drafters([a, b], [1.5, -0.5])
    with pytest.raises(MergeError, match="at least two"):
        average_drafters([a], [1.0])


def test_mixed_targets_and_architectures_are_refused(target):
    other = FrozenTarget(make_tiny_target(seed=9), "tiny-other")  # same shapes, other weights
    with pytest.raises(MergeError, match="different targets.*tiny-llama.*tiny-other"):
        average_drafters([_fine_tuned(target, 1), _fine_tuned(other, 2)])
    with pytest.raises(MergeError, match="different architectures.*fc_bias"):
        average_drafters([_fine_tuned(target, 1), _fine_tuned(target, 2, fc_bias=False)])


def test_warns_without_a_shared_initialisation(target, caplog):
    with caplog.at_level(logging.WARNING):
        merged = average_drafters([_fine_tuned(target, 1, init_seed=0), _fine_tuned(target, 2, init_seed=7)])
    assert "do not share a recorded initialisation" in caplog.text
    assert merged.config.init == {"parents": [{"seed": 0}, {"seed": 7}]}
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        average_drafters([_fine_tuned(target, 1), _fine_tuned(target, 2)])
    assert "initialisation" not in caplog.text


def _lora_pair(base: EagleDrafter):
    modules = ["q_proj", "v_proj", "fc"]
    model = get_peft_model(copy.deepcopy(base), LoraConfig(r=2, lora_alpha=4, target_modules=modules,
                                                          init_lora_weights=False), adapter_name="math")
    model.add_adapter("chat", LoraConfig(r=2, lora_alpha=8, target_modules=modules, init_lora_weights=False))
    return model


def test_lora_cat_gives_the_weighted_mean_of_deltas_and_linear_does_not(target):
    model = _lora_pair(_fine_tuned(target, 1))
    w = [0.25, 0.75]
    average_lora_adapters(model, ["math", "chat"], w, "cat")
    model.add_weighted_adapter(["math", "chat"], w, "linear", combination_type="linear")
    linear_off = 0.0
    for layer in lora_layers(model).values():
        want = w[0] * lora_delta(layer, "math") + w[1] * lora_delta(layer, "chat")
        torch.testing.assert_close(lora_delta(layer, "cat"), want, rtol=1e-5, atol=1e-7)
        linear_off = max(linear_off, float((lora_delta(layer, "linear") - want).abs().max()))
    assert linear_off > 1e-3  # (sum w B)(sum w A) is not sum w (B A)
    with pytest.raises(MergeError, match="differs from the weighted mean"):
        average_lora_adapters(model, ["math", "chat"], w, "linear2", combination_type="linear")


def test_merging_an_adapter_into_its_base(target):
    base = _fine_tuned(target, 1)
    model = _lora_pair(base)
    average_lora_adapters(model, ["math", "chat"], [0.5, 0.5], "avg")
    model.set_adapter("avg")
    deltas = {name: lora_delta(layer, "avg") for name, layer in lora_layers(model).items()}
    embeds, feats = torch.randn(1, 5, 32), torch.randn(1, 5, 32)
    pos = torch.arange(5)[None]
    with torch.no_grad():
        with_adapter = model(embeds, feats, pos)
    merged = drafter_from_merged_lora(base, merge_lora_into_base(model, "avg"))
    torch.testing.assert_close(merged.fc.weight, base.fc.weight + deltas["base_model.model.fc"])
    with torch.no_grad():
        torch.testing.assert_close(merged(embeds, feats, pos), with_adapter, rtol=1e-5, atol=1e-5)


def test_merge_drafters_cli_full_and_lora(tmp_path, target):
    main = runpy.run_path(str(REPO_ROOT / "launch" / "merge_drafters.py"))["main"]
    base = _fine_tuned(target, 1)
    save_drafter(base, tmp_path / "base")
    save_drafter(_fine_tuned(target, 2), tmp_path / "b")
    main([str(tmp_path / "base"), str(tmp_path / "b"), "--weights", "0.5,0.5", "--out", str(tmp_path / "m")])
    assert load_drafter(tmp_path / "m").config.lineage["weights"] == [0.5, 0.5]
    model = _lora_pair(base)
    model.save_pretrained(str(tmp_path / "adapters"))  # one subdirectory per adapter
    main([str(tmp_path / "adapters" / "math"), str(tmp_path / "adapters" / "chat"), "--base", str(tmp_path / "base"),
          "--out", str(tmp_path / "lora"), "--merge-into-base"])
    folded = load_drafter(tmp_path / "lora")
    assert folded.config.lineage["method"] == "lora_cat_average"
    for name in ("math", "chat"):  # record the base as training does (peft base_model_name_or_path)
        cfg_path = tmp_path / "adapters" / name / "adapter_config.json"
        cfg_path.write_text(json.dumps({**json.loads(cfg_path.read_text()),
                                        "base_model_name_or_path": str(tmp_path / "base")}))
    direct = average_lora_dirs(None, [tmp_path / "adapters" / "math", tmp_path / "adapters" / "chat"],
                               None, tmp_path / "adapter-avg")  # base taken from the adapters' record
    assert (direct / "adapter_config.json").is_file() and (direct / "adapter_model.safetensors").is_file()
    cfg_path.write_text(json.dumps({**json.loads(cfg_path.read_text()), "base_model_name_or_path": "elsewhere"}))
    with pytest.raises(MergeError, match="different bases"):
        average_lora_dirs(None, [tmp_path / "adapters" / "math", tmp_path / "adapters" / "chat"], None,
                          tmp_path / "x")
