"""The one classification of what a server answers instead of a result (``tether.base._faults``),
one test per entry of its table, each with the reply a real server gives in that state:
a failover's CLUSTERDOWN, another client's BUSY script, a failed save's MISCONF, a full
server's OOM, a demoted master's READONLY, a replica's MASTERDOWN, NOREPLICAS, a wrong
password, a missing permission, an unknown command, a vanished consumer group.

Two states are hard to reach on purpose on one machine (TRYAGAIN needs a multi-key command
during a slot migration, LOADING a data set large enough to load slowly): for those a
script returns the server's own wording as an error reply, which reaches the client exactly
as the real one does.
"""

from __future__ import annotations

import ssl
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from tether.base._embedded import EmbeddedServer, free_port
from tether.base._faults import (
    Fault,
    UnknownReplies,
    classify,
    describe_error,
    is_transient,
    reply_code,
)

from ..conftest import SERVER_KINDS, start_server
from ..server_states import busy_script, failed_save
from ..servers import free_cluster_port

WHERE = "redis://127.0.0.1:6379/0"


@pytest.fixture(scope="module", params=SERVER_KINDS)
def node(request: pytest.FixtureRequest) -> Iterator[EmbeddedServer]:
    """A server of each kind for this module alone: the tests change its configuration
    (and put it back)."""
    proc = start_server(request.param, ["--enable-protected-configs", "yes"])
    yield proc
    proc.cleanup()


@pytest.fixture
def client(node: EmbeddedServer) -> Iterator[redis.Redis]:
    rds = redis.Redis.from_url(node.url, socket_timeout=10)
    yield rds
    rds.close()


def raised(call: object, *args: object) -> BaseException:
    """The error ``call(*args)`` raises (the test fails if it returns)."""
    assert callable(call)
    try:
        call(*args)
    except Exception as exc:
        return exc
    raise AssertionError(f"{call} did not fail")


def reply_from_script(client: redis.Redis, reply: str) -> BaseException:
    return raised(client.eval, f"return redis.error_reply({reply!r})", 0)


# -- transient ------------------------------------------------------------------------------


def test_a_refused_connection_is_transient() -> None:
    closed = redis.Redis(port=free_port(), socket_connect_timeout=1)
    exc = raised(closed.ping)
    assert classify(exc, WHERE) is Fault.TRANSIENT
    assert "cannot reach the server" in describe_error(exc, WHERE)


def test_a_timeout_is_transient(node: EmbeddedServer) -> None:
    slow = redis.Redis.from_url(node.url, socket_timeout=0.2)
    try:
        exc = raised(slow.blpop, ["nothing-comes"], 2)
    finally:
        slow.close()
    assert isinstance(exc, redis.TimeoutError)
    assert classify(exc, WHERE) is Fault.TRANSIENT
    assert "did not answer in time" in describe_error(exc, WHERE)


def test_clusterdown_is_transient(node: EmbeddedServer, tmp_path: Path) -> None:
    # A cluster node that serves no slot yet answers as a failed master's slots do
    # during the second before a replica takes over.
    lone = EmbeddedServer(
        node.binary,
        port=free_cluster_port(),
        args=["--cluster-enabled", "yes", "--cluster-config-file", str(tmp_path / "n.conf")],
    ).start()
    try:
        with redis.Redis.from_url(lone.url) as rds:
            exc = raised(rds.set, "k", "v")
    finally:
        lone.cleanup()
    assert reply_code(exc) == "CLUSTERDOWN"
    assert classify(exc, WHERE) is Fault.TRANSIENT
    assert "cluster at" in describe_error(exc, WHERE) and "down" in describe_error(exc, WHERE)


@pytest.mark.parametrize(
    "reply",
    [
        "TRYAGAIN Multiple keys request during rehashing of slot",
        "LOADING Redis is loading the dataset in memory",
    ],
)
def test_tryagain_and_loading_are_transient(client: redis.Redis, reply: str) -> None:
    exc = reply_from_script(client, reply)
    assert classify(exc, WHERE) is Fault.TRANSIENT, (type(exc), exc)


def test_busy_is_transient(node: EmbeddedServer, client: redis.Redis) -> None:
    with busy_script(node.url):
        exc = raised(client.set, "k", "v")
    assert reply_code(exc) == "BUSY", exc
    assert type(exc) is redis.ResponseError  # no class of its own: only the code tells
    assert classify(exc, WHERE) is Fault.TRANSIENT
    assert "busy running another client's script" in describe_error(exc, WHERE)
    assert client.set("k", "v")  # and it passes


def test_misconf_is_transient(client: redis.Redis) -> None:
    with failed_save(client):
        exc = raised(client.set, "k", "v")
    assert client.set("k", "v")  # and it passes
    assert reply_code(exc) == "MISCONF", exc
    assert classify(exc, WHERE) is Fault.TRANSIENT
    assert "refuses writes after a failed save" in describe_error(exc, WHERE)


def test_oom_is_transient(client: redis.Redis) -> None:
    client.config_set("maxmemory", 1)
    try:
        exc = raised(client.set, "k", "v")
    finally:
        client.config_set("maxmemory", 0)
    assert classify(exc, WHERE) is Fault.TRANSIENT
    assert "out of memory" in describe_error(exc, WHERE)


