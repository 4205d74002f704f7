"""The management API over real HTTP: uvicorn on a free port, httpx as the client, a real
server and real worker processes behind it.

Every route is found by walking the app's routes (never a hand-kept list), so a route added
later is covered by the 401 and read-only checks without anyone remembering to."""

from __future__ import annotations

import html
import logging
import os
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx
import pytest
import redis
from fastapi import Depends, FastAPI, HTTPException, Request
from fastapi.routing import APIRoute
from starlette.routing import Route

from tether.protocol._keys import QueueKeys, known_queues_key
from tether.web import create_app, router
from tether.web._auth import PUBLIC_PATHS, SESSION_COOKIE

from ..apps import ops
from ..helpers import FAST, WorkerProcess, eventually
from ..web_helpers import TOKEN, sample_path, serving, valkey_url  # noqa: F401  (a fixture)

BEARER = {"Authorization": f"Bearer {TOKEN}"}
APP = "tests.apps.ops:app"


def routes_of(app: FastAPI) -> list[tuple[str, str]]:
    """(method, path) of every route the app serves, HEAD aside, included routers walked
    (FastAPI 0.12x keeps them as routes; later releases as lazily included routers)."""
    try:
        from fastapi.routing import iter_route_contexts
    except ImportError:  # a FastAPI that copies included routes into the app
        found = [(r.path, r.methods) for r in app.routes if isinstance(r, (APIRoute, Route))]
    else:
        found = [(c.path, c.methods) for c in iter_route_contexts(app.routes)]
    return [(m, p) for p, methods in found if p for m in sorted(methods or ()) if m != "HEAD"]


def writes_of(app: FastAPI) -> list[tuple[str, str]]:
    return [
        (m, p) for m, p in routes_of(app) if m not in ("GET", "OPTIONS") and p not in PUBLIC_PATHS
    ]


@pytest.fixture
def url(valkey_url: str) -> str:  # noqa: F811  (the fixture of that name)
    """One server for these tests (see ``valkey_url``)."""
    return valkey_url


@pytest.fixture
async def tasks(url: str, namespace: str) -> AsyncIterator[ops.Ops]:
    """The producer side, on the test's event loop."""
    made = ops.fresh(url, namespace)
    async with made.app:
        yield made


@pytest.fixture
def server_app(url: str, namespace: str) -> ops.Ops:
    """The server's own app (it runs on uvicorn's event loop, in another thread)."""
    return ops.fresh(url, namespace)


@pytest.fixture
def web(server_app: ops.Ops) -> FastAPI:
    return create_app(server_app.app, token=TOKEN)


@pytest.fixture
def base(web: FastAPI) -> Iterator[str]:
    with serving(web) as address:
        yield address


@pytest.fixture
async def client(base: str) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(base_url=base, headers=BEARER, timeout=20) as c:
        yield c


# -- security -----------------------------------------------------------------------------


async def test_every_endpoint_without_a_token_answers_401(web: FastAPI, base: str) -> None:
    found = [(m, p) for m, p in routes_of(web) if p not in PUBLIC_PATHS]
    assert ("GET", "/api/openapi.json") in found and ("POST", "/api/queues/{queue}/pause") in found
    async with httpx.AsyncClient(base_url=base, timeout=20) as anonymous:
        for n, (method, path) in enumerate(found):
            url = sample_path(path)
            # Each request from an address of its own (uvicorn takes X-Forwarded-For from
            # 127.0.0.1): one address's wrong tokens get 429 after a few, unchecked.
            address = {"X-Forwarded-For": f"10.{n // 256}.{n % 256}.1"}
            for headers in (
                {},
                {"Authorization": "Bearer " + "x" * len(TOKEN)},
                {"Authorization": TOKEN},
                {"Cookie": f"{SESSION_COOKIE}=forged.9999999999.mac"},
            ):
                answer = await anonymous.request(
                    method, url, headers={**headers, **address}, json={}
                )
                assert answer.status_code == 401, (method, path, headers, answer.text)
                assert "detail" in answer.json()
        page = await anonymous.get("/api/queues", headers={"Accept": "text/html"})
        assert page.status_code == 303
        assert page.headers["location"] == "/login?next=%2Fapi%2Fqueues"


