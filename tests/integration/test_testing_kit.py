"""tether.testing: the recording and eager modes (no server), drain() and the isolated app
against a real server, and the pytest plugin run in a pytest subprocess."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import textwrap
import threading
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pytest
import redis

from tether import (
    BlockingCallError,
    CancelResult,
    Middleware,
    ResultTimeout,
    Retry,
    SerializationError,
    TaskContext,
    TaskFailed,
    TaskNotFound,
    TaskStatus,
    Tether,
    current_task,
)
from tether.testing import (
    DrainTimeout,
    TaskError,
    drain,
    drain_sync,
    eager,
    isolated,
    recording,
)

from ..helpers import ROOT

# A URL nothing listens on: the in-memory modes never connect.
NOWHERE = "redis://127.0.0.1:1/0"


def make_app() -> Tether:
    return Tether(NOWHERE, namespace="kit")


# -- recording ----------------------------------------------------------------------------


def test_recording_asserts_what_was_enqueued() -> None:
    app = make_app()

    @app.task(queue="emails")
    def send(to: str, *, template: str = "welcome") -> None: ...

    @app.task
    async def add(x: int, y: int) -> int:
        return x + y

    at = datetime(2030, 1, 1, tzinfo=timezone.utc)
    with recording(app) as queue:
        first = send.enqueue_sync("ann@x")
        send.options(delay=60, priority="high").enqueue_sync("bob@x", template="late")
        add.options(at=at).enqueue_sync(1, 2)
        add.enqueue_many_sync([(3, 4), add.call(5, y=6)])

        assert first.status_sync() is TaskStatus.QUEUED
        queue.assert_enqueued(send, "ann@x")
        queue.assert_enqueued(send.options(queue="emails", delay=60), "bob@x", template="late")
        late = queue.assert_enqueued(send.options(priority="high"), "bob@x", template="late")
        assert late.delay == 60 and late.queue == "emails" and late.priority == "high"
        assert queue.matching(add.options(at=at), 1, 2)[0].at == at
        assert len(queue.calls(add)) == 3
        with pytest.raises(AssertionError, match=r"add\(1, 2\) enqueued once, matched 1"):
            queue.assert_enqueued_once(add, 1, 2)  # add was enqueued three times
        with pytest.raises(
            AssertionError, match=r"(?s)delay=30.0 enqueued.*was enqueued as:.*delay=60"
        ):
            queue.assert_enqueued(send.options(delay=30), "bob@x", template="late")
        with pytest.raises(AssertionError, match="expected no enqueue"):
            queue.assert_not_enqueued(send)
        with pytest.raises(ResultTimeout, match="never run in recording mode"):
            first.result_sync(timeout=5)
        assert first.cancel_sync() is CancelResult.CANCELLED
        assert first.status_sync() is TaskStatus.CANCELLED
        # A flow-control limit key is an option like the others.
        send.options(limit_key="tenant:7").enqueue_sync("cy@x")
        keyed = queue.assert_enqueued(send.options(limit_key="tenant:7"), "cy@x")
        assert keyed.options["limit_key"] == "tenant:7"
        with pytest.raises(AssertionError, match="limit_key='tenant:8'"):
            queue.assert_enqueued(send.options(limit_key="tenant:8"), "cy@x")
    assert app.intercept is None  # the block left the app as it found it


def test_recording_keeps_the_producer_checks_and_dedup() -> None:
    app = make_app()

    @app.task
    def takes(value: object) -> None: ...

    with recording(app) as queue:
        with pytest.raises(SerializationError, match=r"argument 'value' \(lock\)"):
            takes.enqueue_sync(threading.Lock())
        assert queue.enqueued == []
        one = takes.options(key="k").enqueue_sync(1)
        two = takes.options(key="k").enqueue_sync(2)
        assert two.duplicate and two.id == one.id
        assert len(queue.calls(takes)) == 1 and queue.enqueued[1].duplicate
        queue.assert_enqueued_once(takes.options(key="k"), 1)
        one.cancel_sync()  # releases the key
        assert not takes.options(key="k").enqueue_sync(3).duplicate
        by_name = app.enqueue_by_name_sync("elsewhere.job", 7)
        assert queue.calls("elsewhere.job")[0].args == (7,)
        assert by_name.id.startswith("default:")


def test_recorded_arguments_are_a_tuple_of_what_the_worker_decodes() -> None:
    """As docs/testing.md says (it said they compare as lists): ``Enqueued.args`` is a tuple,
    like ``unittest.mock``'s ``call.args``, of the values after the serializer (a tuple
    argument is a list, as the worker receives it); an expectation goes through the
    serializer too, so it is written as the call was."""
    app = make_app()

    @app.task
    def engrave(item: str, size: tuple[int, int], gift: bool = False) -> None: ...

    with recording(app) as queue:
        engrave.enqueue_sync("mug", (8, 10), gift=True)
        found = queue.assert_enqueued_once(engrave, "mug", (8, 10), gift=True)
        assert type(found.args) is tuple and found.args == ("mug", [8, 10])
        assert found.args != ["mug", [8, 10]]  # not a list
        assert found.kwargs == {"gift": True}
        assert queue.matching(engrave, "mug", [8, 10], gift=True) == [found]  # type: ignore[arg-type]
        assert queue.matching(engrave, "mug", (8, 11), gift=True) == []
    with eager(app) as queue:  # the eager mode records the same
        engrave.enqueue_sync("mug", (8, 10))
        assert queue.enqueued[0].args == ("mug", [8, 10])


async def test_recording_from_asyncio_and_the_loop_guard() -> None:
    app = make_app()

    @app.task
    async def job(n: int) -> int:
        return n

    with recording(app) as queue:
        handle = await job.enqueue(1)
        assert await handle.status() is TaskStatus.QUEUED
        with pytest.raises(BlockingCallError, match="enqueue_sync"):
            job.enqueue_sync(2)  # refused on the loop's thread, as for real
        assert [c.args for c in queue.calls(job)] == [(1,)]


# -- eager --------------------------------------------------------------------------------


class Hooks(Middleware):
    def __init__(self) -> None:
        self.seen: list[str] = []

    def before_enqueue(self, task_name: str, queue: str, headers: dict[str, str]) -> None:
        headers["trace"] = "t1"
        self.seen.append("before_enqueue")

    async def on_enqueue(self, task_name: str, task_id: str, queue: str) -> None:
        self.seen.append("on_enqueue")

    async def before_run(self, ctx: TaskContext) -> None:
        self.seen.append(f"before_run:{ctx.attempt}")

    async def after_run(self, ctx: TaskContext, status: str, value: Any, error: Any) -> None:
        self.seen.append(f"after_run:{status}")

    async def on_retry(self, ctx: TaskContext, error: BaseException, delay: float) -> None:
        self.seen.append("on_retry")

    async def on_dead(self, ctx: TaskContext | None, task_id: str, reason: str) -> None:
        self.seen.append("on_dead")


def test_eager_runs_at_enqueue_with_retries_hooks_and_context() -> None:
    hooks = Hooks()
    app = Tether(NOWHERE, namespace="kit", middleware=[hooks])
    attempts: list[tuple[int, int, str]] = []

    @app.task(retries=2)
    def flaky(n: int) -> dict[str, int]:
        ctx = current_task()
        attempts.append((ctx.attempt, ctx.max_attempts, ctx.headers["trace"]))
        if ctx.attempt < 3:
            raise Retry(delay=30)  # the delay is not waited for
        return {"n": n, "attempt": ctx.attempt}

    @app.task
    async def add(x: int, y: int) -> int:
        return x + y

    with eager(app) as queue:
        handle = flaky.enqueue_sync(5)
        assert handle.status_sync() is TaskStatus.SUCCEEDED
        assert handle.result_sync() == {"n": 5, "attempt": 3}
        assert attempts == [(1, 3, "t1"), (2, 3, "t1"), (3, 3, "t1")]
        assert add.enqueue_sync(1, 2).result_sync() == 3
        queue.assert_enqueued_once(flaky, 5)
    assert hooks.seen[:8] == [
        "before_enqueue", "on_enqueue", "before_run:1", "on_retry", "before_run:2",
        "on_retry", "before_run:3", "after_run:succeeded",
    ]  # fmt: skip


def test_eager_failures_timeouts_and_dead_letters() -> None:
    hooks = Hooks()
    app = Tether(NOWHERE, namespace="kit", middleware=[hooks])

    @app.task(retries=1, retry_on=(ConnectionError,))
    def broken() -> None:
        raise ValueError("no")

    @app.task(timeout=0.05)
    async def slow() -> None:
        await asyncio.sleep(5)

    @app.task(timeout=0.05)
    def slow_thread() -> None:
        threading.Event().wait(0.3)

    @app.task
    def unstorable() -> object:
        return object()

    with eager(app) as queue:
        failed = broken.enqueue_sync()
        with pytest.raises(TaskFailed, match="ValueError: no") as info:
            failed.result_sync()
        assert info.value.status == "failed" and "raise ValueError" in info.value.traceback
        assert hooks.seen[-2:] == ["after_run:failed", "on_dead"]
        with pytest.raises(TaskFailed, match="TaskTimeout"):
            slow.enqueue_sync().result_sync()
        with pytest.raises(TaskFailed, match="ran past its timeout"):
            slow_thread.enqueue_sync().result_sync()
        with pytest.raises(TaskFailed, match="cannot be serialized"):
            unstorable.enqueue_sync().result_sync()
        ghost = app.enqueue_by_name_sync("not.registered", 1)
        assert ghost.status_sync() is TaskStatus.DEAD
        reasons = dict(queue.dead)
        assert "not in retry_on" in reasons[failed.id]
        assert "unknown task 'not.registered'" in reasons[ghost.id]

    with eager(app, propagate=True), pytest.raises(TaskError) as raised:
        broken.enqueue_sync()
    assert isinstance(raised.value.__cause__, ValueError)


async def test_eager_drain_order_nesting_and_cancel() -> None:
    app = make_app()
    order: list[str] = []

    @app.task
    async def step(name: str) -> str:
        order.append(name)
        if name == "parent":
            await step.enqueue("child")
        return name

    @app.task
    def blocking(name: str) -> str:
        order.append(name)
        step.enqueue_sync(f"{name}-child")  # a plain task enqueues from its thread
        return name

    with eager(app, inline=False) as queue:
        low = await step.options(priority="low").enqueue("low")
        await step.options(delay=3600).enqueue("later")
        await step.enqueue("parent")
        await step.options(priority="high").enqueue("high")
        await blocking.enqueue("sync")
        doomed = await step.enqueue("doomed")
        assert await doomed.cancel() is CancelResult.CANCELLED
        with pytest.raises(ResultTimeout, match=r"queue\.drain\(\)"):
            await low.result()
        assert await queue.drain() == 7
        assert await low.result() == "low"
    # Due tasks by priority, then in enqueue order (the children too); delayed ones last.
    assert order == ["high", "parent", "sync", "child", "sync-child", "low", "later"]


def test_eager_a_task_that_exits_fails_as_under_a_worker() -> None:
    """``sys.exit()`` and ``KeyboardInterrupt`` in a task fail it, as under ``tether
    worker``: they never end the test run."""
    app = make_app()

    @app.task
    def exits() -> None:
        sys.exit(3)

    @app.task(timeout=5)
    async def interrupted() -> None:
        raise KeyboardInterrupt

    with eager(app):
        with pytest.raises(TaskFailed) as exited:
            exits.enqueue_sync().result_sync()
        assert (exited.value.status, exited.value.error_type) == ("failed", "SystemExit")
        assert exited.value.error_message == "3"
        with pytest.raises(TaskFailed) as interrupt:
            interrupted.enqueue_sync().result_sync()
        assert interrupt.value.error_type == "KeyboardInterrupt"


def test_eager_dedup_holds_the_key_while_the_task_runs() -> None:
    app = make_app()
    inner: list[bool] = []

    @app.task
    def once(n: int) -> int:
        inner.append(once.options(key="k").enqueue_sync(n + 1).duplicate)
        return n

    @app.task
    def held(n: int) -> int:
        return n

    with eager(app) as queue:
        once.options(key="k").enqueue_sync(1)
        assert inner == [True]  # the key was held while the first one ran
        assert not once.options(key="k").enqueue_sync(2).duplicate  # released at its end
        held.options(key="h", key_ttl=3600).enqueue_sync(1)
        assert held.options(key="h").enqueue_sync(2).duplicate  # key_ttl keeps it held
        assert len(queue.calls(held)) == 1
        quiet = held.options(store_result=False).enqueue_sync(3)
        with pytest.raises(TaskNotFound):
            quiet.status_sync()


def test_eager_tasks_that_enqueue_tasks_inline_nest_deeply() -> None:
    app = make_app()

    @app.task
    def chain(n: int) -> int:
        # Each level waits in its thread for the next, run inline by its enqueue.
        return 0 if n == 0 else 1 + chain.enqueue_sync(n - 1).result_sync()

    with eager(app):
        assert chain.enqueue_sync(20).result_sync() == 20


# -- against a real server ----------------------------------------------------------------


async def test_drain_runs_queued_delayed_and_retried_tasks(
    url: str, namespace: str, rds: redis.Redis
) -> None:
    app = Tether(url, namespace=namespace)
    seen: list[int] = []

    @app.task(retries=1)
    async def job(n: int) -> int:
        if n == 0 and current_task().attempt == 1:
            raise Retry(delay=0.2)
        seen.append(n)
        if n == 1:
            await job.options(delay=0.3).enqueue(2)
        return n

    @app.task(queue="other")
    def later(n: int) -> int:
        return n

    async with app:
        await job.enqueue(0)
        await job.enqueue(1)
        far = await later.options(delay=3600).enqueue(9)
        with pytest.raises(DrainTimeout, match="1 delayed tasks left"):
            await drain(app, timeout=1)
        assert sorted(seen) == [0, 1, 2]
        counters = await drain(app, due_now=True)
        assert counters.succeeded == 1 and await far.result() == 9


def test_drain_sync_and_isolation(url: str, rds: redis.Redis) -> None:
    app = make_app()

    @app.task
    def triple(n: int) -> int:
        return 3 * n

    with isolated(app, url) as isolated_app:
        namespace = isolated_app.namespace
        assert namespace.startswith("test-")
        handles = triple.enqueue_many_sync([(i,) for i in range(5)])
        drain_sync(isolated_app)
        assert [h.result_sync(timeout=1) for h in handles] == [0, 3, 6, 9, 12]
        assert list(rds.scan_iter(f"{{{namespace}:*"))
    assert not list(rds.scan_iter(f"{{{namespace}:*"))  # every key of the test is gone
    assert app.settings.url == NOWHERE and app.namespace == "kit"


# -- the pytest plugin --------------------------------------------------------------------


def run_pytest(tmp_path: Path, source: str, *args: str) -> subprocess.CompletedProcess[str]:
    test_file = tmp_path / "test_example.py"
    test_file.write_text(textwrap.dedent(source))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TETHER_", "PYTEST_"))}
    env["PYTHONPATH"] = str(ROOT)
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(test_file), *args],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_the_plugin_gives_an_isolated_app_and_drain(tmp_path: Path) -> None:
    done = run_pytest(
        tmp_path,
        """
        import pytest
        from tether import Tether

        app = Tether()

        @app.task
        def square(n: int) -> int:
            return n * n

        @pytest.fixture(scope="session")
        def tether_base_app() -> Tether:
            return app

        namespaces = []

        @pytest.mark.parametrize("n", [2, 3])
        def test_square(tether_app, tether_drain, n):
            namespaces.append(tether_app.namespace)
            handle = square.enqueue_sync(n)
            tether_drain()
            assert handle.result_sync(timeout=1) == n * n

        def test_each_test_had_its_own_namespace(tether_server):
            import redis
            assert len(set(namespaces)) == 2
            client = redis.Redis.from_url(tether_server)
            assert not [k for n in namespaces for k in client.scan_iter(f"{{{n}:*")]

        def test_eager_needs_no_server(tether_eager):
            assert square.enqueue_sync(4).result_sync() == 16
            tether_eager.assert_enqueued_once(square, 4)
        """,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "4 passed" in done.stdout


def test_the_plugin_starts_nothing_unless_asked(tmp_path: Path) -> None:
    source = """
        def test_plain(request):
            # No fixture of the plugin's is used unless a test asks for it.
            assert not [f for f in request.fixturenames if f.startswith("tether_")]
        """
    planned = run_pytest(tmp_path, source, "--setup-plan")  # what would be set up
    assert planned.returncode == 0, planned.stdout + planned.stderr
    assert "tether_server" not in planned.stdout
    ran = run_pytest(tmp_path, source)  # and the test itself, run
    assert ran.returncode == 0 and "1 passed" in ran.stdout, ran.stdout + ran.stderr
