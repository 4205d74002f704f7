"""A worker's Prometheus metrics: real `tether worker` processes with --metrics-port,
scraped over HTTP, checked with promtool and read back with prometheus-client's parser."""

from __future__ import annotations

import asyncio
import signal
import socket
import subprocess
import sys
import threading
from pathlib import Path

import httpx
import prometheus_client
import pytest
import redis

from tether import ConfigError, TaskFailed, Tether, WorkerSettings
from tether.base._embedded import free_port

from ..helpers import ROOT, ServerInfo, WorkerProcess, running_worker, wait_until
from ..metrics_helpers import check_exposition, scrape

N = 30


def _metrics_url(port: int) -> str:
    return f"http://127.0.0.1:{port}/metrics"


def _served(url: str) -> bool:
    try:
        return httpx.get(url, timeout=2).status_code == 200
    except httpx.TransportError:
        return False


async def test_a_worker_process_counts_what_it_ran(
    server: ServerInfo, namespace: str, tmp_path: Path, workers: list[WorkerProcess]
) -> None:
    app = Tether(server.url, namespace=namespace)
    port = free_port()
    proc = WorkerProcess(
        server.url, namespace, "metered", app="tests.apps.observed:app", log_dir=tmp_path,
        concurrency=8, metrics_port=port,
    )  # fmt: skip
    workers.append(proc)
    url = _metrics_url(port)
    async with app:
        rds = redis.Redis.from_url(server.url)
        try:
            proc.wait_ready(rds)
        finally:
            rds.close()
        before = await asyncio.to_thread(scrape, url)
        assert before.status == 200
        assert before.value("tether_worker_lease_held") == 1
        assert before.value("tether_worker_concurrency") == 8
        assert before.value("tether_worker_max_pending") == 8

        handles = await app.by_name("obs.ok").enqueue_many([(i,) for i in range(N)])
        flaky = await app.by_name("obs.flaky").enqueue()
        slow = await app.by_name("obs.slow").enqueue()
        assert [await h.result(timeout=20) for h in handles] == list(range(N))
        with pytest.raises(TaskFailed, match="always"):
            await flaky.result(timeout=20)
        with pytest.raises(TaskFailed, match="past its timeout"):
            await slow.result(timeout=20)

        def settled() -> object:
            got = scrape(url)
            return (
                got
                if got.value("tether_worker_held") == 0
                and got.value(
                    "tether_tasks_total", queue="default", task="obs.slow", outcome="failed"
                )
                else None
            )

        after = await asyncio.to_thread(wait_until, settled, 20)

    check_exposition(after.text)
    d = {"queue": "default"}
    assert after.value("tether_tasks_total", **d, task="obs.ok", outcome="succeeded") == N
    assert after.value("tether_tasks_total", **d, task="obs.flaky", outcome="retried") == 1
    assert after.value("tether_tasks_total", **d, task="obs.flaky", outcome="failed") == 1
    assert after.value("tether_tasks_total", **d, task="obs.slow", outcome="failed") == 1
    assert after.value("tether_task_timeouts_total", **d, task="obs.slow") == 1
    assert after.value("tether_task_timeouts_total", **d, task="obs.ok") == 0
    # Every attempt is in both histograms, and the +Inf bucket is the count.
    for hist in ("tether_task_duration_seconds", "tether_task_wait_seconds"):
        assert after.value(f"{hist}_count", **d, task="obs.ok") == N
        assert after.value(f"{hist}_bucket", **d, task="obs.ok", le="+Inf") == N
        assert after.value(f"{hist}_count", **d, task="obs.flaky") == 2
    # The slow task ran for its timeout (0.05 s): in the 0.05 bucket's neighbours, not below.
    assert after.value("tether_task_duration_seconds_bucket", **d, task="obs.slow", le="0.025") == 0
    assert after.value("tether_task_duration_seconds_bucket", **d, task="obs.slow", le="1.0") == 1
    assert after.value("tether_task_duration_seconds_sum", **d, task="obs.slow") >= 0.05
    # The delivery counters: N + 2 first deliveries fetched, and the retry once it was
    # promoted; two dead letters; nothing lost.
    assert after.value("tether_worker_fetched_total") == N + 3
    assert after.value("tether_worker_dead_lettered_total") == 2
    assert after.value("tether_worker_promoted_total") == 1
    for counter in ("lost_leases", "quarantined", "lease_lapses", "claimed", "handed_off"):
        assert after.value(f"tether_worker_{counter}_total") == 0, counter
    assert after.value("tether_worker_running") == 0
    info = after.labelled("tether_worker_info")
    assert info == [{"worker": "metered", "queues": "default", "version": info[0]["version"]}]
    # Its own registry also has the process's metrics, and nothing else of anyone's.
    assert after.value("process_cpu_seconds_total") is not None
    others = {n for n in after.names() if not n.startswith(("tether_", "process_", "python_"))}
    assert others == set()

    proc.signal(signal.SIGTERM)
    assert proc.wait(30) == 0
    assert not _served(url), "the metrics server outlived its worker"