async def test_a_wrong_bearer_token_is_told_apart_from_none(base: str) -> None:
    """RFC 6750: no credentials get a bare challenge; a wrong token gets invalid_token, in
    the body and in WWW-Authenticate, so a script knows to fix its token, not to add one.
    A wrong token is answered so even where a browser without one is sent to the login."""
    async with httpx.AsyncClient(base_url=base, timeout=20) as anonymous:
        missing = await anonymous.get("/api/queues")
        assert missing.status_code == 401
        assert missing.json() == {
            "detail": "authentication required: send the token as "
            "'Authorization: Bearer <token>' or log in at /login"
        }
        assert missing.headers["www-authenticate"] == 'Bearer realm="tether"'
        for accept in ("application/json", "text/html"):
            wrong = await anonymous.get("/api/queues", headers={
                "Authorization": "Bearer " + "x" * len(TOKEN), "Accept": accept})  # fmt: skip
            assert wrong.status_code == 401, accept
            assert wrong.json() == {
                "detail": "the bearer token is wrong: check the token the server was started with",
                "error": "invalid_token",
            }
            assert 'error="invalid_token"' in wrong.headers["www-authenticate"]


async def test_one_task_id_rule_and_message_for_the_api_and_the_pages(
    client: httpx.AsyncClient,
) -> None:
    """A short id, a cut one (as a list once showed them) and a stream entry id are
    malformed (422) in the API and on the task page alike, with the same words; a
    well-formed id of no task is unknown (404)."""
    rule = "a task id is its queue, a colon and the id proper: a plain enqueue's stream"
    for bad, words in (("default:cea5cc", "is not a task id"),
                       ("default:9f2c4e\u2026", "is cut short: copy the whole task id"),
                       ("default:9f2c4e...", "is cut short"),
                       ("1732870000000-0", "is not a task id")):  # fmt: skip
        api = await client.get(f"/api/tasks/{quote(bad, safe='')}")
        assert api.status_code == 422, (bad, api.text)
        (item,) = api.json()["detail"]
        assert words in item["msg"] and rule in item["msg"], item
        page = await client.get("/task", params={"id": bad})
        assert page.status_code == 422, bad
        assert item["msg"] in html.unescape(page.text), bad
        cancel = await client.post(f"/api/tasks/{quote(bad, safe='')}/cancel")
        assert cancel.status_code == 422 and cancel.json()["detail"][0]["msg"] == item["msg"]
    for unknown in ("default:" + "0" * 32, "default:2-1-0", "default:some-taskiq-id.1a2b3c4d"):
        assert (await client.get(f"/api/tasks/{quote(unknown, safe='')}")).status_code == 404
        assert (await client.get("/task", params={"id": unknown})).status_code == 404


async def test_read_only_answers_403_to_every_write(server_app: ops.Ops) -> None:
    standalone = create_app(server_app.app, token=TOKEN, read_only=True)
    mounted = FastAPI()
    mounted.include_router(router(server_app.app, read_only=True), prefix="/tether")
    for app, prefix, headers in ((standalone, "", BEARER), (mounted, "", {})):
        writes = writes_of(app)
        assert len(writes) >= 10, writes
        with serving(app) as address:
            async with httpx.AsyncClient(base_url=address + prefix, headers=headers) as c:
                for method, path in writes:
                    for body in ({"json": {"all": True}}, {"content": b"{not json"}):
                        answer = await c.request(
                            method, sample_path(path), headers={"Content-Type":
                            "application/json"}, **body,  # type: ignore[arg-type]
                        )  # fmt: skip
                        if "{not" in str(body) and app is mounted:
                            # A mounted router sees a body FastAPI could not parse first.
                            assert answer.status_code in (403, 422), (method, path)
                            continue
                        assert answer.status_code == 403, (method, path, answer.text)
                health = "/tether/api/health" if app is mounted else "/api/health"
                assert (await c.get(health)).status_code == 200


