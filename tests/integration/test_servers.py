"""The cluster and sentinel harness of tests/servers.py works, checked with redis-py alone: a
cluster serves every slot range, a Streams consumer group works in one slot, a killed master's
replica takes over with the acknowledged writes, and a sentinel client follows a failover.
The ``cluster`` and ``sentinel`` fixtures (conftest.py) run each test on both binaries."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, TypeVar

import pytest
import redis
import redis.asyncio
import redis.asyncio.cluster
import redis.asyncio.sentinel
import redis.cluster
import redis.sentinel
from redis.crc import REDIS_CLUSTER_HASH_SLOTS, key_slot
from redis.exceptions import ClusterDownError, RedisClusterException

from tether.base._redis import parse_url

from ..servers import LocalCluster, LocalSentinel

T = TypeVar("T")

# While a master is down its slots answer nothing: the client reports the refused connection
# (it refreshes its slot map after each one) until the replica is promoted. MasterNotFoundError
# (sentinel) is a ConnectionError too.
TRANSIENT = (redis.ConnectionError, redis.TimeoutError, ClusterDownError)


async def until_ok(call: Callable[[], Awaitable[T]], timeout: float = 10.0) -> T:
    """Retry ``call`` through transient failover errors; re-raise the last one on timeout."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            return await call()
        except TRANSIENT:
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.05)


def keys_for_slots(slots: set[int], prefix: str) -> dict[int, str]:
    """A key hashing to each slot in ``slots`` (brute force: crc16 is cheap)."""
    found: dict[int, str] = {}
    i = 0
    while len(found) < len(slots):
        key = f"{prefix}{i}"
        slot = key_slot(key.encode())
        if slot in slots and slot not in found:
            found[slot] = key
        i += 1
    return found


@pytest.fixture
async def cluster_client(
    cluster: LocalCluster,
) -> AsyncIterator[redis.asyncio.cluster.RedisCluster]:
    nodes = [redis.asyncio.cluster.ClusterNode(h, p) for h, p in parse_url(cluster.url).nodes]
    client = redis.asyncio.cluster.RedisCluster(startup_nodes=nodes, decode_responses=True)
    yield client
    await client.aclose()


# --- Cluster ---------------------------------------------------------------------------------


@pytest.mark.cluster
async def test_cluster_serves_every_slot_range(
    cluster: LocalCluster, cluster_client: redis.asyncio.cluster.RedisCluster
) -> None:
    target = parse_url(cluster.url)
    assert target.kind == "cluster"
    assert list(target.nodes) == cluster.addresses
    masters = cluster.masters
    assert len(masters) == 3
    assert all(len(cluster.replicas_of(m)) == 1 for m in masters)
    ranges = sorted(r for m in masters for r in m.slots)
    assert ranges[0][0] == 0 and ranges[-1][1] == REDIS_CLUSTER_HASH_SLOTS - 1
    assert sum(end - start + 1 for start, end in ranges) == REDIS_CLUSTER_HASH_SLOTS

    # A key in the first and the last slot of every master's range.
    edges = {slot for m in masters for start, end in m.slots for slot in (start, end)}
    keys = keys_for_slots(edges, f"k{uuid.uuid4().hex[:8]}:")
    for key in keys.values():
        await cluster_client.set(key, key)
    assert [await cluster_client.get(k) for k in keys.values()] == list(keys.values())

    sync_client = redis.cluster.RedisCluster(
        startup_nodes=[redis.cluster.ClusterNode(h, p) for h, p in target.nodes],
        decode_responses=True,
    )
    try:
        assert [sync_client.get(k) for k in keys.values()] == list(keys.values())
        assert len(sync_client.get_primaries()) == 3 and len(sync_client.get_replicas()) == 3
    finally:
        sync_client.close()

    # Each key is where the harness says its slot is served.
    for slot, key in keys.items():
        master = cluster.master_for_key(key)
        assert master.serves(slot)
        with redis.Redis(port=master.port, decode_responses=True) as direct:
            assert direct.get(key) == key


