"""Every attempt of a task is kept with its error: the settle of a retry appends the attempt's
record to the task's attempt list, which expires with the task's result."""

from __future__ import annotations

import pytest
import redis

from tether import Tether
from tether.admin import Stats

from ..helpers import eventually, running_worker

pytestmark = pytest.mark.compat  # the settle script, on every server kind


async def test_each_retried_attempt_keeps_its_error_and_expires_with_the_result(
    app: Tether, rds: redis.Redis
) -> None:
    runs = {"n": 0}

    @app.task(retries=3, result_ttl=600, backoff=lambda attempt: 0.01)
    async def upload(name: str) -> str:
        runs["n"] += 1
        if runs["n"] < 3:
            raise ConnectionError(f"storage refused attempt {runs['n']} of {name}")
        return "stored"

    @app.task(retries=0, store_result=False)
    async def quiet() -> None:
        raise RuntimeError("not kept")

    handle = await upload.enqueue("report.pdf")
    silent = await quiet.enqueue()
    async with running_worker(app, scheduler=False):
        assert await handle.result(timeout=10) == "stored"
        await eventually(lambda: rds.xlen(app.keys("default").dead) == 1)
    info = await Stats(app).task(handle.id)
    assert info.status == "succeeded" and info.attempt == 3
    assert [a.attempt for a in info.earlier_attempts] == [1, 2]
    for n, earlier in enumerate(info.earlier_attempts, start=1):
        assert earlier.error is not None
        assert earlier.error.type == "ConnectionError"
        assert earlier.error.message == f"storage refused attempt {n} of report.pdf"
        assert earlier.started_at is not None and earlier.finished_at is not None
    keys = app.keys("default")
    attempts_ttl = rds.pttl(keys.attempts(handle.id))
    result_ttl = rds.pttl(keys.result(handle.id))
    assert 590_000 < attempts_ttl <= 600_000 and abs(attempts_ttl - result_ttl) < 2_000
    # A task that stores no result keeps no attempts either.
    assert not rds.exists(keys.attempts(silent.id))
