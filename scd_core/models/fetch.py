"""Fetching a published model folder from the Hugging Face hub (only when a user asks: the CLI's `fetch`, the
loader node's download option).

Only the repositories the family declarations name (`Family.repos`) are fetched.  The files arrive in a hidden
`.<name>.partial` folder next to the target (a dropped connection is resumed with a range request; after a fetch
that failed for good the next one keeps the files that arrived, and resumes the one cut short where
huggingface_hub < 2 kept it as `.incomplete`), are checked against the hub's file list (every file there,
each of its size and, for LFS files, its sha256; every safetensors header parses), and only then is the folder
renamed into place, so a folder under its model's name is always whole.  Code (.py, ...) and pickles are never
downloaded, and nothing from the repository is run.  HF_ENDPOINT and HF_HUB_OFFLINE work as for any hub client.
"""

from __future__ import annotations

import hashlib
import shutil
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable, Optional

from .family import published_repos
from .loading import download_hint
from .weights.checkpoints import PICKLE_SUFFIXES, ModelLoadError
from .weights.hf_folders import check_safetensors_weights

# never downloaded: code, which nothing here runs, and pickles, which loading refuses
SKIPPED_SUFFIXES = (".py", ".pyc", ".pyd", ".so", ".sh", ".ipynb", ".pickle", *PICKLE_SUFFIXES)
HUB_BOOKKEEPING = ".cache"  # huggingface_hub's metadata and .incomplete files inside a local_dir
POLL_S = 0.5  # how often the bytes that arrived are counted for progress
# tries per file on a transport error: huggingface_hub >= 2 resumes a dropped connection itself, < 2 raises and
# resumes from its .incomplete file on the next try
ATTEMPTS = 3
HASH_CHUNK = 1 << 24

Progress = Callable[[int, int, str], None]  # (bytes arrived, bytes in all, file being fetched)


class FetchError(ModelLoadError):
    """A fetch that could not be done or did not arrive whole; the message says why and what to do."""


@dataclass(frozen=True)
class RepoFile:
    """One file of the repository as the hub lists it."""

    name: str  # path inside the repository
    size: int
    sha256: Optional[str]  # LFS files only


def folder_name(repo_id: str) -> str:
    """The folder a repository is fetched into: its name, which the families read ("Janus-Pro-1B")."""
    return repo_id.rsplit("/", 1)[-1]


def check_repo(repo_id: str) -> None:
    """Refuse a repository that is not a whole published model folder, saying what the loader needs instead."""
    repos = published_repos()
    if repo_id in repos:
        return
    hint = download_hint(folder_name(repo_id))
    if hint:
        raise FetchError(f"{repo_id} is not fetched: the loader needs {hint}; download those by hand (README "
                         f"'Model folders'). fetch takes {', '.join(repos)}")
    raise FetchError(f"{repo_id} is not a published model fetch knows; it takes {', '.join(repos)}")


def _skipped(name: str) -> bool:
    return Path(name).suffix.lower() in SKIPPED_SUFFIXES


def _connection_errors() -> tuple[type[BaseException], ...]:
    """What the hub client raises when the hub cannot be reached: its offline mode, and its HTTP library's
    transport errors (requests in huggingface_hub < 1, httpx after)."""
    from huggingface_hub.errors import OfflineModeIsEnabled

    found: list[type[BaseException]] = [OfflineModeIsEnabled, ConnectionError, TimeoutError]
    for module, names in (("requests.exceptions", ("ConnectionError", "Timeout", "ChunkedEncodingError")),
                          ("httpx", ("TransportError",)), ("httpx2", ("TransportError",))):
        try:
            imported = __import__(module, fromlist=list(names))
        except ImportError:
            continue
        found += [getattr(imported, name) for name in names if hasattr(imported, name)]
    return tuple(found)


def _endpoint() -> str:
    from huggingface_hub import constants

    return constants.ENDPOINT


def list_files(repo_id: str, revision: str) -> tuple[str, list[RepoFile]]:
    """The commit `revision` stands for and the files there (sizes and LFS hashes from the hub's metadata)."""
    from huggingface_hub import HfApi
    from huggingface_hub.errors import HfHubHTTPError

    try:
        info = HfApi().model_info(repo_id, revision=revision, files_metadata=True)
    except _connection_errors() as err:
        raise FetchError(f"cannot reach the Hugging Face hub at {_endpoint()} to fetch {repo_id} (offline? "
                         f"{type(err).__name__}); try again when online") from err
    except HfHubHTTPError as err:
        raise FetchError(f"the hub refused {repo_id} at revision {revision}: {str(err).splitlines()[0]}") from err
    files = [RepoFile(sibling.rfilename, int(sibling.size or 0),
                      sibling.lfs.sha256 if sibling.lfs is not None else None) for sibling in info.siblings or ()]
    if not files:
        raise FetchError(f"the hub lists no files for {repo_id} at revision {revision}")
    return info.sha, files


