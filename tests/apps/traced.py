"""Tasks for the tracing tests' worker processes. The module configures the OpenTelemetry
SDK the way an application would, with an exporter that appends each finished span as a
JSON line to the file named by TETHER_TRACE_FILE, for the test to read."""

from __future__ import annotations

import asyncio
import json
import os
import threading
from collections.abc import Sequence

from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExporter, SpanExportResult

from tether import Backoff, RateLimited, Tether, current_task
from tether.base._redis import AsyncClient, async_client, parse_url
from tether.contrib.opentelemetry import PREVIOUS_RUN, Tracing


class JsonLinesExporter(SpanExporter):
    def __init__(self, path: str) -> None:
        self._path = path
        self._lock = threading.Lock()

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        with self._lock, open(self._path, "a") as out:
            for span in spans:
                out.write(json.dumps(_as_dict(span)) + "\n")
        return SpanExportResult.SUCCESS


def _as_dict(span: ReadableSpan) -> dict[str, object]:
    ctx = span.get_span_context()
    assert ctx is not None
    return {
        "name": span.name,
        "kind": span.kind.name,
        "trace_id": f"{ctx.trace_id:032x}",
        "span_id": f"{ctx.span_id:016x}",
        "parent_id": None if span.parent is None else f"{span.parent.span_id:016x}",
        "status": span.status.status_code.name,
        "description": span.status.description,
        "attributes": dict(span.attributes or {}),
        "events": [{"name": e.name, "attributes": dict(e.attributes or {})} for e in span.events],
        "links": [
            {
                "trace_id": f"{link.context.trace_id:032x}",
                "span_id": f"{link.context.span_id:016x}",
                "attributes": dict(link.attributes or {}),
            }
            for link in span.links
        ],
    }


provider = TracerProvider()
provider.add_span_processor(SimpleSpanProcessor(JsonLinesExporter(os.environ["TETHER_TRACE_FILE"])))
trace.set_tracer_provider(provider)
tracer = trace.get_tracer("tests.apps.traced")

app = Tether(middleware=[Tracing()])

_client: AsyncClient | None = None


def _redis() -> AsyncClient:
    global _client
    if _client is None:
        _client = async_client(parse_url(app.settings.url), socket_timeout=10, connect_timeout=5)
    return _client


@app.task(name="traced.ok")
async def ok(i: int) -> int:
    trace.get_current_span().set_attribute("test.arg", i)  # the run's span is current
    with tracer.start_as_current_span("inner-async"):
        await asyncio.sleep(0)
    return i


@app.task(name="traced.sync_ok")
def sync_ok(i: int) -> int:
    """A plain function, run in the worker's thread pool."""
    with tracer.start_as_current_span("inner-sync"):
        return i


@app.task(name="traced.flaky", retries=1, backoff=Backoff(base=0.01, jitter=0))
async def flaky() -> str:
    if current_task().attempt == 1:
        raise ValueError("first attempt fails")
    return "second"


@app.task(name="traced.boom")
async def boom() -> None:
    raise RuntimeError("kaboom")


@app.task(name="traced.limited")
async def limited() -> str:
    if PREVIOUS_RUN not in current_task().headers:
        raise RateLimited(retry_after=0.05)
    return "admitted"


@app.task(name="traced.hold")
async def hold() -> str:
    """Runs until its worker is killed; a reclaimed run returns at once."""
    if current_task().deliveries > 1:
        return "again"
    await _redis().rpush(f"{app.namespace}:started", "1")
    await asyncio.sleep(60)
    return "never"


@app.task(name="traced.headers")
async def headers() -> dict[str, str]:
    return dict(current_task().headers)