def test_lost_workers_tasks_show_in_the_claimers_counters(
    server: ServerInfo, namespace: str, tmp_path: Path, workers: list[WorkerProcess]
) -> None:
    rds = redis.Redis.from_url(server.url)
    app = Tether(server.url, namespace=namespace)
    victim = WorkerProcess(
        server.url, namespace, "victim", app="tests.apps.observed:app", log_dir=tmp_path
    )
    workers.append(victim)
    victim.wait_ready(rds)
    handle = app.by_name("obs.hold").enqueue_sync()
    wait_until(lambda: rds.llen(f"{namespace}:started") == 1, 20)
    port = free_port()
    heir = WorkerProcess(
        server.url, namespace, "heir", app="tests.apps.observed:app", log_dir=tmp_path,
        metrics_port=port,
    )  # fmt: skip
    workers.append(heir)
    heir.wait_ready(rds)
    victim.signal(signal.SIGKILL)
    assert handle.result_sync(timeout=20) == "again"

    got = wait_until(
        lambda: (
            (s := scrape(_metrics_url(port))).value(
                "tether_tasks_total", queue="default", task="obs.hold", outcome="succeeded"
            )
            and s
        ),
        10,
    )
    check_exposition(got.text)
    assert got.value("tether_worker_claimed_total") == 1
    assert got.value("tether_worker_fetched_total") == 1  # the claimed entry, nothing else
    app.close_sync()
    rds.close()


def test_a_frozen_workers_discarded_outcome_is_a_lost_lease_not_an_attempt(
    url: str, namespace: str, tmp_path: Path, workers: list[WorkerProcess]
) -> None:
    rds = redis.Redis.from_url(url)
    app = Tether(url, namespace=namespace)
    port = free_port()
    frozen = WorkerProcess(
        url, namespace, "frozen", app="tests.apps.observed:app", log_dir=tmp_path,
        metrics_port=port,
    )  # fmt: skip
    workers.append(frozen)
    frozen.wait_ready(rds)
    handle = app.by_name("obs.nap").enqueue_sync()
    wait_until(lambda: rds.llen(f"{namespace}:started") == 1, 20)
    frozen.signal(signal.SIGSTOP)  # past its lease: another worker claims the task
    other = WorkerProcess(url, namespace, "other", app="tests.apps.observed:app", log_dir=tmp_path)
    workers.append(other)
    assert handle.result_sync(timeout=20) == "again"
    frozen.signal(signal.SIGCONT)  # it wakes, finishes its nap, and its settle is refused

    got = wait_until(
        lambda: (s := scrape(_metrics_url(port))).value("tether_worker_lost_leases_total") and s,
        20,
    )
    check_exposition(got.text)
    assert got.value("tether_worker_lost_leases_total") == 1
    assert got.value("tether_worker_lease_lapses_total") == 1
    # The nap ran here, but the other worker's run is the one that counts.
    assert not got.labelled("tether_tasks_total")
    assert got.value("tether_task_duration_seconds_count", queue="default", task="obs.nap") is None
    app.close_sync()
    rds.close()


