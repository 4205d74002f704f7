"""Tether with OpenTelemetry tracing on (``tether.contrib.opentelemetry.Tracing``) in the
producer and in the worker, with the SDK recording every span and a batch processor handing
them to an exporter that drops them: the cost of the spans themselves, without a network."""

from __future__ import annotations

from collections.abc import Sequence

import redis.asyncio
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult

from tether import Tether
from tether.contrib.opentelemetry import Tracing

from .. import body
from . import tether as plain


class DropExporter(SpanExporter):
    """Receives the finished spans in batches, as an OTLP exporter would, and drops them."""

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        return SpanExportResult.SUCCESS


provider = TracerProvider()
provider.add_span_processor(BatchSpanProcessor(DropExporter()))
trace.set_tracer_provider(provider)

app = Tether(body.CONFIG.url, namespace=body.CONFIG.tag, middleware=[Tracing()])


@app.task(name=plain.noop.name, store_result=False)
async def noop(i: int) -> None:
    await body.run(i)


class Adapter(plain.Adapter):
    async def open(self) -> None:
        await app.open()

    async def close(self) -> None:
        provider.force_flush()
        await app.close()

    async def enqueue(self, i: int) -> None:
        await noop.enqueue(i)

    async def enqueue_many(self, items: Sequence[int]) -> None:
        await noop.enqueue_many([(i,) for i in items])

    def worker_argv(self, name: str) -> list[str]:
        argv = super().worker_argv(name)
        argv[argv.index(f"{plain.__name__}:app")] = f"{__name__}:app"
        return argv

    async def ready(self, counters: redis.asyncio.Redis, names: Sequence[str]) -> bool:
        keys = app.keys(plain.QUEUE)
        return int(await app.client.exists(*(keys.lease(n) for n in names))) == len(names)
