"""The web surface against a hostile caller, with real parts: uvicorn on free ports, a real
server, and for the cross-site attack Debian's chromium driven by Playwright.

- A page on another site, in a browser that remembers the host's HTTP Basic credentials,
  posts forms (and a bodiless fetch) to a mounted router: nothing may change.
- A router that opened its app itself serves one event loop after another.
- Wrong tokens are throttled per client address, and logged without the token.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import os
import secrets
from collections.abc import AsyncIterator
from typing import Annotated, Any

import httpx
import pytest
import redis
from fastapi import Depends, FastAPI, HTTPException, Request
from fastapi.security import HTTPBasic, HTTPBasicCredentials
from playwright.async_api import Browser, async_playwright
from starlette.applications import Starlette
from starlette.responses import HTMLResponse
from starlette.routing import Route

from tether import Tether
from tether.contrib.fastapi import lifespan
from tether.web import create_app, router
from tether.web._auth import FailureThrottle

from ..apps import ops
from ..helpers import FAST
from ..web_helpers import TOKEN, serving, valkey_url  # noqa: F401  (a fixture)

CHROMIUM = "/usr/bin/chromium"
ATTACKER = "evil.test"
USER, PASSWORD = "admin", "correct horse battery staple"
API_TOKEN = "host-api-token-0123456789"
DEAD = 5
BASIC = HTTPBasic(realm="ops", auto_error=False)


@pytest.fixture
def url(valkey_url: str) -> str:  # noqa: F811  (the fixture of that name)
    return valkey_url


@pytest.fixture
async def browser() -> AsyncIterator[Browser]:
    assert os.access(CHROMIUM, os.X_OK), (
        f"{CHROMIUM} is missing: the browser tests need Debian's chromium "
        "(apt-get install chromium; .ci/run installs it)"
    )
    async with async_playwright() as playwright:
        # The attacker's site is another name for this machine: another site to the browser
        # (not merely another port), as a real attacker's would be.
        resolve = f"--host-resolver-rules=MAP {ATTACKER} 127.0.0.1"
        launched = await playwright.chromium.launch(
            executable_path=CHROMIUM, args=["--no-sandbox", "--disable-gpu", resolve]
        )
        yield launched
        await launched.close()


def basic_host(app: Tether, seen: list[tuple[str, str, str]]) -> FastAPI:
    """A host that protects the router with HTTP Basic (browsers) or a bearer token of its
    own (scripts), as the router's docs tell hosts to. It notes each request's method, path
    and authorization scheme in ``seen``."""

    def admin_only(
        request: Request, credentials: Annotated[HTTPBasicCredentials | None, Depends(BASIC)]
    ) -> None:
        if request.headers.get("authorization") == f"Bearer {API_TOKEN}":
            return
        if credentials is not None and (
            secrets.compare_digest(credentials.username, USER)
            and secrets.compare_digest(credentials.password, PASSWORD)
        ):
            return
        raise HTTPException(401, "admins only", headers={"WWW-Authenticate": 'Basic realm="ops"'})

    host = FastAPI(lifespan=lifespan(app))
    host.include_router(router(app), prefix="/tether", dependencies=[Depends(admin_only)])

    @host.middleware("http")
    async def note(request: Request, call_next: Any) -> Any:
        scheme = request.headers.get("authorization", "").partition(" ")[0]
        seen.append((request.method, request.url.path, scheme))
        return await call_next(request)

    return host


def attack_page(victim: str) -> Starlette:
    """The other site: on load, a bodiless no-cors fetch that pauses the queue, then a form
    that purges every dead letter, both at the victim's router."""
    html = f"""<!doctype html><title>cute cats</title>
<form id="purge" method="post" action="{victim}/tether/queues/default/dead/purge">
  <input type="hidden" name="scope" value="all">
</form>
<script>
  fetch("{victim}/tether/api/queues/default/pause",
        {{method: "POST", mode: "no-cors", credentials: "include"}})
    .finally(() => document.getElementById("purge").submit());
</script>"""

    async def home(request: Request) -> HTMLResponse:
        return HTMLResponse(html)

    return Starlette(routes=[Route("/", home)])


