"""A schedule's failure backoff seen and ended from outside: the HTTP API (bearer token,
audited, write permission), the dashboard in Chromium (the Reset backoff button), the CLI
(``tether schedules``), and the deployment metrics' gauge. Each puts a schedule in backoff
for real: a run of it fails on a worker."""

from __future__ import annotations

import asyncio
import json
import logging
import re
from typing import Any

import httpx
import pytest
import redis
from click.testing import CliRunner
from playwright.sync_api import expect

from tether import ScheduleBackoff, Tether
from tether.cli import main
from tether.metrics._deployment import read
from tether.protocol._keys import QueueKeys
from tether.web import create_app

from ..apps import dashboard, sched_failing
from ..helpers import running_worker
from ..web_helpers import TOKEN, serving, valkey_url  # noqa: F401  (a fixture)
from .test_dashboard import Site, Tab, browser, server_url, site, tab  # noqa: F401  (fixtures)

NAME = "failing-beat"
"""The schedule of tests.apps.sched_failing: every half second, a task that always fails."""


async def fail_once(app: Tether, name: str = NAME) -> None:
    """Trigger one run of a failing schedule and let a worker fail it: the schedule is in
    backoff (one failure; no scheduler runs, so no tick runs meanwhile)."""
    async with running_worker(app, scheduler=False):
        await app.schedules.trigger(name)
        for _ in range(500):
            if await app.schedules.backoff(name) is not None:
                return
            await asyncio.sleep(0.02)
    raise AssertionError("the failed run left no backoff")


def failing_app(url: str, namespace: str) -> Tether:
    app = Tether(url, namespace=namespace)
    sched_failing.declare(app)
    return app


def gauge(families: list[Any], name: str) -> float:
    (family,) = [f for f in families if f.name == name]
    return float(family.samples[0].value)


