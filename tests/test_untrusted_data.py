"""Data Tether cannot trust: task ids made up by callers, records in Redis that are not what
Tether writes, payloads nested deeper than anything renders. Each is refused with the
documented answer, or skipped and reported, never a 500, a traceback or memory kept for good.

Everything is real: a real server, records forged straight into it with redis-py, the API
and the dashboard over HTTP, the ``tether info`` command in a process of its own."""

from __future__ import annotations

import gc
import re
import secrets
import tracemalloc
from collections.abc import AsyncIterator, Callable, Coroutine, Iterator
from typing import Any

import httpx
import pytest

from tether import ConfigError, TaskNotFound, Tether
from tether._keys import KEYS_CACHED, queue_keys
from tether.web import create_app

from .web_helpers import TOKEN, serving, valkey_url  # noqa: F401  (a fixture)

BEARER = {"Authorization": f"Bearer {TOKEN}"}
MB = 1 << 20


@pytest.fixture
def url(valkey_url: str) -> str:  # noqa: F811  (the fixture of that name)
    """One server: what is tested here is how Tether reads, not the kind of server."""
    return valkey_url


@pytest.fixture
def base(url: str, namespace: str) -> Iterator[str]:
    with serving(create_app(Tether(url, namespace=namespace), token=TOKEN)) as address:
        yield address


@pytest.fixture
async def client(base: str) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(base_url=base, headers=BEARER, timeout=30) as c:
        yield c


Step = Callable[[int], Coroutine[Any, Any, object]]


async def grown_by(step: Step, warm_up: int, measured: int) -> int:
    """Bytes still allocated after ``measured`` more rounds of ``step`` than after
    ``warm_up`` rounds (traced from the start, so what a bounded cache drops is seen going)."""
    gc.collect()
    tracemalloc.start()
    try:
        await step(warm_up)
        gc.collect()
        before = tracemalloc.get_traced_memory()[0]
        await step(measured)
        gc.collect()
        return tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()


def made_up_id(queue_chars: int) -> str:
    """A task id nobody enqueued, naming a queue of its own."""
    return f"q{secrets.token_hex(queue_chars // 2)[: queue_chars - 1]}:{'0' * 32}"


# -- B4: made-up task ids -----------------------------------------------------------------


async def test_made_up_task_ids_leave_memory_bounded(app: Tether) -> None:
    """Each made-up id named a queue whose keys were cached for good: 3,000 of them grew a
    process by 135 MB. Well-formed ones now share a bounded cache, malformed ones (a queue
    part that is no queue name) are refused before any key is built."""

    async def ask(task_id: str) -> None:
        with pytest.raises((TaskNotFound, ConfigError)):
            await app.handle(task_id).status()

    async def well_formed(n: int) -> None:
        for _ in range(n):
            await ask(made_up_id(100))

    # Whatever the cache keeps, it holds after the warm-up; then it may only turn over.
    assert await grown_by(well_formed, KEYS_CACHED, 3000) < 1 * MB  # was 6.2 MB, and growing
    assert queue_keys.cache_info().currsize <= KEYS_CACHED

    async def huge(n: int) -> None:
        for _ in range(n):
            with pytest.raises(ConfigError, match=r"\.\.\. \(20\d\d\d characters\)"):
                await app.handle(made_up_id(20_000)).status()

    assert await grown_by(huge, 10, 300) < 1 * MB  # was accepted, keys cached: 70 MB


async def test_malformed_task_ids_answer_422_in_the_api_and_the_dashboard(
    client: httpx.AsyncClient,
) -> None:
    """The documented 422 for a malformed id (it was a 404, after caching its queue)."""
    for bad in ("a:b:c", "-q:1", "bad queue:1", "default:two words", "q" * 101 + ":1"):
        answer = await client.get(f"/api/tasks/{bad}")
        assert answer.status_code == 422, (bad, answer.text)
        assert "not a Tether task id" in answer.json()["detail"][0]["msg"]
        page = await client.get("/task", params={"id": bad})
        assert page.status_code == 422 and "not a Tether task id" in page.text, bad
    # A well-formed id nobody enqueued is unknown: 404, as before.
    assert (await client.get(f"/api/tasks/default:{'0' * 32}")).status_code == 404


async def test_dashboard_form_posts_with_made_up_ids_leave_memory_bounded(base: str) -> None:
    """20 form posts grew the server by 194 MB: a form field has no length limit, and the
    whole field became a queue name whose keys were cached."""
    async with httpx.AsyncClient(base_url=base, timeout=30) as browser:
        await browser.post("/login", data={"token": TOKEN, "next": "/"})
        found = re.search(r'name="csrf_token" value="([^"]+)"', (await browser.get("/")).text)
        assert found
        answers: list[int] = []

        async def post(n: int) -> None:
            for _ in range(n):
                form = {"task_id": made_up_id(100_000), "csrf_token": found.group(1)}
                for action in ("/task/cancel", "/task/run-now"):
                    answer = await browser.post(action, data={**form, "next": "/"})
                    answers.append(answer.status_code)

        # The server's first requests allocate what it keeps anyway: the warm-up.
        assert await grown_by(post, 2, 20) < 4 * MB  # was 22 MB
        assert set(answers) == {303}
        shown = (await browser.get("/")).text
        assert "is not a Tether task id" in shown and len(shown) < 100_000


# -- C7: payloads nested deeper than a JSON encoder goes ------------------------------------


def nested(depth: int) -> list[Any]:
    value: list[Any] = []
    for _ in range(depth):
        value = [value]
    return value


def depth_of(value: Any) -> int:
    """Levels of lists and objects down to the first leaf that is neither."""
    levels = 0
    while isinstance(value, (list, dict)) and value:
        value = value[0] if isinstance(value, list) else next(iter(value.values()))
        levels += 1
    return levels


async def test_arguments_nested_480_levels_deep_render_in_the_api_and_the_task_page(
    app: Tether, client: httpx.AsyncClient
) -> None:
    """The producer accepts them; the API answered 500 (pydantic refuses 255 levels) and
    so did the task page (the indenting JSON encoder ran out of stack)."""

    @app.task
    async def deep(value: Any, *, more: Any = None) -> None: ...

    handle = await deep.enqueue(nested(480), more={"k": nested(480)})
    answer = await client.get(f"/api/tasks/{handle.id}")
    assert answer.status_code == 200, answer.text[:300]
    body = answer.json()
    assert body["status"] == "queued" and body["task"] == deep.name
    # Cut at 64 levels below the arguments, with a marker saying so.
    assert depth_of(body["args"]) == 64 and "nested deeper than 64 levels" in answer.text
    assert depth_of(body["kwargs"]) == 64
    page = await client.get("/task", params={"id": handle.id})
    assert page.status_code == 200 and "nested deeper than 64 levels" in page.text
