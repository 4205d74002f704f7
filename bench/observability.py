"""What the metrics and the tracing cost per task, measured in this process, without a
server: ``python bench/observability.py``.

The processing-rate rows of ``bench/run.py`` (``tether-metrics``, ``tether-otel`` beside
``tether``) measure the whole worker, on a machine whose noise is larger than a microsecond;
this measures the added work alone, with ``time.perf_counter`` over many repetitions (the
best of five runs):

- the worker's metrics: :meth:`AttemptTally.record` per attempt, fed in batches of 32 as
  the settler feeds it, and one scrape of a worker's registry (``generate_latest``);
- tracing: a ``send`` span per enqueue call (``before_enqueue`` + ``after_enqueue``) and a
  ``process`` span per run (``run_scope`` entered and exited), with the SDK recording every
  span into a batch processor whose exporter drops them, and with the API alone (the extra
  installed, no SDK configured);
- a whole worker: the CPU time of this process per task while a burst worker runs N tasks
  whose body does nothing (the worst case for a relative cost), on a fresh embedded
  Valkey, with metrics off, metrics on, and tracing on; the variants alternate round after
  round and the medians are compared (``--rounds``, ``--n``; ``--rounds 0`` skips it).
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import secrets
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

sys.path[0] = str(Path(__file__).resolve().parent.parent)

from opentelemetry.sdk.trace import ReadableSpan, TracerProvider  # noqa: E402
from opentelemetry.sdk.trace.export import (  # noqa: E402
    BatchSpanProcessor,
    SpanExporter,
    SpanExportResult,
)
from prometheus_client import generate_latest  # noqa: E402

from tether import TaskContext, Tether, WorkerSettings  # noqa: E402
from tether.base._embedded import EmbeddedServer, embedded_binary  # noqa: E402
from tether.contrib.opentelemetry import Tracing  # noqa: E402
from tether.metrics._tally import AttemptTally  # noqa: E402
from tether.worker import Worker  # noqa: E402
from tether.worker._stats import Observation  # noqa: E402

BATCH = 32
ROUNDS = 5
SCALE = 1.0
"""Repetitions of the in-process measurements, relative to the defaults (``--quick``)."""


def reps(default: int) -> int:
    return max(1, int(default * SCALE))


class DropExporter(SpanExporter):
    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        return SpanExportResult.SUCCESS


def best_us(step: Callable[[], None], count: int) -> float:
    """Microseconds per call of ``step`` (which does ``count`` units of work): the best of
    ROUNDS runs, so the machine's noise only ever adds."""
    best = float("inf")
    for _ in range(ROUNDS):
        started = time.perf_counter()
        step()
        best = min(best, time.perf_counter() - started)
    return best / count * 1e6


def tally_cost() -> float:
    observations = [
        Observation(f"task{i % 10}", "ok", 1.5 + i % 7, 0.3 + i % 5, False) for i in range(BATCH)
    ]
    tally = AttemptTally()
    batches = reps(20_000)

    def step() -> None:
        for _ in range(batches):
            tally.record("default", observations)

    return best_us(step, batches * BATCH)


def scrape_cost() -> float:
    worker = Worker(Tether("redis://127.0.0.1:1/0"), WorkerSettings(metrics_port=0))
    assert worker.metrics is not None
    for n in range(10):
        worker.metrics.tally.record(
            "default", [Observation(f"task{n}", "ok", 2.0, 1.0, False)] * 1000
        )
    registry = worker.metrics.registry

    scrapes = reps(100)

    def step() -> None:
        for _ in range(scrapes):
            generate_latest(registry)

    return best_us(step, scrapes) / 1000  # ms


def tracing_costs(provider: TracerProvider | None) -> tuple[float, float]:
    tracing = Tracing(tracer_provider=provider)
    calls = reps(20_000)
    sent: dict[str, str] = {}

    def send() -> None:
        for _ in range(calls):
            headers: dict[str, str] = {}
            tracing.before_enqueue("bench.noop", "default", headers)
            tracing.after_enqueue("bench.noop", "default", ["default:2-1-0"], None)
            sent.update(headers)

    send_us = best_us(send, calls)
    ctx = TaskContext(
        "default:2-1-0", "bench.noop", "default", "normal", 1, 1, 1, 0, "bench-worker",
        headers=sent,
    )  # fmt: skip

    def process() -> None:
        for _ in range(calls):
            with tracing.run_scope(ctx, dict(sent)):
                pass

    return send_us, best_us(process, calls)


VARIANTS = ("metrics off", "metrics on", "tracing on")


