"""TetherBroker with taskiq's receiver in this process, against the real servers: labels
(priority, delay, dedup key), failures and taskiq retries (SimpleRetryMiddleware and
SmartRetryMiddleware's delays), dead letters that ``tether dead`` tools read and retry,
suspects handed to taskiq alone, bad input, settings, Sentinel."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import itertools
import json
import re
import time
from collections.abc import AsyncGenerator, AsyncIterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import redis
from taskiq import AckableMessage, SimpleRetryMiddleware, SmartRetryMiddleware
from taskiq.abc.serializer import TaskiqSerializer
from taskiq.api import run_receiver_task
from taskiq.exceptions import SendTaskError
from taskiq.kicker import AsyncKicker
from taskiq.receiver import Receiver

from tether import ConfigError, EnqueueError, WorkerSettings
from tether.base._embedded import free_port
from tether.contrib.taskiq import TetherBroker, TetherMiddleware, current_delivery
from tether.protocol._keys import GROUP, QueueKeys

from ..helpers import FAST, eventually
from ..servers import LocalSentinel

pytestmark = pytest.mark.compat  # on every server kind: see tests/compat.py


def make_broker(url: str, namespace: str, **options: Any) -> TetherBroker:
    return TetherBroker(url, namespace=namespace, **{**FAST, "max_pending": 8, **options})


@contextlib.asynccontextmanager
async def receiving(broker: TetherBroker, max_async_tasks: int = 8) -> AsyncIterator[Receiver]:
    """taskiq's receiver, as ``taskiq worker`` runs it, until the block ends."""
    broker.is_worker_process = True
    finish = asyncio.Event()
    receiver = Receiver(broker, max_async_tasks=max_async_tasks)
    listening = asyncio.create_task(receiver.listen(finish))
    await eventually(lambda: broker.tether_consumer is not None and broker.tether_consumer.ready)
    try:
        yield receiver
    finally:
        finish.set()
        await asyncio.wait_for(listening, 20)
        await broker.shutdown()


def dead_letters(rds: redis.Redis, namespace: str) -> list[dict[bytes, bytes]]:
    return [fields for _, fields in rds.xrange(QueueKeys.of(namespace, "taskiq").dead)]


def leftovers(rds: redis.Redis, namespace: str) -> int:
    keys = QueueKeys.of(namespace, "taskiq")
    return sum(int(rds.xlen(s)) for s in keys.streams) + int(rds.hlen(keys.index))


async def test_priorities_delays_and_the_delivery_a_task_sees(
    url: str, namespace: str, rds: redis.Redis
) -> None:
    broker = make_broker(url, namespace, max_pending=1)
    order: list[str] = []
    seen: list[Any] = []

    @broker.task(task_name="note")
    async def note(tag: str) -> None:
        order.append(tag)
        seen.append(current_delivery())

    await broker.startup()
    await note.kicker().with_labels(delay=0.4).kiq("later")
    for priority in ("low", "normal", "high"):
        await note.kicker().with_labels(priority=priority).kiq(priority)
    assert rds.zcard(QueueKeys.of(namespace, "taskiq").delayed) == 1
    async with receiving(broker, max_async_tasks=1):
        await eventually(lambda: len(order) == 4, timeout=10)
    assert order == ["high", "normal", "low", "later"]
    first = seen[0]
    assert (first.queue, first.priority, first.deliveries) == ("taskiq", "high", 1)
    assert first.task_id == f"taskiq:1-{first.entry_id}"
    assert current_delivery() is None
    assert leftovers(rds, namespace) == 0


