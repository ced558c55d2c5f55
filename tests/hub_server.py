"""A stand-in for the Hugging Face hub on 127.0.0.1, for the fetch tests (tests/test_fetch.py).

It serves folders as model repositories in the hub's URL layout, the requests huggingface_hub makes
(read from its sources, 0.36 and 2.x):

    GET  /api/models/{repo}/revision/{rev}    model_info(files_metadata=True): sha + siblings (size, lfs.sha256)
    HEAD /{repo}/resolve/{rev}/{file}         hf_hub_download's metadata: ETag, X-Repo-Commit, Content-Length
    GET  /{repo}/resolve/{rev}/{file}         the bytes; "Range: bytes=N-" answered 206 (resumed downloads)

Faults on request: `cut` names files whose next GETs stop early (the connection closed after STOP_SHARE of
the body: past the 10 MiB the client writes at a time, so that part is kept), `halt` shuts the whole server
down at that point of a file (a network gone), `served` replaces a file's bytes while its listing keeps the
real size and hash (corrupted on the way).  Every request is logged in `requests`.
"""

from __future__ import annotations

import hashlib
import json
import re
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Optional

COMMIT = "0123456789abcdef0123456789abcdef01234567"
LFS_SUFFIXES = (".safetensors", ".bin", ".pt")  # stored in LFS on the hub: listed with their sha256
STOP_SHARE = 0.9  # how much of a body a faulty GET sends before the connection drops


@dataclass
class Repo:
    folder: Path
    served: dict[str, bytes] = field(default_factory=dict)  # file -> bytes served instead of the real ones

    def names(self) -> list[str]:
        return sorted(path.relative_to(self.folder).as_posix() for path in self.folder.rglob("*") if path.is_file())

    def real(self, name: str) -> bytes:
        return (self.folder / name).read_bytes()

    def body(self, name: str) -> bytes:
        return self.served.get(name, self.real(name))

    def sibling(self, name: str) -> dict[str, Any]:
        data = self.real(name)
        entry: dict[str, Any] = {"rfilename": name, "size": len(data), "blobId": hashlib.sha1(data).hexdigest()}
        if name.endswith(LFS_SUFFIXES):
            entry["lfs"] = {"sha256": hashlib.sha256(data).hexdigest(), "size": len(data), "pointerSize": 134}
        return entry


class FakeHub:
    """`repos`: repo id -> folder.  `start()` listens on 127.0.0.1 (`port` 0: a free one) in a thread."""

    def __init__(self, repos: dict[str, Path], port: int = 0) -> None:
        self.repos = {repo_id: Repo(Path(folder)) for repo_id, folder in repos.items()}
        self.port = port
        self.requests: list[dict[str, Any]] = []
        self.cut: dict[str, int] = {}  # file -> how many more GETs stop early
        self.halt: Optional[str] = None  # a file whose GET shuts the server down early
        self.server: Optional[ThreadingHTTPServer] = None
        self.stopped = threading.Event()  # set once the port is free again

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> "FakeHub":
        hub = self

        class Handler(_Handler):
            fake = hub

        ThreadingHTTPServer.allow_reuse_address = True
        self.server = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return self

    def stop(self) -> None:
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()
            self.server = None
        self.stopped.set()

    def gets(self, name: str) -> list[dict[str, Any]]:
        return [entry for entry in self.requests if entry["method"] == "GET" and entry.get("file") == name]


class _Handler(BaseHTTPRequestHandler):
    fake: FakeHub
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:  # quiet
        pass

    def _send(self, status: int, headers: dict[str, str], body: bytes = b"") -> None:
        self.send_response(status)
        for key, value in headers.items():
            self.send_header(key, value)
        self.end_headers()
        if body:
            self.wfile.write(body)

    def _json(self, status: int, data: Any) -> None:
        body = json.dumps(data).encode()
        self._send(status, {"Content-Type": "application/json", "Content-Length": str(len(body))}, body)

    def _api(self, repo_id: str) -> None:
        repo = self.fake.repos.get(repo_id)
        if repo is None:
            self._send(404, {"X-Error-Code": "RepoNotFound", "Content-Length": "0"})
            return
        self._json(200, {"id": repo_id, "modelId": repo_id, "sha": COMMIT, "private": False,
                         "siblings": [repo.sibling(name) for name in repo.names()]})

    def _route(self) -> Optional[tuple[Repo, str]]:
        """The repository and file of a resolve URL, or None after answering 404 / the API call."""
        api = re.fullmatch(r"/api/models/(.+?)(?:/revision/[^/?]+)?(?:\?.*)?", self.path)
        if api:
            self._api(api[1])
            return None
        match = re.fullmatch(r"/(.+?)/resolve/[^/]+/(.+)", self.path.split("?")[0])
        repo = self.fake.repos.get(match[1]) if match else None
        if repo is None or match[2] not in repo.names():
            self._send(404, {"X-Error-Code": "EntryNotFound", "Content-Length": "0"})
            return None
        return repo, match[2]

    def _headers(self, repo: Repo, name: str, length: int) -> dict[str, str]:
        real = repo.real(name)
        etag = hashlib.sha256(real).hexdigest() if name.endswith(LFS_SUFFIXES) else hashlib.sha1(real).hexdigest()
        return {"ETag": f'"{etag}"', "X-Repo-Commit": COMMIT, "Content-Length": str(length),
                "Accept-Ranges": "bytes", "Content-Type": "application/octet-stream"}

    def do_HEAD(self) -> None:
        self.fake.requests.append({"method": "HEAD", "path": self.path})
        routed = self._route()
        if routed:
            repo, name = routed
            self._send(200, self._headers(repo, name, len(repo.body(name))))

    def do_GET(self) -> None:
        entry = {"method": "GET", "path": self.path, "range": self.headers.get("Range")}
        self.fake.requests.append(entry)
        routed = self._route()
        if not routed:
            return
        repo, name = routed
        entry["file"] = name
        body = repo.body(name)
        start = int(re.fullmatch(r"bytes=(\d+)-\d*", entry["range"])[1]) if entry["range"] else 0
        part = body[start:]
        headers = self._headers(repo, name, len(part))
        if start:
            headers["Content-Range"] = f"bytes {start}-{len(body) - 1}/{len(body)}"
        self.send_response(206 if start else 200)
        for key, value in headers.items():
            self.send_header(key, value)
        self.end_headers()
        if self.fake.halt == name or self.fake.cut.get(name, 0) > 0:
            self._stop_early(name, part, entry)
            return
        self.wfile.write(part)
        entry["sent"] = len(part)

    def _stop_early(self, name: str, part: bytes, entry: dict[str, Any]) -> None:
        sent = int(len(part) * STOP_SHARE)
        self.wfile.write(part[:sent])
        self.wfile.flush()
        entry["sent"] = sent
        self.close_connection = True
        self.connection.shutdown(2)
        if self.fake.halt == name:
            self.fake.halt = None
            threading.Thread(target=self.fake.stop, daemon=True).start()
        else:
            self.fake.cut[name] -= 1