def _bytes_present(folder: Path, files: Iterable[RepoFile]) -> int:
    """The bytes of the listed files that arrived in `folder`, partly downloaded ones included."""
    done = sum(path.stat().st_size for path in (folder / file.name for file in files) if path.is_file())
    return done + sum(path.stat().st_size for path in (folder / HUB_BOOKKEEPING).rglob("*.incomplete"))


class _Poller:
    """Reports the bytes that arrived every POLL_S seconds while the hub client downloads a file."""

    def __init__(self, folder: Path, files: list[RepoFile], progress: Progress) -> None:
        self.folder, self.files, self.progress = folder, files, progress
        self.total = sum(file.size for file in files)
        self.current = ""
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def report(self) -> None:
        self.progress(min(_bytes_present(self.folder, self.files), self.total), self.total, self.current)

    def _run(self) -> None:
        while not self._stop.wait(POLL_S):
            self.report()

    def __enter__(self) -> "_Poller":
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while chunk := handle.read(HASH_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def check_arrived(folder: Path, files: list[RepoFile]) -> None:
    """Every listed file in `folder` at its listed size and hash, and every safetensors header readable."""
    for file in files:
        path = folder / file.name
        if not path.is_file():
            raise FetchError(f"{file.name} did not arrive; fetch again")
        if path.stat().st_size != file.size:
            raise FetchError(f"{file.name} has {path.stat().st_size} bytes, the hub lists {file.size}: it was "
                             "corrupted on the way; fetch again")
        if file.sha256 is not None and _sha256(path) != file.sha256:
            raise FetchError(f"{file.name} does not match the hub's sha256: it was corrupted on the way; fetch again")
    for weights_folder in sorted({(folder / file.name).parent for file in files if file.name.endswith(".safetensors")}):
        try:
            check_safetensors_weights(weights_folder, "fetch again")
        except ModelLoadError as err:
            raise FetchError(str(err)) from err


def _download_file(repo_id: str, commit: str, name: str, partial: Path) -> None:
    """One file into `partial`, tried ATTEMPTS times over transport errors."""
    from huggingface_hub import hf_hub_download
    from huggingface_hub.errors import HfHubHTTPError

    transport = _connection_errors()
    for attempt in range(1, ATTEMPTS + 1):
        try:
            hf_hub_download(repo_id, name, revision=commit, local_dir=partial)
            return
        except (*transport, HfHubHTTPError, OSError) as err:  # OSError: the client's size check
            if attempt < ATTEMPTS and isinstance(err, transport):
                continue
            detail = (str(err).strip().splitlines() or [""])[0]
            raise FetchError(f"the download of {repo_id} stopped at {name} ({type(err).__name__}: {detail}); "
                             f"fetch again to resume (what arrived is kept in {partial})") from err


def _download(repo_id: str, commit: str, files: list[RepoFile], partial: Path, progress: Optional[Progress]) -> None:
    poller = _Poller(partial, files, progress or (lambda done, total, name: None))
    with poller:
        for file in files:
            poller.current = file.name
            _download_file(repo_id, commit, file.name, partial)
        poller.current = ""
        poller.report()


def fetch_model(repo_id: str, root: Path, revision: str = "main", progress: Optional[Progress] = None) -> Path:
    """Download the published model `repo_id` into `root`/<its name> and return that folder; a folder already
    there is returned as it is, without asking the hub.  `progress(done, total, file)` is called as bytes arrive
    (from another thread)."""
    check_repo(repo_id)
    target = Path(root) / folder_name(repo_id)
    if target.exists():
        return target
    commit, listed = list_files(repo_id, revision)
    files = [file for file in listed if not _skipped(file.name)]
    partial = target.with_name(f".{target.name}.partial")
    partial.mkdir(parents=True, exist_ok=True)
    _download(repo_id, commit, files, partial, progress)
    try:
        check_arrived(partial, files)
    except FetchError:
        shutil.rmtree(partial)  # a corrupt file would be resumed as it is: start afresh next time
        raise
    shutil.rmtree(partial / HUB_BOOKKEEPING, ignore_errors=True)
    partial.rename(target)
    return target

