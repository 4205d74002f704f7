"""Tasks for bench/flow.py: the bench's task body (one awaited INCR, bench/body.py) with and
without flow-control limits. The app reads TETHER_URL and TETHER_NAMESPACE."""

from __future__ import annotations

from tether import Tether

from .. import body

app = Tether()

WORKER_CONCURRENCY = 32
BOUND_RATE = "500/s"
"""Far below what one worker does: the limiter decides the rate."""


@app.task(store_result=False)
async def unlimited(i: int) -> None:
    await body.run(i)


@app.task(store_result=False, rate_limit=BOUND_RATE, rate_burst=32)
async def rate_bound(i: int) -> None:
    await body.run(i)


@app.task(store_result=False, rate_limit="1000/s", rate_burst=32)
async def rate_loose(i: int) -> None:
    """Its limit is set at runtime to ten times the unlimited rate (bench/flow.py)."""
    await body.run(i)


@app.task(store_result=False, concurrency_limit=10 * WORKER_CONCURRENCY)
async def concurrency_loose(i: int) -> None:
    await body.run(i)


@app.task(store_result=False, key_concurrency_limit=10 * WORKER_CONCURRENCY)
async def key_concurrency_loose(i: int) -> None:
    await body.run(i)
