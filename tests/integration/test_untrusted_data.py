"""Data Tether cannot trust: task ids made up by callers, records in Redis that are not what
Tether writes, payloads nested deeper than anything renders. Each is refused with the
documented answer, or skipped and reported, never a 500, a traceback or memory kept for good.

Everything is real: a real server, records forged straight into it with redis-py, the API
and the dashboard over HTTP, the ``tether info`` command in a process of its own."""

from __future__ import annotations

import asyncio
import gc
import json
import logging
import os
import re
import secrets
import subprocess
import sys
import time
import tracemalloc
from collections.abc import AsyncIterator, Callable, Coroutine, Iterator
from typing import Any

import httpx
import pytest
import redis

from tether import ConfigError, TaskNotFound, Tether
from tether.base._schedule import Schedule
from tether.protocol._keys import (
    KEYS_CACHED,
    QueueKeys,
    SchedulerKeys,
    known_queues_key,
    overrides_key,
    queue_keys,
    registry_keys,
)
from tether.scheduler import Scheduler
from tether.web import create_app

from ..web_helpers import TOKEN, serving, valkey_url  # noqa: F401  (a fixture)

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


def enqueued_ticks(rds: redis.Redis, namespace: str, schedule: str) -> list[int]:
    """Tick times of the schedule's runs sitting in the default queue, in stream order."""
    out = []
    for stream in QueueKeys.of(namespace, "default").streams:
        for _, fields in rds.xrange(stream):
            opts = json.loads(fields[b"m"]).get("opts", {})
            if opts.get("schedule") == schedule:
                out.append(opts["tick"])
    return out


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
        assert "is not a task id" in answer.json()["detail"][0]["msg"]
        page = await client.get("/task", params={"id": bad})
        assert page.status_code == 422 and "is not a task id" in page.text, bad
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
        assert "is not a task id" in shown and len(shown) < 100_000


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


# -- C6: records in Redis that are not what Tether writes -----------------------------------


