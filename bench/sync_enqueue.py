"""Blocking enqueue beside bare redis-py: ``task.enqueue_sync(i)`` one call at a time, from one
thread and from 8, against the floor of the same ``XADD`` sent by redis-py's blocking client.

    python3 bench/sync_enqueue.py                 # 20 x 1,000 calls per side and row
    python3 bench/sync_enqueue.py --quick         # 4 x 500
    python3 bench/sync_enqueue.py --url redis://host:6379/0

Each call sends one plain task (no delay, no dedup key: one ``XADD``). The floor sends the
very bytes Tether would (the same envelope) with ``execute_command("XADD", ...)`` on a
``redis.Redis`` whose pool is as large as the thread count; Tether uses the app's own
blocking client, opened before timing starts. With threads, each sends its share of a batch.

A row alternates batches of Tether and of the floor (the order flipping each pair), so both
see the same load on a shared machine: a side's rate is its calls over its summed time, and
the ratio column is the median of the pairs' ratios. The stream is trimmed between batches.
The last column is the producer process's CPU time per call (all threads; the server runs
in another process): what Tether adds to a call, less sensitive to a busy machine than the
rates.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "src"))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import envs  # standard library only

envs.run_with_this_tether(__file__)

import redis  # noqa: E402

from tether import Tether  # noqa: E402
from tether.base._embedded import EmbeddedServer, embedded_binary  # noqa: E402
from tether.producer._enqueue import encode  # noqa: E402

NAMESPACE = "bench-sync"


def timed(threads: int, n: int, send: Callable[[int], object]) -> tuple[float, float]:
    """Calls per second of ``send(i)`` for i in range(n), split over ``threads`` threads, and
    the process's CPU seconds they took."""
    per = n // threads
    start_line = threading.Barrier(threads + 1)

    def run(offset: int) -> None:
        start_line.wait()
        for i in range(offset, offset + per):
            send(i)

    pool = [threading.Thread(target=run, args=(t * per,)) for t in range(threads)]
    for thread in pool:
        thread.start()
    start_line.wait()
    started, cpu = time.perf_counter(), time.process_time()
    for thread in pool:
        thread.join()
    return per * threads / (time.perf_counter() - started), time.process_time() - cpu


def measure(
    url: str, batch: int, pairs: int, thread_counts: list[int]
) -> dict[int, dict[str, float]]:
    app = Tether(url, namespace=NAMESPACE, stats=False)

    @app.task(name="bench.noop", store_result=False)
    def noop(i: int) -> None:
        return None

    stream = app.keys("default").stream("normal")
    payload = encode(app.serializer, noop, [((123456,), {})], [], {})[0]
    bare = redis.Redis.from_url(url, max_connections=max(thread_counts) + 2)
    noop.enqueue_sync(0)  # opens the app's pool, caches the plan
    bare.execute_command("XADD", stream, "*", "m", payload)

    def tether_send(i: int) -> object:
        return noop.enqueue_sync(i)

    def floor_send(i: int) -> object:
        return bare.execute_command("XADD", stream, "*", "m", payload)

    rows: dict[int, dict[str, float]] = {}
    for threads in thread_counts:
        for send in (tether_send, floor_send):  # warm up every connection of the pools
            timed(threads, threads * 50, send)
        seconds = {"tether": 0.0, "floor": 0.0}
        cpu = {"tether": 0.0, "floor": 0.0}
        ratios = []
        for pair in range(pairs):
            order = [("tether", tether_send), ("floor", floor_send)]
            if pair % 2:
                order.reverse()
            rates = {}
            for name, send in order:
                bare.delete(stream)
                rates[name], used = timed(threads, batch, send)
                seconds[name] += batch / rates[name]
                cpu[name] += used
            ratios.append(rates["tether"] / rates["floor"])
        calls = batch * pairs
        rows[threads] = {
            "tether": calls / seconds["tether"],
            "floor": calls / seconds["floor"],
            "ratio": statistics.median(ratios),
            "tether_cpu_us": cpu["tether"] / calls * 1e6,
            "floor_cpu_us": cpu["floor"] / calls * 1e6,
        }
        print(f"{threads} threads done", file=sys.stderr)
    bare.delete(stream)
    bare.close()
    app.close_sync()
    return rows


def table(rows: dict[int, dict[str, float]], batch: int, pairs: int) -> str:
    lines = [
        f"Blocking enqueue, one call at a time ({pairs} x {batch:,} calls per side and row)",
        "",
        "| threads | Tether `enqueue_sync` | redis-py `XADD` (floor) | Tether / floor "
        "| client CPU per call: Tether, floor |",
        "|---|---|---|---|---|",
    ]
    for threads, row in rows.items():
        lines.append(
            f"| {threads} | {row['tether']:,.0f}/s | {row['floor']:,.0f}/s | {row['ratio']:.0%} "
            f"| {row['tether_cpu_us']:.0f} us, {row['floor_cpu_us']:.0f} us |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batch", type=int, default=None, help="calls per batch (1,000)")
    parser.add_argument("--pairs", type=int, default=None, help="batch pairs per row (20)")
    parser.add_argument("--threads", default="1,8", help="thread counts, comma-separated")
    parser.add_argument("--url", default=None, help="a server to use (default: a fresh one)")
    parser.add_argument("--quick", action="store_true", help="4 pairs of 500 calls")
    args = parser.parse_args()
    batch = args.batch or (500 if args.quick else 1_000)
    pairs = args.pairs or (4 if args.quick else 20)
    thread_counts = [int(t) for t in args.threads.split(",")]
    server = None
    url = args.url
    if url is None:
        server = EmbeddedServer(embedded_binary()).start()
        url = server.url
    try:
        rows = measure(url, batch, pairs, thread_counts)
    finally:
        if server is not None:
            server.cleanup()
    print(table(rows, batch, pairs))


if __name__ == "__main__":
    main()