@pytest.mark.cluster
async def test_stream_consumer_group_in_one_slot(
    cluster_client: redis.asyncio.cluster.RedisCluster,
) -> None:
    tag = f"{{q{uuid.uuid4().hex[:8]}}}"
    stream, dead = f"{tag}:stream", f"{tag}:dead"
    assert key_slot(stream.encode()) == key_slot(dead.encode())

    await cluster_client.xgroup_create(stream, "workers", id="0", mkstream=True)
    ids = [await cluster_client.xadd(stream, {"n": str(n)}) for n in range(3)]
    # RESP2 shape: [[stream, [(id, fields), ...]]] (typed loosely by redis-py, RESP3 differs).
    got: Any = await cluster_client.xreadgroup("workers", "w1", {stream: ">"}, count=2)
    assert [entry_id for entry_id, _ in got[0][1]] == ids[:2]
    assert await cluster_client.xack(stream, "workers", ids[0]) == 1
    # Another consumer takes over what w1 left pending.
    claimed: Any = await cluster_client.xautoclaim(stream, "workers", "w2", min_idle_time=0)
    assert [entry_id for entry_id, _ in claimed[1]] == [ids[1]]

    # A script over two keys of one slot: move an entry to a dead-letter stream atomically.
    script = """
        redis.call('XADD', KEYS[2], '*', 'id', ARGV[1])
        return redis.call('XACK', KEYS[1], 'workers', ARGV[1])
    """
    assert await cluster_client.eval(script, 2, stream, dead, ids[1]) == 1
    assert await cluster_client.xlen(dead) == 1
    assert (await cluster_client.xpending(stream, "workers"))["pending"] == 0

    # Keys in two slots: redis-py refuses before sending (the server would say CROSSSLOT).
    with pytest.raises(RedisClusterException, match="same key slot"):
        await cluster_client.eval(script, 2, stream, f"other{tag[1:-1]}", ids[2])


@pytest.mark.cluster
@pytest.mark.slow
async def test_replica_takes_over_a_killed_master_with_acknowledged_writes(
    cluster: LocalCluster, cluster_client: redis.asyncio.cluster.RedisCluster
) -> None:
    key = f"{{fo{uuid.uuid4().hex[:8]}}}:value"
    master = cluster.master_for_key(key)
    # WAIT counts the acknowledged writes of its own connection, so the write and the WAIT go
    # over one direct connection: the cluster client sends a keyless WAIT to its default node.
    async with (
        redis.asyncio.Redis(port=master.port) as direct,
        direct.pipeline(transaction=False) as pipe,
    ):
        pipe.set(key, "kept")
        pipe.execute_command("WAIT", 1, 1000)
        assert await pipe.execute() == [True, 1]
    assert await cluster_client.get(key) == "kept"  # the client has the slot map now
    replicas = {replica.node_id for replica in cluster.replicas_of(master)}

    began = time.monotonic()
    cluster.kill(master)
    promoted = cluster.wait_for_failover(master, timeout=10)
    assert promoted.node_id in replicas and promoted.serves(key_slot(key.encode()))
    assert await until_ok(lambda: cluster_client.get(key), timeout=5) == "kept"
    assert await cluster_client.set(key, "after")
    node = cluster_client.get_node_from_key(key)
    assert node is not None and node.port == promoted.port
    assert time.monotonic() - began < 10


# --- Sentinel --------------------------------------------------------------------------------


def test_sentinel_client_finds_master_and_replica(sentinel: LocalSentinel) -> None:
    target = parse_url(sentinel.url)
    assert target.kind == "sentinel" and target.service == "mymaster"
    assert sentinel.master is not None and sentinel.replica is not None
    client = redis.sentinel.Sentinel(list(target.nodes), socket_timeout=2)
    master = client.master_for(target.service, decode_responses=True)
    replica = client.slave_for(target.service, decode_responses=True)
    try:
        assert client.discover_master(target.service) == ("127.0.0.1", sentinel.master.port)
        assert client.discover_slaves(target.service) == [("127.0.0.1", sentinel.replica.port)]
        key = f"s{uuid.uuid4().hex[:8]}"
        with master.pipeline(transaction=False) as pipe:
            pipe.set(key, "v")
            pipe.execute_command("WAIT", 1, 1000)
            assert pipe.execute() == [True, 1]
        assert replica.get(key) == "v"
    finally:
        master.close()
        replica.close()
        for sentinel_client in client.sentinels:
            sentinel_client.close()


@pytest.mark.slow
async def test_sentinel_client_reaches_the_promoted_replica(sentinel: LocalSentinel) -> None:
    target = parse_url(sentinel.url)
    client = redis.asyncio.sentinel.Sentinel(list(target.nodes), socket_timeout=2)
    master: redis.asyncio.Redis = client.master_for(target.service, decode_responses=True)
    try:
        key = f"s{uuid.uuid4().hex[:8]}"
        async with master.pipeline(transaction=False) as pipe:
            pipe.set(key, "kept")
            pipe.execute_command("WAIT", 1, 1000)
            assert await pipe.execute() == [True, 1]

        began = time.monotonic()
        old = sentinel.kill_master()
        new = sentinel.wait_for_failover(timeout=10)
        assert new.port != old.port
        # The client asks the sentinel again after the refused connection.
        assert await until_ok(lambda: master.get(key), timeout=5) == "kept"
        assert await master.set(key, "after")
        assert await client.discover_master(target.service) == ("127.0.0.1", new.port)
        assert time.monotonic() - began < 10
    finally:
        await master.aclose()
        for sentinel_client in client.sentinels:
            await sentinel_client.aclose()
