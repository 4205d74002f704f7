"""Flow control's cost: the processing rate of limited tasks beside an unlimited one.

    python3 bench/flow.py                 # N=10,000, one round: about a minute on 2 cores
    python3 bench/flow.py --n 20000 --rounds 3

Each row runs in a fresh embedded valkey-server (persistence off), one ``tether worker``
process (``--concurrency 32``, pinned like bench/run.py: workers on every core but the
first), the queue filled with ``enqueue_many`` before the worker starts, and the bench's
task body (one awaited ``INCR``). The rate is tasks ÷ the time from the worker's lease
appearing to the done counter reaching N; commands per task are INFO commandstats over the
same window less the driver's polling and the bodies' increments (commands inside scripts
count). Rows:

- unlimited: the bench's Tether row, for reference;
- a rate limit far below the worker's rate (500/s): the limiter decides;
- a rate limit ten times the unlimited row's rate, with a burst of a tenth of a second's
  worth (set at runtime): the admission's cost;
- a concurrency limit ten times the worker's concurrency: admission and slot release;
- the same per limit key (8 keys, round robin).

Figures, never assertions.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import secrets
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path[0] = str(ROOT)

from bench import envs  # noqa: E402  (standard library only)

envs.run_with_this_tether(__file__)

from bench import procs  # noqa: E402
from bench.config import Config  # noqa: E402
from bench.stats import Probe, command_delta  # noqa: E402
from tether import Task, Tether  # noqa: E402
from tether.base._embedded import EmbeddedServer  # noqa: E402

APP = "bench.apps.flow"
KEYS = 8


async def fill(url: str, namespace: str, task: str, n: int, keyed: bool) -> None:
    from bench.apps import flow

    app = Tether(url, namespace=namespace)
    source = flow.app.tasks[f"{APP}.{task}"]
    fn: Task[..., Any] = Task(app, source.fn, source.config)
    async with app:
        if keyed:
            for k in range(KEYS):
                keyed_fn = fn.options(limit_key=f"tenant{k}")
                await keyed_fn.enqueue_many([(i,) for i in range(k, n, KEYS)])
        else:
            for start in range(0, n, 1000):
                await fn.enqueue_many([(i,) for i in range(start, min(n, start + 1000))])


async def set_rate(url: str, namespace: str, task: str, rate: float) -> None:
    app = Tether(url, namespace=namespace)
    async with app:
        # A burst of a tenth of a second's worth: one worker admits whole fetch batches at
        # once, and a rate with a burst smaller than a batch spaces the batch out.
        burst = max(32, int(rate / 10))
        await app.limits.set(f"{APP}.{task}", rate_limit=f"{int(rate)}/s", rate_burst=burst)


async def measure(url: str, task: str, n: int, keyed: bool, rate: float | None) -> dict[str, Any]:
    tag = f"f{secrets.token_hex(4)}"
    namespace = tag
    config = Config(url=url, tag=tag)
    if rate is not None:
        await set_rate(url, namespace, task, rate)
    await fill(url, namespace, task, n, keyed)
    driver_cores, worker_cores = procs.core_plan()
    probe = Probe(config)
    log = Path(tempfile.mkstemp(prefix=f"flow-{task}-", suffix=".log")[1])
    env = {
        **os.environ, **config.env(), "TETHER_URL": url, "TETHER_NAMESPACE": namespace,
        "PYTHONPATH": str(ROOT),
    }  # fmt: skip
    argv = [
        sys.executable, "-m", "tether", "worker", f"{APP}:app", "--queues", "default",
        "--concurrency", "32", "--log-level", "WARNING", "--no-scheduler", "--name", "w1",
    ]  # fmt: skip
    lease = f"{{{namespace}:default}}:lease:w1"
    worker = procs.spawn(argv, env=env, cwd=ROOT, log_path=log, cores=worker_cores)
    import redis.asyncio

    queue_db = redis.asyncio.Redis.from_url(url)
    try:
        while not await queue_db.exists(lease):
            if worker.poll() is not None:
                raise RuntimeError(f"the worker exited:\n{procs.tail(log)}")
            await asyncio.sleep(0.001)
        before = await probe.snapshot()
        cpu0 = procs.cpu_seconds(procs.tree(worker.pid))
        t0 = time.monotonic()
        while await probe.done() < n:
            if worker.poll() is not None:
                raise RuntimeError(f"the worker exited:\n{procs.tail(log)}")
            await asyncio.sleep(0.002)
        elapsed = time.monotonic() - t0
        cpu1 = procs.cpu_seconds(procs.tree(worker.pid))
        after = await probe.snapshot()
    finally:
        procs.stop(worker)
        await queue_db.aclose()
        await probe.close()
    work, _ = command_delta(before, after, body_incrs=n)
    del driver_cores
    return {
        "rate": n / elapsed,
        "commands": sum(work.values()) / n,
        "worker_cpu_us": (cpu1 - cpu0) / n * 1e6,
        "server_cpu_us": (after.cpu - before.cpu) / n * 1e6,
        "detail": work,
    }


ROWS = [
    ("unlimited", "unlimited", False, None),
    ("rate limit 500/s, far below the worker's rate", "rate_bound", False, None),
    ("rate limit 10x the unlimited rate", "rate_loose", False, "x10"),
    ("concurrency limit 320 (10x the worker's 32)", "concurrency_loose", False, None),
    ("per-key concurrency limit 320, 8 keys", "key_concurrency_loose", True, None),
]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=10_000, help="tasks per row (default 10,000)")
    parser.add_argument("--rounds", type=int, default=1)
    args = parser.parse_args(argv)
    results: dict[str, list[dict[str, Any]]] = {label: [] for label, *_ in ROWS}
    unlimited_rate = 0.0
    for _ in range(args.rounds):
        for label, task, keyed, rate in ROWS:
            server = EmbeddedServer().start()
            if server.pid:
                procs.pin(server.pid, procs.core_plan()[0])
            try:
                n = min(args.n, 2500) if task == "rate_bound" else args.n
                target = 10 * unlimited_rate if rate == "x10" else None
                row = asyncio.run(measure(server.url, task, n, keyed, target))
            finally:
                server.cleanup()
            if task == "unlimited":
                unlimited_rate = row["rate"]
            row["limit"] = target
            results[label].append(row)
            print(f"  {label}: {row['rate']:,.0f}/s, {row['commands']:.2f} commands/task, "
                  f"{sorted(row['detail'].items(), key=lambda kv: -kv[1])[:8]}",
                  file=sys.stderr)  # fmt: skip
    print(f"\nN={args.n:,} (the 500/s row: {min(args.n, 2500):,}), rounds={args.rounds}, "
          f"best round shown\n")  # fmt: skip
    print("| row | tasks/s | vs unlimited | Redis commands per task | worker CPU µs/task | "
          "server CPU µs/task |")  # fmt: skip
    print("|---|---|---|---|---|---|")
    base = max(r["rate"] for r in results["unlimited"])
    for label, rows in results.items():
        best = max(rows, key=lambda r: r["rate"])
        extra = f" (limit {best['limit']:,.0f}/s)" if best.get("limit") else ""
        print(f"| {label}{extra} | {best['rate']:,.0f} | {best['rate'] / base:.0%} | "
              f"{best['commands']:.2f} | {best['worker_cpu_us']:.0f} | "
              f"{best['server_cpu_us']:.0f} |")  # fmt: skip


if __name__ == "__main__":
    main()
