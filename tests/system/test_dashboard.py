"""The dashboard in a real browser: Debian's chromium driven by Playwright, the dashboard
served by uvicorn (standalone, read-only, and mounted in a FastAPI app under a prefix), a
real server, and real worker processes for running and failed tasks. Every button is
pressed as an operator would, and its effect is checked in Redis.

Every test collects the browser's console errors and uncaught exceptions and fails on any
it did not expect (a 401 or 404 page it asked for says so in the console). Screenshots of
every page, light and dark, go to ``tests/screenshots/`` (ignored by git); with
``DOCS_SCREENSHOTS=1`` the tour also refreshes the ones in ``docs/images/``.

These tests never skip: without ``/usr/bin/chromium`` they fail and say how to install it
(``.ci/run`` does).
"""

from __future__ import annotations

import asyncio
import os
import re
import shutil
import socket
import time
from collections.abc import Awaitable, Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import quote

import pytest
import redis
from fastapi import Depends, FastAPI, HTTPException, Request
from playwright.sync_api import Browser, Page, expect, sync_playwright

from tether import Tether
from tether.admin import QueueStats, Stats
from tether.base._histogram import bucket
from tether.base._status import TaskStatus
from tether.protocol._keys import SchedulerKeys, known_queues_key
from tether.web import create_app, router

from ..apps import dashboard
from ..conftest import start_server
from ..helpers import FAST, ROOT, ServerInfo, WorkerProcess, wait_until
from ..integration.test_web import routes_of
from ..web_helpers import TOKEN, sample_path, serving

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
APP = "tests.apps.dashboard:app"
SCREENSHOTS = ROOT / "tests" / "screenshots"
DOCS_IMAGES = ROOT / "docs" / "images"
WIDTH = 1024
T = TypeVar("T")


# -- the browser, the server, the dashboard -----------------------------------------------


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    """One chromium for the module. Missing, it fails the tests: CI installs it."""
    assert os.access(CHROMIUM, os.X_OK), (
        f"{CHROMIUM} is missing: the dashboard's browser tests need Debian's chromium "
        "(apt-get install chromium; .ci/run installs it)"
    )
    with sync_playwright() as playwright:
        launched = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield launched
        launched.close()


@pytest.fixture(scope="module")
def server_url(_servers: dict[str, ServerInfo]) -> str:
    """The session's Valkey: what the pages add does not depend on the server's kind (the
    readers behind them run on each kind in test_admin)."""
    if "valkey" not in _servers:
        proc = start_server("valkey")
        _servers["valkey"] = ServerInfo("valkey", proc.url, proc)
    return _servers["valkey"].url


