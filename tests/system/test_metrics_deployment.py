"""The deployment's metrics, read from Redis at each scrape: /metrics of `tether web` (a
real uvicorn, behind the token) and `tether exporter` (a real process), checked with
promtool and read back with prometheus-client's parser."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import redis

from tether import ConfigError, Tether
from tether.base._embedded import EmbeddedServer, embedded_binary, free_port
from tether.metrics import METRICS, Exporter, exposition
from tether.web import create_app

from ..helpers import ROOT, WorkerProcess, running_worker, wait_until
from ..metrics_helpers import check_exposition, scrape
from ..web_helpers import TOKEN, serving, valkey_url  # noqa: F401  (a fixture)

OPENMETRICS = "application/openmetrics-text; version=1.0.0"


@pytest.fixture
def url(valkey_url: str) -> str:  # noqa: F811  (the fixture of that name)
    """One server kind: what the figures are is tested on each kind in test_admin."""
    return valkey_url


@pytest.fixture
def own_server() -> Iterator[EmbeddedServer]:
    """A server of this test's own, to stop and freeze."""
    server = EmbeddedServer(embedded_binary()).start()
    yield server
    if server.process is not None and server.process.poll() is None:
        os.kill(server.process.pid, signal.SIGCONT)
    server.cleanup()


def _app(url: str, namespace: str) -> Tether:
    app = Tether(url, namespace=namespace)

    @app.task(name="dep.boom")
    async def boom() -> None:
        raise ValueError("boom")

    @app.task(name="dep.work", queue="work")
    async def work(i: int) -> int:
        return i

    @app.task(name="dep.hold", queue="held")
    async def hold() -> None:
        return None

    return app


async def test_tether_web_serves_the_queue_gauges_behind_its_token(
    url: str, namespace: str
) -> None:
    app = _app(url, namespace)
    async with app:
        await app.by_name("dep.boom").enqueue()
        await app.worker(burst=True, queues=("default",)).run()  # one dead letter
        work = app.by_name("dep.work")
        await work.enqueue_many([(1,), (2,)])
        await work.options(priority="low").enqueue(3)
        await work.options(priority="high").enqueue(4)
        await work.options(delay=3600).enqueue(5)
        await app.pause("held")
        await app.by_name("dep.hold").enqueue()
        await asyncio.sleep(0.05)  # the oldest waiting entry is older than this
        # The server gets an app of its own: it opens it on uvicorn's event loop.
        async with running_worker(app, queues=("idle",)):
            with serving(create_app(_app(url, namespace), token=TOKEN)) as base:
                anonymous = await asyncio.to_thread(scrape, f"{base}/metrics")
                wrong = await asyncio.to_thread(scrape, f"{base}/metrics", token="x" * 30)
                got = await asyncio.to_thread(scrape, f"{base}/metrics", token=TOKEN)
                om = await asyncio.to_thread(
                    scrape, f"{base}/metrics", token=TOKEN, accept=OPENMETRICS
                )

    assert (anonymous.status, wrong.status) == (401, 401)
    assert got.status == 200, got.text
    assert got.content_type.startswith("text/plain; version=0.0.4")
    check_exposition(got.text)
    assert got.value("tether_up") == 1
    assert got.value("tether_read_duration_seconds") > 0
    depth = {p: got.value("tether_queue_depth", queue="work", priority=p) for p in
             ("high", "normal", "low")}  # fmt: skip
    assert depth == {"high": 1, "normal": 2, "low": 1}
    assert got.value("tether_queue_delayed", queue="work") == 1
    assert got.value("tether_queue_running", queue="work") == 0
    assert got.value("tether_queue_oldest_waiting_seconds", queue="work") >= 0.05
    assert got.value("tether_queue_oldest_waiting_seconds", queue="default") == 0
    assert got.value("tether_queue_dead_letters", queue="default") == 1
    assert got.value("tether_queue_dead_letters", queue="work") == 0
    assert got.value("tether_queue_paused", queue="held") == 1
    assert got.value("tether_queue_paused", queue="work") == 0
    assert got.value("tether_queue_depth", queue="held", priority="normal") == 1
    assert got.value("tether_queue_workers", queue="idle") == 1
    assert got.value("tether_queue_workers", queue="work") == 0
    assert got.value("tether_workers") == 1
    assert got.value("tether_scheduler_leader") == 1
    assert {q["queue"] for q in got.labelled("tether_queue_running")} == {
        "default", "work", "held", "idle"
    }  # fmt: skip
    assert om.status == 200
    assert om.content_type.startswith("application/openmetrics-text")
    assert om.text.rstrip().endswith("# EOF")