async def test_a_browser_logs_in_with_the_token_and_writes_need_the_csrf_token(
    base: str, tasks: ops.Ops, caplog: pytest.LogCaptureFixture
) -> None:
    await tasks.ok.enqueue(1)
    async with httpx.AsyncClient(base_url=base, timeout=20) as browser:
        page = await browser.get("/login", params={"next": "/api/queues"})
        assert page.status_code == 200 and 'name="token"' in page.text
        wrong = await browser.post("/login", data={"token": "not-the-token", "next": "/"})
        assert wrong.status_code == 401 and SESSION_COOKIE not in wrong.cookies
        answer = await browser.post("/login", data={"token": TOKEN, "next": "/api/queues"})
        assert answer.status_code == 303 and answer.headers["location"] == "/api/queues"
        cookie = answer.headers["set-cookie"]
        assert "HttpOnly" in cookie and "SameSite=strict" in cookie and "Path=/" in cookie
        assert (await browser.get("/api/queues")).status_code == 200
        assert (await browser.get("/")).status_code == 200
        # A state-changing request from the browser needs its session's CSRF token.
        refused = await browser.post("/api/queues/default/pause")
        assert refused.status_code == 403 and "CSRF" in refused.json()["detail"]
        forged = await browser.post("/api/queues/default/pause", headers={"X-CSRF-Token": "x"})
        assert forged.status_code == 403
        session = (await browser.get("/api/session")).json()
        assert session["authenticated_by"] == "session" and session["csrf_token"]
        with caplog.at_level(logging.INFO, logger="tether.web.audit"):
            done = await browser.post(
                "/api/queues/default/pause", headers={"X-CSRF-Token": session["csrf_token"]}
            )
        assert done.status_code == 200 and done.json()["paused"] is True
        (line,) = [r.getMessage() for r in caplog.records if "queue.pause" in r.getMessage()]
        assert "browser session" in line and "127.0.0.1" in line and "queue='default'" in line
        # A form post carries the token as a field.
        form = await browser.post("/api/queues/default/resume",
                                  data={"csrf_token": session["csrf_token"]})  # fmt: skip
        assert form.status_code == 200 and form.json()["paused"] is False
        # Leaving the login page for another site is refused.
        away = await browser.post("/login", data={"token": TOKEN, "next": "//evil.example/"})
        assert away.headers["location"] == "/"
        out = await browser.post("/logout")
        assert out.status_code == 303
        browser.cookies.clear()
        assert (await browser.get("/api/queues")).status_code == 401
    async with httpx.AsyncClient(base_url=base, headers=BEARER) as script:
        assert (await script.get("/api/session")).json()["csrf_token"] is None
        assert (await script.post("/api/queues/default/resume")).status_code == 200


async def test_a_mounted_router_serves_under_a_prefix_with_the_hosts_auth(
    server_app: ops.Ops, tasks: ops.Ops, caplog: pytest.LogCaptureFixture
) -> None:
    def admin_only(request: Request) -> None:
        if request.headers.get("x-admin") != "yes" and request.cookies.get("host") != "admin":
            raise HTTPException(401, "admins only")

    def who(request: Request) -> str:
        return "admin alice"

    host = FastAPI()
    host.include_router(
        router(server_app.app, actor=who), prefix="/tether", dependencies=[Depends(admin_only)]
    )
    await tasks.fail.enqueue(1)
    with serving(host) as address:
        async with httpx.AsyncClient(base_url=address, timeout=20) as c:
            assert (await c.get("/tether/api/queues")).status_code == 401
            ok = await c.get("/tether/api/queues", headers={"x-admin": "yes"})
            assert ok.status_code == 200 and ok.json()["items"][0]["name"] == "default"
            # With the host's Basic credentials a request a page on another site could send
            # (no body, or a form) needs the CSRF token: browsers attach remembered Basic
            # credentials to it. JSON, which such a page cannot send, needs none...
            header_auth = {"x-admin": "yes", "Authorization": "Basic x"}
            bodiless = await c.post("/tether/api/queues/default/pause", headers=header_auth)
            assert bodiless.status_code == 403
            with caplog.at_level(logging.INFO, logger="tether.web.audit"):
                paused = await c.post(
                    "/tether/api/queues/default/pause", headers=header_auth, json={}
                )
            assert paused.status_code == 200
            assert any("admin alice" in r.getMessage() for r in caplog.records)
            # ...with its cookie, the double-submit token is.
            c.cookies.set("host", "admin")
            assert (await c.post("/tether/api/queues/default/resume")).status_code == 403
            session = await c.get("/tether/api/session")
            token = session.json()["csrf_token"]
            assert session.json()["authenticated_by"] == "host" and token
            resumed = await c.post("/tether/api/queues/default/resume",
                                   headers={"X-CSRF-Token": token})  # fmt: skip
            assert resumed.status_code == 200