async def test_the_api_shows_and_resets_a_backoff_and_the_gauge_counts_it(
    valkey_url: str,  # noqa: F811  (the fixture)
    namespace: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    app = failing_app(valkey_url, namespace)
    async with app:
        await fail_once(app)
        assert gauge(await read(app), "tether_schedules_in_backoff") == 1
        headers = {"Authorization": f"Bearer {TOKEN}"}
        # The server's own app: uvicorn opens it on its loop, in its thread.
        served = failing_app(valkey_url, namespace)
        with serving(create_app(served, token=TOKEN)) as base:
            async with httpx.AsyncClient(base_url=base, headers=headers, timeout=20) as client:
                (listed,) = (await client.get("/api/schedules")).json()["items"]
                assert listed["name"] == NAME
                assert listed["backoff"]["failures"] == 1 and listed["backoff"]["resting"]
                until = listed["backoff"]["until"]
                # A trigger during the backoff says so.
                triggered = (await client.post(f"/api/schedules/{NAME}/trigger")).json()
                assert triggered["backoff_until"] is not None and triggered["task_id"]
                with caplog.at_level(logging.INFO, logger="tether.web.audit"):
                    reset = await client.post(f"/api/schedules/{NAME}/reset-backoff")
                assert reset.status_code == 200
                assert reset.json() == {
                    "name": NAME, "paused": None, "task_id": None, "removed": None,
                    "backoff_until": until, "backoff_reset": True,
                }  # fmt: skip
                assert "schedule.reset_backoff" in caplog.text and NAME in caplog.text
                (listed,) = (await client.get("/api/schedules")).json()["items"]
                assert listed["backoff"] is None
                again = (await client.post(f"/api/schedules/{NAME}/reset-backoff")).json()
                assert again["backoff_reset"] is False
                missing = await client.post("/api/schedules/no-such/reset-backoff")
                assert missing.status_code == 404 and "no-such" in missing.json()["detail"]
                async with httpx.AsyncClient(base_url=base) as stranger:
                    anonymous = await stranger.post(f"/api/schedules/{NAME}/reset-backoff")
                assert anonymous.status_code == 401
        served = failing_app(valkey_url, namespace)
        with serving(create_app(served, token=TOKEN, read_only=True)) as base:
            async with httpx.AsyncClient(base_url=base, headers=headers, timeout=20) as client:
                refused = await client.post(f"/api/schedules/{NAME}/reset-backoff")
                assert refused.status_code == 403
        assert gauge(await read(app), "tether_schedules_in_backoff") == 0


def test_the_cli_shows_the_backoff_its_tick_log_and_resets_it(
    valkey_url: str,  # noqa: F811  (the fixture)
    namespace: str,
    rds: redis.Redis,
) -> None:
    asyncio.run(_fail_and_close(valkey_url, namespace))
    target = ["tests.apps.sched_failing:app", "--url", valkey_url, "--namespace", namespace]
    runner = CliRunner()
    listed = runner.invoke(main, ["schedules", *target, "--json"])
    assert listed.exit_code == 0, listed.output
    row = json.loads(listed.output.splitlines()[0])
    assert row["backoff"]["failures"] == 1 and row["backoff"]["resting"] is True
    table = runner.invoke(main, ["schedules", *target])
    assert "1 failed in a row; skipped until" in " ".join(table.output.split())
    ticks = runner.invoke(main, ["schedules", *target, "--ticks", NAME, "--json"])
    (record,) = [json.loads(line) for line in ticks.output.splitlines()]
    assert record["outcome"] == "failed" and record["tick"] is None  # triggered by hand
    assert record["failures"] == 1 and record["until"] == row["backoff"]["until"]
    triggered = runner.invoke(main, ["schedules", *target, "--trigger", NAME])
    assert "through its backoff: 1 failed in a row" in triggered.output
    reset = runner.invoke(main, ["schedules", *target, "--reset-backoff", NAME])
    assert f"backoff of {NAME} ended: its next tick runs" in reset.output
    assert rds.hget(QueueKeys.of(namespace, "default").backoff, NAME) is None
    again = runner.invoke(main, ["schedules", *target, "--reset-backoff", NAME])
    assert f"{NAME} was not in backoff" in again.output


async def _fail_and_close(url: str, namespace: str) -> None:
    async with failing_app(url, namespace) as app:
        await fail_once(app)


def test_the_dashboard_shows_a_backoff_and_its_button_ends_it(
    site: Site,  # noqa: F811  (the fixture)
    tab: Tab,  # noqa: F811  (the fixture)
) -> None:
    # A schedule added at runtime for the dashboard app's failing task; one run of it fails.
    site.do(asyncio.run, _fail_on_site(site.url, site.namespace))
    page = tab.go("/schedules")
    row = page.locator("tr[data-schedule='declines-hourly']")
    expect(row.locator("[data-field=backoff]")).to_contain_text("in backoff")
    expect(row.locator("[data-field=backoff]")).to_contain_text("1 failed run in a row")
    # Its next run is the first tick after the rest (an hour from now, at the earliest).
    expect(row.locator("[data-field=next-run] time")).to_have_text(re.compile(r"^in "))
    row.get_by_role("button", name="Reset backoff").click()
    expect(tab.flash()).to_contain_text(
        "Schedule declines-hourly: backoff ended, its next tick runs."
    )
    key = QueueKeys.of(site.namespace, "default").backoff
    assert site.rds.hget(key, "declines-hourly") is None
    expect(row.locator("[data-field=backoff]")).to_have_count(0)
    expect(row.get_by_role("button", name="Reset backoff")).to_have_count(0)


async def _fail_on_site(url: str, namespace: str) -> None:
    app = dashboard.fresh(url, namespace).app
    async with app:
        await app.schedules.add(
            app.tasks["dash.fail"],  # type: ignore[arg-type]
            every=3600, args=(7,), name="declines-hourly",
            backoff=ScheduleBackoff(initial=3600, cap=7200),
        )  # fmt: skip
        await fail_once(app, "declines-hourly")
