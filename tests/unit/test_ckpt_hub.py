"""Hub publishing and model cards.

The upload test replaces ``HfApi`` at the network boundary (``checkpoints.hub.HfApi``) with a
recorder: nothing leaves the machine, and everything up to that call is the real code path.
"""

from __future__ import annotations

import json
import logging
import runpy

import pytest
import yaml

import checkpoints.hub as hub
from checkpoints.drafter_io import save_drafter
from checkpoints.hub import HubError, push_drafter
from checkpoints.model_card import build_model_card
from tests.conftest import REPO_ROOT, make_tiny_target
from training.drafter import DrafterConfig, EagleDrafter
from training.target import FrozenTarget

SECRET = "hf_TOKENtokenTOKEN0123456789secret"


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    """A drafter directory as training leaves it, with resume state that must not be published."""
    target = FrozenTarget(make_tiny_target(), "smollm2-135m-instruct")
    cfg = DrafterConfig.from_target(target.config, target.info(), seed=42)
    cfg.training = {"objective": "hass", "steps": 120, "hardware": "2x CPU (gloo)"}
    directory = save_drafter(EagleDrafter.from_config(cfg), tmp_path_factory.mktemp("run") / "final")
    (directory / "training_config.yaml").write_text(yaml.safe_dump(
        {"mix": "balanced", "scale": 0.01, "objective": "hass", "max_steps": 120, "lr": 0.001, "seed": 42}))
    (directory / "manifest.json").write_text(json.dumps({  # the layout data_recipes.prepare writes
        "recipe": "balanced", "recipe_counts": {"math": 35000, "chat": 35000}, "scale": 0.01,
        "train": {"total": 686, "by_source": {"gsm8k": 343, "sharegpt": 343}, "tokens": 9000, "trained_tokens": 5000},
        "heldout": {"total": 14, "by_source": {"gsm8k": 7, "sharegpt": 7}},
        "sources": {"gsm8k": {"domain": "math", "kind": "data_dir"}, "sharegpt": {"domain": "chat", "kind": "package"}},
        "domains": {"math": {"skipped_sources": {"mathinstruct": ["offline"]}}}}))
    (directory / "metrics.json").write_text(json.dumps({"final": {"heldout_loss": 1.2345, "top1": {"d1": 0.61}}}))
    (directory / "optimizer_state.pt").write_bytes(b"not for upload")
    (directory / "step_100").mkdir()
    results = directory.parent / "results.jsonl"
    rows = [{"benchmark": "gsm8k", "rule": "greedy", "drafter": "final", "verify_tokens": 30, "verify_passes": 10},
            {"benchmark": "gsm8k", "rule": "greedy", "drafter": "final", "verify_tokens": 12, "verify_passes": 2},
            {"benchmark": "mt_bench", "rule": "sps", "drafter": "final", "verify_tokens": 25, "verify_passes": 10},
            {"benchmark": "gsm8k", "rule": "greedy", "drafter": "other", "verify_tokens": 99, "verify_passes": 1}]
    results.write_text("".join(json.dumps(r) + "\n" for r in rows) + '{"torn line')
    return directory


EXPECTED_FILES = ["README.md", "config.json", "manifest.json", "metrics.json", "model.safetensors",
                  "training_config.yaml"]


def test_model_card_is_complete(checkpoint):
    card = build_model_card(checkpoint, repo_id="me/drafter", eval_results=checkpoint.parent / "results.jsonl")
    _, front, body = card.split("---\n", 2)
    meta = yaml.safe_load(front)
    assert meta["library_name"] == "taps" and meta["base_model"] == "HuggingFaceTB/SmolLM2-135M-Instruct"
    assert meta["datasets"] == ["Aeala/ShareGPT_Vicuna_unfiltered", "openai/gsm8k"]
    assert {"speculative-decoding", "eagle", "hass"} <= set(meta["tags"]) and meta["license"] == "apache-2.0"
    assert "optimizer steps: 120" in body and "hardware: 2x CPU (gloo)" in body
    assert "| gsm8k | math | 343 | 7 |" in body and "skipped): mathinstruct" in body
    assert "this run used scale 0.01" in body and "dequantised copy" in body
    assert "| heldout_loss | 1.234 |" in body and "| top1.d1 | 0.61 |" in body
    assert "| gsm8k | greedy |  | single | 3.50 | 2 |" in body  # (30 + 12) / (10 + 2), not 'other'
    assert "| mt_bench | sps |  | single | 2.50 | 1 |" in body
    assert "sglang.launch_server --model-path HuggingFaceTB/SmolLM2-135M-Instruct" in body
    assert "does not load in vLLM" in body  # fc has a bias


def test_model_card_says_what_is_missing(tmp_path):
    target = FrozenTarget(make_tiny_target(), "tiny")
    directory = save_drafter(EagleDrafter.from_config(
        DrafterConfig.from_target(target.config, target.info())), tmp_path / "bare")
    card = build_model_card(directory)
    assert "no manifest.json" in card and "No metrics.json" in card and "No evaluation run" in card
    assert "not recorded (no training_config.yaml" in card


