"""The FastAPI and Flask recipes of docs/producers.md, run for real: the FastAPI app served by
uvicorn (its lifespan opens the Tether app, and may run a worker in-process), the Flask app
through its test client, both against a real server and a real worker."""

from __future__ import annotations

import ast
import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis
from asgi_lifespan import LifespanManager
from fastapi import FastAPI, Request

from tether import ConfigError, WorkerSettings
from tether.base._embedded import free_port
from tether.contrib.fastapi import TetherApp, lifespan

from ..docs.test_docs import blocks
from ..helpers import ROOT, WorkerProcess

# -- FastAPI, under uvicorn ---------------------------------------------------------------


class Uvicorn:
    """``uvicorn MODULE:APP`` on a free port, stopped with SIGTERM (a graceful shutdown runs
    the lifespan's end)."""

    def __init__(self, target: str, url: str, namespace: str, log_dir: Path) -> None:
        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        self.log_path = log_dir / "uvicorn.log"
        self._log = open(self.log_path, "wb")  # noqa: SIM115 - closed in stop
        env = {
            **os.environ,
            "TETHER_URL": url,
            "TETHER_NAMESPACE": namespace,
            "PYTHONPATH": str(ROOT),
        }
        self.process = subprocess.Popen(
            [sys.executable, "-m", "uvicorn", target, "--host", "127.0.0.1", "--port",
             str(self.port), "--log-level", "info"],
            env=env, cwd=ROOT, stdout=self._log, stderr=subprocess.STDOUT,
        )  # fmt: skip
        deadline = time.monotonic() + 20
        while True:
            assert self.process.poll() is None, self.log()
            try:
                httpx.get(f"{self.base}/docs", timeout=1)
                break
            except httpx.TransportError:
                assert time.monotonic() < deadline, self.log()
                time.sleep(0.05)

    def log(self) -> str:
        if not self._log.closed:
            self._log.flush()
        return self.log_path.read_text(errors="replace")

    def stop(self) -> None:
        """Stop gracefully; uvicorn runs the lifespan's end, then re-raises the signal."""
        if self._log.closed:
            return
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        try:
            code = self.process.wait(30)
        finally:
            if self.process.poll() is None:
                self.process.kill()
                self.process.wait(10)
            self._log.close()
        assert code in (0, -signal.SIGTERM), self.log()
        assert "Application shutdown complete" in self.log_path.read_text(errors="replace")


@pytest.fixture
def serve(url: str, namespace: str, tmp_path: Path) -> Iterator[Any]:
    started: list[Uvicorn] = []

    def start(target: str) -> Uvicorn:
        server = Uvicorn(target, url, namespace, tmp_path)
        started.append(server)
        return server

    yield start
    for server in started:
        server.stop()


async def wait_done(client: httpx.AsyncClient, task_id: str, timeout: float = 20) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        reply = await client.get(f"/tasks/{task_id}")
        assert reply.status_code == 200, reply.text
        body = reply.json()
        if body["status"] in ("succeeded", "failed", "dead", "cancelled"):
            return body
        assert time.monotonic() < deadline, body
        await asyncio.sleep(0.02)


async def test_fastapi_with_a_separate_worker(
    serve: Any, url: str, namespace: str, tmp_path: Path, workers: list[WorkerProcess],
    rds: redis.Redis,
) -> None:  # fmt: skip
    server = serve("tests.apps.web_fastapi:api")
    async with httpx.AsyncClient(base_url=server.base) as client:
        signup = await client.post("/signup", json={"email": "ann@example.com"})
        assert signup.status_code == 202
        task_id = signup.json()["task_id"]
        assert task_id.startswith("emails:")
        assert (await client.get(f"/tasks/{task_id}")).json()["status"] == "queued"
        worker = WorkerProcess(
            url, namespace, "api-worker", app="tests.apps.web_fastapi:app",
            queues="default,emails", log_dir=tmp_path,
        )  # fmt: skip
        workers.append(worker)
        worker.wait_ready(rds)
        done = await wait_done(client, task_id)
        assert done == {"status": "succeeded", "result": "welcome sent to ann@example.com"}
        # Bad ids answer 4xx with a JSON error, never 500: 422 for a string that is no task
        # id (app.handle() raised ConfigError, which the recipe let through as a 500), 404 for
        # an id no task has.
        bad = await client.get("/tasks/not-an-id")
        assert bad.status_code == 422 and "not a Tether task id" in bad.json()["detail"]
        missing = await client.get("/tasks/default:" + "0" * 32)
        assert missing.status_code == 404
        # Arguments that do not fit the task: 422 naming the problem, not 503 or 500.
        wrong = await client.post("/add", json={"x": 1, "z": 2})
        assert wrong.status_code == 422
        detail = wrong.json()["detail"]
        assert detail == "task 'tests.apps.web_fastapi.add': missing a required argument: 'y'"
    server.stop()