def forge_bad_records(rds: redis.Redis, namespace: str) -> str:
    """Beside one good worker and one good statistics field, a record of every kind that
    no Tether writes: the worker registry, statistics, the known queues, delayed tasks,
    task records, schedule markers. Returns the good worker's name."""
    index, prefix = registry_keys(namespace)
    now_ms = int(time.time() * 1000)
    good = {"name": "good-worker", "host": "h", "pid": 1, "queues": ["default"],
            "started_ms": now_ms, "heartbeat_ms": now_ms}  # fmt: skip
    bad_workers = {
        "bad-time": {**good, "name": "bad-time", "started_ms": "yesterday"},
        "bad-queues": {**good, "name": "bad-queues", "queues": 5},
        "far-future": {**good, "name": "far-future", "heartbeat_ms": 1e300},
        "not-json": b"{not json",
        "too-deep": b"[" * 100_000 + b"]" * 100_000,
    }
    rds.set(prefix + "good-worker", json.dumps(good))
    for name, record in bad_workers.items():
        rds.set(prefix + name, record if isinstance(record, bytes) else json.dumps(record))
    rds.zadd(index, {name: now_ms for name in ["good-worker", *bad_workers]})
    rds.zadd(index, {b"\xff\xfe": now_ms})  # a name that is not text
    keys = QueueKeys.of(namespace, "default")
    minute = keys.stats_minute(int(time.time() // 60))
    rds.hset(minute, mapping={"ops.ok|ok": 3, "ops.ok|r9999": 1, "ops.ok|r\u00b2": 1,
                              "ops.ok|fail": "many", b"\xff|ok": 1})  # fmt: skip
    rds.zadd(known_queues_key(namespace), {"default": 0, "bad name!": 0, b"\xff": 0})
    rds.zadd(keys.delayed, {f"default:{'1' * 32}": float("inf")})
    rds.set(keys.result(f"default:{'2' * 32}"), b"{not json")
    rds.set(keys.result(f"default:{'3' * 32}"), json.dumps({"status": "succeeded",
            "finished_ms": "soon", "started_ms": 1e300, "attempt": "two"}))  # fmt: skip
    return "good-worker"


READERS = [
    "/api/workers", "/api/workers/good-worker", "/api/queues", "/api/queues/default",
    "/api/queues/default/delayed", "/api/queues/default/throughput", "/api/stats/tasks",
    f"/api/tasks/default:{'2' * 32}", f"/api/tasks/default:{'3' * 32}", "/api/schedules",
    "/", "/fragments/overview", "/workers", "/stats", "/queues/default",
    "/queues/default/scheduled", "/schedules", f"/task?id=default:{'3' * 32}", "/metrics",
]  # fmt: skip


async def test_malformed_records_are_skipped_and_reported_never_a_500(
    client: httpx.AsyncClient,
    rds: redis.Redis,
    namespace: str,
    url: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """One malformed worker-registry record answered 500 on the overview, /workers and the
    queue and worker APIs, crashed `tether info` and set tether_up 0; one malformed
    statistics field did the same to the statistics. Now each is left out, logged once
    with its key and counted; what is readable shows as before."""
    good = forge_bad_records(rds, namespace)
    with caplog.at_level(logging.WARNING, logger="tether.admin"):
        for _ in range(2):  # a second reading logs nothing new
            failed = {}
            for path in READERS:
                answer = await client.get(path)
                if answer.status_code != 200:
                    failed[path] = (answer.status_code, answer.text[:200])
            assert not failed
    logged = [r.getMessage() for r in caplog.records if "unreadable" in r.getMessage()]
    assert len(logged) == len(set(logged)), "a record is logged once"
    assert any("worker record" in m and "bad-time" in m for m in logged)
    assert any("statistics record" in m and "r9999" in m for m in logged)
    workers = (await client.get("/api/workers")).json()["items"]
    assert [w["name"] for w in workers] == [good]
    (stats,) = (await client.get("/api/stats/tasks")).json()["items"]
    assert stats["counts"]["succeeded"] == 3 and stats["task"] == "ops.ok"
    queues = [q["name"] for q in (await client.get("/api/queues")).json()["items"]]
    assert queues == ["default"]
    assert (await client.get("/api/queues/default")).json()["next_due_s"] is None
    record = (await client.get(f"/api/tasks/default:{'3' * 32}")).json()
    assert record["status"] == "succeeded" and record["attempt"] is None
    metrics = (await client.get("/metrics")).text
    assert "tether_up 1.0" in metrics and "tether_workers 1.0" in metrics
    for kind in ("worker", "statistics", "queue", "delayed", "task"):
        found = re.search(rf'tether_unreadable_records_total{{kind="{kind}"}} (\d+)', metrics)
        assert found and int(found.group(1)) > 0, kind
    env = {**os.environ, "TETHER_URL": url, "TETHER_NAMESPACE": namespace}
    info = await asyncio.to_thread(
        subprocess.run, [sys.executable, "-m", "tether", "info", "--json"],
        capture_output=True, text=True, timeout=60, env=env,
    )  # fmt: skip
    assert info.returncode == 0, info.stderr
    overview = json.loads(info.stdout)
    assert overview["workers"] == 1 and [q["name"] for q in overview["queues"]] == ["default"]
    assert "Traceback" not in info.stderr and "skipped an unreadable worker record" in info.stderr


def run_cli(url: str, namespace: str, *args: str) -> subprocess.CompletedProcess[str]:
    """The real ``tether`` command, in a process of its own."""
    env = {**os.environ, "TETHER_URL": url, "TETHER_NAMESPACE": namespace}
    return subprocess.run(
        [sys.executable, "-m", "tether", *args],
        capture_output=True, text=True, timeout=60, env=env,
    )  # fmt: skip


PAST_9999_MS = 10**17
"""A time in unix milliseconds past the year 9999: no datetime holds it."""


def forge_bad_schedules(rds: redis.Redis, namespace: str) -> dict[str, str]:
    """Runtime schedules whose tick markers no Tether writes, beside one whose marker is
    good, and definitions, pauses, errors and a leader that are not text or not JSON.
    Returns the good schedule's name -> its last task id."""
    keys = SchedulerKeys.of(namespace)
    queue = QueueKeys.of(namespace, "default")
    now_ms = int(time.time() * 1000)
    good_id = f"default:{'4' * 32}"
    markers: dict[str, str | bytes] = {
        "a-past-9999": f"{PAST_9999_MS}|default:{'5' * 32}",
        "a-cron-past-9999": f"{PAST_9999_MS}|default:{'5' * 32}",
        "a-not-utf8": b"\xff\xfe|default:" + b"6" * 32,
        "a-bad-last-id": f"{now_ms}|not a task id",
        "a-tick-in-words": "yesterday|" + good_id,
        "good": f"{now_ms}|{good_id}",
    }
    for name, marker in markers.items():
        spec = {"cron": "0 * * * *"} if "cron" in name else {"every": 60.0}
        rds.hset(keys.definitions, name, Schedule(name=name, task="ops.tick", **spec).to_json())
        rds.hset(queue.schedules, name, marker)
    rds.hset(keys.definitions, b"\xff", b"{not json")  # a name that is not text
    rds.hset(keys.definitions, "too-deep", b"[" * 100_000 + b"]" * 100_000)
    rds.sadd(keys.paused, b"\xfe", "good")
    rds.hset(keys.errors, b"\xfd", b"\xff")
    rds.set(keys.leader, b"\xff\xfe")
    return {"good": good_id}


async def test_malformed_schedule_markers_are_skipped_and_reported_in_the_api_page_and_cli(
    client: httpx.AsyncClient, rds: redis.Redis, namespace: str, url: str
) -> None:
    """A tick marker past the year 9999 (OverflowError), one that is not UTF-8
    (UnicodeDecodeError) or one naming a malformed last task id (a 422) broke
    /api/schedules, the /schedules page and `tether schedules`: now the marker is left out
    (no last run), the rest of the schedule and the other schedules show as before."""
    good = forge_bad_schedules(rds, namespace)
    answer = await client.get("/api/schedules")
    assert answer.status_code == 200, answer.text[:300]
    items = {s["name"]: s for s in answer.json()["items"]}
    assert set(items) == {n for n in ("a-past-9999", "a-cron-past-9999", "a-not-utf8",
                                      "a-bad-last-id", "a-tick-in-words", "good")}  # fmt: skip
    assert items["good"]["last_task_id"] == good["good"]
    assert items["good"]["last_outcome"] == "expired" and items["good"]["paused"]
    for name in ("a-past-9999", "a-cron-past-9999", "a-not-utf8", "a-bad-last-id"):
        assert items[name]["last_run"] is None and items[name]["last_task_id"] is None, name
        assert items[name]["next_run"] is not None, name
    page = await client.get("/schedules")
    assert page.status_code == 200 and "a-past-9999" in page.text, page.text[:300]
    metrics = (await client.get("/metrics")).text
    found = re.search(r'tether_unreadable_records_total{kind="schedule"} (\d+)', metrics)
    assert "tether_up 1.0" in metrics and found and int(found.group(1)) > 0
    shown = await asyncio.to_thread(run_cli, url, namespace, "schedules", "tests.apps.sched:app")
    assert shown.returncode == 0, shown.stderr[-2000:]
    assert "Traceback" not in shown.stderr and "a-past-9999" in shown.stdout
    listed = await asyncio.to_thread(
        run_cli, url, namespace, "schedules", "tests.apps.sched:app", "--json"
    )
    assert listed.returncode == 0, listed.stderr[-2000:]
    rows = [json.loads(line) for line in listed.stdout.splitlines()]
    assert {r["name"] for r in rows} >= {"beat", "good", "a-not-utf8", "too-deep"}
    # A leader key that is not text set tether_up 0 and failed `tether info`.
    info = await asyncio.to_thread(run_cli, url, namespace, "info", "--json")
    assert info.returncode == 0 and "Traceback" not in info.stderr, info.stderr[-2000:]
    assert json.loads(info.stdout)["scheduler_leader"] == "\ufffd\ufffd"


async def test_the_scheduler_fires_the_other_schedules_beside_malformed_markers(
    app: Tether, rds: redis.Redis, caplog: pytest.LogCaptureFixture
) -> None:
    """A marker past the year 9999 made the scheduler's pass fail after the schedule's
    turn (the next tick of a time no datetime holds), so every schedule after it stopped
    firing; each malformed marker is now that schedule's reported error, once."""

    @app.periodic(every=60, name="z-good")
    @app.periodic(cron="* * * * *", name="a-cron-past-9999")
    @app.periodic(every=60, name="a-past-9999")
    @app.periodic(every=60, name="a-not-utf8")
    @app.periodic(every=60, name="a-no-separator")
    @app.task
    async def job() -> None: ...

    keys = QueueKeys.of(app.namespace, "default")
    rds.hset(keys.schedules, mapping={
        "a-cron-past-9999": f"{PAST_9999_MS}|", "a-past-9999": f"{PAST_9999_MS}|",
        "a-not-utf8": b"\xff\xfe|", "a-no-separator": "12",
    })  # fmt: skip
    scheduler = Scheduler(app, loop_interval=0.1, leader_ttl=5.0)
    t0 = float(int(time.time() // 60 * 60))
    with caplog.at_level(logging.ERROR):
        for minute in range(3):
            await scheduler.run_once(now=t0 + 1 + 60 * minute)
    base = int(t0 * 1000)
    assert enqueued_ticks(rds, app.namespace, "z-good") == [base + 60_000, base + 120_000]
    assert "scheduler pass failed" not in caplog.text
    infos = {i.schedule.name: i for i in await app.schedules.list()}
    for name in ("a-cron-past-9999", "a-past-9999", "a-not-utf8"):
        assert infos[name].error is not None and "marker" in infos[name].error, name
        reports = [r for r in caplog.records if f"schedule {name}:" in r.getMessage()]
        assert len(reports) == 1, name
    assert infos["z-good"].error is None
    await scheduler.resign()


def forge_bad_dead_letters(rds: redis.Redis, namespace: str) -> dict[str, str]:
    """Dead letters no Tether writes, after one that is good: fields missing, not UTF-8,
    times past the year 9999 or in words, counts in words, payloads and errors that are not
    JSON or not what an error holds. Returns a name for each -> its entry id."""
    dead = QueueKeys.of(namespace, "default").dead
    good_id = f"default:{'7' * 32}"
    letters: dict[str, dict[Any, Any]] = {
        "good": {"id": good_id, "m": json.dumps({"task": "ops.x"}), "status": "failed",
                 "reason": "boom", "at": int(time.time() * 1000), "deliveries": 1,
                 "queue_stream": QueueKeys.of(namespace, "default").stream("normal")},
        "empty": {"x": "1"},
        "not-utf8": {"id": b"\xff", "m": b"\xff", "status": b"\xfe", "reason": b"\xff",
                     "queue_stream": b"\xff", "error": b"\xff"},
        "past-9999": {"id": good_id, "at": "9" * 30, "deliveries": "many", "m": b"{not json"},
        "time-in-words": {"id": good_id, "at": "yesterday", "deliveries": b"\xff"},
        "odd-error": {"id": good_id, "error": json.dumps(
            {"type": 5, "message": ["a"], "traceback": {"x": 1}})},
        "too-deep": {"id": good_id, "m": b"[" * 100_000 + b"]" * 100_000,
                     "error": b"[" * 100_000 + b"]" * 100_000},
    }  # fmt: skip
    return {name: rds.xadd(dead, fields).decode() for name, fields in letters.items()}


async def test_malformed_dead_letters_show_their_unreadable_fields_never_a_500(
    app: Tether, client: httpx.AsyncClient, rds: redis.Redis, namespace: str, url: str
) -> None:
    """A dead letter with a task id or status that is not UTF-8, a time past the year 9999
    or in words, or deliveries in words failed the whole listing: the API and the pages
    answered 500, `tether dead list` and `show` printed a traceback. Each letter is listed
    (it can still be purged), its unreadable fields shown as such and reported."""
    entries = forge_bad_dead_letters(rds, namespace)
    base = "/api/queues/default/dead"
    listed = await client.get(base, params={"limit": 50})
    assert listed.status_code == 200, listed.text[:300]
    items = {d["entry_id"]: d for d in listed.json()["items"]}
    assert set(items) == set(entries.values())
    good = items[entries["good"]]
    assert good["task"] == "ops.x" and good["deliveries"] == 1 and good["at"] is not None
    assert items[entries["past-9999"]]["at"] is None
    assert items[entries["time-in-words"]]["deliveries"] == 0
    assert items[entries["not-utf8"]]["task_id"] == "\ufffd"
    failed = {}
    for name, entry_id in entries.items():
        for path in (f"{base}/{entry_id}", f"/queues/default/dead/{entry_id}"):
            answer = await client.get(path)
            if answer.status_code != 200:
                failed[name, path] = answer.status_code
    page = await client.get("/queues/default/dead")
    assert not failed and page.status_code == 200, (failed, page.status_code)
    metrics = (await client.get("/metrics")).text
    found = re.search(r'tether_unreadable_records_total{kind="dead"} (\d+)', metrics)
    assert found and int(found.group(1)) > 0
    letters = app.dead_letters("default")
    assert len(await letters.list()) == len(entries)
    assert len(await letters.find(f"default:{'7' * 32}")) == 5
    retried = await letters.retry_matching(limit=100)
    assert set(retried.failed) == set(entries.values())  # none has a payload to run
    shown = await asyncio.to_thread(run_cli, url, namespace, "dead", "list")
    assert shown.returncode == 0 and "Traceback" not in shown.stderr, shown.stderr[-2000:]
    as_json = await asyncio.to_thread(run_cli, url, namespace, "dead", "list", "--json")
    assert as_json.returncode == 0, as_json.stderr[-2000:]
    assert len(as_json.stdout.splitlines()) == len(entries)
    for name in ("not-utf8", "past-9999", "odd-error"):
        one = await asyncio.to_thread(run_cli, url, namespace, "dead", "show", entries[name])
        assert one.returncode == 0 and "Traceback" not in one.stderr, (name, one.stderr[-2000:])
    assert await letters.purge(list(entries.values())) == len(entries)


def forge_bad_limits(rds: redis.Redis, namespace: str) -> None:
    """Runtime limit overrides no Tether writes, beside a good one, and statistics of held
    tasks that are not text or not numbers."""
    keys = QueueKeys.of(namespace, "default")
    rds.zadd(known_queues_key(namespace), {"default": 0})
    rds.hset(overrides_key(keys.tag), mapping={
        "good": json.dumps({"c": 3, "gen": 1}),
        b"\xff": json.dumps({"c": 3}),  # a task name that is not text
        "too-deep": b"[" * 100_000 + b"]" * 100_000,
        "infinite-rate": '{"rc": Infinity, "rp": 1000}',  # Python's json reads Infinity
        "nan": '{"c": NaN}',
        "huge-generation": '{"c": 2, "gen": 1e999}',
        "infinite-period": '{"rc": 5, "rp": 1e999}',
        "negative": '{"c": -5}',
        "words": '{"c": "three"}',
        "not-json": b"\xff{",
    })  # fmt: skip
    minute = keys.stats_minute(int(time.time() // 60))
    rds.hset(minute, mapping={"ops.x|held_rate": 4, "ops.x|held_concurrency": "many",
                              b"\xff|held_rate": 1})  # fmt: skip


async def test_malformed_limit_records_are_skipped_and_reported_never_a_500(
    app: Tether, client: httpx.AsyncClient, rds: redis.Redis, namespace: str
) -> None:
    """One runtime override that is not a number Tether writes (an infinity, NaN, JSON
    nested too deep), or a task name that is not text, failed every limits listing
    (OverflowError, ValueError, RecursionError, UnicodeDecodeError: a 500); one held-tasks
    count in words failed the held counts. Each is left out and reported."""
    forge_bad_limits(rds, namespace)
    answer = await client.get("/api/queues/default/limits")
    assert answer.status_code == 200, answer.text[:300]
    listed = {i["task"]: i for i in answer.json()["items"]}
    assert listed["good"]["effective"]["concurrency_limit"] == 3
    assert listed["good"]["generation"] == 1
    for name in ("too-deep", "infinite-rate", "nan", "huge-generation", "infinite-period",
                 "negative", "words", "not-json"):  # fmt: skip
        assert name not in listed, name
        one = await client.get(f"/api/queues/default/limits/{name}")
        assert one.status_code == 200, (name, one.text[:300])
        assert one.json()["override"] is None, name
    held = await client.get("/api/queues/default/held")
    assert held.status_code == 200, held.text[:300]
    (counts,) = held.json()["items"]
    assert counts["task"] == "ops.x" and counts["rate"] == 4 and counts["concurrency"] == 0
    metrics = (await client.get("/metrics")).text
    found = re.search(r'tether_unreadable_records_total{kind="limit"} (\d+)', metrics)
    assert found and int(found.group(1)) > 0
    assert [i.task for i in await app.limits.list()] == ["good"]


async def test_a_status_or_index_entry_no_tether_writes_is_reported_not_a_raw_error(
    app: Tether, client: httpx.AsyncClient, rds: redis.Redis, url: str, namespace: str
) -> None:
    """A record whose status is not one Tether knows made handle.status() raise a bare
    ValueError (and a record that is not JSON, a JSONDecodeError); an index entry that does
    not start with a stream digit made the status script fail, and the API answer 502.
    Now the first is TaskNotFound saying the record cannot be read, and the index entry is
    skipped: the task reads from what else Redis holds of it. Both are reported."""
    keys = QueueKeys.of(namespace, "default")
    odd, garbled, not_json = (f"default:{c * 32}" for c in "abc")
    rds.set(keys.result(odd), json.dumps({"status": "exploded"}))
    rds.set(keys.result(garbled), json.dumps(["succeeded"]))
    rds.set(keys.result(not_json), b"\xff{")
    for task_id in (odd, garbled, not_json):
        with pytest.raises(TaskNotFound, match="record Tether cannot read"):
            await app.handle(task_id).status()
        with pytest.raises(TaskNotFound, match="record Tether cannot read"):
            await asyncio.to_thread(app.handle(task_id).status_sync)
        with pytest.raises(TaskNotFound, match="record Tether cannot read"):
            await app.handle(task_id).result(timeout=1)
    finished, indexed, queued = (f"default:{c * 32}" for c in "def")
    rds.set(keys.result(finished), json.dumps({"status": "succeeded", "value": 1}))
    rds.hset(keys.index, mapping={finished: "x1-0", indexed: "?", queued: "2not-an-id"})
    assert await app.handle(finished).status() == "succeeded"
    for task_id in (indexed, queued):
        with pytest.raises(TaskNotFound):
            await app.handle(task_id).status()
    for task_id in (finished, indexed, queued, odd):
        answer = await client.get(f"/api/tasks/{task_id}")
        assert answer.status_code in (200, 404), (task_id, answer.status_code, answer.text[:300])
    assert (await client.get(f"/api/tasks/{finished}")).json()["status"] == "succeeded"
    metrics = (await client.get("/metrics")).text
    found = re.search(r'tether_unreadable_records_total{kind="task"} (\d+)', metrics)
    assert found and int(found.group(1)) > 0


async def test_a_page_of_unreadable_delayed_rows_does_not_end_the_delayed_list(
    client: httpx.AsyncClient, rds: redis.Redis, namespace: str
) -> None:
    """Unreadable rows are left out of a page of the delayed list; when every row of a page
    was, the page came back empty with no cursor, and the readable tasks after them were
    never listed."""
    keys = QueueKeys.of(namespace, "default")
    rds.zadd(known_queues_key(namespace), {"default": 0})
    due = int(time.time() * 1000) + 3_600_000
    rds.zadd(keys.delayed, {b"\xff" + bytes([n]): due + n for n in range(5)})
    good = [f"default:{c * 32}" for c in "0123"]
    rds.zadd(keys.delayed, {task_id: due + 10 + n for n, task_id in enumerate(good)})
    rds.zadd(keys.delayed, {b"\xfe": due + 12})  # one among them, too
    listed: list[str] = []
    cursor = None
    for _ in range(20):
        params: dict[str, Any] = {"limit": 2, **({"cursor": cursor} if cursor else {})}
        answer = await client.get("/api/queues/default/delayed", params=params)
        assert answer.status_code == 200, answer.text[:300]
        listed += [t["task_id"] for t in answer.json()["items"]]
        cursor = answer.json()["cursor"]
        if cursor is None:
            break
    assert listed == good
    # A page that fills up in the middle of what it read goes on after its last row.
    answer = await client.get("/api/queues/default/delayed", params={"limit": 3})
    first = answer.json()
    assert [t["task_id"] for t in first["items"]] == good[:3] and first["cursor"]
    answer = await client.get(
        "/api/queues/default/delayed", params={"limit": 3, "cursor": first["cursor"]}
    )
    assert [t["task_id"] for t in answer.json()["items"]] == good[3:]
    page = await client.get("/queues/default/scheduled", params={"limit": 2})
    assert page.status_code == 200 and good[0] in page.text


async def test_cancelling_a_task_whose_index_entry_no_tether_writes_reads_past_it(
    app: Tether, rds: redis.Redis, namespace: str
) -> None:
    """handle.cancel() parsed the index entry by its first character: one set by hand raised
    a bare ValueError in Python and an error in the cancel script. It is read past (and
    reported), so the task is unknown (TaskNotFound, as for any id Tether cannot find), and
    once the entry is put right it is cancelled."""
    keys = QueueKeys.of(namespace, "default")
    lost = f"default:{'e' * 32}"
    rds.hset(keys.index, lost, "not-an-entry")
    with pytest.raises(TaskNotFound, match="is unknown"):
        await app.handle(lost).cancel()
    with pytest.raises(TaskNotFound, match="is unknown"):
        await asyncio.to_thread(app.handle(lost).cancel_sync)

    @app.task(queue="default")
    async def later() -> None: ...

    handle = await later.options(key="k").enqueue()
    entry = rds.hget(keys.index, handle.id)
    assert entry is not None
    rds.hset(keys.index, handle.id, b"x" + entry)  # garbled: the script must not fail on it
    with pytest.raises(TaskNotFound, match="is unknown"):
        await handle.cancel()
    rds.hset(keys.index, handle.id, entry)
    assert await handle.cancel() == "cancelled"
