"""The dashboard over plain HTTP (what needs no browser): numbers and times for people, the
charts, error pages for bad input (never a 500), the assets, the headers, the audit log of
page writes, the base URL behind a proxy's root path, the server commands of a live
refresh, and ``tether demo --web``. The browser tests are in ``test_dashboard.py``."""

from __future__ import annotations

import gc
import logging
import os
import re
import signal
import socket
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from collections.abc import AsyncIterator, Iterator
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis
from redis.exceptions import RedisError

from tether import Tether
from tether.admin import Counts, MinuteCounts, Stats
from tether.base._histogram import bucket
from tether.web import create_app
from tether.web._auth import PUBLIC_PATHS
from tether.web._format import DASH, ago, count, duration, percent, rate
from tether.web._series import SeriesCache
from tether.web.pages import _charts

from ..apps import dashboard
from ..conftest import start_server
from ..helpers import ROOT, wait_until
from ..web_helpers import TOKEN, serving, valkey_url  # noqa: F401  (a fixture)

BEARER = {"Authorization": f"Bearer {TOKEN}"}


@pytest.fixture
def url(valkey_url: str) -> str:  # noqa: F811  (the fixture of that name)
    return valkey_url


@pytest.fixture
async def tasks(url: str, namespace: str) -> AsyncIterator[dashboard.Dash]:
    made = dashboard.fresh(url, namespace)
    async with made.app:
        yield made


@pytest.fixture
def base(url: str, namespace: str) -> Iterator[str]:
    with serving(create_app(dashboard.fresh(url, namespace).app, token=TOKEN)) as address:
        yield address


@pytest.fixture
async def client(base: str) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(base_url=base, headers=BEARER, timeout=20) as c:
        yield c


# -- numbers and charts -------------------------------------------------------------------


def test_numbers_and_times_read_as_people_say_them() -> None:
    assert [count(n) for n in (0, 7, 999, 1000, 1234, 12_345, 999_499, 999_500, 1_234_567)] == [
        "0", "7", "999", "1k", "1.2k", "12k", "999k", "1M", "1.2M",
    ]  # fmt: skip
    assert count(None) == DASH and count(2.5) == "2.5" and count(-1500) == "-1.5k"
    assert [rate(r) for r in (0, 1200, 3.45, 0.5, 0.01, 1 / 7200, 1 / 86400)] == [
        "0/s", "1.2k/s", "3.5/s", "30/min", "36/h", "0.5/h", "1/d",
    ]  # fmt: skip
    assert [duration(s) for s in (None, 0, 0.0001, 0.0042, 0.34, 3.4, 42, 300, 7500, 200_000)] == [
        DASH, "0 ms", "<1 ms", "4.2 ms", "340 ms", "3.4 s", "42 s", "5 min", "2 h 5 min", "2 d 7 h",
    ]  # fmt: skip
    # Past a minute, two units: run times of 73 s and 92 s do not both read "1 min".
    assert [duration(s) for s in (59.4, 59.8, 73, 92, 119.9, 3599)] == [
        "59 s", "1 min", "1 min 13 s", "1 min 32 s", "2 min", "59 min 59 s",
    ]  # fmt: skip
    now = datetime(2024, 5, 1, 12, 0, tzinfo=timezone.utc)
    assert ago(now - timedelta(seconds=3.7), now) == "3 s ago"
    assert ago(now - timedelta(minutes=3, seconds=20), now) == "3 min ago"
    assert ago(now + timedelta(hours=2), now) == "in 2 h"
    assert ago(now, now) == "just now" and ago(None, now) == DASH
    assert [percent(p) for p in (None, 0, 0.0004, 0.034, 0.42, 1)] == [
        DASH, "0%", "<0.1%", "3.4%", "42%", "100%",
    ]  # fmt: skip


def _minutes(*attempts: tuple[int, int]) -> list[MinuteCounts]:
    start = datetime(2024, 5, 1, 12, 0, tzinfo=timezone.utc)
    return [
        MinuteCounts(start + timedelta(minutes=i), Counts(succeeded=ok, failed=bad))
        for i, (ok, bad) in enumerate(attempts)
    ]