async def worker_cpu_us(url: str, variant: str, n: int, provider: TracerProvider) -> float:
    """CPU microseconds of this process per task while a burst worker runs ``n`` tasks
    (every thread: the event loop, the heartbeat, the metrics server, the span processor)."""
    tracing = [Tracing(tracer_provider=provider)] if variant == "tracing on" else []
    app = Tether(url, namespace=f"obs{secrets.token_hex(4)}", middleware=tracing)

    @app.task(name="bench.noop", store_result=False)
    async def noop(i: int) -> None:
        return None

    settings: dict[str, object] = {"burst": True, "concurrency": 32, "scheduler": False}
    if variant == "metrics on":
        settings["metrics_port"] = 0
    async with app:
        await noop.enqueue_many([(i,) for i in range(n)])
        worker = app.worker(**settings)
        started = time.process_time()
        await worker.run()
        spent = time.process_time() - started
        assert worker.counters.succeeded == n, worker.counters
    return spent / n * 1e6


def worker_rows(
    rounds: int, n: int, provider: TracerProvider, variants: Sequence[str]
) -> list[tuple[str, str]]:
    server = EmbeddedServer(embedded_binary()).start()
    samples: dict[str, list[float]] = {v: [] for v in variants}
    try:
        # Untimed: the first run in a process pays for imports and first connections.
        asyncio.run(worker_cpu_us(server.url, "metrics off", n // 5, provider))
        for r in range(rounds):
            k = r % len(variants)
            order = [*variants[k:], *variants[:k]]  # rotated, as bench/run.py does
            for variant in order:
                # Each run starts clean: no spans of the run before still in the processor's
                # thread, no garbage of it left for the collector (this process's CPU time
                # counts every thread).
                provider.force_flush()
                gc.collect()
                samples[variant].append(
                    asyncio.run(worker_cpu_us(server.url, variant, n, provider))
                )
    finally:
        server.cleanup()
    base = statistics.median(samples["metrics off"])
    rows = []
    for variant in variants:
        median = statistics.median(samples[variant])
        spread = f"{min(samples[variant]):.0f} to {max(samples[variant]):.0f}"
        extra = ""
        if variant != "metrics off":
            # Paired: each round's difference with the run beside it, so a load that drifts
            # over the rounds cancels out; the median of those differences.
            paired = statistics.median(
                v - off for v, off in zip(samples[variant], samples["metrics off"], strict=True)
            )
            extra = f", {paired:+.1f} µs ({paired / base:+.1%}) paired with metrics off"
        rows.append((f"worker CPU per task, {variant} (median of {rounds}, {spread})",
                     f"{median:.1f} µs{extra}"))  # fmt: skip
    return rows


def micro_rows(provider: TracerProvider) -> list[tuple[str, str]]:
    rows = [
        ("metrics: AttemptTally.record, per attempt (batches of 32)", f"{tally_cost():.2f} µs"),
        ("metrics: one scrape of a worker, 10 task names (generate_latest)",
         f"{scrape_cost():.2f} ms"),
    ]  # fmt: skip
    send_sdk, process_sdk = tracing_costs(provider)
    send_api, process_api = tracing_costs(None)
    return [
        *rows,
        ("tracing, SDK recording: send span per enqueue call", f"{send_sdk:.1f} µs"),
        ("tracing, SDK recording: process span per run", f"{process_sdk:.1f} µs"),
        ("tracing, API only (no SDK configured): send span", f"{send_api:.1f} µs"),
        ("tracing, API only (no SDK configured): process span", f"{process_api:.1f} µs"),
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=7, help="whole-worker rounds (0: none)")
    parser.add_argument("--n", type=int, default=5000, help="tasks per whole-worker round")
    parser.add_argument(
        "--variants",
        default=",".join(VARIANTS),
        help=f"whole-worker variants, comma-separated, from: {', '.join(VARIANTS)}",
    )
    parser.add_argument("--no-micro", action="store_true", help="whole-worker rounds only")
    parser.add_argument(
        "--quick", action="store_true", help="a look, not a measure: 1 round of 300 tasks, "
        "a twentieth of the repetitions"
    )  # fmt: skip
    args = parser.parse_args()
    if args.quick:
        global SCALE
        SCALE = 0.05
        args.rounds, args.n = min(args.rounds, 1), min(args.n, 300)
    variants = [v.strip() for v in args.variants.split(",")]
    if "metrics off" not in variants or not set(variants) <= set(VARIANTS):
        parser.error(f"--variants: from {', '.join(VARIANTS)}, with 'metrics off'")
    provider = TracerProvider()
    provider.add_span_processor(BatchSpanProcessor(DropExporter(), max_queue_size=100_000))
    rows = [] if args.no_micro else micro_rows(provider)
    if args.rounds:
        rows += worker_rows(args.rounds, args.n, provider, variants)
    provider.shutdown()
    width = max(len(name) for name, _ in rows)
    print(f"{'what':<{width}}  cost")
    for name, cost in rows:
        print(f"{name:<{width}}  {cost}")


if __name__ == "__main__":
    main()
