"""Fixtures of the chaos suite: a fresh server per test (faults kill, freeze and fill it),
the session's server as the record server (no fault touches it), and a harness that
enqueues, counts every task and samples what each worker holds."""

from __future__ import annotations

import contextlib
import os
import signal
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tether.base._embedded import EmbeddedServer

from ..conftest import start_server
from ..helpers import ServerInfo, WorkerProcess
from ._harness import Chaos


@pytest.fixture
def fresh(server: ServerInfo) -> Iterator[Callable[..., EmbeddedServer]]:
    """Start servers of the session server's kind, with extra arguments; each is stopped
    (thawed first, if a test froze it) at the end."""
    started: list[EmbeddedServer] = []

    def start(*args: str, directory: str | None = None) -> EmbeddedServer:
        if directory is None:
            proc = start_server(server.kind, list(args))
        else:
            binary = server.process.binary
            proc = EmbeddedServer(binary, args=list(args), directory=directory).start()
        started.append(proc)
        return proc

    yield start
    for proc in started:
        if proc.process is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(proc.process.pid, signal.SIGCONT)
        proc.cleanup()


@pytest.fixture
def chaos(
    server: ServerInfo,
    namespace: str,
    tmp_path: Path,
    workers: list[WorkerProcess],
    monkeypatch: pytest.MonkeyPatch,
) -> Iterator[Chaos]:
    monkeypatch.setenv("CHAOS_RECORD_URL", server.url)
    harness = Chaos(record_url=server.url, namespace=namespace, log_dir=tmp_path, workers=workers)
    yield harness
    harness.close()