async def test_bad_labels_fail_the_kick_with_the_label_named_and_write_nothing(
    url: str, namespace: str, rds: redis.Redis
) -> None:
    broker = make_broker(url, namespace)

    @broker.task(task_name="job")
    async def job() -> None: ...

    await broker.startup()
    try:
        for labels, words in (
            (
                {"priority": "urgent"},
                "label priority='urgent' must be 'high', 'normal' or "
                "'low', or a number (above 0: high, 0: normal, below 0: low)",
            ),
            (
                {"queue_name": "no spaces"},
                "label queue_name: queue 'no spaces' is not a valid name",
            ),
            ({"delay": "soon"}, "label delay='soon' must be a number of seconds"),
            ({"dedup_key": ""}, "label dedup_key='' must be text of 1 to 512 characters"),
            ({"dedup_key_ttl": 5}, "dedup_key_ttl is set without dedup_key"),
        ):
            with pytest.raises(SendTaskError) as caught:
                await job.kicker().with_labels(**labels).kiq()
            assert isinstance(caught.value.__cause__, EnqueueError)
            assert words in str(caught.value.__cause__)
    finally:
        await broker.shutdown()
    assert not rds.keys(f"*{namespace}*")


async def test_numeric_priorities_map_to_the_three_streams_by_their_sign(
    url: str, namespace: str, rds: redis.Redis
) -> None:
    """A number is a priority as on RabbitMQ (higher is more urgent; taskiq-redis ignores
    the label): above 0 high, 0 normal (an unlabelled message), below 0 low."""
    broker = make_broker(url, namespace, max_pending=1)
    order: list[str] = []

    @broker.task(task_name="note")
    async def note(tag: str) -> None:
        order.append(tag)

    await broker.startup()
    for priority in (-3, 0, 5, "7", 0.5, -0.5, "normal"):
        await note.kicker().with_labels(priority=priority).kiq(str(priority))
    keys = QueueKeys.of(namespace, "taskiq")
    assert [rds.xlen(keys.stream(p)) for p in ("high", "normal", "low")] == [3, 2, 2]
    async with receiving(broker, max_async_tasks=1):
        await eventually(lambda: len(order) == 7, timeout=10)
    assert order == ["5", "7", "0.5", "0", "normal", "-3", "-0.5"]
    assert leftovers(rds, namespace) == 0


async def test_the_queue_name_label_sends_a_message_to_that_queue_s_worker(
    url: str, namespace: str, rds: redis.Redis
) -> None:
    """As taskiq-redis sends a message to the stream its ``queue_name`` names, the label sends
    it to that Tether queue of the namespace, plain, delayed and deduplicated alike; the
    broker of that queue runs it and the producer's own queue stays empty."""
    producer = make_broker(url, namespace)
    emails = make_broker(url, namespace, queue="emails")
    sent: list[tuple[str, str]] = []

    for broker in (producer, emails):

        @broker.task(task_name="send_email")
        async def send_email(to: str) -> None:
            delivery = current_delivery()
            assert delivery is not None
            sent.append((to, delivery.queue))

    await producer.startup()

    def kicker(**labels: Any) -> AsyncKicker[Any, Any]:
        return AsyncKicker("send_email", producer, {"queue_name": "emails", **labels})

    await kicker().kiq("a@example.com")
    await kicker(delay=0.2).kiq("b@example.com")
    first = await kicker(dedup_key="c").kiq("c@example.com")
    again = await kicker(dedup_key="c").kiq("c@example.com")
    assert again.task_id == first.task_id  # the duplicate was refused in the queue named
    assert leftovers(rds, namespace) == 0  # nothing in the producer's queue
    email_keys = QueueKeys.of(namespace, "emails")
    assert rds.xlen(email_keys.stream("normal")) == 2 and rds.zcard(email_keys.delayed) == 1
    async with receiving(emails):
        await eventually(lambda: len(sent) == 3, timeout=10)
    await producer.shutdown()
    assert sorted(sent) == [(f"{c}@example.com", "emails") for c in "abc"]
    assert sum(int(rds.xlen(s)) for s in email_keys.streams) == 0


