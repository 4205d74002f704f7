"""The blocking twins of the admin readers (``app.dead_letters(q).count_sync()``,
``app.stats.overview_sync()``, ...), for scripts and tests that run no event loop: the same
answers as the async readers, against a real server, without opening the app; refused on a
thread that runs a loop; usable from threads while the app is open on a loop elsewhere."""

from __future__ import annotations

import asyncio
import threading

import pytest

from tether import Tether
from tether.base._errors import BlockingCallError


def _burst(app: Tether) -> None:
    """A burst worker of ``app`` runs what is queued (and dead-letters what fails)."""
    app.close_sync()

    async def burst() -> None:
        async with app:
            await app.worker(burst=True, scheduler=False, give_up_after=10).run()

    asyncio.run(burst())


def _dead_letters(app: Tether, count: int) -> list[str]:
    """``count`` tasks no worker knows, dead-lettered by a burst worker: their task ids."""
    ids = [app.enqueue_by_name_sync("no.such.task", i).id for i in range(count)]
    _burst(app)
    return ids


def test_the_dead_letter_twins_read_retry_and_purge(url: str, namespace: str) -> None:
    app = Tether(url, namespace=namespace)
    first, second = _dead_letters(app, 2)
    letters = app.dead_letters("default")

    assert letters.count_sync() == 2
    listed = letters.list_sync()
    assert [letter.task_id for letter in listed] == [second, first]  # newest first
    assert "unknown task 'no.such.task'" in listed[0].reason
    assert letters.show_sync(first).task_id == first
    assert [letter.task_id for letter in letters.find_sync(second)] == [second]
    page = letters.page_sync(limit=1)
    assert [letter.task_id for letter in page.items] == [second] and page.cursor is not None
    assert not app.is_open  # each twin used a connection of its own, not the app's

    handle = letters.retry_sync(first)
    assert handle.id == first and handle.app is app
    assert handle.status_sync().value == "queued"
    assert letters.count_sync() == 1
    assert letters.purge_sync() == 1
    assert letters.count_sync() == 0

    app.enqueue_by_name_sync("no.such.task", 3)
    _burst(app)  # the retried one fails again, and this one too
    total = letters.retry_all_sync()
    assert (total.done, total.failed) == (2, 0)
    assert letters.purge_all_sync().done == 0  # retried: none is left
    app.close_sync()


def test_the_stats_twins_answer_as_the_readers(url: str, namespace: str) -> None:
    app = Tether(url, namespace=namespace)

    @app.task(name="breaks")
    def breaks() -> None:
        raise ValueError("no ink")

    breaks.enqueue_sync()
    dead = breaks.enqueue_sync().id
    _burst(app)  # both fail: two dead letters
    waiting = breaks.enqueue_sync()
    app.close_sync()

    overview = app.stats.overview_sync()
    (queue,) = [q for q in overview.queues if q.name == "default"]
    assert (queue.depth, queue.dead) == (1, 2)
    assert (app.stats.queue_sync("default").depth, app.stats.queue_sync("default").dead) == (1, 2)
    assert "default" in app.stats.queue_names_sync().items
    assert app.stats.task_sync(waiting.id).status == "queued"
    assert app.stats.task_sync(dead).status == "failed"
    assert app.stats.health_sync().reachable
    assert app.stats.workers_sync().items == [] and app.stats.all_workers_sync() == []
    assert app.stats.running_sync("default").items == []
    assert app.stats.delayed_sync("default").items == []
    (stats,) = app.stats.tasks_sync("default")
    assert (stats.task, stats.counts.failed) == ("breaks", 2)
    assert [t.task for t in app.stats.tasks_page_sync("default").items] == ["breaks"]
    assert sum(m.counts.failed for m in app.stats.throughput_sync("default", minutes=5)) == 2

    async def the_same_read_async() -> int:
        async with app:
            return (await app.stats.queue("default")).dead

    assert asyncio.run(the_same_read_async()) == queue.dead
    assert not app.is_open


async def test_a_twin_on_a_thread_that_runs_a_loop_is_refused(url: str, namespace: str) -> None:
    app = Tether(url, namespace=namespace)
    with pytest.raises(BlockingCallError, match=r"count_sync\(\) blocks.*await \.\.\.count"):
        app.dead_letters("default").count_sync()
    with pytest.raises(BlockingCallError, match=r"overview_sync\(\) blocks"):
        app.stats.overview_sync()


async def test_twins_in_threads_while_the_app_is_open_on_a_loop(url: str, namespace: str) -> None:
    """A sync helper called from threads of an async service: each call has a connection of
    its own, and the app's stays open and usable on its loop."""
    app = Tether(url, namespace=namespace)
    await asyncio.to_thread(_dead_letters, app, 2)
    async with app:
        counts: list[int] = []
        threads = [
            threading.Thread(target=lambda: counts.append(app.dead_letters("default").count_sync()))
            for _ in range(4)
        ]
        await asyncio.to_thread(lambda: [t.start() for t in threads])
        await asyncio.to_thread(lambda: [t.join(30) for t in threads])
        assert counts == [2, 2, 2, 2]
        assert app.is_open and await app.dead_letters("default").count() == 2