@dataclass
class Site:
    """A namespace, its dashboard's address, and the producer side of the test."""

    url: str
    namespace: str
    base: str
    dash: dashboard.Dash
    rds: redis.Redis
    log_dir: Path
    workers: list[WorkerProcess]
    pool: ThreadPoolExecutor = field(default_factory=lambda: ThreadPoolExecutor(1))

    def do(self, call: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """A blocking Tether call (``enqueue_sync``, ``result_sync``, ...) from a thread of
        its own: Playwright's sync API runs an event loop in the test's thread, where
        Tether refuses to block."""
        return self.pool.submit(call, *args, **kwargs).result()

    def close(self) -> None:
        self.do(self.dash.app.close_sync)
        self.pool.shutdown()
        self.rds.close()

    def worker(self, name: str, queues: str = "default", **settings: Any) -> WorkerProcess:
        proc = WorkerProcess(
            self.url, self.namespace, name, app=APP, queues=queues, log_dir=self.log_dir,
            **{**FAST, "heartbeat_ttl": 1.0, **settings},
        )  # fmt: skip
        self.workers.append(proc)
        proc.wait_ready(self.rds)
        return proc

    def read(self, reader: Callable[[Stats], Awaitable[T]]) -> T:
        """A reader's answer, on an app and an event loop of its own (the test is sync:
        Playwright's sync API runs its own loop in this thread)."""

        async def main() -> T:
            app = Tether(self.url, namespace=self.namespace)
            async with app:
                return await reader(Stats(app))

        return self.pool.submit(asyncio.run, main()).result()

    def queue(self, name: str = "default") -> QueueStats:
        return self.read(lambda stats: stats.queue(name))

    def drain(self) -> None:
        """Run what is due with a burst worker in this process."""

        async def main() -> None:
            app = dashboard.fresh(self.url, self.namespace).app
            async with app:
                await app.worker(burst=True, scheduler=False, **FAST).run()

        self.pool.submit(asyncio.run, main()).result()

    def dead_count(self, queue: str = "default") -> int:
        return int(self.rds.xlen(self.dash.app.keys(queue).dead))

    def paused(self, queue: str = "default") -> bool:
        return bool(self.rds.exists(self.dash.app.keys(queue).paused))


def site_of(server_url: str, namespace: str, base: str, tmp_path: Path,
            workers: list[WorkerProcess]) -> Site:  # fmt: skip
    return Site(
        url=server_url, namespace=namespace, base=base,
        dash=dashboard.fresh(server_url, namespace), rds=redis.Redis.from_url(server_url),
        log_dir=tmp_path, workers=workers,
    )  # fmt: skip


@pytest.fixture
def site(
    server_url: str, namespace: str, tmp_path: Path, workers: list[WorkerProcess]
) -> Iterator[Site]:
    """The standalone dashboard (``create_app``) of a fresh namespace, on uvicorn."""
    served = dashboard.fresh(server_url, namespace).app
    with serving(create_app(served, token=TOKEN)) as base:
        made = site_of(server_url, namespace, base, tmp_path, workers)
        yield made
        made.close()


@dataclass
class Tab:
    """A browser tab on a dashboard, and what its console said."""

    page: Page
    base: str
    errors: list[str] = field(default_factory=list)
    allowed: list[str] = field(default_factory=list)
    """Patterns of console errors this test causes on purpose (a 404 page it asked for)."""

    def go(self, path: str, status: int = 200) -> Page:
        answer = self.page.goto(self.base + path)
        assert answer is not None and answer.status == status, (path, answer and answer.status)
        return self.page

    def flash(self) -> Any:
        return self.page.locator(".flash")

    def login(self, token: str = TOKEN) -> None:
        # Onto the workers' page: a first view of the overview before the test's tasks ran
        # would show their charts only ten seconds later (see tether.web._series).
        self.go("/login?next=%2Fworkers")
        self.page.fill("#token", token)
        self.page.click("button[type=submit]")
        self.page.wait_for_url(self.base + "/workers")

    def unexpected(self) -> list[str]:
        return [e for e in self.errors if not any(re.search(a, e) for a in self.allowed)]


@contextmanager
def tab_on(browser: Browser, base: str, **options: Any) -> Iterator[Tab]:
    """A fresh browser context (no cookies) at 1024 px; fails on unexpected console errors."""
    context = browser.new_context(viewport={"width": WIDTH, "height": 900}, **options)
    page = context.new_page()
    tab = Tab(page, base)
    page.on("console", lambda m: tab.errors.append(f"console: {m.text}")
            if m.type == "error" else None)  # fmt: skip
    page.on("pageerror", lambda exc: tab.errors.append(f"uncaught: {exc}"))
    page.on("dialog", lambda dialog: dialog.accept())  # the confirmations of writes
    page.set_default_timeout(15_000)
    try:
        yield tab
    finally:
        context.close()
    assert tab.unexpected() == [], tab.errors


@pytest.fixture
def tab(browser: Browser, site: Site) -> Iterator[Tab]:
    """A signed-in tab on the site's dashboard."""
    with tab_on(browser, site.base) as opened:
        opened.login()
        yield opened


def page_paths(app: FastAPI) -> list[str]:
    """The path of every page the dashboard serves (GET, HTML), parameters filled."""
    return sorted(
        {
            sample_path(path)
            for method, path in routes_of(app)
            if method == "GET" and not path.startswith(("/api", "/static", "/login"))
        }
    )


def figure(page: Page, queue: str, name: str) -> Any:
    """A figure of a queue's row on the overview (its exact value is ``data-value``)."""
    return page.locator(f"tr[data-queue='{queue}'] [data-figure='{name}']")


# -- authentication -----------------------------------------------------------------------


def test_without_a_login_every_page_redirects_to_the_login_and_a_wrong_token_is_refused(
    browser: Browser, server_url: str, namespace: str
) -> None:
    web = create_app(dashboard.fresh(server_url, namespace).app, token=TOKEN)
    paths = page_paths(web)
    assert {"/", "/queues/default", "/queues/default/dead", "/task", "/workers", "/schedules",
            "/stats", "/fragments/overview"} <= set(paths), paths  # fmt: skip
    with serving(web) as base, tab_on(browser, base) as tab:
        for path in paths:
            tab.page.goto(base + path)
            assert tab.page.url == f"{base}/login?next={quote(path, safe='')}", path
            expect(tab.page.locator("#token")).to_be_visible()
        tab.go("/login?next=%2Fqueues%2Fdefault")
        tab.page.fill("#token", "not-the-token-at-all")
        with tab.page.expect_response(lambda r: r.request.method == "POST") as answer:
            tab.page.click("button[type=submit]")
        assert answer.value.status == 401
        tab.allowed.append("status of 401")
        expect(tab.page.get_by_role("alert")).to_have_text("That token is not right.")
        cookies = tab.page.context.cookies()
        assert not [c for c in cookies if c["name"] == "tether_session"]
        tab.page.fill("#token", TOKEN)
        tab.page.click("button[type=submit]")
        tab.page.wait_for_url(f"{base}/queues/default")  # where it was going
        session = next(c for c in tab.page.context.cookies() if c["name"] == "tether_session")
        assert session["httpOnly"] and session["sameSite"] == "Strict"
        tab.page.get_by_role("button", name="Sign out").click()
        tab.page.wait_for_url(f"{base}/login")
        tab.page.goto(base + "/workers")
        assert tab.page.url.startswith(f"{base}/login?next=")


def test_a_post_without_the_csrf_token_is_refused(site: Site, tab: Tab) -> None:
    page = tab.go("/queues/default")
    tab.allowed.append("status of 403")
    for form in ({"next": "/"}, {"next": "/", "csrf_token": "forged"}):
        answer = page.request.post(site.base + "/queues/default/pause", form=form,
                                   max_redirects=0)  # fmt: skip
        assert answer.status == 403, answer.text()
        assert "CSRF" in answer.text() and "<html" in answer.text()
    assert not site.paused()
    # The page's own form carries the token: the same post with it is done.
    token = page.locator("input[name=csrf_token]").first.get_attribute("value")
    answer = page.request.post(site.base + "/queues/default/pause", max_redirects=0,
                               form={"next": "/", "csrf_token": token or ""})  # fmt: skip
    assert answer.status == 303 and answer.headers["location"] == "/"
    assert site.paused()


def test_read_only_mode_shows_no_write_button_and_refuses_a_forged_post(
    browser: Browser, server_url: str, namespace: str, tmp_path: Path,
    workers: list[WorkerProcess],
) -> None:  # fmt: skip
    served = dashboard.fresh(server_url, namespace).app
    web = create_app(served, token=TOKEN, read_only=True)
    with serving(web) as base, tab_on(browser, base) as tab:
        site = site_of(server_url, namespace, base, tmp_path, workers)
        site.do(site.dash.fail.enqueue_many_sync, [(i,) for i in range(2)])
        site.do(site.dash.ok.options(delay=600).enqueue_sync, 1)
        site.do(site.dash.hold.enqueue_sync, 30)
        site.worker("dash-ro", concurrency=1)
        wait_until(lambda: site.queue().dead == 2 and site.queue().running == 1, timeout=20)
        tab.login()
        expect(tab.page.locator(".top .badge")).to_have_text("read-only")
        (running,) = site.read(lambda stats: stats.running("default")).items
        entry = site.rds.xrange(site.dash.app.keys("default").dead, count=1)[0][0].decode()
        for path in ("/", "/queues/default", "/queues/default/scheduled", "/queues/default/dead",
                     f"/queues/default/dead/{entry}", f"/task?id={quote(running.task_id)}",
                     "/workers", "/schedules", "/stats"):  # fmt: skip
            page = tab.go(path)
            # The sign-out form is the only one that posts.
            assert page.locator("form[method=post]").count() == 1, path
            assert page.locator("form[method=post]").get_attribute("action") == "/logout"
            for label in ("Retry", "Purge", "Cancel", "Cancel task", "Pause", "Resume",
                          "Pause queue", "Resume queue", "Run now", "Trigger"):  # fmt: skip
                assert page.get_by_role("button", name=label, exact=True).count() == 0, label
        token = tab.page.request.get(base + "/api/session").json()["csrf_token"]
        tab.allowed.append("status of 403")
        for action in ("/queues/default/pause", "/queues/default/dead/retry", "/task/cancel",
                       "/schedules/pause"):  # fmt: skip
            answer = tab.page.request.post(base + action, max_redirects=0, form={
                "csrf_token": token, "next": "/", "scope": "all",
                "task_id": "default:" + "0" * 32, "name": "nightly-report"})  # fmt: skip
            assert answer.status == 403, (action, answer.text())
        assert not site.paused() and site.dead_count() == 2
        site.close()


# -- what the pages show ------------------------------------------------------------------


def test_the_overview_shows_the_counts_of_enqueued_running_failed_and_delayed_tasks(
    site: Site, tab: Tab
) -> None:
    d = site.dash
    site.do(d.fail.enqueue_many_sync, [(i,) for i in range(3)])
    worker = site.worker("dash-a", concurrency=1)
    wait_until(lambda: site.queue().dead == 3, timeout=20)
    site.do(
        d.hold.options(priority="high").enqueue_sync, 60
    )  # the worker's only slot, for a minute
    wait_until(lambda: site.queue().running == 1, timeout=20)
    site.do(d.ok.options(priority="high").enqueue_many_sync, [(i,) for i in range(3)])
    site.do(d.ok.enqueue_many_sync, [(i,) for i in range(4)])
    site.do(d.ok.options(priority="low").enqueue_many_sync, [(i,) for i in range(2)])
    site.do(d.ok.options(delay=600).enqueue_many_sync, [(i,) for i in range(2)])
    site.do(
        d.send.enqueue_many_sync, [("a@example.com",), ("b@example.com",)]
    )  # nobody serves mail

    page = tab.go("/")
    expected = {
        "default": {"waiting-high": 3, "waiting-normal": 4, "waiting-low": 2, "running": 1,
                    "delayed": 2, "dead": 3, "workers": 1},
        "mail": {"waiting-high": 0, "waiting-normal": 2, "waiting-low": 0, "running": 0,
                 "delayed": 0, "dead": 0, "workers": 0},
    }  # fmt: skip
    for queue, figures in expected.items():
        for name, value in figures.items():
            expect(figure(page, queue, name)).to_have_attribute("data-value", str(value))
    totals = {"waiting": "11", "running": "1", "delayed": "2", "dead": "3", "workers": "1"}
    for name, value in totals.items():
        expect(page.locator(f"[data-total='{name}']")).to_have_text(value)
    # The scheduler leader is the worker (its scheduler runs beside it): <name>:<token>.
    expect(page.locator("[data-total='leader']")).to_contain_text(f"{worker.name}:")
    charts = page.locator("tr[data-queue='default'] svg.chart")
    expect(charts).to_have_count(2)
    # The charts read their last minutes every ten seconds (the figures at every refresh).
    expect(charts.first).to_have_attribute("aria-label", re.compile("3 in all"), timeout=15_000)
    expect(charts.last).to_have_attribute("aria-label", re.compile("100% overall"))

    # Live: a new task shows without a reload...
    expect(page.locator("[data-live-status]")).to_contain_text("Live")
    site.do(d.ok.enqueue_sync, 99)
    expect(figure(page, "default", "waiting-normal")).to_have_attribute("data-value", "5")
    # ...until the refresh is paused, and again once it is resumed.
    page.locator("[data-live-toggle]").click()
    expect(page.locator("[data-live-toggle]")).to_have_text("Resume updates")
    expect(page.locator("[data-live-status]")).to_have_text("Paused")
    site.do(d.ok.enqueue_sync, 100)
    time.sleep(3)  # more than one refresh interval
    expect(figure(page, "default", "waiting-normal")).to_have_attribute("data-value", "5")
    page.locator("[data-live-toggle]").click()
    expect(figure(page, "default", "waiting-normal")).to_have_attribute("data-value", "6")


# -- the buttons --------------------------------------------------------------------------


def test_the_queue_page_cancels_retries_purges_runs_now_and_pauses(site: Site, tab: Tab) -> None:
    d = site.dash
    broken = site.do(d.fragile.enqueue_sync, f"{site.namespace}:fragile-runs")
    site.do(d.fail.enqueue_many_sync, [(i,) for i in range(3)])
    worker = site.worker("dash-q", concurrency=1)
    wait_until(lambda: site.dead_count() == 4, timeout=20)
    held = site.do(d.hold.enqueue_sync, 60)
    wait_until(lambda: site.queue().running == 1, timeout=20)

    # Cancel the running task from its row.
    page = tab.go("/queues/default")
    page.locator(f"tr[data-task-id='{held.id}']").get_by_role("button", name="Cancel").click()
    expect(tab.flash()).to_contain_text(f"Cancellation of task {held.id} requested")
    wait_until(lambda: site.do(held.status_sync) is TaskStatus.CANCELLED, timeout=20)

    # Retry one dead letter: the task runs again (and succeeds this time).
    page = tab.go("/queues/default/dead")
    expect(page.locator("table[data-list=dead] tbody tr")).to_have_count(4)
    page.locator(f"tr[data-task-id='{broken.id}']").get_by_role("button", name="Retry").click()
    expect(tab.flash()).to_contain_text(f"queued as {broken.id}")
    assert site.do(broken.result_sync, timeout=20) == "fixed at run 2"
    assert site.dead_count() == 3

    # Retry in bulk: every letter of the page, selected at once; they fail again.
    page.locator("input[data-select-all]").check()
    expect(page.locator("[data-selected-count]")).to_have_text("3 selected")
    page.get_by_role("button", name="Retry selected").click()
    expect(tab.flash()).to_contain_text("Retried 3 dead letters")
    wait_until(lambda: site.dead_count() == 3 and site.queue().depth == 0, timeout=20)

    # Purge two selected, then the rest with "Purge all".
    page = tab.go("/queues/default/dead")
    boxes = page.locator("input[name=ids]")
    boxes.nth(0).check()
    boxes.nth(1).check()
    page.get_by_role("button", name="Purge selected").click()
    expect(tab.flash()).to_contain_text("Purged 2 dead letters")
    assert site.dead_count() == 1
    page.get_by_role("button", name=re.compile("^Purge all")).click()
    expect(tab.flash()).to_contain_text("Purged 1 dead letter")
    assert site.dead_count() == 0

    # Run a scheduled task now.
    later = site.do(d.ok.options(delay=600).enqueue_sync, 41)
    page = tab.go("/queues/default/scheduled")
    page.locator(f"tr[data-task-id='{later.id}']").get_by_role("button", name="Run now").click()
    expect(tab.flash()).to_contain_text("is due now")
    assert site.do(later.result_sync, timeout=20) == 41

    # Cancel a scheduled task: it leaves the delayed set and will not run.
    never = site.do(d.ok.options(delay=600).enqueue_sync, 42)
    page = tab.go("/queues/default/scheduled")
    page.locator(f"tr[data-task-id='{never.id}']").get_by_role("button", name="Cancel").click()
    expect(tab.flash()).to_contain_text(f"Task {never.id} cancelled")
    assert site.do(never.status_sync) is TaskStatus.CANCELLED
    expect(page.locator(f"tr[data-task-id='{never.id}']")).to_have_count(0)

    # Pause the queue: the worker stops fetching from it; resume: it fetches again.
    page.get_by_role("button", name="Pause queue").click()
    expect(tab.flash()).to_contain_text("Queue default paused")
    expect(page.locator(".page-head [data-paused]")).to_be_visible()
    assert site.paused()
    # A pause is seen at the worker's next maintenance pass (a read already blocked may
    # still deliver until then): enqueue once the worker says it saw it.
    wait_until(lambda: "queue default is paused" in worker.log(), timeout=20)
    waiting = site.do(d.ok.enqueue_sync, 7)
    time.sleep(1.5)  # several maintenance passes (reclaim_interval 0.2 s)
    assert site.do(waiting.status_sync) is TaskStatus.QUEUED
    assert site.queue().depth == 1
    page.get_by_role("button", name="Resume queue").click()
    expect(tab.flash()).to_contain_text("Queue default resumed")
    assert site.do(waiting.result_sync, timeout=20) == 7
    assert not site.paused()


def test_retry_on_a_dead_letters_own_page_goes_to_the_retried_task(site: Site, tab: Tab) -> None:
    broken = site.do(site.dash.fragile.enqueue_sync, f"{site.namespace}:own-page-runs")
    site.drain()
    entry = site.rds.xrange(site.dash.app.keys("default").dead, count=1)[0][0].decode()
    page = tab.go(f"/queues/default/dead/{entry}")
    page.get_by_role("button", name="Retry", exact=True).click()
    # The letter left the stream with the retry: its page would be a 404 now.
    page.wait_for_url(re.compile(r"/task\?id="))
    assert page.url == f"{site.base}/task?id={quote(broken.id, safe='')}"
    expect(tab.flash()).to_contain_text(f"Dead letter {entry} retried: queued as {broken.id}")
    expect(page.locator("[data-field=status]")).to_have_text("queued")
    assert site.dead_count() == 0


NEVER = "\u2013"
"""What a page shows for a time or an outcome that does not exist (an en dash)."""


def test_schedules_pause_resume_and_trigger_from_the_page(site: Site, tab: Tab) -> None:
    paused_key = SchedulerKeys.of(site.namespace).paused
    page = tab.go("/schedules")
    row = page.locator("tr[data-schedule='nightly-report']")
    expect(row.locator("[data-field=state]")).to_have_text("active")
    # Its next run is a time to come (the exact moment in the tooltip); it never ran.
    expect(row.locator("[data-field=next-run] time")).to_have_text(re.compile(r"^in "))
    expect(row.locator("[data-field=next-run] time")).to_have_attribute("title", re.compile("UTC"))
    expect(row.locator("[data-field=last-run]")).to_have_text(NEVER)
    expect(row.locator("[data-field=last-outcome]")).to_have_text(NEVER)
    row.get_by_role("button", name="Pause").click()
    expect(tab.flash()).to_contain_text("Schedule nightly-report paused")
    assert site.rds.sismember(paused_key, "nightly-report")
    expect(row.locator("[data-field=state]")).to_have_text("paused")
    row.get_by_role("button", name="Resume").click()
    expect(tab.flash()).to_contain_text("Schedule nightly-report resumed")
    assert not site.rds.sismember(paused_key, "nightly-report")
    row.get_by_role("button", name="Trigger").click()
    expect(tab.flash()).to_contain_text("Schedule nightly-report triggered: task ")
    task_id = (tab.flash().text_content() or "").rsplit(" ", 1)[-1].rstrip(".")
    assert site.do(site.dash.app.handle(task_id).status_sync) is TaskStatus.QUEUED


def test_the_task_page_shows_status_timeline_arguments_and_result(site: Site, tab: Tab) -> None:
    d = site.dash
    done = site.do(d.ok.enqueue_sync, 5)
    failed = site.do(d.fail.enqueue_sync, 8)
    site.drain()
    waiting = site.do(d.send.enqueue_sync, "ops@example.com")

    page = tab.go("/")
    page.get_by_role("searchbox", name="Task id").fill(done.id)
    page.get_by_role("searchbox", name="Task id").press("Enter")
    page.wait_for_url(re.compile(r"/task\?id="))
    expect(page.locator("[data-field=status]")).to_have_text("succeeded")
    expect(page.locator("[data-field=result]")).to_have_text("5")
    expect(page.locator("[data-event=enqueued]")).to_contain_text(" UTC")
    expect(page.locator("[data-event=succeeded]")).to_contain_text(" UTC")

    page = tab.go(f"/task?id={quote(failed.id)}")
    expect(page.locator("[data-field=status]")).to_have_text("failed")
    expect(page.locator("[data-field=error]")).to_contain_text("card declined for order 8")
    entry = site.rds.xrange(d.app.keys("default").dead, count=1)[0][0].decode()
    expect(page.locator("[data-field=dead-letter]")).to_have_attribute(
        "href", f"/queues/default/dead/{entry}"
    )

    page = tab.go(f"/task?id={quote(waiting.id)}")
    expect(page.locator("[data-field=status]")).to_have_text("queued")
    expect(page.locator("[data-field=args]")).to_contain_text("ops@example.com")
    expect(page.locator("[data-event=started]")).to_contain_text("not yet")
    page.get_by_role("button", name="Cancel task").click()
    expect(tab.flash()).to_contain_text(f"Task {waiting.id} cancelled")
    expect(page.locator("[data-field=status]")).to_have_text("cancelled")
    assert site.do(waiting.status_sync) is TaskStatus.CANCELLED

    tab.allowed += ["status of 404", "status of 422"]
    page = tab.go("/task?id=default:" + "0" * 32, status=404)
    expect(page.locator("[data-problem]")).to_contain_text("is unknown")
    page = tab.go("/task?id=not-a-task-id", status=422)
    expect(page.locator("[data-problem]")).to_contain_text(
        "is not a task id: a task id is its queue, a colon"
    )
    page = tab.go("/queues/nope", status=404)
    expect(page.locator("[data-error='404']")).to_contain_text("queue 'nope' is unknown")


def test_a_failed_tasks_page_shows_its_dead_letter_its_arguments_and_every_attempt(
    site: Site, tab: Tab
) -> None:
    failed = site.do(site.dash.fail.options(retries=2).enqueue_sync, 17)
    site.worker("dash-f", concurrency=1)
    wait_until(lambda: site.dead_count() == 1, timeout=30)
    entry = site.rds.xrange(site.dash.app.keys("default").dead, count=1)[0][0].decode()

    page = tab.go(f"/task?id={quote(failed.id)}")
    expect(page.locator("[data-field=status]")).to_have_text("failed")
    # The payload is gone with the run; the dead letter kept it.
    expect(page.locator("[data-field=args]")).to_contain_text("17")
    expect(page.locator("[data-field=args-source]")).to_contain_text("From its dead letter")
    # The two attempts before the last, each with what it raised (settle keeps the records
    # of retried attempts).
    for n in (1, 2):
        event = page.locator(f"[data-event='attempt {n}']")
        expect(event).to_contain_text("ValueError: card declined for order 17; retried")
        expect(event.locator("time")).to_have_count(1)
    expect(page.locator("[data-event=failed]")).to_contain_text("attempt 3")
    expect(page.locator("[data-field=error]")).to_contain_text("card declined for order 17")
    expect(page.get_by_role("heading", name="Error")).to_contain_text("of attempt 3, the last")
    # Its own letter, not every letter of the task.
    page.locator("[data-field=dead-letter]").click()
    page.wait_for_url(f"{site.base}/queues/default/dead/{entry}")
    expect(page.get_by_role("heading", level=1)).to_contain_text(entry)


def test_the_workers_and_statistics_pages(site: Site, tab: Tab) -> None:
    d = site.dash
    worker = site.worker("dash-w", queues="default,mail", concurrency=4)
    handles = [
        *site.do(d.ok.enqueue_many_sync, [(i,) for i in range(5)]),
        site.do(d.fail.enqueue_sync, 1),
    ]
    for h in handles[:5]:
        site.do(h.result_sync, timeout=20)
    wait_until(lambda: site.dead_count() == 1, timeout=20)
    # The registry shows what the worker holds as of its last heartbeat.
    wait_until(lambda: site.read(lambda stats: stats.worker("dash-w")).held == 0)  # type: ignore[union-attr]

    page = tab.go("/workers")
    row = page.locator("tr[data-worker='dash-w']")
    expect(row).to_contain_text(socket.gethostname())
    expect(row).to_contain_text(str(worker.pid))
    expect(row.get_by_role("link", name="mail")).to_be_visible()
    expect(row.locator("[data-figure=held]")).to_contain_text("0 / 4")
    expect(row.locator("[data-figure=heartbeat]")).to_have_text(re.compile("ago|just now"))
    row.locator("summary").click()
    expect(row.locator("dl")).to_contain_text("succeeded")

    page = tab.go("/stats")
    hour = page.locator("tr[data-task='dash.ok'][data-window='3600']")
    expect(hour.locator("[data-figure=attempts]")).to_have_text("5")
    expect(hour.locator("[data-figure=retried]")).to_have_attribute("data-value", "0")
    expect(hour.locator("[data-figure=dead]")).to_have_attribute("data-value", "0")
    # Percentiles of run and wait time, as durations people read ("<1 ms", "4.2 ms", "1.3 s").
    for figure in ("run-p50", "run-p95", "run-p99", "wait-p50", "wait-p95", "wait-p99"):
        expect(hour.locator(f"[data-figure={figure}]")).to_have_text(
            re.compile(r"^(<1 ms|[\d.]+ (ms|s))$")
        )
    fails = page.locator("tr[data-task='dash.fail'][data-window='3600']")
    expect(fails.locator("[data-figure=dead]")).to_have_text("1 100%")  # no retries: dead
    expect(fails.locator("[data-figure=retried]")).to_have_attribute("data-value", "0")
    expect(page.locator("[data-legend]")).to_contain_text("Attempts that raised and were retried")
    expect(page.locator("tr[data-task='dash.ok'][data-window='86400']")).to_have_count(1)
    page.select_option("#queue", "mail")  # submits itself
    page.wait_for_url(re.compile(r"queue=mail"))
    expect(page.locator("td.empty")).to_contain_text("No attempt ended")


def test_at_1024_px_nothing_is_clipped_names_wrap_between_words_and_times_are_utc(
    site: Site, tab: Tab
) -> None:
    """A fleet's long names: the scheduler card and the workers' counters show whole at
    1024 px, a task name breaks only after its separators, task ids are shown whole, and
    the live clock says UTC in 24-hour time like every other time of the dashboard."""
    d = site.dash
    long_name = "billing-worker-eu-west-1a.internal.example-7f9c2b1d"
    site.worker(long_name, queues="default,mail", concurrency=2)
    site.do(d.ok.enqueue_many_sync, [(i,) for i in range(3)])
    later = site.do(d.ok.options(delay=600).enqueue_sync, 1)
    wait_until(lambda: site.queue().depth == 0, timeout=20)

    def clipped(locator: Any) -> list[str]:
        return [box.evaluate("e => e.tagName + ' ' + e.scrollWidth + ' > ' + e.clientWidth")
                for box in locator.all()
                if box.evaluate("e => e.scrollWidth > e.clientWidth + 1")]  # fmt: skip

    page = tab.go("/")
    leader = page.locator("[data-total='leader']")
    expect(leader).to_contain_text(long_name)
    assert clipped(page.locator(".card .value")) == []
    expect(page.locator("[data-live-status]")).to_have_text(
        re.compile(r"updated \d\d:\d\d:\d\d UTC$"), timeout=10_000
    )
    page = tab.go("/workers")
    assert clipped(page.locator(".table-wrap")) == []
    for name in ("Succeeded", "Failed", "Retried"):
        expect(page.get_by_role("columnheader", name=name)).to_be_in_viewport()
    page = tab.go("/queues/default/scheduled")
    shown = page.locator(f"tr[data-task-id='{later.id}'] a.task-id")
    expect(shown).to_have_text(later.id)  # whole: no ellipsis a copy would keep
    assert shown.evaluate("e => getComputedStyle(e).textOverflow") != "ellipsis"
    page = tab.go("/stats")
    name = page.locator("tr[data-task='dash.ok'][data-window='3600'] td.name")
    assert name.inner_html() == "dash.<wbr>ok"
    assert name.evaluate("e => getComputedStyle(e).overflowWrap") == "break-word"


# -- other ways to serve and to see it ----------------------------------------------------


def test_the_mounted_router_serves_the_pages_under_a_prefix_with_the_hosts_auth(
    browser: Browser, server_url: str, namespace: str, tmp_path: Path,
    workers: list[WorkerProcess],
) -> None:  # fmt: skip
    def admin_only(request: Request) -> None:
        if request.cookies.get("host-session") != "admin":
            raise HTTPException(401, "admins only")

    host = FastAPI()
    served = dashboard.fresh(server_url, namespace).app
    host.include_router(router(served), prefix="/ops/tether", dependencies=[Depends(admin_only)])
    with serving(host) as address, tab_on(browser, address) as tab:
        site = site_of(server_url, namespace, address + "/ops/tether", tmp_path, workers)
        site.do(site.dash.fail.enqueue_sync, 1)
        site.drain()
        # The host's answer, and the browser's request of the host's /favicon.ico after it.
        tab.allowed += ["status of 401", "status of 404"]
        assert tab.page.goto(address + "/ops/tether/").status == 401
        tab.page.context.add_cookies([{"name": "host-session", "value": "admin",
                                       "url": address}])  # fmt: skip
        page = tab.go("/ops/tether/")
        figure(page, "default", "dead").get_by_role("link").click()
        page.wait_for_url(address + "/ops/tether/queues/default/dead")
        page.get_by_role("button", name="Retry", exact=True).click()  # CSRF: double submit
        expect(tab.flash()).to_contain_text("retried")
        assert site.dead_count() == 0
        page.get_by_role("link", name="Workers").click()
        page.wait_for_url(address + "/ops/tether/workers")
        href = page.locator("link[rel=stylesheet]").get_attribute("href") or ""
        assert href.startswith("/ops/tether/static/tether.css?v=")
        css = tab.page.request.get(address + href)
        assert css.ok and "prefers-color-scheme" in css.text()
        # The page's fragment refreshes under the prefix too.
        page = tab.go("/ops/tether/")
        expect(page.locator("[data-live-status]")).to_contain_text("updated")
        site.close()


def test_read_only_pages_work_without_javascript(browser: Browser, site: Site) -> None:
    site.do(site.dash.fail.enqueue_sync, 3)
    site.drain()
    site.do(site.dash.ok.enqueue_many_sync, [(i,) for i in range(4)])
    with tab_on(browser, site.base, java_script_enabled=False) as tab:
        tab.login()  # a plain form post
        page = tab.go("/")
        expect(figure(page, "default", "waiting-normal")).to_have_attribute("data-value", "4")
        expect(page.locator("[data-live-control]")).to_be_hidden()
        expect(page.locator("tr[data-queue='default'] svg.chart")).to_have_count(2)
        page.get_by_role("link", name="default", exact=True).click()
        page.get_by_role("link", name=re.compile("^Dead letters")).click()
        page.locator("summary", has_text="Traceback").first.click()  # <details>: no script
        expect(page.locator("details pre")).to_contain_text("card declined for order 3")
        for path in ("/workers", "/schedules", "/stats", "/queues/default/scheduled"):
            tab.go(path)


# -- every page: light and dark, 1024 px, no console error, screenshots ----------------------


def write_history(site: Site, queue: str, task: str, level: int, seed: int) -> None:
    """An hour of statistics in the format the workers write (``tether.base._histogram``), so
    the charts of the screenshots show an hour rather than the minute the test ran."""
    keys = site.dash.app.keys(queue)
    now = int(time.time() // 60)
    pipe = site.rds.pipeline(transaction=False)
    for back in range(1, 60):
        minute = now - back
        wave = (minute * seed) % 23 + (level // 2 if (back + seed) % 19 < 6 else 0)
        ok = level + wave
        failed = (minute * 7 + seed) % 4 if (back + seed) % 13 else level // 4
        fields = {f"{task}|ok": ok, f"{task}|fail": failed,
                  f"{task}|r{bucket(35 + back % 20)}": ok + failed,
                  f"{task}|w{bucket(120 + back * 3)}": ok + failed}  # fmt: skip
        for key in (keys.stats_minute(minute), keys.stats_hour(minute // 60)):
            for name, amount in fields.items():
                pipe.hincrby(key, name, amount)
            pipe.expire(key, 7200)
    pipe.execute()


def test_every_page_light_and_dark_at_1024_px_without_console_errors(
    browser: Browser, site: Site
) -> None:
    d = site.dash
    history = [("default", "dash.ok", 60, 7919), ("mail", "dash.send", 20, 31),
               ("reports", "dash.ok", 8, 101)]  # fmt: skip
    for queue, task, level, seed in history:
        write_history(site, queue, task, level, seed)
    site.rds.zadd(known_queues_key(site.namespace), {"reports": 0})
    site.do(d.fail.enqueue_many_sync, [(i,) for i in range(1040, 1046)])
    broken = site.do(d.fragile.enqueue_sync, f"{site.namespace}:runs")
    site.worker("worker-1", queues="default,mail", concurrency=2)
    wait_until(lambda: site.dead_count() == 7, timeout=20)
    running = [site.do(d.hold.enqueue_sync, 600), site.do(d.hold.enqueue_sync, 600)]
    wait_until(lambda: site.queue().running == 2, timeout=20)
    site.do(d.ok.options(priority="high").enqueue_many_sync, [(i,) for i in range(12)])
    site.do(d.ok.enqueue_many_sync, [(i,) for i in range(1480)])
    site.do(d.ok.options(priority="low").enqueue_many_sync, [(i,) for i in range(230)])
    site.do(d.ok.options(delay=900).enqueue_many_sync, [(i,) for i in range(24)])
    site.do(
        d.send.options(delay=300).enqueue_many_sync, [(f"user{i}@example.com",) for i in range(3)]
    )
    entry = site.rds.xrange(d.app.keys("default").dead, count=1)[0][0].decode()
    pages = {
        "overview": "/",
        "queue": "/queues/default",
        "queue-scheduled": "/queues/default/scheduled",
        "queue-dead": "/queues/default/dead",
        "dead-letter": f"/queues/default/dead/{entry}",
        "task": f"/task?id={quote(running[0].id)}",
        "task-failed": f"/task?id={quote(broken.id)}",
        "workers": "/workers",
        "schedules": "/schedules",
        "statistics": "/stats",
    }
    for scheme in ("light", "dark"):
        folder = SCREENSHOTS / scheme
        folder.mkdir(parents=True, exist_ok=True)
        with tab_on(browser, site.base, color_scheme=scheme) as tab:
            tab.login()
            for name, path in pages.items():
                page = tab.go(path)
                width = page.evaluate("document.documentElement.scrollWidth")
                assert width <= WIDTH, f"{path} is {width} px wide at {WIDTH} px ({scheme})"
                background = page.evaluate("getComputedStyle(document.body).backgroundColor")
                dark = sum(int(c) for c in re.findall(r"\d+", background)[:3]) < 200
                assert dark == (scheme == "dark"), (path, scheme, background)
                if name == "task":  # a running task: when its worker took it, and which
                    started = page.locator("[data-event=started]")
                    expect(started).to_contain_text(" UTC")
                    expect(started).to_contain_text("on worker worker-1")
                page.screenshot(path=str(folder / f"{name}.png"), full_page=True)
            tab.go("/login")
            page = tab.page
            page.screenshot(path=str(folder / "login.png"))
    if os.environ.get("DOCS_SCREENSHOTS"):
        DOCS_IMAGES.mkdir(parents=True, exist_ok=True)
        for scheme, name in (("light", "overview"), ("light", "queue-dead"), ("dark", "overview"),
                             ("light", "task"), ("light", "statistics")):  # fmt: skip
            shutil.copy(SCREENSHOTS / scheme / f"{name}.png",
                        DOCS_IMAGES / f"dashboard-{name}-{scheme}.png")  # fmt: skip


def test_a_taskiq_only_deployment_shows_its_queue_on_the_overview(
    site: Site, tab: Tab, tmp_path: Path
) -> None:
    """With only taskiq workers running (nothing else ever served or named the queue),
    the overview lists their queue with its live workers."""
    from ..taskiq_workers import TaskiqWorker

    worker = TaskiqWorker(site.url, site.namespace, "tq-dash", log_dir=tmp_path)
    try:
        worker.wait_ready(site.rds)
        # The registry record follows the lease within the same heartbeat.
        wait_until(lambda: site.rds.zscore(known_queues_key(site.namespace), "taskiq") is not None)
        page = tab.go("/")
        expect(page.locator("tr[data-queue='taskiq']")).to_have_count(1)
        expect(figure(page, "taskiq", "workers")).to_have_attribute("data-value", "1")
    finally:
        worker.kill_now()
