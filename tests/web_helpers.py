"""A real uvicorn server on a free port, in a thread of the test process, for the web tests
(a thread, so the audit log reaches caplog)."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
import uvicorn

from .conftest import start_server
from .helpers import ServerInfo

TOKEN = "test-token-0123456789abcdef"


@contextlib.contextmanager
def serving(asgi: Any) -> Iterator[str]:
    """Serve ``asgi`` on 127.0.0.1 at a free port until the block ends; yields its URL."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    config = uvicorn.Config(asgi, log_level="warning", lifespan="on")
    server = uvicorn.Server(config)
    thread = threading.Thread(
        target=lambda: asyncio.run(server.serve(sockets=[sock])), name="uvicorn", daemon=True
    )
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise AssertionError("uvicorn did not start")
        time.sleep(0.01)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(10)
        sock.close()


def sample_path(path: str) -> str:
    """A route's path with its parameters filled with well-formed values."""
    samples = {
        "queue": "default",
        "entry_id": "1-0",
        "task_id": "default:2-1-0",
        "name": "hourly",
        "task": "ops.ok",
        "key": "tenant:42",
    }
    for key, value in samples.items():
        path = path.replace("{" + key + "}", value).replace("{" + key + ":path}", value)
    assert "{" not in path, f"no sample value for a parameter of {path}"
    return path


@pytest.fixture
def valkey_url(_servers: dict[str, ServerInfo]) -> str:
    """The session's Valkey alone. What HTTP adds (auth, routing, errors, the CLI) does not
    depend on the kind of server; the readers behind it run on each kind in test_admin."""
    if "valkey" not in _servers:
        proc = start_server("valkey")
        _servers["valkey"] = ServerInfo("valkey", proc.url, proc)
    return _servers["valkey"].url
