"""A real ComfyUI server with this pack installed, for end-to-end tests.

`ComfyServer` (the session fixture `comfy_server` in conftest.py) starts ComfyUI (installed by tests/install_comfyui.sh)
on a free port with a temporary base directory whose custom_nodes/comfyui-scd-main links
to this repository, and stops it at the end.  Helpers queue API graphs and collect
the websocket events of a run until it finishes.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import struct
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional

import requests
import websocket

REPO_ROOT = Path(__file__).resolve().parents[1]
COMFYUI_DIR = Path(os.environ.get("SCD_COMFYUI_DIR", REPO_ROOT / ".cache" / "comfyui" / "_comfyui"))
FRONTEND_INSTALLER = REPO_ROOT / "tests" / "install_frontend.sh"
PACK_NAME = "comfyui-scd-main"  # as a downloaded ZIP unpacks: not the project name, which must not matter
READY_TIMEOUT_S = 180.0
BINARY_TEXT = 3  # ComfyUI's BinaryEventTypes.TEXT (progress text on a node)
BINARY_PREVIEWS = (1, 4)  # PREVIEW_IMAGE, PREVIEW_IMAGE_WITH_METADATA


class PromptRejected(AssertionError):
    """POST /prompt answered with an error (validation failed); `body` holds ComfyUI's answer."""

    def __init__(self, status: int, body: dict[str, Any]) -> None:
        super().__init__(f"/prompt rejected the graph ({status}): {json.dumps(body)[:2000]}")
        self.status, self.body = status, body


def comfyui_main() -> Path:
    main = COMFYUI_DIR / "main.py"
    if not main.is_file():
        raise FileNotFoundError(f"ComfyUI not found at {main}; run tests/install_comfyui.sh VENV_DIR first "
                                "(or set SCD_COMFYUI_DIR)")
    return main


def newest_frontend() -> tuple[str, Path]:
    """The newest frontend the browser tests run against (pinned in tests/install_frontend.sh, the one place to
    bump it): its version and the static folder ComfyUI serves with --front-end-root."""
    version = re.search(r'^FRONTEND_VERSION="([^"]+)"', FRONTEND_INSTALLER.read_text(), re.MULTILINE)[1]
    static = REPO_ROOT / ".cache" / f"frontend-{version}" / "comfyui_frontend_package" / "static"
    if not (static / "index.html").is_file():
        raise FileNotFoundError(f"frontend {version} not found at {static}; run tests/install_frontend.sh first")
    return version, static


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@dataclass
class PromptRun:
    """One queued prompt and everything its websocket delivered."""

    server: "ComfyServer"
    ws: websocket.WebSocket
    prompt_id: str
    events: list[dict[str, Any]] = field(default_factory=list)  # JSON messages {"type", "data"}
    texts: list[str] = field(default_factory=list)  # progress texts shown on nodes
    previews: int = 0  # preview images received
    finished: bool = False

    def _receive(self, deadline: float) -> None:
        self.ws.settimeout(max(deadline - time.monotonic(), 0.01))
        opcode, payload = self.ws.recv_data()
        if opcode == websocket.ABNF.OPCODE_TEXT:
            message = json.loads(payload)
            self.events.append(message)
            data = message.get("data") or {}
            if (message["type"] == "executing" and data.get("node") is None
                    and data.get("prompt_id") == self.prompt_id):
                self.finished = True
        elif opcode == websocket.ABNF.OPCODE_BINARY:
            (kind,) = struct.unpack(">I", payload[:4])
            if kind == BINARY_TEXT:
                (id_length,) = struct.unpack(">I", payload[4:8])
                self.texts.append(payload[8 + id_length:].decode("utf-8"))
            elif kind in BINARY_PREVIEWS:
                self.previews += 1

    def _pump(self, done: Callable[[], bool], timeout: float, waiting_for: str) -> None:
        deadline = time.monotonic() + timeout
        while not done():
            if time.monotonic() > deadline:
                raise AssertionError(f"waited {timeout} s for {waiting_for}; last events: {self.events[-5:]}")
            try:
                self._receive(deadline)
            except websocket.WebSocketTimeoutException:
                pass

    def wait_for(self, predicate: Callable[[dict[str, Any]], bool], timeout: float) -> dict[str, Any]:
        """Read events until one satisfies `predicate` (already received ones count); returns it."""
        def matching() -> list[dict[str, Any]]:
            return [event for event in self.events if predicate(event)]

        self._pump(lambda: bool(matching()) or self.finished, timeout, "a matching event")
        found = matching()
        assert found, f"the run finished without a matching event; last events: {self.events[-5:]}"
        return found[0]

    def wait_done(self, timeout: float = 300.0) -> "PromptRun":
        self._pump(lambda: self.finished, timeout, f"prompt {self.prompt_id} to finish")
        self.ws.close()
        return self

    def of_type(self, kind: str) -> list[dict[str, Any]]:
        return [e["data"] for e in self.events if e["type"] == kind]

    @property
    def status(self) -> str:
        """success, error or interrupted (valid once finished)."""
        kinds = {e["type"] for e in self.events}
        if "execution_interrupted" in kinds:
            return "interrupted"
        if "execution_error" in kinds:
            return "error"
        return "success" if "execution_success" in kinds else "unknown"

    def history(self) -> dict[str, Any]:
        return self.server.get_json(f"/history/{self.prompt_id}")[self.prompt_id]


