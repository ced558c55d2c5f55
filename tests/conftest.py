"""Shared pytest setup: the repository root on sys.path, the ComfyUI server fixture, its log on failures."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any, Iterator

import pytest

REPO_ROOT = Path(__file__).resolve().parents[1]
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

from janus_fixture import tiny_janus_dir  # noqa: E402,F401  (fixture, one checkpoint per session)

# Tests neither read nor write the automatic window's saved costs (a user's cache, or each other's): each test
# process starts cold, as the tests assume; tests/test_window_memory.py points it at a file of its own.
os.environ["SCD_WINDOW_COSTS"] = "off"


@pytest.fixture(scope="session")
def comfy_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """A running ComfyUI (see comfy_server.py) with this pack in custom_nodes; stopped after the session."""
    from comfy_server import ComfyServer  # imported here: it needs the test requirements (requests, websocket)

    server = ComfyServer(tmp_path_factory.mktemp("comfy_base"))
    try:
        server.start()
        yield server
    finally:
        server.stop()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo):
    outcome = yield
    report = outcome.get_result()
    server = getattr(item, "funcargs", {}).get("comfy_server")
    if report.failed and server is not None:
        report.sections.append(("ComfyUI server log (tail)", server.log_tail()))


@pytest.fixture
def unlearned_auto_window(monkeypatch: pytest.MonkeyPatch) -> None:
    """For tests that compare two automatic runs on one model: their widths agree only if the first run taught
    the chooser nothing, so the runs' own call costs are not learned and no call explores (both are tested on
    their own in tests/test_auto_window.py), and no run starts from the last one's commit law."""
    from scd_core.windows import auto_window

    monkeypatch.setattr(auto_window.CallCosts, "learn", lambda self, width, seconds: None)
    monkeypatch.setattr(auto_window.CallCosts, "explores", lambda self, neighbours: False)
    monkeypatch.setattr(auto_window.CallCosts, "learn_hazard", lambda self, hazard: None)
