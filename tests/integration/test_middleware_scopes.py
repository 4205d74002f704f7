"""The two middleware seams tracing is built on, with any middleware: ``before_enqueue`` /
``after_enqueue`` around each enqueue call, and ``run_scope`` around each run of a task's
function. A real server and an in-process worker."""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import logging
import threading
from collections.abc import Iterator, Sequence
from typing import Any

import pytest

from tether import (
    ArgumentSerializationError,
    Backoff,
    Middleware,
    SerializationError,
    TaskContext,
    Tether,
    current_task,
)

from ..helpers import running_worker

SCOPE: contextvars.ContextVar[str] = contextvars.ContextVar("scope", default="")


class Recorder(Middleware):
    def __init__(self, name: str, calls: list[tuple[Any, ...]]) -> None:
        self.name = name
        self.calls = calls

    def before_enqueue(self, task_name: str, queue: str, headers: dict[str, str]) -> None:
        headers[self.name] = "1"
        self.calls.append((self.name, "before", task_name, queue))

    def after_enqueue(
        self, task_name: str, queue: str, task_ids: Sequence[str], error: BaseException | None
    ) -> None:
        self.calls.append((self.name, "after", task_name, list(task_ids), type(error)))

    def run_scope(
        self, ctx: TaskContext, retry_headers: dict[str, str]
    ) -> contextlib.AbstractContextManager[Any]:
        retry_headers[f"{self.name}-ran"] = str(ctx.attempt)
        return self._scope(ctx)

    @contextlib.contextmanager
    def _scope(self, ctx: TaskContext) -> Iterator[None]:
        token = SCOPE.set(f"{SCOPE.get()}{self.name}")
        self.calls.append((self.name, "enter", ctx.attempt))
        try:
            yield
        except BaseException as exc:
            self.calls.append((self.name, "exit", type(exc).__name__))
            raise
        else:
            self.calls.append((self.name, "exit", None))
        finally:
            SCOPE.reset(token)


async def test_after_enqueue_pairs_before_enqueue_in_every_producer(
    url: str, namespace: str
) -> None:
    calls: list[tuple[Any, ...]] = []
    app = Tether(url, namespace=namespace, middleware=[Recorder("a", calls), Recorder("b", calls)])

    @app.task(name="m.add")
    async def add(x: int, y: int) -> int:
        return x + y

    async with app:
        one = await add.enqueue(1, 2)
        many = await add.enqueue_many([(1, 1), (2, 2)])
        assert await add.enqueue_many([]) == []  # nothing to send: no hook
        keyed = await add.options(key="k").enqueue(3, 3)
        again = await add.options(key="k").enqueue(4, 4)  # refused: the key is held
        with pytest.raises(SerializationError):
            await add.enqueue(object(), 1)  # type: ignore[arg-type]
    # The blocking producers go through the same hooks (from a thread without a loop).
    sync_one = await asyncio.to_thread(add.enqueue_sync, 5, 5)
    sync_many = await asyncio.to_thread(add.enqueue_many_sync, [(6, 6)])
    app.close_sync()
    none = type(None)

    def pair(task_ids: list[str], error: type[BaseException] = none) -> list[Any]:
        return [
            ("a", "before", "m.add", "default"),
            ("b", "before", "m.add", "default"),
            ("b", "after", "m.add", task_ids, error),  # in reverse order
            ("a", "after", "m.add", task_ids, error),
        ]

    assert calls == [
        *pair([one.id]),
        *pair([h.id for h in many]),
        *pair([keyed.id]),
        *pair([keyed.id]),  # a duplicate's handle names the task holding the key
        *pair([], ArgumentSerializationError),  # the exact type the hook receives
        *pair([sync_one.id]),
        *pair([sync_many[0].id]),
    ]
    assert again.duplicate and again.id == keyed.id