def test_charts_are_small_svg_with_a_summary_for_screen_readers() -> None:
    series = _minutes((10, 0), (0, 0), (30, 10), (5, 5))
    svg = ET.fromstring(str(_charts.throughput(series)))
    assert svg.get("role") == "img" and "60 in all, peak 40/min" in (svg.get("aria-label") or "")
    paths = {p.get("class"): p.get("d") or "" for p in svg.iter() if p.tag.endswith("path")}
    assert paths["chart-ok"].count("M") == 3  # the minute without attempts has no bar
    assert paths["chart-err"].count("M") == 2
    failures = ET.fromstring(str(_charts.failures(series)))
    assert "25% overall, worst minute 50%" in (failures.get("aria-label") or "")
    idle = ET.fromstring(str(_charts.throughput(_minutes((0, 0), (0, 0)))))
    assert idle.get("aria-label") == "No attempts in the last 2 min"
    assert _charts.failure_share(series) == pytest.approx(15 / 60)
    # An hour of minutes stays small: the overview draws a pair per queue at each refresh.
    hour = _minutes(*[(100 + i, i % 3) for i in range(60)])
    assert len(str(_charts.throughput(hour))) + len(str(_charts.failures(hour))) < 3000


async def test_the_chart_cache_gives_what_the_reader_gives(tasks: dashboard.Dash) -> None:
    """Settled minutes come from the cache, the last ones from Redis: the same series."""
    app = tasks.app
    keys = app.keys("default")
    now = int(time.time() // 60)
    for back in range(0, 70, 3):  # a minute now and then, the last one included
        await app.client.hincrby(keys.stats_minute(now - back), "dash.ok|ok", back + 1)
        await app.client.hincrby(keys.stats_minute(now - back), "dash.ok|fail", back % 2)
    stats = Stats(app)
    cache = SeriesCache(fresh_s=0)  # read the last minutes again at every call
    first = await cache.series(stats, "default", 60)
    await app.client.hincrby(keys.stats_minute(int(time.time() // 60)), "dash.ok|ok", 5)
    second = await cache.series(stats, "default", 60)
    expected = await stats.throughput("default", minutes=60)
    if expected[-1].minute != second[-1].minute:  # the clock turned a minute meanwhile
        second = await cache.series(stats, "default", 60)
    assert [(m.minute, m.counts) for m in second] == [(m.minute, m.counts) for m in expected]
    assert sum(m.counts.attempts for m in second) == sum(m.counts.attempts for m in first) + 5
    # Shown again as it is for a while: a chart shows minutes, the figures are what moves.
    steady = SeriesCache()
    shown = await steady.series(stats, "default", 60)
    await app.client.hincrby(keys.stats_minute(int(time.time() // 60)), "dash.ok|ok", 1)
    again = await steady.series(stats, "default", 60)
    assert again is shown or again[-1].minute != shown[-1].minute


def _row(html: str, task: str, window: int) -> str:
    found = re.search(rf'<tr data-task="{task}" data-queue="default" data-window="{window}">'
                      r"(.*?)</tr>", html, re.S)  # fmt: skip
    assert found is not None, (task, window)
    return found.group(1)


def _cell(row: str, name: str) -> str:
    found = re.search(rf'data-figure="{name}"[^>]*>(.*?)</td>', row, re.S)
    assert found is not None, name
    return " ".join(re.sub(r"<[^>]+>", " ", found.group(1)).split())


async def test_statistics_rates_cover_the_time_with_data_and_retries_show_apart_from_dead(
    url: str, namespace: str, client: httpx.AsyncClient
) -> None:
    """Five minutes of data: the day's rate is over those minutes, not over 24 h; a task
    whose attempts were mostly retries shows its retried and its dead-lettered attempts
    apart, the columns defined on the page; run times past a minute read in two units."""
    app = Tether(url, namespace=namespace)
    keys = app.keys("default")
    rds = redis.Redis.from_url(url)
    now = int(time.time() // 60)
    fields = {"dash.fail|retry": 4, "dash.fail|fail": 1, f"dash.fail|r{bucket(80_000)}": 5,
              f"dash.fail|w{bucket(20)}": 5}  # fmt: skip
    for minute in (now - 4, now):
        for key in (keys.stats_minute(minute), keys.stats_hour(minute // 60)):
            for name, amount in fields.items():
                rds.hincrby(key, name, amount)  # the hour of both minutes adds them up
            rds.expire(key, 7200)
    async with app:
        (day,) = await Stats(app).tasks("default", window=86400)
    assert day.attempts == 10 and day.active_s is not None
    assert 60 <= day.active_s <= 2 * 3600 + 60  # the hours holding data, not the day
    assert day.per_second == pytest.approx(10 / day.active_s)

    page = (await client.get("/stats")).text
    hour_row, day_row = _row(page, "dash.fail", 3600), _row(page, "dash.fail", 86400)
    # Both windows hold the same ten attempts: the day's rate is the hour's, per minute.
    assert _cell(hour_row, "throughput") == _cell(day_row, "throughput")
    assert _cell(day_row, "throughput").endswith("/min"), _cell(day_row, "throughput")
    for row in (hour_row, day_row):
        assert _cell(row, "attempts") == "10"
        assert _cell(row, "retried") == "8 80%" and _cell(row, "dead") == "2 20%"
        assert re.fullmatch(r"1 min \d+ s", _cell(row, "run-p50")), _cell(row, "run-p50")
    assert "failure rate" not in page.lower()
    for words in ("Attempts that raised and were retried: the task ran again.",
                  "Attempts that ended the task in the dead letters",
                  "over the part of the window that holds data"):  # fmt: skip
        assert words in page, words
    rds.close()


# -- errors, assets, headers --------------------------------------------------------------


async def test_bad_input_renders_an_error_page_never_a_500(client: httpx.AsyncClient) -> None:
    cases = {
        "/queues/nope": 404,
        "/queues/bad%20name": 422,
        "/queues/default?cursor=garbage": 422,
        "/queues/default?limit=0": 422,
        "/queues/default/scheduled?cursor=garbage": 422,
        "/queues/default/dead?cursor=garbage": 422,
        "/queues/default/dead/not-an-id": 422,
        "/queues/default/dead/1-0": 404,
        "/queues/nope/dead": 404,
        "/?cursor=" + "x" * 200: 422,
        "/fragments/overview?cursor=bad%20name": 422,
        "/task?id=not-a-task-id": 422,
        "/task?id=default:" + "0" * 32: 404,
        "/workers?limit=100000": 422,
        "/stats?queue=nope": 404,
        "/stats?queue=bad%20name": 422,
    }
    for path, status in cases.items():
        answer = await client.get(path)
        assert answer.status_code == status, (path, answer.text[:500])
        assert answer.headers["content-type"].startswith("text/html"), path
        assert "<html" in answer.text and "Tether" in answer.text
    posts = {
        "/queues/nope/pause": 404,
        "/queues/bad%20name/resume": 422,
        "/queues/default/dead/not-an-id/retry": 422,
    }
    for path, status in posts.items():
        answer = await client.post(path)
        assert answer.status_code == status, (path, answer.text[:500])
    # A write that cannot be done says why on the page it came from.
    gone = await client.post("/queues/default/dead/1-0/retry", data={"next": "/queues/default"})
    assert gone.status_code == 303 and gone.headers["location"] == "/queues/default"
    flash = (await client.get("/queues/default")).text  # the client keeps the flash cookie
    assert "Could not retry 1-0" in flash


async def test_pages_send_security_headers_and_the_live_fragment_is_marked(
    client: httpx.AsyncClient,
) -> None:
    page = await client.get("/")
    csp = page.headers["content-security-policy"]
    assert "script-src 'self'" in csp and "frame-ancestors 'none'" in csp and "unsafe" not in csp
    assert page.headers["x-frame-options"] == "DENY" and page.headers["cache-control"] == "no-store"
    assert re.fullmatch(r"app;dur=\d+\.\d", page.headers["server-timing"])
    assert "<script" in page.text and "<script>" not in page.text  # no inline script
    assert ' style="' not in page.text  # no inline style either: the CSP forbids both
    fragment = await client.get("/fragments/overview")
    assert fragment.headers["x-tether-fragment"] == "1" and "<html" not in fragment.text


async def test_assets_are_served_from_the_package_without_a_session(base: str) -> None:
    assert {"/static/tether.css", "/static/tether.js", "/static/favicon.svg"} <= PUBLIC_PATHS
    async with httpx.AsyncClient(base_url=base) as anonymous:
        login = await anonymous.get("/login")
        href = re.search(r'href="(/static/tether\.css\?v=\w+)"', login.text)
        assert href, login.text
        css = await anonymous.get(href.group(1))
        assert css.status_code == 200 and css.headers["content-type"].startswith("text/css")
        assert "immutable" in css.headers["cache-control"]
        again = await anonymous.get("/static/tether.css", headers={"If-None-Match":
                                    css.headers["etag"]})  # fmt: skip
        assert again.status_code == 304
        js = await anonymous.get("/static/tether.js")
        assert js.status_code == 200 and "javascript" in js.headers["content-type"]
        assert (await anonymous.get("/static/../_app.py")).status_code in (401, 404)
        assert (await anonymous.get("/static/other.js")).status_code == 401
        assert (await anonymous.get("/")).status_code == 401  # the pages are not public


async def test_page_writes_are_audit_logged_and_answered_with_a_message(
    base: str, tasks: dashboard.Dash, caplog: pytest.LogCaptureFixture
) -> None:
    await tasks.ok.options(delay=600).enqueue(1)
    later = await tasks.ok.options(delay=600).enqueue(2)
    async with httpx.AsyncClient(base_url=base, timeout=20) as browser:
        await browser.post("/login", data={"token": TOKEN, "next": "/"})
        page = (await browser.get("/queues/default/scheduled")).text
        token = re.search(r'name="csrf_token" value="([^"]+)"', page)
        assert token
        with caplog.at_level(logging.INFO, logger="tether.web.audit"):
            done = await browser.post("/task/cancel", data={
                "task_id": later.id, "csrf_token": token.group(1),
                "next": "/queues/default/scheduled"})  # fmt: skip
        assert done.status_code == 303 and done.headers["location"] == "/queues/default/scheduled"
        (line,) = [r.getMessage() for r in caplog.records if "task.cancel" in r.getMessage()]
        assert "browser session" in line and later.id in line and "cancelled" in line
        shown = (await browser.get("/queues/default/scheduled")).text
        assert f"Task {later.id} cancelled: it will not run." in shown
        listed = (await browser.get("/queues/default/scheduled")).text
        assert f'data-task-id="{later.id}"' not in listed and "cancelled: it" not in listed
        away = await browser.post("/queues/default/pause", data={
            "csrf_token": token.group(1), "next": "//evil.example/"})  # fmt: skip
        assert away.headers["location"] == "/"  # never to another site


async def test_links_follow_a_proxys_root_path(url: str, namespace: str) -> None:
    web = create_app(dashboard.fresh(url, namespace).app, token=TOKEN)
    transport = httpx.ASGITransport(app=web, root_path="/tether")
    async with (
        web.router.lifespan_context(web),
        httpx.AsyncClient(transport=transport, base_url="http://proxy", headers=BEARER) as c,
    ):
        page = await c.get("/tether/queues/default")
        assert page.status_code == 200, page.text[:300]
        assert 'href="/tether/queues/default/dead"' in page.text
        assert 'href="/tether/static/tether.css?v=' in page.text
        assert 'action="/tether/task"' in page.text


# -- the cost of a live refresh -----------------------------------------------------------


def _commands(client: redis.Redis) -> int:
    stats: Any = client.info("commandstats")
    return sum(int(v["calls"]) for k, v in stats.items() if k != "cmdstat_info")


async def test_a_live_refresh_costs_a_fixed_number_of_commands_per_queue() -> None:
    """On a server of its own (nothing else counts): the commands of one refresh do not
    grow with the tasks queued or delayed, and grow by the same number with each queue.
    See bench/dashboard.py for 50 queues and 100,000 tasks."""
    server = start_server("valkey")
    counter = redis.Redis.from_url(server.url)
    try:
        measured: dict[tuple[int, int], int] = {}
        cold: dict[tuple[int, int], int] = {}
        for queues, tasks in ((1, 600), (2, 10), (2, 600), (4, 600)):
            namespace = f"cost-{queues}-{tasks}"
            producer = dashboard.fresh(server.url, namespace)
            async with producer.app:
                for name in (f"q{i}" for i in range(queues)):
                    ok = producer.ok.options(queue=name)
                    await ok.enqueue_many([(i,) for i in range(tasks)])
                    await ok.options(delay=600).enqueue_many([(i,) for i in range(tasks // 10)])
                    await producer.app.pause(name)  # a known queue without a worker
            served = Tether(server.url, namespace=namespace)
            with serving(create_app(served, token=TOKEN)) as base:
                async with httpx.AsyncClient(base_url=base, headers=BEARER) as c:
                    counts = []
                    for _ in range(4):
                        before = _commands(counter)
                        answer = await c.get("/fragments/overview")
                        assert answer.status_code == 200
                        assert answer.text.count("<tr data-queue=") == queues
                        counts.append(_commands(counter) - before)
            cold[(queues, tasks)] = counts[0]
            # The least of the warm ones: a minute that turns over meanwhile reads one more.
            measured[(queues, tasks)] = min(counts[1:])
        assert measured[(2, 10)] == measured[(2, 600)], measured
        per_queue = measured[(2, 600)] - measured[(1, 600)]
        assert measured[(4, 600)] - measured[(2, 600)] == 2 * per_queue, measured
        # The figures (about 20 commands), and every ten seconds the charts' minutes not yet
        # settled (two): the settled ones are kept, read once by the first refresh.
        assert per_queue <= 25, measured
        assert cold[(4, 600)] - measured[(4, 600)] >= 4 * 55, (cold, measured)
    finally:
        counter.close()
        server.stop()


async def test_reading_the_figures_ties_nothing_into_garbage_cycles(
    tasks: dashboard.Dash,
) -> None:
    """Queues declared and never used have no streams: the errors of their figures' reads
    must not hold the pipeline's replies in a cycle (a full collection of the server's heap
    every few refreshes, 150 ms on the reference machine)."""
    stats = Stats(tasks.app)
    assert {q.name for q in await stats.queues()} == {"default", "mail"}  # no stream at all
    gc.collect()
    gc.set_debug(gc.DEBUG_SAVEALL)
    try:
        await stats.queues()
        gc.collect()
        cycles = [o for o in gc.garbage if isinstance(o, (RedisError, list))]
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
    assert cycles == []


# -- tether demo --web ----------------------------------------------------------------------


def test_demo_serves_the_dashboard_and_prints_its_address(url: str, tmp_path: Path) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = int(sock.getsockname()[1])
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TETHER_URL": url,
           "TETHER_WEB_TOKEN": TOKEN}  # fmt: skip
    log = tmp_path / "demo.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "tether", "demo", "--tasks", "200", "--workers", "1",
             "--web", "--web-bind", f"127.0.0.1:{port}"],
            env=env, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT,
        )  # fmt: skip
    try:
        wait_until(lambda: "stays up" in log.read_text() or proc.poll() is not None, timeout=60)
        text = log.read_text()
        assert f"dashboard: http://127.0.0.1:{port}/" in text, text
        assert f"dashboard token: {TOKEN}" in text
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=10) as browser:
            signed = browser.post("/login", data={"token": TOKEN, "next": "/"})
            assert signed.status_code == 303
            page = browser.get("/")
            assert page.status_code == 200 and 'data-queue="demo"' in page.text
            workers = browser.get("/workers").text
            assert "-worker-0" in workers
        proc.send_signal(signal.SIGINT)
        assert proc.wait(30) == 0, log.read_text()
        assert "stopped the embedded server" not in log.read_text()  # it was given --url
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
