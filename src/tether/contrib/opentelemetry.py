"""OpenTelemetry tracing of enqueues and runs (``pip install 'tether-queue[otel]'``).

    from tether import Tether
    from tether.contrib.opentelemetry import Tracing

    app = Tether(middleware=[Tracing()])      # or app.add_middleware(Tracing())

It uses ``opentelemetry-api`` only: your application brings the SDK (a tracer provider and
its exporters); until it sets one, the spans cost next to nothing and go nowhere. Put the
middleware on the app in the producers' processes and in the workers' (the app module that
``tether worker`` imports), and configure the SDK in both.

**Spans**, named and described by the OpenTelemetry messaging conventions:

- ``send <queue>`` (PRODUCER) around each enqueue call, from before its tasks are encoded
  until Redis accepted them (a batch is one span with ``messaging.batch.message_count``;
  one task gives ``messaging.message.id``). A failed enqueue records its exception and an
  error status.
- ``process <queue>`` (CONSUMER) around each run of a task's function; it is the current
  span while the function runs (async on the event loop, or plain in its thread), so spans
  the task opens nest under it. A run that raises records the exception, an ``error.type``
  and an error status; a ``RateLimited`` push-back is an event, not an error.

Attributes: ``messaging.system`` (``tether``), ``messaging.operation.type`` and
``messaging.operation.name`` (``send`` or ``process``), ``messaging.destination.name``
(the queue), ``messaging.message.id`` (the task id), ``messaging.consumer.group.name`` and
``messaging.client.id`` (the worker) on runs, and ``tether.task.name``,
``tether.task.attempt``, ``tether.task.priority``, ``tether.task.deliveries``.

**Context** travels in the task's headers (the envelope's ``hdr``): the producer's
``traceparent`` (W3C trace context, and ``baggage``; whatever the global propagator
writes, or the ``propagator`` given). The first run of a task is a child of its ``send``
span: one trace from the request that enqueued it to the work it did. A retry, a run
after a ``RateLimited`` push-back, or a run reclaimed after its worker died starts a new
trace, linked to the ``send`` span and to the previous attempt's span (carried in the
retry's ``tether-previous-run`` header), so a backoff of an hour does not stretch one trace
across it. Baggage reaches every run.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from contextvars import ContextVar, Token
from types import TracebackType
from typing import TYPE_CHECKING, Any

from opentelemetry import context as otel_context
from opentelemetry import propagate, trace
from opentelemetry.context import Context
from opentelemetry.propagators.textmap import TextMapPropagator
from opentelemetry.trace import INVALID_SPAN, Link, Span, SpanContext, SpanKind, Status, StatusCode
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from ..base._errors import RateLimited
from ..base._middleware import Middleware
from ..base._version import __version__
from ..protocol._keys import GROUP

if TYPE_CHECKING:
    from ..base._context import TaskContext

__all__ = ["PREVIOUS_RUN", "SYSTEM", "Tracing"]

SYSTEM = "tether"
"""The ``messaging.system`` of every span."""

PREVIOUS_RUN = "tether-previous-run"
"""The header a retry carries: the W3C ``traceparent`` of the attempt before it."""

_W3C = TraceContextTextMapPropagator()


def _error_type(exc: BaseException) -> str:
    cls = type(exc)
    return f"{cls.__module__}.{cls.__qualname__}".removeprefix("builtins.")


def _fail(span: Span, exc: BaseException) -> None:
    span.record_exception(exc)
    span.set_attribute("error.type", _error_type(exc))
    span.set_status(Status(StatusCode.ERROR, f"{type(exc).__name__}: {exc}"))


def _traceparent(span_context: SpanContext) -> str:
    """The W3C ``traceparent`` of a span (version 00), written directly: this runs for
    every run, and the propagator's way costs more than the formatting."""
    flags = int(span_context.trace_flags)
    return f"00-{span_context.trace_id:032x}-{span_context.span_id:016x}-{flags:02x}"


def _previous(headers: Mapping[str, str]) -> SpanContext | None:
    value = headers.get(PREVIOUS_RUN)
    if not value:
        return None
    found = trace.get_current_span(_W3C.extract({"traceparent": value})).get_span_context()
    return found if found.is_valid else None


class _RunSpan:
    """The ``process`` span of one run, current from ``__enter__`` to ``__exit__``."""

    __slots__ = ("_context", "_span", "_token")

    def __init__(self, span: Span, parent: Context) -> None:
        self._span = span
        self._context = trace.set_span_in_context(span, parent)
        self._token: Token[Context] | None = None

    def __enter__(self) -> Span:
        self._token = otel_context.attach(self._context)
        return self._span

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        span = self._span
        try:
            if isinstance(exc, RateLimited):  # back-pressure, not an error
                after = exc.retry_after
                span.add_event(
                    "tether.rate_limited", {} if after is None else {"tether.retry_after_s": after}
                )
            elif exc is not None:
                _fail(span, exc)
        finally:
            span.end()
            if self._token is not None:
                otel_context.detach(self._token)