# -- what the API shows -------------------------------------------------------------------


async def test_counts_in_the_api_match_what_was_enqueued_run_failed_and_killed(
    client: httpx.AsyncClient,
    tasks: ops.Ops,
    url: str,
    namespace: str,
    workers: list[WorkerProcess],
    tmp_path: Path,
) -> None:
    async def queue() -> dict[str, Any]:
        answer = await client.get("/api/queues/default")
        assert answer.status_code == 200, answer.text
        return dict(answer.json())

    await tasks.ok.options(priority="high").enqueue_many([(i,) for i in range(3)])
    await tasks.ok.enqueue_many([(i,) for i in range(4)])
    await tasks.ok.options(priority="low").enqueue_many([(i,) for i in range(2)])
    delayed = await tasks.ok.options(delay=600).enqueue_many([(i,) for i in range(2)])
    q = await queue()
    assert q["waiting"] == {"high": 3, "normal": 4, "low": 2} and q["depth"] == 9
    assert (q["running"], q["delayed"], q["dead"], q["workers"]) == (0, 2, 0, 0)
    listed = (await client.get("/api/queues/default/delayed")).json()["items"]
    assert {d["task_id"] for d in listed} == {h.id for h in delayed}

    await tasks.fail.enqueue_many([(i,) for i in range(3)])
    await tasks.flaky.enqueue_many([(i,) for i in range(2)])
    held = await tasks.hold.enqueue(1.0)
    settings = {**FAST, "heartbeat_ttl": 1.0}
    first = WorkerProcess(url, namespace, "web-a", app=APP, log_dir=tmp_path, **settings)
    workers.append(first)

    async def settled() -> bool:
        q = await queue()
        return q["dead"] == 5 and q["depth"] == 0 and q["running"] == 1

    await eventually(settled, timeout=20)
    running = (await client.get("/api/queues/default/running")).json()["items"]
    assert [(r["task_id"], r["worker"], r["worker_alive"]) for r in running] == [
        (held.id, "web-a", True)
    ]
    fleet = (await client.get("/api/workers")).json()["items"]
    assert [w["name"] for w in fleet] == ["web-a"] and fleet[0]["running"] == 1
    assert (await client.get("/api/workers/web-a")).json()["pid"] == first.pid
    stats = (await client.get("/api/stats/tasks", params={"queue": "default"})).json()["items"]
    counts = {s["task"]: s["counts"] for s in stats}
    assert counts["ops.ok"]["succeeded"] == 9 and counts["ops.fail"]["failed"] == 3
    assert (counts["ops.flaky"]["retried"], counts["ops.flaky"]["failed"]) == (2, 2)
    dead = (await client.get("/api/queues/default/dead", params={"limit": 2})).json()
    assert dead["total"] == 5 and len(dead["items"]) == 2 and dead["cursor"]

    first.signal(9)  # killed while the hold task runs
    await eventually(lambda: _workers(client, []), timeout=10)

    async def orphaned() -> bool:
        # The registry and the lease key expire on their own clocks, both within the lease.
        orphan = (await client.get("/api/queues/default/running")).json()["items"]
        return [(r["worker"], r["worker_alive"]) for r in orphan] == [("web-a", False)]

    await eventually(orphaned, timeout=10)
    assert (await queue())["running"] == 1
    workers.append(WorkerProcess(url, namespace, "web-b", app=APP, log_dir=tmp_path, **settings))
    assert await held.result(timeout=20) == "held"  # reclaimed and run again
    task = (await client.get(f"/api/tasks/{held.id}")).json()
    assert (task["status"], task["result"], task["task"]) == ("succeeded", "held", "ops.hold")
    q = await queue()
    assert (q["running"], q["depth"], q["dead"], q["workers"]) == (0, 0, 5, 1)


