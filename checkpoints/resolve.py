"""Turn a drafter spec (local directory or Hub id with optional ``@revision``) into a local directory."""

from __future__ import annotations

import os
import re
from pathlib import Path

# what a taps drafter repository holds that loading or a model card needs (never pickles)
DRAFTER_FILE_PATTERNS = ["*.json", "*.safetensors", "*.yaml", "*.yml", "README.md"]
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.\-]*/[\w.\-]+$")


def parse_hub_spec(spec: str) -> tuple[str, str | None]:
    """``ORG/NAME`` or ``ORG/NAME@revision`` -> (repo_id, revision)."""
    repo_id, at, revision = spec.partition("@")
    if not _HUB_ID.match(repo_id) or ".." in repo_id or (at and not revision):
        raise FileNotFoundError(f"drafter {spec!r} is neither an existing directory nor a Hub id "
                         "(ORG/NAME or ORG/NAME@revision)")
    return repo_id, revision or None


def resolve_drafter(spec: str | os.PathLike, *, cache_dir: str | Path | None = None,
                    token: str | None = None) -> Path:
    """A local drafter directory for ``spec``; Hub ids are downloaded into the Hugging Face cache.

    Only JSON, YAML, safetensors and the model card are fetched (never pickles or code).
    """
    path = Path(spec).expanduser()
    if path.is_dir():
        return path
    text = str(spec)
    if path.exists():
        raise NotADirectoryError(f"drafter {text!r} is a file; give the drafter directory")
    if text.startswith((".", "/", "~")):
        raise FileNotFoundError(f"drafter directory {text!r} does not exist")
    repo_id, revision = parse_hub_spec(text)
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import LocalEntryNotFoundError, RepositoryNotFoundError, RevisionNotFoundError

    try:
        local = snapshot_download(repo_id, revision=revision, cache_dir=cache_dir, token=token,
                                  allow_patterns=DRAFTER_FILE_PATTERNS)
    except LocalEntryNotFoundError as err:
        offline = os.environ.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes", "on")
        why = ("HF_HUB_OFFLINE is set and it is not in the local Hugging Face cache" if offline
               else "the Hub cannot be reached and it is not in the local Hugging Face cache")
        raise FileNotFoundError(f"cannot fetch drafter {text!r}: {why}. Download it once with network "
                                "access, or pass a local directory.") from err
    except RevisionNotFoundError as err:
        raise FileNotFoundError(f"drafter {repo_id!r} has no revision {revision!r}") from err
    except RepositoryNotFoundError as err:
        raise FileNotFoundError(f"drafter repository {repo_id!r} not found on the Hub (or it is private "
                                "and no token with access is available)") from err
    return Path(local)