async def test_code_reading_listen_itself_may_await_the_ack_or_call_it(
    url: str, namespace: str, rds: redis.Redis
) -> None:
    """taskiq's AckableMessage takes a sync or an async ack, so code that reads
    ``broker.listen()`` itself (taskiq-redis's tests do) writes ``await message.ack()``."""
    broker = make_broker(url, namespace)

    @broker.task(task_name="job")
    async def job(n: int) -> None: ...

    await broker.startup()
    await job.kiq(1)
    await job.kiq(2)
    got: list[bytes] = []
    async with contextlib.aclosing(broker.listen()) as messages:
        async for message in messages:
            got.append(message.data)
            if len(got) == 1:
                await message.ack()
            else:
                message.ack()  # a plain call acknowledges too
                break
    assert [broker.formatter.loads(data).args for data in got] == [[1], [2]]
    await broker.shutdown()
    assert leftovers(rds, namespace) == 0  # both acks were taken: the entries are settled
    # as done: the companion middleware saw neither start (no receiver ran them), yet a
    # message whose bytes parse is no message the receiver skipped as unreadable.
    assert dead_letters(rds, namespace) == []


async def test_code_reading_listen_gets_any_task_name_and_an_unknown_one_is_dead_lettered(
    url: str, namespace: str, rds: redis.Redis
) -> None:
    """As taskiq-redis does, listen() hands over a message whatever its task name (its own
    stream-broker tests kick random names and read them back). A message no task of the
    broker's handles still ends in the dead letters with the reason once it is acknowledged
    unrun, as when taskiq's receiver skips it; the known one is done."""
    broker = make_broker(url, namespace)

    @broker.task(task_name="known")
    async def known() -> None: ...

    await broker.startup()
    await AsyncKicker("nobody.has.this", broker, {}).kiq()
    await known.kiq()
    names: list[str] = []
    async with contextlib.aclosing(broker.listen()) as messages:
        async for message in messages:
            names.append(broker.formatter.loads(message.data).task_name)
            await message.ack()
            if len(names) == 2:
                break
    await broker.shutdown()
    assert names == ["nobody.has.this", "known"]
    assert leftovers(rds, namespace) == 0
    (letter,) = dead_letters(rds, namespace)
    assert (
        letter[b"reason"]
        .decode()
        .startswith(
            "unknown task 'nobody.has.this': this taskiq worker has no task by that name; it was "
            "acknowledged without being run"
        )
    )


async def test_without_the_middleware_an_unknown_name_is_dead_lettered_before_taskiq(
    url: str, namespace: str, rds: redis.Redis
) -> None:
    """Without the companion middleware an ack cannot tell a run from a message taskiq's
    receiver dropped unrun, so a name no task of the broker's has never reaches it."""
    broker = make_broker(url, namespace)
    broker.middlewares = [m for m in broker.middlewares if not isinstance(m, TetherMiddleware)]
    ran: list[str] = []

    @broker.task(task_name="known")
    async def known(tag: str) -> None:
        ran.append(tag)

    await broker.startup()
    await AsyncKicker("nobody.has.this", broker, {}).kiq()
    await known.kiq("fine")
    async with receiving(broker):
        await eventually(lambda: len(dead_letters(rds, namespace)) == 1 and ran, timeout=10)
    (letter,) = dead_letters(rds, namespace)
    assert letter[b"reason"].decode() == (
        "unknown task 'nobody.has.this': this taskiq worker has no task by that name"
    )
    assert ran == ["fine"]
    assert leftovers(rds, namespace) == 0