async def dead_letters(made: ops.Ops, count: int) -> None:
    await made.fail.enqueue_many([(i,) for i in range(count)])
    await made.app.worker(burst=True, scheduler=False, **FAST).run()


async def test_a_cross_site_page_cannot_write_with_the_browsers_basic_credentials(
    browser: Browser, url: str, namespace: str
) -> None:
    rds = redis.Redis.from_url(url)
    producer = ops.fresh(url, namespace)
    served = ops.fresh(url, namespace)
    keys = producer.app.keys("default")
    async with producer.app:
        await dead_letters(producer, DEAD)
    assert rds.xlen(keys.dead) == DEAD

    seen: list[tuple[str, str, str]] = []
    with serving(basic_host(served.app, seen)) as victim, serving(attack_page(victim)) as other:
        evil = other.replace("127.0.0.1", ATTACKER)
        context = await browser.new_context(
            http_credentials={"username": USER, "password": PASSWORD, "origin": victim}
        )
        tab = await context.new_page()
        # The operator looks at the dashboard and the API: the browser now holds the Basic
        # credentials, and sends them at once to the paths under those it was asked for.
        for path in ("/tether/api/queues", "/tether/queues/default/dead"):
            shown = await tab.goto(victim + path)
            assert shown is not None and shown.status == 200
        # Then visits the other site, which posts to the router at once.
        async with tab.expect_response(
            lambda r: r.request.method == "POST" and r.url.endswith("/dead/purge")
        ) as purge_info:
            await tab.goto(evil)
        purge = await purge_info.value
        # The browser sent the Basic credentials along with the form (the fetch's too, if
        # it did: chromium sends them to a cross-site fetch only after a 401 it answers).
        assert ("POST", "/tether/queues/default/dead/purge", "Basic") in seen, seen
        assert (purge.status, rds.xlen(keys.dead)) == (403, DEAD)  # nothing purged
        assert "CSRF" in await purge.text()
        assert not rds.exists(keys.paused)  # nothing paused
        assert any(m == "POST" and p.endswith("/pause") for m, p, _ in seen), seen

        # Scripts with the host's credentials still work without the CSRF token when a
        # page on another site could not send what they send: JSON, or a bearer token.
        async with httpx.AsyncClient(base_url=victim + "/tether", timeout=20) as script:
            basic = httpx.BasicAuth(USER, PASSWORD)
            form = await script.post("/api/queues/default/pause", auth=basic)
            assert form.status_code == 403  # bodiless, as a cross-site page sends it
            paused = await script.post("/api/queues/default/pause", auth=basic, json={})
            assert paused.status_code == 200, paused.text
            bearer = {"Authorization": f"Bearer {API_TOKEN}"}
            resumed = await script.post("/api/queues/default/resume", headers=bearer)
            assert resumed.status_code == 200, resumed.text
            session = await script.get("/api/session", auth=basic)
            assert session.json()["csrf_token"]  # Basic callers are given the token
        assert not rds.exists(keys.paused)

        # The operator's own dashboard still purges: its forms carry the token.
        tab.on("dialog", lambda dialog: asyncio.ensure_future(dialog.accept()))
        await tab.goto(victim + "/tether/queues/default/dead")
        await tab.get_by_role("button", name=f"Purge all {DEAD}").click()
        await tab.wait_for_url(victim + "/tether/queues/default/dead")
        assert rds.xlen(keys.dead) == 0
        await context.close()
    rds.close()


# -- a router across event loops ---------------------------------------------------------


