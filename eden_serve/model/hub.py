"""The official weights on the Hugging Face hub: ``hf://`` references and their download.

    hf://zhZ524/EDEN/eden.pt            the official checkpoint, latest revision
    hf://zhZ524/EDEN/eden.pt@REV        at a branch, tag or commit
    hf://zhZ524/EDEN@REV/eden.pt        the same, in the hub's own URI order

A file is fetched once into huggingface_hub's cache (``HF_HUB_CACHE``, ``HF_HOME``) and read from
there afterwards; with ``HF_HUB_OFFLINE=1`` only the cache is used, and so it is when one quick
connection to the hub (or its proxy) fails, rather than huggingface_hub's retries for half a
minute. What is downloaded is then checked like any other checkpoint (``checkpoint.load_official``),
with ``weights_only=True``. References are checked here, before any file or network access: no
empty, ``.`` or ``..`` parts, no absolute or backslash paths.
"""

from __future__ import annotations

import contextlib
import logging
import re
import socket
import urllib.parse
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from ..errors import CheckpointError

OFFICIAL_REPO = "zhZ524/EDEN"
OFFICIAL_FILE = "eden.pt"
SCHEME = "hf://"

_SEGMENT = re.compile(r"[\w.-]+")  # an organisation or repository name on the hub
PROBE_TIMEOUT = 5.0  # seconds for the one connection that tells whether the hub can be reached


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
    reference = HubFile(f"{org}/{name}", filename, revision or None)
    check_hub_file(reference)
    return reference


def _safe_path(text: str) -> bool:
    """A relative path of named parts: no empty, ``.`` or ``..`` part, no backslash."""
    return bool(text) and "\\" not in text and all(part not in ("", ".", "..") for part in text.split("/"))


def check_hub_file(where: HubFile) -> None:
    """Refuse a reference that could name something outside its repository, before any access."""
    org, _, name = where.repo.partition("/")
    problems = [
        (not all(_SEGMENT.fullmatch(part) and part not in (".", "..") for part in (org, name)), f"repository {where.repo!r}"),
        (not _safe_path(where.filename), f"file {where.filename!r}"),
        (where.revision is not None and not _safe_path(where.revision), f"revision {where.revision!r}"),
    ]
    for bad, what in problems:
        if bad:
            raise CheckpointError(f"{what} is not allowed in a hub reference (ORG/NAME; FILE and REVISION: "
                                  "relative paths, no empty, '.' or '..' parts, no backslashes)")


def _unreachable(endpoint: str) -> str | None:
    """Why one quick connection to the hub (or the proxy that would carry it) fails; None if it
    does not."""
    url = urllib.parse.urlsplit(endpoint)
    host, port = url.hostname or "", url.port or (443 if url.scheme == "https" else 80)
    proxy = None if urllib.request.proxy_bypass(host) else urllib.request.getproxies().get(url.scheme)
    if proxy:
        proxied = urllib.parse.urlsplit(proxy if "://" in proxy else f"http://{proxy}")
        host, port = proxied.hostname or "", proxied.port or 80
    try:
        socket.create_connection((host, port), timeout=PROBE_TIMEOUT).close()
    except socket.gaierror as exc:
        return f"cannot resolve {host} ({exc.strerror})"
    except TimeoutError:
        return f"no answer from {host}:{port} in {PROBE_TIMEOUT:g} s"
    except OSError as exc:
        return f"{host}:{port}: {exc.strerror or type(exc).__name__}"
    return None


@contextlib.contextmanager
def _quiet(name: str):
    """huggingface_hub's own warnings (one line per retry) held back: its failure becomes our one line."""
    logger = logging.getLogger(name)
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        logger.setLevel(level)


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
    check_hub_file(where)
    try:
        Path(constants.HF_HUB_CACHE).expanduser()
    except RuntimeError:  # "~": HOME unset, and the user has no password entry (a container's arbitrary uid)
        raise CheckpointError(f"{where}: no home directory for the hub cache ({constants.HF_HUB_CACHE}): set HF_HOME") from None
    unreachable = None if constants.HF_HUB_OFFLINE else _unreachable(constants.ENDPOINT)
    try:
        with _quiet("huggingface_hub"):
            return Path(hf_hub_download(repo_id=repo, filename=filename, revision=revision, local_files_only=unreachable is not None))
    # Order matters: LocalEntryNotFoundError is an EntryNotFoundError, GatedRepoError a RepositoryNotFoundError.
    except LocalEntryNotFoundError:
        if constants.HF_HUB_OFFLINE:
            raise CheckpointError(f"{where} is not in the hub cache ({constants.HF_HUB_CACHE}) and HF_HUB_OFFLINE=1 forbids downloading it") from None
        reason = f" ({unreachable})" if unreachable else ""
        raise CheckpointError(f"{where}: the hub cannot be reached{reason} and the file is not in the hub cache ({constants.HF_HUB_CACHE})") from None
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