async def test_receivers_share_a_broker_and_a_later_one_listens_again(
    url: str, namespace: str, rds: redis.Redis, caplog: pytest.LogCaptureFixture
) -> None:
    """Two receivers on one started broker (one through taskiq's ``run_receiver_task``, which
    listens again at once whenever listening fails) both serve it, the second goes on when
    the first stops, and a receiver started after both ended gets the next message: no
    listener is refused, so nothing spins."""
    broker = make_broker(url, namespace)
    ran: list[str] = []

    @broker.task(task_name="note")
    async def note(tag: str) -> None:
        await asyncio.sleep(0.05)
        ran.append(tag)

    await broker.startup()
    broker.is_worker_process = True
    first_done = asyncio.Event()
    first = asyncio.create_task(Receiver(broker, max_async_tasks=2).listen(first_done))
    second = asyncio.create_task(run_receiver_task(broker, max_async_tasks=2))
    await eventually(lambda: broker.tether_consumer is not None and broker.tether_consumer.ready)
    await eventually(lambda: broker.tether_consumer.listeners == 2)  # type: ignore[union-attr]
    for i in range(8):
        await note.kiq(f"a{i}")
    await eventually(lambda: len(ran) == 8, timeout=10)
    first_done.set()
    await asyncio.wait_for(first, 10)
    await note.kiq("b")
    await eventually(lambda: "b" in ran, timeout=10)
    second.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await second
    await note.kiq("c")  # kicked while nobody listens
    third_done = asyncio.Event()
    third = asyncio.create_task(Receiver(broker, max_async_tasks=2).listen(third_done))
    await eventually(lambda: "c" in ran, timeout=10)
    third_done.set()
    await asyncio.wait_for(third, 10)
    await broker.shutdown()
    assert sorted(ran) == sorted([f"a{i}" for i in range(8)] + ["b", "c"])
    spins = [r for r in caplog.records if "Exception found while listening" in r.getMessage()]
    assert not spins
    assert leftovers(rds, namespace) == 0