async def test_an_unreachable_server_is_tether_up_0_not_an_error(
    own_server: EmbeddedServer, namespace: str
) -> None:
    with serving(create_app(_app(own_server.url, namespace), token=TOKEN)) as base:
        up = await asyncio.to_thread(scrape, f"{base}/metrics", token=TOKEN)
        assert up.value("tether_up") == 1
        assert own_server.process is not None
        own_server.process.kill()
        own_server.process.wait(10)
        down = await asyncio.to_thread(scrape, f"{base}/metrics", token=TOKEN)
    assert down.status == 200, down.text
    check_exposition(down.text)
    assert down.value("tether_up") == 0
    assert {n for n in down.names() if n.startswith("tether_")} == {
        "tether_up", "tether_read_duration_seconds"
    }  # fmt: skip
    assert "Traceback" not in down.text


async def test_a_frozen_server_answers_within_the_read_timeout(
    own_server: EmbeddedServer, namespace: str
) -> None:
    app = _app(own_server.url, namespace)
    assert own_server.process is not None
    async with app:
        assert b"tether_up 1.0" in (await exposition(app))[0]
        os.kill(own_server.process.pid, signal.SIGSTOP)
        try:
            started = asyncio.get_running_loop().time()
            body, _ = await exposition(app, timeout=0.5)
            took = asyncio.get_running_loop().time() - started
        finally:
            os.kill(own_server.process.pid, signal.SIGCONT)
        assert b"tether_up 0.0" in body
        assert took < 3
        # The connection cut short by the timeout does not spoil the next scrape.
        assert b"tether_up 1.0" in (await exposition(app))[0]


async def test_without_the_extra_tether_web_says_how_to_get_metrics(
    url: str, namespace: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "prometheus_client", None)
    for name in [m for m in sys.modules if m.startswith("tether.metrics")]:
        monkeypatch.delitem(sys.modules, name)
    app = Tether(url, namespace=namespace)
    async with app:
        api = create_app(app, token=TOKEN)
        transport = httpx.ASGITransport(app=api)
        async with httpx.AsyncClient(transport=transport, base_url="http://tether") as http:
            answer = await http.get("/metrics", headers={"Authorization": f"Bearer {TOKEN}"})
            health = await http.get("/api/health", headers={"Authorization": f"Bearer {TOKEN}"})
        assert answer.status_code == 501
        assert "pip install 'tether-queue[metrics]'" in answer.text
        assert health.status_code == 200
        with pytest.raises(ConfigError, match=r"pip install 'tether-queue\[metrics\]'"):
            app.worker(metrics_port=0)