async def test_dead_letters_schedules_and_tasks_through_the_api(
    client: httpx.AsyncClient, tasks: ops.Ops, url: str, namespace: str
) -> None:
    await tasks.fail.enqueue_many([(i,) for i in range(4)])
    await tasks.flaky.options(retries=0).enqueue_many([(i,) for i in range(2)])
    await _drain(tasks)
    dead = (await client.get("/api/queues/default/dead", params={"task": "ops.fail"})).json()
    assert dead["total"] == 6 and len(dead["items"]) == 4
    entry = dead["items"][0]["entry_id"]
    shown = (await client.get(f"/api/queues/default/dead/{entry}")).json()
    assert shown["status"] == "failed" and "ValueError" in shown["error"]["type"]
    retried = await client.post(f"/api/queues/default/dead/{entry}/retry")
    assert retried.status_code == 200 and retried.json()["task_id"] == shown["task_id"]
    assert (await client.get(f"/api/tasks/{shown['task_id']}")).json()["status"] == "queued"
    others = [d["entry_id"] for d in dead["items"][1:]]
    bulk = await client.post("/api/queues/default/dead/purge", json={"ids": others[:2]})
    assert bulk.json()["count"] == 2
    by_task = await client.post("/api/queues/default/dead/purge", json={"task": "ops.flaky"})
    assert by_task.json()["count"] == 2 and by_task.json()["cursor"] is None
    gone = await client.delete(f"/api/queues/default/dead/{others[2]}")
    assert gone.status_code == 200
    assert (await client.delete(f"/api/queues/default/dead/{others[2]}")).status_code == 404
    assert (await client.get("/api/queues/default/dead")).json()["total"] == 0
    cancelled = await client.post(f"/api/tasks/{shown['task_id']}/cancel")
    assert cancelled.json()["result"] == "cancelled"

    later = await tasks.ok.options(delay=600).enqueue(41)
    moved = await client.post(f"/api/tasks/{later.id}/run-now")
    assert moved.status_code == 200 and moved.json()["due"] == "now"
    await _drain(tasks)  # its first maintenance pass moves it into the stream
    assert await later.result(timeout=10) == 41
    again = await client.post(f"/api/tasks/{later.id}/run-now")
    assert again.status_code == 409 and "succeeded" in again.json()["detail"]

    schedules = (await client.get("/api/schedules")).json()["items"]
    assert [s["name"] for s in schedules] == ["hourly"] and schedules[0]["source"] == "code"
    assert (await client.post("/api/schedules/hourly/pause")).json()["paused"] is True
    assert (await client.get("/api/schedules")).json()["items"][0]["paused"] is True
    assert (await client.post("/api/schedules/hourly/resume")).json()["paused"] is False
    triggered = (await client.post("/api/schedules/hourly/trigger")).json()
    assert (await client.get(f"/api/tasks/{triggered['task_id']}")).json()["task"] == "ops.hourly"
    declared = await client.delete("/api/schedules/hourly")
    assert declared.status_code == 409 and "declared in code" in declared.json()["detail"]
    assert (await client.post("/api/schedules/nope/pause")).status_code == 404

    health = (await client.get("/api/health")).json()
    assert health["reachable"] is True and health["server"] in ("redis", "valkey")
    assert health["namespace"] == namespace


