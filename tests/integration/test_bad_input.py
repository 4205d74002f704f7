"""Bad entries go to the dead-letter stream with a reason and their payload; the worker
goes on."""

from __future__ import annotations

import json

import pytest
import redis

from tether import Tether
from tether.protocol._keys import QueueKeys

from ..helpers import eventually, running_worker

pytestmark = pytest.mark.compat  # on every server kind: see tests/compat.py


def dead_entries(rds: redis.Redis, keys: QueueKeys) -> list[dict[bytes, bytes]]:
    return [fields for _, fields in rds.xrange(keys.dead)]


@pytest.mark.parametrize(
    ("payload", "reason"),
    [
        (b"{not json", "cannot be decoded by the json serializer"),
        (b"[1, 2]", "is a list, not an envelope object"),
        (
            json.dumps({"v": 99, "id": "default:x", "task": "t"}).encode(),
            "unknown envelope version 99",
        ),
        (
            json.dumps(
                {
                    "v": 1,
                    "id": "default:y",
                    "task": "nobody.knows",
                    "args": [],
                    "kwargs": {},
                    "enq": 0,
                    "try": 1,
                    "opts": {},
                }
            ).encode(),
            "unknown task 'nobody.knows'",
        ),
        (json.dumps({"v": 1, "id": "default:z", "task": "x"}).encode(), "lacks the field 'args'"),
    ],
    ids=["undecodable", "not-an-object", "unknown-version", "unknown-task", "missing-field"],
)
async def test_bad_entry_is_dead_lettered_with_reason_and_payload(
    app: Tether, rds: redis.Redis, payload: bytes, reason: str
) -> None:
    done: list[str] = []

    @app.task
    async def good(tag: str) -> None:
        done.append(tag)

    keys = QueueKeys.of(app.namespace, "default")
    rds.xadd(keys.stream("normal"), {"m": payload})
    await good.enqueue("after")
    async with running_worker(app) as worker:
        await eventually(lambda: done == ["after"] and rds.xlen(keys.dead) == 1)
        assert worker.counters.dead_lettered == 1
    (entry,) = dead_entries(rds, keys)
    assert reason in entry[b"reason"].decode()
    assert entry[b"m"] == payload
    assert entry[b"status"] == b"dead"
    assert rds.xlen(keys.stream("normal")) == 0
    assert rds.xpending(keys.stream("normal"), "tether")["pending"] == 0


async def test_entry_without_payload_field_is_dead_lettered(app: Tether, rds: redis.Redis) -> None:
    keys = QueueKeys.of(app.namespace, "default")
    rds.xadd(keys.stream("high"), {"other": "x"})
    async with running_worker(app):
        await eventually(lambda: rds.xlen(keys.dead) == 1)
    (entry,) = dead_entries(rds, keys)
    assert b"no 'm' field" in entry[b"reason"]


async def test_dead_letter_stream_is_capped(url: str, namespace: str, rds: redis.Redis) -> None:
    app = Tether(url, namespace=namespace, dead_letter_maxlen=10)
    keys = QueueKeys.of(namespace, "default")
    for i in range(300):
        rds.xadd(keys.stream("normal"), {"m": f"garbage {i}"})
    async with app, running_worker(app, concurrency=8):
        await eventually(lambda: rds.xlen(keys.stream("normal")) == 0)
    # MAXLEN ~ trims whole nodes: the stream stays near the cap, never near 300.
    assert rds.xlen(keys.dead) <= 10 + 100