def test_tether_exporter_serves_only_the_deployment_metrics(
    url: str, namespace: str, tmp_path: Path, workers: list[WorkerProcess]
) -> None:
    rds = redis.Redis.from_url(url)
    app = Tether(url, namespace=namespace)
    asyncio.run(_pause(app, "default"))
    proc = WorkerProcess(url, namespace, "w1", app="tests.apps.observed:app", log_dir=tmp_path)
    workers.append(proc)
    proc.wait_ready(rds)
    app.by_name("obs.ok").enqueue_many_sync([(i,) for i in range(3)])
    port = free_port()
    log = (tmp_path / "exporter.log").open("wb")
    exporter = subprocess.Popen(
        [sys.executable, "-m", "tether", "exporter", "tests.apps.observed:app", "--port",
         str(port)],
        env={**os.environ, "TETHER_URL": url, "TETHER_NAMESPACE": namespace},
        cwd=ROOT, stdout=log, stderr=subprocess.STDOUT,
    )  # fmt: skip
    try:
        metrics = f"http://127.0.0.1:{port}/metrics"
        got = wait_until(lambda: _try_scrape(metrics), 20)
        check_exposition(got.text)
        assert got.value("tether_up") == 1
        assert got.value("tether_queue_depth", queue="default", priority="normal") == 3
        assert got.value("tether_queue_paused", queue="default") == 1
        assert got.value("tether_queue_workers", queue="default") == 1
        assert got.value("tether_workers") == 1
        assert got.value("tether_scheduler_leader") == 1
        deployment = {s for m in METRICS if m.scope == "deployment" for s in m.series}
        assert got.names() == deployment  # every deployment metric, and nothing else
        assert httpx.get(f"http://127.0.0.1:{port}/", timeout=5).status_code == 404
        exporter.send_signal(signal.SIGTERM)
        assert exporter.wait(20) == 0
        assert _try_scrape(metrics) is None
    finally:
        if exporter.poll() is None:
            exporter.kill()
            exporter.wait(10)
        log.close()
        app.close_sync()
        rds.close()
    output = (tmp_path / "exporter.log").read_text()
    assert f"at http://127.0.0.1:{port}/metrics" in output


async def _pause(app: Tether, queue: str) -> None:
    async with app:
        await app.pause(queue)


def _try_scrape(url: str) -> object:
    try:
        got = scrape(url)
    except httpx.TransportError:
        return None
    return got if got.status == 200 else None


@pytest.mark.parametrize(
    ("args", "env", "message"),
    [
        (["--bind", "0.0.0.0"], {}, "refusing to serve metrics on 0.0.0.0 without a token"),
        (["--bind", "0.0.0.0"], {"TETHER_WEB_TOKEN": "short"}, "at least 16 characters"),
        (["--bind", "10.0.0.1:80"], {}, "without a port"),
        ([], {}, "Missing option '--port'"),
    ],
)
def test_the_exporter_refuses_a_bad_start(
    url: str, namespace: str, args: list[str], env: dict[str, str], message: str
) -> None:
    port = [] if "--port" in message else ["--port", str(free_port())]
    done = subprocess.run(
        [sys.executable, "-m", "tether", "exporter", "--url", url, "--namespace", namespace,
         *port, *args],
        env={**os.environ, **env}, capture_output=True, text=True, timeout=60, cwd=ROOT,
    )  # fmt: skip
    assert done.returncode == 2, done.stderr
    assert message in done.stderr
    assert "Traceback" not in done.stderr


async def test_an_exporter_with_a_token_refuses_scrapes_without_it(
    url: str, namespace: str
) -> None:
    app = Tether(url, namespace=namespace)
    async with Exporter(app, port=0, token=TOKEN) as exporter:
        assert app.is_open
        anonymous = await asyncio.to_thread(scrape, exporter.url)
        wrong = await asyncio.to_thread(scrape, exporter.url, token=TOKEN + "x")
        good = await asyncio.to_thread(scrape, exporter.url, token=TOKEN)
        served = exporter.url
    assert not app.is_open  # the exporter opened it, so it closed it
    assert (anonymous.status, wrong.status, good.status) == (401, 401, 200)
    assert good.value("tether_up") == 1
    assert _try_scrape(served) is None
    with socket_in_use() as port, pytest.raises(ConfigError, match="the port is in use"):
        async with Exporter(app, port=port):
            pass
    assert not app.is_open


@contextlib.contextmanager
def socket_in_use() -> Iterator[int]:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        yield int(sock.getsockname()[1])