async def test_task_statistics_page_through_every_queue_and_task_once(
    client: httpx.AsyncClient, rds: redis.Redis, namespace: str
) -> None:
    """Paged by queue then task: queue "a" comes before "ab" (as text, "a|y" sorts after
    "ab|x": the page after "a|x" once left "ab" out)."""
    minute = int(time.time() // 60)
    for queue in ("a", "ab", "b"):
        rds.zadd(known_queues_key(namespace), {queue: 0})
        for task in ("x", "y"):
            rds.hincrby(QueueKeys.of(namespace, queue).stats_minute(minute), f"{task}|ok", 1)
    seen: list[tuple[str, str]] = []
    params: dict[str, Any] = {"limit": 1}
    while True:
        page = (await client.get("/api/stats/tasks", params=params)).json()
        seen += [(r["queue"], r["task"]) for r in page["items"]]
        if page["cursor"] is None:
            break
        params["cursor"] = page["cursor"]
    assert seen == [(q, t) for q in ("a", "ab", "b") for t in ("x", "y")]
    bad = await client.get("/api/stats/tasks", params={"cursor": "no-bar"})
    assert bad.status_code == 422, bad.text


async def test_bad_input_gets_a_json_4xx_never_a_500(client: httpx.AsyncClient) -> None:
    cases = {
        "/api/queues/nope": 404,
        "/api/queues/bad%20name": 422,
        "/api/queues/default/dead/not-an-id": 422,
        "/api/queues/default/dead/1-0": 404,
        "/api/queues/default/running?limit=100000": 422,
        "/api/queues/default/running?cursor=garbage": 422,
        "/api/queues/default/delayed?cursor=garbage": 422,
        "/api/queues/default/dead?cursor=garbage": 422,
        "/api/queues/default/throughput?minutes=0": 422,
        "/api/stats/tasks?window=1": 422,
        "/api/tasks/not-a-task-id": 422,
        "/api/tasks/default:" + "0" * 32: 404,
        "/api/workers/nobody": 404,
    }
    for path, status in cases.items():
        answer = await client.get(path)
        assert answer.status_code == status, (path, answer.text)
        assert answer.headers["content-type"] == "application/json", path
        assert "detail" in answer.json()
    for body in ({}, {"ids": ["x"]}, {"all": True, "task": "t"}, {"ids": ["1-0"], "extra": 1}):
        answer = await client.post("/api/queues/default/dead/retry", json=body)
        assert answer.status_code == 422, (body, answer.text)


async def test_the_api_survives_a_fuzzer_with_no_500_and_no_schema_violation(
    base: str, tasks: ops.Ops
) -> None:
    import schemathesis
    from hypothesis import HealthCheck, given, settings
    from schemathesis.checks import (
        content_type_conformance,
        not_a_server_error,
        response_schema_conformance,
        status_code_conformance,
    )

    await tasks.ok.enqueue_many([(i,) for i in range(3)])
    await tasks.ok.options(delay=600).enqueue(1)
    await tasks.fail.enqueue(1)
    await _drain(tasks)
    schema = schemathesis.openapi.from_url(f"{base}/api/openapi.json", headers=BEARER)
    checks = [
        not_a_server_error, status_code_conformance, content_type_conformance,
        response_schema_conformance,
    ]  # fmt: skip
    operations = [result.ok() for result in schema.get_all_operations()]
    # A small budget for the suite; WEB_FUZZ_EXAMPLES=200 for a longer run by hand.
    examples = int(os.environ.get("WEB_FUZZ_EXAMPLES", "8"))
    assert len(operations) >= 20
    for operation in operations:

        @given(case=operation.as_strategy())
        @settings(
            max_examples=examples, deadline=None, database=None,
            suppress_health_check=list(HealthCheck),
        )  # fmt: skip
        def check(case: Any) -> None:
            case.call_and_validate(base_url=base, headers=BEARER, checks=checks)

        check()


# -- helpers ------------------------------------------------------------------------------


async def _drain(tasks: ops.Ops) -> None:
    """A burst worker on the producer's app: it returns once nothing is due."""
    await tasks.app.worker(burst=True, **FAST).run()


async def _workers(client: httpx.AsyncClient, names: list[str]) -> bool:
    page = (await client.get("/api/workers")).json()
    return [w["name"] for w in page["items"]] == names