def test_readonly_and_masterdown_are_transient(node: EmbeddedServer) -> None:
    """A demoted master answers READONLY to writes; a replica that lost its master and
    may not serve stale data answers MASTERDOWN to everything."""
    replica = EmbeddedServer(node.binary).start()
    try:
        with redis.Redis.from_url(replica.url) as rds:
            rds.replicaof("127.0.0.1", node.port)
            readonly = raised(rds.set, "k", "v")
            rds.config_set("replica-serve-stale-data", "no")
            rds.replicaof("127.0.0.1", free_port())  # a master that never answers
            deadline = time.monotonic() + 10
            while True:
                masterdown = raised(rds.get, "k")
                if reply_code(masterdown) == "MASTERDOWN" or time.monotonic() > deadline:
                    break
                time.sleep(0.05)
    finally:
        replica.cleanup()
    assert isinstance(readonly, redis.exceptions.ReadOnlyError)
    assert classify(readonly, WHERE) is Fault.TRANSIENT
    assert reply_code(masterdown) == "MASTERDOWN", masterdown
    assert classify(masterdown, WHERE) is Fault.TRANSIENT


def test_noreplicas_is_transient(client: redis.Redis) -> None:
    client.config_set("min-replicas-to-write", 1)
    try:
        exc = raised(client.set, "k", "v")
    finally:
        client.config_set("min-replicas-to-write", 0)
    assert reply_code(exc) == "NOREPLICAS", exc
    assert classify(exc, WHERE) is Fault.TRANSIENT


# -- fatal ----------------------------------------------------------------------------------


def test_a_wrong_password_is_fatal(node: EmbeddedServer) -> None:
    wrong = redis.Redis(port=node.port, username="nobody", password="not-the-password")
    exc = raised(wrong.ping)
    wrong.close()
    assert classify(exc, WHERE) is Fault.FATAL
    assert "authentication failed" in describe_error(exc, WHERE)


def test_a_missing_permission_is_fatal_directly_and_inside_a_script(
    node: EmbeddedServer, client: redis.Redis
) -> None:
    client.acl_setuser(
        "reader", enabled=True, passwords=["+secret"], commands=["+get", "+eval"], keys=["*"]
    )
    try:
        with redis.Redis(port=node.port, username="reader", password="secret") as reader:
            direct = raised(reader.set, "k", "v")
            scripted = raised(reader.eval, "return redis.call('set', KEYS[1], 'v')", 1, "k")
    finally:
        client.acl_deluser("reader")
    assert classify(direct, WHERE) is Fault.FATAL, direct
    assert classify(scripted, WHERE) is Fault.FATAL, scripted
    assert "lacks a permission" in describe_error(direct, WHERE)


def test_an_unknown_command_is_fatal(client: redis.Redis) -> None:
    exc = raised(client.execute_command, "NOSUCHCOMMAND", "x")
    assert classify(exc, WHERE) is Fault.FATAL, exc


def test_a_refused_tls_certificate_is_fatal() -> None:
    # The real handshake is in test_security (redis-server with TLS); here the shape of
    # what redis-py raises: a ConnectionError raised from the certificate error.
    refused = redis.ConnectionError("Error connecting")
    refused.__cause__ = ssl.SSLCertVerificationError(1, "certificate verify failed")
    assert classify(refused, "rediss://127.0.0.1:6380/0") is Fault.FATAL
    assert "TLS certificate" in describe_error(refused, "rediss://127.0.0.1:6380/0")


# -- lost, unknown, internal ---------------------------------------------------------------


def test_a_vanished_group_is_lost(client: redis.Redis) -> None:
    exc = raised(client.xreadgroup, "nogroup", "me", {"no-such-stream": ">"})
    assert classify(exc, WHERE) is Fault.LOST


def test_any_other_reply_is_unknown(client: redis.Redis) -> None:
    client.rpush("a-list", 1)
    wrongtype = raised(client.get, "a-list")
    odd = reply_from_script(client, "WEIRDSTATE something nobody has seen yet")
    for exc in (wrongtype, odd):
        assert classify(exc, WHERE) is Fault.UNKNOWN, exc
        assert not is_transient(exc)
    assert "answered: " in describe_error(odd, WHERE)


def test_what_is_not_a_server_error_is_internal() -> None:
    assert classify(ValueError("a bug"), WHERE) is Fault.INTERNAL
    assert classify(KeyError("x"), WHERE) is Fault.INTERNAL


def test_unknown_replies_are_retried_up_to_a_bound(caplog: pytest.LogCaptureFixture) -> None:
    streak = UnknownReplies(limit=3)
    exc = redis.ResponseError("WEIRDSTATE x")
    assert not streak.failed(exc, "settle")
    assert not streak.failed(exc, "settle")
    streak.succeeded()  # a success in between starts the count again
    assert not streak.failed(exc, "settle")
    assert not streak.failed(exc, "settle")
    assert streak.failed(exc, "settle")
    logged = [r for r in caplog.records if "unexpected reply" in r.getMessage()]
    assert len(logged) == 2  # once per streak, with the reply
    assert "WEIRDSTATE x" in logged[0].getMessage()