@pytest.mark.filterwarnings("ignore::ResourceWarning")  # the loop closed by hand, below
def test_a_router_that_opened_its_app_serves_one_event_loop_after_another(
    url: str, namespace: str
) -> None:
    """No lifespan opens the app: the router opens it at its first request, on that
    request's loop. Each ``asyncio.run`` (as each ``TestClient``) and each server below
    runs a loop of its own."""
    app = Tether(url, namespace=namespace)
    host = FastAPI()
    host.include_router(router(app), prefix="/tether")

    async def ask() -> httpx.Response:
        transport = httpx.ASGITransport(app=host)
        async with httpx.AsyncClient(transport=transport, base_url="http://host") as client:
            return await client.get("/tether/api/queues")

    for _ in range(2):
        answer = asyncio.run(ask())
        assert answer.status_code == 200, answer.text
    assert not app.is_open  # closed with its loop, on it
    for _ in range(2):
        with serving(host) as address:
            answer = httpx.get(address + "/tether/api/queues", timeout=20)
            assert answer.status_code == 200, answer.text
    # A loop closed by hand never closes the client: the next loop lets go of it.
    for _ in range(2):
        loop = asyncio.new_event_loop()
        try:
            assert loop.run_until_complete(ask()).status_code == 200
        finally:
            loop.close()
    assert app.is_open
    assert asyncio.run(ask()).status_code == 200
    assert not app.is_open
    gc.collect()  # the sockets of the hand-closed loops' clients, released here


# -- throttled guessing ------------------------------------------------------------------


def test_the_failure_table_is_bounded_and_forgets() -> None:
    now = [0.0]
    throttle = FailureThrottle(free=3, max_clients=100, forget_after=60, clock=lambda: now[0])
    for i in range(10_000):
        throttle.failed(f"10.{i // 65536}.{i // 256 % 256}.{i % 256}")
    assert len(throttle) == 100
    for _ in range(3):
        throttle.failed("192.0.2.1")
    assert throttle.wait("192.0.2.1") == 1.0
    throttle.failed("192.0.2.1")
    assert throttle.wait("192.0.2.1") == 2.0
    # One IPv6 host holds a /64: its addresses are one client.
    for i in range(3):
        throttle.failed(f"2001:db8::{i + 1}")
    assert throttle.wait("2001:db8::ffff") == 1.0
    now[0] += 61
    assert throttle.wait("192.0.2.1") == 0.0
    assert throttle.failed("192.0.2.1").count == 1


async def test_wrong_tokens_are_throttled_per_address_and_logged(
    url: str, namespace: str, caplog: pytest.LogCaptureFixture
) -> None:
    web = create_app(ops.fresh(url, namespace).app, token=TOKEN)
    wrong = "guess-" + "x" * 20
    statuses: list[int] = []
    with caplog.at_level(logging.WARNING, logger="tether.web"), serving(web) as address:
        async with httpx.AsyncClient(base_url=address, timeout=20) as c:
            # One connection, as fast as it answers, for two seconds.
            loop = asyncio.get_running_loop()
            deadline = loop.time() + 2
            last = None
            while loop.time() < deadline:
                last = await c.get("/api/queues", headers={"Authorization": f"Bearer {wrong}"})
                statuses.append(last.status_code)
            assert last is not None and last.status_code == 429
            assert int(last.headers["retry-after"]) >= 1
            # While it waits, even the right token is not checked from that address...
            right = {"Authorization": f"Bearer {TOKEN}"}
            assert (await c.get("/api/queues", headers=right)).status_code == 429
            # ...nor at the login page.
            login = await c.post("/login", data={"token": TOKEN})
            assert login.status_code == 429 and "try again" in login.text
            # Another address is not held up (uvicorn takes X-Forwarded-For from 127.0.0.1).
            other = {**right, "X-Forwarded-For": "192.0.2.7"}
            assert (await c.get("/api/queues", headers=other)).status_code == 200
            # Wrong tokens at the login page count the same way.
            page = {"X-Forwarded-For": "192.0.2.8"}
            logins = [(await c.post("/login", data={"token": wrong}, headers=page)).status_code
                      for _ in range(6)]  # fmt: skip
            assert logins == [401] * 5 + [429]
    checked = statuses.count(401)
    # Five free guesses, then one after a second's wait (and one after two more).
    assert 5 <= checked <= 7, statuses
    assert set(statuses) == {401, 429}
    messages = [r.getMessage() for r in caplog.records if r.name == "tether.web"]
    assert any("wrong token in an Authorization header from 127.0.0.1" in m for m in messages)
    assert any("wrong token at the login page from 192.0.2.8" in m for m in messages)
    assert all(wrong not in m and TOKEN not in m for m in messages)