class Tracing(Middleware):
    """Tether middleware that traces enqueues (``send``) and runs (``process``).

    ``tracer_provider``: the provider to take the tracer from (default: the global one,
    as set by ``trace.set_tracer_provider``). ``propagator``: how the context is written
    into and read from the headers (default: the global propagator, W3C trace context and
    baggage unless the application configured another)."""

    def __init__(
        self,
        *,
        tracer_provider: trace.TracerProvider | None = None,
        propagator: TextMapPropagator | None = None,
    ) -> None:
        self._tracer = trace.get_tracer("tether", __version__, tracer_provider=tracer_provider)
        self._propagator = propagator
        # The send spans this middleware opened in the current thread or asyncio task,
        # closed by after_enqueue (an enqueue inside an enqueue hook nests).
        self._sending: ContextVar[tuple[tuple[Span, Token[Context]] | None, ...]] = ContextVar(
            f"tether_tracing_{id(self)}", default=()
        )

    # -- producer -------------------------------------------------------------------------

    def before_enqueue(self, task_name: str, queue: str, headers: dict[str, str]) -> None:
        # This call's place on the stack first, so that after_enqueue closes this call's
        # span and no other, whatever fails below.
        sending = self._sending.get()
        self._sending.set((*sending, None))
        span = self._tracer.start_span(
            f"send {queue}",
            kind=SpanKind.PRODUCER,
            attributes={
                "messaging.system": SYSTEM,
                "messaging.operation.type": "send",
                "messaging.operation.name": "send",
                "messaging.destination.name": queue,
                "tether.task.name": task_name,
            },
        )
        ctx = trace.set_span_in_context(span)
        self._sending.set((*sending, (span, otel_context.attach(ctx))))
        self._inject(headers, ctx)

    def after_enqueue(
        self,
        task_name: str,
        queue: str,
        task_ids: Sequence[str],
        error: BaseException | None,
    ) -> None:
        sending = self._sending.get()
        if not sending:
            return
        self._sending.set(sending[:-1])
        if sending[-1] is None:  # before_enqueue failed before its span was current
            return
        span, token = sending[-1]
        try:
            if len(task_ids) == 1:
                span.set_attribute("messaging.message.id", task_ids[0])
            elif task_ids:
                span.set_attribute("messaging.batch.message_count", len(task_ids))
            if error is not None:
                _fail(span, error)
        finally:
            span.end()
            otel_context.detach(token)

    # -- consumer -------------------------------------------------------------------------

    def run_scope(self, ctx: TaskContext, retry_headers: dict[str, str]) -> _RunSpan:
        headers = ctx.headers
        sent = self._extract(headers)
        producer = trace.get_current_span(sent).get_span_context()
        previous = _previous(headers)
        links: list[Link] = []
        if ctx.attempt == 1 and ctx.deliveries <= 1 and previous is None:
            parent = sent  # the first run: a child of its send span
        else:
            # A new trace (the span of the send taken out, its baggage kept), linked back.
            parent = trace.set_span_in_context(INVALID_SPAN, sent)
            if producer.is_valid:
                links.append(Link(producer, {"tether.link": "send"}))
            if previous is not None:
                links.append(Link(previous, {"tether.link": "previous_attempt"}))
        attributes: dict[str, Any] = {
            "messaging.system": SYSTEM,
            "messaging.operation.type": "process",
            "messaging.operation.name": "process",
            "messaging.destination.name": ctx.queue,
            "messaging.message.id": ctx.task_id,
            "messaging.consumer.group.name": GROUP,
            "messaging.client.id": ctx.worker,
            "tether.task.name": ctx.task_name,
            "tether.task.attempt": ctx.attempt,
            "tether.task.priority": ctx.priority,
            "tether.task.deliveries": ctx.deliveries,
        }
        if ctx.schedule is not None:
            attributes["tether.schedule"] = ctx.schedule
        span = self._tracer.start_span(
            f"process {ctx.queue}",
            context=parent,
            kind=SpanKind.CONSUMER,
            links=links,
            attributes=attributes,
        )
        if span.is_recording():  # a span nobody records is not worth a link
            retry_headers[PREVIOUS_RUN] = _traceparent(span.get_span_context())
        else:
            retry_headers.pop(PREVIOUS_RUN, None)
        return _RunSpan(span, parent)

    # -- propagation ----------------------------------------------------------------------

    def _inject(self, headers: dict[str, str], ctx: Context) -> None:
        if self._propagator is None:
            propagate.inject(headers, context=ctx)
        else:
            self._propagator.inject(headers, context=ctx)

    def _extract(self, headers: Mapping[str, str]) -> Context:
        if self._propagator is None:
            return propagate.extract(headers, context=Context())
        return self._propagator.extract(headers, context=Context())
