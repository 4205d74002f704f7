"""OpenTelemetry tracing across real processes: the producer here, with the SDK's in-memory
exporter; the worker a real `tether worker` process whose app module (tests/apps/traced.py)
configures the SDK to write its finished spans to a JSON-lines file this test reads."""

from __future__ import annotations

import asyncio
import json
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from opentelemetry import baggage, trace
from opentelemetry import context as otel_context
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from tether import EnqueueError, Tether
from tether.contrib.opentelemetry import Tracing
from tether.testing import eager

from ..helpers import WorkerProcess, wait_until
from ..web_helpers import valkey_url  # noqa: F401  (a fixture)


@pytest.fixture
def url(valkey_url: str) -> str:  # noqa: F811  (the fixture of that name)
    """One server kind: tracing adds nothing the server kind changes."""
    return valkey_url


@pytest.fixture
def exporter() -> InMemorySpanExporter:
    return InMemorySpanExporter()


@pytest.fixture
def provider(exporter: InMemorySpanExporter) -> Iterator[TracerProvider]:
    """The producer's SDK, given to the middleware (the global provider stays unset)."""
    tracer_provider = TracerProvider()
    tracer_provider.add_span_processor(SimpleSpanProcessor(exporter))
    yield tracer_provider
    tracer_provider.shutdown()


@pytest.fixture
def producer(url: str, namespace: str, provider: TracerProvider) -> Tether:
    """The producer's app: it knows the worker's tasks by name only."""
    return Tether(url, namespace=namespace, middleware=[Tracing(tracer_provider=provider)])


class TracedWorker:
    """A `tether worker tests.apps.traced:app` process and the spans it exported."""

    def __init__(self, proc: WorkerProcess, spans: Path) -> None:
        self.proc = proc
        self.path = spans

    def spans(self) -> list[dict[str, Any]]:
        if not self.path.exists():
            return []
        return [json.loads(line) for line in self.path.read_text().splitlines() if line]

    def process_spans(self, task_id: str, count: int = 1) -> list[dict[str, Any]]:
        """The `process` spans of a task, in the order they ended (waits for ``count``)."""

        def found() -> list[dict[str, Any]] | None:
            spans = [s for s in self.spans() if s["name"].startswith("process ")
                     and s["attributes"].get("messaging.message.id") == task_id]  # fmt: skip
            return spans if len(spans) >= count else None

        result: list[dict[str, Any]] = wait_until(found, 20)
        return result

    def named(self, name: str) -> list[dict[str, Any]]:
        return [s for s in self.spans() if s["name"] == name]


def start_worker(
    url: str, namespace: str, tmp_path: Path, workers: list[WorkerProcess], name: str = "tw"
) -> TracedWorker:
    path = tmp_path / f"{name}-spans.jsonl"
    proc = WorkerProcess(
        url, namespace, name, app="tests.apps.traced:app", log_dir=tmp_path,
        env={"TETHER_TRACE_FILE": str(path)},
    )  # fmt: skip
    workers.append(proc)
    rds = redis.Redis.from_url(url)
    try:
        proc.wait_ready(rds)
    finally:
        rds.close()
    return TracedWorker(proc, path)


def hexid(value: int) -> str:
    return f"{value:016x}"


def trace_hex(span: ReadableSpan) -> str:
    assert span.context is not None
    return f"{span.context.trace_id:032x}"


def sends(exporter: InMemorySpanExporter) -> list[ReadableSpan]:
    return [s for s in exporter.get_finished_spans() if s.name.startswith("send ")]


def assert_child_of(child: dict[str, Any], parent: ReadableSpan) -> None:
    assert parent.context is not None
    assert child["trace_id"] == trace_hex(parent)
    assert child["parent_id"] == hexid(parent.context.span_id)