async def test_a_listener_after_a_failed_one_waits_before_starting_again(
    url: str, namespace: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A listener that cannot start (here: a server that is not there) fails; taskiq's
    ``run_receiver_task`` then listens again at once, forever. Each new start waits longer
    (``reconnect_delay``), so a second holds a few attempts, not thousands."""
    port = free_port()
    broker = TetherBroker(
        f"redis://127.0.0.1:{port}/0", namespace=namespace,
        **{**FAST, "give_up_after": 0.1, "reconnect_max_delay": 0.4},
    )  # fmt: skip

    @broker.task(task_name="note")
    async def note() -> None: ...

    runner = asyncio.create_task(run_receiver_task(broker))
    await asyncio.sleep(2.0)
    runner.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await runner
    await broker.shutdown()
    failed = [r for r in caplog.records if "Exception found while listening" in r.getMessage()]
    assert 2 <= len(failed) <= 12, len(failed)


async def test_a_dedup_key_keeps_one_task_and_a_duplicate_kick_returns_its_handle(
    url: str, namespace: str, rds: redis.Redis
) -> None:
    broker = make_broker(url, namespace)
    ran: list[int] = []

    @broker.task(task_name="sync_account")
    async def sync_account(n: int) -> None:
        ran.append(n)

    await broker.startup()
    first = await sync_account.kicker().with_labels(dedup_key="acct-7").kiq(1)
    second = await sync_account.kicker().with_labels(dedup_key="acct-7").kiq(2)
    assert second.task_id == first.task_id  # the task that holds the key
    dedup = QueueKeys.of(namespace, "taskiq").dedup("acct-7")
    assert rds.exists(dedup)
    async with receiving(broker):
        await eventually(lambda: ran == [1])
        await eventually(lambda: not rds.exists(dedup))  # released by the fenced ack
        third = await sync_account.kicker().with_labels(dedup_key="acct-7").kiq(3)
        assert third.task_id != first.task_id
        await eventually(lambda: ran == [1, 3])
    assert leftovers(rds, namespace) == 0


async def test_a_failure_taskiq_does_not_retry_goes_to_the_dead_letters_and_retries_from_there(
    url: str, namespace: str, rds: redis.Redis
) -> None:
    broker = make_broker(url, namespace).with_middlewares(
        SimpleRetryMiddleware(default_retry_count=2)
    )
    attempts: list[str] = []

    @broker.task(task_name="charge", retry_on_error=True)
    async def charge(order: str) -> str:
        attempts.append(order)
        if len(attempts) <= 2:  # fails twice: the first attempt and taskiq's retry
            raise RuntimeError(f"card declined for {order}")
        return order

    await broker.startup()
    await charge.kiq("o-1")
    async with receiving(broker):
        await eventually(lambda: dead_letters(rds, namespace), timeout=10)
        (letter,) = dead_letters(rds, namespace)
        assert letter[b"status"] == b"failed"
        assert letter[b"reason"] == (
            b"failed and taskiq did not retry it: RuntimeError: card declined for o-1"
        )
        error = json.loads(letter[b"error"])
        assert error["type"] == "RuntimeError" and "card declined" in error["traceback"]
        assert attempts == ["o-1", "o-1"]  # the retry was not dead-lettered
        consumer = broker.tether_consumer
        assert consumer is not None
        assert (consumer.counters.retried, consumer.counters.failed) == (1, 1)
        # `tether dead retry` puts it back; this time it succeeds.
        letters = broker.dead_letters()
        (listed,) = await letters.list()
        assert listed.task == "charge" and listed.status == "failed"
        await letters.retry(listed.entry_id)
        await eventually(lambda: len(attempts) == 3, timeout=10)
        assert await letters.count() == 0
    assert leftovers(rds, namespace) == 0


async def test_entries_that_cannot_run_go_to_the_dead_letters_with_a_reason(
    url: str, namespace: str, rds: redis.Redis
) -> None:
    broker = make_broker(url, namespace)
    ran: list[str] = []

    @broker.task(task_name="known")
    async def known(tag: str) -> None:
        ran.append(tag)

    keys = QueueKeys.of(namespace, "taskiq")
    stream = keys.stream("normal")
    rds.xadd(stream, {"m": b"\xff not an envelope"})
    rds.xadd(stream, {"m": json.dumps({"v": 1, "task": "t", "args": [], "enq": 0})})
    rds.xadd(stream, {"other": "no payload field"})
    await broker.startup()
    await AsyncKicker("nobody.has.this", broker, {}).kiq()
    # A message taskiq's receiver cannot parse: a valid envelope around bad taskiq bytes.
    envelope = {"v": 1, "task": "known", "args": [], "enq": 0,
                "taskiq": {"id": "x1", "message": "{not json"}}  # fmt: skip
    rds.xadd(stream, {"m": json.dumps(envelope)})
    await known.kiq("fine")
    async with receiving(broker):
        await eventually(lambda: len(dead_letters(rds, namespace)) == 5 and ran, timeout=10)
    reasons = [letter[b"reason"].decode() for letter in dead_letters(rds, namespace)]
    expected = [
        "the payload is not UTF-8 text",
        "the envelope carries no 'taskiq' object: it is not a taskiq message",
        "the entry has no 'm' field",
        "unknown task 'nobody.has.this': this taskiq worker has no task by that name",
        "taskiq's receiver acknowledged it without running it: it could not parse the message",
    ]
    assert len(reasons) == len(expected)
    for reason, start in zip(reasons, expected, strict=True):
        assert reason.startswith(start), reasons
    assert ran == ["fine"]
    assert leftovers(rds, namespace) == 0
    assert not rds.xpending(stream, GROUP)["pending"]


async def test_smart_retry_middleware_s_delays_are_kept_and_nothing_is_dead_lettered(
    url: str, namespace: str, rds: redis.Redis
) -> None:
    """taskiq's SmartRetryMiddleware re-kicks a failed task with the same taskiq id and a
    ``delay`` label (0.3 s, then 0.6 s with its exponent): each retry waits in Tether's
    delayed set for that long, runs once, and the final success leaves no dead letter."""
    broker = make_broker(url, namespace).with_middlewares(
        SmartRetryMiddleware(default_retry_count=3, default_delay=0.3, use_delay_exponent=True)
    )
    starts: list[float] = []
    seen: list[Any] = []

    @broker.task(task_name="sync_inventory", retry_on_error=True)
    async def sync_inventory(sku: str) -> str:
        starts.append(time.time())
        seen.append(current_delivery())
        if len(starts) < 3:
            raise RuntimeError(f"supplier down for {sku}")
        return sku

    keys = QueueKeys.of(namespace, "taskiq")
    await broker.startup()
    kicked = await sync_inventory.kiq("sku-1")
    async with receiving(broker):
        await eventually(lambda: len(starts) == 1, timeout=10)
        await eventually(lambda: rds.zcard(keys.delayed) == 1)  # the retry waits there
        await eventually(lambda: len(starts) == 3, timeout=15)
        consumer = broker.tether_consumer
        assert consumer is not None
        await eventually(lambda: consumer.counters.succeeded == 1)  # the last ack went out
        await asyncio.sleep(1.0)  # time enough for a wrongly scheduled fourth run
        counters = consumer.counters
        assert (counters.retried, counters.failed, counters.dead_lettered) == (2, 0, 0)
        assert counters.succeeded == 1, "a retried attempt was counted as a success"
    assert len(starts) == 3
    gaps = [later - earlier for earlier, later in itertools.pairwise(starts)]
    for gap, delay in zip(gaps, (0.3, 0.6), strict=True):
        assert delay - 0.01 <= gap <= delay + 1.0, gaps
    # The first run was a plain kick; each retry a delayed message with a Tether id of its
    # own around the same taskiq id.
    ids = [d.task_id for d in seen]
    assert ids[0].startswith("taskiq:2-")
    assert all(i.startswith(f"taskiq:{kicked.task_id}.") for i in ids[1:]) and ids[1] != ids[2]
    assert [d.deliveries for d in seen] == [1, 1, 1]
    assert not dead_letters(rds, namespace)
    assert leftovers(rds, namespace) == 0 and rds.zcard(keys.delayed) == 0


class Watched(TetherBroker):
    """Notes each message handed to taskiq's receiver and each ack, in order, by the first
    argument of the task."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.events: list[tuple[str, str]] = []

    async def listen(self) -> AsyncGenerator[AckableMessage, None]:
        async for message in super().listen():
            tag = str(self.formatter.loads(message.data).args[0])
            self.events.append(("handed", tag))
            yield AckableMessage(data=message.data, ack=self._noted(tag, message))

    def _noted(self, tag: str, message: AckableMessage) -> Any:
        def ack() -> Any:
            done = message.ack()
            self.events.append(("acked", tag))
            return done

        return ack


GHOST_TOOK_IT = """
local id = redis.call('XADD', KEYS[1], '*', 'm', ARGV[1])
local read = redis.call(
  'XREADGROUP', 'GROUP', ARGV[2], 'ghost', 'COUNT', 1, 'STREAMS', KEYS[1], '>')
redis.call('XCLAIM', KEYS[1], ARGV[2], 'ghost', 0, id, 'RETRYCOUNT', 2, 'JUSTID')
return {id, read[1][2][1][1]}
"""
"""An entry that a worker now gone (no lease) took and started twice, written in one atomic
step so that the live worker's own read cannot take it first."""


async def test_a_suspect_is_handed_to_taskiq_alone(
    url: str, namespace: str, rds: redis.Redis
) -> None:
    """An entry started twice by workers that died (a suspect) reaches taskiq's receiver only
    once nothing else is in its hands, and nothing else does until its ack, though taskiq
    could run 8 at once and other messages wait in the broker."""
    broker = Watched(url, namespace=namespace, **{**FAST, "max_pending": 16, "max_deliveries": 5})
    started: list[str] = []
    suspect_deliveries: list[int] = []

    @broker.task(task_name="step")
    async def step(tag: str, seconds: float) -> None:
        started.append(tag)
        if tag == "suspect":
            delivery = current_delivery()
            assert delivery is not None
            suspect_deliveries.append(delivery.deliveries)
        await asyncio.sleep(seconds)

    # The suspect's message, as kick() writes it (kicked to another queue, copied below).
    staging = TetherBroker(url, namespace=namespace, queue="staging")
    await staging.startup()
    await AsyncKicker("step", staging, {}).kiq("suspect", 1.5)
    await staging.shutdown()
    ((_, fields),) = rds.xrange(QueueKeys.of(namespace, "staging").stream("normal"))
    keys = QueueKeys.of(namespace, "taskiq")
    stream = keys.stream("normal")

    await broker.startup()
    for i in range(4):
        await step.kiq(f"before{i}", 0.8)
    async with receiving(broker, max_async_tasks=8):
        consumer = broker.tether_consumer
        assert consumer is not None

        def held_here() -> int:
            """Entries delivered to this worker and not acknowledged, on the three streams."""
            return sum(
                int(c["pending"])
                for s in keys.streams
                for c in rds.xpending(s, GROUP)["consumers"]
                if c["name"].decode() == consumer.name
            )

        await eventually(lambda: len(started) == 4)  # four running in taskiq's hands
        entry, read = rds.eval(GHOST_TOOK_IT, 1, stream, fields[b"m"], GROUP)
        assert entry == read
        await eventually(lambda: "suspect" in started, timeout=10)
        for i in range(4):  # more work arrives while the suspect runs
            await step.kicker().with_labels(priority="high").kiq(f"during{i}", 0.05)
        # They wait in the broker, delivered to this worker, while the suspect runs.
        await eventually(lambda: held_here() == 5, timeout=5)
        assert ("acked", "suspect") not in broker.events
        await eventually(lambda: len([e for e in broker.events if e[0] == "acked"]) == 9, 20)
    assert suspect_deliveries == [3]  # its start was counted when taskiq started it
    in_hands: set[str] = set()
    for kind, tag in broker.events:
        if kind == "handed":
            if tag == "suspect":
                assert not in_hands, f"the suspect was handed beside {in_hands}"
            assert "suspect" not in in_hands, f"{tag} was handed while the suspect ran"
            in_hands.add(tag)
        else:
            in_hands.discard(tag)
    handed = [t for k, t in broker.events if k == "handed"]
    assert handed[:4] == [f"before{i}" for i in range(4)] and handed[4] == "suspect"
    assert sorted(handed[5:]) == [f"during{i}" for i in range(4)]
    assert leftovers(rds, namespace) == 0


class BinarySerializer(TaskiqSerializer):
    """A serializer whose bytes are not UTF-8 (as msgpack's or CBOR's are not)."""

    def dumpb(self, value: Any) -> bytes:
        return b"\xff\x00" + json.dumps(value).encode()

    def loadb(self, value: bytes) -> Any:
        assert value.startswith(b"\xff\x00")
        return json.loads(value[2:])


async def test_a_binary_serializer_s_bytes_reach_taskiq_unchanged(
    url: str, namespace: str, rds: redis.Redis
) -> None:
    broker = make_broker(url, namespace).with_serializer(BinarySerializer())
    got: list[dict[str, int]] = []

    @broker.task(task_name="binary")
    async def binary(value: dict[str, int]) -> None:
        got.append(value)

    await broker.startup()
    await binary.kiq({"n": 7})
    ((_, fields),) = rds.xrange(QueueKeys.of(namespace, "taskiq").stream("normal"))
    carried = json.loads(fields[b"m"])["taskiq"]
    assert "message" not in carried
    assert base64.b64decode(carried["message_b64"]).startswith(b"\xff\x00")
    async with receiving(broker):
        await eventually(lambda: got == [{"n": 7}])
    assert leftovers(rds, namespace) == 0


def test_bad_settings_fail_when_the_broker_is_made() -> None:
    with pytest.raises(ConfigError, match=r"heartbeat_ttl=1\.0 must exceed heartbeat_interval"):
        TetherBroker("redis://localhost:1/0", heartbeat_interval=2, heartbeat_ttl=1)
    with pytest.raises(ConfigError, match="queue 'no spaces' is not a valid name"):
        TetherBroker("redis://localhost:1/0", queue="no spaces")
    with pytest.raises(ConfigError, match="max_pending=0"):
        TetherBroker("redis://localhost:1/0", max_pending=0)
    with pytest.raises(ConfigError, match="url scheme 'http' is unknown"):
        TetherBroker("http://localhost")
    with pytest.raises(ConfigError, match="ack_linger=-1"):
        TetherBroker("redis://localhost:1/0", ack_linger=-1)
    with pytest.raises(ConfigError, match="ack_linger=3 must stay below heartbeat_interval=2"):
        TetherBroker("redis://localhost:1/0", ack_linger=3)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"heartbeat_tll": 5}, "TetherBroker has no setting 'heartbeat_tll': did you mean "
                               "heartbeat_ttl?"),
        ({"socket_timout": 5}, "TetherBroker has no setting 'socket_timout': did you mean "
                               "socket_timeout?"),
        ({"connect_timeout": 5}, "'connect_timeout': it is 'give_up_after' now"),
        ({"settings": WorkerSettings(), "give_up_after": -1},
         "give_up_after=-1: must be more than zero"),
        ({"settings": WorkerSettings(heartbeat_interval=2), "heartbeat_ttl": 1},
         "heartbeat_ttl=1.0 must exceed heartbeat_interval=2.0"),
        ({"concurrency": 4}, "TetherBroker sets concurrency itself: taskiq runs the tasks "
                             "(--max-async-tasks): give max_pending="),
        ({"queues": ("a",)}, "TetherBroker sets queues itself: the broker serves one queue: "
                             "give queue="),
        ({"metrics_port": 9100}, "TetherBroker sets metrics_port itself"),
        ({"settings": {"heartbeat_ttl": 3}},
         "settings={'heartbeat_ttl': 3}: expected a tether.WorkerSettings"),
    ],
)  # fmt: skip
def test_bad_worker_settings_fail_when_the_broker_is_made(
    options: dict[str, Any], message: str
) -> None:
    """The worker side's options are WorkerSettings fields, checked by WorkerSettings."""
    with pytest.raises(ConfigError, match=re.escape(message)):
        TetherBroker("redis://localhost:1/0", **options)


