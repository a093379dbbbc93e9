"""Publishing a drafter directory to the Hugging Face Hub (``create_repo`` + ``upload_folder``).

The upload is an explicit allow-list of the checkpoint's files (config, safetensors weights,
resolved training config, data manifest, metrics, lineage; never resume state or pickles) plus a
generated model card, staged in a temporary directory. The token comes from the argument,
``HF_TOKEN`` or the saved login and is never printed or logged.
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from huggingface_hub import HfApi

from checkpoints.model_card import TRAINING_CONFIG_NAMES, build_model_card
from training.drafter import CONFIG_NAME, WEIGHTS_NAME

log = logging.getLogger(__name__)

UPLOAD_FILES = (CONFIG_NAME, WEIGHTS_NAME, *TRAINING_CONFIG_NAMES, "manifest.json", "metrics.json",
                "lineage.json", "adapter_config.json", "adapter_model.safetensors",
                "adapter/adapter_config.json", "adapter/adapter_model.safetensors")
CARD_NAME = "README.md"


class HubError(RuntimeError):
    """A push that cannot go ahead (no token, someone else's repository, bad directory)."""


@dataclass
class PushPlan:
    repo_id: str
    revision: str | None
    private: bool
    files: list[str] = field(default_factory=list)
    card: str = ""
    url: str | None = None

    def describe(self) -> str:
        where = f"{self.repo_id}" + (f" (branch {self.revision})" if self.revision else "")
        lines = [f"would upload to {where}, {'private' if self.private else 'public'}:" if self.url is None
                 else f"uploaded to {self.url}:"]
        lines += [f"  {name}" for name in self.files]
        return "\n".join(lines)


def upload_file_list(directory: Path) -> list[str]:
    """The checkpoint files that are published (README.md is generated, not copied)."""
    files = [name for name in UPLOAD_FILES if (directory / name).is_file()]
    if CONFIG_NAME not in files:
        raise HubError(f"{directory} has no {CONFIG_NAME}: not a drafter directory")
    if WEIGHTS_NAME not in files and "adapter_model.safetensors" not in files:
        raise HubError(f"{directory} has no {WEIGHTS_NAME}: nothing to publish")
    return files


def resolve_token(token: str | None = None) -> str:
    """The token from the argument, ``HF_TOKEN`` or the saved login (``hf auth login``)."""
    if token:
        return token
    if os.environ.get("HF_TOKEN"):
        return os.environ["HF_TOKEN"]
    from huggingface_hub import get_token

    saved = get_token()
    if not saved:
        raise HubError("no Hugging Face token: set HF_TOKEN or log in once with `hf auth login` "
                       "(a token with write access is needed to push)")
    return saved


def _scrub(text: str, token: str) -> str:
    return text.replace(token, "***") if token else text


def _check_owner(api: HfApi, repo_id: str, token: str) -> None:
    """The namespace must be the token's user or one of its organisations."""
    who = api.whoami(token=token)
    namespace = repo_id.split("/")[0]
    allowed = {who.get("name")} | {org.get("name") for org in who.get("orgs", []) if isinstance(org, dict)}
    if namespace not in allowed:
        raise HubError(f"the repository {repo_id!r} belongs to {namespace!r}, but the token is for user "
                       f"{who.get('name')!r} (organisations: {sorted(a for a in allowed if a)}); "
                       "push to your own namespace or use a token of that organisation")


def _validate(directory: Path, files: list[str]) -> None:
    if WEIGHTS_NAME in files:
        from checkpoints.drafter_io import load_drafter

        load_drafter(directory)  # the same checks as loading: never publish a broken drafter


def push_drafter(directory: str | Path, repo_id: str, *, private: bool = False, revision: str | None = None,
                 dry_run: bool = False, token: str | None = None, commit_message: str | None = None,
                 eval_results: str | Path | None = None, license: str = "apache-2.0") -> PushPlan:
    """Upload a drafter directory (with a generated model card) to ``repo_id``.

    ``revision`` is a branch, created from main when missing. With ``dry_run`` nothing is sent:
    the returned plan lists exactly the files and carries the model card.
    """
    directory = Path(directory)
    if not directory.is_dir():
        raise HubError(f"{directory} is not a directory")
    if repo_id.count("/") != 1 or not all(repo_id.split("/")):
        raise HubError(f"--repo-id must be ORG/NAME, got {repo_id!r}")
    files = upload_file_list(directory)
    _validate(directory, files)
    card = build_model_card(directory, repo_id=repo_id, eval_results=eval_results, license=license)
    plan = PushPlan(repo_id, revision, private, sorted([*files, CARD_NAME]), card)
    if dry_run:
        return plan
    token = resolve_token(token)
    api = HfApi(token=token)
    try:
        _check_owner(api, repo_id, token)
        url = api.create_repo(repo_id, private=private, exist_ok=True, repo_type="model", token=token)
        if private and not getattr(api.repo_info(repo_id, repo_type="model", token=token), "private", False):
            raise HubError(f"{repo_id} already exists and is public; --private does not change an existing "
                           "repository's visibility, so nothing was uploaded (make it private first)")
        if revision:
            api.create_branch(repo_id, branch=revision, exist_ok=True, repo_type="model", token=token)
        with tempfile.TemporaryDirectory(prefix="taps-push-") as tmp:
            stage = Path(tmp)
            for name in files:
                (stage / name).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(directory / name, stage / name)
            (stage / CARD_NAME).write_text(card)
            api.upload_folder(repo_id=repo_id, folder_path=str(stage), revision=revision, repo_type="model",
                              commit_message=commit_message or f"Upload drafter {directory.name} with taps",
                              token=token)
    except HubError:
        raise
    except Exception as err:  # network/HTTP errors: re-raise with a clear message, token scrubbed
        status = getattr(getattr(err, "response", None), "status_code", None)
        hint = {401: "the token is invalid or expired", 403: "the token may not write to this repository "
                "(read-only token, or a repository of someone else)"}.get(status, "")
        raise HubError(_scrub(f"push to {repo_id} failed{': ' + hint if hint else ''}: {err}", token)) from None
    plan.url = str(url)
    log.info("pushed %s to %s%s", directory, repo_id, f"@{revision}" if revision else "")
    return plan