class ComfyServer:
    def __init__(self, base_dir: Path, front_end_root: Optional[Path] = None) -> None:
        """`front_end_root`: a frontend's static folder to serve instead of the one the core pins."""
        self.base_dir = base_dir
        self.front_end_root = front_end_root
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = base_dir / "comfyui.log"
        self.process: Optional[subprocess.Popen] = None

    @property
    def models_dir(self) -> Path:
        return self.base_dir / "models" / "scd"

    def start(self) -> None:
        main = comfyui_main()
        (self.base_dir / "custom_nodes").mkdir(parents=True, exist_ok=True)
        (self.base_dir / "custom_nodes" / PACK_NAME).symlink_to(REPO_ROOT, target_is_directory=True)
        self.models_dir.mkdir(parents=True, exist_ok=True)
        command = [sys.executable, str(main), "--cpu", "--base-directory", str(self.base_dir),
                   "--listen", "127.0.0.1", "--port", str(self.port), "--disable-auto-launch",
                   "--database-url", "sqlite:///:memory:"]  # the default file lives in ComfyUI's own folder
        if self.front_end_root is not None:
            command += ["--front-end-root", str(self.front_end_root)]
        with open(self.log_path, "wb") as log:
            self.process = subprocess.Popen(command, cwd=self.base_dir, stdout=log, stderr=subprocess.STDOUT,
                                            env=dict(os.environ, PYTHONUNBUFFERED="1"))
        deadline = time.monotonic() + READY_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"ComfyUI exited with {self.process.returncode}:\n{self.log_tail()}")
            try:
                if requests.get(f"{self.url}/system_stats", timeout=2).ok:
                    return
            except requests.ConnectionError:
                pass
            time.sleep(0.3)
        raise RuntimeError(f"ComfyUI not ready after {READY_TIMEOUT_S} s:\n{self.log_tail()}")

    def stop(self) -> None:
        if self.process is None or self.process.poll() is not None:
            return
        self.process.terminate()
        try:
            self.process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()

    def log_tail(self, lines: int = 80) -> str:
        if not self.log_path.exists():
            return ""
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])

    def is_alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    # -- HTTP --------------------------------------------------------------------------------------
    def get_json(self, path: str) -> Any:
        response = requests.get(self.url + path, timeout=30)
        response.raise_for_status()
        return response.json()

    def submit(self, graph: dict[str, Any], client_id: str = "") -> requests.Response:
        """POST /prompt; the raw response (400 with node_errors when validation fails)."""
        return requests.post(f"{self.url}/prompt", json={"prompt": graph, "client_id": client_id}, timeout=30)

    def start_prompt(self, graph: dict[str, Any]) -> PromptRun:
        """Connect a websocket, queue `graph` and return the run (events are read by wait_*)."""
        client_id = uuid.uuid4().hex
        ws = websocket.create_connection(f"ws://127.0.0.1:{self.port}/ws?clientId={client_id}", timeout=30)
        response = self.submit(graph, client_id)
        if response.status_code != 200:
            ws.close()
            raise PromptRejected(response.status_code, response.json())
        return PromptRun(self, ws, response.json()["prompt_id"])

    def run(self, graph: dict[str, Any], timeout: float = 300.0) -> PromptRun:
        return self.start_prompt(graph).wait_done(timeout)

    def interrupt(self) -> None:
        requests.post(f"{self.url}/interrupt", timeout=10).raise_for_status()

    def view(self, image: dict[str, str]) -> bytes:
        """The bytes of an output image, given its entry in history outputs ({filename, subfolder, type})."""
        response = requests.get(f"{self.url}/view", params=image, timeout=30)
        response.raise_for_status()
        return response.content

    def object_info(self, node: str) -> dict[str, Any]:
        return self.get_json(f"/object_info/{node}")[node]

    # -- models ------------------------------------------------------------------------------------
    def add_model(self, name: str, folder: Path) -> str:
        """Make `folder` available as model `name` under BASE/models/scd/; returns the loader's combo value."""
        target = self.models_dir / name
        if target.is_symlink() or target.exists():
            target.unlink() if target.is_symlink() else shutil.rmtree(target)
        target.symlink_to(Path(folder).resolve(), target_is_directory=True)
        return name
