"""What a worker records when an attempt times out or returns what cannot be stored: the
error's public name (``tether.TaskTimeout``), in the result and in the dead letter."""

from __future__ import annotations

import asyncio
import threading

import pytest

from tether import TaskFailed, Tether

from ..helpers import running_worker


async def test_a_timed_out_attempt_is_recorded_as_tether_task_timeout(app: Tether) -> None:
    """On the event loop and in a thread (whose slot stays taken until it returns)."""
    release = threading.Event()

    @app.task(timeout=0.05)
    async def slow() -> None:
        await asyncio.sleep(5)

    @app.task(timeout=0.05)
    def slow_thread() -> None:
        release.wait(5)

    handles = [await slow.enqueue(), await slow_thread.enqueue()]
    try:
        async with running_worker(app) as worker:
            for handle in handles:
                with pytest.raises(TaskFailed) as failed:
                    await handle.result(timeout=10)
                assert failed.value.error_type == "tether.TaskTimeout"
                assert "tether.TaskTimeout: " in failed.value.traceback
            assert worker.counters.timed_out == 2
            release.set()
    finally:
        release.set()
    letters = await app.dead_letters().list()
    assert sorted(letter.error.get("type") for letter in letters) == ["tether.TaskTimeout"] * 2


async def test_a_result_that_cannot_be_stored_is_recorded_as_a_result_serialization_error(
    app: Tether,
) -> None:
    @app.task
    async def odd() -> object:
        return object()

    handle = await odd.enqueue()
    async with running_worker(app):
        with pytest.raises(TaskFailed, match="cannot be serialized") as failed:
            await handle.result(timeout=10)
    assert failed.value.error_type == "tether.ResultSerializationError"