async def test_fastapi_with_an_in_process_worker(
    serve: Any, rds: redis.Redis, namespace: str
) -> None:
    """One process serves the API and runs its tasks; the lifespan's end stops the worker
    gracefully and uvicorn exits cleanly."""
    server = serve("tests.apps.web_fastapi:api_with_worker")
    async with httpx.AsyncClient(base_url=server.base) as client:
        replies = [await client.post("/add", json={"x": i, "y": i}) for i in range(20)]
        ids = [r.json()["task_id"] for r in replies]
        results = [(await wait_done(client, task_id))["result"] for task_id in ids]
        assert results == [2 * i for i in range(20)]
        signup = await client.post("/signup", json={"email": "bob@example.com"})
        done = await wait_done(client, signup.json()["task_id"])
        assert done["result"] == "welcome sent to bob@example.com"
    leases = [k for k in rds.scan_iter(f"{{{namespace}:*") if b":lease:" in k]
    assert len(leases) == 2  # the in-process worker serves both queues
    server.stop()
    # The lifespan's end stopped the worker gracefully: it deleted its leases last.
    assert not [k for k in rds.scan_iter(f"{{{namespace}:*") if b":lease:" in k]


async def test_fastapi_through_an_asgi_client(url: str, namespace: str) -> None:
    """The same recipe in-process: httpx's ASGI transport, the lifespan run by
    asgi-lifespan, the in-process worker on this test's loop."""
    from tests.apps.web_fastapi import FAST, add, app, routes

    started: list[str] = []

    @contextlib.asynccontextmanager
    async def own_lifespan(api: FastAPI) -> AsyncIterator[dict[str, str]]:
        # The application's lifespan runs inside Tether's: it may enqueue at start-up.
        started.append((await add.enqueue(20, 22)).id)
        yield {"warm": started[0]}

    app.configure(url=url, namespace=namespace)
    settings = WorkerSettings(queues=("default", "emails"), **FAST)  # or a dict of its fields
    api = routes(FastAPI(lifespan=lifespan(app, worker=settings, then=own_lifespan)))

    @api.get("/warm")
    async def warm(request: Request) -> str:
        return str(request.state.warm)

    async with LifespanManager(api) as manager:
        transport = httpx.ASGITransport(app=manager.app)
        async with httpx.AsyncClient(transport=transport, base_url="http://api") as client:
            task_id = (await client.post("/add", json={"x": 2, "y": 3})).json()["task_id"]
            assert (await wait_done(client, task_id))["result"] == 5
            warm_id = (await client.get("/warm")).json()
            assert warm_id == started[0]
            assert (await wait_done(client, warm_id))["result"] == 42
    assert not app.is_open  # the lifespan's end closed it


async def test_fastapi_answers_503_only_for_a_server_that_failed_the_call(
    namespace: str,
) -> None:
    """A server that refuses connections: the enqueue answers 503 and says nothing was
    enqueued; arguments that do not fit still answer 422 and a malformed id 422 (neither
    needs the server)."""
    from tests.apps.web_fastapi import app, routes

    app.configure(url=f"redis://127.0.0.1:{free_port()}/0", namespace=namespace)
    api = routes(FastAPI(lifespan=lifespan(app)))
    async with LifespanManager(api) as manager:
        transport = httpx.ASGITransport(app=manager.app)
        async with httpx.AsyncClient(transport=transport, base_url="http://api") as client:
            down = await client.post("/add", json={"x": 1, "y": 2})
            wrong = await client.post("/add", json={"x": 1, "y": 2, "z": 3})
            malformed = await client.get("/tasks/favicon.ico")
    assert down.status_code == 503, down.text
    assert "cannot reach the server" in down.json()["detail"]
    assert down.json()["detail"].endswith("no connection was made, so nothing was enqueued")
    assert wrong.status_code == 422, wrong.text
    assert "unexpected keyword argument 'z'" in wrong.json()["detail"]
    assert malformed.status_code == 422, malformed.text


async def test_fastapi_without_the_lifespan_says_what_is_missing() -> None:
    api = FastAPI()

    @api.get("/")
    def index(tether: TetherApp) -> str:
        return str(tether)

    transport = httpx.ASGITransport(app=api)
    async with httpx.AsyncClient(transport=transport, base_url="http://api") as client:
        with pytest.raises(ConfigError, match="lifespan"):
            await client.get("/")


# -- Flask, through its test client ------------------------------------------------------