def test_dry_run_lists_exactly_the_files_and_prints_the_card(checkpoint, capsys):
    main = runpy.run_path(str(REPO_ROOT / "launch" / "push_to_hub.py"))["main"]
    main([str(checkpoint), "--repo-id", "me/drafter", "--dry-run", "--revision", "exp"])
    out = capsys.readouterr().out
    listed = [line.strip() for line in out.split("----- README.md")[0].splitlines()[1:] if line.strip()]
    assert listed == EXPECTED_FILES
    assert "would upload to me/drafter (branch exp), public" in out
    assert "library_name: taps" in out and "## Held-out metrics" in out and "## Usage" in out


class FakeHfApi:
    """Records the calls push_drafter makes (stands in for the network)."""

    calls: list = []
    who = {"name": "me", "orgs": [{"name": "my-org"}]}

    def __init__(self, token=None):
        self.calls.append(("init", token))

    def whoami(self, token=None):
        return self.who

    existing: dict = {}  # repo id -> private flag of repositories that already exist

    def create_repo(self, repo_id, **kw):
        self.calls.append(("create_repo", repo_id, kw))
        self.existing.setdefault(repo_id, bool(kw.get("private")))
        return f"https://huggingface.co/{repo_id}"

    def repo_info(self, repo_id, **kw):
        return type("Info", (), {"private": self.existing[repo_id]})()

    def create_branch(self, repo_id, **kw):
        self.calls.append(("create_branch", repo_id, kw))

    def upload_folder(self, **kw):
        from pathlib import Path

        files = sorted(p.name for p in Path(kw["folder_path"]).iterdir())
        self.calls.append(("upload_folder", kw["repo_id"], kw, files))


@pytest.fixture
def fake_api(monkeypatch):
    FakeHfApi.calls = []
    FakeHfApi.existing = {}
    monkeypatch.setattr(hub, "HfApi", FakeHfApi)
    monkeypatch.setenv("HF_TOKEN", SECRET)
    return FakeHfApi


def test_upload_path(checkpoint, fake_api, capsys, caplog):
    main = runpy.run_path(str(REPO_ROOT / "launch" / "push_to_hub.py"))["main"]
    with caplog.at_level(logging.DEBUG):
        main([str(checkpoint), "--repo-id", "my-org/drafter", "--private", "--revision", "exp"])
    calls = {c[0]: c for c in fake_api.calls}
    assert calls["create_repo"][1] == "my-org/drafter" and calls["create_repo"][2]["private"] is True
    assert calls["create_branch"][2]["branch"] == "exp"
    _, repo, kw, files = calls["upload_folder"]
    assert repo == "my-org/drafter" and kw["revision"] == "exp" and files == EXPECTED_FILES
    out = capsys.readouterr()
    assert "uploaded to https://huggingface.co/my-org/drafter" in out.out
    assert SECRET not in out.out + out.err + caplog.text


def test_refuses_someone_elses_repo_and_missing_token(checkpoint, fake_api, monkeypatch, caplog):
    with caplog.at_level(logging.DEBUG), pytest.raises(HubError, match="belongs to 'bob'.*user 'me'") as err:
        push_drafter(checkpoint, "bob/drafter")
    assert SECRET not in str(err.value) + caplog.text
    assert not [c for c in fake_api.calls if c[0] in ("create_repo", "upload_folder")]
    monkeypatch.delenv("HF_TOKEN")
    monkeypatch.setattr("huggingface_hub.get_token", lambda: None)
    with pytest.raises(HubError, match="no Hugging Face token: set HF_TOKEN or log in"):
        push_drafter(checkpoint, "me/drafter")


def test_private_push_to_an_existing_public_repo_is_refused(checkpoint, fake_api):
    fake_api.existing["me/public"] = False
    with pytest.raises(HubError, match="already exists and is public"):
        push_drafter(checkpoint, "me/public", private=True)
    assert not [c for c in fake_api.calls if c[0] == "upload_folder"]


def test_http_errors_are_explained_with_the_token_scrubbed(checkpoint, fake_api, monkeypatch):
    class Forbidden(Exception):
        response = type("R", (), {"status_code": 403})()

    def upload_folder(self, **kw):
        raise Forbidden(f"403 Forbidden for token {SECRET}")

    monkeypatch.setattr(FakeHfApi, "upload_folder", upload_folder)
    with pytest.raises(HubError, match="may not write to this repository") as err:
        push_drafter(checkpoint, "me/drafter")
    assert SECRET not in str(err.value) and "***" in str(err.value)


def test_refuses_a_broken_drafter_before_uploading(checkpoint, tmp_path, fake_api):
    import shutil

    broken = shutil.copytree(checkpoint, tmp_path / "broken")
    data = (broken / "model.safetensors").read_bytes()
    (broken / "model.safetensors").write_bytes(data[:-100])
    with pytest.raises(ValueError, match="truncated"):
        push_drafter(broken, "me/drafter", dry_run=True)
    assert not fake_api.calls
