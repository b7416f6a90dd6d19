"""The official weights on the Hugging Face hub: ``hf://`` references and their download.

    hf://zhZ524/EDEN/eden.pt            the official checkpoint, latest revision
    hf://zhZ524/EDEN/eden.pt@REV        at a branch, tag or commit
    hf://zhZ524/EDEN@REV/eden.pt        the same, in the hub's own URI order

A file is fetched once into huggingface_hub's cache (``HF_HUB_CACHE``, ``HF_HOME``) and read from
there afterwards; with ``HF_HUB_OFFLINE=1`` only the cache is used. What is downloaded is then
checked like any other checkpoint (``checkpoint.load_official``), with ``weights_only=True``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from .errors import CheckpointError

OFFICIAL_REPO = "zhZ524/EDEN"
OFFICIAL_FILE = "eden.pt"
SCHEME = "hf://"

_SEGMENT = re.compile(r"[\w.-]+")  # an organisation or repository name on the hub


@dataclass(frozen=True)
class HubFile:
    repo: str
    filename: str
    revision: str | None = None

    def __str__(self) -> str:
        return f"{SCHEME}{self.repo}/{self.filename}" + (f"@{self.revision}" if self.revision else "")


def is_reference(text: str | Path) -> bool:
    return isinstance(text, str) and text.startswith(SCHEME)


def parse_reference(text: str) -> HubFile:
    """``hf://ORG/NAME/FILE[@REV]`` (or ``hf://ORG/NAME@REV/FILE``) as a :class:`HubFile`."""
    body = text[len(SCHEME):] if is_reference(text) else ""
    org, _, rest = body.partition("/")
    name, _, filename = rest.partition("/")
    name, at, revision = name.partition("@")
    if not at:
        filename, at, revision = filename.partition("@")
    valid = _SEGMENT.fullmatch(org) and _SEGMENT.fullmatch(name) and filename and "@" not in filename + revision
    if not valid or (at and not revision):
        raise CheckpointError(
            f"{text!r} is not a hub reference; expected {SCHEME}ORG/NAME/FILE[@REVISION], e.g. {SCHEME}{OFFICIAL_REPO}/{OFFICIAL_FILE}"
        )
    return HubFile(f"{org}/{name}", filename, revision or None)


def download(repo: str = OFFICIAL_REPO, filename: str = OFFICIAL_FILE, revision: str | None = None) -> Path:
    """The local path of ``filename`` in ``repo`` at ``revision``: from the cache, else downloaded into it."""
    try:
        from huggingface_hub import constants, hf_hub_download
        from huggingface_hub.errors import (
            EntryNotFoundError,
            GatedRepoError,
            HfHubHTTPError,
            HFValidationError,
            LocalEntryNotFoundError,
            RepositoryNotFoundError,
            RevisionNotFoundError,
        )
    except ImportError:
        raise CheckpointError("hub references need huggingface_hub: install the project with its hub extra (pip install 'eden-serve[hub]')") from None

    where = HubFile(repo, filename, revision)
    try:
        return Path(hf_hub_download(repo_id=repo, filename=filename, revision=revision))
    # Order matters: LocalEntryNotFoundError is an EntryNotFoundError, GatedRepoError a RepositoryNotFoundError.
    except LocalEntryNotFoundError:
        if constants.HF_HUB_OFFLINE:
            raise CheckpointError(f"{where} is not in the hub cache ({constants.HF_HUB_CACHE}) and HF_HUB_OFFLINE=1 forbids downloading it") from None
        raise CheckpointError(f"{where}: the hub cannot be reached and the file is not in the hub cache ({constants.HF_HUB_CACHE})") from None
    except HFValidationError as exc:
        raise CheckpointError(f"{where}: {str(exc).splitlines()[0][:200]}") from None
    except GatedRepoError:
        raise CheckpointError(f"{where}: the repository is gated; accept its terms on the hub and log in (HF_TOKEN)") from None
    except RepositoryNotFoundError:
        raise CheckpointError(f"{where}: no such repository on the hub (or it is private: log in with HF_TOKEN)") from None
    except RevisionNotFoundError:
        raise CheckpointError(f"{where}: no revision {revision!r} in {repo}") from None
    except EntryNotFoundError:
        raise CheckpointError(f"{where}: no file {filename!r} in {repo}") from None
    except (HfHubHTTPError, OSError) as exc:
        raise CheckpointError(f"{where}: download failed ({type(exc).__name__}: {str(exc).splitlines()[0][:200]})") from None


def resolve_checkpoint(checkpoint: str | Path) -> Path:
    """A checkpoint path as given, or the local copy of a hub reference."""
    if is_reference(checkpoint):
        reference = parse_reference(checkpoint)
        return download(reference.repo, reference.filename, reference.revision)
    return Path(checkpoint)