async def test_a_run_continues_the_trace_of_its_enqueue(
    url: str, namespace: str, tmp_path: Path, workers: list[WorkerProcess],
    producer: Tether, provider: TracerProvider, exporter: InMemorySpanExporter,
) -> None:  # fmt: skip
    worker = start_worker(url, namespace, tmp_path, workers)
    tracer = provider.get_tracer("test")
    async with producer:
        with tracer.start_as_current_span("request") as request:
            handle = await producer.by_name("traced.ok").enqueue(1)
            threaded = await producer.by_name("traced.sync_ok").enqueue(2)
            carried = await producer.by_name("traced.headers").enqueue()
        assert trace.get_current_span() is trace.INVALID_SPAN  # the send spans were detached
        assert await handle.result(timeout=20) == 1
        assert await threaded.result(timeout=20) == 2
        headers = await carried.result(timeout=20)

    send, send_sync, send_headers = sends(exporter)
    assert send.kind is trace.SpanKind.PRODUCER
    assert send.name == "send default"
    assert send.parent is not None and send.parent.span_id == request.get_span_context().span_id
    assert dict(send.attributes or {}) == {
        "messaging.system": "tether",
        "messaging.operation.type": "send",
        "messaging.operation.name": "send",
        "messaging.destination.name": "default",
        "messaging.message.id": handle.id,
        "tether.task.name": "traced.ok",
    }
    # W3C trace context travels in the task's headers.
    assert headers["traceparent"].split("-")[1:3] == [
        trace_hex(send_headers),
        hexid(send_headers.context.span_id),  # type: ignore[union-attr]
    ]

    (run,) = worker.process_spans(handle.id)
    assert run["kind"] == "CONSUMER"
    assert run["name"] == "process default"
    assert_child_of(run, send)
    assert run["links"] == []
    assert run["status"] == "UNSET"
    assert run["attributes"] == {
        "messaging.system": "tether",
        "messaging.operation.type": "process",
        "messaging.operation.name": "process",
        "messaging.destination.name": "default",
        "messaging.message.id": handle.id,
        "messaging.consumer.group.name": "tether",
        "messaging.client.id": "tw",
        "tether.task.name": "traced.ok",
        "tether.task.attempt": 1,
        "tether.task.priority": "normal",
        "tether.task.deliveries": 1,
        "test.arg": 1,  # set by the task on the current span: the run's
    }
    # The run's span is current inside the task: the task's own spans nest under it, on the
    # event loop and in the thread of a plain function alike.
    (inner,) = worker.named("inner-async")
    assert inner["parent_id"] == run["span_id"] and inner["trace_id"] == run["trace_id"]
    (run_sync,) = worker.process_spans(threaded.id)
    assert_child_of(run_sync, send_sync)
    (inner_sync,) = worker.named("inner-sync")
    assert inner_sync["parent_id"] == run_sync["span_id"]


async def test_blocking_and_batched_enqueues_carry_the_context(
    url: str, namespace: str, tmp_path: Path, workers: list[WorkerProcess],
    producer: Tether, provider: TracerProvider, exporter: InMemorySpanExporter,
) -> None:  # fmt: skip
    worker = start_worker(url, namespace, tmp_path, workers)
    tracer = provider.get_tracer("test")

    def blocking() -> tuple[str, list[str]]:  # a thread without an event loop
        with tracer.start_as_current_span("blocking request"):
            one = producer.by_name("traced.sync_ok").enqueue_sync(3)
            many = producer.by_name("traced.ok").enqueue_many_sync([(i,) for i in range(3)])
        return one.id, [h.id for h in many]

    one, batch = await asyncio.to_thread(blocking)
    async with producer:
        with tracer.start_as_current_span("async batch"):
            handles = await producer.by_name("traced.ok").enqueue_many([(i,) for i in range(4)])
            assert await producer.by_name("traced.ok").enqueue_many([]) == []
    producer.close_sync()

    send_one, send_many, send_async = sends(exporter)  # the empty batch sent nothing
    assert dict(send_one.attributes or {})["messaging.message.id"] == one
    for send, count in ((send_many, 3), (send_async, 4)):
        attributes = dict(send.attributes or {})
        assert attributes["messaging.batch.message_count"] == count
        assert "messaging.message.id" not in attributes
    (run,) = worker.process_spans(one)
    assert_child_of(run, send_one)
    for task_id in batch:
        assert_child_of(worker.process_spans(task_id)[0], send_many)
    for handle in handles:
        assert_child_of(worker.process_spans(handle.id)[0], send_async)