@pytest.fixture
def flask_app(url: str, namespace: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    monkeypatch.setenv("TETHER_URL", url)
    monkeypatch.setenv("TETHER_NAMESPACE", namespace)
    from tests.apps import web_flask

    web_flask.app.configure(url=url, namespace=namespace)  # the module is imported once
    yield web_flask
    web_flask.app.close_sync()


def test_flask_enqueues_with_the_blocking_api(
    flask_app: Any, url: str, namespace: str, tmp_path: Path, workers: list[WorkerProcess],
    rds: redis.Redis,
) -> None:  # fmt: skip
    client = flask_app.web.test_client()
    with ThreadPoolExecutor(8) as pool:  # requests in threads share the app's client
        replies = list(
            pool.map(lambda i: client.post("/signup", json={"email": f"u{i}@x"}), range(40))
        )
    assert {r.status_code for r in replies} == {202}
    ids = [r.get_json()["task_id"] for r in replies]
    report = client.post("/reports/2026")
    assert report.status_code == 202
    assert client.get(f"/tasks/{ids[0]}").get_json() == {"status": "queued"}
    # Bad requests answer 4xx, never 500 or 503: a body that is no JSON object 400; fields
    # that do not fit the task 422 (InvalidArguments; the recipe answered every EnqueueError
    # with 503 "the server is down"); a string that is no task id 422 (app.handle() raised
    # ConfigError, a 500); an id no task has 404.
    assert client.post("/signup", data="ann").status_code == 400
    wrong = client.post("/signup", json={"mail": "ann@x"})
    assert wrong.status_code == 422
    assert "missing a required argument: 'email'" in wrong.get_json()["error"]
    assert client.post("/signup", json={"email": "a@x", "cc": "b@x"}).status_code == 422
    assert client.get("/tasks/zzz").status_code == 422
    assert client.get("/tasks/default:" + "0" * 32).status_code == 404

    worker = WorkerProcess(
        url, namespace, "flask-worker", app="tests.apps.web_flask_reports:app",
        queues="default,emails", log_dir=tmp_path,
    )  # fmt: skip
    workers.append(worker)
    worker.wait_ready(rds)
    results = [client.get(f"/tasks/{i}?wait=20").get_json() for i in ids]
    assert [r["result"] for r in results] == [f"welcome sent to u{i}@x" for i in range(40)]
    built = client.get(f"/tasks/{report.get_json()['task_id']}?wait=20").get_json()
    assert built == {"status": "succeeded", "result": "report 2026"}


def test_flask_answers_503_only_for_a_server_that_failed_the_call(namespace: str) -> None:
    from tests.apps import web_flask

    web_flask.app.close_sync()
    web_flask.app.configure(url=f"redis://127.0.0.1:{free_port()}/0", namespace=namespace)
    client = web_flask.web.test_client()
    try:
        down = client.post("/signup", json={"email": "ann@example.com"})
        wrong = client.post("/signup", json={"email": "ann@example.com", "cc": "bob"})
    finally:
        web_flask.app.close_sync()
    assert down.status_code == 503
    assert down.get_json()["error"].endswith("no connection was made, so nothing was enqueued")
    assert wrong.status_code == 422
    assert "unexpected keyword argument 'cc'" in wrong.get_json()["error"]


# -- the recipes in the docs are the apps above --------------------------------------------


def _recipe(marker: str) -> ast.Module:
    """The Python block of docs/producers.md that holds ``marker``, parsed."""
    found = [code for where, _, code in blocks() if where.startswith("producers.md#")]
    chosen = [code for code in found if marker in code]
    assert len(chosen) == 1, marker
    return ast.parse(chosen[0])


def _decorated(tree: ast.AST) -> dict[str, str]:
    """Each decorated function (the views and the tasks), nested or not, by name: its syntax
    tree with its decorators, so layout and comments aside it is the same code."""
    return {
        node.name: ast.dump(node)
        for node in ast.walk(tree)
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.decorator_list
    }


@pytest.mark.parametrize(
    ("marker", "module"), [("FastAPI(lifespan=", "web_fastapi"), ("Flask(__name__)", "web_flask")]
)
def test_the_recipes_in_the_docs_are_the_apps_the_tests_run(marker: str, module: str) -> None:
    """docs/producers.md runs its recipes (tests/docs) for one request of each kind; the tests
    above serve the same views under uvicorn, a real worker and 8 threads. The views and
    tasks the page shows must be the code these tests serve, or a fix to one misses the
    other (the recipes answered 500 for a malformed id, which the test apps did not)."""
    shown = _decorated(_recipe(marker))
    served = _decorated(ast.parse((ROOT / "tests" / "apps" / f"{module}.py").read_text()))
    assert len(shown) >= 3, sorted(shown)  # the task and the two views
    differing = [name for name, code in shown.items() if served.get(name) != code]
    assert not differing, f"docs/producers.md and tests/apps/{module}.py differ in {differing}"