def test_a_port_in_use_stops_the_worker_at_start_up(url: str, namespace: str) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = subprocess.run(
            [sys.executable, "-m", "tether", "worker", "tests.apps.observed:app",
             "--metrics-port", str(port), "--url", url, "--namespace", namespace],
            capture_output=True, text=True, timeout=60, cwd=ROOT,
        )  # fmt: skip
    assert done.returncode == 1, done.stderr
    assert f"cannot serve metrics on 127.0.0.1:{port}: the port is in use" in done.stderr
    assert "Traceback" not in done.stderr


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--metrics-port", "70000"], "metrics_port=70000: a port is 0 to 65535"),
        (["--metrics-port", "-1"], "metrics_port=-1: must be 0 or more"),
        (["--metrics-port", "9", "--metrics-bind", "0.0.0.0:9"], "without a port"),
        (["--metrics-port", "nine"], "'nine' is not a valid integer"),
    ],
)
def test_bad_metrics_options_are_refused_at_start_up(
    url: str, namespace: str, flags: list[str], message: str
) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "tether", "worker", "tests.apps.observed:app", *flags,
         "--url", url, "--namespace", namespace],
        capture_output=True, text=True, timeout=60, cwd=ROOT,
    )  # fmt: skip
    assert done.returncode == 2, done.stderr
    assert message in done.stderr
    assert "Traceback" not in done.stderr


def test_settings_check_the_metrics_options() -> None:
    assert WorkerSettings(metrics_port=9100).metrics_bind == "127.0.0.1"
    assert WorkerSettings(metrics_port=0, metrics_bind="::1").metrics_bind == "::1"
    env = WorkerSettings.from_env(environ={"TETHER_METRICS_PORT": "9101"})
    assert env.metrics_port == 9101
    for bad in ({"metrics_port": True}, {"metrics_bind": ""}, {"metrics_bind": "a b"}):
        with pytest.raises(ConfigError):
            WorkerSettings(**bad)  # type: ignore[arg-type]


async def test_embedded_workers_keep_to_their_own_registries_and_stop_their_servers(
    url: str, namespace: str
) -> None:
    app = Tether(url, namespace=namespace)
    async with (
        app,
        running_worker(app, metrics_port=0, name="one") as one,
        running_worker(app, metrics_port=0, name="two") as two,
    ):
        assert one.metrics is not None and two.metrics is not None
        assert one.metrics.url != two.metrics.url
        assert one.metrics.registry is not two.metrics.registry
        first = await asyncio.to_thread(scrape, one.metrics.url)
        second = await asyncio.to_thread(scrape, two.metrics.url)
        assert first.labelled("tether_worker_info")[0]["worker"] == "one"
        assert second.labelled("tether_worker_info")[0]["worker"] == "two"
        served = [one.metrics.url, two.metrics.url]
    # The application's global registry holds nothing of Tether's.
    assert not [m for m in prometheus_client.REGISTRY.collect() if m.name.startswith("tether")]
    # Nothing is left behind once run() returned: no thread, no socket.
    assert not [t for t in threading.enumerate() if t.name.startswith("tether-metrics")]
    for served_url in served:
        assert not await asyncio.to_thread(_served, served_url)


def test_a_worker_without_metrics_imports_neither_extra(url: str, namespace: str) -> None:
    """With metrics and tracing off, their modules and prometheus_client are not imported,
    and the worker has no metrics to feed."""
    # redis-py 8 imports opentelemetry itself when it is installed: ask about Tether's.
    loaded = ("prometheus_client", "tether.metrics", "tether.contrib.opentelemetry")
    code = (
        f"import asyncio, sys\nLOADED = {loaded!r}\n"
        "from tests.apps import observed\n"
        "async def main():\n"
        "    async with observed.app:\n"
        "        await observed.ok.enqueue_many([(i,) for i in range(20)])\n"
        "        worker = observed.app.worker(burst=True)\n"
        "        await worker.run()\n"
        "        assert worker.metrics is None and not worker._engine.settler._sinks\n"
        "        print(worker.counters.succeeded)\n"
        "asyncio.run(main())\n"
        "print(sorted(m for m in sys.modules if m.startswith(LOADED)))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True, text=True, timeout=60, cwd=ROOT,
        env={"TETHER_URL": url, "TETHER_NAMESPACE": namespace, "PATH": "/usr/bin:/bin"},
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["20", "[]"]