async def test_a_retry_starts_a_new_trace_linked_to_its_enqueue_and_first_run(
    url: str, namespace: str, tmp_path: Path, workers: list[WorkerProcess],
    producer: Tether, exporter: InMemorySpanExporter,
) -> None:  # fmt: skip
    worker = start_worker(url, namespace, tmp_path, workers)
    async with producer:
        handle = await producer.by_name("traced.flaky").enqueue()
        assert await handle.result(timeout=20) == "second"
    (send,) = sends(exporter)
    first, second = worker.process_spans(handle.id, 2)

    assert_child_of(first, send)
    assert first["attributes"]["tether.task.attempt"] == 1
    assert first["status"] == "ERROR"
    assert first["attributes"]["error.type"] == "ValueError"
    assert [e["name"] for e in first["events"]] == ["exception"]

    assert second["attributes"]["tether.task.attempt"] == 2
    assert second["status"] == "UNSET"
    assert second["trace_id"] != first["trace_id"]  # not one trace across the backoff
    assert second["parent_id"] is None
    assert send.context is not None
    assert second["links"] == [
        {"trace_id": trace_hex(send), "span_id": hexid(send.context.span_id),
         "attributes": {"tether.link": "send"}},
        {"trace_id": first["trace_id"], "span_id": first["span_id"],
         "attributes": {"tether.link": "previous_attempt"}},
    ]  # fmt: skip


async def test_a_failed_run_records_its_exception_and_an_error_status(
    url: str, namespace: str, tmp_path: Path, workers: list[WorkerProcess], producer: Tether
) -> None:
    worker = start_worker(url, namespace, tmp_path, workers)
    async with producer:
        handle = await producer.by_name("traced.boom").enqueue()
        with pytest.raises(Exception, match="kaboom"):
            await handle.result(timeout=20)
    (run,) = worker.process_spans(handle.id)
    assert run["status"] == "ERROR"
    assert run["description"] == "RuntimeError: kaboom"
    assert run["attributes"]["error.type"] == "RuntimeError"
    (event,) = run["events"]
    assert event["name"] == "exception"
    assert event["attributes"]["exception.type"] == "RuntimeError"
    assert event["attributes"]["exception.message"] == "kaboom"
    assert 'raise RuntimeError("kaboom")' in event["attributes"]["exception.stacktrace"]


async def test_a_rate_limited_run_is_an_event_and_the_next_run_links_back(
    url: str, namespace: str, tmp_path: Path, workers: list[WorkerProcess],
    producer: Tether, exporter: InMemorySpanExporter,
) -> None:  # fmt: skip
    worker = start_worker(url, namespace, tmp_path, workers)
    async with producer:
        handle = await producer.by_name("traced.limited").enqueue()
        assert await handle.result(timeout=20) == "admitted"
    (send,) = sends(exporter)
    first, second = worker.process_spans(handle.id, 2)
    assert first["status"] == "UNSET"
    assert [e["name"] for e in first["events"]] == ["tether.rate_limited"]
    assert first["events"][0]["attributes"] == {"tether.retry_after_s": 0.05}
    assert "error.type" not in first["attributes"]
    # Pushed back, not retried: the same attempt, in a trace of its own.
    assert second["attributes"]["tether.task.attempt"] == 1
    assert second["trace_id"] != trace_hex(send)
    assert [link["attributes"]["tether.link"] for link in second["links"]] == [
        "send", "previous_attempt"
    ]  # fmt: skip


def test_a_reclaimed_run_starts_a_new_trace_linked_to_its_enqueue(
    url: str, namespace: str, tmp_path: Path, workers: list[WorkerProcess],
    producer: Tether, exporter: InMemorySpanExporter,
) -> None:  # fmt: skip
    rds = redis.Redis.from_url(url)
    victim = start_worker(url, namespace, tmp_path, workers, name="victim")
    handle = producer.by_name("traced.hold").enqueue_sync()
    wait_until(lambda: rds.llen(f"{namespace}:started") == 1, 20)
    heir = start_worker(url, namespace, tmp_path, workers, name="heir")
    victim.proc.signal(signal.SIGKILL)
    assert handle.result_sync(timeout=20) == "again"
    producer.close_sync()
    rds.close()

    (send,) = sends(exporter)
    (run,) = heir.process_spans(handle.id)
    assert run["attributes"]["tether.task.deliveries"] == 2
    assert run["attributes"]["messaging.client.id"] == "heir"
    assert run["parent_id"] is None and run["trace_id"] != trace_hex(send)
    assert [link["span_id"] for link in run["links"]] == [
        hexid(send.context.span_id)  # type: ignore[union-attr]
    ]
    assert victim.spans() == []  # killed mid-run: its span never ended


