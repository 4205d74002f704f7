"""Local multi-process set-ups for tests: a Redis Cluster and a Sentinel-managed master/replica,
started from a server binary (the embedded valkey-server or the machine's redis-server) on free
loopback ports. Every process is stopped by its PID and every temporary folder removed.

The cluster is formed without redis-cli, with CLUSTER commands sent from redis-py, so the suite
needs nothing but the server binaries.

The fixtures in conftest.py are built on :func:`cluster_fixture`, :func:`sentinel_fixture`
(session-wide set-ups) and :func:`healed` (per test: restarts what an earlier test killed).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, TypeVar

import redis
from redis.backoff import NoBackoff
from redis.crc import REDIS_CLUSTER_HASH_SLOTS, key_slot
from redis.retry import Retry

from tether.base._embedded import EmbeddedServer, embedded_binary, free_port, system_binary
from tether.base._errors import TetherError

HOST = "127.0.0.1"
BUS_PORT_OFFSET = 10000
"""The cluster bus listens on port + 10000 (the default, and the only choice before Redis 7)."""

Role = Literal["master", "replica"]


class HarnessError(RuntimeError):
    """A local cluster or sentinel set-up did not come up (or heal) in time."""


def binary_for(kind: str) -> str:
    """The server binary of a kind: ``valkey`` (the embedded one) or ``redis`` (the machine's)."""
    if kind == "valkey":
        return embedded_binary()
    if kind == "redis":
        binary = system_binary()
        if binary is None:
            raise HarnessError("no redis-server on this machine")
        return binary
    raise ValueError(f"unknown server kind {kind!r}")


def _port_is_free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind((HOST, port))
        except OSError:
            return False
    return True


def free_cluster_port() -> int:
    """A free port whose bus port (port + 10000) is free too.

    ``free_port`` gives an ephemeral port (32768-60999 on Linux), so the bus port can overflow
    65535; such ports are skipped.
    """
    for _ in range(200):
        port = free_port()
        if port + BUS_PORT_OFFSET <= 65535 and _port_is_free(port + BUS_PORT_OFFSET):
            return port
    raise HarnessError("no free port pair for a cluster node")


def _admin_client(port: int) -> redis.Redis:
    # No retries and short timeouts: the harness polls, so a dead or restarting node should
    # fail fast and be asked again on the next round rather than stall a poll for seconds.
    return redis.Redis(
        host=HOST,
        port=port,
        decode_responses=True,
        socket_timeout=2.0,
        socket_connect_timeout=1.0,
        retry=Retry(NoBackoff(), 0),
    )


def _parse_info(reply: Any) -> dict[str, str]:
    """INFO or CLUSTER INFO: redis-py parses the former into a dict, not the latter."""
    if isinstance(reply, dict):
        return {str(k): str(v) for k, v in reply.items()}
    out: dict[str, str] = {}
    for line in str(reply).splitlines():
        key, sep, value = line.strip().partition(":")
        if sep:
            out[key] = value
    return out


class _Server(EmbeddedServer):
    """An :class:`EmbeddedServer` whose stdout and stderr go to a file: a server that rejects
    its arguments says why there, before it opens its log file."""

    @property
    def output_path(self) -> Path:
        return Path(self.directory) / f"output-{self.port}.txt"

    def start(self, timeout: float = 15.0) -> _Server:
        if self.process is not None and self.process.poll() is None:
            return self
        with open(self.output_path, "ab") as output:
            self.process = subprocess.Popen(
                self.command(), stdout=output, stderr=subprocess.STDOUT, cwd=self.directory
            )
        self.wait_ready(timeout)
        return self

    def tail_log(self, lines: int = 10) -> str:
        log = super().tail_log(lines)
        try:
            output = self.output_path.read_text(errors="replace").strip()
        except OSError:
            return log
        return f"{output[-2000:]}\n{log}" if output else log


def _start_with_retries(make: Callable[[], EmbeddedServer], timeout: float) -> EmbeddedServer:
    """Start a server; pick new ports when the chosen ones were taken meanwhile.

    A free port is only free when it is checked: on a busy CI machine another process can bind it
    before the server does. The server then exits at once with "Address already in use".
    """
    last: Exception | None = None
    for _ in range(3):
        server = make()
        try:
            return server.start(timeout)
        except TetherError as exc:
            server.stop(kill=True)
            last = exc
            if "already in use" not in str(exc) and "already in use" not in server.tail_log(40):
                raise HarnessError(str(exc)) from exc
    raise HarnessError(f"could not bind a free port three times: {last}")


def _terminate(servers: Sequence[EmbeddedServer], timeout: float = 5.0) -> None:
    """SIGTERM every process at once, then SIGKILL those still running after ``timeout``."""
    processes = [s.process for s in servers if s.process is not None]
    for process in processes:
        if process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(process.pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    for process in processes:
        try:
            process.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.kill(process.pid, signal.SIGKILL)
            process.wait(10)
    for server in servers:
        server.process = None


def _wait(
    check: Callable[[], str | None],
    timeout: float,
    what: str,
    logs: Callable[[], str],
    interval: float = 0.05,
) -> None:
    """Poll ``check`` until it returns None; it returns what is still missing otherwise."""
    deadline = time.monotonic() + timeout
    while True:
        problem = check()
        if problem is None:
            return
        if time.monotonic() > deadline:
            raise HarnessError(f"{what}: not done within {timeout}s: {problem}\n{logs()}")
        time.sleep(interval)


_REPLICATION_ARGS = ["--repl-diskless-sync-delay", "0", "--repl-ping-replica-period", "1"]
"""Diskless sync waits 5 s by default for more replicas to join one transfer. The 1 s pings
make a replica's acknowledged offset non-zero soon (see :func:`_replicas_not_streaming`)."""


def _replicas_not_streaming(replication: dict[str, Any], count: int) -> str | None:
    """None when the master (its INFO replication) streams to ``count`` replicas.

    After a diskless full sync the master holds writes back until the replica's first
    REPLCONF ACK, sent once a second; until then WAIT blocks (up to a second, seen with Redis
    7.0), which would make a test's ``WAIT 1 1000`` flaky. A non-zero acknowledged offset shows
    that ACK arrived.
    """
    if int(replication.get("connected_slaves", 0)) != count:
        return f"{replication.get('connected_slaves')} of {count} replicas connected"
    for index in range(count):
        entry = replication.get(f"slave{index}")
        if not isinstance(entry, dict):
            return f"slave{index}: {entry!r}"
        if entry.get("state") != "online" or int(entry.get("offset", 0)) <= 0:
            return f"replica {entry.get('port')} not streaming yet: {entry}"
    return None


# --------------------------------------------------------------------------------------------
# Cluster


@dataclass
class ClusterNode:
    """One server process of a :class:`LocalCluster`."""

    index: int
    server: EmbeddedServer
    role: Role
    node_id: str = ""
    master_id: str | None = None
    """For a replica: the node id of its master."""
    slots: list[tuple[int, int]] = field(default_factory=list)
    """For a master: the slot ranges it serves, inclusive."""

    @property
    def port(self) -> int:
        return self.server.port

    @property
    def pid(self) -> int | None:
        return self.server.pid

    @property
    def address(self) -> tuple[str, int]:
        return (HOST, self.port)

    @property
    def name(self) -> str:
        return f"{HOST}:{self.port}"

    def alive(self) -> bool:
        process = self.server.process
        return process is not None and process.poll() is None

    def serves(self, slot: int) -> bool:
        return any(start <= slot <= end for start, end in self.slots)

    def __repr__(self) -> str:
        return f"<{self.role} {self.name} pid={self.pid} id={self.node_id[:8]}>"


@dataclass
class _NodeView:
    """One line of CLUSTER NODES."""

    node_id: str
    port: int
    flags: set[str]
    master_id: str | None
    connected: bool
    slots: list[tuple[int, int]]

    @property
    def role(self) -> Role:
        return "master" if "master" in self.flags else "replica"


def _parse_cluster_nodes(text: str) -> dict[str, _NodeView]:
    views: dict[str, _NodeView] = {}
    for line in text.strip().splitlines():
        parts = line.split()
        # <id> <ip:port@cport[,hostname]> <flags> <master> <ping> <pong> <epoch> <link> <slot>...
        address = parts[1].split(",")[0]
        port = int(address.split("@")[0].rsplit(":", 1)[1] or 0)
        slots: list[tuple[int, int]] = []
        for item in parts[8:]:
            if item.startswith("["):  # a slot being migrated or imported
                continue
            start, _, end = item.partition("-")
            slots.append((int(start), int(end or start)))
        views[parts[0]] = _NodeView(
            node_id=parts[0],
            port=port,
            flags=set(parts[2].split(",")),
            master_id=None if parts[3] == "-" else parts[3],
            connected=parts[7] == "connected",
            slots=slots,
        )
    return views


class LocalCluster:
    """A Redis Cluster of ``masters`` masters (and a replica for each, by default) on loopback.

    ``url`` is Tether's ``redis+cluster://`` URL. Use as a context manager or call ``start()``
    and ``stop()``. ``kill()`` a master, ``wait_for_failover()``, then ``heal()`` restarts the
    killed nodes on their ports (they rejoin as replicas) for the next test.
    """

    def __init__(
        self,
        binary: str,
        *,
        masters: int = 3,
        replicas: bool = True,
        node_timeout_ms: int = 1000,
        extra_args: Sequence[str] = (),
    ) -> None:
        self.binary = binary
        self.masters_count = masters
        self.with_replicas = replicas
        self.node_timeout_ms = node_timeout_ms
        self.extra_args = list(extra_args)
        self.nodes: list[ClusterNode] = []
        self.directory = Path(tempfile.mkdtemp(prefix="tether-cluster-"))
        self._clients: dict[int, redis.Redis] = {}
        self._suspect = False
        self.startup_seconds = 0.0

    # -- public API ----------------------------------------------------------------------

    @property
    def url(self) -> str:
        return "redis+cluster://" + ",".join(node.name for node in self.nodes)

    @property
    def addresses(self) -> list[tuple[str, int]]:
        return [node.address for node in self.nodes]

    @property
    def masters(self) -> list[ClusterNode]:
        return [node for node in self.nodes if node.role == "master" and node.slots]

    @property
    def replicas(self) -> list[ClusterNode]:
        return [node for node in self.nodes if node.role == "replica"]

    def start(self, timeout: float = 30.0) -> LocalCluster:
        began = time.monotonic()
        try:
            self._start_processes(timeout)
            self._form(timeout)
        except BaseException:
            self.stop()
            raise
        self.startup_seconds = time.monotonic() - began
        return self

    def stop(self) -> None:
        """Stop every process started (SIGTERM, then SIGKILL) and remove the temp folders."""
        for client in self._clients.values():
            client.close()
        self._clients.clear()
        _terminate([node.server for node in self.nodes])
        shutil.rmtree(self.directory, ignore_errors=True)

    def __enter__(self) -> LocalCluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def master_for_key(self, key: str | bytes) -> ClusterNode:
        """The master serving ``key``'s slot now (the topology is re-read from a live node)."""
        slot = key_slot(key.encode() if isinstance(key, str) else key)
        self.refresh()
        for node in self.masters:
            if node.alive() and node.serves(slot):
                return node
        raise HarnessError(f"no live master serves slot {slot}: {self.nodes}")

    def replicas_of(self, master: ClusterNode) -> list[ClusterNode]:
        return [n for n in self.nodes if n.role == "replica" and n.master_id == master.node_id]

    def kill(self, node: ClusterNode) -> None:
        """SIGKILL a node by PID: no shutdown, no last words to the cluster bus."""
        self._suspect = True
        process = node.server.process
        if process is None or process.poll() is not None:
            raise HarnessError(f"{node} is not running")
        os.kill(process.pid, signal.SIGKILL)
        process.wait(10)

    def wait_for_failover(self, old_master: ClusterNode, timeout: float = 15.0) -> ClusterNode:
        """Wait until a replica of ``old_master`` serves its slots and every live node says
        ``cluster_state:ok``; returns the promoted node."""
        old_id, old_slots = old_master.node_id, list(old_master.slots)
        candidates = [n.node_id for n in self.nodes if n.master_id == old_id]
        if not candidates:
            raise HarnessError(f"{old_master} has no replica to promote")
        promoted: list[ClusterNode] = []

        def check() -> str | None:
            self._raise_if_crashed()
            for node in self._live():
                try:
                    views = self._views(node)
                except redis.RedisError as exc:
                    return f"{node}: {exc}"
                winners = [views[c] for c in candidates if c in views and views[c].role == "master"]
                if not winners or sorted(winners[0].slots) != sorted(old_slots):
                    return f"{node} does not yet see a replica of {old_id[:8]} promoted"
            self.refresh()
            promoted[:] = [n for n in self.nodes if n.node_id in candidates and n.role == "master"]
            return None

        _wait(check, timeout, f"failover of {old_master}", self._logs)
        return promoted[0]

    def heal(self, timeout: float = 30.0) -> None:
        """Restart every dead node on its port and wait until the cluster is whole again: each
        master with a replica (when replicas were asked for), all slots served, links up."""
        dead = [node for node in self.nodes if not node.alive()]
        if not dead and not self._suspect:
            return
        # Until the cluster is whole again, a later heal() must check it, not trust the PIDs.
        self._suspect = True
        for node in dead:
            # Same port and folder: the node reloads its nodes.conf, so it rejoins under its old
            # id, learns from the others that its slots moved, and becomes a replica.
            try:
                node.server.start(timeout)
            except TetherError as exc:
                raise HarnessError(f"restarting {node}: {exc}") from exc
        _wait(self._check_healthy, timeout, "cluster heal", self._logs)
        self.refresh()
        self._suspect = False

    def healthy(self) -> bool:
        return all(node.alive() for node in self.nodes) and self._check_healthy() is None

    def refresh(self) -> None:
        """Re-read roles and slots from a live node's CLUSTER NODES."""
        for source in self._live():
            try:
                views = self._views(source)
            except redis.RedisError:
                continue
            for node in self.nodes:
                view = views.get(node.node_id)
                if view is not None:
                    node.role = view.role
                    node.master_id = view.master_id
                    node.slots = view.slots
            return
        raise HarnessError("no live cluster node to read the topology from")

    def tail_logs(self, lines: int = 15) -> str:
        return self._logs(lines)

    # -- start-up ------------------------------------------------------------------------

    def _node_args(self) -> list[str]:
        return [
            "--cluster-enabled",
            "yes",
            "--cluster-config-file",
            "nodes.conf",  # relative to --dir: one per node folder
            "--cluster-node-timeout",
            str(self.node_timeout_ms),
            # 0: a replica fails over however long its link to the master has been down, so a
            # promotion never waits on (or is refused for) replication lag in tests.
            "--cluster-replica-validity-factor",
            "0",
            # Keep the topology the tests set up: no replica wandering to an orphaned master.
            "--cluster-allow-replica-migration",
            "no",
            # Redis 7.0 also leaves a replica out of CLUSTER SLOTS (so clients never see it)
            # while its replication offset is 0: on an idle master, until the first
            # replication ping, every 10 s by default; _REPLICATION_ARGS ping every second.
            *_REPLICATION_ARGS,
            *self.extra_args,
        ]

    def _start_processes(self, timeout: float) -> None:
        count = self.masters_count * (2 if self.with_replicas else 1)
        for index in range(count):
            folder = self.directory / f"node-{index}"
            folder.mkdir()

            def make(folder: Path = folder) -> EmbeddedServer:
                # A fresh nodes.conf on a retry: the failed process may have written one.
                (folder / "nodes.conf").unlink(missing_ok=True)
                return _Server(
                    self.binary,
                    port=free_cluster_port(),
                    args=self._node_args(),
                    directory=str(folder),
                )

            server = _start_with_retries(make, timeout)
            role: Role = "master" if index < self.masters_count else "replica"
            self.nodes.append(ClusterNode(index, server, role))
            self._clients[server.port] = _admin_client(server.port)

    def _form(self, timeout: float) -> None:
        for node in self.nodes:
            node.node_id = self._client(node).execute_command("CLUSTER", "MYID")
        masters = self.nodes[: self.masters_count]
        step = REDIS_CLUSTER_HASH_SLOTS // len(masters)
        for i, node in enumerate(masters):
            start = i * step
            end = REDIS_CLUSTER_HASH_SLOTS - 1 if i == len(masters) - 1 else start + step - 1
            client = self._client(node)
            # Distinct config epochs up front (as redis-cli does) spare the cluster an epoch
            # collision round after MEET.
            client.execute_command("CLUSTER", "SET-CONFIG-EPOCH", i + 1)
            try:
                client.execute_command("CLUSTER", "ADDSLOTSRANGE", start, end)
            except redis.ResponseError as exc:  # Redis 6.2 has no ADDSLOTSRANGE
                if "unknown subcommand" not in str(exc).lower():
                    raise
                client.execute_command("CLUSTER", "ADDSLOTS", *range(start, end + 1))
            node.slots = [(start, end)]
        first = self._client(self.nodes[0])
        for node in self.nodes[1:]:
            first.execute_command("CLUSTER", "MEET", HOST, node.port)
        _wait(self._check_met, timeout, "cluster meet", self._logs)
        if self.with_replicas:
            for replica, master in zip(self.nodes[self.masters_count :], masters, strict=True):
                self._client(replica).execute_command("CLUSTER", "REPLICATE", master.node_id)
                replica.master_id = master.node_id
        _wait(self._check_healthy, timeout, "cluster start", self._logs)

    # -- checks: each returns None when satisfied, else what is missing ------------------

    def _client(self, node: ClusterNode) -> redis.Redis:
        return self._clients[node.port]

    def _live(self) -> list[ClusterNode]:
        return [node for node in self.nodes if node.alive()]

    def _views(self, node: ClusterNode) -> dict[str, _NodeView]:
        return _parse_cluster_nodes(self._client(node).execute_command("CLUSTER", "NODES"))

    def _raise_if_crashed(self) -> None:
        for node in self.nodes:
            process = node.server.process
            if process is not None and process.poll() is not None and process.returncode != -9:
                # Exited by itself (not our SIGKILL): the log says why; no point waiting.
                raise HarnessError(
                    f"{node} exited with {process.returncode}:\n{node.server.tail_log(20)}"
                )

    def _check_met(self) -> str | None:
        self._raise_if_crashed()
        for node in self.nodes:
            try:
                views = self._views(node)
            except redis.RedisError as exc:
                return f"{node}: {exc}"
            if len(views) != len(self.nodes):
                return f"{node} knows {len(views)} of {len(self.nodes)} nodes"
            for view in views.values():
                if view.flags & {"handshake", "noaddr"} or not view.connected:
                    return f"{node} sees {view.port} as {','.join(sorted(view.flags))}"
        return None

    def _check_healthy(self) -> str | None:
        """Every node up, agreeing on who replicates whom, all slots served, state ok, every
        node listed in CLUSTER SLOTS (what clients see), every replica's link up and every
        master streaming to its replicas (so WAIT answers at once)."""
        self._raise_if_crashed()
        expected: dict[str, str | None] | None = None
        for node in self.nodes:
            if not node.alive():
                return f"{node} is down"
            client = self._client(node)
            try:
                info = _parse_info(client.execute_command("CLUSTER", "INFO"))
                views = self._views(node)
            except redis.RedisError as exc:
                return f"{node}: {exc}"
            if info.get("cluster_state") != "ok":
                return f"{node}: cluster_state:{info.get('cluster_state')}"
            if info.get("cluster_slots_ok") != str(REDIS_CLUSTER_HASH_SLOTS):
                return f"{node}: cluster_slots_ok:{info.get('cluster_slots_ok')}"
            if len(views) != len(self.nodes):
                return f"{node} knows {len(views)} of {len(self.nodes)} nodes"
            for view in views.values():
                if view.flags & {"fail", "fail?", "handshake", "noaddr"} or not view.connected:
                    return f"{node} sees {view.port} as {','.join(sorted(view.flags))}"
            roles = {
                v.node_id: v.master_id if v.role == "replica" else None for v in views.values()
            }
            if expected is None:
                expected = roles
            elif roles != expected:
                return f"{node} disagrees on the roles: {roles} != {expected}"
            # What clients see: CLUSTER SLOTS must list every node, replicas included.
            try:
                slots = client.execute_command("CLUSTER SLOTS")
            except redis.RedisError as exc:
                return f"{node}: {exc}"
            listed = {entry[2] for item in slots for entry in item[2:]}
            if len(listed) != len(self.nodes):
                return f"{node} lists {len(listed)} of {len(self.nodes)} nodes in CLUSTER SLOTS"
        assert expected is not None
        if self.with_replicas:
            served = {v for v in expected.values() if v is not None}
            masters = [n for n, m in expected.items() if m is None]
            if sorted(served) != sorted(masters):
                return f"not every master has a replica: {expected}"
        for node in self.nodes:
            master_id = expected.get(node.node_id)
            try:
                replication = self._client(node).info("replication")
            except redis.RedisError as exc:
                return f"{node}: {exc}"
            if master_id is not None:
                if replication.get("master_link_status") != "up":
                    status = replication.get("master_link_status")
                    return f"replica {node}: master_link_status:{status}"
                continue
            count = sum(1 for m in expected.values() if m == node.node_id)
            problem = _replicas_not_streaming(replication, count)
            if problem:
                return f"master {node}: {problem}"
        return None

    def _logs(self, lines: int = 15) -> str:
        return "\n".join(
            f"--- {node} log ---\n{node.server.tail_log(lines)}" for node in self.nodes
        )


# --------------------------------------------------------------------------------------------
# Sentinel


class _SentinelProcess(_Server):
    """A server in sentinel mode: the config file must come first and must be writable, since
    the sentinel rewrites it with what it learns."""

    def __init__(
        self,
        binary: str,
        *,
        port: int,
        directory: str,
        service: str,
        master_port: int,
        down_after_ms: int,
        failover_timeout_ms: int,
    ) -> None:
        super().__init__(binary, port=port, directory=directory)
        self.config_path = Path(directory) / f"sentinel-{port}.conf"
        self.config_path.write_text(
            "\n".join(
                [
                    f"port {port}",
                    f"bind {HOST}",
                    "daemonize no",
                    f'dir "{directory}"',
                    f'logfile "{self.log_path}"',
                    f"sentinel monitor {service} {HOST} {master_port} 1",
                    f"sentinel down-after-milliseconds {service} {down_after_ms}",
                    f"sentinel failover-timeout {service} {failover_timeout_ms}",
                    f"sentinel parallel-syncs {service} 1",
                    "",
                ]
            )
        )

    def command(self) -> list[str]:
        return [self.binary, str(self.config_path), "--sentinel"]


class LocalSentinel:
    """A master, a replica and one sentinel (quorum 1) watching them, on loopback.

    ``url`` is Tether's ``redis+sentinel://`` URL. ``kill_master()``, ``wait_for_failover()``,
    then ``heal()`` restarts the dead server as a replica of the new master.
    """

    def __init__(
        self,
        binary: str,
        *,
        service: str = "mymaster",
        down_after_ms: int = 1000,
        failover_timeout_ms: int = 5000,
    ) -> None:
        self.binary = binary
        self.service = service
        self.down_after_ms = down_after_ms
        self.failover_timeout_ms = failover_timeout_ms
        self.directory = Path(tempfile.mkdtemp(prefix="tether-sentinel-"))
        self.master: EmbeddedServer | None = None
        self.replica: EmbeddedServer | None = None
        self.sentinel: EmbeddedServer | None = None
        self._sentinel_client: redis.Redis | None = None
        self._clients: dict[int, redis.Redis] = {}
        self._suspect = False
        self.startup_seconds = 0.0

    @property
    def url(self) -> str:
        assert self.sentinel is not None
        return f"redis+sentinel://{HOST}:{self.sentinel.port}/{self.service}"

    @property
    def sentinel_address(self) -> tuple[str, int]:
        assert self.sentinel is not None
        return (HOST, self.sentinel.port)

    def start(self, timeout: float = 30.0) -> LocalSentinel:
        began = time.monotonic()
        try:
            self.master = self._server(None, timeout)
            self.replica = self._server(self.master.port, timeout)
            folder = self.directory / "sentinel"
            folder.mkdir()
            master_port = self.master.port

            def make() -> EmbeddedServer:
                return _SentinelProcess(
                    self.binary,
                    port=free_port(),
                    directory=str(folder),
                    service=self.service,
                    master_port=master_port,
                    down_after_ms=self.down_after_ms,
                    failover_timeout_ms=self.failover_timeout_ms,
                )

            self.sentinel = _start_with_retries(make, timeout)
            self._sentinel_client = _admin_client(self.sentinel.port)
            # The sentinel pings every min(down-after, 1 s) and, on a new link (at start, and to
            # a new master after a failover), counts the wait for the first PONG from the link's
            # creation: with down-after at 1 s its first ping goes out just as that wait passes
            # 1 s, so it can flag a healthy master down and fail over again (seen with Valkey 9).
            # Pinging every 300 ms closes that race. Not less: a replica is only promoted if
            # its last INFO reply is younger than 5 ping periods, and INFO goes every 1 s during
            # a failover (at 100 ms: "-failover-abort-no-good-slave"). The sentinel finds
            # replicas in the master's INFO, read every 10 s by default: every 1 s, a restarted
            # replica is known again quickly. SENTINEL DEBUG exists since Redis 7.0.
            with contextlib.suppress(redis.ResponseError):
                self._sentinel().execute_command(
                    "SENTINEL", "DEBUG", "ping-period", 300, "info-period", 1000
                )
            self._nudge_replication(timeout)
            _wait(self._check_ready, timeout, "sentinel start", self._logs)
        except BaseException:
            self.stop()
            raise
        self.startup_seconds = time.monotonic() - began
        return self

    def stop(self) -> None:
        if self._sentinel_client is not None:
            self._sentinel_client.close()
            self._sentinel_client = None
        for client in self._clients.values():
            client.close()
        self._clients.clear()
        _terminate([s for s in (self.sentinel, self.master, self.replica) if s is not None])
        shutil.rmtree(self.directory, ignore_errors=True)

    def __enter__(self) -> LocalSentinel:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def kill_master(self) -> EmbeddedServer:
        """SIGKILL the current master by PID; returns it."""
        assert self.master is not None and self.master.process is not None
        self._suspect = True
        process = self.master.process
        os.kill(process.pid, signal.SIGKILL)
        process.wait(10)
        return self.master

    def wait_for_failover(self, timeout: float = 15.0) -> EmbeddedServer:
        """Wait until the sentinel has switched to the replica and the replica is master; the
        sentinel then forgets the dead ex-master (SENTINEL RESET, so ``discover_slaves`` is
        empty until the next heal). Swaps ``master`` and ``replica``; returns the new master."""
        assert self.replica is not None
        replica = self.replica

        def check() -> str | None:
            # Not GET-MASTER-ADDR-BY-NAME: it names the promoted replica before the failover
            # ends. SENTINEL MASTER shows the new address only after +switch-master, and a
            # restart of the ex-master (heal) must wait for that.
            try:
                master = self._sentinel().execute_command("SENTINEL", "MASTER", self.service)
                info = self._replication(replica.port)
            except redis.RedisError as exc:
                return str(exc)
            fields = _pairs(master)
            if int(fields.get("port", 0)) != replica.port or fields.get("flags") != "master":
                return f"sentinel's master is port {fields.get('port')} ({fields.get('flags')})"
            if info.get("role") != "master":
                return f"replica {replica.port} has role {info.get('role')}"
            return None

        _wait(check, timeout, "sentinel failover", self._logs)
        # The sentinel now lists the dead ex-master as a replica and keeps calling on its port;
        # whatever binds that free port next (another test session's server, say) would be
        # made a replica of our master and flushed. A reset makes it forget the dead address;
        # it rediscovers the live replicas from the master's INFO.
        self._sentinel().execute_command("SENTINEL", "RESET", self.service)
        self.master, self.replica = self.replica, self.master
        return self.master

    def heal(self, timeout: float = 30.0) -> None:
        """Finish a failover a test started, restart the dead ex-master as a replica of the
        current master and wait until the sentinel sees it healthy."""
        assert self.master is not None and self.replica is not None
        if self.master.process is not None and self.master.process.poll() is not None:
            self.wait_for_failover(timeout)  # swaps master and replica
        replica_alive = self.replica.process is not None and self.replica.process.poll() is None
        if replica_alive and not self._suspect:
            return
        self._suspect = True
        if not replica_alive:
            old = self.replica
            self.replica = _Server(
                self.binary,
                port=old.port,
                directory=old.directory,
                args=["--replicaof", HOST, str(self.master.port), *_REPLICATION_ARGS],
            )
            try:
                self.replica.start(timeout)
            except TetherError as exc:
                raise HarnessError(f"restarting the replica: {exc}") from exc
        self._nudge_replication(timeout)
        _wait(self._check_ready, timeout, "sentinel heal", self._logs)
        self._suspect = False

    def healthy(self) -> bool:
        servers = (self.master, self.replica, self.sentinel)
        if any(s is None or s.process is None or s.process.poll() is not None for s in servers):
            return False
        return self._check_ready() is None

    def tail_logs(self, lines: int = 15) -> str:
        return self._logs(lines)

    # -- internals -----------------------------------------------------------------------

    def _server(self, master_port: int | None, timeout: float) -> EmbeddedServer:
        folder = self.directory / ("master" if master_port is None else "replica")
        folder.mkdir()
        args = list(_REPLICATION_ARGS)
        if master_port is not None:
            args += ["--replicaof", HOST, str(master_port)]
        return _start_with_retries(
            lambda: _Server(self.binary, port=free_port(), args=args, directory=str(folder)),
            timeout,
        )

    def _sentinel(self) -> redis.Redis:
        assert self._sentinel_client is not None
        return self._sentinel_client

    def _nudge_replication(self, timeout: float) -> None:
        """Have the replica acknowledge a write, so the master streams to it (see
        :func:`_replicas_not_streaming`) within a replica ACK rather than a ping and an ACK.
        A PUBLISH is replicated (outside cluster mode) and touches no key; WAIT makes the master
        ask the replica for its ACK at once."""
        assert self.master is not None
        deadline = time.monotonic() + timeout
        client = self._client(self.master.port)
        while time.monotonic() < deadline:
            try:
                client.publish("__tether_harness__", "sync")
                if client.execute_command("WAIT", 1, 200) >= 1:
                    return
            except redis.RedisError:
                pass
            time.sleep(0.05)

    def _client(self, port: int) -> redis.Redis:
        if port not in self._clients:
            self._clients[port] = _admin_client(port)
        return self._clients[port]

    def _replication(self, port: int) -> dict[str, Any]:
        return dict(self._client(port).info("replication"))

    def _check_ready(self) -> str | None:
        """The replica linked to the master, and the sentinel knowing both as healthy: a
        failover needs a replica the sentinel has seen up recently."""
        assert self.master is not None and self.replica is not None
        for server in (self.master, self.replica, self.sentinel):
            assert server is not None
            if server.process is None or server.process.poll() is not None:
                raise HarnessError(f"{server.binary} on {server.port} exited:\n{self._logs()}")
        try:
            info = self._replication(self.replica.port)
            problem = _replicas_not_streaming(self._replication(self.master.port), 1)
            master = self._sentinel().execute_command("SENTINEL", "MASTER", self.service)
            replicas = self._sentinel().execute_command("SENTINEL", "REPLICAS", self.service)
        except redis.RedisError as exc:
            return str(exc)
        if info.get("master_link_status") != "up":
            return f"replica link {info.get('master_link_status')}"
        if problem:
            return f"master: {problem}"
        master_fields = _pairs(master)
        if int(master_fields.get("port", 0)) != self.master.port:
            return f"sentinel's master is port {master_fields.get('port')}"
        if master_fields.get("flags") != "master":
            return f"sentinel flags the master {master_fields.get('flags')}"
        for item in replicas:
            fields = _pairs(item)
            if int(fields.get("port", 0)) == self.replica.port:
                if fields.get("flags") != "slave" or fields.get("master-link-status") != "ok":
                    return f"sentinel sees the replica as {fields}"
                return None
        return f"sentinel does not know replica {self.replica.port} yet"

    def _logs(self, lines: int = 15) -> str:
        servers = [("master", self.master), ("replica", self.replica), ("sentinel", self.sentinel)]
        return "\n".join(
            f"--- {name} {server.port} log ---\n{server.tail_log(lines)}"
            for name, server in servers
            if server is not None
        )


def _pairs(item: Any) -> dict[str, str]:
    """A SENTINEL MASTER/REPLICAS entry: a flat [key, value, ...] list (RESP2) or a dict."""
    if isinstance(item, dict):
        return {str(k): str(v) for k, v in item.items()}
    return {str(k): str(v) for k, v in zip(item[::2], item[1::2], strict=True)}


# --------------------------------------------------------------------------------------------
# Fixture bodies for conftest.py


def cluster_fixture(kind: str) -> Iterator[LocalCluster]:
    """Body of a session-scoped fixture: a cluster of ``kind`` for the whole session."""
    with LocalCluster(binary_for(kind)) as cluster:
        yield cluster


def sentinel_fixture(kind: str) -> Iterator[LocalSentinel]:
    """Body of a session-scoped fixture: a sentinel set-up of ``kind`` for the whole session."""
    with LocalSentinel(binary_for(kind)) as sentinel:
        yield sentinel


SetUp = TypeVar("SetUp", LocalCluster, LocalSentinel)


def healed(setup: SetUp) -> Iterator[SetUp]:
    """Body of a per-test fixture over a session set-up: heals what an earlier test killed
    first. Healing lazily, before the next test that needs it, spares the restart after the
    last killing test of the session (about a second each)."""
    setup.heal()
    yield setup