async def test_run_scopes_surround_the_function_in_its_own_context(
    url: str, namespace: str
) -> None:
    calls: list[tuple[Any, ...]] = []
    seen: list[tuple[str, str, dict[str, str]]] = []
    app = Tether(url, namespace=namespace, middleware=[Recorder("a", calls), Recorder("b", calls)])

    @app.task(name="m.async", retries=1, backoff=Backoff(base=0.01, jitter=0))
    async def in_loop() -> str:
        seen.append(("loop", SCOPE.get(), dict(current_task().headers)))
        if current_task().attempt == 1:
            raise ValueError("again")
        return "done"

    @app.task(name="m.sync")
    def in_thread() -> str:
        seen.append((threading.current_thread().name[:11], SCOPE.get(), {}))
        return "done"

    async with app:
        first = await in_loop.enqueue()
        second = await in_thread.enqueue()
        calls.clear()
        async with running_worker(app):  # not burst: it waits for the retry's backoff
            assert await first.result(timeout=10) == "done"
            assert await second.result(timeout=10) == "done"

    # The scopes' context variable is what the function sees, on the loop and in a thread.
    by_where = {(where, scope) for where, scope, _ in seen}
    assert by_where == {("loop", "ab"), ("tether-task", "ab")}
    # What a scope put in retry_headers reached the next attempt, beside the producer's.
    first_attempt, second_attempt = [h for where, _, h in seen if where == "loop"]
    assert first_attempt == {"a": "1", "b": "1"}
    assert second_attempt == {"a": "1", "b": "1", "a-ran": "1", "b-ran": "1"}
    # Entered in order, exited in reverse, with the function's exception.
    retried = [c for c in calls if c[1] in ("enter", "exit")]
    assert retried.count(("a", "enter", 1)) == 2  # the async first attempt and the sync run
    assert ("b", "exit", "ValueError") in retried and ("a", "exit", "ValueError") in retried
    assert retried.index(("b", "exit", "ValueError")) < retried.index(("a", "exit", "ValueError"))
    assert ("a", "enter", 2) in retried


async def test_eager_mode_runs_the_same_scopes_as_a_worker() -> None:
    """The eager mode runs each attempt with the worker's attempt policy: the run scopes
    surround the function (on the loop and in a thread), in order, and what a scope put in
    ``retry_headers`` reaches the next attempt. It used to skip ``run_scope`` altogether."""
    from tether.testing import eager

    calls: list[tuple[Any, ...]] = []
    seen: list[tuple[str, str, dict[str, str]]] = []
    app = Tether("redis://127.0.0.1:9/0", middleware=[Recorder("a", calls), Recorder("b", calls)])

    @app.task(name="m.async", retries=1, backoff=Backoff(base=0.01, jitter=0))
    async def in_loop() -> str:
        seen.append(("loop", SCOPE.get(), dict(current_task().headers)))
        if current_task().attempt == 1:
            raise ValueError("again")
        return "done"

    @app.task(name="m.sync")
    def in_thread() -> str:
        seen.append(("thread", SCOPE.get(), {}))
        return "done"

    with eager(app):
        assert await (await in_loop.enqueue()).result() == "done"
        assert await (await in_thread.enqueue()).result() == "done"

    assert {(where, scope) for where, scope, _ in seen} == {("loop", "ab"), ("thread", "ab")}
    first_attempt, second_attempt = [h for where, _, h in seen if where == "loop"]
    assert first_attempt == {"a": "1", "b": "1"}
    assert second_attempt == {"a": "1", "b": "1", "a-ran": "1", "b-ran": "1"}
    scoped = [c for c in calls if c[1] in ("enter", "exit")]
    assert scoped == [
        ("a", "enter", 1), ("b", "enter", 1), ("b", "exit", "ValueError"),
        ("a", "exit", "ValueError"),
        ("a", "enter", 2), ("b", "enter", 2), ("b", "exit", None), ("a", "exit", None),
        ("a", "enter", 1), ("b", "enter", 1), ("b", "exit", None), ("a", "exit", None),
    ]  # fmt: skip


class Broken(Middleware):
    """A scope that fails to enter, and one that tries to swallow the task's error."""

    def __init__(self, how: str) -> None:
        self.how = how

    def run_scope(
        self, ctx: TaskContext, retry_headers: dict[str, str]
    ) -> contextlib.AbstractContextManager[Any]:
        if self.how == "raise":
            raise RuntimeError("scope broke")
        return _Swallow()


class _Swallow:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> bool:
        return True  # would suppress the exception in a plain `with`


async def test_a_broken_scope_is_logged_and_cannot_hide_the_tasks_error(
    url: str, namespace: str, caplog: pytest.LogCaptureFixture
) -> None:
    app = Tether(url, namespace=namespace, middleware=[Broken("raise"), Broken("swallow")])

    @app.task(name="m.fails")
    async def fails() -> None:
        raise KeyError("lost")

    @app.task(name="m.works")
    async def works() -> int:
        return 7

    async with app:
        failing = await fails.enqueue()
        working = await works.enqueue()
        with caplog.at_level(logging.ERROR, logger="tether.middleware"):
            await app.worker(burst=True).run()
        assert await working.result(timeout=5) == 7
        assert (await failing.status()).value == "failed"
    assert "middleware Broken.run_scope failed; carrying on" in caplog.text