async def test_an_enqueue_that_fails_records_its_error(
    provider: TracerProvider, exporter: InMemorySpanExporter, namespace: str
) -> None:
    app = Tether(
        "redis://127.0.0.1:9/0", namespace=namespace, connect_timeout=0.5,
        middleware=[Tracing(tracer_provider=provider)],
    )  # fmt: skip
    tracer = provider.get_tracer("test")
    async with app:
        with tracer.start_as_current_span("request") as request:
            with pytest.raises(EnqueueError):
                await app.by_name("traced.ok").enqueue(1)
            assert trace.get_current_span() is request  # the send span was detached
    with pytest.raises(EnqueueError):
        await asyncio.to_thread(app.by_name("traced.ok").enqueue_sync, 1)
    app.close_sync()
    for send in sends(exporter):
        assert send.status.status_code is trace.StatusCode.ERROR
        attributes = dict(send.attributes or {})
        assert attributes["error.type"] == "tether.EnqueueError"
        assert "messaging.message.id" not in attributes
        assert [e.name for e in send.events] == ["exception"]
    assert len(sends(exporter)) == 2


async def test_baggage_reaches_every_run_and_old_envelopes_run_as_roots(
    url: str, namespace: str, tmp_path: Path, workers: list[WorkerProcess], producer: Tether
) -> None:
    worker = start_worker(url, namespace, tmp_path, workers)
    token = otel_context.attach(baggage.set_baggage("tenant", "acme"))
    try:
        async with producer:
            carried = await producer.by_name("traced.headers").enqueue()
            headers = await carried.result(timeout=20)
            # An entry written by a producer without tracing, or by an older release: no
            # headers at all; another with a field this release does not know.
            stream = producer.keys("default").streams[1]
            now = int(time.time() * 1000)
            plain = {"v": 1, "task": "traced.ok", "args": [7], "enq": now}
            await producer.client.xadd(stream, {"m": json.dumps(plain)})
            newer = {**plain, "args": [8], "zz": {"from": "a newer release"}, "hdr": {"k": "v"}}
            await producer.client.xadd(stream, {"m": json.dumps(newer)})
            for arg in (7, 8):
                wait_until(lambda a=arg: _ran(worker, a), 20)
    finally:
        otel_context.detach(token)
    assert headers["baggage"] == "tenant=acme"
    for arg in (7, 8):
        run = _ran(worker, arg)
        assert run["parent_id"] is None and run["links"] == []
        assert run["status"] == "UNSET"


def _ran(worker: TracedWorker, arg: int) -> dict[str, Any] | None:
    """The process span of the `traced.ok` run whose argument was ``arg`` (the task sets it
    on the current span)."""
    runs = [s for s in worker.spans() if s["attributes"].get("test.arg") == arg]
    return runs[0] if runs else None


async def test_enqueues_nest_and_the_testing_kit_traces_sends(
    provider: TracerProvider, exporter: InMemorySpanExporter
) -> None:
    """In eager mode an async task runs inside its enqueue, through the worker's attempt
    policy: its process span is a child of its send span, the send span of the enqueue it
    makes nests under its process span, and each closes its own span."""
    app = Tether("redis://127.0.0.1:9/0", middleware=[Tracing(tracer_provider=provider)])

    @app.task(name="nest.child")
    async def child(x: int) -> int:
        return x

    @app.task(name="nest.parent")
    async def parent(x: int) -> int:
        return await (await child.enqueue(x)).result()

    with eager(app):
        assert await (await parent.enqueue(3)).result() == 3
    assert trace.get_current_span() is trace.INVALID_SPAN
    spans = exporter.get_finished_spans()
    assert [(s.name, dict(s.attributes or {})["tether.task.name"]) for s in spans] == [
        ("process default", "nest.child"),
        ("send default", "nest.child"),
        ("process default", "nest.parent"),
        ("send default", "nest.parent"),
    ]
    process_child, send_child, process_parent, send_parent = spans
    assert send_parent.parent is None
    for span, parent_span in (
        (process_parent, send_parent),
        (send_child, process_parent),
        (process_child, send_child),
    ):
        assert span.parent is not None and parent_span.context is not None
        assert span.parent.span_id == parent_span.context.span_id