async def test_the_worker_side_runs_on_the_settings_given(
    url: str, namespace: str, rds: redis.Redis, tmp_path: Path
) -> None:
    """``settings`` (one shared with ``tether worker``, say) with keywords over it; the broker
    sets its queue, its bound on what a process holds, no shutdown grace and no scheduler."""
    health = tmp_path / "health"
    shared = WorkerSettings(
        queues=("emails", "default"),
        concurrency=2,
        heartbeat_interval=timedelta(milliseconds=100),
        heartbeat_ttl=timedelta(seconds=30),
        reclaim_interval=0.2,
        stall_timeout=60,
        shutdown_grace=20,
        health_file=str(health),
    )
    broker = TetherBroker(
        url, namespace=namespace, settings=shared, max_pending=8,
        heartbeat_ttl=timedelta(seconds=2), give_up_after=timedelta(seconds=9),
    )  # fmt: skip
    done: list[int] = []

    @broker.task(task_name="job")
    async def job(i: int) -> None:
        done.append(i)

    await broker.startup()
    await job.kiq(1)
    async with receiving(broker):
        await eventually(lambda: done == [1])
        consumer = broker.tether_consumer
        assert consumer is not None
        s = consumer.settings
        assert (s.queues, s.concurrency, s.max_pending) == (("taskiq",), 8, 8)
        assert (s.shutdown_grace, s.scheduler) == (0.0, False)
        assert (s.heartbeat_interval, s.heartbeat_ttl, s.give_up_after) == (0.1, 2.0, 9.0)
        assert (s.reclaim_interval, s.stall_timeout) == (0.2, 60.0)
        # In effect: the lease lives heartbeat_ttl (2 s, not the shared 30 s); the
        # heartbeat touches the health file.
        lease = QueueKeys.of(namespace, "taskiq").lease(consumer.name)
        await eventually(lambda: 0 < rds.pttl(lease) <= 2000)
        await eventually(health.exists)
    assert shared.heartbeat_ttl == 30.0  # the shared settings are left as they were


@pytest.mark.cluster
async def test_sentinel_url(sentinel: LocalSentinel, namespace: str) -> None:
    broker = TetherBroker(sentinel.url, namespace=namespace, **{**FAST, "heartbeat_ttl": 2.0})
    done: list[int] = []

    @broker.task(task_name="job")
    async def job(i: int) -> None:
        done.append(i)

    await broker.startup()
    await job.kiq(1)
    async with receiving(broker):
        await eventually(lambda: done == [1], timeout=10)
